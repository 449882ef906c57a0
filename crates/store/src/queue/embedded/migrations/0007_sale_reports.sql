-- Shipped: never edit; add a migration.
-- The sale's report (SPEC 2.5, issue 28): one counter per queue, minute and field (`queue::report`
-- names the fields), added to by every flush; minute -1 holds the totals. Kept apart from `queues`, so a
-- queue forgotten when idle keeps its report; deleting the queue deletes it.
CREATE TABLE queue_report (
    queue TEXT NOT NULL,
    minute INTEGER NOT NULL,
    field TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (queue, minute, field)
) WITHOUT ROWID;
-- When each report was last written, to keep at most `max_queues` of them (the least recent go).
CREATE TABLE queue_report_written (
    queue TEXT PRIMARY KEY,
    written_ms INTEGER NOT NULL
);
