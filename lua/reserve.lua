--[[
throttler: reserve permits from a limiter shared through Redis.

This script is a line-by-line mirror of the pure algorithm in `src/core`
(`State::resync`, `State::reserve_earliest_available`, `State::can_acquire`,
`State::set_rate`, and the bursty and warming-up policies). It performs the
same floating-point operations in the same order, so for the same inputs it
computes bit-for-bit the same waits and state as the Rust code; a
differential test (`tests/redis_differential.rs`) keeps the two in step.
Where a function below has a counterpart in `src/core`, it carries its name.

KEYS[1]  The limiter: a hash with four fields, each written with
         `%.17g` (exact round trip):
           stored  stored_permits
           next    next_free_micros (integer microseconds, server clock)
           rate    permits_per_second in force when the hash was written
                   (may be `inf`)
           max     max_permits in force when the hash was written

ARGV[1]  permits: an integer >= 1 to reserve, or 0 to QUERY: reply with the
         current wait (0 for a missing or corrupted key) and write nothing.
ARGV[2]  timeout_micros: an integer >= 0 for a try, which is refused when the
         existing debt does not fit (`next - timeout > now`, the negation of
         `State::can_acquire`); -1 for a plain reservation.
ARGV[3]  permits_per_second: a number > 0, or `inf`.
ARGV[4]  policy: `bursty` or `warming_up`.
ARGV[5]  bursty: max_burst_micros; warming_up: warmup_micros. An integer
         >= 0; values above 2^53 are capped at 2^53.
ARGV[6]  warming_up: cold_factor, a finite number >= 1. Ignored by bursty,
         but must be present (pass 0).
ARGV[7]  Optional, for tests only: now_micros, an integer in 0..=2^53.

Reply    An integer: the wait in microseconds (>= 0) for a granted
         reservation or a query; -1 for a refused try.

Errors   `ERR throttler: ...` for any invalid argument, before the key is
         read or written. If KEYS[1] holds something other than a hash, the
         HMGET fails with WRONGTYPE and that error is returned as is: data
         that is not ours is never overwritten.

Clock    ARGV[7] when given, else the server's `TIME` in microseconds. All
         callers of one key therefore share one clock, the server's.

Rate     When the `rate` in the hash differs from ARGV[3], the rate changed:
changes  as in `State::set_rate`, idle time up to now is first credited at
         the old rate (its stable interval recomputed from `rate`, with the
         old `max`, under the current policy arguments), then stored permits
         are rescaled to the same fraction of the new max_permits. The same
         happens when the rate is unchanged but the policy arguments give a
         different max_permits than the `max` in the hash (the limiter was
         reconfigured). This is done at the start of every call, before the
         try check, and is written with the reservation; a refused try or a
         query writes nothing, so the change is then applied by the next call
         that writes.

Missing  A missing key reads as a limiter that has been idle for a long time:
key      stored_permits = max_permits (full for bursty, cold for warming-up),
         next_free_micros = now, at the rate in ARGV[3]. (A limiter created
         in-process starts with no stored permits when bursty; a shared key
         cannot tell "new" from "expired", so it takes the idle reading.)

Corrupt  A hash whose fields are missing, not numbers, NaN, negative,
key      infinite (except `rate`, which may be `inf`), with `rate` <= 0, with
         `next` not an integer or above 2^53, or with `stored` > `max`, is
         treated exactly as a missing key and overwritten by the next call
         that writes. Fields other than the four above are left alone.

Expiry   Every write sets a TTL (PEXPIRE) that lasts until the key would
         read as a missing key anyway: until next_free_micros has passed AND
         idle time has refilled stored_permits to max_permits (rounded up to
         whole milliseconds, plus 2 ms, at most 2^53 / 1000 ms). At an
         unchanged rate and configuration, expiry is therefore invisible.
         (Across a rate change it can be visible in two corner cases the
         in-process limiter treats specially: leaving an infinite rate, and
         leaving a rate with max_permits = 0.) A refused try or a query never
         sets a TTL.

Numbers  Time is integer microseconds, saturating at 2^53 (MAX_MICROS). Lua
         numbers are doubles, exactly like the f64 of the core; every field is
         written with `%.17g` because Redis would round a bare Lua number to 14
         significant digits. Cost: one HMGET, one HSET, one PEXPIRE.

Redis    4.0 or newer (HSET with several fields). On servers older than 5,
         the script turns on effects replication before reading TIME.
]]

-- Constants, as in src/core.
local MAX_MICROS = 9007199254740992 -- 2^53
local F64_MAX = 1.7976931348623157e308 -- f64::MAX
local MICROS_PER_SECOND = 1000000.0
local INFINITY = math.huge
local TTL_CAP_MS = 9007199254740 -- floor(2^53 / 1000)

local floor = math.floor

local function fail(what)
    return redis.error_reply('ERR throttler: ' .. what)
end

-- Shows a bad argument in an error message (shortened).
local function shown(value)
    return '(got "' .. string.sub(tostring(value), 1, 40) .. '")'
end

