-- Part 3 of 5: a query, and the cold modes (probe, resume, cancel).

-- QUERY: max(next_free_micros - now, 0), writing nothing.
if permits == 0 then
    if value and next_free_micros > now_micros then return next_free_micros - now_micros end
    return 0
end

-- The cold modes, before the key's state is completed and the rate changes.
local cancelled
if mode then
    if mode == 'probe' then
        if value then
            -- The same bytes again (an older value in its thr2 form: no
            -- fraction, a record of nothing), same TTL.
            if older then
                value = struct.pack(VALUE, MARKER, stored_permits, next_free_micros, old_rate, old_max,
                    expires_micros, last_now_micros, 0, stored_permits, next_free_micros)
            end
            redis.call('SET', key, value, 'KEEPTTL')
            if next_free_micros > now_micros then return next_free_micros - now_micros end
            return 0
        end
        -- A missing key is written below as it reads: the rate change and
        -- the reservation do not apply.
    elseif mode == 'cancel' then
        if not value then return 0 end
        -- State::give_back. The key's own rate and max_permits stay in
        -- force (no rate change), with the cool-down that goes with them.
        local key_stable = 1000000.0 / old_rate
        if key_stable > MAX_MICROS then key_stable = MAX_MICROS end
        local token_stable = 1000000.0 / tk_rate
        if token_stable > MAX_MICROS then token_stable = MAX_MICROS end
        if groups > 0 and not decode() then
            return redis.error_reply(string.format(NOT_OURS, key, size))
        end
        -- The latest: the state is the one it left, and nothing waits in
        -- the ledger since (its group, the same moment, is the newest and
        -- no request came after it).
        local latest = stored_permits == tk_stored_after and next_free_micros == tk_next_free_after
            and next_free_fraction == tk_fraction_after
            and key_stable == token_stable and old_max == tk_max
        if latest then
            if tk_id then
                latest = open == INFINITY and groups > 0 and group_ids[groups] == tk_id
                    and group_moments[groups] == tk_moment
            else
                latest = groups == 0
            end
        end
        if not latest and groups > 0 then expire() end
        if latest then
            -- Put back the state it found; its group's terms join the open
            -- group.
            stored_permits = tk_stored_before
            next_free_micros = tk_next_free_before
            next_free_fraction = tk_fraction_before
            cancelled = 1
            if tk_id then
                open = group_offsets[groups]
                groups = groups - 1
                if groups == 0 then open, earliest, in_order = 0, INFINITY, 1 end
            end
        elseif now_micros < tk_moment and tk_spent_stored == 0 then
            -- Reserved::charge_micros: whole µs, rounded down, from the
            -- ticket at the moment (its fraction is fraction_before if no
            -- resync moved it) to the ticket after.
            local charge = tk_next_free_after - tk_moment
            local moment_fraction = 0
            if tk_moment == tk_next_free_before then moment_fraction = tk_fraction_before end
            if tk_fraction_after < moment_fraction and charge > 0 then charge = charge - 1 end
            -- Ledger::give_back: the groups up to its own (those with a
            -- lower id, if it has no group of its own) lose its charge, the
            -- others keep theirs; the ticket moves back to the largest of
            -- what they then hold, possibly behind now. Its fraction stays.
            local losing, own = 0, false
            if tk_id then
                while losing < groups and group_ids[losing + 1] < tk_id do
                    losing = losing + 1
                end
                if losing < groups and group_ids[losing + 1] == tk_id then
                    losing = losing + 1
                    own = true
                end
            end
            local lost, kept = INFINITY, open
            for i = 1, losing do
                if group_offsets[i] < lost then lost = group_offsets[i] end
            end
            lost = lost + charge
            for i = losing + 1, groups do
                if group_offsets[i] < kept then kept = group_offsets[i] end
            end
            local moved = next_free_micros
            if lost < moved then moved = lost end
            if kept < moved then moved = kept end
            next_free_micros = next_free_micros - moved
            for i = 1, losing do
                local offset = group_offsets[i]
                if offset < INFINITY then
                    -- Capped at 2^53, as in the core (exact: no sum here
                    -- leaves the integers a double holds).
                    offset = (offset - moved) + charge
                    if offset > MAX_MICROS then offset = MAX_MICROS end
                    group_offsets[i] = offset
                end
            end
            for i = losing + 1, groups do
                group_offsets[i] = group_offsets[i] - moved
            end
            open = open - moved
            if own then
                -- Its group's terms join the next group.
                local offset = group_offsets[losing]
                for i = losing, groups - 1 do
                    group_ids[i], group_moments[i], group_offsets[i] =
                        group_ids[i + 1], group_moments[i + 1], group_offsets[i + 1]
                end
                groups = groups - 1
                if losing <= groups then
                    if offset < group_offsets[losing] then group_offsets[losing] = offset end
                elseif offset < open then
                    open = offset
                end
            end
            -- Ledger::prune: a group that a later one reaches can never be
            -- the largest again.
            local later = open
            for i = groups, 1, -1 do
                if group_offsets[i] >= later then
                    group_offsets[i] = INFINITY
                else
                    later = group_offsets[i]
                end
            end
            if groups == 0 then open, earliest, in_order = 0, INFINITY, 1 end
            cancelled = 2
        else
            return 0
        end
        if encode then encode() end
        permits_per_second = old_rate
        max_permits = old_max
        cool_down = key_stable
        if not is_bursty and old_max > 0.0 then cool_down = policy_micros / old_max end
    end
end

if not value then
    -- Missing: idle for a long time, with no TTL to keep.
    stored_permits = max_permits
    next_free_micros = now_micros
    next_free_fraction = 0
    old_rate = permits_per_second
    old_max = max_permits
    expires_micros = 0
end
