-- The limiter's script, part 1 of 5: constants, arguments, the limits'
-- configuration, the clock, the value as read. It mirrors core::Limits
-- (src/core/limits.rs) over core::State (src/core/mod.rs), for 1 to
-- MAX_LIMITS limits; its protocol is specified in docs/redis-protocol.md.
--
-- It is written for speed: Redis runs one script at a time, so every
-- instruction here is every caller's. With one limit, its state and
-- configuration are plain locals (no table is built); with several, the
-- tables S (the value's doubles from the states on, laid out as in the
-- value, so that one unpack reads them and one pack writes them) and C
-- (configuration) hold every limit's, and the same locals are the limit
-- being worked on (loaded at the top of each loop over the limits, stored
-- back at its end). Code on the common path makes no closure, converts
-- each argument once and packs the value once.

-- Constants, as in src/core.
local MAX_MICROS = 9007199254740992 -- 2^53
local F64_MAX = 1.7976931348623157e308 -- f64::MAX
local FRACTION_ONE = 1048576 -- 2^20: one microsecond in fraction units
local FINE_CHARGE_LIMIT = 4294967296 -- 2^32 µs (FINE_CHARGE_LIMIT_MICROS)
local TTL_CAP_MS = 9007199254740 -- floor(2^53 / 1000)
local TTL_MAX_SLACK_MS = 1000
-- The value (see Value in the protocol).
local MARKER = 'plv1'
local HEAD = 36 -- the marker and the hot part's head: four doubles
local MAX_LIMITS = 16
-- shape = limits + SHAPE * logged requests + BOUND * (the record's bound + 1)
local SHAPE = 32
local LOGGED = 65 -- SHAPE * LOGGED = BOUND
local BOUND = 2080
local LOG_CAPACITY = 64 -- the most requests the log keeps
local DEAD_CAPACITY = 16 -- the most requests kept in the value after they left the log
local BATCH_CAPACITY = 1024 -- the most requests in one batch
-- The formats of several limits' values: string.sub(FORMAT, 3, 3 + k) is
-- k doubles, string.sub(FORMAT, 1, 3 + k) the marker and k doubles.
local FORMAT = 'c4<ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd' -- (85: 4 + 5 * MAX_LIMITS + 1)
local BAD = 'ERR paceline: %s (got "%.40s")'
-- (One literal: a concatenation would run on every call.)
local NOT_OURS = 'ERR paceline: key %s holds a value this limiter does not recognise (%d bytes); it was left untouched: delete it or use another limiter name'

-- Comparisons are written `if x > cap then x = cap end` where the core has
-- `x.min(cap)`: the same, as no x there is NaN. An integer check is
-- `x % 1 == 0`, which NaN and the infinities fail; `x <= F64_MAX` is
-- x < inf. On the common paths, `a = x; b = y` where the two are
-- independent: a multiple assignment goes through temporaries.

---------------------------------------------------------------------------
-- Arguments, all checked before the key is read.
---------------------------------------------------------------------------

local argv, tonumber = ARGV, tonumber
local nargs = #argv
if #KEYS ~= 1 then
    return redis.error_reply('ERR paceline: expected exactly 1 key, the limiter (got ' .. #KEYS .. ')')
end
-- Two, four per limit, and the clock's reading if it is given.
local clocked = (nargs - 2) % 4
local n = (nargs - 2 - clocked) / 4
if clocked > 1 or n < 1 or n > MAX_LIMITS then
    return redis.error_reply('ERR paceline: expected 2 + 4 per limit (1 to ' .. MAX_LIMITS
        .. ' limits) arguments, then now_micros optionally: permits|mode, timeout_micros|debts|id|'
        .. 'requests, and per limit permits_per_second, policy, max_burst_micros|warmup_micros, '
        .. 'cold_factor (got ' .. nargs .. ')')
end

-- ARGV[1]: the permits of a reservation (`held`: `n+`, one its caller may
-- give back), 0 for a query, or the mode. The common values skip tonumber.
local permits, held, mode = argv[1], false, nil
if permits == '1' then
    permits = 1
elseif permits == '1+' then
    permits, held = 1, true
elseif permits == 'batch' or permits == 'give_back' or permits == 'probe' or permits == 'resume'
        or permits == 'status' then
    mode, permits = permits, nil
else
    if string.byte(permits, -1) == 43 then permits, held = string.sub(permits, 1, -2), true end
    permits = tonumber(permits)
    if not (permits and permits >= 0 and permits <= MAX_MICROS and permits % 1 == 0)
            or (held and permits == 0) then
        return redis.error_reply(string.format(BAD, 'ARGV[1] must be the permits to reserve, an integer '
            .. 'from 1 to 2^53 (followed by + if it may be given back), 0 to query, or batch, give_back, '
            .. 'probe, resume or status', argv[1]))
    end
end

-- ARGV[2]: a reservation's timeout (-1: none), a resume's debts, a
-- give_back's id, a batch's requests (R: permits, held, timeout and count of
-- each run of them; `total` requests, `holds` if any is held).
local arg2 = argv[2]
local timeout, R, debts, give_back_id, total, holds = -1, nil, nil, nil, 1, false
if arg2 == '-1' and not mode then
    -- (No timeout: the most common.)
elseif mode == 'batch' then
    R = {}
    local count = 0
    for request in string.gmatch(arg2, '[^,]+') do
        local p, plus, t, times = string.match(request, '^(%d+)(%+?):(-?%d+)(.*)$')
        p, t = tonumber(p), tonumber(t)
        if times == '' then
            times = 1
        elseif times then
            times = tonumber(string.match(times, '^%*(%d+)$'))
        end
        if not (p and t and times and p >= 1 and p <= MAX_MICROS and t >= -1 and times >= 1)
                or count + times > BATCH_CAPACITY then
            return redis.error_reply(string.format(BAD, 'ARGV[2] of a batch must be 1 to ' .. BATCH_CAPACITY
                .. ' requests permits[+]:timeout_micros[*count] (permits from 1 to 2^53, timeout_micros -1 '
                .. 'or >= 0, count >= 1), joined by commas', request))
        end
        if t > MAX_MICROS then t = MAX_MICROS end
        plus = plus == '+'
        R[#R + 1], R[#R + 2], R[#R + 3], R[#R + 4] = p, plus, t, times
        count, holds = count + times, holds or plus
    end
    total = count
    if count == 0 then
        return redis.error_reply(string.format(BAD, 'ARGV[2] of a batch must hold a request', arg2))
    end
elseif mode == 'resume' then
    debts = {}
    for debt in string.gmatch(arg2 .. ',', '([^,]*),') do
        debt = tonumber(debt)
        if not (debt and debt >= 0 and debt % 1 == 0) or #debts == n then
            debts = nil
            break
        end
        if debt > MAX_MICROS then debt = MAX_MICROS end
        debts[#debts + 1] = debt
    end
    if not (debts and #debts == n) then
        return redis.error_reply(string.format(BAD, 'ARGV[2] of a resume must be each limit\'s '
            .. 'debt_micros, ' .. n .. ' integers >= 0 joined by commas', arg2))
    end
elseif mode == 'give_back' then
    give_back_id = tonumber(arg2)
    if not (give_back_id and give_back_id >= 0 and give_back_id < MAX_MICROS and give_back_id % 1 == 0) then
        return redis.error_reply(string.format(BAD, 'ARGV[2] of a give-back must be the id a held '
            .. 'reservation\'s reply gave, an integer from 0 to 2^53 - 1', arg2))
    end
elseif arg2 == '0' then
    timeout = 0
else
    timeout = tonumber(arg2)
    if not (timeout and timeout >= -1 and timeout % 1 == 0) then
        return redis.error_reply(string.format(BAD, 'timeout_micros (ARGV[2]) must be an integer >= 0, '
            .. 'or -1 for no timeout', arg2))
    end
    if timeout > MAX_MICROS then timeout = MAX_MICROS end
end

---------------------------------------------------------------------------
-- The configuration in force (Policy::set_stable_interval), limit by
-- limit: its rate, whether
-- it is bursty, its max_burst_micros or warmup_micros, stable interval,
-- max_permits, warming-up threshold and slope, and cool-down interval
-- (Policy::cool_down_interval_micros). C holds all of them, 8 per limit.
---------------------------------------------------------------------------

local rate, bursty, pmicros, stable, mx, thr, slope, cd
local C, r1, b1, p1, s1, m1, t1, l1, d1
for i = 1, n do
    local a = 4 * i - 1 -- its rate; then its policy, micros and cold factor
    -- stable_interval_micros: rejects NaN, zero, negative rates (and -inf).
    rate = tonumber(argv[a])
    if not (rate and rate > 0) then
        return redis.error_reply(string.format(BAD, 'permits_per_second of limit ' .. (i - 1)
            .. ' (ARGV[' .. a .. ']) must be a number > 0 or inf', argv[a]))
    end
    local policy = argv[a + 1]
    bursty = policy == 'bursty'
    if not bursty and policy ~= 'warming_up' then
        return redis.error_reply(string.format(BAD, 'the policy of limit ' .. (i - 1) .. ' (ARGV['
            .. (a + 1) .. ']) must be "bursty" or "warming_up"', policy))
    end
    -- Bursty::max_burst_micros or WarmingUp::warmup_micros, capped as `micros`.
    pmicros = tonumber(argv[a + 2])
    if not (pmicros and pmicros >= 0 and pmicros % 1 == 0) then
        return redis.error_reply(string.format(BAD, (bursty and 'max_burst_micros' or 'warmup_micros')
            .. ' of limit ' .. (i - 1) .. ' (ARGV[' .. (a + 2) .. ']) must be an integer >= 0', argv[a + 2]))
    end
    if pmicros > MAX_MICROS then pmicros = MAX_MICROS end
    stable = 1000000.0 / rate
    if stable > MAX_MICROS then stable = MAX_MICROS end
    cd = stable
    if bursty then
        -- Bursty::max_permits
        mx = 0.0
        if rate <= F64_MAX then mx = pmicros * rate / 1000000.0 end
        if mx > F64_MAX then mx = F64_MAX end
    else
        local cold_factor = tonumber(argv[a + 3])
        if not (cold_factor and cold_factor >= 1 and cold_factor <= F64_MAX) then
            return redis.error_reply(string.format(BAD, 'the cold_factor of limit ' .. (i - 1)
                .. ' (ARGV[' .. (a + 3) .. ']) must be a finite number >= 1', argv[a + 3]))
        end
        -- WarmingUp::set_stable_interval
        mx = 0.0; thr = 0.0; slope = 0.0
        if stable ~= 0.0 then
            local cold = stable * cold_factor
            if cold > F64_MAX then cold = F64_MAX end
            thr = 0.5 * pmicros / stable
            if thr > F64_MAX then thr = F64_MAX end
            local stable_plus_cold = stable + cold
            if stable_plus_cold > F64_MAX then stable_plus_cold = F64_MAX end
            mx = thr + 2.0 * pmicros / stable_plus_cold
            if mx > F64_MAX then mx = F64_MAX end
            if mx > thr then
                slope = (cold - stable) / (mx - thr)
                if slope > F64_MAX then slope = F64_MAX end
            end
        end
        if mx > 0.0 then cd = pmicros / mx end
    end
    -- (A table is cheapest built whole: the first limit's wait in locals
    -- for the second's.)
    if n == 1 then
    elseif i == 1 then
        r1 = rate; b1 = bursty; p1 = pmicros; s1 = stable; m1 = mx; t1 = thr or 0.0; l1 = slope or 0.0; d1 = cd
    elseif i == 2 then
        C = {r1, b1, p1, s1, m1, t1, l1, d1, rate, bursty, pmicros, stable, mx, thr or 0.0, slope or 0.0, cd}
    else
        local c = 8 * i - 8
        C[c + 1], C[c + 2], C[c + 3], C[c + 4] = rate, bursty, pmicros, stable
        C[c + 5], C[c + 6], C[c + 7], C[c + 8] = mx, thr or 0.0, slope or 0.0, cd
    end
end

-- The clock as read: ARGV's last, or TIME (Lua converts the two strings
-- TIME replies with exactly).
local time_micros
if clocked == 1 then
    time_micros = tonumber(argv[nargs])
    if not (time_micros and time_micros >= 0 and time_micros <= MAX_MICROS and time_micros % 1 == 0) then
        return redis.error_reply(string.format(BAD, 'now_micros (ARGV[' .. nargs .. ']) must be an '
            .. 'integer from 0 to 2^53, or absent to use TIME', argv[nargs]))
    end
else
    local time = redis.call('TIME')
    time_micros = time[1] * 1000000 + time[2]
end
local now = time_micros

---------------------------------------------------------------------------
-- The value as read (see Value). WRONGTYPE (the key is not a string)
-- propagates: nothing is written.
---------------------------------------------------------------------------

-- Each limit's state: stored_permits, next_free_micros, next_free_fraction,
-- and the rate and max_permits it was last charged at (the first limit's,
-- or the only one's: st, nf, fr, ort, omx; S: the value's doubles from its
-- hot part's states on, 3 per limit, the TTL's end `expires`, 2 per limit).
-- The log (see Log): `count` requests; the limits' states before the
-- first (bst, bnf, bfr; B, laid out as S); the requests from byte `log_at`
-- of the value (`dead` requests that left it before), 4 doubles each, the
-- first read: its id, permits, now and moment (`front`). `whole`: the value
-- is written whole, not only its hot part (see Value).
local st, nf, fr, ort, omx
local S, B, changed
local bst, bnf, bfr
local key = KEYS[1]
local value = redis.call('GET', key)
local expires, next_id, count, size, held_n, dead = 0, 0, 0, 0, 0, 0
local log_from, log_at, front_id, front_p, front_at, front
if value then
    size = #value
    local marker, shape, last_now, _
    if size >= 84 then
        marker, shape, last_now, next_id, _, st, nf, fr, expires, ort, omx =
            struct.unpack('<c4dddddddddd', value)
    end
    -- The head. (NaN fails every comparison.)
    local ok = marker == MARKER
        and last_now >= 0 and last_now <= MAX_MICROS and last_now % 1 == 0
        and next_id >= 0 and next_id < MAX_MICROS and next_id % 1 == 0
    local at = 84
    if not ok then
    elseif size == at and (shape == 1 or shape == 2081) then -- (1 + BOUND)
        -- (One limit, nothing logged.)
        held_n = 1
    elseif shape >= 1 and shape < 17 * BOUND and shape % 1 == 0 then
        held_n = shape % SHAPE
        count = (shape - held_n) / SHAPE % LOGGED
        at = 44 + 40 * held_n
        ok = held_n >= 1 and held_n <= MAX_LIMITS and count <= LOG_CAPACITY
        if count == 0 then
            ok = ok and size == at
        elseif ok and size >= at + 8 then
            dead = struct.unpack('<d', value, at + 1)
            ok = dead >= 0 and dead <= DEAD_CAPACITY and dead % 1 == 0
                and size == at + 8 + 24 * held_n + 32 * (dead + count)
        else
            ok = false
        end
    else
        ok = false
    end
    -- The limits: with several (read or in force), S; `changed`: a limit
    -- other than the first is at another rate or max_permits than in force
    -- (the first then compares to rate and mx, its own).
    if ok and held_n + n > 2 then
        S = {struct.unpack(string.sub(FORMAT, 3, 4 + 5 * held_n), value, HEAD + 1)}
        -- (j: the limit's rate in S, c: its configuration in C.)
        local e = 3 * held_n + 1
        local j, c = e + 1, 0
        expires = S[e]; ort = S[j]; omx = S[j + 1]
        if n > 1 then rate = r1; mx = m1 end
        for k = 4, e - 1, 3 do
            j = j + 2; c = c + 8
            local s, t, f, r, m = S[k], S[k + 1], S[k + 2], S[j], S[j + 1]
            ok = ok and m >= 0 and m <= F64_MAX and s >= 0 and s <= m and t >= 0 and t <= MAX_MICROS
                and t % 1 == 0 and f >= 0 and f < FRACTION_ONE and f % 1 == 0 and r > 0
            if c < 8 * n and (r ~= C[c + 1] or m ~= C[c + 5]) then changed = true end
        end
    end
    ok = ok and expires >= 0 and expires <= F64_MAX and omx >= 0 and omx <= F64_MAX and st >= 0
        and st <= omx and nf >= 0 and nf <= MAX_MICROS and nf % 1 == 0
        and fr >= 0 and fr < FRACTION_ONE and fr % 1 == 0 and ort > 0
    -- A value with another number of limits keeps its limits by position
    -- (those it lacks start full, below; those past n go) and loses its log.
    if held_n ~= n then count = 0 end
    if ok and count > 0 then
        -- The states before the log's first request, then that request.
        at = at + 9
        log_from = at + 24 * n
        log_at = log_from + 32 * dead
        if n == 1 then
            bst, bnf, bfr = struct.unpack('<ddd', value, at)
        else
            B = {struct.unpack(string.sub(FORMAT, 3, 3 + 3 * n), value, at)}
        end
        for i = 1, n do
            if B then bst, bnf, bfr = B[3 * i - 2], B[3 * i - 1], B[3 * i] end
            ok = ok and bst >= 0 and bst <= F64_MAX and bnf >= 0 and bnf <= MAX_MICROS and bnf % 1 == 0
                and bfr >= 0 and bfr < FRACTION_ONE and bfr % 1 == 0
        end
        front_id, front_p, front_at, front = struct.unpack('<dddd', value, log_at)
        ok = ok and front_id % 1 == 0 and front_id >= -1 - n and front_id < next_id
            and front_p % 1 == 0 and front_p >= 0 and front_p <= MAX_MICROS
            and front_at >= 0 and front_at % 1 == 0 and front >= front_at and front <= MAX_MICROS
            and front % 1 == 0
    end
    if not ok then return redis.error_reply(string.format(NOT_OURS, key, size)) end
    -- The clock never runs backwards for a key.
    if last_now > now then now = last_now end
    -- A try of one limit that the debt does not fit, its rate unchanged:
    -- refused here, as part 4 would refuse it (see Replies).
    if timeout >= 0 and nf - now > timeout and n == 1 and not mode and permits > 0 and ort == rate and omx == mx then
        return st == 0 and now - nf or struct.pack('<dddd', now, st, nf, fr)
    end
end
local whole, logged_as_read = held_n ~= n, count
-- Missing (or a limit the value lacks): idle for a long time, i.e. full.
if held_n == 0 then st = mx; nf = now; fr = 0; ort = rate; omx = mx end
if n > 1 and held_n ~= n then
    -- S laid out for n limits (T), those it lacks as they start (e: the
    -- TTL's end in the value's).
    local T, e = {}, 3 * held_n + 1
    for i = 1, n do
        local c, k, j = 8 * i - 8, 3 * i - 2, 3 * n + 2 * i
        if i > held_n then
            T[k], T[k + 1], T[k + 2], T[j], T[j + 1] = C[c + 5], now, 0, C[c + 1], C[c + 5]
        else
            T[k], T[k + 1], T[k + 2], T[j], T[j + 1] = S[k], S[k + 1], S[k + 2], S[e + 2 * i - 1], S[e + 2 * i]
        end
    end
    T[3 * n + 1], S = expires, T
end
