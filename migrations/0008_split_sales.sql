-- A hot sku split over several groups (docs/cluster.md, "A split sale"): one parent, N
-- parts, each part an ordinary sale (a row of `sales`) on the group whose slots its sku
-- hashes to. The parent's allocation is what the whole split may ever hand out; the
-- parts' allocations move between them through `sale_adjustments` (the rebalance), and
-- their sum is kept at or below the parent's here, in the database, whatever tool writes.

CREATE TABLE split_parents (
    parent          TEXT PRIMARY KEY
                    CHECK (parent ~ '^[A-Za-z0-9_.:-]{1,48}$'),
    allocation      BIGINT NOT NULL CHECK (allocation >= 0),
    parts           INTEGER NOT NULL CHECK (parts BETWEEN 1 AND 64),
    -- Units per user on each part (0 or NULL: none); see docs/cluster.md for what it
    -- bounds across parts.
    per_user_limit  INTEGER CHECK (per_user_limit >= 0),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE split_parts (
    parent          TEXT NOT NULL REFERENCES split_parents (parent),
    part_index      INTEGER NOT NULL CHECK (part_index >= 0),
    -- The part's sale; a sale belongs to at most one split.
    sku             TEXT NOT NULL UNIQUE REFERENCES sales (sku),
    -- The history id (`INFO`'s `stockgate_history`) of the group the part was created on:
    -- the split tools refuse a server reporting another, as `server_binding` does for a
    -- ledger of one group.
    history_id      TEXT NOT NULL CHECK (length(history_id) > 0),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (parent, part_index)
);

-- SG005 when the parts of `p_parent` would hold more than the parent's allocation, or a
-- part's index is not below the parent's part count. The parent's row is locked first,
-- so two transactions raising two parts at once are checked one after the other (each
-- statement of a plpgsql function sees what committed before it started).
CREATE FUNCTION split_check_parent(p_parent text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_alloc bigint;
    v_parts integer;
    v_sum   numeric;
    v_bad   integer;
BEGIN
    SELECT allocation, parts INTO v_alloc, v_parts
      FROM split_parents WHERE parent = p_parent FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_bad
      FROM split_parts WHERE parent = p_parent AND part_index >= v_parts;
    IF v_bad > 0 THEN
        RAISE EXCEPTION 'split %: a part index is not below its % parts', p_parent, v_parts
            USING ERRCODE = 'SG005';
    END IF;
    SELECT coalesce(sum(s.allocation), 0) INTO v_sum
      FROM split_parts sp JOIN sales s ON s.sku = sp.sku
     WHERE sp.parent = p_parent;
    IF v_sum > v_alloc THEN
        RAISE EXCEPTION 'split %: the parts would hold % units, more than the parent''s allocation %',
            p_parent, v_sum, v_alloc
            USING ERRCODE = 'SG005';
    END IF;
END
$$;

CREATE FUNCTION split_parts_check() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM split_check_parent(NEW.parent);
    RETURN NULL;
END
$$;

CREATE FUNCTION split_sales_check() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_parent text;
BEGIN
    SELECT parent INTO v_parent FROM split_parts WHERE sku = NEW.sku;
    IF FOUND THEN
        PERFORM split_check_parent(v_parent);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER split_parts_within_parent
    AFTER INSERT OR UPDATE ON split_parts
    FOR EACH ROW EXECUTE FUNCTION split_parts_check();

CREATE TRIGGER split_parents_within_allocation
    AFTER UPDATE ON split_parents
    FOR EACH ROW EXECUTE FUNCTION split_parts_check();

-- Only raises need checking, but a cheap check on every allocation change keeps the rule
-- in one place.
CREATE TRIGGER split_sales_within_parent
    AFTER UPDATE OF allocation ON sales
    FOR EACH ROW WHEN (NEW.allocation > OLD.allocation)
    EXECUTE FUNCTION split_sales_check();
