-- Shipped: never edit; add a migration.
-- How many waiting members a queue dropped as abandoned, kept so a restart answers the same. Queues
-- stored before start at 0, as they did at every start before it was stored.
ALTER TABLE queues ADD COLUMN abandoned INTEGER NOT NULL DEFAULT 0;
