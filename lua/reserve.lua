--[[
throttler: the limiter shared through Redis, protocol v2 (values `thr2`,
and `thr3` while they carry a ledger).

This script is a line-by-line mirror of the pure algorithm in `src/core`
(`State::resync`, `State::reserve_earliest_available`, `State::charge`,
`State::can_acquire`, `State::set_rate`, `State::reserve_recorded`,
`State::give_back`, the bursty and warming-up policies, and the `Ledger`
that makes give-backs exact: `Ledger::note`, `reserve_recorded`,
`give_back`, `expire`, `clear`, with `Ledger::SHARED_CAPACITY` groups). It
performs the same floating-point operations in the same order, so for the
same inputs it computes bit-for-bit the same waits and state as the Rust
code (the ticket's fraction included); a differential test
(`tests/redis_differential.rs`) keeps the two in step. Where a block below
has a counterpart in `src/core`, it carries its name. It is written for
speed (Redis runs one script at a time, so its time in here is the limit of
every caller): each argument converted once, one `struct.pack` for the
value (which a granted reservation also replies), a reservation touching
only the ends of the ledger (see Ledger), and three Redis calls per
reservation (TIME, GET, SET).

KEYS[1]  The limiter (see Value).

ARGV     6 arguments, or 7 with ARGV[7], in every mode.
ARGV[1]  The mode:
           n >= 1   RESERVE n permits (an integer up to 2^53).
           n+       The same (n >= 1, then a plus sign), for a reservation
                    its caller may give back: if it waits, it gets a group
                    in the ledger (see Ledger), and its give-back is exact.
                    (Any reservation can be given back; one made without
                    the sign returns only what the ledger knows lies before
                    it, if it is not the latest.)
           0        QUERY the current wait. Writes nothing.
           probe    PROBE that the server takes this script's writes,
                    without changing the limiter: an existing key is SET
                    again to the bytes it holds (an older value in its
                    thr2 form, see Value), keeping its TTL; a missing key
                    is written as it reads (see Missing key), with the TTL
                    that needs (a few ms). A server that refuses writes
                    fails the SET (OOM under maxmemory with noeviction,
                    READONLY on a replica), and that error is the reply.
           resume   RESUME on Redis after serving from a local fallback:
                    the rate change, noted in the ledger as a request
                    whose charge is never given back (`Ledger::note`:
                    reservations waiting keep their groups), `State::resync`
                    at now (which zeroes
                    the fraction if it moves the ticket), then
                    stored_permits = 0 (the key's idle time during the
                    outage was not idle: no burst after it), then
                    next_free_micros = next_free_micros + debt: the debt
                    the fallback ran up beyond what the key already held.
                    A ticket that reaches 2^53 is 2^53 exactly, with no
                    fraction (as in `State::charge`); below that the
                    fraction stays. Added, not raised to, so that it
                    stays whatever the order of this call and the cancels
                    of reservations that reached Redis late.
           cancel   CANCEL a reservation (`Ledger::give_back`): if it is
                    the latest (the key's stored_permits, next_free_micros,
                    next_free_fraction and max_permits equal the token's,
                    fields 1, 2, 7 and 4, its rate has the same stable
                    interval as the token's field 3, and the ledger holds
                    nothing after it: a token with an id is the newest
                    group, with the same moment, and no request came after
                    it; one without, an empty ledger), the token's
                    "before" state (8, 9 and fraction_before) is written
                    back and its group goes (restored); else, after the
                    ledger's expiry, if now < moment and the reservation
                    spent no stored permits, the ticket moves back by its
                    charge in whole µs (`Reserved::charge_micros`:
                    next_free_micros - moment, minus 1 if its fraction is
                    below the one the ticket had at the moment, which is
                    fraction_before if moment = next_free_before, else 0;
                    never below 0), but not below the largest term of the
                    requests made after it, which the ledger holds (see
                    Ledger); possibly behind now; its fraction unchanged
                    (returned); else nothing is written. No rate change:
                    ARGV[3..6] are checked, and the TTL is that of the key's
                    own rate and max_permits under the policy of ARGV[4..6].
ARGV[2]  reserve: timeout_micros, an integer >= 0 for a try, refused when
           the existing debt does not fit (`next - timeout > now`, the
           negation of `State::can_acquire`); -1 for a plain reservation.
         query, probe: ignored, but must be -1 or an integer >= 0.
         resume: debt_micros, an integer >= 0 (above 2^53 read as 2^53).
         cancel: the token of the reservation, as its reply gave it.
ARGV[3]  permits_per_second: a number > 0, or `inf`.
ARGV[4]  policy: `bursty` or `warming_up`.
ARGV[5]  bursty: max_burst_micros; warming_up: warmup_micros. An integer
         >= 0; values above 2^53 are capped at 2^53.
ARGV[6]  warming_up: cold_factor, a finite number >= 1. Ignored by bursty,
         but must be present (pass 0).
ARGV[7]  Optional, for tests only: the clock reading, an integer in
         0..=2^53, used instead of TIME.

Reply    debt is max(next_free_micros - now, 0) of the key after the call
         (for a refused try or a query, of the key as it is).
           reserve  granted: the value it wrote without its ledger (see
                    Value), 76 bytes, and for a reservation made with `n+`
                    that waits the id of its group in the ledger, 8 more
                    (one double): the reservation's token (see Token). With
                    now =
                    last_now_micros (field 6), the wait is
                    max(next_free_before - now, 0) (field 9) and the debt
                    next_free_micros - now (field 2), in whole µs.
                    refused try: the integer -debt_micros (<= -1, as a
                    refused try has debt_micros > timeout_micros >= 0)
           query    the integer debt_micros (0 for a missing key)
           probe    the integer debt_micros
           resume   the integer debt_micros
           cancel   the integer 1 restored, 2 returned, 0 nothing given
                    back (or a missing key)
         (A granted reservation replies the bytes it has just packed for
         its write: packing a reply of its own, or building an array, would
         cost Redis more than the rest of the reservation's arithmetic.
         A token has an id when its reservation was made with `n+` and
         waits.)

Token    The 76 or 84 bytes a granted reservation replied, unchanged: its
         value's first 76 bytes (marker `thr2`, or `thr3` if the value has a
         ledger), whose fields 7 to 9 record the reservation (see Value),
         then, for one made with `n+` that waits, its group's id in the
         ledger: a little-endian double, an integer in 0..2^53. Send it
         back with the same key. Its fields 1 to 4, 6, 8 and 9 are checked
         as in a value, field 7 is an integer in 0..2^41, and
         next_free_micros is not before the moment; anything else is an
         error (see Errors).

Value    76 bytes: the 4 ASCII bytes `thr2`, then nine little-endian IEEE
         doubles, `struct.pack('<c4ddddddddd', 'thr2', ...)` (exact):
           1  stored_permits, in 0..=max_permits
           2  next_free_micros, an integer in 0..=2^53
           3  permits_per_second in force when written, > 0 (may be inf)
           4  max_permits in force when written, finite, >= 0
           5  expires_micros: when the key's TTL ends, as last set (see
              Expiry); finite, >= 0
           6  last_now_micros: the latest clock reading a call used on this
              key (see Clock); an integer in 0..=2^53
           7  fractions: an integer in 0..2^41 that packs three
              non-negative integers (every such integer is valid),
                next_free_fraction * 2^21 + fraction_before * 2 + spent_stored
              next_free_fraction  the ticket's part below the microsecond,
                                  in 0..2^20, in units of 2^-20 µs: the
                                  ticket is next_free_micros +
                                  next_free_fraction / 2^20 (see Numbers)
              fraction_before     in 0..2^20: of the record, below
              spent_stored        0 or 1: of the record, below
         The last write's reservation (`Reserved`; for a write that is not
         a reservation, one of nothing: 8 and 9 equal 1 and 2,
         fraction_before equals next_free_fraction, spent_stored is 0):
           8  stored_before     the state the reservation found: after the
           9  next_free_before  missing-key reading and the rate change,
              fraction_before   before its own resync (in field 7)
              spent_stored      1 if it spent stored permits, else 0
                                (in field 7)
         Its moment (when its permits may be used, the ticket after its
         resync) is max(next_free_before, last_now_micros): the rate
         change's resync moves the ticket to now only if it lies behind.
         Fields 1 to 7 are checked on every read; no field may be NaN.
         Fields 8 and 9 (and the record's part of 7) are read only from a
         token, and checked there. (Packing the three small integers into
         one double keeps the value at 76 bytes, a Redis allocation of 80,
         and costs a reservation one more double to read, 7, and none more
         to write, 9: each double packed or unpacked costs Redis time.)
         Older formats are read and upgraded in place, if their fields
         are valid (the same checks, without field 7):
           thr1  76 bytes, marker `thr1`, the same fields 1 to 6, then its
                 own record (stored_before, next_free_before,
                 spent_stored), which is not read: read as thr2 with
                 next_free_fraction = 0.
           v0    exactly 40 bytes, fields 1 to 5, no marker: read as thr2
                 with last_now_micros = 0 and next_free_fraction = 0.
         The next write stores the value as thr2 (or thr3). A probe
         rewrites it in its thr2 form, keeping its TTL: the same fields 1
         to 6, field 7 0, and a record of nothing (a value's record is only ever read
         back from a token, which an older value cannot be). Any other
         string (another length, another marker, invalid fields) is not
         this limiter's: every mode fails (see Errors) and leaves it
         untouched.

         thr3  A thr2 value whose marker is `thr3`, followed by its ledger
               (see Ledger): written instead of thr2 while the ledger holds
               a group, and until its horizon has passed.

Ledger   What an exact give-back must know about the reservations still
         waiting (the reasoning is on `Ledger` in `src/core/ledger.rs`):
         one group per reservation made with `n+` that still waits, oldest
         first, each with its id, its moment, and the offset below `tat` of
         the largest term of the requests since the group before it (none
         once a later group reaches it). At most LEDGER_CAPACITY (64) groups: past that, the
         two newest merge, and the reservation between them gives back
         only what lies before it (errs late). After the 76 bytes:
           6 doubles  open      the open group's offset (the requests
                                since the newest group; inf: none)
                      next_id   the id the next group gets
                      earliest  no group's moment is before it (inf: none)
                      in_order  1 if the groups' moments rise, else 0
                      groups    how many groups, 0..=64
                      horizon   the latest moment of a reservation given an
                                id since the ledger was written first
           then a pair of doubles (id, moment) per group, oldest first, then
           a pair (id, offset) per group that has an offset: ids and
           offsets both strictly rise, every number a whole µs (or id) in
           0..=2^53.
         A reservation reads the six doubles and the ends of these lists
         only: expiry cuts a prefix (while the moments rise, as they do
         until a give-back lets a request in before a waiting one: then it
         reads them all), the request's term pops entries from the end, its
         group is appended. A give-back reads every group, checks them (a
         ledger this script did not write is an error, see Errors) and
         writes them back. A rate change and a request that finds the key
         idle beyond its burst empty the ledger; a resume is noted as a
         request whose charge no give-back returns. Ids start at 0 in a new
         ledger; the value keeps its ledger, with no group, until `now`
         reaches the horizon, and the key lives that long (see Expiry): so
         a token never meets the ids of another ledger while it could still
         be given back, and matching the latest group also compares the
         moment.

