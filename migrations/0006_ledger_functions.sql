-- The ledger's rules as functions of the ledger (docs/ledger.md, "The ledger's functions").
--
-- Every checkout transition is one statement for the caller, in any language: the function
-- takes the row lock it needs, decides, moves the order and appends its audit row in the
-- same transaction, and answers with a plain text outcome. A caller cannot forget the
-- expiry guard or the refund branch, because they are not the caller's to write. The Rust
-- tools call these same functions, so each rule has one copy. The transition trigger of
-- 0001 stays underneath as the last line of defence.
--
-- Errors carry their own SQLSTATEs (class SG) and a message in plain words that names the
-- token:
--   SG001  refused: the order's status does not allow this step
--          ("order <token> is <STATUS>: <what was refused>")
--   SG002  conflict: the token exists with another sku / user / qty
--   SG003  not found: no order for this token
--   SG004  invalid argument
--
-- Times are epoch milliseconds (bigint), as the server reports them; expiry is judged by
-- the database clock (now()). Each function is created with `SET search_path FROM
-- CURRENT`: it is created while the migration runs in the ledger's schema, so its body
-- finds the ledger's tables there whatever the caller's search_path is (a caller may
-- write `stockgate.pay_order(...)` without setting it).

-- Epoch milliseconds to a timestamp, exactly: an interval of whole milliseconds (no
-- seconds-as-float rounding that could move a deadline by a millisecond). NULL stays NULL.
CREATE FUNCTION stockgate_ms_to_ts(p_ms bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT timestamptz '1970-01-01 00:00:00+00' + p_ms * interval '1 millisecond' $$;

-- SG004 unless `p_ms` is a time the ledger can store (0 .. year 9999).
CREATE FUNCTION stockgate_check_ms(p_ms bigint, p_what text, p_token text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_ms IS NULL OR p_ms < 0 OR p_ms > 253402300799999 THEN
        RAISE EXCEPTION 'invalid argument for order %: % must be epoch milliseconds between 0 and 253402300799999, got %',
            p_token, p_what, coalesce(p_ms::text, 'NULL')
            USING ERRCODE = 'SG004';
    END IF;
END
$$;

-- SG004 for an empty or NULL token.
CREATE FUNCTION stockgate_check_token(p_token text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_token IS NULL OR p_token = '' THEN
        RAISE EXCEPTION 'invalid argument: the reservation token is empty'
            USING ERRCODE = 'SG004';
    END IF;
END
$$;

-- SG001 with the one message shape every refusal uses.
CREATE FUNCTION stockgate_refuse(p_token text, p_status text, p_what text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'order % is %: %', p_token, p_status, p_what
        USING ERRCODE = 'SG001';
END
$$;

-- SG003.
CREATE FUNCTION stockgate_not_found(p_token text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'no order for reservation %', p_token
        USING ERRCODE = 'SG003';
END
$$;

-- 1. A server hold becomes a PENDING order (or a retry finds it). A token the sweeper
-- tombstoned first, or one cancelled or refunded, is refused: its units went back to
-- stock, so the hold cannot be paid for any more.
CREATE FUNCTION materialize_order(
    p_token text, p_sku text, p_user text, p_request_id text, p_qty integer,
    p_expires_at_ms bigint, p_created_at_ms bigint
) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    o orders%ROWTYPE;
BEGIN
    PERFORM stockgate_check_token(p_token);
    IF p_sku IS NULL OR p_sku = '' OR p_user IS NULL OR p_user = ''
       OR p_request_id IS NULL OR p_request_id = '' THEN
        RAISE EXCEPTION 'invalid argument for order %: sku, user and request id must not be empty', p_token
            USING ERRCODE = 'SG004';
    END IF;
    IF p_qty IS NULL OR p_qty <= 0 THEN
        RAISE EXCEPTION 'invalid argument for order %: qty must be positive, got %',
            p_token, coalesce(p_qty::text, 'NULL')
            USING ERRCODE = 'SG004';
    END IF;
    PERFORM stockgate_check_ms(p_expires_at_ms, 'expires_at_ms', p_token);
    PERFORM stockgate_check_ms(p_created_at_ms, 'created_at_ms', p_token);

    -- DO NOTHING: a retry, or a tombstone the sweeper wrote first, keeps the row it finds.
    INSERT INTO orders (reservation_token, sku, user_id, request_id, qty, status,
                        reservation_expires_at, reservation_created_at)
    VALUES (p_token, p_sku, p_user, p_request_id, p_qty, 'PENDING',
            stockgate_ms_to_ts(p_expires_at_ms), stockgate_ms_to_ts(p_created_at_ms))
    ON CONFLICT (reservation_token) DO NOTHING;
    IF FOUND THEN
        INSERT INTO order_events (reservation_token, from_status, to_status, actor)
        VALUES (p_token, NULL, 'PENDING', 'checkout');
        RETURN 'CREATED';
    END IF;

    -- The row exists (rows are never deleted). A share lock waits for a transition in
    -- flight and reads its outcome.
    SELECT * INTO o FROM orders WHERE reservation_token = p_token FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % vanished during materialize', p_token;
    END IF;
    -- A tombstone carries sku/user/qty from EXPIRED: its status matters more than a
    -- detail mismatch; otherwise the same token with other details is a caller's bug.
    IF (o.sku, o.user_id, o.qty) IS DISTINCT FROM (p_sku, p_user, p_qty)
       AND o.status NOT IN ('CANCELLED', 'CANCELLED_BY_SWEEPER') THEN
        RAISE EXCEPTION 'order % exists with other details (sku %, user %, qty %), not sku %, user %, qty %',
            p_token, o.sku, o.user_id, o.qty, p_sku, p_user, p_qty
            USING ERRCODE = 'SG002';
    END IF;
    IF o.status = 'PENDING' THEN
        RETURN 'ALREADY_PENDING';
    ELSIF o.status = 'COMMITTED' THEN
        RETURN 'ALREADY_COMMITTED';
    END IF;
    PERFORM stockgate_refuse(p_token, o.status,
        'materialize refused (its units went back to stock)');
    RETURN NULL;
END
$$;

-- 2. The ledger step of a payment: the expiry guard and the refund branch in one place.
-- `>= now()` is the exact complement of the sweeper's `< now()`; the row lock orders a
-- payment and a sweep of the same order, so exactly one of them wins.
CREATE FUNCTION pay_order(p_token text, p_payment_ref text, p_money_moved boolean)
RETURNS TABLE(outcome text, previous_status text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_live boolean;
    v_ref text;
BEGIN
    PERFORM stockgate_check_token(p_token);
    IF p_money_moved IS NULL THEN
        RAISE EXCEPTION 'invalid argument for order %: money_moved must be true or false', p_token
            USING ERRCODE = 'SG004';
    END IF;

    SELECT o.status, o.reservation_expires_at >= now(), o.payment_ref
      INTO v_status, v_live, v_ref
      FROM orders o WHERE o.reservation_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        -- Nothing to attach a refund to: the caller must handle the money itself.
        RETURN QUERY SELECT 'NOT_FOUND'::text, NULL::text;
        RETURN;
    END IF;

    IF v_status = 'PENDING' AND v_live THEN
        UPDATE orders SET status = 'COMMITTED', payment_ref = p_payment_ref,
               committed_at = now(), updated_at = now()
         WHERE reservation_token = p_token;
        INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
        VALUES (p_token, 'PENDING', 'COMMITTED', 'payment', p_payment_ref);
        RETURN QUERY SELECT 'COMMITTED'::text, 'PENDING'::text;
        RETURN;
    END IF;

    IF v_status = 'COMMITTED' THEN
        -- The token is the payment idempotency key: the same payment again.
        RETURN QUERY SELECT 'ALREADY_COMMITTED'::text, 'COMMITTED'::text;
        RETURN;
    END IF;

    -- Late (PENDING past its deadline), cancelled, or already being refunded: the units
    -- are not this payment's to sell.
    IF NOT p_money_moved THEN
        RETURN QUERY SELECT 'REFUSED'::text, v_status;
        RETURN;
    END IF;
    IF v_status = 'REFUNDED' THEN
        -- The order's refund is done and cannot be reopened (the transition trigger
        -- forbids REFUNDED -> REFUND_REQUIRED). The same payment again is a retry; another
        -- payment would need a second refund this ledger has no row for.
        IF p_payment_ref IS NOT NULL AND p_payment_ref <> ''
           AND p_payment_ref IS DISTINCT FROM v_ref THEN
            PERFORM stockgate_refuse(p_token, v_status, format(
                'payment %s refused: the order was already refunded for payment %s, refund %s by hand',
                p_payment_ref, coalesce(v_ref, '(none)'), p_payment_ref));
        END IF;
        RETURN QUERY SELECT 'REFUND_REQUIRED'::text, v_status;
        RETURN;
    END IF;
    IF v_status <> 'REFUND_REQUIRED' THEN
        UPDATE orders SET status = 'REFUND_REQUIRED',
               payment_ref = coalesce(nullif(p_payment_ref, ''), payment_ref),
               updated_at = now()
         WHERE reservation_token = p_token;
        INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
        VALUES (p_token, v_status, 'REFUND_REQUIRED', 'payment',
                'payment after the reservation ended');
    END IF;
    RETURN QUERY SELECT 'REFUND_REQUIRED'::text, v_status;
END
$$;

-- 3. The buyer abandons, before the server's RELEASE.
CREATE FUNCTION cancel_order(p_token text) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_status text;
BEGIN
    PERFORM stockgate_check_token(p_token);
    SELECT status INTO v_status FROM orders WHERE reservation_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM stockgate_not_found(p_token);
    END IF;
    IF v_status = 'CANCELLED' THEN
        RETURN 'ALREADY_CANCELLED';
    ELSIF v_status <> 'PENDING' THEN
        PERFORM stockgate_refuse(p_token, v_status, 'cancel refused');
    END IF;
    UPDATE orders SET status = 'CANCELLED', cancelled_at = now(), updated_at = now()
     WHERE reservation_token = p_token;
    INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
    VALUES (p_token, 'PENDING', 'CANCELLED', 'checkout', 'buyer cancelled');
    RETURN 'CANCELLED';
END
$$;

-- 4. The mirror of a server EXTEND (after the server accepted it). Not a status change, so
-- no audit row: order_events records transitions.
CREATE FUNCTION extend_order(p_token text, p_expires_at_ms bigint) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_status text;
BEGIN
    PERFORM stockgate_check_token(p_token);
    PERFORM stockgate_check_ms(p_expires_at_ms, 'expires_at_ms', p_token);
    SELECT status INTO v_status FROM orders WHERE reservation_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM stockgate_not_found(p_token);
    END IF;
    IF v_status <> 'PENDING' THEN
        PERFORM stockgate_refuse(p_token, v_status, 'extend refused');
    END IF;
    UPDATE orders SET reservation_expires_at = stockgate_ms_to_ts(p_expires_at_ms),
           updated_at = now()
     WHERE reservation_token = p_token;
    RETURN 'EXTENDED';
END
$$;

-- 5. Compensation: money moved for units that are not (or no longer) this order's. Returns
-- the status the order had. An empty or NULL payment_ref never replaces a stored one: the
-- refund needs it, and some callers (the sweeper) only know the token.
CREATE FUNCTION mark_refund_required(p_token text, p_payment_ref text, p_reason text)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_status text;
    v_expired boolean;
BEGIN
    PERFORM stockgate_check_token(p_token);
    SELECT status, reservation_expires_at < now() INTO v_status, v_expired
      FROM orders WHERE reservation_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM stockgate_not_found(p_token);
    END IF;
    IF v_status = 'REFUND_REQUIRED' THEN
        RETURN v_status;
    END IF;
    IF v_status = 'PENDING' AND NOT v_expired THEN
        PERFORM stockgate_refuse(p_token, v_status,
            'refund refused (the reservation has not expired, it can still be paid)');
    ELSIF v_status NOT IN ('PENDING', 'CANCELLED', 'CANCELLED_BY_SWEEPER', 'COMMITTED') THEN
        PERFORM stockgate_refuse(p_token, v_status, 'refund refused');
    END IF;
    UPDATE orders SET status = 'REFUND_REQUIRED',
           payment_ref = coalesce(nullif(p_payment_ref, ''), payment_ref),
           updated_at = now()
     WHERE reservation_token = p_token;
    INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
    VALUES (p_token, v_status, 'REFUND_REQUIRED', 'payment', p_reason);
    RETURN v_status;
END
$$;

-- 6. The refund was made.
CREATE FUNCTION mark_refunded(p_token text) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_status text;
BEGIN
    PERFORM stockgate_check_token(p_token);
    SELECT status INTO v_status FROM orders WHERE reservation_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM stockgate_not_found(p_token);
    END IF;
    IF v_status = 'REFUNDED' THEN
        RETURN 'ALREADY_REFUNDED';
    ELSIF v_status <> 'REFUND_REQUIRED' THEN
        PERFORM stockgate_refuse(p_token, v_status, 'marking it refunded refused');
    END IF;
    UPDATE orders SET status = 'REFUNDED', updated_at = now()
     WHERE reservation_token = p_token;
    INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
    VALUES (p_token, 'REFUND_REQUIRED', 'REFUNDED', 'payment', 'refunded');
    RETURN 'REFUNDED';
END
$$;

-- 7. The same-hold check: whether the server's reservation with these fields is the hold
-- this order was materialized from (the one its payment paid for), not a later hold of
-- the same (sku, user, request id), which has the same token but was created later with
-- a new deadline. Same sku, user and qty, and the same creation time (kept exactly from
-- the server) or the same expiry (exact from RESERVE; it differs only if an EXTEND
-- reached the server but not the ledger).
CREATE FUNCTION order_is_hold(
    p_token text, p_sku text, p_user text, p_qty integer,
    p_created_at_ms bigint, p_expires_at_ms bigint
) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM orders
         WHERE reservation_token = p_token
           AND sku = p_sku AND user_id = p_user AND qty = p_qty
           AND (reservation_created_at = stockgate_ms_to_ts(p_created_at_ms)
                OR reservation_expires_at = stockgate_ms_to_ts(p_expires_at_ms)));
END
$$;

-- 8a. The sweeper's first step for a batch of reservations the server reports expired:
-- PENDING orders past their deadline become CANCELLED_BY_SWEEPER, and every token gets a
-- verdict, in input order:
--   CANCELLED_NOW                 this call cancelled it: release the units
--   ALREADY_CANCELLED_BY_SWEEPER  an earlier sweep cancelled it and died before RELEASE
--   CANCELLED_BY_BUYER            CANCELLED: the checkout died before its RELEASE
--   REFUND                        REFUND_REQUIRED / REFUNDED: the units were never sold
--   COMMIT_CLEANUP                COMMITTED: the server is to COMMIT, no stock back
--   SKIP                          PENDING and not expired by the ledger's clock, or its
--                                 row is held by a concurrent transition: a later pass
--   MISSING                       no order: write a tombstone first (sweep_tombstone)
-- Rows another transaction holds are skipped (SKIP LOCKED), not waited for; locks are
-- taken in token order, so concurrent sweepers never deadlock.
CREATE FUNCTION sweep_cancel_expired(p_tokens text[])
RETURNS TABLE(token text, verdict text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_tokens IS NULL THEN
        RAISE EXCEPTION 'invalid argument: the token list is NULL' USING ERRCODE = 'SG004';
    END IF;
    RETURN QUERY
    WITH claim AS (
        SELECT o.id FROM orders o
         WHERE o.reservation_token = ANY(p_tokens) AND o.status = 'PENDING'
           AND o.reservation_expires_at < now()
         ORDER BY o.reservation_token
         FOR UPDATE SKIP LOCKED
    ), upd AS (
        UPDATE orders o SET status = 'CANCELLED_BY_SWEEPER', cancelled_at = now(),
               updated_at = now()
          FROM claim WHERE o.id = claim.id
        RETURNING o.reservation_token
    ), ev AS (
        INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
        SELECT u.reservation_token, 'PENDING', 'CANCELLED_BY_SWEEPER', 'sweeper', 'expired'
          FROM upd u
    )
    -- The outer SELECT reads the rows as they were before this statement: a row `upd`
    -- moved still shows PENDING there, so `upd` is consulted first.
    SELECT t.tok,
           CASE
               WHEN u.reservation_token IS NOT NULL THEN 'CANCELLED_NOW'
               WHEN o.status IS NULL THEN 'MISSING'
               WHEN o.status = 'CANCELLED_BY_SWEEPER' THEN 'ALREADY_CANCELLED_BY_SWEEPER'
               WHEN o.status = 'CANCELLED' THEN 'CANCELLED_BY_BUYER'
               WHEN o.status IN ('REFUND_REQUIRED', 'REFUNDED') THEN 'REFUND'
               WHEN o.status = 'COMMITTED' THEN 'COMMIT_CLEANUP'
               ELSE 'SKIP'
           END
      FROM unnest(p_tokens) WITH ORDINALITY AS t(tok, n)
      LEFT JOIN (SELECT DISTINCT reservation_token FROM upd) u
             ON u.reservation_token = t.tok
      LEFT JOIN orders o ON o.reservation_token = t.tok
     ORDER BY t.n;
END
$$;

-- 8b. The sweeper's tombstones: for expired reservations with no order at all, a
-- CANCELLED_BY_SWEEPER row written before the units go back, so a late materialize of the
-- token is refused instead of selling them twice. The arrays are parallel (one element
-- per reservation, from the server's EXPIRED entry). Verdict per token, in input order:
--   TOMBSTONED  this call wrote the tombstone: release the units
--   EXISTS      an order appeared first (a materialize won the race): judge it again
--               with sweep_cancel_expired
CREATE FUNCTION sweep_tombstone(
    p_tokens text[], p_skus text[], p_users text[], p_qtys integer[],
    p_expires_at_ms bigint[]
) RETURNS TABLE(token text, verdict text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n integer := coalesce(cardinality(p_tokens), 0);
BEGIN
    IF p_tokens IS NULL OR p_skus IS NULL OR p_users IS NULL OR p_qtys IS NULL
       OR p_expires_at_ms IS NULL
       OR cardinality(p_skus) <> v_n OR cardinality(p_users) <> v_n
       OR cardinality(p_qtys) <> v_n OR cardinality(p_expires_at_ms) <> v_n THEN
        RAISE EXCEPTION 'invalid argument: sweep_tombstone needs five arrays of the same length'
            USING ERRCODE = 'SG004';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_tokens, p_qtys, p_expires_at_ms) AS x(t, q, e)
                WHERE t IS NULL OR t = '' OR q IS NULL OR q <= 0
                   OR e IS NULL OR e < 0 OR e > 253402300799999) THEN
        RAISE EXCEPTION 'invalid argument: sweep_tombstone got an empty token, a qty that is not positive or an invalid time'
            USING ERRCODE = 'SG004';
    END IF;
    RETURN QUERY
    WITH ins AS (
        INSERT INTO orders (reservation_token, sku, user_id, qty, status,
                            reservation_expires_at, cancelled_at)
        SELECT x.t, x.s, x.u, x.q, 'CANCELLED_BY_SWEEPER', stockgate_ms_to_ts(x.e), now()
          FROM unnest(p_tokens, p_skus, p_users, p_qtys, p_expires_at_ms) AS x(t, s, u, q, e)
         ORDER BY x.t
        ON CONFLICT (reservation_token) DO NOTHING
        RETURNING reservation_token
    ), ev AS (
        INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
        SELECT i.reservation_token, NULL, 'CANCELLED_BY_SWEEPER', 'sweeper', 'tombstone'
          FROM ins i
    )
    SELECT t.tok, CASE WHEN i.reservation_token IS NOT NULL THEN 'TOMBSTONED' ELSE 'EXISTS' END
      FROM unnest(p_tokens) WITH ORDINALITY AS t(tok, n)
      LEFT JOIN ins i ON i.reservation_token = t.tok
     ORDER BY t.n;
END
$$;
