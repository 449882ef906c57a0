-- Shipped: never edit; add a migration.
-- Products can be delisted (SPEC 1.5): every product stored before stays listed.
ALTER TABLE catalog ADD COLUMN listed INTEGER NOT NULL DEFAULT 1;
