//! The distributed limiter: one rate shared by every process that uses the
//! same Redis key.
//!
//! [`RedisRateLimiter`] runs the [core algorithm](crate::core) as a Lua
//! script inside Redis (`lua/reserve.lua`, a line-by-line mirror of
//! `src/core`), on Redis's own clock, in one round trip per reservation. The
//! limiter's state is one key, `throttler:{name}` (a 76-byte string with a
//! format marker), so it works the same on a single server and on Redis
//! Cluster. The key expires only once an idle limiter would have refilled
//! anyway, so expiry is invisible; a missing key reads as a limiter that
//! has been idle for a long time (full for the bursty policy, cold for the
//! warming-up one).
//!
//! Each limiter built with [`RedisRateLimiter::builder`] has a connection
//! of its own. Many limiters (one per API, per queue, ...) can share one
//! instead: build a [`RedisBackend`] once, then limiters from it with
//! [`RedisBackend::limiter`], which does no I/O. They share its connection,
//! its health and its probe.
//!
//! When Redis is unreachable, too slow (see
//! [`response_timeout`](RedisBuilder::response_timeout)) or failing, the
//! [`Fallback`] decides: limit locally (the default), grant, or refuse.
//!
//! ```no_run
//! use std::time::Duration;
//! use throttler::redis::{Fallback, RedisRateLimiter};
//!
//! // A program with no async runtime at all:
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let limiter = RedisRateLimiter::builder(client, "batch")
//!     .permits_per_second(5.0)
//!     .fallback(Fallback::FailClosed)
//!     .build_blocking()?;
//! for _item in 0..10 {
//!     limiter.acquire_blocking(1)?;
//!     // process it
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod backend;
mod builder;
mod connection;
mod failover;
mod fallback;
mod health;
mod keyed;
mod limiter;
mod naming;
mod round_trip;
mod script;
mod shared;

pub use builder::{DEFAULT_PROBE_INTERVAL, DEFAULT_RESPONSE_TIMEOUT, KEY_PREFIX, RedisBuilder};
pub use fallback::{Fallback, RedisStats};
pub use keyed::{DEFAULT_MAX_LOCAL_KEYS, KeyedRedisRateLimiter, RedisKeyedBuilder};
pub use limiter::RedisRateLimiter;
pub use script::Token;
pub use shared::{RedisBackend, RedisBackendBuilder, RedisLimiterBuilder};