-- f64::min: a NaN operand loses.
local function min(a, b)
    if b < a or a ~= a then
        return b
    end
    return a
end

-- An integer argument (finite, no fraction), or nil.
local function integer_arg(value)
    local x = tonumber(value)
    if x == nil or x ~= floor(x) or x == INFINITY or x == -INFINITY then
        return nil
    end
    return x
end

---------------------------------------------------------------------------
-- Arguments. Everything is checked before the key is read or written.
---------------------------------------------------------------------------

if #KEYS ~= 1 then
    return fail('expected exactly 1 key, the limiter (got ' .. #KEYS .. '); call with KEYS[1] = limiter key')
end
if #ARGV ~= 6 and #ARGV ~= 7 then
    return fail('expected 6 or 7 arguments: permits, timeout_micros, permits_per_second, policy, '
        .. 'max_burst_micros|warmup_micros, cold_factor[, now_micros] (got ' .. #ARGV .. ')')
end

local key = KEYS[1]

local permits = integer_arg(ARGV[1])
if permits == nil or permits < 0 or permits > MAX_MICROS then
    return fail('permits (ARGV[1]) must be an integer from 1 to 2^53, or 0 to query ' .. shown(ARGV[1]))
end

local timeout_micros = integer_arg(ARGV[2])
if timeout_micros == nil or timeout_micros < -1 then
    return fail('timeout_micros (ARGV[2]) must be an integer >= 0, or -1 for no timeout ' .. shown(ARGV[2]))
end
local is_try = timeout_micros >= 0
timeout_micros = min(timeout_micros, MAX_MICROS)

-- stable_interval_micros: rejects NaN, zero, negative rates (and -inf).
local permits_per_second = tonumber(ARGV[3])
if permits_per_second == nil or not (permits_per_second > 0) then
    return fail('permits_per_second (ARGV[3]) must be a number > 0 or inf ' .. shown(ARGV[3]))
end

local policy = ARGV[4]
local is_bursty
if policy == 'bursty' then
    is_bursty = true
elseif policy == 'warming_up' then
    is_bursty = false
else
    return fail('policy (ARGV[4]) must be "bursty" or "warming_up" ' .. shown(policy))
end

-- Bursty::max_burst_micros or WarmingUp::warmup_micros, capped like `micros`.
local policy_micros = integer_arg(ARGV[5])
if policy_micros == nil or policy_micros < 0 then
    return fail((is_bursty and 'max_burst_micros' or 'warmup_micros')
        .. ' (ARGV[5]) must be an integer >= 0 ' .. shown(ARGV[5]))
end
policy_micros = min(policy_micros, MAX_MICROS)

local cold_factor = 0
if not is_bursty then
    cold_factor = tonumber(ARGV[6])
    if cold_factor == nil or not (cold_factor >= 1) or cold_factor == INFINITY then
        return fail('cold_factor (ARGV[6]) must be a finite number >= 1 ' .. shown(ARGV[6]))
    end
end

local now_micros
if ARGV[7] ~= nil then
    now_micros = integer_arg(ARGV[7])
    if now_micros == nil or now_micros < 0 or now_micros > MAX_MICROS then
        return fail('now_micros (ARGV[7]) must be an integer from 0 to 2^53, or absent to use TIME '
            .. shown(ARGV[7]))
    end
end

---------------------------------------------------------------------------
-- The policies (src/core/bursty.rs, src/core/warming_up.rs, Policy).
---------------------------------------------------------------------------

-- stable_interval_micros: 0 for an infinite rate, capped at MAX_MICROS.
local function stable_interval_micros(rate)
    return min(MICROS_PER_SECOND / rate, MAX_MICROS)
end

-- to_micros: truncates, saturates at MAX_MICROS; NaN reads as MAX_MICROS.
local function to_micros(micros)
    if micros < MAX_MICROS then
        return floor(micros)
    end
    return MAX_MICROS
end

-- Policy::set_stable_interval: returns max_permits, threshold_permits, slope
-- (the last two are used by the warming-up policy only).
local function set_stable_interval(stable, rate)
    if is_bursty then
        -- Bursty::max_permits
        if rate == INFINITY then
            return 0.0, 0.0, 0.0
        end
        return min(policy_micros * rate / 1000000.0, F64_MAX), 0.0, 0.0
    end
    -- WarmingUp::set_stable_interval
    if stable == 0.0 then
        return 0.0, 0.0, 0.0
    end
    local warmup = policy_micros
    local cold = min(stable * cold_factor, F64_MAX)
    local threshold_permits = min(0.5 * warmup / stable, F64_MAX)
    local max_permits = min(threshold_permits + 2.0 * warmup / min(stable + cold, F64_MAX), F64_MAX)
    local slope = 0.0
    if max_permits > threshold_permits then
        slope = min((cold - stable) / (max_permits - threshold_permits), F64_MAX)
    end
    return max_permits, threshold_permits, slope
end

-- Policy::cool_down_interval_micros
local function cool_down_interval_micros(stable, max_permits)
    if is_bursty then
        return stable
    end
    if max_permits > 0.0 then
        return policy_micros / max_permits
    end
    return stable
end

-- Policy::stored_permits_to_wait_micros
local function stored_permits_to_wait_micros(stored, permits, stable, threshold_permits, slope)
    if is_bursty then
        return 0.0
    end
    local above_threshold = stored - threshold_permits
    local micros = 0.0
    if above_threshold > 0.0 then
        local take_above = min(above_threshold, permits)
        -- A trapezoid; permits_to_time(p) = stable + p * slope.
        local length = (stable + above_threshold * slope)
            + (stable + (above_threshold - take_above) * slope)
        micros = take_above * length / 2.0
        permits = permits - take_above
    end
    return micros + stable * permits
end

---------------------------------------------------------------------------
-- The state.
---------------------------------------------------------------------------

-- The configuration in force from now on.
local stable = stable_interval_micros(permits_per_second)
local max_permits, threshold_permits, slope = set_stable_interval(stable, permits_per_second)

-- The clock.
if now_micros == nil then
    if redis.replicate_commands then
        redis.replicate_commands()
    end
    local time = redis.call('TIME')
    now_micros = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- Load. WRONGTYPE (the key is not a hash) propagates: nothing is written.
local fields = redis.call('HMGET', key, 'stored', 'next', 'rate', 'max')
local stored_permits = tonumber(fields[1])
local next_free_micros = tonumber(fields[2])
local old_rate = tonumber(fields[3])
local old_max = tonumber(fields[4])
-- NaN fails every comparison below, so it is rejected too.
local valid = stored_permits ~= nil and next_free_micros ~= nil and old_rate ~= nil and old_max ~= nil
    and old_max >= 0 and old_max < INFINITY
    and stored_permits >= 0 and stored_permits <= old_max
    and next_free_micros >= 0 and next_free_micros <= MAX_MICROS
    and next_free_micros == floor(next_free_micros)
    and old_rate > 0

-- QUERY: max(next_free_micros - now, 0), writing nothing.
if permits == 0 then
    if valid and next_free_micros > now_micros then
        return next_free_micros - now_micros
    end
    return 0
end

if not valid then
    -- Missing (or corrupted): idle for a long time.
    stored_permits = max_permits
    next_free_micros = now_micros
    old_rate = permits_per_second
    old_max = max_permits
end

-- State::resync, at a given stable interval and max_permits.
local function resync(stable_interval, max)
    if now_micros > next_free_micros then
        local cool_down = cool_down_interval_micros(stable_interval, max)
        -- idle > 0, so an infinite quotient (cool_down == 0) is fine, never NaN.
        local new_permits = (now_micros - next_free_micros) / cool_down
        stored_permits = min(stored_permits + new_permits, max)
        next_free_micros = min(now_micros, MAX_MICROS)
    end
end

-- State::set_rate, when the rate (or the configuration) changed.
if old_rate ~= permits_per_second or old_max ~= max_permits then
    local old_stable = stable_interval_micros(old_rate)
    resync(old_stable, old_max)
    if old_stable == 0.0 then
        -- Policy::stored_permits_after_infinite_rate
        stored_permits = is_bursty and max_permits or 0.0
    elseif old_max == 0.0 then
        -- Policy::initial_stored_permits
        stored_permits = is_bursty and 0.0 or max_permits
    else
        -- stored / old_max is in 0..=1, so this never overflows.
        stored_permits = stored_permits / old_max * max_permits
    end
end

-- State::can_acquire, for a try: refused means nothing is written at all.
if is_try and next_free_micros - timeout_micros > now_micros then
    return -1
end

-- State::reserve_earliest_available
resync(stable, max_permits)
local moment = next_free_micros
local requested = permits
local stored_to_spend = min(requested, stored_permits)
local fresh = requested - stored_to_spend
local wait = stored_permits_to_wait_micros(stored_permits, stored_to_spend, stable, threshold_permits, slope)
    + fresh * stable
next_free_micros = min(next_free_micros + to_micros(wait), MAX_MICROS)
stored_permits = stored_permits - stored_to_spend

-- Write the state, then a TTL that ends when the key would read as missing:
-- the debt paid and the stored permits refilled to max_permits.
redis.call('HSET', key,
    'stored', string.format('%.17g', stored_permits),
    'next', string.format('%.17g', next_free_micros),
    'rate', string.format('%.17g', permits_per_second),
    'max', string.format('%.17g', max_permits))
-- The margin is 2 ms, not 1: before Redis 7.2, PEXPIRE reads the clock twice
-- and deletes the key at once if a millisecond boundary falls in between and
-- the TTL is 1 ms.
local refill_micros = (max_permits - stored_permits) * cool_down_interval_micros(stable, max_permits)
local ttl_ms = math.ceil((next_free_micros - now_micros) / 1000 + refill_micros / 1000) + 2
if not (ttl_ms < TTL_CAP_MS) then
    ttl_ms = TTL_CAP_MS -- also for inf and NaN
end
redis.call('PEXPIRE', key, string.format('%.17g', ttl_ms))

-- State::reserve: the wait until `moment`, never negative.
if moment > now_micros then
    return moment - now_micros
end
return 0
