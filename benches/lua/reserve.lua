-- Baseline reservation gate (DESIGN.md, "The baseline we measure against: Redis + Lua").
-- KEYS[1] = {SKU_SHARD}:stock          (integer: units left in this shard)
-- KEYS[2] = {SKU_SHARD}:expiry_index   (sorted set: token scored by expiry epoch seconds)
-- KEYS[3] = {SKU_SHARD}:reservation:<token>   (hash)
-- ARGV    = sku, user, shard, ttl seconds, expiry epoch seconds, reservation token
-- Returns 1 reserved, 2 idempotent replay (this token exists), 0 sold out.
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 2
end
local stock = tonumber(redis.call('GET', KEYS[1]))
if stock and stock > 0 then
  redis.call('DECR', KEYS[1])
  redis.call('HSET', KEYS[3],
    'sku', ARGV[1], 'user', ARGV[2], 'shard', ARGV[3], 'qty', 1,
    'status', 'RESERVED', 'expiry', ARGV[5])
  -- Backstop only: the sweeper deletes the record explicitly.
  redis.call('EXPIRE', KEYS[3], 86400)
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[6])
  return 1
end
return 0
