-- The simpler per-user baseline: one reservation per user key, no expiry index.
-- KEYS[1] = {SKU_SHARD}:stock, KEYS[2] = {SKU_SHARD}:user:<user>
-- ARGV    = qty, ttl seconds (600), reservation token
-- Returns 1 reserved, 2 the user already holds a reservation, 0 sold out.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 2
end
local qty = tonumber(ARGV[1])
local stock = tonumber(redis.call('GET', KEYS[1]))
if stock and stock >= qty then
  redis.call('DECRBY', KEYS[1], qty)
  redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[2])
  return 1
end
return 0
