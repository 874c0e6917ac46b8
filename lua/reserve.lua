-- Part 4 of 5: the rate in force, then a reservation.

-- STATUS: the key's state as read (a missing key as it starts), with the
-- clock, writing nothing: six doubles, `now_micros, stored_permits,
-- next_free_micros, next_free_fraction, rate, max_permits` (the rate and
-- max_permits it was last charged at). The client takes it to the rate in
-- force (src/core/snapshot.rs).
if mode == 'status' then
    return struct.pack('<dddddd', now_micros, stored_permits, next_free_micros, next_free_fraction,
        old_rate, old_max)
end

-- State::set_rate, when the rate (or the configuration) changed. (Never for
-- a cancel or a probe: their configuration is the key's.)
if old_rate ~= permits_per_second or old_max ~= max_permits then
    -- Ledger::clear: its offsets were at the old rate.
    open, groups, earliest, in_order = 0, 0, INFINITY, 1
    src, p0, p1, e0, e1 = '', 1, 0, 1, 0
    local old_stable = 1000000.0 / old_rate
    if old_stable > MAX_MICROS then old_stable = MAX_MICROS end
    -- State::resync at the old stable interval and max_permits.
    if now_micros > next_free_micros then
        local old_cool_down = old_stable
        if not is_bursty and old_max > 0.0 then old_cool_down = policy_micros / old_max end
        -- Idle time from the exact ticket: > 0 (the fraction is below one
        -- µs), so an infinite quotient (cool_down == 0) is fine, never NaN.
        local stored = stored_permits
            + ((now_micros - next_free_micros) - next_free_fraction / FRACTION_ONE) / old_cool_down
        if stored > old_max then stored = old_max end
        stored_permits = stored
        next_free_micros = now_micros
        next_free_fraction = 0
    end
    if old_stable == 0.0 then
        -- Policy::stored_permits_after_infinite_rate
        stored_permits = is_bursty and max_permits or 0.0
    elseif old_max == 0.0 then
        -- Policy::initial_stored_permits
        stored_permits = is_bursty and 0.0 or max_permits
    else
        -- stored / old_max is in 0..=1, so this never overflows.
        stored_permits = stored_permits / old_max * max_permits
    end
end

-- One request, or each of a batch in order (see Batch): they all read the
-- clock once, and the state each leaves is the next one's, as if each were
-- its own call at that clock reading. A batch packs each granted request's
-- token as its own write would, and writes once, at the end.
-- The reservation a write records (`State::reserve_recorded`'s; a mode
-- records one of nothing), and its id in the ledger; the value written
-- (its first 76 bytes), its marker, and the TTL to set in ms (nil: the
-- key's is kept).
local stored_before, next_free_before, record, token_id
local written, marker, ttl_set
-- A batch's replies (see Batch): per request, -debt if refused, else 0 (no
-- token), 1 (a token) or its group's id + 2 (a token with that id); and the
-- tokens. The latest grant's token waits in `last_*` until it is known
-- whether it is the batch's last grant.
local replies, packed
local last_r, last_marker, last_stored, last_next_free, last_expires, last_fractions
local last_stored_before, last_next_free_before
if batch_p then replies, packed = {}, {} end
for r = 1, batch_p and #batch_p or 1 do
    if batch_p then
        permits, held, timeout_micros = batch_p[r], batch_h[r], batch_t[r]
        is_try = timeout_micros >= 0
        token_id = nil
        if p_tail ~= '' then
            -- The previous request's group joins the ledger as read, which
            -- the code below reads from its ends.
            local places = string.sub(src, p0, p1) .. p_tail
            src = places .. string.sub(src, e0, e1) .. e_tail
            p0, p1, e0, e1 = 1, #places, #places + 1, #src
            p_tail, e_tail = '', ''
        end
    end
    -- State::can_acquire, for a try: refused means nothing is written at
    -- all (for a batch, nothing for this request).
    if is_try and next_free_micros - timeout_micros > now_micros then
        if not batch_p then return now_micros - next_free_micros end
        replies[r] = now_micros - next_free_micros
    else
        if not mode or mode == 'resume' then
            -- Ledger::note: the request's term joins the open group. First
            -- Ledger::expire.
            if groups > 0 and now_micros >= earliest then
                if in_order == 1 then
                    -- Moments rise with the groups: the passed ones come first, and
                    -- their entries (with ids up to theirs) too; the smallest offset
                    -- among those is the first. It joins the next group, whose own
                    -- entry (the next, if it has one) can only be larger.
                    -- (The groups are all in `src` here: nothing was added yet.)
                    local passed = 0
                    while passed < groups and struct.unpack('<d', src, p0 + 16 * passed + 8) <= now_micros do
                        passed = passed + 1
                    end
                    if passed > 0 then
                        local last_passed = struct.unpack('<d', src, p0 + 16 * passed - 16)
                        local carried = INFINITY
                        if e0 <= e1 and struct.unpack('<d', src, e0) <= last_passed then
                            carried = struct.unpack('<d', src, e0 + 8)
                            repeat
                                e0 = e0 + 16
                            until e0 > e1 or struct.unpack('<d', src, e0) > last_passed
                        end
                        p0 = p0 + 16 * passed
                        groups = groups - passed
                        if groups > 0 and carried < INFINITY then
                            -- The next group's entry becomes the first (its own,
                            -- if it had one, is larger): the groups are packed
                            -- anew.
                            local first = struct.unpack('<d', src, p0)
                            if e0 <= e1 and struct.unpack('<d', src, e0) == first then e0 = e0 + 16 end
                            src = string.sub(src, p0, p1) .. struct.pack('<dd', first, carried)
                                .. string.sub(src, e0, e1)
                            p0, p1 = 1, 16 * groups
                            e0, e1 = p1 + 1, #src
                        end
                    end
                    if groups > 0 then
                        earliest = struct.unpack('<d', src, p0 + 8)
                    else
                        open, earliest, in_order = 0, INFINITY, 1
                    end
                else
                    if not decode() then return redis.error_reply(string.format(NOT_OURS, key, size)) end
                    expire()
                    encode()
                end
            end
            if groups == 0 then
                open = 0
            else
                -- How far `tat` lies above now - burst (slack_micros): a warming-up
                -- limiter counts no burst.
                local room = 0.0
                if is_bursty then room = (max_permits - stored_permits) * stable end
                local slack = ((next_free_micros + next_free_fraction / FRACTION_ONE) - now_micros) + room
                if slack < 0.0 then
                    -- Idle beyond the burst: this term is above every other.
                    open, groups, earliest, in_order = 0, 0, INFINITY, 1
                    src, p0, p1, e0, e1 = '', 1, 0, 1, 0
                else
                    -- Rounded down: a term never reads lower than it is.
                    if slack < MAX_MICROS then
                        slack = slack - slack % 1
                    else
                        slack = MAX_MICROS
                    end
                    if slack < open then open = slack end
                    -- The groups it reaches can never be the largest again: their
                    -- entries, the last ones, go.
                    while e1 >= e0 and not (struct.unpack('<d', src, e1 - 7) < open) do
                        e1 = e1 - 16
                    end
                end
            end
        end

        if mode then
            if mode == 'resume' then
                -- (Noted in the ledger above as a request whose charge, the debt
                -- and the dropped stored permits, is never given back: the
                -- reservations waiting in it keep their groups, so that their
                -- give-backs that reach Redis after this return what they would
                -- have before it.)
                -- State::resync, whose stored permits are then dropped: only its
                -- move of the ticket up to now is left.
                if now_micros > next_free_micros then
                    next_free_micros = now_micros
                    next_free_fraction = 0
                end
                stored_permits = 0.0
                -- The debt; a ticket that reaches 2^53 is 2^53, with no fraction.
                next_free_micros = next_free_micros + debt_micros
                if next_free_micros >= MAX_MICROS then
                    next_free_micros = MAX_MICROS
                    next_free_fraction = 0
                end
            end
        else
            -- State::reserve_recorded: the state found, then
            -- State::reserve_earliest_available: resync, then spend.
            stored_before = stored_permits
            next_free_before = next_free_micros
            -- The record's part of field 7: fraction_before * 2 + spent_stored.
            record = next_free_fraction * 2
            if now_micros > next_free_micros then
                local stored = stored_permits
                    + ((now_micros - next_free_micros) - next_free_fraction / FRACTION_ONE) / cool_down
                if stored > max_permits then stored = max_permits end
                stored_permits = stored
                next_free_micros = now_micros
                next_free_fraction = 0
            end
            -- The reservation's moment: when its permits may be used.
            local moment = next_free_micros
            local stored_to_spend = permits
            if stored_permits < stored_to_spend then stored_to_spend = stored_permits end
            local fresh = permits - stored_to_spend
            local wait
            if is_bursty then
                -- Bursty::stored_permits_to_wait_micros is 0, and 0.0 + x == x.
                wait = fresh * stable
            else
                -- WarmingUp::stored_permits_to_wait_micros
                local above_threshold = stored_permits - threshold_permits
                local micros = 0.0
                local spent = stored_to_spend
                if above_threshold > 0.0 then
                    local take_above = above_threshold
                    if spent < take_above then take_above = spent end
                    -- A trapezoid; permits_to_time(p) = stable + p * slope.
                    local length = (stable + above_threshold * slope)
                        + (stable + (above_threshold - take_above) * slope)
                    micros = take_above * length / 2.0
                    spent = spent - take_above
                end
                wait = micros + stable * spent + fresh * stable
            end
            -- State::charge. Below 2^32 µs: rounded to the nearest 2^-20 µs and
            -- added to the fraction, in units of 2^-20 µs (x - x % 1 is floor(x)
            -- for x >= 0), whose whole µs (the units above 20 bits) go to the
            -- ticket. Else to_micros: truncated, saturated, NaN read as
            -- MAX_MICROS; the fraction stays. A ticket that reaches 2^53 is 2^53,
            -- with no fraction.
            if wait < FINE_CHARGE_LIMIT then
                wait = wait * FRACTION_ONE + 0.5
                wait = wait - wait % 1 + next_free_fraction
                next_free_fraction = wait % FRACTION_ONE
                wait = (wait - next_free_fraction) / FRACTION_ONE
            elseif wait < MAX_MICROS then
                wait = wait - wait % 1
            else
                wait = MAX_MICROS
            end
            next_free_micros = next_free_micros + wait
            if next_free_micros >= MAX_MICROS then
                next_free_micros = MAX_MICROS
                next_free_fraction = 0
            end
            -- Reserved::spent_stored: the stored permits changed by the spending.
            local stored_resynced = stored_permits
            stored_permits = stored_permits - stored_to_spend
            if stored_permits ~= stored_resynced then record = record + 1 end
            -- Ledger::reserve_recorded: a reservation that waits, and that its
            -- caller may give back, gets a group of its own, the open group's terms
            -- with it; its id goes in its token. (Any other was only noted: a
            -- give-back of it, e.g. of a round trip its caller abandoned, returns
            -- what lies before its place, if it is not the latest.)
            if held and moment > now_micros then
                token_id = next_id or 0
                next_id = token_id + 1
                if groups == 0 then
                    in_order = 1
                elseif struct.unpack('<d', src, p1 - 7) > moment then
                    in_order = 0
                end
                -- Its entry holds the open group's offset (finite: the note above
                -- set it), the largest (entries rise).
                if groups < LEDGER_CAPACITY then
                    groups = groups + 1
                    p_tail = struct.pack('<dd', token_id, moment)
                    e_tail = struct.pack('<dd', token_id, open)
                else
                    -- Full: the two newest merge, the one before this losing its
                    -- group (it then gives back only what lies before it). Its place
                    -- goes; this one takes the smaller offset: that one's entry,
                    -- the last, if it has one.
                    local older = struct.unpack('<d', src, p1 - 15)
                    p1 = p1 - 16
                    p_tail = struct.pack('<dd', token_id, moment)
                    local last_id, last_offset
                    if e1 >= e0 then last_id, last_offset = struct.unpack('<dd', src, e1 - 15) end
                    if last_id == older then
                        e1 = e1 - 16
                        e_tail = struct.pack('<dd', token_id, last_offset)
                    else
                        e_tail = struct.pack('<dd', token_id, open)
                    end
                end
                open = INFINITY
                if moment < earliest then earliest = moment end
                if moment > horizon then horizon = moment end
            end
        end

        -- The value as this write leaves it (see Value and Expiry).
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
        marker = MARKER
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

        -- Keep the TTL if it lasts long enough, else set one with slack (twice the
        -- need, at most TTL_MAX_SLACK_MS more).
        if time_micros + ttl_ms * 1000 > expires_micros then
            if ttl_ms > TTL_MAX_SLACK_MS then
                ttl_ms = ttl_ms + TTL_MAX_SLACK_MS
            else
                ttl_ms = ttl_ms + ttl_ms
            end
            if ttl_ms > TTL_CAP_MS then ttl_ms = TTL_CAP_MS end
            expires_micros = time_micros + ttl_ms * 1000
            ttl_set = ttl_ms
        end
        if not batch_p then
            written = struct.pack(VALUE, marker, stored_permits, next_free_micros, permits_per_second,
                max_permits, expires_micros, now_micros, fractions, stored_before, next_free_before)
        end
        if batch_p then
            -- Its token, as its own call would reply it, if its give-back
            -- can return anything: if it waits (next_free_before > now),
            -- or if it is the batch's last grant (it may be the latest).
            -- Any other is neither: a give-back of it returns nothing.
            if last_r then replies[last_r] = 0 end
            if next_free_before > now_micros then
                packed[#packed + 1] = struct.pack(VALUE, marker, stored_permits, next_free_micros,
                    permits_per_second, max_permits, expires_micros, now_micros, fractions,
                    stored_before, next_free_before)
                replies[r] = token_id and token_id + 2 or 1
                last_r = nil
            else
                last_r, last_marker, last_stored, last_next_free = r, marker, stored_permits,
                    next_free_micros
                last_expires, last_fractions, last_stored_before, last_next_free_before =
                    expires_micros, fractions, stored_before, next_free_before
            end
            -- A value written without its ledger reads back with none: the
            -- next request's ledger starts its ids anew.
            if marker == MARKER then next_id = nil end
        end
    end
end
