//! The traits every limiter implements, in this process or shared through
//! Redis, so that code can hold an `Arc<dyn Limiter>` and not care which:
//! each implemented once, over the [engine](crate::store) under the
//! limiter.

use std::time::Duration;

use async_trait::async_trait;

use super::{Key, KeyedRateLimiter, Pacer, RateLimiter, Store};
use crate::clock::Clock;
use crate::store::{self, Engine, OnlyKey};
use crate::{Error, Reservation, Snapshot, Stats};

/// A rate limiter, in this process or shared through a backend.
///
/// Implementors provide the reservations; waiting is provided on top of them,
/// sleeping on the limiter's [`clock`](Limiter::clock). The trait is object
/// safe, so code can hold an `Arc<dyn Limiter>` and not care which kind it
/// has.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use paceline::{Limiter, RateLimiter};
///
/// async fn send_all(limiter: Arc<dyn Limiter>, messages: &[&str]) -> Result<(), paceline::Error> {
///     for _message in messages {
///         limiter.acquire(1).await?;
///         // send it
///     }
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline::Error> {
/// let limiter: Arc<dyn Limiter> = Arc::new(RateLimiter::bursty(1000.0)?);
/// send_all(limiter, &["a", "b"]).await?;
/// # Ok(()) }
/// ```
///
/// # A limiter of your own
///
/// Implement the required methods under [`async_trait`](crate::async_trait)
/// (re-exported by this crate): the waiting methods are provided on top of
/// them, and the crate's adapters take it as they take its own limiters.
///
/// ```
/// use std::time::Duration;
/// use paceline::clock::{Clock, SystemClock};
/// use paceline::{Error, Limiter, Snapshot, async_trait};
///
/// /// Lets everything through at once.
/// struct Unlimited(SystemClock);
///
/// #[async_trait]
/// impl Limiter for Unlimited {
///     async fn reserve(&self, _permits: u32) -> Result<Duration, Error> {
///         Ok(Duration::ZERO)
///     }
///     async fn try_reserve(&self, _: u32, _: Duration) -> Result<Option<Duration>, Error> {
///         Ok(Some(Duration::ZERO))
///     }
///     async fn snapshot(&self) -> Result<Snapshot, Error> {
///         Ok(Snapshot::waiting(Duration::ZERO, f64::INFINITY))
///     }
///     fn set_rate(&self, _: f64) -> Result<(), Error> {
///         Ok(())
///     }
///     fn rate(&self) -> f64 {
///         f64::INFINITY
///     }
///     fn clock(&self) -> &dyn Clock {
///         &self.0
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let limiter = Unlimited(SystemClock::new());
/// assert_eq!(limiter.acquire(5).await?, Duration::ZERO);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Limiter: Send + Sync {
    /// Reserves `permits` now and returns the wait before they may be used.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe for this crate's limiters: a future dropped before its
    /// Redis round trip is sent reserves nothing; one dropped after stays
    /// charged (only a [`reservation`](Self::reservation) is given back).
    /// Once it has returned, the permits are the caller's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; a backend's errors.
    async fn reserve(&self, permits: u32) -> Result<Duration, Error>;

    /// Reserves `permits` if the wait fits in `timeout` and returns it;
    /// returns `None`, reserving nothing, otherwise. Cancel-safe as
    /// [`reserve`](Self::reserve).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; a backend's errors.
    async fn try_reserve(&self, permits: u32, timeout: Duration)
    -> Result<Option<Duration>, Error>;

    /// What the limiter holds now, read without reserving: how many
    /// requests would go at once, the wait, the rate and the burst (see
    /// [`Snapshot`]). A Redis limiter reads it in one round trip, on the
    /// server's clock; with several limits, it is the binding limit's.
    ///
    /// Its [`wait`](Snapshot::wait) is how long a request made now would
    /// wait (for a `Retry-After` header, say). A limiter that knows only
    /// that can answer [`Snapshot::waiting`]. Cancel-safe: it reserves
    /// nothing.
    ///
    /// # Errors
    /// A backend's errors.
    async fn snapshot(&self) -> Result<Snapshot, Error>;

    /// Changes the rate.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error>;

    /// The stable rate, in permits per second, as this process knows it
    /// without I/O (of the first limit, with several): a `RateLimiter` in
    /// this process runs at it, what it learned from an upstream included;
    /// through Redis it is the rate set, and what the limiter learned is
    /// read with [`snapshot`](Limiter::snapshot).
    fn rate(&self) -> f64;

    /// The slowest of its limits' stable rates, in permits per second, as
    /// [`rate`](Limiter::rate) reads them: the rate it sustains, and what
    /// [`io`](crate::io) sizes its chunks by. Provided: `rate`, for a
    /// limiter with one limit.
    fn slowest_rate(&self) -> f64 {
        self.rate()
    }

    /// The clock waits are slept on.
    fn clock(&self) -> &dyn Clock;

    /// How the limiter is served and what it dropped (see [`Stats`]): for
    /// a Redis limiter, whether it is on its fallback now. Provided: all
    /// zero, for a limiter with nothing to count.
    fn stats(&self) -> Stats {
        Stats::default()
    }

    /// Takes `permits` if they are free now (nothing owed), without waiting
    /// and without I/O: `Some(Ok(true))` if taken (nothing to wait for, so
    /// nothing to give back), `Some(Ok(false))` if they are not free
    /// (nothing reserved), `None` if this limiter cannot tell without a
    /// round trip. The in-process limiters answer (the adapters use it to
    /// let a request through with no future when nothing is owed); a Redis
    /// limiter, and by default a limiter of your own, answers `None`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    #[must_use = "dropped, it does not say whether the permits were taken"]
    fn take_now(&self, permits: u32) -> Option<Result<bool, Error>> {
        let _ = permits;
        None
    }

    /// [`snapshot`](Self::snapshot) if this limiter can read it without
    /// I/O; `None` otherwise (a Redis limiter, and by default a limiter of
    /// your own).
    fn snapshot_now(&self) -> Option<Snapshot> {
        None
    }

    /// Reserves `permits` now as a [`Reservation`]: wait for it, or drop it
    /// to give the permits back.
    ///
    /// Provided: a [`reserve`](Limiter::reserve) whose permits cannot be
    /// given back. The limiters of this crate give them back.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe for this crate's limiters: a future dropped before it
    /// returns reserves nothing; the [`Reservation`] it returns gives its
    /// permits back when dropped ([how exactly](crate#cancel-safety)).
    ///
    /// # Errors
    /// As [`reserve`](Limiter::reserve).
    async fn reservation(&self, permits: u32) -> Result<Reservation<'_>, Error> {
        let wait = self.reserve(permits).await?;
        Ok(Reservation::without_give_back(wait, self.clock()))
    }

    /// [`reservation`](Limiter::reservation) if the permits can be used
    /// within `timeout`; `None`, reserving nothing, otherwise. Cancel-safe
    /// as [`reservation`](Self::reservation).
    ///
    /// # Errors
    /// As [`try_reserve`](Limiter::try_reserve).
    async fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        let wait = self.try_reserve(permits, timeout).await?;
        Ok(wait.map(|wait| Reservation::without_give_back(wait, self.clock())))
    }

    /// Reserves `permits` and sleeps for the wait; returns the time slept.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe for this crate's limiters: dropping the future gives back
    /// what it had taken, so `tokio::time::timeout(d, limiter.acquire(n))`
    /// bounds a wait correctly. How exactly, per limiter: the crate's
    /// [cancel-safety table](crate#cancel-safety).
    ///
    /// # Errors
    /// As [`reserve`](Limiter::reserve).
    async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        Ok(self.reservation(permits).await?.wait().await)
    }

    /// Acquires `permits` if the wait fits in `timeout`, sleeping for it;
    /// returns `false` at once, reserving nothing, otherwise (and, on this
    /// crate's limiters, later if a refusal learned while it waited pauses
    /// the limiter past `timeout`: see [`outbound`](crate::outbound)).
    /// Cancel-safe as [`acquire`](Limiter::acquire).
    ///
    /// # Errors
    /// As [`try_reserve`](Limiter::try_reserve).
    async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Ok(
            crate::reservation::wait_if_granted(self.try_reservation(permits, timeout).await?)
                .await,
        )
    }
}

