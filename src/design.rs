//! How the limiter is designed, and why: the algorithm every limiter of this
//! crate runs, in this process or in Redis.
//!
//! This module holds no items. The arithmetic it describes is in `src/core/`
//! (pure functions of `now`: no clock, lock or I/O), under the names used
//! here, and mirrored line by line in Lua (`lua/`) for Redis; differential
//! tests hold the two to the same results. In this process a limiter of one
//! bursty limit runs it folded into one word, updated by one compare-and-swap
//! (as is each key of a keyed limiter); every other limiter, under a short
//! lock.
//!
//! A rate of `r` permits per second hands permits out one *stable interval*
//! (`1 / r` seconds) apart. The limiter remembers one instant, the ticket
//! **`next_free_micros`**: the earliest time the next request may proceed. A
//! request arriving at `now` waits until the ticket, and moves it forward by
//! the cost of what it took.
//!
//! # Pre-consumption: the next caller pays
//!
//! A request is served as soon as the ticket is due, however many permits it
//! asks for, and its cost is added to the ticket for whoever comes next. So an
//! idle limiter grants `acquire(100)` at once, and the following `acquire(1)`
//! waits 100 intervals.
//!
//! Why: making a large request wait on an idle limiter wastes idle time that
//! is already there; charging its cost forward lets it start and keeps the
//! long-run rate exact. A request's wait is therefore only the debt left by
//! earlier callers, never its own size, and a refused `State::try_reserve`
//! only has to look at that debt: no request is "too big" to be tried.
//!
//! # Stored permits: remembering idle time
//!
//! A strict "one interval apart" limiter forgets idle time: after ten idle
//! seconds, the next ten requests still go one interval apart, under-using a
//! resource that was idle. Remembering all of it allows an unbounded burst
//! after a long pause. The compromise is **`stored_permits`**: idle time
//! becomes permits (one per *cool-down interval*), saved up to
//! **`max_permits`**. A request spends stored permits first and is charged the
//! rest as *fresh* permits at the stable interval. `resync` converts idle time
//! at the start of every operation (step 1 below).
//!
//! What a stored permit *costs* is the one question the two policies
//! (`Policy`; [`Limit::burst`](crate::Limit::burst) and
//! [`Limit::warmup`](crate::Limit::warmup) choose one) answer differently:
//!
//! * `Bursty`: nothing. An idle limiter lets `max_permits + 1` requests go at
//!   once (`max_permits` is one second's worth by default), then falls back to
//!   the stable rate. Right for a resource that was simply under-used: an API
//!   quota, a batch job that paused.
//! * `WarmingUp`: more than a fresh permit. A long-idle resource may be cold
//!   (empty caches, closed connections, a JIT that has not compiled yet), so
//!   after a pause the limiter starts at `cold_factor` times the stable
//!   interval and speeds up linearly to the stable rate as stored permits are
//!   used up. `WarmingUp` draws the curve.
//!
//! # One reservation, step by step
//!
//! `State::reserve_earliest_available` for `permits` at `now`:
//!
//! 1. `resync(now)`: if `now > next_free_micros`, add
//!    `(now - next_free_micros) / cool_down_interval` stored permits (capped
//!    at `max_permits`); set `next_free_micros = now`.
//! 2. Remember `moment = next_free_micros`: this request may go then.
//! 3. Spend `min(permits, stored_permits)` stored permits at the policy's
//!    price; the rest are fresh, at `stable_interval_micros` each.
//! 4. Push the ticket forward by that total (`State::charge`).
//! 5. Return `moment`. The caller waits `moment - now`, or nothing if that is
//!    in the past.
//!
//! `State::can_acquire` asks, changing nothing, whether
//! `next_free_micros - timeout <= now`: whether the existing debt fits in the
//! caller's timeout. A try that does not fit reserves nothing.
//!
//! # Giving a reservation back
//!
//! A caller may give up before its moment comes (`timeout(d, acquire(n))`, a
//! dropped future or [`Reservation`](crate::Reservation)). Later callers
//! should then be scheduled as if its reservation had never been made, while
//! callers already waiting keep their slots.
//!
//! The state alone cannot do that in general. Moving the ticket back by what
//! the reservation charged is exact while the limiter stays in debt (every
//! request since found the ticket ahead and nothing stored, and would have
//! been charged the same from a ticket that much earlier), but not once
//! several are given back: a reservation `B` that keeps its slot after an
//! earlier `A` was given back holds a later slot than a limiter that never
//! made `A` would have given it, so a request `S` made while `B` waits finds
//! the limiter in debt where that limiter sat idle past its burst and dropped
//! the excess. Giving `B` back then moves `S`'s charge into that dropped time,
//! and the callers after `S` go early, by seconds and more (two reservations
//! of an hour each, given back in turn, let later callers in up to an hour
//! early). Nor can a reservation that spent stored permits (a cold warming-up
//! limiter) be undone in the numbers: their price depended on how many were
//! left.
//!
//! So while a reservation that may be given back waits, the limits keep a
//! *log*: their states before the oldest such reservation, and every request
//! since (its permits and its `now`). Giving one back takes it out and replays
//! the rest from the saved states, which then hold exactly what they would had
//! it never been made, stored permits and warm-up included, for either policy
//! and however many are given back in whatever order. A reservation leaves the
//! log once its moment has passed (it was used) or it is kept; a log with
//! nothing left that may be given back is empty, and costs nothing. When more
//! than `LOG_CAPACITY` requests (1 024 in this process, 128 per key in Redis)
//! follow the oldest that may be given back, that one leaves the log and
//! gives nothing back; a rate change empties the log, as does a pause (the
//! saved states do not hold them). Both err towards limiting. A cap on what
//! an upstream says is left (at most that many permits stored) is logged,
//! an entry of its own that nothing gives back, and replayed where it came:
//! after a give-back or a settle the limits store no more than the upstream
//! said was left, whether the cap took permits away at the time or not.
//! `Limits` (`src/core/limits.rs`) has the details.
//!
//! What the replay does not undo is a waiting caller's slot. The callers
//! behind a given-back reservation keep their moments, while the replay
//! charges them where it left room, and later callers are scheduled after
//! those charges: they can be given moments inside a waiting caller's real
//! slot. Giving back `A` while `B`, 50 permits at 1/s, waits behind it lets
//! a stream of later callers run through `B`'s moment, and a window around
//! it holds up to `B`'s permits more than the rate and the burst allow (the
//! long-run rate holds). Charging `B` at its real moment instead would free
//! nothing while anyone waits behind a given-back reservation; the limiter
//! frees the room, and the overlap is bounded by the permits of the callers
//! that wait behind it.
//!
//! # Rate changes
//!
//! `State::set_rate` ([`RateLimiter::set_rate`](crate::RateLimiter::set_rate))
//! resyncs at the old rate first, so time already passed is credited at the
//! rate that was in force. The debt already in the ticket is kept as is: the
//! next caller repays the previous request at the old rate, and only later
//! requests are charged at the new one. Stored permits are rescaled to the
//! same fraction of the new `max_permits`, but for the cases where the old
//! one was nothing to scale from: leaving an infinite rate, a bursty limiter
//! starts full and a warming-up one warm (nothing stored), and a warming-up
//! one whose old `max_permits` was 0 starts full (cold).
//!
//! # Numbers
//!
//! Time is integer microseconds, saturating at `MAX_MICROS` (2^53 µs, about
//! 285 years), the largest integer a double holds exactly, so that the Lua
//! mirror computes bit-for-bit the same values. Permit counts and intervals
//! are `f64`. The stable interval is capped at `MAX_MICROS` (slower rates all
//! mean "about never") and every quantity is kept finite, so no input produces
//! NaN or an overflow: `stable_interval_micros` rejects bad rates, anything
//! else saturates.
//!
//! # Exact at every rate
//!
//! A wait is whole microseconds, what a clock can sleep: the integer part of
//! the ticket. The ticket itself is finer: `next_free_micros` plus
//! `next_free_fraction`, in units of 2^-20 µs (about a picosecond).
//! `State::charge` rounds each reservation's floating-point cost to that unit
//! and adds it with the fraction, and a resync counts idle time from the
//! fractional ticket. So what one wait leaves out is carried to the next, and
//! the schedule never drifts: a saturated limiter's achieved rate is its
//! configured rate to the rounding of each cost to 2^-20 µs, within 0.01% for
//! one permit at a time up to 10^7 permits/s and for chunks of 64 or more up
//! to 10^9 permits/s (`tests/local/exactness.rs` runs 100 000 reservations at
//! each rate, with both policies and across a rate change). Truncating each
//! cost to whole microseconds instead, as the classic formulation does, runs
//! 11% fast at 300 000 permits/s and does not limit at all above 10^6
//! permits/s.
//!
//! Costs of 2^32 µs (about 71 minutes) or more are charged in whole
//! microseconds, truncated: that keeps every intermediate value of the charge
//! below 2^53, so exact in the Lua mirror's doubles, and at such costs a
//! microsecond is a rounding of under 10^-9.
//!
//! Two choices differ from the classic formulation: a zero warm-up period
//! limits like a bursty limiter with no burst (instead of producing NaN and
//! not limiting at all), and extreme rates saturate instead of overflowing.
