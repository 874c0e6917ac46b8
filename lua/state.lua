-- Part 2 of 5: the clock, the value as read, the ledger.

---------------------------------------------------------------------------
-- The state.
---------------------------------------------------------------------------

-- The clock. (Lua converts the two strings TIME replies with exactly.)
if not time_micros then
    local time = redis.call('TIME')
    time_micros = time[1] * 1000000 + time[2]
end
local now_micros = time_micros

-- Load. WRONGTYPE (the key is not a string) propagates: nothing is written.
local key = KEYS[1]
local value = redis.call('GET', key)
local stored_permits, next_free_micros, old_rate, old_max, expires_micros, last_now_micros
local next_free_fraction, fractions
-- `older`: the value is in an older format (thr1 or v0), read as thr2 (see
-- Value).
local size, older
-- The ledger (see Ledger): its head (`next_id` is nil while the value has
-- no ledger), then its groups as packed: the places (id, moment) are bytes
-- p0..p1 of `src`, then `p_tail`; the entries (id, offset) bytes e0..e1,
-- then `e_tail` (`src` is the value as read, until the groups are packed
-- anew). A reservation reads and moves only the ends of these ranges and
-- adds at most one place and one entry, so that the value it writes is cut
-- from the one it read with no copy in between (each string a call makes
-- costs Redis about a microsecond per kilobyte). A give-back, which reads
-- every group, reads them into three arrays, oldest first (`decode`: ids,
-- moments, offsets, INFINITY for none) and packs them back (`encode`).
local open, next_id, earliest, in_order, groups, horizon = 0, nil, INFINITY, 1, 0, 0
local src, p0, p1, e0, e1, p_tail, e_tail = '', 1, 0, 1, 0, '', ''
local group_ids, group_moments, group_offsets
if value then
    size = #value
    local marker
    if size == VALUE_SIZE then
        marker, stored_permits, next_free_micros, old_rate, old_max, expires_micros, last_now_micros,
            fractions = struct.unpack(STATE, value)
        if marker == THR1 then
            -- Field 7 is its record's stored_before: no fraction.
            marker, older, fractions = MARKER, true, 0
        end
    elseif size >= LEDGER_START + 47 then
        marker, stored_permits, next_free_micros, old_rate, old_max, expires_micros, last_now_micros,
            fractions = struct.unpack(STATE, value)
        if marker == THR3 then
            marker = nil
            open, next_id, earliest, in_order, groups, horizon = struct.unpack(LEDGER, value, LEDGER_START)
            -- NaN fails every comparison. (The groups themselves are checked
            -- where they are all read: by a give-back, see `decode`.)
            if open >= 0 and next_id >= 0 and next_id <= MAX_MICROS and next_id % 1 == 0
                    and earliest >= 0 and (in_order == 0 or in_order == 1)
                    and groups >= 0 and groups <= LEDGER_CAPACITY and groups % 1 == 0
                    and horizon >= 0 and horizon <= MAX_MICROS and horizon % 1 == 0 then
                local count = (size - LEDGER_START - 47) / 16 - groups
                if count % 1 == 0 and count >= 0 and count <= groups then
                    marker = MARKER
                    src, p0, p1 = value, LEDGER_START + 48, LEDGER_START + 47 + 16 * groups
                    e0, e1 = p1 + 1, size
                end
            end
        else
            marker = nil
        end
    elseif size == 40 then
        -- The first format: read as thr2 that has seen no clock yet.
        stored_permits, next_free_micros, old_rate, old_max, expires_micros = struct.unpack('<ddddd', value)
        marker, older, last_now_micros, fractions = MARKER, true, 0, 0
    end
    -- NaN fails every comparison, so it is rejected too.
    if not (marker == MARKER
            and old_max >= 0 and old_max < INFINITY
            and stored_permits >= 0 and stored_permits <= old_max
            and next_free_micros >= 0 and next_free_micros <= MAX_MICROS and next_free_micros % 1 == 0
            and old_rate > 0
            and expires_micros >= 0 and expires_micros < INFINITY
            and last_now_micros >= 0 and last_now_micros <= MAX_MICROS and last_now_micros % 1 == 0
            and fractions >= 0 and fractions < FRACTIONS_END and fractions % 1 == 0) then
        return redis.error_reply('ERR paceline: key ' .. key .. ' holds a value this limiter does not '
            .. 'recognise (' .. size .. ' bytes); it was left untouched: delete it or use another '
            .. 'limiter name')
    end
    -- The ticket's fraction: the top of field 7.
    next_free_fraction = (fractions - fractions % FRACTIONS_SHIFT) / FRACTIONS_SHIFT
    -- The clock never runs backwards for a key.
    if last_now_micros > now_micros then now_micros = last_now_micros end
