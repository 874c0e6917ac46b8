-- paceline: slots for calls in flight (Limit::concurrent), shared through
-- Redis. Its own script, beside the limiter's (src/redis/leases/).
--
-- KEYS[1]: the slots key of a limiter or of one of its keys: a sorted set
--   of lease ids, each scored by when it expires (µs, Redis's TIME).
-- KEYS[2], KEYS[3]: its line, the calls waiting for a slot: their ids
--   scored by when each came (KEYS[2]), and by when each last asked
--   (KEYS[3]).
-- ARGV[1]: "take", "release" or "leave".
-- ARGV[2]: the lease id (chosen by the caller, unique to one take), or for
--   leave the waiting call's id.
-- ARGV[3]: take only: how many leases may be live at once (at least 1).
-- ARGV[4]: take only: the lease's time to live, in µs (at least 1 000).
-- ARGV[5]: take only, optional: the id of the call the lease is for
--   (chosen by the caller, the same for each take of one call), which
--   waits in the line while it is not served; empty: none.
-- ARGV[6]: take only, a renewal's: when the lease expires as its holder
--   last heard (µs, Redis's TIME, as a take's reply said).
--
-- take: drops the expired leases, and the calls in line that have not
--   asked for LINE_GRACE. A lease live already is renewed: {1, live,
--   when it now expires, 0}. Otherwise the lease is added if fewer than
--   ARGV[3] are live and the call's turn has come: the free slots go to
--   the calls in line in the order they came, then to any; the call
--   leaves the line: {1, live, when it expires, 0}. Otherwise the call
--   stands in the line (keeping its place) and the reply is {0, live, µs
--   until the earliest live lease expires (0 if a slot is free for a call
--   ahead), calls ahead of it in line}. A renewal is a take of a lease
--   already held; a lease that expired meanwhile (its holder could not
--   renew it in time) is taken again only as a new call's would be, and
--   one gone before it was to expire (released: a renewal run after the
--   release, or lost) is not taken again, before then: {0, live, 0, 0}.
--   The slots key lives as long as its longest lease, the line as long as
--   a call in it asks.
-- release: removes the lease (an empty set is no key): {1, live, 0, 0}.
-- leave: removes the call from the line: {1, live, 0, 0}.

local key, line, asked = KEYS[1], KEYS[2], KEYS[3]
local mode = ARGV[1]
local id = ARGV[2]

if mode == 'release' then
  redis.call('ZREM', key, id)
elseif mode == 'leave' then
  redis.call('ZREM', line, id)
  redis.call('ZREM', asked, id)
elseif mode ~= 'take' then
  return redis.error_reply('ERR paceline: the slots script has no mode ' .. tostring(mode))
end
if mode ~= 'take' then
  return {1, redis.call('ZCARD', key), 0, 0}
end

local calls = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local waiter = ARGV[5] ~= '' and ARGV[5] or nil
local renewing = tonumber(ARGV[6])
if not calls or calls < 1 or not ttl or ttl < 1000 then
  return redis.error_reply('ERR paceline: the slots script was called with bad arguments')
end
for _, k in ipairs(KEYS) do
  local kind = redis.call('TYPE', k).ok
  if kind ~= 'zset' and kind ~= 'none' then
    return redis.error_reply('ERR paceline: the slots key holds a ' .. kind)
  end
end

-- How long a call may go without asking before it loses its place (µs):
-- a waiting call asks again at least every 200 ms.
local LINE_GRACE = 500000

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))

local live = redis.call('ZCARD', key)
local held = redis.call('ZSCORE', key, id)
if not held and renewing and now < renewing then
  -- Gone before it expired: released.
  return {0, live, 0, 0}
end
local free = calls - live
-- The calls in line ahead of this one (all of them for a call not in it).
local ahead = 0
if not held and (free > 0 or waiter) then
  ahead = redis.call('ZCARD', line)
  if ahead > 0 then
    local gone = redis.call('ZRANGEBYSCORE', asked, '-inf', string.format('%.0f', now - LINE_GRACE), 'LIMIT', 0, 100)
    if #gone > 0 then
      redis.call('ZREM', line, unpack(gone))
      redis.call('ZREM', asked, unpack(gone))
    end
    ahead = redis.call('ZRANK', line, waiter or '') or redis.call('ZCARD', line)
  end
end
if held or ahead < free then
  -- Written as an integer: Lua would write a number of 16 digits to 14.
  redis.call('ZADD', key, string.format('%.0f', now + ttl), id)
  if not held then
    live = live + 1
    if waiter then
      redis.call('ZREM', line, waiter)
      redis.call('ZREM', asked, waiter)
    end
  end
  local ttl_ms = math.ceil(ttl / 1000)
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  return {1, live, now + ttl, 0}
end

if waiter then
  local stamp = string.format('%.0f', now)
  redis.call('ZADD', line, 'NX', stamp, waiter)
  redis.call('ZADD', asked, stamp, waiter)
  local grace_ms = LINE_GRACE / 1000
  redis.call('PEXPIRE', line, grace_ms)
  redis.call('PEXPIRE', asked, grace_ms)
  ahead = redis.call('ZRANK', line, waiter)
end
local until_free = 0
if free <= 0 then
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  until_free = math.max(tonumber(first[2]) - now, 0)
end
return {0, live, until_free, ahead}