Missing  A missing key reads as a limiter that has been idle for a long time:
key      stored_permits = max_permits (full for bursty, cold for warming-up),
         next_free_micros = now (next_free_fraction = 0), at the rate in
         ARGV[3]. (A limiter created in-process starts with no stored
         permits when bursty; a shared key cannot tell "new" from
         "expired", so it takes the idle reading.)

Clock    now = max(TIME, last_now_micros): the server's TIME in microseconds
         (ARGV[7] when given), never below the last reading the key has
         seen, and every write stores last_now_micros = now. So time never
         runs backwards for a key: a step of the server's clock backwards
         reads as time standing still until the clock catches up (never as
         a debt that grows), and a step forwards reads as idle time, which
         stores at most max_permits (one burst). All callers of a key share
         one clock, the server's.

Rate     When the rate in the key differs from ARGV[3], the rate changed:
changes  as in `State::set_rate`, idle time up to now is first credited at
         the old rate (its stable interval recomputed from that rate, with
         the old max_permits, under the current policy arguments), then
         stored permits are rescaled to the same fraction of the new
         max_permits. The same happens when the rate is unchanged but the
         policy arguments give a different max_permits than the one in the
         key (the limiter was reconfigured). Reserve and resume do this
         first, before the try check, and write it with the rest; a refused
         try or a query writes nothing, so the next call that writes applies
         it. Cancel and probe never change the rate.

