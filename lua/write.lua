-- Part 5 of 5: the value written, its TTL, the reply.

-- A batch's replies end with the next id (its held requests that waited
-- got the ids before it, in order), and the limits' states after it with
-- the clock, then what the key learned, if anything, as a status replies
-- them.
if replies then
    local k = #replies
    replies[k + 1], replies[k + 2] = next_id, now
    if n == 1 then
        replies[k + 3], replies[k + 4], replies[k + 5] = st, nf, fr
    else
        for j = 1, 3 * n do replies[k + 2 + j] = S[j] end
    end
    for j = 1, L and 4 + n or 0 do replies[#replies + 1] = L[j] or 1e999 end
    replies = struct.pack(string.rep('<d', #replies), unpack(replies))
    -- None granted (every try refused): nothing is written.
    if not writes then return replies end
end

-- The TTL the key needs (see Expiry): until every limit's debt is paid and
-- its stored permits refilled to max_permits, plus 2 ms, on the clock as
-- read. (Not 1: before Redis 7.2, setting a 1 ms TTL can delete the key at
-- once if a millisecond boundary falls between the two clock reads.)
-- ceil(x) is x - x % 1, plus 1 if x had a fraction; x < TTL_CAP_MS - 2
-- rules out inf and NaN first. A need <= 0 (a give-back can move a ticket
-- into the past) means the key already reads as missing. A batch applies
-- the rule after each request granted, as their own calls would, with the
-- needs part 4 noted (`needs`). A need the TTL covers with 3 ms to spare
-- keeps it at once (ceil(x) + 2 <= x + 3; a need below -1 ms, which a
-- keep or a give-back can leave, keeps a TTL shorter than 2 ms: the key
-- already reads as missing).
local ttl_ms, ttl_set
if needs then
elseif not C then
    -- (One limit's; two in locals: the first's, and the second's, kept in
    -- part 4.)
    ttl_ms = (nf - time_micros) / 1000 + (mx - st) * cd / 1000
    if n > 1 and need_r > ttl_ms then ttl_ms = need_r end
else
    for i = 1, n do
        local need = (S[3 * i - 1] - time_micros) / 1000 + (C[8 * i - 3] - S[3 * i - 2]) * C[8 * i] / 1000
        if i == 1 or need > ttl_ms then ttl_ms = need end
    end
end
for j = 1, needs and #needs or 1 do
    if needs then ttl_ms = needs[j] end
    if not (time_micros + ttl_ms * 1000 + 3000 <= expires) then
        if ttl_ms < TTL_CAP_MS - 2 then
            if ttl_ms < 0 then ttl_ms = 0 end
            local ceil = ttl_ms - ttl_ms % 1
            if ceil < ttl_ms then ceil = ceil + 1 end
            ttl_ms = ceil + 2
        else
            ttl_ms = TTL_CAP_MS
        end
        -- Keep the TTL the key has if it lasts that long (setting one
        -- costs Redis more than the rest of the write), else set one with
        -- slack: twice the need, at most TTL_MAX_SLACK_MS more. So the TTL
        -- only ever grows, and covers every logged request's moment, which
        -- was at most a ticket.
        if time_micros + ttl_ms * 1000 > expires then
            ttl_ms = ttl_ms + (ttl_ms > TTL_MAX_SLACK_MS and TTL_MAX_SLACK_MS or ttl_ms)
            if ttl_ms > TTL_CAP_MS then ttl_ms = TTL_CAP_MS end
            expires = time_micros + ttl_ms * 1000
            ttl_set = ttl_ms
        end
    end
end

-- The value (see Value). Its hot part (the head and each limit's state)
-- is what a reservation replies; when nothing else changed (the limits
-- and their rates, the TTL, the log) and the limits learned nothing (a
-- grant's reply carries what they learned, so that the state it reads is
-- at the rates in force), it alone is written over the value as read. A
-- reservation that keeps requests of the log as read writes in place too:
-- the hot part, the rest of the fixed part and the log's head (the
-- requests before `log_at` stay in the value, dead, up to DEAD_CAPACITY),
-- and its own request appended; the log is not copied.
-- Otherwise the value is written whole: for a give-back, keep or settle,
-- the requests still in the log (less the one given back, with the one
-- kept or settled as it now is); else those of the value as read that it
-- kept, then this call's. What the limits learned follows the fixed part.
-- (`logged`: a give-back's, keep's or settle's count before, for E.)
local logged, hot
if E then
    logged = count
    count = count - (first - 1) / W - (place and 1 or 0)
end
local shape = n + SHAPE * count + BOUND * (bound_r + 1)
if L then
    -- (A cap per limit: inf for a limit the value lacked.)
    shape = shape + LEARNED
    for i = 1, n do L[4 + i] = L[4 + i] or 1e999 end
end
if mode == 'probe' and value then
    -- The probe of a key that exists: the same bytes again, the same TTL.
    redis.call('SET', key, value, 'KEEPTTL')
elseif not whole and not ttl_set and count == 0 and logged_as_read == 0 and not L then
    if n == 1 then
        hot = struct.pack('<ddddddd', shape, now, next_id, moment_r, st, nf, fr)
    elseif not C then
        -- (Two limits in locals, see part 4.)
        hot = struct.pack('<dddddddddd', shape, now, next_id, moment_r, st, nf, fr, bst, bnf, bfr)
    else
        hot = struct.pack(string.sub(FORMAT, 3, 7 + 3 * n), shape, now, next_id, moment_r, unpack(S, 1, 3 * n))
    end
    redis.call('SETRANGE', key, '4', hot)
elseif count == 0 then
    if n == 1 then
        hot = struct.pack('<c4dddddddddd', MARKER, shape, now, next_id, moment_r, st, nf, fr, expires, rate, mx)
    elseif not C then
        -- (Two limits in locals; the second's rate and max_permits, as in
        -- force: ort, omx.)
        hot = struct.pack('<c4ddddddddddddddd', MARKER, shape, now, next_id, moment_r, st, nf, fr, bst, bnf,
            bfr, expires, r1, m1, ort, omx)
    else
        S[3 * n + 1] = expires
        hot = struct.pack(string.sub(FORMAT, 1, 8 + 5 * n), MARKER, shape, now, next_id, moment_r,
            unpack(S, 1, 5 * n + 1))
    end
    if L then hot = hot .. struct.pack(string.sub(FORMAT, 3, 7 + n), unpack(L, 1, 4 + n)) end
    if ttl_set then redis.call('SET', key, hot, 'PX', ttl_set) else redis.call('SET', key, hot, 'KEEPTTL') end
else
    -- The fixed part after the hot one: the TTL's end, each limit's rate
    -- and max_permits; the log's head: the dead requests, the base.
    local in_place = log_at and not mode and not whole and log_at - log_from <= 8 * W * DEAD_CAPACITY
    dead = in_place and (log_at - log_from) / (8 * W) or 0
    if n == 1 and not (E or L) then
        hot = struct.pack('<dddddddddddddd', shape, now, next_id, moment_r, st, nf, fr, expires, rate, mx,
            dead, bst, bnf, bfr)
    else
        -- (One limit's state and base laid out as several limits' are.)
        if n == 1 then S, B = {st, nf, fr, expires, rate, mx}, {bst, bnf, bfr} end
        S[3 * n + 1] = expires
        local numbers = {shape, now, next_id, moment_r, unpack(S, 1, 5 * n + 1)}
        for k = 1, L and 4 + n or 0 do numbers[#numbers + 1] = L[k] end
        numbers[#numbers + 1] = dead
        for k = 1, 3 * n do numbers[#numbers + 1] = B[k] end
        for j = first or 1, E and W * logged or 0, W do
            if j ~= place then
                for k = j, j + W - 1 do numbers[#numbers + 1] = E[k] end
            end
        end
        hot = struct.pack(string.rep('<d', #numbers), unpack(numbers))
    end
    if in_place then
        -- (A single reservation adds at most one request.)
        redis.call('SETRANGE', key, '4', hot)
        if added then redis.call('APPEND', key, added[1]) end
        if ttl_set then redis.call('PEXPIRE', key, ttl_set) end
    else
        hot = MARKER .. hot
        if not E then
            hot = hot .. (log_at and string.sub(value, log_at, size) or '')
                .. (added and table.concat(added, '', added_first) or '')
        end
        if ttl_set then redis.call('SET', key, hot, 'PX', ttl_set) else redis.call('SET', key, hot, 'KEEPTTL') end
    end
end

-- A reservation (a call's, a settle's the log let go): what it wrote,
-- from the hot part on (see Reply); a learn the value, whole.
if replies then return replies end
if not mode or mode == 'learn' then return hot end
-- A give-back: 1 given back, 0 kept instead; a keep or a settle in the
-- log: 1.
if E then return (kept and mode == 'give_back') and 0 or 1 end
-- A resume or a probe: the debt (Limits::earliest: the latest ticket, or
-- now).
local debt = 0
for k = 2, 3 * n, 3 do debt = math.max(debt, (n == 1 and nf or S[k]) - now) end
return debt
