-- Part 3 of 5: the calls on the log itself (see Log). A give-back
-- (Limits::give_back): the request with this id leaves the log, if it is
-- still there with its moment ahead, and the log's other requests are
-- charged again (in part 4) from the states before the first: the limits
-- then hold what they would had it never been made; an open call whose
-- moment has passed is kept instead. A keep (Limits::keep): the request
-- with this id will not be given back nor settled; those at the head that
-- were used leave the log (no state changes). A settle (Limits::settle):
-- the open call with this id, while the log holds it, gets the counts it
-- really cost and the log is charged again from its base, as a give-back
-- does; once the log let it go, what it cost past what it was charged is
-- charged now, as a reservation (part 4) that does not wait for it.

-- E: the log's requests as read, W doubles each (see Log); `first`: the
-- first that stays in the log (Limits::expire: those before it were used,
-- or kept); `place`: the one given back; `kept`: the one kept (its id and
-- open flag cleared). (T, `ahead` and K: see part 4, declared here in
-- the same instruction.)
local E, first, place, kept, T, ahead, K
if mode and (mode == 'give_back' or mode == 'keep' or mode == 'settle') then
    -- A rate changed since (or changes now, with this call): the log is
    -- void (the next write empties it), and nothing is given back or kept.
    changed = changed or ort ~= rate or omx ~= mx
    if (changed or count == 0) and mode ~= 'settle' then return 0 end
    if not (changed or count == 0) then
        E = {struct.unpack(string.rep('<d', W * count), value, log_at)}
        -- Every request is checked, as this script writes them (see
        -- read_request, part 2), its ids rising. (c: its first count as
        -- stored.)
        local last_id = -1
        for j = 1, W * count, W do
            local id, c, moment = E[j], E[j + 1], E[j + 3]
            if not (read_request(log_at + 8 * j - 8, next_id, value, n) and (id < 0 or id > last_id)) then
                return redis.error_reply(string.format(NOT_OURS, size))
            end
            if id >= 0 then last_id = id end
            if id ~= give_back_id then
            elseif mode == 'keep' or mode == 'give_back' and c < 0 and moment <= now then
                kept = j
            elseif mode == 'give_back' and moment > now or mode == 'settle' and c < 0 then
                place = j
            end
            -- (The first that stays: with an id, open or its moment ahead,
            -- and not the one kept, whose id goes.)
            if not first and id >= 0 and j ~= kept and (c < 0 or moment > now) then first = j end
        end
        first = first or W * count + 1
    end
    if mode == 'settle' and not place then
        -- Let go: what it cost past what it was charged, limit by limit
        -- (nothing if it cost no more anywhere; `ok`: it cost more).
        ok = false
        for i = 1, n do
            local m = math.max(lists[2][i] - lists[1][i], 0)
            lists[1][i], ok = m, ok or m > 0
        end
        if not ok then return 0 end
        mode, permits, E, P = nil, lists[1][1], nil, lists[1]
    elseif mode == 'settle' then
        -- In the log: its counts replaced, then charged again with the rest.
        E[place + 1] = -1 - lists[2][1]
        for i = 2, n do E[place + 2 + i] = lists[2][i] end
        place = nil
    elseif kept then
        -- (Its id cleared; an open call's count, -1 - p, made p again.)
        E[kept], E[kept + 1] = -1, math.max(E[kept + 1], -1 - E[kept + 1])
    elseif not place then
        return 0
    end
end
