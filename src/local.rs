//! The in-process limiter: the [core algorithm](crate::core) behind a lock.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::Error;
use crate::builder::Builder;
use crate::clock::{Clock, SystemClock};
use crate::core::{State, micros};
use crate::error::check_permits;

/// A rate limiter for one process, shared by any number of threads and tasks.
///
/// It hands out permits at a configured rate with the reservation-based
/// algorithm described in [`core`](crate::core): a request goes as soon as the
/// previous caller's debt is paid, and its own cost is charged to the next
/// caller. Reservations are made under a short lock; waiting happens outside
/// it, so a sleeping caller never blocks others.
///
/// Share it with an [`Arc`](std::sync::Arc). It implements the
/// [`Limiter`](crate::Limiter) trait, so it can stand wherever the Redis
/// limiter can.
///
/// ```
/// use std::time::Duration;
/// use throttler::RateLimiter;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), throttler::Error> {
/// let limiter = RateLimiter::bursty(1000.0)?; // 1000 permits per second
/// limiter.acquire(1).await?;                 // waits if needed
/// if limiter.try_acquire(1, Duration::from_millis(10)).await? {
///     // got a permit within 10 ms
/// }
/// # Ok(()) }
/// ```
pub struct RateLimiter<C: Clock = SystemClock> {
    state: Mutex<State>,
    clock: C,
}

/// # Constructors
impl RateLimiter<SystemClock> {
    /// A bursty limiter at `permits_per_second` that saves up to one second of
    /// idle time as a burst.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn bursty(permits_per_second: f64) -> Result<Self, Error> {
        Self::builder()
            .permits_per_second(permits_per_second)
            .build()
    }

    /// A warming-up limiter at `permits_per_second`: after a pause it starts
    /// three times slower and reaches the stable rate within `warmup`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn warming_up(permits_per_second: f64, warmup: Duration) -> Result<Self, Error> {
        Self::builder()
            .permits_per_second(permits_per_second)
            .warmup(warmup)
            .build()
    }

    /// A builder for the other options: burst size, warm-up, cold factor,
    /// clock.
    pub fn builder() -> Builder<SystemClock> {
        Builder::new()
    }
}

/// # Reserving and waiting
impl<C: Clock> RateLimiter<C> {
    pub(crate) fn from_parts(state: State, clock: C) -> Self {
        RateLimiter {
            state: Mutex::new(state),
            clock,
        }
    }

    /// The state, whatever a panicking thread left behind: the core never
    /// panics mid-update, so a poisoned lock still holds a consistent state.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now_micros(&self) -> u64 {
        micros(self.clock.now())
    }

    /// Reserves `permits` now and returns how long the caller must wait
    /// before using them. Does not sleep.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        check_permits(permits)?;
        let mut state = self.state();
        let wait = state.reserve(permits, self.now_micros());
        Ok(Duration::from_micros(wait))
    }

    /// Reserves `permits` if they can be used within `timeout`, and returns
    /// the wait. Returns `None`, reserving nothing, if the wait would be
    /// longer. Does not sleep.
    ///
    /// Only the debt of earlier callers counts, not the size of this request:
    /// an idle limiter grants any request at once and charges it to the next.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn try_reserve(&self, permits: u32, timeout: Duration) -> Result<Option<Duration>, Error> {
        check_permits(permits)?;
        let mut state = self.state();
        let wait = state.try_reserve(permits, self.now_micros(), micros(timeout));
        Ok(wait.map(Duration::from_micros))
    }

    /// Reserves `permits` and sleeps until they may be used; returns the time
    /// slept. Sleeps on the limiter's clock (for [`SystemClock`], a Tokio
    /// timer). When nothing is owed, returns at once without touching a timer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        let wait = self.reserve(permits)?;
        if !wait.is_zero() {
            self.clock.sleep(wait).await;
        }
        Ok(wait)
    }

    /// Acquires `permits` if they can be had within `timeout`, sleeping for
    /// the wait; returns `false` at once, reserving nothing, otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        match self.try_reserve(permits, timeout)? {
            Some(wait) => {
                if !wait.is_zero() {
                    self.clock.sleep(wait).await;
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// [`acquire`](Self::acquire) on the calling thread: blocks it for the
    /// wait. Needs no async runtime; do not call it from async code.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn acquire_blocking(&self, permits: u32) -> Result<Duration, Error> {
        let wait = self.reserve(permits)?;
        if !wait.is_zero() {
            self.clock.sleep_blocking(wait);
        }
        Ok(wait)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn try_acquire_blocking(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        match self.try_reserve(permits, timeout)? {
            Some(wait) => {
                if !wait.is_zero() {
                    self.clock.sleep_blocking(wait);
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// How long a request made now would wait, without reserving anything:
    /// for a `Retry-After` header, say.
    pub fn available_in(&self) -> Duration {
        let next_free = self.state().query_earliest_available();
        Duration::from_micros(next_free.saturating_sub(self.now_micros()))
    }
}

/// # Rate
impl<C: Clock> RateLimiter<C> {
    /// Changes the rate from now on. The next caller still repays the
    /// previous request at the old rate; stored permits are rescaled to the
    /// new burst size.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN; the
    /// limiter is then unchanged.
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        let mut state = self.state();
        state.set_rate(permits_per_second, self.now_micros())
    }

    /// The stable rate, in permits per second, as last set.
    pub fn rate(&self) -> f64 {
        self.state().permits_per_second
    }

    /// The clock this limiter reads and sleeps on.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: Clock> fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("state", &*self.state())
            .finish_non_exhaustive()
    }
}
