-- Part 3 of 7: the call that changes nothing: the probe of a key that
-- exists. (A status is answered in part 5, at the rates in force.)

-- PROBE of a key that exists: the same bytes again, the same TTL, and the
-- wait (Limits::earliest: the latest ticket, or now). (A missing key is
-- written in part 7 as it reads.)
if mode == 'probe' and value then
    redis.call('SET', key, value, 'KEEPTTL')
    local latest = now
    for k = 2, 3 * n, 3 do
        local ticket = S and S[k] or nf
        if ticket > latest then latest = ticket end
    end
    return latest - now
end
