-- stockgate ledger schema: the durable judge of every reservation (DESIGN.md, "Ledger").
-- Applied by sqlx's migrator at start-up of the tools that need it and by
-- `stockgate-sweeper migrate`.

-- A sale and the units it started with. A rebuild of a fenced server computes
--   available = initial_allocation - committed - verified pending
-- from this row and the orders below, so SALE.ADJUST must be mirrored here.
CREATE TABLE sales (
    sku                 TEXT PRIMARY KEY
                        CHECK (sku ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    initial_allocation  BIGINT NOT NULL CHECK (initial_allocation >= 0),
    -- Creation parameters, so a server that lost the sale can be given it back fenced.
    shards              INTEGER CHECK (shards IS NULL OR shards > 0),
    ttl_ms              BIGINT CHECK (ttl_ms IS NULL OR ttl_ms > 0),
    per_user_limit      INTEGER CHECK (per_user_limit IS NULL OR per_user_limit >= 0),
    -- Fingerprint of the server's reservation key: a rebuild with another key is refused,
    -- because it would derive other tokens and break idempotency.
    key_fingerprint     TEXT,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One order per reservation, keyed by the server-derived reservation token (also the
-- payment idempotency key). No foreign key to sales: the sweeper must be able to write a
-- tombstone for any reservation the server lists, even of a sale the ledger never saw.
CREATE TABLE orders (
    id                      BIGSERIAL PRIMARY KEY,
    reservation_token       TEXT NOT NULL UNIQUE,
    sku                     TEXT NOT NULL,
    user_id                 TEXT NOT NULL,
    -- Kept beside the token so a rebuild can re-derive it (SALE.RESTORE). NULL only for
    -- sweeper tombstones: EXPIRED does not carry the request id.
    request_id              TEXT,
    qty                     INTEGER NOT NULL CHECK (qty > 0),
    status                  TEXT NOT NULL CHECK (status IN (
                                'PENDING', 'COMMITTED', 'CANCELLED', 'CANCELLED_BY_SWEEPER',
                                'REFUND_REQUIRED', 'REFUNDED')),
    reservation_expires_at  TIMESTAMPTZ NOT NULL,
    reservation_created_at  TIMESTAMPTZ,
    payment_ref             TEXT,
    created_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    committed_at            TIMESTAMPTZ,
    cancelled_at            TIMESTAMPTZ,
    CHECK (status <> 'PENDING' OR request_id IS NOT NULL),
    CHECK (status <> 'COMMITTED' OR committed_at IS NOT NULL)
);

-- Serves the sweeper's and the rebuild's view of what is still in flight: PENDING orders
-- of a SKU by deadline (the per-token conditional updates use the unique index above).
CREATE INDEX orders_pending_by_expiry
    ON orders (sku, reservation_expires_at)
    WHERE status = 'PENDING';

-- Per-SKU status sums (invariant checks, rebuild's committed count).
CREATE INDEX orders_sku_status ON orders (sku, status);

-- Append-only audit: one row per transition, written in the same statement/transaction
-- as the transition itself.
CREATE TABLE order_events (
    id                  BIGSERIAL PRIMARY KEY,
    reservation_token   TEXT NOT NULL,
    from_status         TEXT,
    to_status           TEXT NOT NULL,
    actor               TEXT NOT NULL,
    detail              TEXT,
    at                  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX order_events_by_token ON order_events (reservation_token, id);

CREATE FUNCTION stockgate_refuse_audit_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'order_events is append-only';
END
$$;

CREATE TRIGGER order_events_no_update_delete
    BEFORE UPDATE OR DELETE ON order_events
    FOR EACH ROW EXECUTE FUNCTION stockgate_refuse_audit_change();
CREATE TRIGGER order_events_no_truncate
    BEFORE TRUNCATE ON order_events
    FOR EACH STATEMENT EXECUTE FUNCTION stockgate_refuse_audit_change();

-- The order state machine, enforced where the truth lives: a bug in any client cannot
-- move an order along an illegal edge (e.g. CANCELLED back to PENDING, or COMMITTED to
-- CANCELLED, which would hand a sold unit back to stock).
CREATE FUNCTION stockgate_check_order_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.reservation_token <> OLD.reservation_token THEN
        RAISE EXCEPTION 'reservation_token is immutable';
    END IF;
    IF NEW.status = OLD.status THEN
        RETURN NEW;
    END IF;
    IF (OLD.status, NEW.status) IN (
        ('PENDING', 'COMMITTED'),
        ('PENDING', 'CANCELLED'),
        ('PENDING', 'CANCELLED_BY_SWEEPER'),
        ('PENDING', 'REFUND_REQUIRED'),
        ('CANCELLED', 'REFUND_REQUIRED'),
        ('CANCELLED_BY_SWEEPER', 'REFUND_REQUIRED'),
        ('COMMITTED', 'REFUND_REQUIRED'),
        ('REFUND_REQUIRED', 'REFUNDED')
    ) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'illegal order transition % -> % for %',
        OLD.status, NEW.status, OLD.reservation_token
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER orders_transition_check
    BEFORE UPDATE ON orders
    FOR EACH ROW EXECUTE FUNCTION stockgate_check_order_transition();

CREATE FUNCTION stockgate_refuse_order_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'orders are never deleted (tombstones keep late materializes out)';
END
$$;

CREATE TRIGGER orders_no_delete
    BEFORE DELETE ON orders
    FOR EACH ROW EXECUTE FUNCTION stockgate_refuse_order_delete();
