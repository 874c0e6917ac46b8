--[[
throttler: reserve permits from a limiter shared through Redis.

This script is a line-by-line mirror of the pure algorithm in `src/core`
(`State::resync`, `State::reserve_earliest_available`, `State::can_acquire`,
`State::set_rate`, and the bursty and warming-up policies). It performs the
same floating-point operations in the same order, so for the same inputs it
computes bit-for-bit the same waits and state as the Rust code; a
differential test (`tests/redis_differential.rs`) keeps the two in step.
Where a block below has a counterpart in `src/core`, it carries its name.
It is written for speed (Redis runs one script at a time, so its time in
here is the limit of every caller): no helper functions, no string
building, each argument converted once, three Redis calls per reservation.

KEYS[1]  The limiter: a string of exactly 40 bytes, five little-endian
         IEEE doubles, `struct.pack('<ddddd', ...)` (exact, no rounding):
           1  stored_permits
           2  next_free_micros (an integer, on the clock of the call)
           3  permits_per_second in force when it was written (may be inf)
           4  max_permits in force when it was written
           5  expires_micros: when the key's TTL ends, as last set (same
              clock as next_free_micros); see Expiry

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
         read or written. If KEYS[1] holds something other than a string
         (a hash, a list, ...), the GET fails with WRONGTYPE and that error
         is returned as is: nothing is written. (So does a key left by the
         first version of this script, which kept the state in a hash:
         delete it, or let it expire.)

Clock    ARGV[7] when given, else the server's `TIME` in microseconds. All
         callers of one key therefore share one clock, the server's.

Rate     When the rate in the key differs from ARGV[3], the rate changed:
changes  as in `State::set_rate`, idle time up to now is first credited at
         the old rate (its stable interval recomputed from that rate, with
         the old max_permits, under the current policy arguments), then
         stored permits are rescaled to the same fraction of the new
         max_permits. The same happens when the rate is unchanged but the
         policy arguments give a different max_permits than the one in the
         key (the limiter was reconfigured). This is done at the start of
         every call, before the try check, and is written with the
         reservation; a refused try or a query writes nothing, so the change
         is then applied by the next call that writes.

Missing  A missing key reads as a limiter that has been idle for a long time:
key      stored_permits = max_permits (full for bursty, cold for warming-up),
         next_free_micros = now, at the rate in ARGV[3]. (A limiter created
         in-process starts with no stored permits when bursty; a shared key
         cannot tell "new" from "expired", so it takes the idle reading.)

Corrupt  A string that is not 40 bytes long, or whose fields are NaN,
key      negative, infinite (except the rate, which may be inf), with a rate
         <= 0, with next_free_micros not an integer or above 2^53, or with
         stored_permits > max_permits, is treated exactly as a missing key
         and overwritten by the next call that writes (a query or a refused
         try leaves it alone).

Expiry   The key must live until it would read as a missing key anyway: until
         next_free_micros has passed AND idle time has refilled
         stored_permits to max_permits (rounded up to whole milliseconds,
         plus 2 ms; at most 2^53 / 1000 ms). At an unchanged rate and
         configuration, expiry is therefore invisible. (Across a rate change
         it can be visible in two corner cases the in-process limiter treats
         specially: leaving an infinite rate, and leaving a rate with
         max_permits = 0.)
         Setting a TTL costs Redis more than the rest of the write, so a
         write keeps the TTL it finds (`SET ... KEEPTTL`) when
         expires_micros already covers that moment, and otherwise sets one
         with slack (`SET ... PX`): twice what the key needs, but at most 1 s
         more, recording its end in expires_micros. A busy key thus sets a
         TTL about once per second that its end moves instead of on every
         call, and an idle key still goes soon after it reads as missing.
         A refused try or a query never writes, so never sets a TTL. (A TTL
         removed from outside, e.g. by PERSIST, is therefore not restored
         until the key needs a longer one; and with ARGV[7], expires_micros
         is on the caller's clock.)

Numbers  Time is integer microseconds, saturating at 2^53 (MAX_MICROS). Lua
         numbers are doubles, exactly like the f64 of the core, and the state
         is stored as their exact bytes. Cost: TIME, GET, SET.

Redis    6.0 or newer (SET ... KEEPTTL), with effects replication (the
         default since 5.0, the only mode since 7.0), as the script writes
         after reading TIME.
]]

