-- Shipped: never edit; add a migration.
-- The pre-queue draw of a scheduled opening (SPEC 2.1): a queue's draw record (JSON of `DrawRecord`)
-- and its drawn order, written in chunks at `position`s.
CREATE TABLE IF NOT EXISTS queue_draws (queue TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queue_drawn_members (
    queue TEXT NOT NULL, position INTEGER NOT NULL, member TEXT NOT NULL,
    PRIMARY KEY (queue, position)
) WITHOUT ROWID;
