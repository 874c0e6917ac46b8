-- The script of a limiter with several limits: every limit of a key in one
-- value, updated by one call. It mirrors core::Limits (src/core/limits.rs):
-- a request goes at M = max(now, every ticket), every limit is charged as
-- if it had arrived at M, and a give-back replays the log of requests
-- made since the oldest one that may be given back. Its protocol is in
-- docs/redis-protocol.md ("Several limits").
--
-- KEYS[1]: the key. ARGV[1]: permits to reserve (`n`, or `n+` for one its
-- caller may give back), 0 to query, `cancel`, `probe`, `resume`,
-- `status` (the state as read, see below) or `batch` (ARGV[2] then holds
-- the requests, see below).
-- ARGV[2]: the timeout in µs (-1: none); for a cancel, the id a
-- reservation's reply gave; for a resume, each limit's debt in µs, joined
-- by commas (the key's stored permits are dropped and each ticket moves by
-- its debt, as core::Limits::resume); ignored by a probe (which proves the
-- key can be read and written, changing nothing).
-- ARGV[3]: the number of limits, n >= 2; then 4 arguments per limit: rate,
-- `bursty` or `warming_up`, max_burst_micros or warmup_micros, cold factor;
-- then, optionally, now in µs instead of TIME.
-- Reply: {1, wait, bound, id, debt} granted (bound: the limit, from 0,
-- that set the wait, or -1; id: -1 unless it may be given back; debt: how
-- far the latest ticket lies ahead of now after the call), {0, wait,
-- bound, -1, debt} refused (the wait it would have needed), {1 or 0} for a
-- cancel, and {1, wait, bound, -1, debt} for a query, a probe or a resume
-- (the wait a request would have after it).

local MAX_MICROS = 9007199254740992 -- 2^53
local F64_MAX = 1.7976931348623157e308
local INFINITY = 1 / 0
local FRACTION_ONE = 1048576 -- 2^20
local FINE_CHARGE_LIMIT = 4294967296 -- 2^32 µs
local TTL_CAP_MS = 9007199254740
local SEVERAL = 'thr4'
local LOG_CAPACITY = 64
local BATCH_CAPACITY = 1024 -- the most requests in one batch
local MAX_LIMITS = 16
local BAD = 'ERR paceline: %s (got "%s")'

local argv, tonumber = ARGV, tonumber
local function bad(what, i)
    return redis.error_reply(string.format(BAD, what, string.sub(tostring(argv[i]), 1, 40)))
end

-- Arguments, all checked before the key is read.
if #KEYS ~= 1 then return redis.error_reply('ERR paceline: expected exactly 1 key') end
local n = tonumber(argv[3])
if not (n and n >= 2 and n <= MAX_LIMITS and n % 1 == 0) then
    return bad('ARGV[3] must be the number of limits, 2 to ' .. MAX_LIMITS, 3)
