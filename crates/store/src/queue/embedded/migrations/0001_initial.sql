-- Shipped: never edit; add a migration.
-- The queue store's schema as its first build created it inline. `IF NOT EXISTS` because a database
-- from before versioning may hold some of these tables already (see `sqlite_migration`).
--
-- `queues`: a queue's settings, sequence, admission budget and estimator (JSON); `members`: one row per
-- member in columns (`persist::MemberRow`); `jobs`: the delayed/retry job queue.
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY, settings TEXT NOT NULL, next_seq INTEGER NOT NULL,
    budget TEXT NOT NULL, estimator TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    queue TEXT NOT NULL, member TEXT NOT NULL, kind INTEGER NOT NULL, seq INTEGER NOT NULL,
    at_ms INTEGER NOT NULL, digest BLOB, nonce BLOB, expires_ms INTEGER NOT NULL,
    claim_digest BLOB, claim_expires_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, member)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS jobs (
    queue TEXT NOT NULL, id TEXT NOT NULL, record TEXT NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (queue, id)
) WITHOUT ROWID;
