-- paceline: slots for calls in flight (Limit::concurrent), shared through
-- Redis. Its own script, beside the limiter's (src/redis/leases/).
--
-- KEYS[1]: the slots key of a limiter or of one of its keys: a sorted set
--   of lease ids, each scored by when it expires (µs, Redis's TIME).
-- ARGV[1]: "take" or "release".
-- ARGV[2]: the lease id (chosen by the caller, unique to one call).
-- ARGV[3]: take only: how many leases may be live at once (at least 1).
-- ARGV[4]: take only: the lease's time to live, in µs (at least 1 000).
--
-- take: drops the expired leases, then adds (or renews) the lease if it
--   is live already or fewer than ARGV[3] are: {1, live, 0}. Otherwise
--   {0, live, µs until the earliest live lease expires}. A renewal is a
--   take of a lease already held; a lease that expired meanwhile (its
--   holder could not renew it in time) is taken again only if there is
--   room. The key lives as long as its longest lease.
-- release: removes the lease (an empty set is no key): {1, live, 0}.

local key = KEYS[1]
local mode = ARGV[1]
local id = ARGV[2]

if mode == 'release' then
  redis.call('ZREM', key, id)
  return {1, redis.call('ZCARD', key), 0}
end

if mode ~= 'take' then
  return redis.error_reply('ERR paceline: the slots script has no mode ' .. tostring(mode))
end

local calls = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
if not calls or calls < 1 or not ttl or ttl < 1000 then
  return redis.error_reply('ERR paceline: the slots script was called with bad arguments')
end
local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' and kind ~= 'none' then
  return redis.error_reply('ERR paceline: the slots key holds a ' .. kind)
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))

local live = redis.call('ZCARD', key)
local held = redis.call('ZSCORE', key, id)
if held or live < calls then
  -- Written as an integer: Lua would write a number of 16 digits to 14.
  redis.call('ZADD', key, string.format('%.0f', now + ttl), id)
  if not held then
    live = live + 1
  end
  local ttl_ms = math.ceil(ttl / 1000)
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  return {1, live, 0}
end

local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
local until_free = tonumber(first[2]) - now
if until_free < 0 then
  until_free = 0
end
return {0, live, until_free}
