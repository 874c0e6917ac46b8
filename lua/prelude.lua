-- The limiter's script, part 1 of 5: constants, arguments, configuration.
-- Its protocol is specified in docs/redis-protocol.md.

-- Constants, as in src/core.
local MAX_MICROS = 9007199254740992 -- 2^53
local F64_MAX = 1.7976931348623157e308 -- f64::MAX
local INFINITY = 1 / 0
local TTL_CAP_MS = 9007199254740 -- floor(2^53 / 1000)
local TTL_MAX_SLACK_MS = 1000
local MARKER = 'thr2'
local THR1 = 'thr1' -- the previous marker, same size (see Value)
local VALUE = '<c4ddddddddd' -- the marker and nine doubles: 76 bytes
local VALUE_SIZE = 76
local STATE = '<c4ddddddd' -- the marker and fields 1 to 7, read from a value
local FRACTION_ONE = 1048576 -- 2^20: one microsecond in fraction units
local FINE_CHARGE_LIMIT = 4294967296 -- 2^32 µs (FINE_CHARGE_LIMIT_MICROS)
local FRACTIONS_SHIFT = 2097152 -- 2^21: field 7 = next_free_fraction * 2^21 + ...
local FRACTIONS_END = 2199023255552 -- 2^41: field 7 is below it
local BAD = 'ERR paceline: %s (got "%s")'
local THR3 = 'thr3' -- the marker of a value with a ledger (see Ledger)
local LEDGER = '<dddddd' -- the ledger's head: six doubles, 48 bytes
local LEDGER_START = 77 -- where a thr3 value's ledger begins
local LEDGER_CAPACITY = 64 -- the most groups kept (Ledger::SHARED_CAPACITY)
local TOKEN_ID_SIZE = 84 -- a token with a group id (see Token)
local BATCH_CAPACITY = 1024 -- the most requests in one batch
local NOT_OURS = 'ERR paceline: key %s holds a value this limiter does not recognise (%d bytes); it was left untouched: delete it or use another limiter name'

-- Comparisons below are written `if x > cap then x = cap end` where the core
-- has `x.min(cap)`: the same thing, as no x there can be NaN. An integer
-- check is `x % 1 == 0`, which NaN and the infinities fail.

---------------------------------------------------------------------------
-- Arguments. Everything is checked before the key is read or written.
---------------------------------------------------------------------------

