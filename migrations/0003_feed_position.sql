-- The order feed's materializer (client/src/materialize.rs): how far each consumer has
-- applied the feed. Updated in the same transaction as the orders it wrote, so after any
-- crash the position says exactly which entries are in the ledger.
CREATE TABLE feed_position (
    consumer    TEXT PRIMARY KEY,
    stream      TEXT NOT NULL,
    -- LSN of the last entry applied (entry id `<lsn>-0`); 0 = nothing yet.
    last_lsn    BIGINT NOT NULL CHECK (last_lsn >= 0),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