-- Constants, as in src/core.
local MAX_MICROS = 9007199254740992 -- 2^53
local F64_MAX = 1.7976931348623157e308 -- f64::MAX
local INFINITY = 1 / 0
local TTL_CAP_MS = 9007199254740 -- floor(2^53 / 1000)
local TTL_MAX_SLACK_MS = 1000
local BAD = 'ERR throttler: %s (got "%s")'

-- Comparisons below are written `if x > cap then x = cap end` where the core
-- has `x.min(cap)`: the same thing, as no x there can be NaN. An integer
-- check is `x % 1 == 0`, which NaN and the infinities fail.

---------------------------------------------------------------------------
-- Arguments. Everything is checked before the key is read or written.
---------------------------------------------------------------------------

local argv = ARGV
local nargs = #argv
if #KEYS ~= 1 then
    return redis.error_reply('ERR throttler: expected exactly 1 key, the limiter (got '
        .. #KEYS .. '); call with KEYS[1] = limiter key')
end
if nargs ~= 6 and nargs ~= 7 then
    return redis.error_reply('ERR throttler: expected 6 or 7 arguments: permits, timeout_micros, '
        .. 'permits_per_second, policy, max_burst_micros|warmup_micros, cold_factor[, now_micros] (got '
        .. nargs .. ')')
end
local tonumber = tonumber

-- The most common values skip the conversion.
local permits = argv[1]
if permits == '1' then
    permits = 1
else
    permits = tonumber(permits)
    if not (permits and permits >= 0 and permits <= MAX_MICROS and permits % 1 == 0) then
        return redis.error_reply(string.format(BAD,
            'permits (ARGV[1]) must be an integer from 1 to 2^53, or 0 to query',
            string.sub(tostring(argv[1]), 1, 40)))
    end
end

local timeout_micros = argv[2]
local is_try = false
if timeout_micros ~= '-1' then
    timeout_micros = tonumber(timeout_micros)
    if not (timeout_micros and timeout_micros >= -1 and timeout_micros % 1 == 0) then
        return redis.error_reply(string.format(BAD,
            'timeout_micros (ARGV[2]) must be an integer >= 0, or -1 for no timeout',
            string.sub(tostring(argv[2]), 1, 40)))
    end
    is_try = timeout_micros >= 0
    if timeout_micros > MAX_MICROS then
        timeout_micros = MAX_MICROS
    end
end

-- stable_interval_micros: rejects NaN, zero, negative rates (and -inf).
local permits_per_second = tonumber(argv[3])
if not (permits_per_second and permits_per_second > 0) then
    return redis.error_reply(string.format(BAD, 'permits_per_second (ARGV[3]) must be a number > 0 or inf',
        string.sub(tostring(argv[3]), 1, 40)))
end

local policy = argv[4]
local is_bursty = policy == 'bursty'
if not is_bursty and policy ~= 'warming_up' then
    return redis.error_reply(string.format(BAD, 'policy (ARGV[4]) must be "bursty" or "warming_up"',
        string.sub(tostring(policy), 1, 40)))
end

-- Bursty::max_burst_micros or WarmingUp::warmup_micros, capped like `micros`.
local policy_micros = tonumber(argv[5])
if not (policy_micros and policy_micros >= 0 and policy_micros % 1 == 0) then
    return redis.error_reply(string.format(BAD, (is_bursty and 'max_burst_micros' or 'warmup_micros')
        .. ' (ARGV[5]) must be an integer >= 0', string.sub(tostring(argv[5]), 1, 40)))
end
if policy_micros > MAX_MICROS then
    policy_micros = MAX_MICROS
end

local cold_factor
if not is_bursty then
    cold_factor = tonumber(argv[6])
    if not (cold_factor and cold_factor >= 1 and cold_factor < INFINITY) then
        return redis.error_reply(string.format(BAD, 'cold_factor (ARGV[6]) must be a finite number >= 1',
            string.sub(tostring(argv[6]), 1, 40)))
    end
end

local now_micros
if nargs == 7 then
    now_micros = tonumber(argv[7])
    if not (now_micros and now_micros >= 0 and now_micros <= MAX_MICROS and now_micros % 1 == 0) then
        return redis.error_reply(string.format(BAD,
            'now_micros (ARGV[7]) must be an integer from 0 to 2^53, or absent to use TIME',
            string.sub(tostring(argv[7]), 1, 40)))
    end
end

---------------------------------------------------------------------------
-- The configuration in force from now on (Policy::set_stable_interval).
---------------------------------------------------------------------------

-- stable_interval_micros: 0 for an infinite rate, capped at MAX_MICROS.
local stable = 1000000.0 / permits_per_second
if stable > MAX_MICROS then
    stable = MAX_MICROS
end
local max_permits, threshold_permits, slope, cool_down
if is_bursty then
    -- Bursty::max_permits
    if permits_per_second == INFINITY then
        max_permits = 0.0
    else
        max_permits = policy_micros * permits_per_second / 1000000.0
        if max_permits > F64_MAX then
            max_permits = F64_MAX
        end
    end
    -- Policy::cool_down_interval_micros
    cool_down = stable
else
    -- WarmingUp::set_stable_interval
    if stable == 0.0 then
        max_permits, threshold_permits, slope = 0.0, 0.0, 0.0
    else
        local cold = stable * cold_factor
        if cold > F64_MAX then
            cold = F64_MAX
        end
        threshold_permits = 0.5 * policy_micros / stable
        if threshold_permits > F64_MAX then
            threshold_permits = F64_MAX
        end
        local stable_plus_cold = stable + cold
        if stable_plus_cold > F64_MAX then
            stable_plus_cold = F64_MAX
        end
        max_permits = threshold_permits + 2.0 * policy_micros / stable_plus_cold
        if max_permits > F64_MAX then
            max_permits = F64_MAX
        end
        slope = 0.0
        if max_permits > threshold_permits then
            slope = (cold - stable) / (max_permits - threshold_permits)
            if slope > F64_MAX then
                slope = F64_MAX
            end
        end
    end
    -- Policy::cool_down_interval_micros
    if max_permits > 0.0 then
        cool_down = policy_micros / max_permits
    else
        cool_down = stable
    end
end

---------------------------------------------------------------------------
-- The state.
---------------------------------------------------------------------------

-- The clock. (Lua converts the two strings TIME replies with exactly.)
if not now_micros then
    local time = redis.call('TIME')
    now_micros = time[1] * 1000000 + time[2]
end

-- Load. WRONGTYPE (the key is not a string) propagates: nothing is written.
local key = KEYS[1]
local value = redis.call('GET', key)
local stored_permits, next_free_micros, old_rate, old_max, expires_micros
local valid = false
if value and #value == 40 then
    stored_permits, next_free_micros, old_rate, old_max, expires_micros = struct.unpack('<ddddd', value)
    -- NaN fails every comparison, so it is rejected too.
    valid = old_max >= 0 and old_max < INFINITY
        and stored_permits >= 0 and stored_permits <= old_max
        and next_free_micros >= 0 and next_free_micros <= MAX_MICROS and next_free_micros % 1 == 0
        and old_rate > 0
        and expires_micros >= 0 and expires_micros < INFINITY
end

-- QUERY: max(next_free_micros - now, 0), writing nothing.
if permits == 0 then
    if valid and next_free_micros > now_micros then
        return next_free_micros - now_micros
    end
    return 0
end

if not valid then
    -- Missing (or corrupted): idle for a long time, with no TTL to keep.
    stored_permits = max_permits
    next_free_micros = now_micros
    old_rate = permits_per_second
    old_max = max_permits
    expires_micros = 0
end

-- State::set_rate, when the rate (or the configuration) changed.
if old_rate ~= permits_per_second or old_max ~= max_permits then
    local old_stable = 1000000.0 / old_rate
    if old_stable > MAX_MICROS then
        old_stable = MAX_MICROS
    end
    -- State::resync at the old stable interval and max_permits.
    if now_micros > next_free_micros then
        local old_cool_down = old_stable
        if not is_bursty and old_max > 0.0 then
            old_cool_down = policy_micros / old_max
        end
        -- idle > 0, so an infinite quotient (cool_down == 0) is fine, never NaN.
        local stored = stored_permits + (now_micros - next_free_micros) / old_cool_down
        if stored > old_max then
            stored = old_max
        end
        stored_permits = stored
        next_free_micros = now_micros
    end
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

-- State::reserve_earliest_available: resync, then spend.
if now_micros > next_free_micros then
    local stored = stored_permits + (now_micros - next_free_micros) / cool_down
    if stored > max_permits then
        stored = max_permits
    end
    stored_permits = stored
    next_free_micros = now_micros
end
local moment = next_free_micros
local stored_to_spend = permits
if stored_permits < stored_to_spend then
    stored_to_spend = stored_permits
end
local fresh = permits - stored_to_spend
local wait
if is_bursty then
    -- Bursty::stored_permits_to_wait_micros is 0, and 0.0 + x == x.
    wait = fresh * stable
else
    -- WarmingUp::stored_permits_to_wait_micros
    local above_threshold = stored_permits - threshold_permits
    local micros = 0.0
    local spent = stored_to_spend
    if above_threshold > 0.0 then
        local take_above = above_threshold
        if spent < take_above then
            take_above = spent
        end
        -- A trapezoid; permits_to_time(p) = stable + p * slope.
        local length = (stable + above_threshold * slope)
            + (stable + (above_threshold - take_above) * slope)
        micros = take_above * length / 2.0
        spent = spent - take_above
    end
    wait = micros + stable * spent + fresh * stable
end
-- to_micros: truncates (w - w % 1 is floor(w) for w >= 0), saturates; NaN
-- reads as MAX_MICROS.
if wait < MAX_MICROS then
    wait = wait - wait % 1
else
    wait = MAX_MICROS
end
next_free_micros = next_free_micros + wait
if next_free_micros > MAX_MICROS then
    next_free_micros = MAX_MICROS
end
stored_permits = stored_permits - stored_to_spend

-- The TTL the key needs: until the debt is paid and the stored permits are
-- refilled to max_permits, plus 2 ms. (Not 1: before Redis 7.2, setting a
-- 1 ms TTL can delete the key at once if a millisecond boundary falls
-- between the two clock reads.) ceil(x) is x - x % 1, plus 1 if x had a
-- fraction; x < TTL_CAP_MS - 2 rules out inf and NaN first.
local ttl_ms = (next_free_micros - now_micros) / 1000
    + (max_permits - stored_permits) * cool_down / 1000
if ttl_ms < TTL_CAP_MS - 2 then
    local whole = ttl_ms - ttl_ms % 1
    if whole < ttl_ms then
        whole = whole + 1
    end
    ttl_ms = whole + 2
else
    ttl_ms = TTL_CAP_MS
end

-- Write: keep the TTL if it lasts long enough, else set one with slack
-- (twice the need, at most TTL_MAX_SLACK_MS more).
if now_micros + ttl_ms * 1000 <= expires_micros then
    redis.call('SET', key, struct.pack('<ddddd', stored_permits, next_free_micros, permits_per_second,
        max_permits, expires_micros), 'KEEPTTL')
else
    if ttl_ms > TTL_MAX_SLACK_MS then
        ttl_ms = ttl_ms + TTL_MAX_SLACK_MS
    else
        ttl_ms = ttl_ms + ttl_ms
    end
    if ttl_ms > TTL_CAP_MS then
        ttl_ms = TTL_CAP_MS
    end
    redis.call('SET', key, struct.pack('<ddddd', stored_permits, next_free_micros, permits_per_second,
        max_permits, now_micros + ttl_ms * 1000), 'PX', ttl_ms)
end

-- State::reserve: the wait until `moment`, never negative.
if moment > now_micros then
    return moment - now_micros
end
return 0
