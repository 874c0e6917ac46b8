//! The trait every limiter implements, local or distributed.

use std::time::Duration;

use async_trait::async_trait;

use crate::Error;
use crate::clock::Clock;

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
/// use throttler::{Limiter, RateLimiter};
///
/// async fn send_all(limiter: Arc<dyn Limiter>, messages: &[&str]) -> Result<(), throttler::Error> {
///     for _message in messages {
///         limiter.acquire(1).await?;
///         // send it
///     }
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), throttler::Error> {
/// let limiter: Arc<dyn Limiter> = Arc::new(RateLimiter::bursty(1000.0)?);
/// send_all(limiter, &["a", "b"]).await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Limiter: Send + Sync {
    /// Reserves `permits` now and returns the wait before they may be used.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; a backend's errors.
    async fn reserve(&self, permits: u32) -> Result<Duration, Error>;

    /// Reserves `permits` if the wait fits in `timeout` and returns it;
    /// returns `None`, reserving nothing, otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; a backend's errors.
    async fn try_reserve(&self, permits: u32, timeout: Duration)
    -> Result<Option<Duration>, Error>;

    /// How long a request made now would wait; reserves nothing.
    ///
    /// # Errors
    /// A backend's errors.
    async fn available_in(&self) -> Result<Duration, Error>;

    /// Changes the rate.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error>;

    /// The stable rate, in permits per second.
    fn rate(&self) -> f64;

    /// The clock waits are slept on.
    fn clock(&self) -> &dyn Clock;

    /// Reserves `permits` and sleeps for the wait; returns the time slept.
    ///
    /// # Errors
    /// As [`reserve`](Limiter::reserve).
    async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        let wait = self.reserve(permits).await?;
        if !wait.is_zero() {
            self.clock().sleep(wait).await;
        }
        Ok(wait)
    }

    /// Acquires `permits` if the wait fits in `timeout`, sleeping for it;
    /// returns `false` at once, reserving nothing, otherwise.
    ///
    /// # Errors
    /// As [`try_reserve`](Limiter::try_reserve).
    async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        match self.try_reserve(permits, timeout).await? {
            Some(wait) => {
                if !wait.is_zero() {
                    self.clock().sleep(wait).await;
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[async_trait]
impl<C: Clock> Limiter for crate::RateLimiter<C> {
    async fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        crate::RateLimiter::<C>::reserve(self, permits)
    }

    async fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        crate::RateLimiter::<C>::try_reserve(self, permits, timeout)
    }

    async fn available_in(&self) -> Result<Duration, Error> {
        Ok(crate::RateLimiter::<C>::available_in(self))
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        crate::RateLimiter::<C>::set_rate(self, permits_per_second)
    }

    fn rate(&self) -> f64 {
        crate::RateLimiter::<C>::rate(self)
    }

    fn clock(&self) -> &dyn Clock {
        crate::RateLimiter::<C>::clock(self)
    }
}
