-- Shipped: never edit; add a migration.
-- A scheduled opening's entrant list (issue 28): the pre-queue as it stood at the close, sealed by the
-- draw's entrantsCommitment before anything is revealed; kept until the draw is done (the drawn list then
-- holds the same members in drawn order).
CREATE TABLE IF NOT EXISTS queue_draw_entrants (
    queue TEXT NOT NULL, position INTEGER NOT NULL, member TEXT NOT NULL,
    PRIMARY KEY (queue, position)
) WITHOUT ROWID;
