-- Shipped: never edit; add a migration.
-- Policy versions are fleet state (SPEC 1.3): the version being built and a sequence number that every
-- transition bumps. States stored before start at sequence 0 with nothing building.
ALTER TABLE ranker_state ADD COLUMN building_version INTEGER;
ALTER TABLE ranker_state ADD COLUMN state_seq INTEGER NOT NULL DEFAULT 0;
