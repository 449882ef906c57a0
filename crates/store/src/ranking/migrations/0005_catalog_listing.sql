-- Shipped: never edit; add a migration. `{s}` is replaced by the quoted schema name.
-- Delisting (SPEC 1.5): a catalogue entry says whether its product is listed, and catalogue rows join
-- the change feed like metric and membership rows, so a delisting (or any catalogue write) through one
-- instance reaches every instance. Writes draw `change_seq` under the write lock, as commits do, so a
-- follower's cursor never skips one. Existing products stay listed.
ALTER TABLE {s}.catalog ADD COLUMN listed boolean NOT NULL DEFAULT true;
ALTER TABLE {s}.catalog ADD COLUMN change_seq bigint NOT NULL DEFAULT nextval('{s}.change_seq');
CREATE INDEX catalog_change ON {s}.catalog (change_seq);
