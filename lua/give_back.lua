-- Part 3 of 5: a give-back (Limits::give_back). The held reservation with
-- this id leaves the log, if it is still there with its moment ahead, and
-- the log's other requests are charged again (in part 4) from the states
-- before the first: the limits then hold what they would had it never
-- been made.

-- E: the log's requests as read, 4 doubles each (see Log); `first`: the
-- first whose moment is ahead (Limits::expire: those before it were used);
-- `place`: the one given back.
local E, first, place
if mode == 'give_back' then
    -- A rate changed since: the log is void (the next write empties it),
    -- and nothing is given back.
    if changed or ort ~= rate or omx ~= mx or count == 0 then return 0 end
    E = {struct.unpack(string.rep('<d', 4 * count), value, log_at)}
    -- Every request is checked, as this script writes them: its id (rising,
    -- below next_id), -1 (none) or -1 - limit (a resume of that limit,
    -- carrying its debt as permits); whole µs, the moment at or after its
    -- now.
    local last_id = -1
    for j = 1, 4 * count, 4 do
        local id, p, at, moment = E[j], E[j + 1], E[j + 2], E[j + 3]
        if not (id % 1 == 0 and id < next_id and id >= -1 - n and (id < 0 or id > last_id)
                and p % 1 == 0 and p >= 0 and p <= MAX_MICROS and at >= 0 and at % 1 == 0
                and moment >= at and moment <= MAX_MICROS and moment % 1 == 0) then
            return redis.error_reply(string.format(NOT_OURS, key, size))
        end
        if id >= 0 then last_id = id end
        if not first and moment > now then first = j end
        if id == give_back_id and moment > now then place = j end
    end
    if not place then return 0 end
end