/// A limiter with one rate per key, in this process or shared through a
/// backend: [`Limiter`](crate::Limiter) with a key in front of every call.
///
/// Object safe, so code can hold an `Arc<dyn KeyedLimiter<K>>`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use paceline::{KeyedLimiter, KeyedRateLimiter};
///
/// async fn admit(limiter: &dyn KeyedLimiter<String>, user: &String) -> Result<bool, paceline::Error> {
///     limiter.try_acquire(user, 1, Duration::from_millis(50)).await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline::Error> {
/// let limiter: Arc<dyn KeyedLimiter<String>> = Arc::new(KeyedRateLimiter::bursty(5.0)?);
/// assert!(admit(&*limiter, &"alice".to_owned()).await?);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait KeyedLimiter<K: Sync>: Send + Sync {
    /// [`Limiter::reserve`] for `key`.
    ///
    /// # Errors
    /// As [`Limiter::reserve`].
    async fn reserve(&self, key: &K, permits: u32) -> Result<Duration, Error>;

    /// [`Limiter::try_reserve`] for `key`.
    ///
    /// # Errors
    /// As [`Limiter::try_reserve`].
    async fn try_reserve(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error>;

    /// [`Limiter::snapshot`] for `key`; a key not held reads as a new key
    /// would.
    ///
    /// # Errors
    /// A backend's errors.
    async fn snapshot(&self, key: &K) -> Result<Snapshot, Error>;

    /// Changes the rate of every key.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error>;

    /// The stable rate of every key, in permits per second, as last set:
    /// what a key learned from an upstream is its own, read with
    /// [`snapshot`](KeyedLimiter::snapshot).
    fn rate(&self) -> f64;

    /// [`Limiter::slowest_rate`], of every key. Provided: `rate`.
    fn slowest_rate(&self) -> f64 {
        self.rate()
    }

    /// The clock waits are slept on.
    fn clock(&self) -> &dyn Clock;

    /// [`Limiter::stats`], over every key.
    fn stats(&self) -> Stats {
        Stats::default()
    }

    /// [`Limiter::take_now`] for `key`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    #[must_use = "dropped, it does not say whether the permits were taken"]
    fn take_now(&self, key: &K, permits: u32) -> Option<Result<bool, Error>> {
        let _ = (key, permits);
        None
    }

    /// [`Limiter::snapshot_now`] for `key`.
    fn snapshot_now(&self, key: &K) -> Option<Snapshot> {
        let _ = key;
        None
    }

    /// [`Limiter::reservation`] for `key` (provided the same way).
    ///
    /// # Errors
    /// As [`reserve`](KeyedLimiter::reserve).
    async fn reservation(&self, key: &K, permits: u32) -> Result<Reservation<'_>, Error> {
        let wait = self.reserve(key, permits).await?;
        Ok(Reservation::without_give_back(wait, self.clock()))
    }

    /// [`Limiter::try_reservation`] for `key`.
    ///
    /// # Errors
    /// As [`try_reserve`](KeyedLimiter::try_reserve).
    async fn try_reservation(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        let wait = self.try_reserve(key, permits, timeout).await?;
        Ok(wait.map(|wait| Reservation::without_give_back(wait, self.clock())))
    }

    /// [`Limiter::acquire`] for `key`.
    ///
    /// # Errors
    /// As [`reserve`](KeyedLimiter::reserve).
    async fn acquire(&self, key: &K, permits: u32) -> Result<Duration, Error> {
        Ok(self.reservation(key, permits).await?.wait().await)
    }

    /// [`Limiter::try_acquire`] for `key`.
    ///
    /// # Errors
    /// As [`try_reserve`](KeyedLimiter::try_reserve).
    async fn try_acquire(&self, key: &K, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Ok(
            crate::reservation::wait_if_granted(self.try_reservation(key, permits, timeout).await?)
                .await,
        )
    }
}

