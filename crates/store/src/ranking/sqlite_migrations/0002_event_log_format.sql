-- Shipped: never edit; add a migration.
-- Raw-log rows are length-prefixed now (`ranking::packed`). Rows written before are newline-joined and
-- get the default 0 (`RowFormat::NewlineJoined`), and so do rows an older build inserts after a
-- downgrade, since it names no `format`: whoever wrote a row, its marker is right.
ALTER TABLE event_log ADD COLUMN format INTEGER NOT NULL DEFAULT 0;