end

-- The ledger's functions and arrays, made only where they are used: a
-- give-back on a value whose ledger holds groups, and a reservation's
-- expiry once the groups' moments no longer rise. (Making closures costs a
-- call more than most of its arithmetic.)
local decode, encode, expire
if groups > 0 and (mode == 'cancel' or (in_order == 0 and now_micros >= earliest)) then
    group_ids, group_moments, group_offsets = {}, {}, {}

    -- The groups, from the packed strings into the arrays; false if they are
    -- not a ledger this script wrote (ids rising and below next_id, whole
    -- moments and offsets, offsets rising, each entry a group's).
    decode = function()
        local entries = string.sub(src, e0, e1) .. e_tail
        local count = #entries / 16
        local raw = {struct.unpack('<' .. string.rep('d', 2 * (groups + count)),
            string.sub(src, p0, p1) .. p_tail .. entries)}
        local entry, last_id, last_offset = 2 * groups + 1, -1, -1
        local valid = true
        for i = 1, groups do
            local id, moment, offset = raw[2 * i - 1], raw[2 * i], INFINITY
            if entry <= 2 * (groups + count) and raw[entry] == id then
                offset = raw[entry + 1]
                entry = entry + 2
                if not (offset > last_offset and offset <= MAX_MICROS and offset % 1 == 0) then
                    valid = false
                end
                last_offset = offset
            end
            if not (id > last_id and id < next_id and id % 1 == 0
                    and moment >= 0 and moment <= MAX_MICROS and moment % 1 == 0) then
                valid = false
            end
            last_id = id
            group_ids[i], group_moments[i], group_offsets[i] = id, moment, offset
        end
        return valid and entry == 2 * (groups + count) + 1
    end

    -- The arrays packed back into the strings.
    encode = function()
        local numbers, count = {}, 0
        for i = 1, groups do
            numbers[count + 1], numbers[count + 2] = group_ids[i], group_moments[i]
            count = count + 2
        end
        local places = struct.pack('<' .. string.rep('d', count), unpack(numbers, 1, count))
        count = 0
        for i = 1, groups do
            if group_offsets[i] < INFINITY then
                numbers[count + 1], numbers[count + 2] = group_ids[i], group_offsets[i]
                count = count + 2
            end
        end
        src = places .. struct.pack('<' .. string.rep('d', count), unpack(numbers, 1, count))
        p0, p1, e0, e1 = 1, #places, #places + 1, #src
        p_tail, e_tail = '', ''
    end

    -- Ledger::expire, on the arrays: the groups of the reservations whose
    -- moment has passed (they can no longer be given back) merge into the
    -- group after them.
    expire = function()
        if now_micros < earliest then return end
        local carried, kept = INFINITY, 0
        if in_order == 1 then
            -- Moments rise with the groups: the passed ones come first.
            local passed = 0
            while passed < groups and group_moments[passed + 1] <= now_micros do
                passed = passed + 1
                if group_offsets[passed] < carried then carried = group_offsets[passed] end
            end
            for i = passed + 1, groups do
                kept = kept + 1
                group_ids[kept], group_moments[kept], group_offsets[kept] =
                    group_ids[i], group_moments[i], group_offsets[i]
            end
            groups = kept
            if kept > 0 then
                if carried < group_offsets[1] then group_offsets[1] = carried end
                earliest = group_moments[1]
                return
            end
        else
            local soonest = INFINITY
            for i = 1, groups do
                local moment, offset = group_moments[i], group_offsets[i]
                if moment <= now_micros then
                    if offset < carried then carried = offset end
                else
                    kept = kept + 1
                    if carried < offset then offset = carried end
                    group_ids[kept], group_moments[kept], group_offsets[kept] = group_ids[i], moment, offset
                    carried = INFINITY
                    if moment < soonest then soonest = moment end
                end
            end
            groups = kept
            earliest = soonest
        end
        if groups == 0 then
            -- Ledger::clear
            open, earliest, in_order = 0, INFINITY, 1
        elseif carried < open then
            open = carried
        end
    end
end