Expiry   The key must live until it would read as a missing key anyway: until
         next_free_micros has passed AND idle time has refilled
         stored_permits to max_permits (rounded up to whole milliseconds,
         plus 2 ms, which also covers the ticket's fraction, under 1 µs;
         at most 2^53 / 1000 ms), and, while the value has a ledger, until
         its horizon. At an unchanged rate and configuration, expiry is
         therefore invisible. (Across a rate change it can be
         visible in two corner cases the in-process limiter treats
         specially: leaving an infinite rate, and leaving a rate with
         max_permits = 0.)
         Setting a TTL costs Redis more than the rest of the write, so a
         write keeps the TTL it finds (`SET ... KEEPTTL`) when
         expires_micros already covers that moment, and otherwise sets one
         with slack (`SET ... PX`): twice what the key needs, but at most 1 s
         more, recording its end in expires_micros. A busy key thus sets a
         TTL about once per second that its end moves instead of on every
         call, and an idle key still goes soon after it reads as missing.
         Expiry is counted on the clock as read (TIME, not raised to
         last_now_micros), the clock Redis's TTLs run on: a key whose
         last_now_micros is ahead of TIME lives until TIME reaches its end.
         Writes: a granted reservation, resume, a cancel that restores or
         returns, and a probe of a missing key follow this rule; a probe of
         an existing key keeps its TTL; a query, a refused try and a cancel
         that gives nothing back write nothing, so set no TTL. (A TTL
         removed from outside, e.g. by PERSIST, is therefore not restored
         until the key needs a longer one; and with ARGV[7], expires_micros
         is on the caller's clock.)

Errors   `ERR throttler: ...` for any invalid argument (a malformed token
         included), before the key is read or written. For a value that is
         not this limiter's (see Value), in every mode and before anything
         is written: `ERR throttler: key <key> holds a value this limiter
         does not recognise (<n> bytes); it was left untouched: delete it or
         use another limiter name`; the same for a thr3 value whose ledger
         head is invalid (any mode) or whose groups are (found when they are
         all read: by a cancel, or by a reservation's expiry once the
         moments no longer rise). If KEYS[1] holds something other than a
         string (a hash, a list, ...), the GET fails with WRONGTYPE and that
         error is the reply. A write the server refuses (OOM, READONLY, ...)
         fails with the server's error; as every mode writes at most once,
         last, nothing has changed then either.

Numbers  Time is integer microseconds, saturating at 2^53 (MAX_MICROS), and
         every wait, debt and moment is whole microseconds. The schedule
         itself is exact to 2^-20 µs: the ticket keeps a fraction
         (next_free_fraction), and each reservation's cost below 2^32 µs
         is rounded to the nearest 2^-20 µs and added to it, the whole
         microseconds it carries going to next_free_micros
         (`State::charge`; a cost of 2^32 µs or more, or NaN, is truncated
         to whole µs and leaves the fraction as it is). So a saturated
         limiter never drifts from its rate, whatever its interval. Idle
         time is counted from the exact ticket (`State::resync`), which
         then moves to now with no fraction. Every integer here stays
         below 2^53, so it is exact. Lua numbers are doubles, exactly like
         the f64 of the core, and the state is stored as their exact
         bytes.

Redis    6.0 or newer (SET ... KEEPTTL), with effects replication (the
         default since 5.0, the only mode since 7.0), as the script writes
         after reading TIME.
]]

