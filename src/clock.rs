//! Where limiters read the time and how they sleep.
//!
//! A [`Clock`] reads monotonic time and sleeps, on a thread
//! ([`sleep_blocking`](Clock::sleep_blocking)) and in a task
//! ([`sleep`](Clock::sleep)). Limiters never touch the system clock directly,
//! so the whole algorithm can run on a [`FakeClock`] in tests.

use std::fmt;
use std::future::{Future, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The future returned by [`Clock::sleep`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A monotonic clock that can also sleep.
///
/// Implementations must be cheap to call and thread-safe. The trait is object
/// safe: `&dyn Clock` works.
pub trait Clock: Send + Sync + 'static {
    /// Time elapsed since an origin fixed by the clock. Never goes backwards.
    fn now(&self) -> Duration;

    /// [`now`](Clock::now) in whole microseconds, saturating at 2^53 (about
    /// 285 years): what limiters read, once per reservation. A limiter tells
    /// moments apart below that only: on a clock that reads 2^53 (a
    /// [`FakeClock`] advanced by `Duration::MAX`) time stands still, and
    /// every request goes at once. The default
    /// converts [`now`](Clock::now); a clock may override it with a faster way
    /// to the same number.
    fn now_micros(&self) -> u64 {
        crate::core::micros(self.now())
    }

    /// Blocks the calling thread for `duration`.
    fn sleep_blocking(&self, duration: Duration);

    /// A future that completes after `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// The real clock: reads the CPU's time-stamp counter, scaled, where it is
/// reliable (else the OS monotonic clock); sleeps with `tokio::time::sleep` in
/// tasks and `std::thread::sleep` on threads. [`sleep`](Clock::sleep) must be
/// awaited inside a Tokio runtime with the time driver enabled.
///
/// ```
/// use paceline::clock::{Clock, SystemClock};
///
/// let clock = SystemClock::new();
/// let a = clock.now();
/// let b = clock.now();
/// assert!(b >= a);
/// ```
#[derive(Clone)]
pub struct SystemClock {
    clock: quanta::Clock,
    /// The origin, as a raw reading of `clock`.
    origin: u64,
    /// Microseconds per raw tick, in 0.64 fixed point, if that is at most
    /// `MAX_MICROS` (a tick shorter than 2^-11 µs: a counter faster than 2.05
    /// GHz). Then `now_micros` is `ticks × factor >> 64`: one multiplication
    /// instead of scaling to nanoseconds and dividing, and a result below
    /// `factor`, so below `MAX_MICROS`, that needs no cap (a cap there would
    /// lie on the path of every reservation). Other clocks take the general
    /// path.
    micros_per_tick: Option<u64>,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        // The clock's own scaling of 2^40 ticks, exact to the nanosecond,
        // gives the factor to about 1e-16 relative error.
        const TICKS: u64 = 1 << 40;
        let nanos = u128::from(clock.delta_as_nanos(0, TICKS));
        let micros_per_tick = u64::try_from((nanos << 24) / 1000)
            .ok()
            .filter(|&factor| factor <= crate::core::MAX_MICROS);
        SystemClock {
            clock,
            origin,
            micros_per_tick,
        }
    }

    /// `now_micros` without `micros_per_tick`: through nanoseconds, capped at
    /// `MAX_MICROS`.
    #[cold]
    fn micros_general(&self) -> u64 {
        (self.nanos() / 1_000).min(crate::core::MAX_MICROS)
    }

    /// Nanoseconds since the origin: one raw read and one multiply-shift, with
    /// no `Duration` arithmetic on the way. Monotonic: the scaling is, and a
    /// reading below the origin (a counter that differs between cores) counts
    /// as zero.
    #[inline]
    fn nanos(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl fmt::Debug for SystemClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_now(f, "SystemClock", self)
    }
}

/// A clock as its name and its time now: what a clock's `Debug` shows.
fn debug_now(f: &mut fmt::Formatter<'_>, name: &str, clock: &impl Clock) -> fmt::Result {
    f.debug_struct(name).field("now", &clock.now()).finish()
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos())
    }

    #[inline]
    fn now_micros(&self) -> u64 {
        match self.micros_per_tick {
            Some(factor) => {
                // Below the origin counts as zero, as in `nanos`.
                let ticks = self.clock.raw().saturating_sub(self.origin);
                ((u128::from(ticks) * u128::from(factor)) >> 64) as u64
            }
            None => self.micros_general(),
        }
    }

    fn sleep_blocking(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A clock for tests: it starts at zero and moves only when told to
/// ([`advance`](FakeClock::advance)) or when something sleeps on it, in which
/// case the sleep returns at once and the clock moves by its length. Clones
/// share one time, so a test keeps a clone and hands another to the limiter.
///
/// ```
/// use std::time::Duration;
/// use paceline::clock::{Clock, FakeClock};
///
/// let clock = FakeClock::new();
/// let limiter_side = clock.clone();
/// clock.advance(Duration::from_millis(250));
/// limiter_side.sleep_blocking(Duration::from_millis(750)); // returns at once
/// assert_eq!(clock.now(), Duration::from_secs(1));
/// ```
#[derive(Clone, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A clock at zero.
    pub fn new() -> Self {
        FakeClock::default()
    }

    /// Moves time forward by `duration` (saturating at about 584 years).
    pub fn advance(&self, duration: Duration) {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(nanos))
            });
    }
}

impl fmt::Debug for FakeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_now(f, "FakeClock", self)
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }

    fn now_micros(&self) -> u64 {
        (self.nanos.load(Ordering::Acquire) / 1_000).min(crate::core::MAX_MICROS)
    }

    fn sleep_blocking(&self, duration: Duration) {
        self.advance(duration);
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.advance(duration);
        Box::pin(ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_micros_agree_with_now() {
        let clock = SystemClock::new();
        for _ in 0..1000 {
            let before = clock.now().as_micros() as u64;
            let micros = clock.now_micros();
            let after = clock.now().as_micros() as u64;
            assert!(
                micros + 1 >= before && micros <= after + 1,
                "{before} {micros} {after}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
        let before = clock.now().as_micros() as u64;
        let micros = clock.now_micros();
        let after = clock.now().as_micros() as u64;
        assert!(micros >= 20_000, "{micros}");
        assert!(
            micros + 1 >= before && micros <= after + 1,
            "{before} {micros} {after}"
        );
    }

    #[test]
    fn system_clock_micros_never_go_backwards() {
        let clock = SystemClock::new();
        let mut last = 0;
        for _ in 0..100_000 {
            let micros = clock.now_micros();
            assert!(micros >= last);
            last = micros;
        }
    }
}
