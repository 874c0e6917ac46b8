//! The trait every limiter implements, local or distributed.

use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Clock;
use crate::{Error, Reservation};

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
    /// # Cancel safety
    ///
    /// Cancel-safe for this crate's limiters: a future dropped before it
    /// returns reserves nothing (a Redis round trip already sent is given
    /// back when its reply arrives). Once it has returned, the permits are
    /// the caller's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; a backend's errors.
    async fn reserve(&self, permits: u32) -> Result<Duration, Error>;

    /// Reserves `permits` if the wait fits in `timeout` and returns it;
    /// returns `None`, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`reserve`](Self::reserve).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; a backend's errors.
    async fn try_reserve(&self, permits: u32, timeout: Duration)
    -> Result<Option<Duration>, Error>;

    /// How long a request made now would wait; reserves nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it reserves nothing.
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

    /// Takes `permits` if they are free now (nothing owed), without I/O:
    /// `Some(true)` if taken (with nothing to wait for, so nothing to give
    /// back), `Some(false)` if they are not free (nothing reserved), `None`
    /// if this limiter cannot tell without a round trip. Adapters use it to
    /// skip the reservation machinery when nothing is owed.
    ///
    /// Provided: `None`. The local limiter answers.
    ///
    /// Not part of the API: an optimisation between this crate's limiters
    /// and adapters, hidden from the docs, and free to change.
    ///
    /// # Errors
    /// As [`try_reserve`](Limiter::try_reserve).
    #[doc(hidden)]
    fn take_if_free(&self, permits: u32) -> Option<Result<bool, Error>> {
        let _ = permits;
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
    /// within `timeout`; `None`, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`reservation`](Self::reservation).
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
    /// returns `false` at once, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Limiter::acquire).
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

    async fn reservation(&self, permits: u32) -> Result<Reservation<'_>, Error> {
        crate::RateLimiter::<C>::reservation(self, permits)
    }

    async fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        crate::RateLimiter::<C>::try_reservation(self, permits, timeout)
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

    fn take_if_free(&self, permits: u32) -> Option<Result<bool, Error>> {
        Some(
            crate::RateLimiter::<C>::try_reserve(self, permits, Duration::ZERO)
                .map(|w| w.is_some()),
        )
    }
}