#[async_trait]
impl<S: Store, C: Clock> Limiter for RateLimiter<S, C> {
    async fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        store::reserve(&self.engine, &OnlyKey, permits).await
    }

    async fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        store::try_reserve(&self.engine, &OnlyKey, permits, timeout).await
    }

    async fn snapshot(&self) -> Result<Snapshot, Error> {
        self.engine.snapshot(&OnlyKey).await
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        Pacer::set_rate(self, permits_per_second)
    }

    fn rate(&self) -> f64 {
        Pacer::rate(self)
    }

    fn slowest_rate(&self) -> f64 {
        Pacer::slowest_rate(self)
    }

    fn clock(&self) -> &dyn Clock {
        Pacer::clock(self)
    }

    fn stats(&self) -> Stats {
        Pacer::stats(self)
    }

    fn take_now(&self, permits: u32) -> Option<Result<bool, Error>> {
        store::take_now(&self.engine, &OnlyKey, permits)
    }

    fn snapshot_now(&self) -> Option<Snapshot> {
        self.engine.snapshot_now(&OnlyKey)
    }

    async fn reservation(&self, permits: u32) -> Result<Reservation<'_>, Error> {
        store::reservation(&self.engine, &OnlyKey, permits).await
    }

    async fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        store::try_reservation(&self.engine, &OnlyKey, permits, Some(timeout)).await
    }

    async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        store::acquire(&self.engine, &OnlyKey, permits).await
    }

    async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        store::try_acquire(&self.engine, &OnlyKey, permits, timeout).await
    }
}