-- Constants, as in src/core.
local MAX_MICROS = 9007199254740992 -- 2^53
local F64_MAX = 1.7976931348623157e308 -- f64::MAX
local INFINITY = 1 / 0
local TTL_CAP_MS = 9007199254740 -- floor(2^53 / 1000)
local TTL_MAX_SLACK_MS = 1000
local MARKER = 'thr2'
local THR1 = 'thr1' -- the previous marker, same size (see Value)
local VALUE = '<c4ddddddddd' -- the marker and nine doubles: 76 bytes
local VALUE_SIZE = 76
local STATE = '<c4ddddddd' -- the marker and fields 1 to 7, read from a value
local FRACTION_ONE = 1048576 -- 2^20: one microsecond in fraction units
local FINE_CHARGE_LIMIT = 4294967296 -- 2^32 µs (FINE_CHARGE_LIMIT_MICROS)
local FRACTIONS_SHIFT = 2097152 -- 2^21: field 7 = next_free_fraction * 2^21 + ...
local FRACTIONS_END = 2199023255552 -- 2^41: field 7 is below it
local BAD = 'ERR throttler: %s (got "%s")'
local THR3 = 'thr3' -- the marker of a value with a ledger (see Ledger)
local LEDGER = '<dddddd' -- the ledger's head: six doubles, 48 bytes
local LEDGER_START = 77 -- where a thr3 value's ledger begins
local LEDGER_CAPACITY = 64 -- the most groups kept (Ledger::SHARED_CAPACITY)
local TOKEN_ID_SIZE = 84 -- a token with a group id (see Token)
local NOT_OURS = 'ERR throttler: key %s holds a value this limiter does not recognise (%d bytes); it was left untouched: delete it or use another limiter name'

