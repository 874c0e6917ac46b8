//! The trait every keyed limiter implements, local or distributed.

use std::hash::Hash;
use std::time::Duration;

use async_trait::async_trait;

use super::KeyedRateLimiter;
use crate::clock::Clock;
use crate::{Error, Reservation};

/// A limiter with one rate per key, in this process or shared through a
/// backend: [`Limiter`](crate::Limiter) with a key in front of every call.
///
/// Object safe, so code can hold an `Arc<dyn KeyedLimiter<K>>`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use throttler::{KeyedLimiter, KeyedRateLimiter};
///
/// async fn admit(limiter: &dyn KeyedLimiter<String>, user: &String) -> Result<bool, throttler::Error> {
///     limiter.try_acquire(user, 1, Duration::from_millis(50)).await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), throttler::Error> {
/// let limiter: Arc<dyn KeyedLimiter<String>> = Arc::new(KeyedRateLimiter::bursty(5.0)?);
/// assert!(admit(&*limiter, &"alice".to_owned()).await?);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait KeyedLimiter<K: Sync>: Send + Sync {
    /// Reserves `permits` of `key` now and returns the wait before they may
    /// be used.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe for this crate's limiters: a future dropped before it
    /// returns reserves nothing (a Redis round trip already sent is given
    /// back when its reply arrives). Once it has returned, the permits are
    /// the caller's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; a backend's errors.
    async fn reserve(&self, key: &K, permits: u32) -> Result<Duration, Error>;

    /// Reserves `permits` of `key` if the wait fits in `timeout` and returns
    /// it; returns `None`, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`reserve`](Self::reserve).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; a backend's errors.
    async fn try_reserve(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error>;

    /// How long a request of `key` made now would wait; reserves nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it reserves nothing.
    ///
    /// # Errors
    /// A backend's errors.
    async fn available_in(&self, key: &K) -> Result<Duration, Error>;

    /// Changes the rate of every key.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error>;

    /// The stable rate of every key, in permits per second.
    fn rate(&self) -> f64;

    /// The clock waits are slept on.
    fn clock(&self) -> &dyn Clock;

    /// Reserves `permits` of `key` as a [`Reservation`]: wait for it, or
    /// drop it to give the permits back.
    ///
    /// Provided: a [`reserve`](KeyedLimiter::reserve) whose permits cannot be
    /// given back. The limiters of this crate give them back.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe for this crate's limiters: a future dropped before it
    /// returns reserves nothing; the [`Reservation`] it returns gives its
    /// permits back when dropped.
    ///
    /// # Errors
    /// As [`reserve`](KeyedLimiter::reserve).
    async fn reservation(&self, key: &K, permits: u32) -> Result<Reservation<'_>, Error> {
        let wait = self.reserve(key, permits).await?;
        Ok(Reservation::without_give_back(wait, self.clock()))
    }

    /// [`reservation`](KeyedLimiter::reservation) if the permits can be used
    /// within `timeout`; `None`, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`reservation`](Self::reservation).
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

    /// Reserves `permits` of `key` and sleeps for the wait; returns the time
    /// slept.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe for this crate's limiters: dropping the future gives back
    /// what it had taken.
    ///
    /// # Errors
    /// As [`reserve`](KeyedLimiter::reserve).
    async fn acquire(&self, key: &K, permits: u32) -> Result<Duration, Error> {
        Ok(self.reservation(key, permits).await?.wait().await)
    }

    /// Acquires `permits` of `key` if the wait fits in `timeout`, sleeping
    /// for it; returns `false` at once, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](KeyedLimiter::acquire).
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
impl<K, C> KeyedLimiter<K> for KeyedRateLimiter<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    async fn reserve(&self, key: &K, permits: u32) -> Result<Duration, Error> {
        KeyedRateLimiter::<K, C>::reserve(self, key, permits)
    }

    async fn try_reserve(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        KeyedRateLimiter::<K, C>::try_reserve(self, key, permits, timeout)
    }

    async fn reservation(&self, key: &K, permits: u32) -> Result<Reservation<'_>, Error> {
        KeyedRateLimiter::<K, C>::reservation(self, key, permits)
    }

    async fn try_reservation(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        KeyedRateLimiter::<K, C>::try_reservation(self, key, permits, timeout)
    }

    async fn available_in(&self, key: &K) -> Result<Duration, Error> {
        Ok(KeyedRateLimiter::<K, C>::available_in(self, key))
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        KeyedRateLimiter::<K, C>::set_rate(self, permits_per_second)
    }

    fn rate(&self) -> f64 {
        KeyedRateLimiter::<K, C>::rate(self)
    }

    fn clock(&self) -> &dyn Clock {
        KeyedRateLimiter::<K, C>::clock(self)
    }
}
