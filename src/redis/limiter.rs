//! [`RedisRateLimiter`]: the algorithm runs in Redis, the waiting here.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::failover::Failover;
use super::fallback::RedisStats;
use crate::clock::{Clock, SystemClock};
use crate::store::{Direct, NoKey, Store};
use crate::{Error, Reservation};

/// A rate limiter shared by every process that uses the same Redis key.
///
/// Each reservation is one round trip: an EVALSHA of the Lua script (`lua/`), which
/// runs the [core algorithm](crate::core) inside Redis on Redis's own clock
/// (`TIME`), so all callers share one schedule whatever their own clocks say.
/// The wait it returns is slept here, on the limiter's clock. Every call is
/// bounded by the response timeout; when Redis is unavailable the
/// [`Fallback`](super::Fallback) takes over until a probe sees Redis answer again.
///
/// The verbs and types are those of the local [`RateLimiter`](crate::RateLimiter), and it
/// implements [`Limiter`](crate::Limiter), so an `Arc<dyn Limiter>` can be
/// either.
///
/// ```no_run
/// use std::time::Duration;
/// use paceline::redis::{Fallback, RedisRateLimiter};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let client = paceline::redis::Client::open("redis://127.0.0.1:6379/")?;
/// let limiter = RedisRateLimiter::builder(client, "orders-api")
///     .permits_per_second(50.0)
///     .max_burst(Duration::from_secs(2))
///     .fallback(Fallback::Local)
///     .response_timeout(Duration::from_millis(200))
///     .build()
///     .await?;
/// limiter.acquire(1).await?;
/// if limiter.try_acquire(1, Duration::from_millis(50)).await? {
///     // go
/// }
/// # Ok(()) }
/// ```
pub struct RedisRateLimiter<C: Clock = SystemClock> {
    pub(crate) inner: Arc<Failover<NoKey, C>>,
}

/// # Reserving and waiting
///
/// Each method's one line on cancel safety is graded in the crate's
/// [cancel-safety table](crate#cancel-safety).
///
/// # Errors
/// Every method here returns [`Error::InvalidArgument`] if `permits` is 0,
/// and [`Error::Backend`] if Redis fails and the fallback is
/// [`FailClosed`](super::Fallback::FailClosed), or if the key holds
/// something this limiter did not write. The blocking forms also return
/// [`Error::InvalidArgument`] on the thread that drives the current-thread
/// runtime the limiter runs on (blocking it would stop that runtime).
impl<C: Clock> RedisRateLimiter<C> {
    pub(crate) fn from_arc(inner: Arc<Failover<NoKey, C>>) -> Self {
        RedisRateLimiter { inner }
    }

    /// The first attempt to reach Redis: a fresh connection and the
    /// script's probe on this limiter's key. On failure the limiter starts
    /// degraded (or, when `require` is set, building fails).
    pub(crate) async fn start(&self, require: bool) -> Result<(), Error> {
        let target = self.inner.target(&NoKey);
        self.inner.backend.start(require, target).await
    }

