-- Shipped: never edit; add a migration. `{s}` is replaced by the quoted schema name.
-- A change feed for other instances: every metric or membership row written gets the next value of
-- `change_seq`. Commits hold the per-schema write lock while they draw values, so values become
-- visible in commit order and a follower's cursor never skips a row.
CREATE SEQUENCE {s}.change_seq;
ALTER TABLE {s}.metrics_hourly ADD COLUMN change_seq bigint NOT NULL DEFAULT nextval('{s}.change_seq');
CREATE INDEX metrics_hourly_change ON {s}.metrics_hourly (change_seq);
ALTER TABLE {s}.product_categories ADD COLUMN change_seq bigint NOT NULL DEFAULT nextval('{s}.change_seq');
CREATE INDEX product_categories_change ON {s}.product_categories (change_seq);
