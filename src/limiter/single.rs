//! [`RateLimiter`]'s methods, each written once for every store.

use std::fmt;
use std::time::Duration;

use super::{RateLimiter, Store};
use crate::builder::{Builder, One};
use crate::clock::Clock;
use crate::outbound::{Call, InFlight};
use crate::store::{self, Engine, NoKey, Rate};
use crate::{Cost, Error, Reservation, Snapshot, Stats};

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
    pub fn builder() -> Builder<One> {
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
        S::answer(store::reserve(&self.engine, &NoKey, permits))
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
        S::answer(store::try_reserve(&self.engine, &NoKey, permits, timeout))
    }

    /// Reserves `permits` as a [`Reservation`]: wait for it, or drop it to
    /// give the permits back.
    #[inline]
    pub fn reservation(&self, permits: u32) -> S::Answer<'_, Result<Reservation<'_>, Error>> {
        S::answer(store::reservation(&self.engine, &NoKey, permits))
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
            &NoKey,
            permits,
            Some(timeout),
        ))
    }

    /// What the limiter holds now, read without reserving (see
    /// [`Limiter::snapshot`](crate::Limiter::snapshot)).
    pub fn snapshot(&self) -> S::Answer<'_, Result<Snapshot, Error>> {
        S::answer(self.engine.snapshot(&NoKey))
    }

    /// Reserves `permits` and sleeps on the limiter's clock until they may
    /// be used; the time slept. With nothing owed it returns at once,
    /// touching no timer. A refusal learned while it waits, whose pause
    /// holds its moment, sends it behind the pause (see
    /// [`outbound`](crate::outbound)). Cancel-safe: dropped, it gives the
    /// permits back (behind a pause, those it reserved there).
    pub async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        store::acquire(&self.engine, &NoKey, permits).await
    }

    /// [`acquire`](Self::acquire) if the wait fits in `timeout`; `false` at
    /// once, reserving nothing, otherwise; `false` later if a refusal
    /// learned while it waited pauses the limiter past `timeout` (see
    /// [`outbound`](crate::outbound)). Cancel-safe as `acquire`.
    pub async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        store::try_acquire(&self.engine, &NoKey, permits, timeout).await
    }

    /// [`acquire`](Self::acquire) on the calling thread, which it blocks.
    /// Needs no async runtime; do not call it from async code.
    pub fn acquire_blocking(&self, permits: u32) -> Result<Duration, Error> {
        Ok(store::take_and_sleep(&self.engine, &NoKey, permits, None)?.unwrap_or_default())
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    pub fn try_acquire_blocking(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Ok(store::take_and_sleep(&self.engine, &NoKey, permits, Some(timeout))?.is_some())
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
        let call = store::call(
            &self.engine,
            &self.slots,
            &NoKey,
            estimate.into(),
            None,
            &self.upstream,
        );
        Ok(call
            .await?
            .expect("a call without a timeout is never refused"))
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
        store::call(
            &self.engine,
            &self.slots,
            &NoKey,
            estimate.into(),
            Some(timeout),
            &self.upstream,
        )
        .await
    }

    /// Changes the rate from now on. The next caller still repays the
    /// previous request at the old rate; stored permits keep their share of
    /// the burst, which spans the same time at the new rate (see
    /// [`Limit::burst`](crate::Limit::burst)). With several limits, this is
    /// the first one's rate, and the others are scaled by the same factor
    /// (so that they keep their proportions; from or to an infinite rate,
    /// they all take this one); [`set_limit_rate`](Self::set_limit_rate)
    /// changes one alone.
    /// What waits to be given back then gives back nothing (it was charged
    /// at the old rate): erring towards limiting. A Redis limiter's keys
    /// take it with their next call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN; the
    /// limiter is then unchanged.
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        self.engine.set_rate(permits_per_second)
    }

    /// Changes the rate of limit `index` alone (counted in the order the
    /// builder was given them, from 0), from now on. On a limiter with one
    /// limit, index 0 is [`set_rate`](Self::set_rate).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN, or
    /// there is no limit `index`; the limiter is then unchanged.
    pub fn set_limit_rate(&self, index: usize, permits_per_second: f64) -> Result<(), Error> {
        self.engine.set_limit_rate(index, permits_per_second)
    }

    /// The stable rate, in permits per second, as last set (of the first
    /// limit, for a limiter built with several); in this process, what it
    /// learned from an upstream makes of it (see
    /// [`outbound`](crate::outbound)), through Redis the rate set (the
    /// learned one is in [`snapshot`](Self::snapshot)).
    pub fn rate(&self) -> f64 {
        self.engine.rate()
    }

    /// The slowest of its limits' stable rates, in permits per second, as
    /// [`rate`](Self::rate) reads them: the rate it sustains (`rate` itself
    /// with one limit).
    pub fn slowest_rate(&self) -> f64 {
        self.engine.slowest_rate()
    }

    /// The clock this limiter reads and sleeps on.
    pub fn clock(&self) -> &dyn Clock {
        self.engine.clock()
    }

    /// How the limiter is served: for a Redis limiter, whether it is on
    /// its fallback and how often it switched (see [`Stats`]).
    pub fn stats(&self) -> Stats {
        Stats {
            in_flight: self.slots.in_flight(),
            ..self.engine.stats()
        }
    }
}

impl<S: Store, C: Clock> fmt::Debug for RateLimiter<S, C>
where
    S::Single<C>: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.engine.fmt(f)
    }
}
