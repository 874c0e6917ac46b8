-- Part 5 of 5: the value written, the reply.

-- A batch writes the value as its last granted request left it, with the
-- TTL the latest of them set, if any did (they all read one clock): the
-- same key as its requests one by one would leave. None granted: nothing
-- is written, as for a refused try.
if batch_p then
    -- The last grant's token, then every token, one after another, first.
    -- The value written is the last grant's.
    if last_r then
        replies[last_r] = 1
        packed[#packed + 1] = struct.pack(VALUE, last_marker, last_stored, last_next_free,
            permits_per_second, max_permits, last_expires, now_micros, last_fractions,
            last_stored_before, last_next_free_before)
    end
    table.insert(replies, 1, table.concat(packed))
    -- Then the key's debt after the batch.
    replies[#replies + 1] = next_free_micros > now_micros and next_free_micros - now_micros or 0
    if #packed == 0 then return replies end
    written = packed[#packed]
end
local value_written = written
if marker == THR3 then
    -- The ledger: its head, every group's place (id, moment), then the
    -- (id, offset) of those with an offset.
    value_written = written .. struct.pack(LEDGER, open, next_id, earliest, in_order, groups, horizon)
        .. string.sub(src, p0, p1) .. p_tail .. string.sub(src, e0, e1) .. e_tail
end
if ttl_set then
    redis.call('SET', key, value_written, 'PX', ttl_set)
else
    redis.call('SET', key, value_written, 'KEEPTTL')
end

if batch_p then return replies end
if not mode then
    -- State::reserve: the value written, without its ledger, is the reply
    -- and the token (see Reply); with the group's id if it has one.
    if token_id then return written .. struct.pack('<d', token_id) end
    return written
end
if cancelled then return cancelled end
-- Resume, or the probe of a missing key (no debt): the debt.
if next_free_micros > now_micros then return next_free_micros - now_micros end
return 0
