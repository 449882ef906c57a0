-- position: ARGV[2] member. Read-only on the common path; see read_position.
return read_position(ARGV[2])
