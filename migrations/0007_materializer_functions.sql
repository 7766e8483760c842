-- The materializer's batch steps as functions of the ledger (docs/ledger.md, "The ledger's
-- functions" and "The materializer").
--
-- The materializer follows the server's feed: what the server did has happened, so these
-- never refuse an entry, they only skip what the ledger's rules do not let move. Each takes
-- parallel arrays (one element per feed entry) and is one statement per batch, so a batch
-- of thousands of entries stays one round trip per kind. The rules are those of 0006: an
-- order is recorded PENDING only if its token has no row (a tombstone, a cancelled or a
-- paid order keeps its row, as `materialize_order` keeps it), only a PENDING order moves to
-- COMMITTED or CANCELLED (as `pay_order` and `cancel_order` move it), times go through
-- `stockgate_ms_to_ts`, and every transition appends its `order_events` row (actor
-- `materializer`, detail `feed`). Each returns how many orders it changed. Created with
-- `SET search_path FROM CURRENT`, as 0006's functions are.

-- SG004 unless the arrays are all non-NULL and of the same length.
CREATE FUNCTION stockgate_check_parallel(p_what text, p_lengths integer[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_lengths) AS l(n) WHERE n IS NULL)
       OR (SELECT count(DISTINCT n) FROM unnest(p_lengths) AS l(n)) > 1 THEN
        RAISE EXCEPTION 'invalid argument: % needs non-NULL arrays of the same length', p_what
            USING ERRCODE = 'SG004';
    END IF;
END
$$;

-- 1. `reserved` entries: each token with no order yet becomes a PENDING order with its
-- audit row. A token with a row (the checkout recorded it first, a retried batch, a
-- sweeper tombstone, a paid or cancelled order) keeps that row untouched.
CREATE FUNCTION materialize_reserved(
    p_tokens text[], p_skus text[], p_users text[], p_request_ids text[], p_qtys integer[],
    p_expires_at_ms bigint[], p_created_at_ms bigint[]
) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n bigint;
BEGIN
    PERFORM stockgate_check_parallel('materialize_reserved', ARRAY[
        cardinality(p_tokens), cardinality(p_skus), cardinality(p_users),
        cardinality(p_request_ids), cardinality(p_qtys), cardinality(p_expires_at_ms),
        cardinality(p_created_at_ms)]);
    WITH ins AS (
        INSERT INTO orders (reservation_token, sku, user_id, request_id, qty, status,
                            reservation_expires_at, reservation_created_at)
        SELECT x.t, x.s, x.u, x.r, x.q, 'PENDING', stockgate_ms_to_ts(x.e),
               stockgate_ms_to_ts(x.c)
          FROM unnest(p_tokens, p_skus, p_users, p_request_ids, p_qtys, p_expires_at_ms,
                      p_created_at_ms) AS x(t, s, u, r, q, e, c)
         -- Token order: concurrent writers of overlapping batches take locks in one order.
         ORDER BY x.t
        ON CONFLICT (reservation_token) DO NOTHING
        RETURNING reservation_token
    ), ev AS (
        INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
        SELECT i.reservation_token, NULL, 'PENDING', 'materializer', 'feed' FROM ins i
    )
    SELECT count(*) INTO v_n FROM ins;
    RETURN v_n;
END
$$;

-- 2. `committed` (to COMMITTED) and `released` (to CANCELLED) entries: the PENDING orders
-- among the tokens move, with their audit rows. An order that already moved (the checkout
-- paid or cancelled it first, the sweeper swept it, a retried batch) or has no row is
-- skipped: the ledger moved first and wins.
CREATE FUNCTION materialize_transition(p_to text, p_tokens text[]) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n bigint;
BEGIN
    IF p_to IS NULL OR p_to NOT IN ('COMMITTED', 'CANCELLED') THEN
        RAISE EXCEPTION 'invalid argument: the materializer moves orders to COMMITTED or CANCELLED, not %',
            coalesce(p_to, 'NULL')
            USING ERRCODE = 'SG004';
    END IF;
    PERFORM stockgate_check_parallel('materialize_transition', ARRAY[cardinality(p_tokens)]);
    WITH up AS (
        UPDATE orders
           SET status = p_to,
               committed_at = CASE WHEN p_to = 'COMMITTED' THEN now() ELSE committed_at END,
               cancelled_at = CASE WHEN p_to = 'CANCELLED' THEN now() ELSE cancelled_at END,
               updated_at = now()
         WHERE reservation_token = ANY(p_tokens) AND status = 'PENDING'
        RETURNING reservation_token
    ), ev AS (
        INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
        SELECT u.reservation_token, 'PENDING', p_to, 'materializer', 'feed' FROM up u
    )
    SELECT count(*) INTO v_n FROM up;
    RETURN v_n;
END
$$;

-- 3. `extended` entries: a PENDING order's deadline follows the server's, forward only (an
-- older entry replayed never shortens it). Not a status change, so no audit row, as with
-- `extend_order`.
CREATE FUNCTION materialize_extended(p_tokens text[], p_expires_at_ms bigint[])
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_n bigint;
BEGIN
    PERFORM stockgate_check_parallel('materialize_extended', ARRAY[
        cardinality(p_tokens), cardinality(p_expires_at_ms)]);
    UPDATE orders o SET reservation_expires_at = stockgate_ms_to_ts(x.e), updated_at = now()
      FROM unnest(p_tokens, p_expires_at_ms) AS x(t, e)
     WHERE o.reservation_token = x.t AND o.status = 'PENDING'
       AND o.reservation_expires_at < stockgate_ms_to_ts(x.e);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- 4. The consumer's committed position, moved past the batch in the batch's transaction
-- (the caller holds the row's lock from the start of the batch). SG003 for a consumer
-- with no row.
CREATE FUNCTION feed_set_position(p_consumer text, p_last_lsn bigint, p_fingerprint bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_last_lsn IS NULL OR p_last_lsn < 0 THEN
        RAISE EXCEPTION 'invalid argument for consumer %: the position must be a non-negative LSN, got %',
            p_consumer, coalesce(p_last_lsn::text, 'NULL')
            USING ERRCODE = 'SG004';
    END IF;
    UPDATE feed_position SET last_lsn = p_last_lsn, last_fingerprint = p_fingerprint,
           updated_at = now()
     WHERE consumer = p_consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no feed position for consumer %', p_consumer
            USING ERRCODE = 'SG003';
    END IF;
END
$$;
