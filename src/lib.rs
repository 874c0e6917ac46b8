//! Smooth, reservation-based rate limiting, in one process or shared by many.
//!
//! `paceline` paces work at a steady rate: calls to a rate-limited API, a
//! batch job's throughput, requests that may wait at most so long for their
//! turn. A caller awaits ([`RateLimiter::acquire`]) or blocks
//! ([`RateLimiter::acquire_blocking`]) until its permits are due, or asks
//! whether they would be due within a timeout ([`RateLimiter::try_acquire`]).
//!
//! A request goes as soon as the previous caller's debt is paid and charges
//! its own cost to the next caller; idle time is saved as *stored permits*,
//! which are free (the bursty policy) or expensive (the warming-up policy, for
//! resources that are slow when cold). [`design`] explains the algorithm
//! in full.
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use paceline::RateLimiter;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline::Error> {
//! let limiter = RateLimiter::bursty(50.0)?; // 50 permits per second
//!
//! limiter.acquire(1).await?; // async: waits for its turn
//!
//! // Blocking: the same on a plain thread (never in async code, whose
//! // thread it would hold for the wait).
//! std::thread::scope(|s| s.spawn(|| limiter.acquire_blocking(1)).join().unwrap())?;
//!
//! // At most 20 ms of waiting, or give up without reserving anything.
//! if !limiter.try_acquire(1, Duration::from_millis(20)).await? {
//!     // throttled: shed the request, reply 429, ...
//! }
//!
//! // After a pause, start slow and reach 50/s within 3 seconds.
//! let warm = RateLimiter::builder()
//!     .permits_per_second(50.0)
//!     .warmup(Duration::from_secs(3))
//!     .build()?;
//! warm.acquire(1).await?;
//! # Ok(()) }
//! ```
//!
//! # One rate per user
//!
//! [`KeyedRateLimiter`] holds one limiter per key, with memory that follows
//! the active keys (and an optional hard cap):
//!
//! ```
//! use std::time::Duration;
//! use paceline::KeyedRateLimiter;
//!
//! let per_user = KeyedRateLimiter::<String>::bursty(5.0)?; // 5/s per user
//! assert!(per_user.try_reserve("alice", 1, Duration::ZERO)?.is_some());
//! # Ok::<(), paceline::Error>(())
//! ```
//!
//! # Several limits at once
//!
//! A limiter built with several [`Limit`]s lets a request go when every one of
//! them allows it, charges it to all of them, charges none for a refused try,
//! and gives a dropped reservation back to all of them, exactly. A
//! [`Reservation`] names the limit it waits for. The [`Builder`] takes
//! `.limit()` for every limiter, the Redis ones too (up to 16): all the
//! limits of a key then live in one Redis value, updated by one call.
//!
//! ```
//! use std::time::Duration;
//! use paceline::{KeyedRateLimiter, Limit, RateLimiter};
//!
//! let api = RateLimiter::builder()
//!     .limit(Limit::per_second(10.0).burst(20))
//!     .limit(Limit::per(1000.0, Duration::from_secs(3600)))
//!     .build()?;
//! assert!(api.try_reserve(1, Duration::ZERO)?.is_some());
//! let per_user = KeyedRateLimiter::<String>::builder()
//!     .limit(Limit::per_second(5.0))
//!     .limit(Limit::per(10_000.0, Duration::from_secs(86_400)))
//!     .build()?;
//! assert!(per_user.try_reserve("alice", 1, Duration::ZERO)?.is_some());
//! # Ok::<(), paceline::Error>(())
//! ```
//!
//! # Calls to someone else's API
//!
//! A client of an upstream with limits of its own reserves each call's
//! estimated [`Cost`] (one per limit: a request and its tokens), and once the
//! answer is back feeds it to the [`outbound::Call`] and settles the real
//! cost. The limiter learns the upstream's limit from its answers
//! ([`outbound`]).
//!
//! ```
//! use std::time::Duration;
//! use paceline::{Cost, Limit, RateLimiter};
//! use paceline::outbound::Feedback;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), paceline::Error> {
//! let llm = RateLimiter::builder()
//!     .limit(Limit::per(3_500.0, Duration::from_secs(60)).named("requests"))
//!     .limit(Limit::per(90_000.0, Duration::from_secs(60)).named("tokens"))
//!     .build()?;
//! let call = llm.call(Cost::each([1, 800])).await?; // waits for its turn
//! // ... send it; the answer says 429, come back in 2 s, and cost no tokens.
//! let answer = Feedback::new(429).with_retry_after(Duration::from_secs(2));
//! call.finish(&answer, Cost::each([1, 0]))?;
//! assert!(llm.snapshot()?.wait() > Duration::from_secs(1)); // every caller waits
//! # Ok(()) }
//! ```
//!
//! # Testing code that uses a limiter
//!
//! Limiters read time from a [`Clock`](clock::Clock). Give them a
//! [`FakeClock`](clock::FakeClock) and time moves only when you say so or when
//! the limiter sleeps (which then returns at once), so tests are exact and
//! instant:
//!
//! ```
//! use std::time::Duration;
//! use paceline::RateLimiter;
//! use paceline::clock::FakeClock;
//!
//! let clock = FakeClock::new();
//! let limiter = RateLimiter::builder()
//!     .permits_per_second(5.0)
//!     .clock(clock.clone())
//!     .build()?;
//! assert_eq!(limiter.acquire_blocking(1)?, Duration::ZERO);
//! assert_eq!(limiter.acquire_blocking(1)?, Duration::from_millis(200));
//! assert_eq!(limiter.acquire_blocking(1)?, Duration::from_millis(200));
//! # Ok::<(), paceline::Error>(())
//! ```
//!
//! # Cancel safety
//!
//! Every async method is cancel-safe: dropping its future gives back what it
//! had taken, so `tokio::time::timeout(d, limiter.acquire(n))` is a correct
//! way to bound a wait. Dropping a [`Reservation`] before its moment gives its
//! permits back too; [`Reservation::keep`] keeps them. How exactly a give-back
//! restores the schedule depends on the limiter:
//!
//! | Limiter, methods | A give-back is | Errs towards limiting when |
//! |---|---|---|
//! | [`RateLimiter`], [`KeyedRateLimiter`], one limit or several, either policy: `acquire`, `try_acquire`, a [`Reservation`] | exact, however many are given back, in any order: the limits (a key's) are replayed without it from a log of up to 1 024 requests since the oldest that may be given back, and hold what they would had it never been made | more requests came since the oldest that may be given back (it then gives nothing back); a rate changed meanwhile |
//! | Redis limiters, one limit or several, either policy: `acquire`, `try_acquire`, a [`Reservation`] | exact, as locally, from a log of up to 128 requests per key | more came since it; a rate changed meanwhile; the give-back reaches Redis after its moment, or not at all (Redis down) |
//! | Redis limiters: a round trip dropped in flight, or past the response timeout | the reply is awaited in the background (up to 30 s) and what it reserved given back, as above | as above; the reply comes later than that, or Redis is down |
//! | Redis limiters: `reserve`, `try_reserve` (a wait, not a handle), dropped in flight | not given back: only a reservation with a handle is logged for a give-back | always: its permits stay charged |
//! | Redis limiters on their local fallback | as [`KeyedRateLimiter`] | the key was carried back to Redis meanwhile: the give-back is lost, the permits stay charged |
//! | `call`, `try_call` (dropped before the [`outbound::Call`] is returned) | as `acquire`: the estimate is given back | as `acquire` |
//! | `acquire`, `try_acquire`, `call`, `try_call` woken inside a refusal's pause (see [`outbound`]) | what it reserves again behind the pause, as above | always for what it reserved before the pause: spent, as the pause emptied the log |
//! | an [`outbound::Call`] dropped or settled | not a give-back: a dropped call ends at its estimate, a settled one at its real cost, exactly while the log holds it | more requests than the log holds came since, or a rate changed or was learned meanwhile: a larger cost is charged at once, a smaller one gives nothing back |
//! | Slots of a [`Limit::concurrent`] (`call`, `try_call`) | a call dropped while it waits for a slot takes none, and one parked or forgotten loses its turn 50 ms after a slot is kept for it (the slot is then free to the first call that looks, every waiter woken); a slot taken goes back when the call's future or its [`Call`](outbound::Call) is dropped (through Redis, its lease is released in the background) | through Redis: the release is lost (Redis down, or a reply lost with its connection): the lease stays until its TTL |
//! | [`stream`] adapters | a dropped stream gives its item's pending permits back, as a dropped `acquire` does | as its limiter |
//! | `tower` layers (and the `http` one) | a service dropped while its permit's wait is pending gives it back, as a dropped `acquire` does; a response future dropped while it waits (the keyed layers) gives its request's permit back | always for a permit already due that no `call` used: spent |
//! | [`io`] reader and writer | a dropped call leaves its pending chunk with the reader or writer for the next call; dropping the reader or writer gives its permits back, as a dropped `acquire` does | as its limiter |
//!
//! `snapshot` changes nothing. The `_blocking` methods are not futures:
//! nothing cancels them.
#![warn(missing_docs)]
// A method that returns its receiver changed (a builder step, an option
// set on a copy) does nothing if its value is dropped.
#![warn(clippy::return_self_not_must_use)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(docsrs, doc(auto_cfg(hide(feature = "internals"))))]
#![forbid(unsafe_code)]

mod builder;
pub mod clock;
// Public only with the hidden feature `internals`, for the crate's own model
// tests.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod core;
#[cfg(not(feature = "internals"))]
mod core;
pub mod design;
mod error;
#[cfg(feature = "http")]
pub mod http;
pub mod io;
mod keyed;
mod limiter;
mod local;
mod meter;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
pub mod outbound;
#[cfg(feature = "redis")]
pub mod redis;
mod reservation;
mod store;
pub mod stream;
#[cfg(feature = "tower")]
pub mod tower;

/// The attribute the [`Limiter`] and [`KeyedLimiter`] traits are written
/// with: put it on an impl of either (see "A limiter of your own" there).
#[doc(no_inline)]
pub use async_trait::async_trait;
pub use builder::{Builder, DEFAULT_COLD_FACTOR, Limit};
pub use core::{Cost, Snapshot};
pub use error::{BackendError, Error};
pub use limiter::{
    Key, KeyedLimiter, KeyedRateLimiter, Keys, Limiter, Local, NoKey, Pacer, PerKey, RateLimiter,
    Stats, Store,
};
pub use reservation::Reservation;