local argv = ARGV
local nargs = #argv
if #KEYS ~= 1 then
    return redis.error_reply('ERR paceline: expected exactly 1 key, the limiter (got '
        .. #KEYS .. '); call with KEYS[1] = limiter key')
end
if nargs ~= 6 and nargs ~= 7 then
    return redis.error_reply('ERR paceline: expected 6 or 7 arguments: permits|probe|resume|cancel|batch|status, '
        .. 'timeout_micros|debt_micros|token, permits_per_second, policy, '
        .. 'max_burst_micros|warmup_micros, cold_factor[, now_micros] (got ' .. nargs .. ')')
end
local tonumber = tonumber

-- ARGV[1]. `mode` stays nil for a reservation, a query (`permits`) or a
-- batch (`batch_p`), and names a cold mode otherwise (`permits` is then
-- nil). The most common value skips the conversion.
-- `held`: a reservation its caller may give back (`n+`), which gets a group
-- in the ledger if it waits.
local permits = argv[1]
local mode, held
if permits == '1' then
    permits = 1
elseif permits == '1+' then
    permits, held = 1, true
else
    local n = tonumber(permits)
    if not n and string.byte(permits, -1) == 43 then
        n = tonumber(string.sub(permits, 1, -2))
        held = n and n >= 1
    end
    if n and n >= 0 and n <= MAX_MICROS and n % 1 == 0 and held ~= false then
        permits = n
    elseif not n and (permits == 'probe' or permits == 'resume' or permits == 'cancel'
            or permits == 'batch' or permits == 'status') then
        mode = permits
        permits = nil
    else
        return redis.error_reply(string.format(BAD,
            'ARGV[1] must be the permits to reserve, an integer from 1 to 2^53 (followed by + '
            .. 'if the reservation may be given back), 0 to query, or probe, resume, cancel, batch or status',
            string.sub(tostring(argv[1]), 1, 40)))
    end
end

-- ARGV[2]: the timeout of a reservation (or of nothing, for a query or a
-- probe), the debt of a resume, the token of a cancel, the requests of a
-- batch.
local timeout_micros = argv[2]
local is_try = false
local debt_micros
local tk_stored_before, tk_next_free_before, tk_stored_after, tk_next_free_after
local tk_moment, tk_spent_stored, tk_rate, tk_max, tk_now
local tk_fractions, tk_fraction_before, tk_fraction_after, tk_id
-- A batch: `permits[+]:timeout_micros` each, joined by commas, applied in
-- order at one clock reading as the same calls one by one would be (see
-- Batch): their permits, whether each may be given back, their timeouts.
-- `*count` after a request repeats it (`1:-1*64`: 64 reservations of 1).
local batch_p, batch_h, batch_t
if mode == 'batch' then
    mode = nil
    batch_p, batch_h, batch_t = {}, {}, {}
    local count = 0
    for request in string.gmatch(timeout_micros, '[^,]+') do
        local p, plus, t, times = string.match(request, '^(%d+)(%+?):(-?%d+)(.*)$')
        p, t = tonumber(p), tonumber(t)
        if times == '' then
            times = 1
        elseif times then
            times = tonumber(string.match(times, '^%*(%d+)$'))
        end
        if not (p and t and times and p >= 1 and p <= MAX_MICROS and t >= -1 and times >= 1)
                or count + times > BATCH_CAPACITY then
            return redis.error_reply(string.format(BAD, 'ARGV[2] of a batch must be 1 to '
                .. BATCH_CAPACITY .. ' requests permits[+]:timeout_micros[*count] (permits from 1 '
                .. 'to 2^53, timeout_micros -1 or >= 0, count >= 1), joined by commas',
                string.sub(request, 1, 40)))
        end
        if t > MAX_MICROS then t = MAX_MICROS end
        plus = plus == '+'
        for _ = 1, times do
            count = count + 1
            batch_p[count], batch_h[count], batch_t[count] = p, plus, t
        end
    end
    if count == 0 then
        return redis.error_reply(string.format(BAD, 'ARGV[2] of a batch must hold at least one request',
            string.sub(timeout_micros, 1, 40)))
    end
elseif mode == nil or mode == 'probe' or mode == 'status' then
    if timeout_micros ~= '-1' then
        timeout_micros = tonumber(timeout_micros)
        if not (timeout_micros and timeout_micros >= -1 and timeout_micros % 1 == 0) then
            return redis.error_reply(string.format(BAD,
                'timeout_micros (ARGV[2]) must be an integer >= 0, or -1 for no timeout',
                string.sub(tostring(argv[2]), 1, 40)))
        end
        is_try = timeout_micros >= 0
        if timeout_micros > MAX_MICROS then timeout_micros = MAX_MICROS end
    end
elseif mode == 'resume' then
    debt_micros = tonumber(timeout_micros)
    if not (debt_micros and debt_micros >= 0 and debt_micros % 1 == 0) then
        return redis.error_reply(string.format(BAD, 'debt_micros (ARGV[2]) must be an integer >= 0',
            string.sub(tostring(argv[2]), 1, 40)))
    end
    if debt_micros > MAX_MICROS then debt_micros = MAX_MICROS end
else
    -- The token, as a reservation's reply gave it (see Token).
    local marker, _
    local token_size = #timeout_micros
    if token_size == VALUE_SIZE or token_size == TOKEN_ID_SIZE then
        marker, tk_stored_after, tk_next_free_after, tk_rate, tk_max, _, tk_now, tk_fractions,
            tk_stored_before, tk_next_free_before = struct.unpack(VALUE, timeout_micros)
        tk_moment = tk_next_free_before
        if tk_now > tk_moment then tk_moment = tk_now end
        if marker == THR3 then marker = MARKER end
        if token_size == TOKEN_ID_SIZE then
            tk_id = struct.unpack('<d', timeout_micros, LEDGER_START)
            if not (tk_id >= 0 and tk_id < MAX_MICROS and tk_id % 1 == 0) then marker = nil end
        end
    end
    -- NaN fails every comparison, so it is rejected too.
    if not (marker == MARKER and tk_max >= 0 and tk_max < INFINITY and tk_rate > 0
            and tk_stored_before >= 0 and tk_stored_before <= tk_max
            and tk_stored_after >= 0 and tk_stored_after <= tk_max
            and tk_next_free_before >= 0 and tk_next_free_before <= MAX_MICROS
            and tk_next_free_before % 1 == 0
            and tk_now >= 0 and tk_now % 1 == 0
            and tk_next_free_after >= tk_moment and tk_next_free_after <= MAX_MICROS
            and tk_next_free_after % 1 == 0
            and tk_fractions >= 0 and tk_fractions < FRACTIONS_END and tk_fractions % 1 == 0) then
        return redis.error_reply('ERR paceline: ARGV[2] is not a reservation token: a cancel takes '
            .. VALUE_SIZE .. ' or ' .. TOKEN_ID_SIZE .. ' bytes a granted reservation replied, unchanged (got '
            .. #timeout_micros .. ' bytes)')
    end
    -- Field 7: fraction_after * 2^21 + fraction_before * 2 + spent_stored.
    tk_spent_stored = tk_fractions % FRACTIONS_SHIFT
    tk_fraction_after = (tk_fractions - tk_spent_stored) / FRACTIONS_SHIFT
    tk_fraction_before = tk_spent_stored
    tk_spent_stored = tk_spent_stored % 2
    tk_fraction_before = (tk_fraction_before - tk_spent_stored) / 2
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
if policy_micros > MAX_MICROS then policy_micros = MAX_MICROS end

local cold_factor
if not is_bursty then
    cold_factor = tonumber(argv[6])
    if not (cold_factor and cold_factor >= 1 and cold_factor < INFINITY) then
        return redis.error_reply(string.format(BAD, 'cold_factor (ARGV[6]) must be a finite number >= 1',
            string.sub(tostring(argv[6]), 1, 40)))
    end
end

-- The clock as read: TIME, or ARGV[7].
local time_micros
if nargs == 7 then
    time_micros = tonumber(argv[7])
    if not (time_micros and time_micros >= 0 and time_micros <= MAX_MICROS and time_micros % 1 == 0) then
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
if stable > MAX_MICROS then stable = MAX_MICROS end
local max_permits, threshold_permits, slope, cool_down
if is_bursty then
    -- Bursty::max_permits
    if permits_per_second == INFINITY then
        max_permits = 0.0
    else
        max_permits = policy_micros * permits_per_second / 1000000.0
        if max_permits > F64_MAX then max_permits = F64_MAX end
    end
    -- Policy::cool_down_interval_micros
    cool_down = stable
else
    -- WarmingUp::set_stable_interval
    if stable == 0.0 then
        max_permits, threshold_permits, slope = 0.0, 0.0, 0.0
    else
        local cold = stable * cold_factor
        if cold > F64_MAX then cold = F64_MAX end
        threshold_permits = 0.5 * policy_micros / stable
        if threshold_permits > F64_MAX then threshold_permits = F64_MAX end
        local stable_plus_cold = stable + cold
        if stable_plus_cold > F64_MAX then stable_plus_cold = F64_MAX end
        max_permits = threshold_permits + 2.0 * policy_micros / stable_plus_cold
        if max_permits > F64_MAX then max_permits = F64_MAX end
        slope = 0.0
        if max_permits > threshold_permits then
            slope = (cold - stable) / (max_permits - threshold_permits)
            if slope > F64_MAX then slope = F64_MAX end
        end
    end
    -- Policy::cool_down_interval_micros
    if max_permits > 0.0 then
        cool_down = policy_micros / max_permits
    else
        cool_down = stable
    end
end
