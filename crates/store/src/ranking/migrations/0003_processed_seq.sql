-- Shipped: never edit; add a migration. `{s}` is replaced by the quoted schema name.
-- A commit feed of processed ids, so each source keeps an exact in-memory set of them (`Known`)
-- instead of probing every day partition's id index for every id of a batch. A commit draws one
-- `processed_seq` value under the write lock and stores it with each id it inserts; another source
-- reads `seq > its cursor` (one index probe per partition). Rows that existed before this
-- migration get 0 without a table rewrite (the constant default); every later row gets a value,
-- also from a binary that predates this migration and leaves the column out (`nextval`).
CREATE SEQUENCE {s}.processed_seq;
ALTER TABLE {s}.processed ADD COLUMN seq bigint NOT NULL DEFAULT 0;
ALTER TABLE {s}.processed ALTER COLUMN seq SET DEFAULT nextval('{s}.processed_seq');
CREATE INDEX processed_by_seq ON {s}.processed (seq);