    /// Reserves `permits`; the wait before they may be used. Does not
    /// sleep; nothing gives the permits back.
    /// Cancel-safe: dropped in flight, what it reserved is given back.
    pub async fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        Store::reserve(&*self.inner, &NoKey, permits).await
    }

    /// Reserves `permits` if the wait fits in `timeout`; `None`, reserving
    /// nothing, otherwise. Does not sleep.
    /// Cancel-safe: dropped in flight, what it reserved is given back.
    pub async fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        Store::try_reserve(&*self.inner, &NoKey, permits, timeout).await
    }

    /// Reserves `permits` as a [`Reservation`]: wait for it, or drop it to
    /// give the permits back (one script call).
    /// Cancel-safe: dropped in flight, what it reserved is given back.
    pub async fn reservation(&self, permits: u32) -> Result<Reservation<'_>, Error> {
        Store::reservation(&*self.inner, &NoKey, permits).await
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`;
    /// `None`, reserving nothing, otherwise.
    /// Cancel-safe: dropped in flight, what it reserved is given back.
    pub async fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        Store::try_reservation(&*self.inner, &NoKey, permits, timeout).await
    }

    /// Reserves `permits` and sleeps for the wait; the time slept.
    /// Cancel-safe: dropped, in flight or asleep, it gives back what it
    /// took, so `tokio::time::timeout(d, limiter.acquire(n))` bounds a wait
    /// correctly.
    pub async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        Store::acquire(&*self.inner, &NoKey, permits).await
    }

    /// [`acquire`](Self::acquire) if the wait fits in `timeout`; `false` at
    /// once, reserving nothing, otherwise. Cancel-safe as `acquire`.
    pub async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Store::try_acquire(&*self.inner, &NoKey, permits, timeout).await
    }

    /// How long a request made now would wait; reserves nothing (never an
    /// argument error). Cancel-safe: it takes nothing.
    pub async fn available_in(&self) -> Result<Duration, Error> {
        Store::available_in(&*self.inner, &NoKey).await
    }

    /// [`acquire`](Self::acquire) on the calling thread. The round trip
    /// runs on the limiter's runtime (its own if built with
    /// [`build_blocking`](super::RedisBuilder::build_blocking)); it works
    /// from a plain thread, from `spawn_blocking` and from a task of a
    /// multi-thread runtime.
    pub fn acquire_blocking(&self, permits: u32) -> Result<Duration, Error> {
        Store::acquire_blocking(&*self.inner, &NoKey, permits)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    pub fn try_acquire_blocking(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Store::try_acquire_blocking(&*self.inner, &NoKey, permits, timeout)
    }
}

/// # Rate and health
impl<C: Clock> RedisRateLimiter<C> {
    /// Changes the rate from now on, for every process sharing the key: the
    /// next reservation carries it to Redis, which rescales the stored
    /// permits. (Processes that still pass the old rate change it back on
    /// their next call: give them all the same rate.) With several limits,
    /// this is the first one's rate and the others scale alike, as
    /// [`RateLimiter::set_rate`](crate::RateLimiter::set_rate) does.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        self.inner.set_rate(permits_per_second)
    }

    /// Changes the rate of limit `index` alone (counted from 0 in the order
    /// the builder was given them), from now on, as `set_rate` does for
    /// all. On a limiter with one limit, index 0 is `set_rate`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN, or
    /// there is no limit `index`.
    pub fn set_limit_rate(&self, index: usize, permits_per_second: f64) -> Result<(), Error> {
        self.inner.set_limit_rate(index, permits_per_second)
    }

    /// The stable rate, in permits per second.
    pub fn rate(&self) -> f64 {
        self.inner.rate()
    }

    /// Whether calls are being served by the fallback because Redis is
    /// unavailable.
    pub fn is_degraded(&self) -> bool {
        self.inner.is_degraded()
    }

    /// Health counters: fallbacks, recoveries, calls served by the
    /// fallback. They are the backend's: a limiter sharing a
    /// [`RedisBackend`](super::RedisBackend) sees the counts of all its
    /// limiters. `degraded` is this limiter's, as [`is_degraded`](Self::is_degraded).
    pub fn stats(&self) -> RedisStats {
        RedisStats {
            degraded: self.is_degraded(),
            ..self.inner.backend.health.stats()
        }
    }

    /// The Redis key holding this limiter's state: `paceline:{name}`, with
    /// `\` and `:` in the name escaped as `\\` and `\:` (so that it is no
    /// keyed limiter's key; see
    /// [`KeyedRedisRateLimiter::redis_key`](super::KeyedRedisRateLimiter::redis_key)).
    pub fn key(&self) -> &str {
        self.inner.describe()
    }
}

impl<C: Clock> Direct for RedisRateLimiter<C> {
    type Store = Failover<NoKey, C>;

    fn store(&self) -> &Self::Store {
        &self.inner
    }
}

impl<C: Clock> fmt::Debug for RedisRateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("key", &self.key())
            .field("rate", &self.rate())
            .field("fallback", &self.inner.fallback)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