end
if #argv ~= 3 + 4 * n and #argv ~= 4 + 4 * n then
    return redis.error_reply('ERR paceline: expected ' .. (3 + 4 * n) .. ' or ' .. (4 + 4 * n)
        .. ' arguments for ' .. n .. ' limits (got ' .. #argv .. ')')
end
-- (tonumber costs a strtod: the most common values skip it.)
local mode, permits, held = nil, argv[1], false
if permits == '1' then
    permits = 1
elseif permits == '1+' then
    permits, held = 1, true
elseif permits == 'cancel' or permits == 'probe' or permits == 'resume' or permits == 'batch'
        or permits == 'status' then
    mode, permits = permits, nil
else
    if string.byte(permits, -1) == 43 then permits, held = string.sub(permits, 1, -2), true end
    permits = tonumber(permits)
    if not (permits and permits >= 0 and permits <= MAX_MICROS and permits % 1 == 0)
            or (held and permits == 0) then
        return bad('ARGV[1] must be the permits, an integer from 1 to 2^53 (with + if it may be '
            .. 'given back), 0 to query, or cancel', 1)
    end
end
local timeout, debts = -1, {}
-- A batch: requests applied in order at one clock reading, as the same
-- calls one by one would be; ARGV[2] holds `permits[+]:timeout` each,
-- joined by commas (`*count` after one repeats it).
local batch_p, batch_h, batch_t
if mode == 'batch' then
    batch_p, batch_h, batch_t = {}, {}, {}
    for request in string.gmatch(argv[2], '[^,]+') do
        local p, plus, t, times = string.match(request, '^(%d+)(%+?):(-?%d+)(.*)$')
        p, t = tonumber(p), tonumber(t)
        if times == '' then
            times = 1
        elseif times then
            times = tonumber(string.match(times, '^%*(%d+)$'))
        end
        if not (p and t and times and p >= 1 and p <= MAX_MICROS and t >= -1 and times >= 1)
                or #batch_p + times > BATCH_CAPACITY then
            return bad('ARGV[2] must be up to ' .. BATCH_CAPACITY
                .. ' requests permits[+]:timeout_micros[*count], joined by commas', 2)
        end
        if t > MAX_MICROS then t = MAX_MICROS end
        local h = plus == '+'
        for _ = 1, times do
            local k = #batch_p + 1
            batch_p[k], batch_h[k], batch_t[k] = p, h, t
        end
    end
    if #batch_p == 0 then return bad('ARGV[2] must hold at least one request', 2) end
elseif mode == 'resume' then
    for debt in string.gmatch(argv[2], '[^,]+') do
        debt = tonumber(debt)
        if not (debt and debt >= 0 and debt % 1 == 0) then
            return bad('ARGV[2] must be each limit\'s debt in µs, integers joined by commas', 2)
        end
        if debt > MAX_MICROS then debt = MAX_MICROS end
        debts[#debts + 1] = debt
    end
    if #debts ~= n then return bad('ARGV[2] must hold one debt per limit (' .. n .. ')', 2) end
elseif argv[2] ~= '-1' then
    timeout = tonumber(argv[2])
    if not (timeout and timeout >= -1 and timeout % 1 == 0) then
        return bad('ARGV[2] must be the timeout in µs (-1 for none) or the id to cancel', 2)
    end
    if timeout > MAX_MICROS then timeout = MAX_MICROS end
end

-- Each limit's configuration (Policy::set_stable_interval): rate, stable
-- interval, max_permits, and for warming-up the threshold and slope.
local rate, is_bursty, pmicros, stable, mx, thr, slope = {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
    local a = 3 + 4 * (i - 1)
    local r = tonumber(argv[a + 1])
    if not (r and r > 0) then return bad('limit ' .. (i - 1) .. ': the rate must be > 0 or inf', a + 1) end
    local policy = argv[a + 2]
    if policy ~= 'bursty' and policy ~= 'warming_up' then
        return bad('limit ' .. (i - 1) .. ': the policy must be bursty or warming_up', a + 2)
    end
    local micros = tonumber(argv[a + 3])
    if not (micros and micros >= 0 and micros % 1 == 0) then
        return bad('limit ' .. (i - 1) .. ': max_burst_micros or warmup_micros must be an integer >= 0', a + 3)
    end
    if micros > MAX_MICROS then micros = MAX_MICROS end
    local s = 1000000.0 / r
    if s > MAX_MICROS then s = MAX_MICROS end
    rate[i], is_bursty[i], pmicros[i], stable[i] = r, policy == 'bursty', micros, s
    if is_bursty[i] then
        local m = 0.0
        if r ~= INFINITY then m = micros * r / 1000000.0 end
        if m > F64_MAX then m = F64_MAX end
        mx[i] = m
    else
        local cf = tonumber(argv[a + 4])
        if not (cf and cf >= 1 and cf < INFINITY) then
            return bad('limit ' .. (i - 1) .. ': the cold factor must be a finite number >= 1', a + 4)
        end
        if s == 0.0 then
            mx[i], thr[i], slope[i] = 0.0, 0.0, 0.0
        else
            local cold = s * cf
            if cold > F64_MAX then cold = F64_MAX end
            local t = 0.5 * micros / s
            if t > F64_MAX then t = F64_MAX end
            local sc = s + cold
            if sc > F64_MAX then sc = F64_MAX end
            local m = t + 2.0 * micros / sc
            if m > F64_MAX then m = F64_MAX end
            local sl = 0.0
            if m > t then sl = (cold - s) / (m - t) end
            if sl > F64_MAX then sl = F64_MAX end
            mx[i], thr[i], slope[i] = m, t, sl
        end
    end
end

-- Policy::cool_down_interval_micros of limit i with `max` permits.
local function cool_down(i, max)
    if not is_bursty[i] and max > 0.0 then return pmicros[i] / max end
    return stable[i]
end

local time_micros = tonumber(argv[4 + 4 * n])
if argv[4 + 4 * n] and not (time_micros and time_micros >= 0 and time_micros <= MAX_MICROS
        and time_micros % 1 == 0) then
    return bad('now_micros must be an integer from 0 to 2^53, or absent to use TIME', 4 + 4 * n)
end
if not time_micros then
    local t = redis.call('TIME')
    time_micros = t[1] * 1000000 + t[2]
end
local now = time_micros

-- The value: the limits' states (st stored, nf ticket, fr its fraction,
-- with the rate and max_permits they were last charged at), the clock, the
-- log (base states bst/bnf/bfr, then entries).
local key = KEYS[1]
local value = redis.call('GET', key)
local st, nf, fr, old_rate, old_max = {}, {}, {}, {}, {}
local bst, bnf, bfr = {}, {}, {}
local log_id, log_permits, log_now, log_moment = {}, {}, {}, {}
local expires, next_id, count = 0, 0, 0
-- How many limits the value holds states for (the others start full): a
-- value of this script with fewer or more limits keeps those it has, by
-- position, and loses its log; a value of the one-limit script (thr1 to
-- thr3, or the first format) is the first limit's, its ledger dropped.
-- (What waited to be given back then gives nothing back: erring towards
-- limiting.)
local held_limits = 0
if value then
    local size = #value
    local marker = string.sub(value, 1, 4)
    local ok, last_now = false, 0
    if size >= 44 and marker == SEVERAL then
        local m
        m, expires, last_now, next_id, count = struct.unpack('<ddddd', value, 5)
        ok = m >= 1 and m <= MAX_LIMITS and m % 1 == 0 and count >= 0 and count <= LOG_CAPACITY
            and count % 1 == 0 and size == 44 + 40 * m + (count > 0 and 24 * m or 0) + 32 * count
            and next_id >= 0 and next_id < MAX_MICROS and next_id % 1 == 0
        if ok then
            held_limits = m
            for i = 1, m do
                st[i], nf[i], fr[i], old_rate[i], old_max[i] = struct.unpack('<ddddd', value, 5 + 40 * i)
            end
            if m ~= n then count = 0 end
        end
        local at = 45 + 40 * m
        if ok and count > 0 then
            for i = 1, n do
                bst[i], bnf[i], bfr[i] = struct.unpack('<ddd', value, at)
                at = at + 24
                ok = ok and bst[i] >= 0 and bnf[i] >= 0 and bnf[i] <= MAX_MICROS and bnf[i] % 1 == 0
                    and bfr[i] >= 0 and bfr[i] < FRACTION_ONE and bfr[i] % 1 == 0
            end
            for j = 1, count do
                log_id[j], log_permits[j], log_now[j], log_moment[j] = struct.unpack('<dddd', value, at)
                at = at + 32
                ok = ok and log_permits[j] >= 1 and log_permits[j] <= MAX_MICROS and log_now[j] >= 0
                    and log_now[j] <= MAX_MICROS and log_moment[j] >= log_now[j]
                    and log_moment[j] <= MAX_MICROS and log_id[j] >= -1 and log_id[j] < next_id
            end
        end
    elseif (size == 76 and (marker == 'thr2' or marker == 'thr1')) or (size >= 124 and marker == 'thr3') then
        local fractions, _
        _, st[1], nf[1], old_rate[1], old_max[1], expires, last_now, fractions =
            struct.unpack('<c4ddddddd', value)
        ok = fractions >= 0 and fractions < 2199023255552 and fractions % 1 == 0
        if marker == 'thr1' then
            fr[1] = 0
        else
            fr[1] = (fractions - fractions % 2097152) / 2097152
        end
        held_limits = 1
    elseif size == 40 then
        st[1], nf[1], old_rate[1], old_max[1], expires = struct.unpack('<ddddd', value)
        fr[1], ok, held_limits = 0, true, 1
    end
    if held_limits > n then held_limits = n end
    ok = ok and expires >= 0 and expires < INFINITY and last_now >= 0 and last_now <= MAX_MICROS
        and last_now % 1 == 0
    for i = 1, held_limits do
        ok = ok and old_max[i] >= 0 and old_max[i] < INFINITY and st[i] >= 0 and st[i] <= old_max[i]
            and nf[i] >= 0 and nf[i] <= MAX_MICROS and nf[i] % 1 == 0 and old_rate[i] > 0
            and fr[i] >= 0 and fr[i] < FRACTION_ONE and fr[i] % 1 == 0
    end
    if not ok then
        return redis.error_reply('ERR paceline: key ' .. key .. ' holds a value this limiter does not '
            .. 'recognise (' .. size .. ' bytes); it was left untouched: delete it or use another '
            .. 'limiter name')
    end
    -- The clock never runs backwards for a key.
    if last_now > now then now = last_now end
end
-- Missing, or not in the value: idle for a long time, full.
for i = held_limits + 1, n do
    st[i], nf[i], fr[i], old_rate[i], old_max[i] = mx[i], now, 0, rate[i], mx[i]
end

-- The moment every limit allows a request at `at`, and the limit that set
-- it (0-based, -1 if none).
local function earliest(tickets, at)
    local moment, bound = at, -1
    for i = 1, n do
        if tickets[i] > moment then moment, bound = tickets[i], i - 1 end
    end
    return moment, bound
end

-- Charges `p` permits to every limit of (s, t, f) as of `moment`:
-- State::reserve_earliest_available (resync, spend stored, charge).
local function charge(s, t, f, p, moment)
    for i = 1, n do
        local cd = cool_down(i, mx[i])
        if moment > t[i] then
            local stored = s[i] + ((moment - t[i]) - f[i] / FRACTION_ONE) / cd
            if stored > mx[i] then stored = mx[i] end
            s[i], t[i], f[i] = stored, moment, 0
        end
        local spend = p
        if s[i] < spend then spend = s[i] end
        local fresh = p - spend
        local wait
        if is_bursty[i] then
            wait = fresh * stable[i]
        else
            local above = s[i] - thr[i]
            local micros, spent = 0.0, spend
            if above > 0.0 then
                local take = above
                if spent < take then take = spent end
                local length = (stable[i] + above * slope[i]) + (stable[i] + (above - take) * slope[i])
                micros = take * length / 2.0
                spent = spent - take
            end
            wait = micros + stable[i] * spent + fresh * stable[i]
        end
        if wait < FINE_CHARGE_LIMIT then
            wait = wait * FRACTION_ONE + 0.5
            wait = wait - wait % 1 + f[i]
            f[i] = wait % FRACTION_ONE
            wait = (wait - f[i]) / FRACTION_ONE
        elseif wait < MAX_MICROS then
            wait = wait - wait % 1
        else
            wait = MAX_MICROS
        end
        t[i] = t[i] + wait
        if t[i] >= MAX_MICROS then t[i], f[i] = MAX_MICROS, 0 end
        s[i] = s[i] - spend
    end
end

-- The log: the oldest requests whose moment has passed go into the base
-- (they have been used).
local first = 1
local function fold_oldest()
    local moment = earliest(bnf, log_now[first])
    charge(bst, bnf, bfr, log_permits[first], moment)
    first = first + 1
end
while first <= count and log_moment[first] <= now do fold_oldest() end

-- A status writes nothing: the clock, then each limit's state as read (a
-- limit not in the value as it starts), five doubles each: stored
-- permits, ticket, its fraction, the rate and max_permits it was last
-- charged at.
if mode == 'status' then
    local fields = {now}
    for i = 1, n do
        local k = 5 * (i - 1) + 1
        fields[k + 1], fields[k + 2], fields[k + 3], fields[k + 4], fields[k + 5] =
            st[i], nf[i], fr[i], old_rate[i], old_max[i]
    end
    return struct.pack('<' .. string.rep('d', 1 + 5 * n), unpack(fields))
end

-- A query writes nothing.
if permits == 0 then
    local moment, bound = earliest(nf, now)
    return {1, moment - now, bound, -1, moment - now}
end

local reply
if mode == 'probe' then
    if value then
        redis.call('SET', key, value, 'KEEPTTL')
        local moment, bound = earliest(nf, now)
        return {1, moment - now, bound, -1, moment - now}
    end
    -- A missing key is written as it reads: every limit full.
    reply = {1, 0, -1, -1, 0}
elseif mode == 'cancel' then
    -- A rate changed since: the log is void (the next reservation empties
    -- it), and nothing is given back.
    for i = 1, n do
        if old_rate[i] ~= rate[i] or old_max[i] ~= mx[i] then return {0} end
    end
    local place
    for j = first, count do
        if log_id[j] == timeout and log_moment[j] > now then place = j end
    end
    if not place then return {0} end
    -- Replay the log without it from the base.
    for i = 1, n do st[i], nf[i], fr[i] = bst[i], bnf[i], bfr[i] end
    for j = first, count do
        if j ~= place then charge(st, nf, fr, log_permits[j], (earliest(nf, log_now[j]))) end
    end
    table.remove(log_id, place)
    table.remove(log_permits, place)
    table.remove(log_now, place)
    table.remove(log_moment, place)
    count = count - 1
    reply = {1}
else
    -- State::set_rate of every limit whose configuration changed (the log
    -- then empties: its requests were charged at the old rates).
    for i = 1, n do
        if old_rate[i] ~= rate[i] or old_max[i] ~= mx[i] then
            first, count = 1, 0
            local old_stable = 1000000.0 / old_rate[i]
            if old_stable > MAX_MICROS then old_stable = MAX_MICROS end
            if now > nf[i] then
                local old_cd = old_stable
                if not is_bursty[i] and old_max[i] > 0.0 then old_cd = pmicros[i] / old_max[i] end
                local stored = st[i] + ((now - nf[i]) - fr[i] / FRACTION_ONE) / old_cd
                if stored > old_max[i] then stored = old_max[i] end
                st[i], nf[i], fr[i] = stored, now, 0
            end
            if old_stable == 0.0 then
                st[i] = is_bursty[i] and mx[i] or 0.0
            elseif old_max[i] == 0.0 then
                st[i] = is_bursty[i] and 0.0 or mx[i]
            else
                st[i] = st[i] / old_max[i] * mx[i]
            end
        end
    end
    if mode == 'resume' then
        -- core::Limits::resume: the log empties, every limit drops its
        -- stored permits and carries its debt from now at the earliest.
        first, count = 1, 0
        for i = 1, n do
            if now > nf[i] then nf[i], fr[i] = now, 0 end
            st[i] = 0.0
            nf[i] = nf[i] + debts[i]
            if nf[i] >= MAX_MICROS then nf[i], fr[i] = MAX_MICROS, 0 end
        end
        local moment, bound = earliest(nf, now)
        reply = {1, moment - now, bound, -1, moment - now}
    end
end
if not reply then
    -- One request, or each of a batch in order (its reply: granted, wait,
    -- bound, id per request, then the debt after the last).
    if batch_p then reply = {} end
    for r = 1, batch_p and #batch_p or 1 do
        local p, h, t = permits, held, timeout
        if batch_p then p, h, t = batch_p[r], batch_h[r], batch_t[r] end
        local moment, bound = earliest(nf, now)
        if t >= 0 and moment - now > t then
            if not batch_p then return {0, moment - now, bound, -1, moment - now} end
            local k = #reply
            reply[k + 1], reply[k + 2], reply[k + 3], reply[k + 4] = 0, moment - now, bound, -1
        else
            local id = -1
            if h and moment > now then id, next_id = next_id, next_id + 1 end
            if id >= 0 or first <= count then
                if first > count then
                    first, count = 1, 0
                    for i = 1, n do bst[i], bnf[i], bfr[i] = st[i], nf[i], fr[i] end
                elseif count - first + 1 >= LOG_CAPACITY then
                    fold_oldest()
                end
                count = count + 1
                log_id[count], log_permits[count], log_now[count], log_moment[count] = id, p, now, moment
            end
            charge(st, nf, fr, p, moment)
            if batch_p then
                local k = #reply
                reply[k + 1], reply[k + 2], reply[k + 3], reply[k + 4] = 1, moment - now, bound, id
            else
                reply = {1, moment - now, bound, id, earliest(nf, now) - now}
            end
        end
    end
    if batch_p then reply[#reply + 1] = earliest(nf, now) - now end
end

-- The TTL: until every limit is full again and every logged moment has
-- passed, plus 2 ms, with slack; on the clock as read.
local need = 0
for i = 1, n do
    local limit_need = (nf[i] - time_micros) + (mx[i] - st[i]) * cool_down(i, mx[i])
    if limit_need > need then need = limit_need end
end
for j = first, count do
    if log_moment[j] - time_micros > need then need = log_moment[j] - time_micros end
end
local ttl_ms = need / 1000
-- Keep the TTL set if it lasts long enough (setting one costs Redis an
-- update of its expiry table): else twice the need, plus 2 ms.
local keep = value and time_micros + need + 2000 <= expires
if ttl_ms < TTL_CAP_MS / 2 then
    ttl_ms = ttl_ms - ttl_ms % 1 + 1
    ttl_ms = ttl_ms + ttl_ms + 2
else
    ttl_ms = TTL_CAP_MS
end
if not keep then expires = time_micros + ttl_ms * 1000 end

local parts = {struct.pack('<c4ddddd', SEVERAL, n, expires, now, next_id, count - first + 1)}
for i = 1, n do parts[#parts + 1] = struct.pack('<ddddd', st[i], nf[i], fr[i], rate[i], mx[i]) end
if first <= count then
    for i = 1, n do parts[#parts + 1] = struct.pack('<ddd', bst[i], bnf[i], bfr[i]) end
    for j = first, count do
        parts[#parts + 1] = struct.pack('<dddd', log_id[j], log_permits[j], log_now[j], log_moment[j])
    end
end
if keep then
    redis.call('SET', key, table.concat(parts), 'KEEPTTL')
else
    redis.call('SET', key, table.concat(parts), 'PX', ttl_ms)
end
return reply
