-- The limiter's script, part 1 of 5: constants, arguments, the clock, the
-- value's head as read. It mirrors core::Limits (src/core/limits.rs, and
-- src/core/learn.rs for what it learns) over core::State
-- (src/core/state.rs), for 1 to MAX_LIMITS limits; its protocol is
-- specified in docs/redis-protocol.md.
--
-- It is written for speed: Redis runs one script at a time, so every
-- instruction here is every caller's. With one limit, its state and
-- configuration are plain locals (no table is built), and so are two
-- limits' for a reservation that logs nothing (see part 2); with several,
-- the tables S (the value's doubles from the states on, laid out as in the
-- value, so that one unpack reads them and one pack writes them) and C
-- (configuration) hold every limit's, and the same locals are the limit
-- being worked on (loaded at the top of each loop over the limits, stored
-- back at its end). Code on the common path makes no closure (a value
-- with a log makes one, read_request, that captures nothing), converts
-- each argument once and packs the value once.

-- Constants, as in src/core.
local MAX_MICROS = 9007199254740992 -- 2^53
local F64_MAX = 1.7976931348623157e308 -- f64::MAX
local FRACTION_ONE = 1048576 -- 2^20: one microsecond in fraction units
local FINE_CHARGE_LIMIT = 4294967296 -- 2^32 µs (FINE_CHARGE_LIMIT_MICROS)
local TTL_CAP_MS = 9007199254740 -- floor(2^53 / 1000)
local TTL_MAX_SLACK_MS = 1000
-- The value (see Value in the protocol).
local MARKER = 'plv1'
local MAX_LIMITS = 16
-- shape = limits + SHAPE * logged requests + BOUND * (the record's bound + 1)
-- + LEARNED if the value holds what the limits learned
local SHAPE = 32
local BOUND = 4128 -- SHAPE * 129
local LEARNED = 70176 -- BOUND * 17
local LOG_CAPACITY = 128 -- the most requests the log keeps
local DEAD_CAPACITY = 16 -- the most requests kept in the value after they left the log
-- The formats of several limits' values: string.sub(FORMAT, 3, 3 + k) is
-- k doubles, string.sub(FORMAT, 1, 3 + k) the marker and k doubles.
local FORMAT = 'c4<ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd' -- (85: 4 + 5 * MAX_LIMITS + 1)
-- (One literal: a concatenation would run on every call. Each local here
-- costs every call an instruction: a constant that one branch alone uses
-- is declared there, or written out with its name beside it.)
local NOT_OURS = 'ERR paceline: the key holds a value this limiter does not recognise (%d bytes); it was left untouched: delete it or use another limiter name'

-- Comparisons are written `if x > cap then x = cap end` where the core has
-- `x.min(cap)`: the same, as no x there is NaN (the rare modes' may call
-- math.min and math.max instead). An integer check is
-- `x % 1 == 0`, which NaN and the infinities fail; `x <= F64_MAX` is
-- x < inf. On the common paths, `a = x; b = y` where the two are
-- independent: a multiple assignment goes through temporaries.

---------------------------------------------------------------------------
-- Arguments: the call's (ARGV[1] and ARGV[2]) and the clock's here, the
-- limits' in part 2; all checked before anything is written.
---------------------------------------------------------------------------

local argv, tonumber = ARGV, tonumber
local nargs = #argv
if #KEYS ~= 1 then
    return redis.error_reply(string.format('ERR paceline: expected exactly 1 key, the limiter (got %d)', #KEYS))
end
-- Two, four per limit, and the clock's reading if it is given.
local clocked = (nargs - 2) % 4
local n = (nargs - 2 - clocked) / 4
if clocked > 1 or n < 1 or n > MAX_LIMITS then
    return redis.error_reply(string.format('ERR paceline: expected 2 + 4 per limit (1 to %d limits) arguments, then now_micros optionally: permits|mode, timeout_micros|debts|id|requests|counts|lesson, and per limit permits_per_second, policy, max_burst_micros|warmup_micros, cold_factor (got %d)', MAX_LIMITS, nargs))
end
-- A logged request's doubles (see Log).
local W = 3 + n

-- (The script keeps the names it uses few: every distinct name and string
-- it holds costs each call some of the garbage collector's time. Locals of
-- the new modes reuse names of the others where they mean the same.)

-- ARGV[1]: the permits of a reservation (`held`: `n+`, one its caller may
-- give back), or the mode. The common values skip tonumber.
-- A call (an open call, Limits::open) is a reservation held as 2 (open),
-- of `permits` for the first limit and P (a table, read with several
-- limits) for each. (Declared here too, for the new modes, with no cost
-- to the others: a call's or settle's `lists` of counts, a learn's
-- `lesson`, how long before it its call went (`sent_ago`), and what the
-- limits learn from it, L2 and M1, see part 2.)
local permits, held, mode, P, lists, lesson, sent_ago, L2, M1 = argv[1]
if permits == '1' then
    permits = 1
elseif permits == '1+' then
    permits, held = 1, true
elseif string.find(permits, '^%l') then
    -- (A mode: one that ARGV[2]'s parts below do not know is refused there.)
    mode, permits = permits, nil
else
    if string.byte(permits, -1) == 43 then permits, held = string.sub(permits, 1, -2), true end
    permits = tonumber(permits)
    -- (Not a count: refused as a mode no part knows.)
    if not (permits and permits >= 1 and permits <= MAX_MICROS and permits % 1 == 0) then mode = '?' end
end

-- ARGV[2]: a reservation's timeout (-1: none), a resume's debts, a
-- give_back's or keep's id, a batch's requests (R: permits, held, timeout
-- and count of each run of them; `total` requests, `holds` if any is
-- held), a call's counts and timeout, a settle's id and counts (`lists`:
-- charged, actual), a learn's `lesson` (see below).
local arg2 = argv[2]
local timeout, total, R, debts, give_back_id, holds = -1, 1
if arg2 == '-1' and not mode then
    -- (No timeout: the most common.)
elseif arg2 == '0' and not mode then
    timeout = 0
elseif not mode or mode == 'probe' or mode == 'status' then
    timeout = tonumber(arg2)
    if not (timeout and timeout >= -1 and timeout % 1 == 0) then
        return redis.error_reply(string.format('ERR paceline: timeout_micros (ARGV[2]) must be an integer >= 0, or -1 for no timeout (got "%.40s")', arg2))
    end
    if timeout > MAX_MICROS then timeout = MAX_MICROS end
elseif mode == 'batch' then
    local BATCH_CAPACITY = 1024 -- the most requests in one batch
    R, total = {}, 0
    for request in string.gmatch(arg2, '[^,]+') do
        -- (`star`: '*' before a count, '' for one.)
        local p, plus, t, star, times = string.match(request, '^(%d+)(%+?):(-?%d+)(%*?)(%d*)$')
        p, t, times = tonumber(p), tonumber(t), star == '' and 1 or tonumber(times)
        if not (p and t and times and p >= 1 and p <= MAX_MICROS and t >= -1 and times >= 1)
                or total + times > BATCH_CAPACITY then
            return redis.error_reply(string.format('ERR paceline: ARGV[2] of a batch must be 1 to %d requests permits[+]:timeout_micros[*count] (permits from 1 to 2^53, timeout_micros -1 or >= 0, count >= 1), joined by commas (got "%.40s")', BATCH_CAPACITY, request))
        end
        R[#R + 1], R[#R + 2], R[#R + 3], R[#R + 4] = p, plus == '+', math.min(t, MAX_MICROS), times
        total, holds = total + times, holds or plus == '+'
    end
    if total == 0 then
        return redis.error_reply(string.format('ERR paceline: ARGV[2] of a batch must hold a request (got "%.40s")', arg2))
    end
elseif mode == 'give_back' or mode == 'keep' then
    give_back_id = tonumber(arg2)
    if not (give_back_id and give_back_id >= 0 and give_back_id < MAX_MICROS and give_back_id % 1 == 0) then
        return redis.error_reply(string.format('ERR paceline: ARGV[2] of a %s must be the id a held reservation\'s or a call\'s reply gave, an integer from 0 to 2^53 - 1 (got "%.40s")', mode, arg2))
    end
elseif mode == 'call' or mode == 'settle' or mode == 'resume' then
    -- Lists of n counts (integers from 0 to 2^53) joined by commas: a
    -- resume's debts (capped at 2^53), a call's counts, with its timeout
    -- (`counts:timeout_micros`), or a settle's charged and actual, after
    -- the call's id (`id:charged:actual`). (x, y, e: the parts; t: a
    -- call's timeout or a settle's id; `plus`: a count is above 0.)
    local x, y, e = string.match(arg2, mode == 'settle' and '^(%d+):([%d,]+):([%d,]+)$'
        or mode == 'call' and '^([%d,]+):(-?%d+)$' or '^([%d,]+)$')
    local t, plus = tonumber(mode == 'call' and y or x)
    give_back_id, lists = t, mode == 'settle' and {y, e} or {x}
    local ok = x and (mode == 'resume' or t >= -1 and (mode == 'call' or t < MAX_MICROS))
    for j = 1, ok and #lists or 0 do
        local numbers = {}
        for count in string.gmatch(lists[j] .. ',', '([^,]*),') do
            count = tonumber(count)
            ok = ok and count and (count < MAX_MICROS or mode == 'resume') and #numbers < n
            if not ok then break end
            numbers[#numbers + 1] = math.min(count, MAX_MICROS)
            plus = plus or count > 0
        end
        ok = ok and #numbers == n
        lists[j] = numbers
    end
    debts = mode == 'resume' and lists[1]
    if mode == 'resume' and not ok then
        return redis.error_reply(string.format('ERR paceline: ARGV[2] of a resume must be each limit\'s debt_micros, %d integers >= 0 joined by commas (got "%.40s")', n, arg2))
    elseif mode == 'settle' and not ok then
        return redis.error_reply(string.format('ERR paceline: ARGV[2] of a settle must be id:charged:actual, the id a call\'s reply gave (an integer below 2^53), then what it was charged and what it cost, %d integers from 0 to 2^53 - 1 each, joined by commas (got "%.40s")', n, arg2))
    elseif mode == 'call' and not (ok and plus) then
        return redis.error_reply(string.format('ERR paceline: ARGV[2] of a call must be its count for each limit (%d integers from 0 to 2^53 - 1, one at least > 0) joined by commas, then :timeout_micros (-1 or >= 0) (got "%.40s")', n, arg2))
    elseif mode == 'call' then
        -- A reservation held as open (see part 4).
        mode, permits, held, timeout, P = nil, lists[1][1], 2, math.min(t, MAX_MICROS), lists[1]
    end
elseif mode == 'learn' then
    -- The lesson and the learning's constants (see Learn), in `lesson` by
    -- position: 1 throttled, 2 success (booleans), 3 retry_after (nil: not
    -- given), 4 decrease, 5 increase, 6 interval, 7 floor, 8 pause, 9
    -- margin, 10 the end of the pause a refusal starts (part 2), then for
    -- limit i reported (`;rate,remaining,reset`, an empty field: not
    -- reported): 8 + 3i its rate, 9 + 3i remaining, 10 + 3i reset. (The
    -- tenth field, how long before the lesson its call went, in
    -- `sent_ago`: 0 if empty.)
    lesson = {string.match(arg2, '^([01]),([01]),(%d*),([^,;]+),([^,;]+),(%d+),([^,;]+),(%d+),([^,;]+),(%d*)()')}
    local f, at, ok, k = lesson, lesson[11], #lesson == 11, 10
    if ok then
        sent_ago = math.min(tonumber(f[10]) or 0, MAX_MICROS)
        f[1], f[2], f[10], f[11] = f[1] == '1', f[2] == '1', nil, nil
        for k = 3, 9 do f[k] = tonumber(f[k]) end
        ok = f[4] and f[4] > 0 and f[4] <= 1 and f[5] and f[5] >= 0 and f[5] <= 1
            and f[7] and f[7] > 0 and f[7] <= 1 and f[9] and f[9] > 0 and f[9] <= 1
        f[3], f[8] = f[3] and math.min(f[3], MAX_MICROS), math.min(f[8], MAX_MICROS)
    end
    while ok and at <= #arg2 do
        local r, m, s, e = string.match(arg2, '^;([^,;]*),(%d*),(%d*)()', at)
        local rate = tonumber(r)
        ok = r and k < 10 + 3 * n and (r == '' or rate and rate > 0 and rate <= F64_MAX)
        s = tonumber(s)
        lesson[k + 1], lesson[k + 2], lesson[k + 3], k, at = rate, tonumber(m), s and math.min(s, MAX_MICROS), k + 3, e
    end
    if not ok then
        return redis.error_reply(string.format('ERR paceline: ARGV[2] of a learn must be throttled,success,retry_after_micros,decrease,increase,interval_micros,floor,pause_micros,margin,sent_ago_micros (flags 0 or 1; decrease, floor and margin in (0, 1], increase in [0, 1]; whole µs, retry_after and sent_ago may be empty), then for each limit reported (up to %d) ;rate,remaining,reset_micros (rate > 0 and finite, the others whole, each may be empty) (got "%.40s")', n, arg2))
    end
else
    return redis.error_reply(string.format('ERR paceline: ARGV[1] must be the permits to reserve, an integer from 1 to 2^53 (followed by + if it may be given back), or batch, call, give_back, keep, learn, probe, resume, settle or status (got "%.40s")', argv[1]))
end

-- The clock as read: ARGV's last, or TIME (Lua converts the two strings
-- TIME replies with exactly).
local time_micros = argv[nargs]
if clocked == 1 then
    time_micros = tonumber(time_micros)
    if not (time_micros and time_micros >= 0 and time_micros <= MAX_MICROS and time_micros % 1 == 0) then
        return redis.error_reply(string.format('ERR paceline: now_micros (ARGV[%d]) must be an integer from 0 to 2^53, or absent to use TIME (got "%.40s")', nargs, argv[nargs]))
    end
else
    local time = redis.call('TIME')
    time_micros = time[1] * 1000000 + time[2]
end
local now = time_micros

---------------------------------------------------------------------------
-- The value as read (see Value), its head here (what part 2 needs to
-- configure the limits: whether, and what, they learned), the rest
-- checked in part 2. WRONGTYPE (the key is not a string) propagates:
-- nothing is written.
---------------------------------------------------------------------------

-- Each limit's state: stored_permits, next_free_micros, next_free_fraction,
-- and the rate and max_permits it was last charged at (the first limit's,
-- or the only one's: st, nf, fr, ort, omx; S: the value's doubles from its
-- hot part's states on, 3 per limit, the TTL's end `expires`, 2 per limit).
-- What the limits learned, as read (L: factor, paused_until, increased_at,
-- margin, then each limit's cap; see Learned). The log (see Log): `count`
-- requests; the limits' states before the first (bst, bnf, bfr; B, laid
-- out as S); the requests from byte `log_at` of the value (`dead` requests
-- that left it before), W doubles each, the first read: its id, count
-- (with several limits, front_P: its counts) and now, and `front`, when it
-- leaves the log once at its head (Limits::expire): its moment, never
-- (1e999) for an open call, at once (-1) for a request without an id
-- (plain, kept, a resume, or a lesson's cap), which nothing can give
-- back.
-- `whole`: the value is written whole, not only its hot part (see Value).
-- (Those a missing key leaves nil declared last, in one instruction.)
local key = KEYS[1]
local value = redis.call('GET', key)
local expires, next_id, count, held_n = 0, 0, 0, 0
local st, nf, fr, ort, omx
local S, B, changed, L
local bst, bnf, bfr
local size, dead, log_from, log_at, front_id, front_p, front_at, front, front_P, read_request
local ok, at, last_now, marker, shape, _
if value then
    size = #value
    at = 84
    if size >= 84 then
        marker, shape, last_now, next_id, _, st, nf, fr, expires, ort, omx =
            struct.unpack('<c4dddddddddd', value)
    end
    -- The head. (NaN fails every comparison.)
    ok = marker == MARKER
        and last_now >= 0 and last_now <= MAX_MICROS and last_now % 1 == 0
        -- A value's clock at most 2^52 µs (142 years) ahead of the reading
        -- (a clock stepped back): one further ahead is not one a server's
        -- clock wrote, and time standing still near where it saturates
        -- would stop tickets from limiting.
        and last_now - now <= 4503599627370496 -- 2^52
        -- (next_id 2^53: no id left, see part 4.)
        and next_id >= 0 and next_id <= MAX_MICROS and next_id % 1 == 0
    -- The clock never runs backwards for a key.
    if ok and last_now > now then now = last_now end
    if not ok then
    elseif size == at and (shape == 1 or shape == 4129) then -- (1 + BOUND)
        -- (One limit, nothing logged, nothing learned.)
        held_n = 1
    elseif shape >= 1 and shape < 2 * LEARNED and shape % 1 == 0 then
        held_n = shape % SHAPE
        -- (At most LOG_CAPACITY, as SHAPE * LOG_CAPACITY < BOUND.)
        count = (shape - held_n) % BOUND / SHAPE
        at = 44 + 40 * held_n
        ok = held_n >= 1 and held_n <= MAX_LIMITS
        if shape >= LEARNED and ok and size >= at + 32 + 8 * held_n then
            -- What the limits learned, after their rates.
            L = {struct.unpack(string.sub(FORMAT, 3, 7 + held_n), value, at + 1)}
            L[5 + held_n] = nil -- (the position unpack returns last)
            at = at + 32 + 8 * held_n
            -- A factor in (0, 1], whole µs, a margin in (0, 1], caps > 0
            -- (inf: none reported).
            ok = L[1] > 0 and L[1] <= 1 and L[2] >= 0 and L[2] <= MAX_MICROS and L[2] % 1 == 0
                and L[3] >= 0 and L[3] <= MAX_MICROS and L[3] % 1 == 0 and L[4] > 0 and L[4] <= 1
            for i = 5, 4 + held_n do ok = ok and L[i] > 0 end
        elseif shape >= LEARNED then
            ok = false
        end
        -- The log's head (see Log), if it has one.
        if count > 0 and ok and size >= at + 8 then
            dead = struct.unpack('<d', value, at + 1)
            ok = dead >= 0 and dead <= DEAD_CAPACITY and dead % 1 == 0
                and size == at + 8 + 24 * held_n + (24 + 8 * held_n) * (dead + count)
        else
            ok = ok and count == 0 and size == at
        end
    else
        ok = false
    end
end
