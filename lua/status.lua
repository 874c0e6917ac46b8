-- Part 2 of 5: the calls that change nothing: a query, a status, and the
-- probe of a key that exists.

-- QUERY: the wait (Limits::earliest: the latest ticket, or now), and
-- writes nothing. PROBE of a key that exists: the same bytes again, the
-- same TTL, and the wait. (A missing key is written in part 5 as it reads.)
if permits == 0 or (mode == 'probe' and value) then
    local latest = now
    if n == 1 then
        if nf > latest then latest = nf end
    else
        for k = 2, 5 * n, 5 do
            if S[k] > latest then latest = S[k] end
        end
    end
    if mode then redis.call('SET', key, value, 'KEEPTTL') end
    return latest - now
end

-- STATUS: the clock, then each limit's state as read (a limit the value
-- lacks, or a missing key, as it starts), for a snapshot: five doubles per
-- limit, stored_permits, next_free_micros, next_free_fraction, and the rate
-- and max_permits it was last charged at. The client takes them to the
-- rates in force (src/core/snapshot.rs). Writes nothing.
if mode == 'status' then
    if n == 1 then return struct.pack('<dddddd', now, st, nf, fr, ort, omx) end
    return struct.pack('<' .. string.rep('d', 1 + 5 * n), now, unpack(S, 1, 5 * n))
end
