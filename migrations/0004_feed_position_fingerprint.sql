-- The materializer's position carries a fingerprint of the entry it names, so a feed
-- from another history (a server restored from an old copy, a different group, a split
-- brain) is refused instead of being read "after" a position that means something else
-- there. NULL: position 0, or a row written before this column existed (checked from the
-- next batch on).
ALTER TABLE feed_position ADD COLUMN last_fingerprint BIGINT;
