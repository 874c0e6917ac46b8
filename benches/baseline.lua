--[[
The baseline for `benches/redis.rs`: a straightforward Redis script for the
same reservation as the crate's script (`lua/`) with the bursty policy, written the
plain way. It is here to be measured against, not to be used.

KEYS[1]  A hash with two fields: stored_permits and next_free_micros.
ARGV     permits, timeout_micros (-1: no timeout), permits_per_second,
         max_burst_micros.
Reply    The wait in microseconds, or -1 for a refused try.

Same rules as the crate's script: the server's clock; a missing key is a
full limiter; stored permits are spent first and free, fresh ones cost one
stable interval each, charged to the next caller; a try is refused, writing
nothing, when the existing debt exceeds its timeout; the key expires once it
would read as full anyway. (No argument checks and no rate changes.)
]]

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local permits = tonumber(ARGV[1])
local timeout = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local max_burst_micros = tonumber(ARGV[4])

local interval = 1000000 / rate
local max_permits = max_burst_micros * rate / 1000000

local state = redis.call('HMGET', KEYS[1], 'stored_permits', 'next_free_micros')
local stored = tonumber(state[1]) or max_permits
local next_free = tonumber(state[2]) or now

if timeout >= 0 and next_free - timeout > now then
    return -1
end
if now > next_free then
    stored = math.min(max_permits, stored + (now - next_free) / interval)
    next_free = now
end
local moment = next_free
local spent = math.min(permits, stored)
next_free = next_free + math.floor((permits - spent) * interval)
stored = stored - spent

-- Redis 7 writes Lua numbers with 17 significant digits: exact.
redis.call('HSET', KEYS[1], 'stored_permits', stored, 'next_free_micros', next_free)
local refill = (max_permits - stored) * interval
redis.call('PEXPIRE', KEYS[1], math.ceil((next_free - now + refill) / 1000) + 2)

return math.max(moment - now, 0)
