//! Pacing calls to someone else's rate-limited API: costs settled once the
//! answer says what a call cost, and the upstream's limit learned from its
//! answers.
//!
//! A client that calls an upstream with limits of its own (requests and tokens
//! per minute, say) reserves each call's estimate with
//! [`RateLimiter::call`](crate::RateLimiter::call) (or
//! [`KeyedRateLimiter::call`](crate::KeyedRateLimiter::call), one key per
//! upstream), sends it once the [`Call`] is returned, then settles its real
//! cost and feeds the answer back ([`Call::finish`], with the [`Feedback`]
//! read from its status and headers; [`Call::settle`] and [`Call::learn`]
//! each alone).
//!
//! What the limiter does with the [`Feedback`] ([`Feedback::from_headers`]
//! lists the headers read) is [`Learning`]'s policy (the numbers are its
//! defaults):
//!
//! * a refusal (429, or 503 with `Retry-After`) pauses every caller until
//!   its `Retry-After`: those that reserve after it, and those already
//!   waiting in `acquire`, `try_acquire`, `call` or `try_call` (and the
//!   blocking forms) whose moment falls inside the pause: as they wake,
//!   they reserve again behind it (a `try_` whose timeout the pause
//!   outlasts then returns `false` or `None`), what they reserved first
//!   staying spent, erring towards limiting. Through Redis a caller that
//!   waited asks the key's status as it wakes (one round trip), once its
//!   limiter has called an upstream or learned anything. A
//!   [`Reservation`](crate::Reservation) waited on by its holder keeps its
//!   moment. The refusal also multiplies the rates by 0.7 (once
//!   per pause: not for a call that went before the last pause ended,
//!   however late its refusal comes back; down to 0.05 of the configured
//!   rates) unless the same answer
//!   reports the rate of every limit (the limiter runs under those already:
//!   the refusal came from a burst, and the pause is enough); after the pause
//!   the callers go one interval apart, never as a burst;
//! * each second of successes (`2xx` statuses) after the pause adds back 0.05
//!   of the configured rates, up to them (successes of calls that went
//!   after it: one that went before it ended answers the load the refusal
//!   answered, and raises nothing, however late it comes back);
//! * a rate the upstream reports for a limit (a quota over its window, read as
//!   at least one a day) caps that limit at 0.97 of it, never above the
//!   configured rate; a limit it reports spent (`remaining` 0) waits for its
//!   reset (at most a day; with no reset given, it stores nothing), and one
//!   with `n` left lets no more than `n` go at once (nor after a call
//!   settled or a reservation given back later): it stores `n - 1`, beside
//!   the one request that goes whenever nothing is owed; with none left and
//!   no reset, it stores nothing and one goes (the upstream's answer to it
//!   teaches the rest). A
//!   warming-up limit's stored permits make it slower, not faster, so
//!   neither a pause nor what is left takes them away: "none left" never
//!   warms a cold limit up. A cap stays until the upstream reports another: successes that report
//!   nothing do not lift it;
//! * a rate that changes leaves what was charged as it is (as
//!   [`set_rate`](crate::RateLimiter::set_rate) does): a request charged at
//!   a rate the upstream reported absurdly low (one a day) holds the
//!   callers after it that long over the margin and the factor (up to
//!   20.6 days, at the default margin of 0.97 and a factor refusals
//!   brought down to the default floor of 0.05), even if the next answer
//!   corrects the rate. (Repricing what was charged cannot tell the last request's cost
//!   from a pause or from a cost charged at another rate; it let callers
//!   go ten times too fast.)
//!
//! Estimates: what a call costs past its estimate is always charged, and what
//! it costs less is given back while the limiter's log still holds the call
//! ([`Call::settle`]). What is given back frees room after the calls
//! already waiting, which keep their moments: with many callers waiting, an
//! estimate well above the real cost holds the throughput under the rate
//! (at four times the cost, about 0.6 of it with 16 waiting), so estimate
//! near the cost or low; with more callers waiting on one key than the log
//! holds, low: the excess is charged when the answer says it.
//!
//! The upstream's names for its limits (`requests`, `tokens`) reach the limits
//! [named](crate::Limit::named) so; what it reports without a name reaches the
//! first unnamed limit. Through Redis, what a limiter learns lives in the key
//! it shares: one refusal seen by one worker slows the whole fleet, and a new
//! worker starts at the learned rate. What a key learned lives as long as the
//! key: one left idle until it reads as full again (its Redis key expires; a
//! keyed limiter in this process forgets it) starts again at the configured
//! rates, and learns again from the next answers.
//!
//! # Calls in flight
//!
//! An upstream that also caps how many requests it serves at once gets a
//! [`Limit::concurrent(k)`](crate::Limit::concurrent) beside its rates: "N per
//! second *and* k at once" (what a *slot* is, and what holds one: there). In
//! this process, calls waiting for a slot are served first come, first
//! served: a slot given back is kept for the call that has waited longest,
//! for 50 ms, and a new call (the one that gave it back included) waits
//! behind them. A waiter that gives up takes none, and one that does not
//! take its slot in those 50 ms (parked, forgotten, or not run) loses its
//! turn: the slot is free to the first call that looks, every waiter woken
//! to look (by a thread of the crate's, started the first time a slot is
//! kept and asleep while none is, if no call comes). All or
//! nothing: a [`try_call`](crate::RateLimiter::try_call) that cannot have both
//! within its timeout (one timeout for the two) takes neither, and a slot
//! taken and then refused by the schedule goes back at once.
//! [`Stats::in_flight`](crate::Stats) counts the calls holding a slot. A keyed
//! limiter has `k` slots per key, and holds nothing for a key with no call
//! holding or waiting for one. A call dropped while its request is out
//! (a caller's timeout) frees its slot at once, though the upstream may
//! still be serving it: with `k` matching an upstream's own bound, time
//! calls out no sooner than the upstream answers, or set `k` lower.
//!
//! ```
//! use std::time::Duration;
//! use paceline::{Limit, RateLimiter};
//! use paceline::clock::FakeClock;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline::Error> {
//! // 10 requests a second, and 2 at once.
//! let limiter = RateLimiter::builder()
//!     .limit(Limit::per_second(10.0))
//!     .limit(Limit::concurrent(2))
//!     .clock(FakeClock::new())
//!     .build()?;
//! let first = limiter.call(1).await?;
//! let second = limiter.call(1).await?;
//! // Both slots are taken: a third would wait (this one does not).
//! assert!(limiter.try_call(1, Duration::ZERO).await?.is_none());
//! assert_eq!(limiter.stats().in_flight, 2);
//! drop(first); // its answer is back: its slot is free
//! assert!(limiter.try_call(1, Duration::ZERO).await?.is_some());
//! # drop(second);
//! # Ok(()) }
//! ```
//!
//! **Through Redis** the slots are shared by every process that uses the
//! limiter (per key, for a keyed one): each is a lease in a sorted set beside
//! the limiter's key (`{paceline:v1:name}\slots`, in its cluster slot), taken
//! and released by a script of its own on Redis's clock. A call's lease is
//! renewed while the call lasts and released in the background as soon as it
//! is dropped; the leases of a process that dies holding them come back after
//! the [slot TTL](crate::Builder::slot_ttl) (30 s by default), not before.
//! Calls waiting for a slot stand in a line in Redis, served first come,
//! first served across processes: a worker that gives its slot back and
//! asks again goes behind them. A waiting call polls Redis, after pauses
//! that double up to 200 ms, shorter the nearer it is to the front (a slot
//! freed in another process waits for the first in line up to 5 ms, or a
//! tenth of how long that call has been first) and cut short by a release in
//! its own process; one that has not asked for 500 ms (its process died,
//! or its future lies unpolled) loses its place, and one that cannot wait
//! (a zero timeout) takes no place.
//! While Redis is down the [`Fallback`](crate::redis::Fallback) decides, as
//! for the rates: `Local` gives each key `max(1, ⌊k × local_fraction⌋)` slots
//! in this process, `FailOpen` takes none (calls go unbounded), `FailClosed`
//! fails the call. A slot taken from the fallback stays there until its call
//! ends, unseen by Redis; a call still waiting for one when Redis comes back
//! asks Redis instead. The fallback's slots count only the calls it lets
//! in: the calls that held leases when Redis went down go on, so the fleet
//! may have `k` and every process's share in flight while Redis is down,
//! and as many after it until the fallback's calls end (Redis does not see
//! them); after a restart that lost the leases, Redis sees neither those
//! nor the fallback's calls and grants `k` more: up to `2k` and every
//! process's share until the older calls end (three processes sharing
//! `Limit::concurrent(4)` at a `local_fraction` of a third, 4 + 3 + 4 = 11).
//!
//! What an answer teaches while Redis is down: `Local` learns it in the
//! fallback and carries a refusal's pause back to Redis at its length (the
//! callers waiting in it, here, still go behind it); failing closed or
//! open, a call made in Redis has Redis learn what it teaches once Redis is
//! back (with what is left of its waits), and the calls `FailOpen` lets
//! through meanwhile teach nothing (they are not paced either).

mod call;
mod feedback;
#[cfg(feature = "internals")]
mod hooks;
#[cfg(feature = "http")]
mod layer;
mod lesson;
mod slots;

pub use crate::core::Learning;
pub use call::Call;
pub use feedback::{Feedback, Quota};
#[cfg(feature = "http")]
pub use layer::{Actual, Estimate, Estimated, Outbound, OutboundFuture, OutboundLayer, Unit};
#[cfg(feature = "redis")]
pub(crate) use slots::Taken;
pub(crate) use slots::{InFlight, LocalSlots, Slot, TakeSlot};

/// What a limiter knows of the upstream it paces calls to: how it learns, and
/// which of its limits each of the upstream's is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Upstream {
    pub(crate) learning: Learning,
    /// Each limit's name, in order (`None`: unnamed).
    pub(crate) names: Box<[Option<Box<str>>]>,
}
