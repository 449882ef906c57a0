-- Shipped: never edit; add a migration.
-- The schema as the first builds with batch rows in the raw log created it inline. `IF NOT EXISTS`
-- because a database from before versioning may hold some of these tables already (see
-- `sqlite_migration`).
--
-- `event_log`: one row per (hour, batch) holding the ids and canonical bodies of that batch's events
-- in that hour; the raw log and the processed-id set at once. `metrics_hourly`: a row per (hour,
-- product), how metrics were kept before packed cells (migration 5); kept so rows an older build
-- writes after a downgrade are still folded in on open.
CREATE TABLE IF NOT EXISTS event_log (
    hour   INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    ids    TEXT    NOT NULL,
    bodies BLOB    NOT NULL,
    PRIMARY KEY (hour, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metrics_hourly (
    hour    INTEGER NOT NULL,
    product TEXT    NOT NULL,
    views   INTEGER NOT NULL,
    likes   INTEGER NOT NULL,
    units   INTEGER NOT NULL,
    sales   INTEGER NOT NULL,
    PRIMARY KEY (hour, product)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS product_categories (
    product  TEXT NOT NULL,
    category TEXT NOT NULL,
    PRIMARY KEY (product, category)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS policies (
    ranker  TEXT    NOT NULL,
    version INTEGER NOT NULL,
    weights TEXT    NOT NULL,
    PRIMARY KEY (ranker, version)
);
CREATE TABLE IF NOT EXISTS ranker_state (
    ranker           TEXT PRIMARY KEY,
    active_version   INTEGER NOT NULL,
    previous_version INTEGER,
    latest_version   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS catalog (
    product TEXT PRIMARY KEY,
    body    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
