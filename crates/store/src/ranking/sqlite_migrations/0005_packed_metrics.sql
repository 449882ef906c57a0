-- Shipped: never edit; add a migration.
-- Hourly metrics as packed cells (`ranking::metric_cells`): a batch appends its coalesced deltas as one
-- `metric_deltas` blob, and a commit that finds enough pending folds them into one `metrics_packed`
-- blob per hour. Rows of `metrics_hourly` are folded into the hour blobs on every open, not here: an
-- older build run after a downgrade writes rows there again.
CREATE TABLE IF NOT EXISTS metric_deltas (
    seq      INTEGER PRIMARY KEY,
    max_hour INTEGER NOT NULL,
    cells    INTEGER NOT NULL,
    blob     BLOB    NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics_packed (
    hour  INTEGER PRIMARY KEY,
    cells INTEGER NOT NULL,
    blob  BLOB    NOT NULL
);
