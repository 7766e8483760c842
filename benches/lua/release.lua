-- Baseline release (exactly once): give a reservation's units back to its shard.
-- KEYS[1] = {SKU_SHARD}:stock, KEYS[2] = {SKU_SHARD}:expiry_index,
-- KEYS[3] = {SKU_SHARD}:reservation:<token>
-- ARGV[1] = reservation token
-- Returns 1 if this call returned the units, 0 if nothing changed (unknown, released, committed).
if redis.call('HGET', KEYS[3], 'status') ~= 'RESERVED' then
  return 0
end
local qty = tonumber(redis.call('HGET', KEYS[3], 'qty')) or 1
redis.call('INCRBY', KEYS[1], qty)
redis.call('HSET', KEYS[3], 'status', 'RELEASED')
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
