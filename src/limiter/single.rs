//! [`RateLimiter`]'s methods, each written once for every store.

use std::time::Duration;

use super::{RateLimiter, Store};
use crate::builder::Builder;
use crate::clock::Clock;
use crate::outbound::Call;
use crate::store::{self, Engine, OnlyKey};
use crate::{Cost, Error, Reservation, Snapshot};

/// # Constructors
impl RateLimiter {
    /// A bursty limiter at `permits_per_second` that saves up to one second
    /// of idle time as a burst. It starts with nothing stored: the first
    /// request goes at once, the next waits its interval (see
    /// [`Builder::permits_per_second`](crate::Builder::permits_per_second)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn bursty(permits_per_second: f64) -> Result<Self, Error> {
        Self::builder()
            .permits_per_second(permits_per_second)
            .build()
    }

    /// A builder for every other option: burst, warm-up, several limits,
    /// the clock, and the store (`.redis(..)` to share it).
    pub fn builder() -> Builder {
        Builder::new()
    }
}

/// # Reserving and waiting
///
/// What each method does is said on [`Limiter`](crate::Limiter). Those that
/// never sleep answer in the store's way ([`Store::Answer`]): the value
/// itself in this process (`limiter.reserve(1)?`), a future through Redis
/// (`limiter.reserve(1).await?`, one round trip). Cancel safety: see the
/// crate's [table](crate#cancel-safety).
///
/// # Errors
/// [`Error::InvalidArgument`] if `permits` is 0; a Redis limiter's
/// [`Error::Backend`] if Redis fails and its fallback is
/// `FailClosed`, or its key holds something it did not write (see
/// [`redis`](crate::redis)).
impl<S: Store, C: Clock> RateLimiter<S, C> {
    /// Reserves `permits` now; the wait before they may be used. Does not
    /// sleep; nothing gives the permits back.
    #[inline(always)]
    pub fn reserve(&self, permits: u32) -> S::Answer<'_, Result<Duration, Error>> {
        S::answer(store::reserve(&self.engine, &OnlyKey, permits))
    }

    /// Reserves `permits` if the wait fits in `timeout`; `None`, reserving
    /// nothing, otherwise. Only earlier callers' debt counts, not this
    /// request's size. Does not sleep.
    #[inline(always)]
    pub fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> S::Answer<'_, Result<Option<Duration>, Error>> {
        S::answer(store::try_reserve(&self.engine, &OnlyKey, permits, timeout))
    }

    /// Reserves `permits` as a [`Reservation`]: wait for it, or drop it to
    /// give the permits back.
    #[inline]
    pub fn reservation(&self, permits: u32) -> S::Answer<'_, Result<Reservation<'_>, Error>> {
        S::answer(store::reservation(&self.engine, &OnlyKey, permits))
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`;
    /// `None`, reserving nothing, otherwise.
    #[inline]
    pub fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> S::Answer<'_, Result<Option<Reservation<'_>>, Error>> {
        S::answer(store::try_reservation(
            &self.engine,
            &OnlyKey,
            permits,
            Some(timeout),
        ))
    }

    /// What the limiter holds now, read without reserving (see
    /// [`Limiter::snapshot`](crate::Limiter::snapshot)).
    pub fn snapshot(&self) -> S::Answer<'_, Result<Snapshot, Error>> {
        S::answer(self.engine.snapshot(&OnlyKey))
    }

    /// Reserves `permits` and sleeps on the limiter's clock until they may
    /// be used; the time slept. With nothing owed it returns at once,
    /// touching no timer. A refusal learned while it waits, whose pause
    /// holds its moment, sends it behind the pause (see
    /// [`outbound`](crate::outbound)). Cancel-safe: dropped, it gives the
    /// permits back (behind a pause, those it reserved there).
    pub async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        store::acquire(&self.engine, &OnlyKey, permits).await
    }

    /// [`acquire`](Self::acquire) if the wait fits in `timeout`; `false` at
    /// once, reserving nothing, otherwise; `false` later if a refusal
    /// learned while it waited pauses the limiter past `timeout` (see
    /// [`outbound`](crate::outbound)). Cancel-safe as `acquire`.
    pub async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        store::try_acquire(&self.engine, &OnlyKey, permits, timeout).await
    }

    /// [`acquire`](Self::acquire) on the calling thread, which it blocks.
    /// Needs no async runtime; do not call it from async code.
    pub fn acquire_blocking(&self, permits: u32) -> Result<Duration, Error> {
        Ok(store::take_and_sleep(&self.engine, &OnlyKey, permits, None)?.unwrap_or_default())
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    pub fn try_acquire_blocking(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Ok(store::take_and_sleep(&self.engine, &OnlyKey, permits, Some(timeout))?.is_some())
    }

    /// Reserves `estimate` for a call to an upstream, sleeps until it may
    /// go, and returns the [`Call`](crate::outbound::Call), to settle with
    /// its real cost and learn from once its answer is back (see
    /// [`outbound`](crate::outbound)). `estimate` is a [`Cost`](crate::Cost):
    /// a number of permits for every limit, or one per limit. A refusal
    /// learned while it waits, whose pause holds its moment, sends it
    /// behind the pause, as [`acquire`](Self::acquire). Cancel-safe:
    /// dropped before it returns, it gives the estimate back (behind a
    /// pause, the one it reserved there: see the crate's
    /// [table](crate#cancel-safety)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `estimate` counts nothing, or counts
    /// for a limit the limiter lacks; a Redis limiter's [`Error::Backend`].
    pub async fn call(&self, estimate: impl Into<Cost>) -> Result<Call<'_>, Error> {
        let call = self.call_for(&OnlyKey, estimate.into(), None).await?;
        Ok(call.expect("a call without a timeout is never refused"))
    }

    /// [`call`](Self::call) if the wait fits in `timeout`; `None` at once,
    /// reserving nothing, otherwise; `None` later if a refusal learned
    /// while it waited pauses the limiter past `timeout` (see
    /// [`outbound`](crate::outbound)). Cancel-safe as `call`.
    pub async fn try_call(
        &self,
        estimate: impl Into<Cost>,
        timeout: Duration,
    ) -> Result<Option<Call<'_>>, Error> {
        self.call_for(&OnlyKey, estimate.into(), Some(timeout))
            .await
    }

    /// The end of the pause a refusal learned, while it holds (a round
    /// trip through Redis; only ever compared with another of its
    /// answers): for a caller that sends later than its turn (the outbound
    /// layer, whose client is made ready again after the wait).
    #[cfg(feature = "http")]
    pub(crate) async fn paused(&self) -> Option<u64> {
        self.engine.paused(&OnlyKey).await
    }
}
