-- Part 5 of 5: the value written, its TTL, the reply.

-- A batch's replies end with the limits' states after it, with the clock,
-- as a status replies them.
if replies then
    local k = #replies
    replies[k + 1] = now
    if n == 1 then
        replies[k + 2], replies[k + 3], replies[k + 4], replies[k + 5], replies[k + 6] = st, nf, fr, ort, omx
    else
        for j = 1, 5 * n do replies[k + 1 + j] = S[j] end
    end
    replies = struct.pack('<' .. string.rep('d', #replies), unpack(replies))
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
-- needs part 4 noted (`needs`).
local ttl_ms
if needs then
    ttl_ms = needs[1]
elseif n == 1 then
    ttl_ms = (nf - time_micros) / 1000 + (mx - st) * cd / 1000
else
    for i = 1, n do
        local c, k = 8 * i - 8, 5 * i - 4
        local need = (S[k + 1] - time_micros) / 1000 + (C[c + 5] - S[k]) * C[c + 8] / 1000
        if i == 1 or need > ttl_ms then ttl_ms = need end
    end
end
local ttl_set
for j = 1, needs and #needs or 1 do
    if j > 1 then ttl_ms = needs[j] end
    if ttl_ms < TTL_CAP_MS - 2 then
        if ttl_ms > 0 then
            local whole = ttl_ms - ttl_ms % 1
            if whole < ttl_ms then whole = whole + 1 end
            ttl_ms = whole + 2
        else
            ttl_ms = 2
        end
    else
        ttl_ms = TTL_CAP_MS
    end
    -- Keep the TTL the key has if it lasts that long (setting one costs
    -- Redis more than the rest of the write), else set one with slack:
    -- twice the need, at most TTL_MAX_SLACK_MS more. So the TTL only ever
    -- grows, and covers every logged request's moment, which was at most a
    -- ticket.
    if time_micros + ttl_ms * 1000 > expires then
        if ttl_ms > TTL_MAX_SLACK_MS then
            ttl_ms = ttl_ms + TTL_MAX_SLACK_MS
        else
            ttl_ms = ttl_ms + ttl_ms
        end
        if ttl_ms > TTL_CAP_MS then ttl_ms = TTL_CAP_MS end
        expires = time_micros + ttl_ms * 1000
        ttl_set = ttl_ms
    end
end

-- The value (see Value): its head, each limit's state (at the rates in
-- force), the record of the last request granted, and, while the log holds
-- any request, the states before its first and the requests: for a cancel,
-- those still in it less the one given back; else those of the value as
-- read that it kept, then this call's.
-- (A cancel keeps the requests from the first still in the log, less the
-- one given back.)
local logged = count
if E then count = count - (first - 1) / 4 - 1 end
local written
if n == 1 then
    written = struct.pack('<c4ddddddddddd', MARKER, 1 + SHAPE * count, expires, now, next_id,
        st, nf, fr, ort, omx, moment_r, bound_r)
else
    S[5 * n + 1], S[5 * n + 2] = moment_r, bound_r
    written = struct.pack('<c4dddd' .. string.rep('d', 5 * n + 2), MARKER, n + SHAPE * count, expires,
        now, next_id, unpack(S, 1, 5 * n + 2))
end
local stored = written
if E and count > 0 then
    local numbers = {}
    if n == 1 then
        numbers[1], numbers[2], numbers[3] = bst, bnf, bfr
    else
        for k = 1, 5 * n, 5 do numbers[#numbers + 1], numbers[#numbers + 2], numbers[#numbers + 3] = B[k], B[k + 1], B[k + 2] end
    end
    for j = first, 4 * logged, 4 do
        if j ~= place then
            local k = #numbers
            numbers[k + 1], numbers[k + 2], numbers[k + 3], numbers[k + 4] = E[j], E[j + 1], E[j + 2], E[j + 3]
        end
    end
    stored = written .. struct.pack('<' .. string.rep('d', #numbers), unpack(numbers))
elseif count > 0 and not E then
    local base
    if n == 1 then
        base = struct.pack('<ddd', bst, bnf, bfr)
    else
        local numbers = {}
        for k = 1, 5 * n, 5 do numbers[#numbers + 1], numbers[#numbers + 2], numbers[#numbers + 3] = B[k], B[k + 1], B[k + 2] end
        base = struct.pack('<' .. string.rep('d', 3 * n), unpack(numbers))
    end
    stored = written .. base .. (log_at and string.sub(value, log_at, size) or '')
        .. (added and table.concat(added, '', added_first) or '')
end
if ttl_set then
    redis.call('SET', key, stored, 'PX', ttl_set)
else
    redis.call('SET', key, stored, 'KEEPTTL')
end

-- A reservation: the value written, without its log (see Reply).
if replies then return replies end
if not mode then return written end
if E then return 1 end
-- A resume, or the probe of a missing key: the debt.
local debt = 0
for k = 2, 5 * n, 5 do
    local ahead = (n == 1 and nf or S[k]) - now
    if ahead > debt then debt = ahead end
end
return debt
