-- Part 4 of 5: the rates in force (and what a learn pauses), then the
-- requests a call charges: a reservation's (a call's, a settle's that the
-- log let go), each of a batch's in order (at one clock reading, each as
-- its own call at that reading would be), a resume's (one per limit), a
-- learn's caps on what the limits store (one per limit the upstream says
-- how many it has left), or, for a give-back or a settle, those logged, charged
-- again from the log's base.

-- A learn: the limits it pauses (State::pause: a refusal's every limit,
-- until its end; a limit the upstream says is spent, until its reset), if
-- any pause ends after now (the log then empties), and those it caps (the
-- upstream says how many they have left, 0 included: see the requests
-- below). (T: each
-- limit's pause, false for none; `ahead`: one ends after now, and the
-- rates are set below, where a pause empties the log; K: the limits
-- capped, in order.) The value holds what they learned: whole.
if L2 then
    L, whole, T, ahead, K = L2, true, {}, false, {}
    for i = 1, n do
        -- (t: its pause; e: the end of its spent quota's window.)
        local t, e = lesson[10], lesson[10 + 3 * i]
        if lesson[9 + 3 * i] == 0 and e then
            t = math.max(t or 0, math.min(now + e, MAX_MICROS))
        end
        T[i] = t or false
        ahead = ahead or t and t > now
        if lesson[9 + 3 * i] then K[#K + 1] = i end
    end
end

-- Limits::set_rate for every limit whose rate or configuration changed:
-- State::set_rate at now, and the log empties (its requests were charged
-- at the old rates). Not for a probe (of a missing key, read at the rates
-- in force); a give-back or a keep never gets here with a rate changed
-- (see part 3). A learn sets the rates twice (Limits::learn after the
-- rates in force, at the same now): those before the lesson (M1), then
-- those after it; then it pauses the limits (above), and caps them (the
-- requests below). Each limit resyncs at now first.
if (changed or ort ~= rate or omx ~= mx) and mode ~= 'probe' then
    for pass = M1 and 1 or 2, 2 do
    for i = 1, n do
        local k, c = 3 * i - 3, 8 * i - 8
        -- (r, m: the rate and max_permits it goes to; `set`: they change;
        -- t: its pause, after a lesson.)
        local r, m = rate, mx
        if n > 1 then r, m, ort, omx = C[c + 1], C[c + 5], S[3 * n + 2 * i], S[3 * n + 2 * i + 1] end
        if pass == 1 then r, m = M1[2 * i - 1], M1[2 * i] end
        local set, t = ort ~= r or omx ~= m, ahead and pass == 2 and T[i]
        if set or t then
            if n > 1 then bursty, pmicros, cd, st, nf, fr = C[c + 2], C[c + 3], C[c + 8], S[k + 1], S[k + 2], S[k + 3] end
            -- State::resync: at the old stable interval and max_permits (x:
            -- the cool-down of the policy in force with them). (Once they
            -- changed, nothing is left to resync at the new ones. A pause
            -- alone, the rates unchanged, resyncs at the rates in force all
            -- the same, and rescales nothing.)
            local old_stable = math.min(1000000.0 / ort, MAX_MICROS)
            local x = not bursty and omx > 0.0 and pmicros / omx or old_stable
            count, log_at, whole = 0, nil, true
            if now > nf then st, nf, fr = math.min(st + ((now - nf) - fr / FRACTION_ONE) / x, omx), now, 0 end
            -- Policy::stored_permits_after_infinite_rate, else
            -- Policy::initial_stored_permits, else rescaled (stored /
            -- old_max is in 0..=1, so this never overflows).
            if set then
                st = old_stable == 0.0 and (bursty and m or 0.0) or omx == 0.0 and (bursty and 0.0 or m) or st / omx * m
            end
            ort, omx = r, m
            if t then
                -- State::pause: a bursty limit stores nothing (a warming-up
                -- one keeps its stored permits, which slow it down).
                if bursty then st = 0.0 end
                if t > nf then nf, fr = t, 0 end
            end
            if n > 1 then S[k + 1], S[k + 2], S[k + 3], S[3 * n + 2 * i], S[3 * n + 2 * i + 1] = st, nf, fr, ort, omx end
        end
    end
    end
end

-- STATUS: the clock, then each limit's state at the rates in force, for a
-- snapshot: three doubles per limit, stored_permits, next_free_micros,
-- next_free_fraction (a limit the value lacks, or a missing key, as it
-- starts); then, if the key learned anything, what (as a call's reply
-- carries it: the factor, the end of the pause, when it last rose, the
-- margin, and a cap per limit, 1e999 for none), so that any process reads
-- the rates in force. Writes nothing.
if mode == 'status' then
    local numbers = n == 1 and {now, st, nf, fr} or {now, unpack(S, 1, 3 * n)}
    for k = 1, L and 4 + n or 0 do numbers[#numbers + 1] = L[k] or 1e999 end
    return struct.pack(string.sub(FORMAT, 3, #numbers + 3), unpack(numbers))
end

-- Whether the call writes (the record of the last request granted, see
-- Value, is moment_r and bound_r, from part 2); the requests this call
-- adds to the log (see Log), packed, from `added_first` on (read again
-- with read_request); those that leave it (F: id, permits, now and
-- counts, 4 each), whose charges go into its base in the second pass; a
-- batch's replies (three numbers per request, see Batch), and `g`, `left`:
-- the run of its requests, and how many are left. (Those nil declared
-- last, in one instruction.)
local writes, added_first = mode and mode ~= 'batch', 1
local added, F, need_r, replies, needs, g, left
if R then replies, needs, g, left = {}, {}, -4, 0 end

if not C and count == 0 and (not mode and not held or R and not holds) then
    -- Reservations that log nothing, of one limit (one, or a batch's) or of
    -- two in locals (one, see part 2): Limits::reserve_at is State::reserve,
    -- the loop's steps below for each request, inline (the most common
    -- calls, at a third of the overhead). (A batch's request in permits and
    -- timeout, in turn.) A request's moment starts from the record's
    -- (moment_r: now, or a moment after now and at most the ticket, which
    -- only grows: the same moment and bound as from now), so that two
    -- limits, a step each, start from the first's ticket (part 2): the
    -- second first (its need kept for the TTL, see part 5), then the first,
    -- which finds the moment granted, their states and configurations
    -- swapped between (the second's state then aside, after the first's in
    -- the value).
    for i = 1, n * total do
        if R then
            if left == 0 then g, left = g + 4, R[g + 8] end
            left, permits, timeout = left - 1, R[g + 1], R[g + 3]
        end
        local moment, bound = moment_r, bound_r
        if nf > moment then moment = nf; bound = n - 1 end
        if timeout >= 0 and moment - now > timeout then
            if R then
                replies[#replies + 1] = now - moment
            elseif n > 1 then
                return struct.pack('<ddddddd', now, bst, bnf, bfr, st, nf, fr)
            else
                return st == 0 and now - nf or struct.pack('<dddd', now, st, nf, fr)
            end
        else
            if moment > nf then
                local stored = st + ((moment - nf) - fr / FRACTION_ONE) / cd
                if stored > mx then stored = mx end
                st, nf, fr = stored, moment, 0
            end
            local spend = permits
            if st < spend then spend = st end
            local wait = (permits - spend) * stable
            if not bursty then
                local above, micros, spent = st - thr, 0.0, spend
                if above > 0.0 then
                    local take = above
                    if spent < take then take = spent end
                    micros = take * ((stable + above * slope) + (stable + (above - take) * slope)) / 2.0
                    spent = spent - take
                end
                wait = micros + stable * spent + wait
            end
            if wait < FINE_CHARGE_LIMIT then
                wait = wait * FRACTION_ONE + 0.5
                wait = wait - wait % 1 + fr
                fr = wait % FRACTION_ONE
                wait = (wait - fr) / FRACTION_ONE
            elseif wait < MAX_MICROS then
                wait = wait - wait % 1
            else
                wait = MAX_MICROS
            end
            nf = nf + wait; st = st - spend; moment_r = moment; bound_r = bound; writes = true
            if nf >= MAX_MICROS then nf, fr = MAX_MICROS, 0 end
            -- (A batch's request last: it pays no jump over the rest.)
            if not R then
                if i < n then
                    -- (`wait`: the swap's temporary.)
                    need_r = (nf - time_micros) / 1000 + (mx - st) * cd / 1000
                    wait = st; st = bst; bst = wait; wait = nf; nf = bnf; bnf = wait; wait = fr; fr = bfr; bfr = wait
                    bursty = b1; stable = s1; mx = m1; cd = d1; thr = t1; slope = l1
                end
            else
                replies[#replies + 1] = moment - now
                needs[#needs + 1] = (nf - time_micros) / 1000 + (mx - st) * cd / 1000
            end
        end
    end
else
    -- The requests charged, each at the moment every limit allows it
    -- (Limits::earliest), to the limits or to the log's base (`on_base`:
    -- the two sets of states swap places for it), in up to two passes. A
    -- give-back, keep or settle (part 3): first the logged requests that
    -- leave the log (Limits::expire) into the base, then (not for a keep)
    -- the others but the one given back, or with the settled one's new
    -- counts, into the limits, from the base on. Otherwise: first the
    -- call's requests (a reservation, each of a batch in order, or a
    -- resume's, one per limit) into the limits, then those that left the
    -- log meanwhile into its base (Limits::fold_oldest). `Q`: a pass's
    -- logged requests (id, first count, now and, with several limits, the
    -- counts each), charged again. (Declared here, so that the calls above
    -- pay for none of it.)
    -- (T: a give-back's or settle's second pass; a keep's first is its
    -- last. `steps`: a pass's requests: one reservation, a batch's, a
    -- resume's one per limit, a learn's caps, none for a probe.)
    local Q, T, on_base, pass, steps = nil, nil, false, 1, not mode and 1 or R and total or debts and n or K and #K or 0
    if E then
        Q, T, on_base, pass = {}, {}, true, kept and 2 or 1
        for j = 1, W * count, W do
            if j ~= place then
                local P, e, p = false, j >= first and T or Q, E[j + 1]
                if p < 0 then p = -1 - p end
                if n > 1 then P = {p, unpack(E, j + 4, j + W - 1)} end
                e[#e + 1], e[#e + 2], e[#e + 3], e[#e + 4] = E[j], p, E[j + 2], P
            end
        end
        steps = #Q / 4
    end
    while true do
        if on_base and steps > 0 then
            if n == 1 then st, nf, fr, bst, bnf, bfr = bst, bnf, bfr, st, nf, fr else S, B = B, S end
        end
        for r = 1, steps do
            -- Request r: its permits (the first limit's count; P, with several
            -- limits, the counts, or false for `p` each), timeout, whether it is
            -- held (2: open), its now, its id; for a resume, the limit it
            -- carries its debt to (`p`: the debt); for a cap (`cap`), the limit
            -- that keeps at most `p` stored.
            local p, t, hold, at, id, P, limit, cap = permits, timeout, held, now, -1, P
            if Q then
                local k = 4 * r
                id, p, at, P, t, hold = Q[k - 3], Q[k - 2], Q[k - 1], Q[k], -1, false
                limit = id < -1 and -1 - id
                if id < -101 then limit, cap = -101 - id, true end
            elseif not mode then
                -- (The reservation.)
            elseif R then
                if left == 0 then g, left = g + 4, R[g + 8] end
                left, p, hold, t = left - 1, R[g + 1], R[g + 2], R[g + 3]
            elseif debts then
                -- (Its id as logged: -1 - limit, see read_request.)
                limit, p, id = r, debts[r], -1 - r
            else
                -- (What the upstream says limit K[r] has left, less the
                -- one that goes when nothing is owed; its id as logged:
                -- -101 - limit.)
                limit = K[r]
                p, cap, id = math.max(lesson[9 + 3 * limit] - 1, 0), true, -101 - limit
            end

            -- Limits::earliest: the moment every limit allows it, and the first
            -- limit whose ticket that is, if it lies after now.
            local moment, bound = at, -1
            if limit then
                -- (A resume or a cap: at its now.)
            elseif n == 1 then
                if nf > moment then moment, bound = nf, 0 end
            else
                for k = 2, 3 * n, 3 do
                    local ticket = S[k]
                    if ticket > moment then moment, bound = ticket, (k - 2) / 3 end
                end
            end

            -- A try that the debt does not fit is refused: it charges nothing.
            local granted = t < 0 or moment - at <= t
            if granted and not Q then
                writes = true
                -- Limits::reserve_at: the id of a held reservation that waits, or
                -- of a call (the clock, or the id before it + 1 if that is more:
                -- ids rise, and a key written anew after it expired gives none it
                -- gave before), if ids are left for it and the requests after it
                -- (ids end at 2^53 - 2; none left: next_id 2^53, and a held one
                -- is served as a request that cannot be given back, a call is
                -- refused with an error); Limits::expire (the logged requests whose moment
                -- has passed leave the log: they were used; not an open call) and,
                -- when the log is full, its oldest leaves it; the log keeps the
                -- request if it has an id (for a resume or a cap, its limit's, set
                -- above) or the log holds any, and starts with the limits' states
                -- when it was empty.
                if limit or hold or count > 0 then
                    if hold and (hold == 2 or moment > now) then
                        if next_id < now then next_id = now end
                        if next_id + (steps - r) < 9007199254740991 then -- 2^53 - 1
                            id, next_id = next_id, next_id + 1
                        elseif hold == 2 then
                            -- (A call needs one: to be settled, to learn.)
                            return redis.error_reply('ERR paceline: the key has no id left for a call (its ids end at 2^53 - 2, and its clock or next_id is there); it was left untouched')
                        else
                            next_id = MAX_MICROS
                        end
                    end
                    while count > 0 and (front <= now or count == LOG_CAPACITY) do
                        F = F or {}
                        F[#F + 1], F[#F + 2], F[#F + 3], F[#F + 4] = front_id, front_p, front_at, front_P or false
                        count = count - 1
                        if count == 0 then
                            log_at, added, added_first, F = nil, nil, 1, nil
                        elseif log_at and log_at + 8 * W <= size then
                            -- (The next in the value: read and checked as in part 2.)
                            log_at = log_at + 8 * W
                            ok, front_id, front_p, front_at, front, front_P = read_request(log_at, next_id, value, n)
                            if not ok then return redis.error_reply(string.format(NOT_OURS, size)) end
                        else
                            -- (The next this call logged.)
                            if log_at then log_at = nil else added_first = added_first + 1 end
                            _, front_id, front_p, front_at, front, front_P = read_request(1, next_id, added[added_first], n)
                        end
                    end
                    if id >= 0 or count > 0 then
                        -- (c: its first count as logged, negative if it is open; e:
                        -- when it leaves the log once at its head, see front.)
                        local c, e = p, moment
                        if id < 0 then
                            e = -1
                        elseif hold == 2 then
                            c, e = -1 - p, 1e999
                        end
                        if count == 0 then
                            if n == 1 then
                                bst, bnf, bfr = st, nf, fr
                            else
                                B = {unpack(S, 1, 3 * n)}
                            end
                            front_id, front_p, front_at, front, front_P = id, p, at, e, P
                        end
                        added = added or {}
                        if n == 1 then
                            added[#added + 1] = struct.pack('<dddd', id, c, at, moment)
                        else
                            local numbers = {id, c, at, moment}
                            for i = 2, n do numbers[3 + i] = P and P[i] or p end
                            added[#added + 1] = struct.pack(string.sub(FORMAT, 3, 3 + W), unpack(numbers))
                        end
                        count = count + 1
                    end
                end
            end

            if granted then
                -- Limits::charge: every limit as if requested at the moment
                -- (State::reserve_earliest_available: resync, spend stored permits
                -- first, charge the rest as fresh ones, push the ticket); a
                -- resume's or a cap's limit alone (always granted: no timeout),
                -- resynced at its now as the others are, then its debt or cap.
                -- (k: the limit's state in S, from 1; c: its configuration in C.)
                local k = limit and 3 * limit - 2 or 1
                for k = k, limit and k or 3 * n, 3 do
                    -- (e: its count for this limit.)
                    local e = p
                    if n > 1 then
                        local c = (k - 1) * 8 / 3
                        bursty = C[c + 2]; stable = C[c + 4]; mx = C[c + 5]; cd = C[c + 8]
                        st = S[k]; nf = S[k + 1]; fr = S[k + 2]
                        if not bursty then thr = C[c + 6]; slope = C[c + 7] end
                        if P then e = P[(k + 2) / 3] end
                    end
                    -- State::resync: idle time from the exact ticket, > 0 (the
                    -- fraction is below one µs), so an infinite quotient (cd = 0)
                    -- is fine, never NaN.
                    if moment > nf then
                        local stored = st + ((moment - nf) - fr / FRACTION_ONE) / cd
                        if stored > mx then stored = mx end
                        st, nf, fr = stored, moment, 0
                    end
                    if cap then
                        -- State::keep_stored_at_most: at most `p` stored, bursty
                        -- (a warming-up limit's stored permits slow it down).
                        if bursty and st > p then st = p end
                    elseif limit then
                        -- Limits::resume: no stored permits, bursty (a
                        -- warming-up limit's slow it down: it keeps them), then
                        -- its debt; a ticket that reaches 2^53 is 2^53, with no
                        -- fraction (as in State::charge).
                        if bursty then st = 0.0 end
                        nf = nf + p
                        if nf >= MAX_MICROS then nf, fr = MAX_MICROS, 0 end
                    else
                        local spend = e
                        if st < spend then spend = st end
                        -- The fresh permits' wait. (Bursty::stored_permits_to_wait_micros
                        -- is 0, and 0.0 + x == x.)
                        local wait = (e - spend) * stable
                        if not bursty then
                            -- WarmingUp::stored_permits_to_wait_micros: a trapezoid
                            -- above the threshold, permits_to_time(q) = stable + q * slope.
                            local above, micros, spent = st - thr, 0.0, spend
                            if above > 0.0 then
                                local take = above
                                if spent < take then take = spent end
                                micros = take * ((stable + above * slope) + (stable + (above - take) * slope)) / 2.0
                                spent = spent - take
                            end
                            wait = micros + stable * spent + wait
                        end
                        -- State::charge. Below 2^32 µs: rounded to the nearest 2^-20 µs
                        -- and added to the fraction, in units of 2^-20 µs (x - x % 1 is
                        -- floor(x) for x >= 0), whose whole µs (the units above 20
                        -- bits) go to the ticket. Else to_micros: truncated, saturated,
                        -- NaN read as MAX_MICROS; the fraction stays.
                        if wait < FINE_CHARGE_LIMIT then
                            wait = wait * FRACTION_ONE + 0.5
                            wait = wait - wait % 1 + fr
                            fr = wait % FRACTION_ONE
                            wait = (wait - fr) / FRACTION_ONE
                        elseif wait < MAX_MICROS then
                            wait = wait - wait % 1
                        else
                            wait = MAX_MICROS
                        end
                        nf = nf + wait
                        if nf >= MAX_MICROS then nf, fr = MAX_MICROS, 0 end
                        st = st - spend
                    end
                    if n > 1 then
                        -- (With the TTL the limits need after it: see part 5; a
                        -- resume's or a cap's, that no batch reply reads, its limit's.)
                        S[k] = st; S[k + 1] = nf; S[k + 2] = fr
                        local need = (nf - time_micros) / 1000 + (mx - st) * cd / 1000
                        if k == 1 or limit or need > need_r then need_r = need end
                    end
                end
            end
            if not (granted or R) then
                -- A refused try (not a batch's): the limits' states as read,
                -- with the clock, as a status replies them; one limit that
                -- stores nothing, its wait negated (see Replies).
                if n == 1 then return st == 0 and now - nf or struct.pack('<dddd', now, st, nf, fr) end
                return struct.pack(string.sub(FORMAT, 3, 4 + 3 * n), now, unpack(S, 1, 3 * n))
            elseif not (Q or R or limit) then
                moment_r, bound_r = moment, bound
            elseif R and not Q then
                -- A batch's reply for it (see Batch): its wait, negated if it
                -- was refused, and with several limits the one that bound it;
                -- if granted, the TTL its own call would need (see part 5).
                -- (Charged again, Q's requests have no reply.)
                replies[#replies + 1] = granted and moment - now or now - moment
                if n > 1 then replies[#replies + 1] = bound end
                if granted then
                    moment_r, bound_r = moment, bound
                    if n == 1 then need_r = (nf - time_micros) / 1000 + (mx - st) * cd / 1000 end
                    needs[#needs + 1] = need_r
                end
            end
        end
        if on_base and steps > 0 then
            if n == 1 then st, nf, fr, bst, bnf, bfr = bst, bnf, bfr, st, nf, fr else S, B = B, S end
        end
        if pass == 2 or not (E or (F and count > 0)) then break end
        pass = 2
        if E then
            -- The limits from the base on, then the others.
            if n == 1 then
                st, nf, fr = bst, bnf, bfr
            else
                for k = 1, 3 * n do S[k] = B[k] end
            end
            Q, on_base, steps = T, false, #T / 4
        else
            Q, on_base, steps = F, true, #F / 4
        end
    end
end
