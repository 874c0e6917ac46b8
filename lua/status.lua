-- Part 3 of 7: the calls that change nothing: a query, and the probe of a
-- key that exists. (A status is answered in part 5, at the rates in force.)

-- QUERY: the wait (Limits::earliest: the latest ticket, or now), and
-- writes nothing. PROBE of a key that exists: the same bytes again, the
-- same TTL, and the wait. (A missing key is written in part 7 as it reads.)
-- (A call whose first count is 0 is no query.)
if permits == 0 and held ~= 2 or (mode == 'probe' and value) then
    local latest = now
    for k = 2, 3 * n, 3 do
        local ticket = S and S[k] or nf
        if ticket > latest then latest = ticket end
    end
    if mode then redis.call('SET', key, value, 'KEEPTTL') end
    return latest - now
end