#[async_trait]
impl<K, S, C> KeyedLimiter<K> for KeyedRateLimiter<K, S, C>
where
    K: Key,
    S: Store,
    C: Clock,
    S::Keyed<K, C>: Engine<K>,
{
    async fn reserve(&self, key: &K, permits: u32) -> Result<Duration, Error> {
        store::reserve(&self.engine, key, permits).await
    }

    async fn try_reserve(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        store::try_reserve(&self.engine, key, permits, timeout).await
    }

    async fn snapshot(&self, key: &K) -> Result<Snapshot, Error> {
        self.engine.snapshot(key).await
    }

    fn take_now(&self, key: &K, permits: u32) -> Option<Result<bool, Error>> {
        store::take_now(&self.engine, key, permits)
    }

    fn snapshot_now(&self, key: &K) -> Option<Snapshot> {
        self.engine.snapshot_now(key)
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        Pacer::set_rate(self, permits_per_second)
    }

    fn rate(&self) -> f64 {
        Pacer::rate(self)
    }

    fn slowest_rate(&self) -> f64 {
        Pacer::slowest_rate(self)
    }

    fn clock(&self) -> &dyn Clock {
        Pacer::clock(self)
    }

    fn stats(&self) -> Stats {
        Pacer::stats(self)
    }

    async fn reservation(&self, key: &K, permits: u32) -> Result<Reservation<'_>, Error> {
        store::reservation(&self.engine, key, permits).await
    }

    async fn try_reservation(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        store::try_reservation(&self.engine, key, permits, Some(timeout)).await
    }

    async fn acquire(&self, key: &K, permits: u32) -> Result<Duration, Error> {
        store::acquire(&self.engine, key, permits).await
    }

    async fn try_acquire(&self, key: &K, permits: u32, timeout: Duration) -> Result<bool, Error> {
        store::try_acquire(&self.engine, key, permits, timeout).await
    }
}
