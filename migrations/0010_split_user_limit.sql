-- The per-user limit over a whole split sale (docs/cluster.md, "A split sale"): each
-- part's server holds a buyer to `per_user_limit` units on that part, so a buyer may
-- hold up to that many on several parts at once; the ledger is the one place that sees
-- every part, so it is where the limit over the parent is kept, at payment. A payment
-- that would take the buyer's paid units of the parent (COMMITTED orders on any of its
-- parts) over the parent's `per_user_limit` is refused: outcome LIMIT when no money
-- moved (nothing changes; the hold is the caller's to release), REFUND_REQUIRED when it
-- did. Every language pays through `pay_order`, so every language gets the rule.

-- The parent whose per-user limit paying `p_token` would exceed; NULL when the order is
-- not of a split part, the parent has no limit, or the payment fits. Payments of one
-- buyer on one parent are serialised by an advisory lock on (parent, buyer), taken
-- before the sum is read: the second of two concurrent payments reads the first's
-- committed order (each plpgsql statement sees what committed before it started).
CREATE FUNCTION split_over_limit(p_token text) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_parent text;
    v_limit  integer;
    v_user   text;
    v_qty    integer;
    v_paid   bigint;
BEGIN
    SELECT sp.parent, p.per_user_limit, o.user_id, o.qty
      INTO v_parent, v_limit, v_user, v_qty
      FROM orders o
      JOIN split_parts sp ON sp.sku = o.sku
      JOIN split_parents p ON p.parent = sp.parent
     WHERE o.reservation_token = p_token;
    IF NOT FOUND OR coalesce(v_limit, 0) = 0 THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('stockgate split limit'),
                                  hashtext(v_parent || E'\x1f' || v_user));
    SELECT coalesce(sum(o.qty), 0) INTO v_paid
      FROM orders o JOIN split_parts sp ON sp.sku = o.sku
     WHERE sp.parent = v_parent AND o.user_id = v_user AND o.status = 'COMMITTED'
       AND o.reservation_token <> p_token;
    IF v_paid + v_qty > v_limit THEN
        RETURN v_parent;
    END IF;
    RETURN NULL;
END
$$;

-- `pay_order` as migration 0006 made it, with the split limit checked before a PENDING
-- order within its deadline commits.
CREATE OR REPLACE FUNCTION pay_order(p_token text, p_payment_ref text, p_money_moved boolean)
RETURNS TABLE(outcome text, previous_status text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_live boolean;
    v_ref text;
    v_parent text;
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
        v_parent := split_over_limit(p_token);
        IF v_parent IS NOT NULL THEN
            IF NOT p_money_moved THEN
                RETURN QUERY SELECT 'LIMIT'::text, v_status;
                RETURN;
            END IF;
            UPDATE orders SET status = 'REFUND_REQUIRED',
                   payment_ref = coalesce(nullif(p_payment_ref, ''), payment_ref),
                   updated_at = now()
             WHERE reservation_token = p_token;
            INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail)
            VALUES (p_token, 'PENDING', 'REFUND_REQUIRED', 'payment',
                    format('payment over the per-user limit of the split sale %s', v_parent));
            RETURN QUERY SELECT 'REFUND_REQUIRED'::text, v_status;
            RETURN;
        END IF;
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
