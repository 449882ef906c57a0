-- Shipped: never edit; add a migration. `{s}` is replaced by the quoted schema name.
-- Policy versions are fleet state (SPEC 1.3): the version being built and a sequence number that every
-- transition bumps, so a follower tells a newer state from one it has seen. Transitions lock the
-- ranker's row (`SELECT ... FOR UPDATE`), so concurrent ones through several instances apply one after
-- the other; rows from before this migration start at sequence 0 with nothing building.
ALTER TABLE {s}.ranker_state ADD COLUMN building_version bigint;
ALTER TABLE {s}.ranker_state ADD COLUMN state_seq bigint NOT NULL DEFAULT 0;