-- Comparisons below are written `if x > cap then x = cap end` where the core
-- has `x.min(cap)`: the same thing, as no x there can be NaN. An integer
-- check is `x % 1 == 0`, which NaN and the infinities fail.

---------------------------------------------------------------------------
-- Arguments. Everything is checked before the key is read or written.
---------------------------------------------------------------------------

local argv = ARGV
local nargs = #argv
if #KEYS ~= 1 then
    return redis.error_reply('ERR throttler: expected exactly 1 key, the limiter (got '
        .. #KEYS .. '); call with KEYS[1] = limiter key')
end
if nargs ~= 6 and nargs ~= 7 then
    return redis.error_reply('ERR throttler: expected 6 or 7 arguments: permits|probe|resume|cancel, '
        .. 'timeout_micros|debt_micros|token, permits_per_second, policy, '
        .. 'max_burst_micros|warmup_micros, cold_factor[, now_micros] (got ' .. nargs .. ')')
end
local tonumber = tonumber

-- ARGV[1]. `mode` stays nil for a reservation or a query (`permits`), and
-- names a cold mode otherwise (`permits` is then nil). The most common value
-- skips the conversion.
-- `held`: a reservation its caller may give back (`n+`), which gets a group
-- in the ledger if it waits.
local permits = argv[1]
local mode, held
if permits == '1' then
    permits = 1
elseif permits == '1+' then
    permits, held = 1, true
else
    local n = tonumber(permits)
    if not n and string.byte(permits, -1) == 43 then
        n = tonumber(string.sub(permits, 1, -2))
        held = n and n >= 1
    end
    if n and n >= 0 and n <= MAX_MICROS and n % 1 == 0 and held ~= false then
        permits = n
    elseif not n and (permits == 'probe' or permits == 'resume' or permits == 'cancel') then
        mode = permits
        permits = nil
    else
        return redis.error_reply(string.format(BAD,
            'ARGV[1] must be the permits to reserve, an integer from 1 to 2^53 (followed by + '
            .. 'if the reservation may be given back), 0 to query, or probe, resume or cancel',
            string.sub(tostring(argv[1]), 1, 40)))
    end
end

-- ARGV[2]: the timeout of a reservation (or of nothing, for a query or a
-- probe), the debt of a resume, the token of a cancel.
local timeout_micros = argv[2]
local is_try = false
local debt_micros
local tk_stored_before, tk_next_free_before, tk_stored_after, tk_next_free_after
local tk_moment, tk_spent_stored, tk_rate, tk_max, tk_now
local tk_fractions, tk_fraction_before, tk_fraction_after, tk_id
if mode == nil or mode == 'probe' then
    if timeout_micros ~= '-1' then
        timeout_micros = tonumber(timeout_micros)
        if not (timeout_micros and timeout_micros >= -1 and timeout_micros % 1 == 0) then
            return redis.error_reply(string.format(BAD,
                'timeout_micros (ARGV[2]) must be an integer >= 0, or -1 for no timeout',
                string.sub(tostring(argv[2]), 1, 40)))
        end
        is_try = timeout_micros >= 0
        if timeout_micros > MAX_MICROS then
            timeout_micros = MAX_MICROS
        end
    end
elseif mode == 'resume' then
    debt_micros = tonumber(timeout_micros)
    if not (debt_micros and debt_micros >= 0 and debt_micros % 1 == 0) then
        return redis.error_reply(string.format(BAD, 'debt_micros (ARGV[2]) must be an integer >= 0',
            string.sub(tostring(argv[2]), 1, 40)))
    end
    if debt_micros > MAX_MICROS then
        debt_micros = MAX_MICROS
    end
else
    -- The token, as a reservation's reply gave it (see Token).
    local marker, _
    local token_size = #timeout_micros
    if token_size == VALUE_SIZE or token_size == TOKEN_ID_SIZE then
        marker, tk_stored_after, tk_next_free_after, tk_rate, tk_max, _, tk_now, tk_fractions,
            tk_stored_before, tk_next_free_before = struct.unpack(VALUE, timeout_micros)
        tk_moment = tk_next_free_before
        if tk_now > tk_moment then
            tk_moment = tk_now
        end
        if marker == THR3 then
            marker = MARKER
        end
        if token_size == TOKEN_ID_SIZE then
            tk_id = struct.unpack('<d', timeout_micros, LEDGER_START)
            if not (tk_id >= 0 and tk_id < MAX_MICROS and tk_id % 1 == 0) then
                marker = nil
            end
        end
    end
    -- NaN fails every comparison, so it is rejected too.
    if not (marker == MARKER and tk_max >= 0 and tk_max < INFINITY and tk_rate > 0
            and tk_stored_before >= 0 and tk_stored_before <= tk_max
            and tk_stored_after >= 0 and tk_stored_after <= tk_max
            and tk_next_free_before >= 0 and tk_next_free_before <= MAX_MICROS
            and tk_next_free_before % 1 == 0
            and tk_now >= 0 and tk_now % 1 == 0
            and tk_next_free_after >= tk_moment and tk_next_free_after <= MAX_MICROS
            and tk_next_free_after % 1 == 0
            and tk_fractions >= 0 and tk_fractions < FRACTIONS_END and tk_fractions % 1 == 0) then
        return redis.error_reply('ERR throttler: ARGV[2] is not a reservation token: a cancel takes '
            .. VALUE_SIZE .. ' or ' .. TOKEN_ID_SIZE .. ' bytes a granted reservation replied, unchanged (got '
            .. #timeout_micros .. ' bytes)')
    end
    -- Field 7: fraction_after * 2^21 + fraction_before * 2 + spent_stored.
    tk_spent_stored = tk_fractions % FRACTIONS_SHIFT
    tk_fraction_after = (tk_fractions - tk_spent_stored) / FRACTIONS_SHIFT
    tk_fraction_before = tk_spent_stored
    tk_spent_stored = tk_spent_stored % 2
    tk_fraction_before = (tk_fraction_before - tk_spent_stored) / 2
end

-- stable_interval_micros: rejects NaN, zero, negative rates (and -inf).
local permits_per_second = tonumber(argv[3])
if not (permits_per_second and permits_per_second > 0) then
    return redis.error_reply(string.format(BAD, 'permits_per_second (ARGV[3]) must be a number > 0 or inf',
        string.sub(tostring(argv[3]), 1, 40)))
end

local policy = argv[4]
local is_bursty = policy == 'bursty'
if not is_bursty and policy ~= 'warming_up' then
    return redis.error_reply(string.format(BAD, 'policy (ARGV[4]) must be "bursty" or "warming_up"',
        string.sub(tostring(policy), 1, 40)))
end

-- Bursty::max_burst_micros or WarmingUp::warmup_micros, capped like `micros`.
local policy_micros = tonumber(argv[5])
if not (policy_micros and policy_micros >= 0 and policy_micros % 1 == 0) then
    return redis.error_reply(string.format(BAD, (is_bursty and 'max_burst_micros' or 'warmup_micros')
        .. ' (ARGV[5]) must be an integer >= 0', string.sub(tostring(argv[5]), 1, 40)))
end
if policy_micros > MAX_MICROS then
    policy_micros = MAX_MICROS
end

local cold_factor
if not is_bursty then
    cold_factor = tonumber(argv[6])
    if not (cold_factor and cold_factor >= 1 and cold_factor < INFINITY) then
        return redis.error_reply(string.format(BAD, 'cold_factor (ARGV[6]) must be a finite number >= 1',
            string.sub(tostring(argv[6]), 1, 40)))
    end
end

-- The clock as read: TIME, or ARGV[7].
local time_micros
if nargs == 7 then
    time_micros = tonumber(argv[7])
    if not (time_micros and time_micros >= 0 and time_micros <= MAX_MICROS and time_micros % 1 == 0) then
        return redis.error_reply(string.format(BAD,
            'now_micros (ARGV[7]) must be an integer from 0 to 2^53, or absent to use TIME',
            string.sub(tostring(argv[7]), 1, 40)))
    end
end

---------------------------------------------------------------------------
-- The configuration in force from now on (Policy::set_stable_interval).
---------------------------------------------------------------------------

-- stable_interval_micros: 0 for an infinite rate, capped at MAX_MICROS.
local stable = 1000000.0 / permits_per_second
if stable > MAX_MICROS then
    stable = MAX_MICROS
end
local max_permits, threshold_permits, slope, cool_down
if is_bursty then
    -- Bursty::max_permits
    if permits_per_second == INFINITY then
        max_permits = 0.0
    else
        max_permits = policy_micros * permits_per_second / 1000000.0
        if max_permits > F64_MAX then
            max_permits = F64_MAX
        end
    end
    -- Policy::cool_down_interval_micros
    cool_down = stable
else
    -- WarmingUp::set_stable_interval
    if stable == 0.0 then
        max_permits, threshold_permits, slope = 0.0, 0.0, 0.0
    else
        local cold = stable * cold_factor
        if cold > F64_MAX then
            cold = F64_MAX
        end
        threshold_permits = 0.5 * policy_micros / stable
        if threshold_permits > F64_MAX then
            threshold_permits = F64_MAX
        end
        local stable_plus_cold = stable + cold
        if stable_plus_cold > F64_MAX then
            stable_plus_cold = F64_MAX
        end
        max_permits = threshold_permits + 2.0 * policy_micros / stable_plus_cold
        if max_permits > F64_MAX then
            max_permits = F64_MAX
        end
        slope = 0.0
        if max_permits > threshold_permits then
            slope = (cold - stable) / (max_permits - threshold_permits)
            if slope > F64_MAX then
                slope = F64_MAX
            end
        end
    end
    -- Policy::cool_down_interval_micros
    if max_permits > 0.0 then
        cool_down = policy_micros / max_permits
    else
        cool_down = stable
    end
end

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
        return redis.error_reply('ERR throttler: key ' .. key .. ' holds a value this limiter does not '
            .. 'recognise (' .. size .. ' bytes); it was left untouched: delete it or use another '
            .. 'limiter name')
    end
    -- The ticket's fraction: the top of field 7.
    next_free_fraction = (fractions - fractions % FRACTIONS_SHIFT) / FRACTIONS_SHIFT
    -- The clock never runs backwards for a key.
    if last_now_micros > now_micros then
        now_micros = last_now_micros
    end
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
        if now_micros < earliest then
            return
        end
        local carried, kept = INFINITY, 0
        if in_order == 1 then
            -- Moments rise with the groups: the passed ones come first.
            local passed = 0
            while passed < groups and group_moments[passed + 1] <= now_micros do
                passed = passed + 1
                if group_offsets[passed] < carried then
                    carried = group_offsets[passed]
                end
            end
            for i = passed + 1, groups do
                kept = kept + 1
                group_ids[kept], group_moments[kept], group_offsets[kept] =
                    group_ids[i], group_moments[i], group_offsets[i]
            end
            groups = kept
            if kept > 0 then
                if carried < group_offsets[1] then
                    group_offsets[1] = carried
                end
                earliest = group_moments[1]
                return
            end
        else
            local soonest = INFINITY
            for i = 1, groups do
                local moment, offset = group_moments[i], group_offsets[i]
                if moment <= now_micros then
                    if offset < carried then
                        carried = offset
                    end
                else
                    kept = kept + 1
                    if carried < offset then
                        offset = carried
                    end
                    group_ids[kept], group_moments[kept], group_offsets[kept] = group_ids[i], moment, offset
                    carried = INFINITY
                    if moment < soonest then
                        soonest = moment
                    end
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

-- QUERY: max(next_free_micros - now, 0), writing nothing.
if permits == 0 then
    if value and next_free_micros > now_micros then
        return next_free_micros - now_micros
    end
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
            if next_free_micros > now_micros then
                return next_free_micros - now_micros
            end
            return 0
        end
        -- A missing key is written below as it reads: the rate change and
        -- the reservation do not apply.
    elseif mode == 'cancel' then
        if not value then
            return 0
        end
        -- State::give_back. The key's own rate and max_permits stay in
        -- force (no rate change), with the cool-down that goes with them.
        local key_stable = 1000000.0 / old_rate
        if key_stable > MAX_MICROS then
            key_stable = MAX_MICROS
        end
        local token_stable = 1000000.0 / tk_rate
        if token_stable > MAX_MICROS then
            token_stable = MAX_MICROS
        end
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
        if not latest and groups > 0 then
            expire()
        end
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
                if groups == 0 then
                    open, earliest, in_order = 0, INFINITY, 1
                end
            end
        elseif now_micros < tk_moment and tk_spent_stored == 0 then
            -- Reserved::charge_micros: whole µs, rounded down, from the
            -- ticket at the moment (its fraction is fraction_before if no
            -- resync moved it) to the ticket after.
            local charge = tk_next_free_after - tk_moment
            local moment_fraction = 0
            if tk_moment == tk_next_free_before then
                moment_fraction = tk_fraction_before
            end
            if tk_fraction_after < moment_fraction and charge > 0 then
                charge = charge - 1
            end
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
                if group_offsets[i] < lost then
                    lost = group_offsets[i]
                end
            end
            lost = lost + charge
            for i = losing + 1, groups do
                if group_offsets[i] < kept then
                    kept = group_offsets[i]
                end
            end
            local moved = next_free_micros
            if lost < moved then
                moved = lost
            end
            if kept < moved then
                moved = kept
            end
            next_free_micros = next_free_micros - moved
            for i = 1, losing do
                local offset = group_offsets[i]
                if offset < INFINITY then
                    -- Capped at 2^53, as in the core (exact: no sum here
                    -- leaves the integers a double holds).
                    offset = (offset - moved) + charge
                    if offset > MAX_MICROS then
                        offset = MAX_MICROS
                    end
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
                    if offset < group_offsets[losing] then
                        group_offsets[losing] = offset
                    end
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
            if groups == 0 then
                open, earliest, in_order = 0, INFINITY, 1
            end
            cancelled = 2
        else
            return 0
        end
        if encode then
            encode()
        end
        permits_per_second = old_rate
        max_permits = old_max
        cool_down = key_stable
        if not is_bursty and old_max > 0.0 then
            cool_down = policy_micros / old_max
        end
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

-- State::set_rate, when the rate (or the configuration) changed. (Never for
-- a cancel or a probe: their configuration is the key's.)
if old_rate ~= permits_per_second or old_max ~= max_permits then
    -- Ledger::clear: its offsets were at the old rate.
    open, groups, earliest, in_order = 0, 0, INFINITY, 1
    src, p0, p1, e0, e1 = '', 1, 0, 1, 0
    local old_stable = 1000000.0 / old_rate
    if old_stable > MAX_MICROS then
        old_stable = MAX_MICROS
    end
    -- State::resync at the old stable interval and max_permits.
    if now_micros > next_free_micros then
        local old_cool_down = old_stable
        if not is_bursty and old_max > 0.0 then
            old_cool_down = policy_micros / old_max
        end
        -- Idle time from the exact ticket: > 0 (the fraction is below one
        -- µs), so an infinite quotient (cool_down == 0) is fine, never NaN.
        local stored = stored_permits
            + ((now_micros - next_free_micros) - next_free_fraction / FRACTION_ONE) / old_cool_down
        if stored > old_max then
            stored = old_max
        end
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

local stored_before, next_free_before, record, token_id
-- State::can_acquire, for a try: refused means nothing is written at all.
if is_try and next_free_micros - timeout_micros > now_micros then
    return now_micros - next_free_micros
end

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
                    if e0 <= e1 and struct.unpack('<d', src, e0) == first then
                        e0 = e0 + 16
                    end
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
            if not decode() then
                return redis.error_reply(string.format(NOT_OURS, key, size))
            end
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
        if is_bursty then
            room = (max_permits - stored_permits) * stable
        end
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
            if slack < open then
                open = slack
            end
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
        if stored > max_permits then
            stored = max_permits
        end
        stored_permits = stored
        next_free_micros = now_micros
        next_free_fraction = 0
    end
    -- The reservation's moment: when its permits may be used.
    local moment = next_free_micros
    local stored_to_spend = permits
    if stored_permits < stored_to_spend then
        stored_to_spend = stored_permits
    end
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
            if spent < take_above then
                take_above = spent
            end
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
    if stored_permits ~= stored_resynced then
        record = record + 1
    end
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
            if e1 >= e0 then
                last_id, last_offset = struct.unpack('<dd', src, e1 - 15)
            end
            if last_id == older then
                e1 = e1 - 16
                e_tail = struct.pack('<dd', token_id, last_offset)
            else
                e_tail = struct.pack('<dd', token_id, open)
            end
        end
        open = INFINITY
        if moment < earliest then
            earliest = moment
        end
        if moment > horizon then
            horizon = moment
        end
    end
end

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
    if horizon_ms > ttl_ms then
        ttl_ms = horizon_ms
    end
end
if ttl_ms < TTL_CAP_MS - 2 then
    if ttl_ms > 0 then
        local whole = ttl_ms - ttl_ms % 1
        if whole < ttl_ms then
            whole = whole + 1
        end
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
    if ttl_ms > TTL_CAP_MS then
        ttl_ms = TTL_CAP_MS
    end
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
    if token_id then
        return written .. struct.pack('<d', token_id)
    end
    return written
end
if cancelled then
    return cancelled
end
-- Resume, or the probe of a missing key (no debt): the debt.
if next_free_micros > now_micros then
    return next_free_micros - now_micros
end
return 0
