-- One ledger, several groups (docs/ledger.md, "A ledger and its server histories"): a
-- ledger may describe several server histories, one per group of a cluster, each bound
-- deliberately (the first on first contact, every other by `stockgate-sweeper bind`).
-- Every sale records the history it lives on, so each group's tools work on their own
-- sales only, and each group's materializer keeps its own feed position.

CREATE TABLE server_bindings (
    history_id  TEXT PRIMARY KEY CHECK (length(history_id) > 0),
    -- The operator's name for the group (`bind --group`), for people reading the table.
    group_name  TEXT,
    bound_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The old singleton's binding becomes the first of the list.
INSERT INTO server_bindings (history_id, bound_at)
    SELECT history_id, bound_at FROM server_binding;
DROP TABLE server_binding;

-- The old name stays readable (`SELECT history_id FROM server_binding`) while the ledger
-- has exactly one binding, and is empty when it has several; it cannot be written, so a
-- writer that still believes in one binding fails instead of binding a second.
CREATE VIEW server_binding AS
    SELECT TRUE AS singleton, history_id, bound_at FROM server_bindings
     WHERE (SELECT count(*) FROM server_bindings) = 1
     LIMIT 1;

-- The history each sale lives on: set when a tool registers the sale against a server.
-- NULL: registered before this column existed and not yet claimed; such a sale counts as
-- the binding's while the ledger has exactly one.
ALTER TABLE sales ADD COLUMN history_id TEXT CHECK (length(history_id) > 0);
UPDATE sales s SET history_id = sp.history_id FROM split_parts sp WHERE sp.sku = s.sku;
UPDATE sales SET history_id = (SELECT history_id FROM server_bindings)
 WHERE history_id IS NULL AND (SELECT count(*) FROM server_bindings) = 1;
CREATE INDEX sales_by_history ON sales (history_id);

-- A materializer's position is per consumer name and per history, so the materializers
-- of two groups never move each other's position, and each position's fingerprint is
-- checked against its own group's feed. '' = a position written before this column
-- existed in a ledger with no binding: the first materializer of that name claims it.
ALTER TABLE feed_position ADD COLUMN history_id TEXT NOT NULL DEFAULT '';
UPDATE feed_position SET history_id = (SELECT history_id FROM server_bindings)
 WHERE (SELECT count(*) FROM server_bindings) = 1;
ALTER TABLE feed_position DROP CONSTRAINT feed_position_pkey;
ALTER TABLE feed_position ADD PRIMARY KEY (consumer, history_id);

-- The position of `p_consumer` on history `p_history`, moved past a batch in the batch's
-- transaction. SG003 for no such row; SG004 a negative LSN.
CREATE FUNCTION feed_set_position(p_consumer text, p_history text, p_last_lsn bigint,
                                  p_fingerprint bigint)
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
     WHERE consumer = p_consumer AND history_id = coalesce(p_history, '');
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no feed position for consumer % on history %', p_consumer,
            coalesce(p_history, '(none)')
            USING ERRCODE = 'SG003';
    END IF;
END
$$;

-- The three-argument form keeps working for a consumer with one position (one group);
-- for a consumer name with positions on several histories it cannot know which one is
-- meant, and refuses (SG004) instead of moving them all.
CREATE OR REPLACE FUNCTION feed_set_position(p_consumer text, p_last_lsn bigint,
                                             p_fingerprint bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_rows integer;
    v_history text;
BEGIN
    SELECT count(*), min(history_id) INTO v_rows, v_history
      FROM feed_position WHERE consumer = p_consumer;
    IF v_rows > 1 THEN
        RAISE EXCEPTION 'consumer % has a feed position on each of % server histories: name the history, feed_set_position(consumer, history_id, last_lsn, fingerprint)',
            p_consumer, v_rows
            USING ERRCODE = 'SG004';
    END IF;
    IF v_rows = 0 THEN
        RAISE EXCEPTION 'no feed position for consumer %', p_consumer
            USING ERRCODE = 'SG003';
    END IF;
    PERFORM feed_set_position(p_consumer, v_history, p_last_lsn, p_fingerprint);
END
$$;
