-- stockgate ledger schema, step 2: the sale's current allocation has one truth, here.
--
-- Before this migration a `SALE.ADJUST` changed only the server's total; a rebuild then
-- started from the units the sale was created with, and withdrawn units went back on sale.
-- Now every adjustment is written here first (keyed by an operator-chosen id, so a retry
-- never adjusts twice), then sent to the server; the rebuild uses `sales.allocation`.

-- Current allocation: initial_allocation plus every recorded adjustment that was not
-- refused by the server. initial_allocation stays what the sale was created with (it is
-- what a repeated `create-sale` is compared against).
ALTER TABLE sales ADD COLUMN allocation BIGINT;
UPDATE sales SET allocation = initial_allocation;
ALTER TABLE sales ALTER COLUMN allocation SET NOT NULL;
ALTER TABLE sales ADD CONSTRAINT sales_allocation_nonnegative CHECK (allocation >= 0);

-- One row per adjustment. `status`:
--   RECORDED  written to the ledger (allocation already moved); not yet confirmed on the
--             server. A crash here is finished by re-running the same adjustment id: the
--             tool compares the server's total with the ledger's allocation to tell
--             whether the server already has it, so it is applied there exactly once.
--   APPLIED   the server's total includes it (SALE.ADJUST answered, or a rebuild set the
--             server's total to an allocation that includes it).
--   REFUSED   the server refused it (e.g. not enough available units to withdraw); the
--             allocation was moved back in the same transaction.
CREATE TABLE sale_adjustments (
    adjustment_id       TEXT PRIMARY KEY
                        CHECK (length(adjustment_id) BETWEEN 1 AND 128),
    sku                 TEXT NOT NULL REFERENCES sales (sku),
    delta               BIGINT NOT NULL CHECK (delta <> 0),
    -- The allocation right after this adjustment was recorded (for the audit trail).
    allocation_after    BIGINT NOT NULL,
    status              TEXT NOT NULL DEFAULT 'RECORDED'
                        CHECK (status IN ('RECORDED', 'APPLIED', 'REFUSED')),
    -- The server's total when it was confirmed there (APPLIED), if known.
    server_total        BIGINT,
    detail              TEXT,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The sweeper reads the unconfirmed adjustments of a sale on every pass.
CREATE INDEX sale_adjustments_recorded
    ON sale_adjustments (sku, created_at)
    WHERE status = 'RECORDED';
