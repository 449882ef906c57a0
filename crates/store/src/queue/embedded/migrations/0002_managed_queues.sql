-- Shipped: never edit; add a migration.
-- Idle queues can be forgotten unless an admin configured them (`managed`). Queues stored before are
-- marked managed, since nothing tells whether an admin configured them, and forgetting one an admin
-- did configure would be worse than keeping an idle one.
ALTER TABLE queues ADD COLUMN managed INTEGER NOT NULL DEFAULT 0;
UPDATE queues SET managed = 1;
