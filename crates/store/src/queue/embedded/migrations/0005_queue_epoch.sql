-- Shipped: never edit; add a migration.
-- Each queue's epoch (SPEC 2.2, "Places that survive the store"), written into its members' tickets. Queues
-- stored before have epoch 0, and keep it: the tickets issued for them stay of the current epoch.
ALTER TABLE queues ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
