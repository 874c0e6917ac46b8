-- Part 5 of 5: the TTL, the value written, the reply.

-- The TTL the key needs: until the debt is paid and the stored permits are
-- refilled to max_permits, plus 2 ms, on the clock as read (see Expiry).
-- (Not 1: before Redis 7.2, setting a 1 ms TTL can delete the key at once if
-- a millisecond boundary falls between the two clock reads.) ceil(x) is
-- x - x % 1, plus 1 if x had a fraction; x < TTL_CAP_MS - 2 rules out inf
-- and NaN first. A need <= 0 (a cancel can move the ticket into the past)
-- means the key already reads as missing.
local ttl_ms = (next_free_micros - time_micros) / 1000
    + (max_permits - stored_permits) * cool_down / 1000
-- The ledger is written while it holds anything, and until the moments of
-- the reservations it gave an id have all passed (the horizon): no token
-- meets another ledger's ids while it may be given back. The key lives
-- that long too.
local marker = MARKER
if groups > 0 or now_micros < horizon then
    marker = THR3
    local horizon_ms = (horizon - time_micros) / 1000
    if horizon_ms > ttl_ms then ttl_ms = horizon_ms end
end
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

-- The reservation recorded with the value: this one, or one of nothing;
-- then field 7.
if mode then
    stored_before, next_free_before, record = stored_permits, next_free_micros, next_free_fraction * 2
end
fractions = next_free_fraction * FRACTIONS_SHIFT + record

-- Write: keep the TTL if it lasts long enough, else set one with slack
-- (twice the need, at most TTL_MAX_SLACK_MS more).
local written, ttl_option
if time_micros + ttl_ms * 1000 <= expires_micros then
    ttl_option = 'KEEPTTL'
else
    if ttl_ms > TTL_MAX_SLACK_MS then
        ttl_ms = ttl_ms + TTL_MAX_SLACK_MS
    else
        ttl_ms = ttl_ms + ttl_ms
    end
    if ttl_ms > TTL_CAP_MS then ttl_ms = TTL_CAP_MS end
    ttl_option = 'PX'
    expires_micros = time_micros + ttl_ms * 1000
end
written = struct.pack(VALUE, marker, stored_permits, next_free_micros, permits_per_second, max_permits,
    expires_micros, now_micros, fractions, stored_before, next_free_before)
local value_written = written
if marker == THR3 then
    -- The ledger: its head, every group's place (id, moment), then the
    -- (id, offset) of those with an offset.
    value_written = written .. struct.pack(LEDGER, open, next_id, earliest, in_order, groups, horizon)
        .. string.sub(src, p0, p1) .. p_tail .. string.sub(src, e0, e1) .. e_tail
end
if ttl_option == 'PX' then
    redis.call('SET', key, value_written, 'PX', ttl_ms)
else
    redis.call('SET', key, value_written, 'KEEPTTL')
end

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
