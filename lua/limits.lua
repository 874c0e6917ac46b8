-- Part 2 of 5: what a learn learns (Limits::learn, before its rates are
-- applied in part 4), the limits' configuration at the rates they run at,
-- and the rest of the value as read, checked.

---------------------------------------------------------------------------
-- A learn: what the limits learn from the lesson (L2, laid out as L), at
-- the key's clock. They run at their configured rates (the ceilings, in
-- ARGV) until they first learn (see Learned).
---------------------------------------------------------------------------

if lesson then
    -- (L2 laid out as L; f: the lesson. The rates change: `changed`.)
    local f = lesson
    changed = true
    L2 = L and {L[1], L[2], L[3], f[9]} or {1.0, 0, 0, f[9]}
    -- (Each limit's cap: reported, learned before, or none, inf.)
    for i = 1, n do L2[4 + i] = f[8 + 3 * i] or L and i <= held_n and L[4 + i] or 1e999 end
    -- (When its call went: one that went before the last pause ended
    -- lowers nothing, and raises nothing.)
    local sent = math.max(now - sent_ago, 0)
    if f[1] then
        -- A refusal: lowered once per pause (not for a call that went
        -- before the last one ended); paused until its Retry-After.
        if sent >= L2[2] then L2[1] = math.max(L2[1] * f[4], f[7]) end
        f[10] = math.min(now + (f[3] or f[8]), MAX_MICROS)
        if f[10] > L2[2] then L2[2] = f[10] end
        L2[3] = L2[2]
    elseif f[2] and sent >= L2[2] and L2[1] < 1.0 and (now - L2[3] >= f[6] or f[6] == 0) then
        -- A success of a call that went after the pause, an interval
        -- after the last rise.
        L2[1] = math.min(L2[1] + f[5], 1.0)
        L2[3] = now
    end
end

---------------------------------------------------------------------------
-- The configuration in force (Policy::set_stable_interval), limit by
-- limit: its rate (what it learned makes of its configured rate: see
-- Learned), whether it is bursty, its max_burst_micros or warmup_micros,
-- stable interval, max_permits, warming-up threshold and slope, and
-- cool-down interval (Policy::cool_down_interval_micros). C holds all of
-- them, 8 per limit. A learn goes over the limits twice: at the rates
-- they ran at before the lesson (only each rate and max_permits kept, in
-- M1, for part 4), then at those after it.
---------------------------------------------------------------------------

local rate, bursty, pmicros, stable, mx, thr, slope, cd
local C, r1, b1, p1, s1, m1, t1, l1, d1
-- (f: what the limits learned, for their rates.)
local f = L
while true do
    for i = 1, n do
        local a = 4 * i - 1 -- its rate; then its policy, micros and cold factor
        -- stable_interval_micros: rejects NaN, zero, negative rates (and -inf).
        rate = tonumber(argv[a])
        if not (rate and rate > 0) then
            return redis.error_reply(string.format('ERR paceline: permits_per_second of limit %d (ARGV[%d]) must be a number > 0 or inf (got "%.40s")', i - 1, a, argv[a]))
        end
        if f then
            -- Learned::rate: min(ceiling, cap * margin) * factor, the capped
            -- rate if that is not > 0; a cap * margin that rounds to 0 is the
            -- least double, the slowest rate. (A limit the value lacks has
            -- no cap: inf.)
            local m = (f[4 + i] or 1e999) * f[4]
            if m == 0 then m = 4.9406564584124654e-324 end
            if m < rate then rate = m end
            m = rate * f[1]
            if m > 0.0 then rate = m end
        end
        local policy = argv[a + 1]
        bursty = policy == 'bursty'
        if not bursty and policy ~= 'warming_up' then
            return redis.error_reply(string.format('ERR paceline: the policy of limit %d (ARGV[%d]) must be "bursty" or "warming_up" (got "%.40s")', i - 1, a + 1, policy))
        end
        -- Bursty::max_burst_micros or WarmingUp::warmup_micros, capped as `micros`.
        pmicros = tonumber(argv[a + 2])
        if not (pmicros and pmicros >= 0 and pmicros % 1 == 0) then
            return redis.error_reply(string.format('ERR paceline: %s of limit %d (ARGV[%d]) must be an integer >= 0 (got "%.40s")', bursty and 'max_burst_micros' or 'warmup_micros', i - 1, a + 2, argv[a + 2]))
        end
        if pmicros > MAX_MICROS then pmicros = MAX_MICROS end
        stable = 1000000.0 / rate
        if stable > MAX_MICROS then stable = MAX_MICROS end
        cd = stable
        mx = 0.0
        if bursty then
            -- Bursty::max_permits
            if rate <= F64_MAX then mx = pmicros * rate / 1000000.0 end
            if mx > F64_MAX then mx = F64_MAX end
        else
            local cold_factor = tonumber(argv[a + 3])
            if not (cold_factor and cold_factor >= 1 and cold_factor <= F64_MAX) then
                return redis.error_reply(string.format('ERR paceline: the cold_factor of limit %d (ARGV[%d]) must be a finite number >= 1 (got "%.40s")', i - 1, a + 3, argv[a + 3]))
            end
            -- WarmingUp::set_stable_interval (all 0 at an infinite rate)
            thr = 0.0; slope = 0.0
            if stable > 0.0 then
                local cold = stable * cold_factor
                if cold > F64_MAX then cold = F64_MAX end
                thr = 0.5 * pmicros / stable
                if thr > F64_MAX then thr = F64_MAX end
                -- (stable + cold is finite: cold is at most F64_MAX and
                -- stable at most 2^53)
                mx = thr + 2.0 * pmicros / (stable + cold)
                if mx > F64_MAX then mx = F64_MAX end
                if mx > thr then
                    slope = (cold - stable) / (mx - thr)
                    if slope > F64_MAX then slope = F64_MAX end
                end
            end
            if mx > 0.0 then cd = pmicros / mx end
        end
        if n == 1 then
            -- (One limit keeps nothing, in one test.)
        elseif i == 1 then
            -- (The first limit's wait in locals for the second's.)
            r1 = rate; b1 = bursty; p1 = pmicros; s1 = stable; m1 = mx; t1 = thr or 0.0; l1 = slope or 0.0; d1 = cd
        elseif not (n == 2 and held_n == 2 and count == 0 and not (mode or held)) then
            -- (Not two limits in locals, see below: for those, C only if
            -- a rate changed.)
            if i == 2 then C = {r1, b1, p1, s1, m1, t1, l1, d1} end
            local c = 8 * i - 8
            C[c + 1], C[c + 2], C[c + 3], C[c + 4] = rate, bursty, pmicros, stable
            C[c + 5], C[c + 6], C[c + 7], C[c + 8] = mx, thr or 0.0, slope or 0.0, cd
        end
    end
    if not L2 or f == L2 then break end
    -- A learn: the rates in force before the lesson kept, the limits again
    -- with what they learned from it.
    M1 = {rate, mx}
    for i = 1, n > 1 and n or 0 do M1[2 * i - 1], M1[2 * i] = C[8 * i - 7], C[8 * i - 3] end
    f = L2
end

---------------------------------------------------------------------------
-- The value as read, checked (the head was, in part 1): every field, as
-- this script writes them.
---------------------------------------------------------------------------

if count > 0 or R or debts then
    -- A request of the log, at byte `at` of the value, read as its head
    -- (see front and front_P), and whether it is as this script writes
    -- them (`good`): its id whole, -1 (none), -1 - limit (a resume of
    -- that limit, carrying its debt as its counts), -101 - limit (a cap
    -- on what that limit stores, what the upstream said is left, whole
    -- but of any size, as its counts) or >= 0 and below
    -- `below`; whole counts up to 2^53 (a cap's, any), the first
    -- negative for an open call (with an id); whole µs, the moment at or
    -- after its now. (Made only for a
    -- value with a log or a call that may log several requests: part 3
    -- checks each request with it, part 4 reads the next ones, of the
    -- value or of those it logged, as the log moves on. It captures
    -- nothing, as it is made on each such call: 2^53 is MAX_MICROS.)
    read_request = function(at, below, value, n)
        -- (_: the position unpack returns last; P: nil with one limit.)
        local id, p, t, moment, _, P = struct.unpack('<dddd', value, at)
        local good = id % 1 == 0 and id < below and p % 1 == 0
            and (id >= -1 - n and p >= -9007199254740992 and p <= 9007199254740992 and (p >= 0 or id >= 0)
                or id <= -102 and id >= -101 - n and p >= 0)
            and t >= 0 and t % 1 == 0 and moment >= t and moment <= 9007199254740992 and moment % 1 == 0
        if id < 0 then
            moment = -1
        elseif p < 0 then
            p, moment = -1 - p, 1e999
        end
        if n > 1 then
            P = {struct.unpack('<' .. string.rep('d', 3 + n), value, at)}
            P[1] = p
            for i = 2, n do
                P[i] = P[3 + i]
                good = good and P[i] % 1 == 0 and P[i] >= 0 and (P[i] <= 9007199254740992 or id < -101)
            end
        end
        return good, id, p, t, moment, P
    end
end

-- The limits: with several (read or in force), S; `changed`: a limit other
-- than the first is at another rate or max_permits than in force (the
-- first then compares to rate and mx, its own).
if value then
    if ok and held_n + n > 2 then
        -- (The head read its first six doubles, from HEAD on.)
        local HEAD = 36 -- the marker and the hot part's head: four doubles
        -- Two limits that logged nothing, for a reservation (that logs
        -- nothing, see part 4), at the rates in force: no table, as with
        -- one limit (C is built only if a rate changed: with several
        -- limits, no C from here on means these two). The second is
        -- worked on in st, nf, fr, ort and omx (its configuration: the last
        -- the loop above set), the first waits aside in bst, bnf, bfr (the
        -- log's base, free with nothing logged; its configuration: r1 to
        -- d1). (The head read the second's state as expires, ort and omx; a
        -- rate equal to the one in force is > 0, a max_permits in
        -- 0..=F64_MAX.)
        if n > 1 and not C then
            local e, r, m, r2, m2 = struct.unpack('<ddddd', value, HEAD + 49)
            if r == r1 and m == m1 and r2 == rate and m2 == mx then
                bst = st; bnf = nf; bfr = fr; st = expires; nf = ort; fr = omx; expires = e; ort = r2; omx = m2
                ok = bst <= m and bst >= 0 and bnf >= 0 and bnf <= MAX_MICROS and bnf % 1 == 0
                    and bfr >= 0 and bfr < FRACTION_ONE and bfr % 1 == 0
            else
                C = {r1, b1, p1, s1, m1, t1, l1, d1, rate, bursty, pmicros, stable, mx, thr or 0.0, slope or 0.0, cd}
            end
        end
        if not bst then
            S = {st, nf, fr, expires, ort, omx, struct.unpack(string.sub(FORMAT, 3, 5 * held_n - 2), value, HEAD + 49)}
            -- (j: the limit's rate in S, c: its configuration in C.)
            local e, j, c = 3 * held_n + 1, 3 * held_n + 2, 0
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
    end
    ok = ok and expires >= 0 and expires <= F64_MAX and omx >= 0 and omx <= F64_MAX and st >= 0
        and st <= omx and nf >= 0 and nf <= MAX_MICROS and nf % 1 == 0
        and fr >= 0 and fr < FRACTION_ONE and fr % 1 == 0 and ort > 0
    -- A value with another number of limits keeps its limits by position
    -- (those it lacks start full, below; those past n go) and loses its log.
    if held_n ~= n then count = 0 end
    if ok and count > 0 then
        -- The log's first request, then the states before it.
        at = at + 9
        log_from = at + 24 * n
        log_at = log_from + 8 * W * dead
        ok, front_id, front_p, front_at, front, front_P = read_request(log_at, next_id, value, n)
        if n == 1 then
            bst, bnf, bfr = struct.unpack('<ddd', value, at)
        else
            B = {struct.unpack(string.sub(FORMAT, 3, 3 + 3 * n), value, at)}
        end
        -- (Each within its limit's max_permits as read, m: the log holds
        -- only requests charged at those rates, so a charge of it again
        -- from its base stores no more.)
        local m = omx
        for i = 1, n do
            if B then bst, bnf, bfr, m = B[3 * i - 2], B[3 * i - 1], B[3 * i], S[3 * n + 2 * i + 1] end
            ok = ok and bst >= 0 and bst <= m and bnf >= 0 and bnf <= MAX_MICROS and bnf % 1 == 0
                and bfr >= 0 and bfr < FRACTION_ONE and bfr % 1 == 0
        end
    end
    if not ok then return redis.error_reply(string.format(NOT_OURS, size)) end
    -- A try of one limit that the debt does not fit, its rate unchanged:
    -- refused here, as part 4 would refuse it (see Replies).
    if timeout >= 0 and nf - now > timeout and n == 1 and not mode and ort == rate and omx == mx then
        return st == 0 and now - nf or struct.pack('<dddd', now, st, nf, fr)
    end
end
-- The record of the last request granted (see part 4), none yet: now.
local whole, logged_as_read, moment_r, bound_r = held_n ~= n, count, now, -1
-- Missing (or a limit the value lacks): idle for a long time, i.e. full,
-- at the rate in force before a lesson.
if held_n == 0 then
    ort = rate; omx = mx
    if M1 then ort = M1[1]; omx = M1[2] end
    st = omx; nf = now; fr = 0
end
if n > 1 then
    if held_n ~= n then
        -- S laid out for n limits (T), those it lacks as they start (e: the
        -- TTL's end in the value's).
        local T, e = {}, 3 * held_n + 1
        for i = 1, n do
            local c, k, j = 8 * i - 8, 3 * i - 2, 3 * n + 2 * i
            if i > held_n then
                local r, m = M1 and M1[2 * i - 1] or C[c + 1], M1 and M1[2 * i] or C[c + 5]
                T[k], T[k + 1], T[k + 2], T[j], T[j + 1] = m, now, 0, r, m
            else
                T[k], T[k + 1], T[k + 2], T[j], T[j + 1] = S[k], S[k + 1], S[k + 2], S[e + 2 * i - 1], S[e + 2 * i]
            end
        end
        T[3 * n + 1], S = expires, T
    elseif not C and bnf > now then
        -- Two limits in locals: the moment both allow starts from the
        -- first's ticket (see part 4), as the record's.
        moment_r = bnf; bound_r = 0
    end
end
