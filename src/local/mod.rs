//! The in-process limiter: [`Limits`] (the [core](crate::core)'s one
//! algorithm), on one atomic word while it can be.
//!
//! A limiter of one bursty limit whose log is empty is the word's case (see
//! [`word`]): its whole state fits in one `u64`, so a reservation is a clock
//! read, a load, a little arithmetic and one compare-and-swap: no lock, no
//! allocation, and a refusal writes nothing. Everything else runs the
//! limits themselves under a lock (*mutex mode*): several limits, the
//! warming-up policy (whose stored permits have a price that does not fold
//! into one number), rate changes, rare rebases of the word's fixed-point
//! window, and reservations that have to wait and may be given back (an
//! `acquire`, a [`Reservation`]): those are logged, which makes their
//! give-backs exact, and the limiter stays under the lock while its log
//! holds anything.

mod locked;
mod outcome;
mod slot;

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::time::Duration;

use crate::builder::Builder;
use crate::clock::{Clock, SystemClock};
use crate::core::word::{self, Quick, Step};
use crate::core::{Limits, micros, stable_interval_micros};
use crate::error::check_permits;
use crate::metrics::Metrics;
use crate::reservation::{GiveBackTo, Pending, Reservation, Taken};
use crate::store::{Direct, NoKey, Now, Rate, Store, in_process_store};
use crate::{Error, Snapshot};

use outcome::{Grant, Outcome};
use slot::Slot;

/// A rate limiter for one process, shared by any number of threads and tasks.
///
/// It hands out permits at a configured rate with the reservation-based
/// algorithm described in [`core`](crate::core): a request goes as soon as the
/// previous caller's debt is paid, and its own cost is charged to the next
/// caller. A bursty limiter reserves with one atomic compare-and-swap and no
/// lock; a warming-up one, or one of several limits, under a short lock.
/// Waiting always happens outside, so a sleeping caller never blocks others.
///
/// Share it with an [`Arc`](std::sync::Arc). It implements the
/// [`Limiter`](crate::Limiter) trait, so it can stand wherever the Redis
/// limiter can.
///
/// # Lock-free reservations
///
/// A bursty limiter's two numbers, stored permits and the next free moment,
/// fold into one: `tat = next_free − stored_permits × interval`, the moment
/// the limiter would be free had nothing been saved. Resyncing is clamping
/// it to at most a full burst before now, and a reservation of `p` permits,
/// stored or fresh, pushes it by `p × interval`; the caller waits until
/// `max(tat, now)`. So the whole state is one 64-bit word and a reservation
/// one compare-and-swap; a refusal writes nothing, and nothing allocates.
///
/// While nothing is stored the word holds the core's next free moment,
/// with its fraction of a microsecond, and every wait is the core's to the
/// bit. Stored permits are held as time to 2^-20 µs rather than as the
/// core's floating-point count, so once some were spent a wait can differ
/// from the core's by one microsecond of rounding. Rate changes, a rebase
/// of the word's fixed-point window every few hours, debts and bursts
/// longer than about two hours, the warming-up policy (whose stored
/// permits have a price) and several limits run the core's [`Limits`]
/// under a lock.
///
/// So does a reservation that has to wait and can be given back (an
/// `acquire` that sleeps, a [`Reservation`] with a delay): the limits log
/// it, and the limiter stays under the lock while the log holds anything.
/// That is what makes giving it back exact: the limits are replayed without
/// it, and hold what they would hold had it never been made. A caller that
/// has to wait is about to sleep anyway; an `acquire` with nothing owed,
/// and every `reserve` and `try_reserve`, stay on the lock-free word while
/// nothing is logged.
///
/// ```
/// use std::time::Duration;
/// use paceline::RateLimiter;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline::Error> {
/// let limiter = RateLimiter::bursty(1000.0)?; // 1000 permits per second
/// limiter.acquire(1).await?;                 // waits if needed
/// if limiter.try_acquire(1, Duration::from_millis(10)).await? {
///     // got a permit within 10 ms
/// }
/// # Ok(()) }
/// ```
pub struct RateLimiter<C: Clock = SystemClock> {
    /// The state (see [`word`]), alone in its cache line: every reservation
    /// writes it.
    word: Word,
    /// The configuration of the word's generation and of the next one.
    slots: Slots,
    /// The limits: their configuration always, their state in mutex mode
    /// (the word holds it otherwise). Serializes rate changes, rebases and
    /// reservations that can be given back.
    limits: Mutex<Limits>,
    clock: C,
    metrics: Metrics,
}

#[repr(align(128))]
struct Word(AtomicU64);

#[repr(align(128))]
struct Slots([Slot; 2]);

impl Slots {
    /// The configuration of `word`'s generation.
    #[inline(always)]
    fn of(&self, word: u64) -> &Slot {
        &self.0[word::slot_index(word)]
    }

    /// The word that publishes `limits` at `now` in the generation after
    /// `word`'s (see [`word::publish`]), its configuration written first.
    fn publish(&self, word: u64, limits: &Limits, now: u64) -> u64 {
        let (new, config) = word::publish(word, limits, now);
        if let Some(config) = config {
            self.0[word::slot_index(new)].store(&config);
        }
        new
    }
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
    /// A limiter that enforces every one of `limits` (see [`Limits`]): on
    /// the word if they are one bursty limit, else in mutex mode.
    pub(crate) fn from_limits(limits: Limits, clock: C) -> Self {
        let now = clock.now_micros();
        let slots = Slots([Slot::default(), Slot::default()]);
        // Published as the generation after the last one, i.e. generation 0.
        let word = slots.publish(u64::MAX, &limits, now);
        RateLimiter {
            word: Word(AtomicU64::new(word)),
            slots,
            limits: Mutex::new(limits),
            clock,
            metrics: Metrics::default(),
        }
    }

    /// Records into `metrics` from now on.
    pub(crate) fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Reserves `permits` if the debt fits in `timeout` µs (`u64::MAX`: a
    /// plain reservation); returns the wait in µs and, for a [`Grant`],
    /// what to give back if the reservation goes unused.
    #[inline(always)]
    fn reserve_micros<O: Outcome>(&self, permits: u32, timeout: u64) -> Option<O> {
        let first = self.word.0.load(Acquire);
        if word::is_mutex(first) {
            // The lock path reads the clock itself, under the lock.
            return self.reserve_locked(permits, timeout);
        }
        let now = self.clock.now_micros();
        let (quick, mut current) = if word::has_stored(first) {
            let quick = Quick::new(first, now, permits, self.slots.of(first));
            // Reloaded, so that only the quick step lies between the load
            // and the compare-and-swap when other threads write the word.
            (quick, self.word.0.load(Acquire))
        } else {
            (Quick::NONE, first)
        };
        loop {
            let (new, wait) = match quick.apply(current) {
                Some(new) => (new, 0),
                None => match word::step(current, now, permits, timeout, self.slots.of(current)) {
                    Step::Refused => return None,
                    // One that can be given back waits in the log.
                    Step::Granted { wait, .. } if O::GIVES_BACK && wait > 0 => {
                        return self.reserve_locked(permits, timeout);
                    }
                    Step::Granted { word, wait } => (word, wait),
                    Step::Slow => return self.reserve_locked(permits, timeout),
                },
            };
            match self
                .word
                .0
                .compare_exchange_weak(current, new, AcqRel, Acquire)
            {
                Ok(_) => return Some(O::from_word(wait)),
                Err(actual) => current = actual,
            }
        }
    }

    /// A grant as a reservation: one with a wait can be given back.
    #[inline(always)]
    fn to_reservation(&self, grant: Grant) -> Reservation<'_> {
        match grant {
            Grant {
                wait,
                taken: Some(taken),
                limit,
            } if wait > 0 => Reservation::new(
                Duration::from_micros(wait),
                &self.clock,
                Some(Pending { owner: self, taken }),
            )
            .for_limit(limit),
            _ => Reservation::new(Duration::ZERO, &self.clock, None),
        }
    }
}

/// # Reserving and waiting
///
/// Each method is [`Limiter`](crate::Limiter)'s, which says what it does;
/// here the ones that do not sleep are plain functions. Cancel safety: see
/// the crate's [table](crate#cancel-safety).
impl<C: Clock> RateLimiter<C> {
    /// Reserves `permits` now; the wait before they may be used. Does not
    /// sleep; nothing gives the permits back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    #[inline(always)]
    pub fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        Now::reserve_now(self, &NoKey, permits)
    }

    /// Reserves `permits` if the wait fits in `timeout`; `None`, reserving
    /// nothing, otherwise. Only earlier callers' debt counts, not this
    /// request's size. Does not sleep.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    #[inline(always)]
    pub fn try_reserve(&self, permits: u32, timeout: Duration) -> Result<Option<Duration>, Error> {
        Now::try_reserve_now(self, &NoKey, permits, timeout)
    }

    /// Reserves `permits` as a [`Reservation`]: wait for it, or drop it to
    /// give the permits back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    #[inline]
    pub fn reservation(&self, permits: u32) -> Result<Reservation<'_>, Error> {
        Now::reservation_now(self, &NoKey, permits)
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`;
    /// `None`, reserving nothing, otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    #[inline]
    pub fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        Now::try_reservation_now(self, &NoKey, permits, timeout)
    }

    /// Reserves `permits` and sleeps on the limiter's clock until they may
    /// be used; the time slept. With nothing owed it returns at once,
    /// touching no timer. Cancel-safe: dropped, it gives the permits back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        Store::acquire(self, &NoKey, permits).await
    }

    /// [`acquire`](Self::acquire) if the wait fits in `timeout`; `false` at
    /// once, reserving nothing, otherwise. Cancel-safe as `acquire`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Store::try_acquire(self, &NoKey, permits, timeout).await
    }

    /// [`acquire`](Self::acquire) on the calling thread, which it blocks.
    /// Needs no async runtime; do not call it from async code.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn acquire_blocking(&self, permits: u32) -> Result<Duration, Error> {
        Store::acquire_blocking(self, &NoKey, permits)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn try_acquire_blocking(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Store::try_acquire_blocking(self, &NoKey, permits, timeout)
    }

    /// How long a request made now would wait; reserves nothing (for a
    /// `Retry-After` header, say).
    ///
    /// # Errors
    /// None from this limiter: the `Result` is the one every limiter
    /// returns.
    pub fn available_in(&self) -> Result<Duration, Error> {
        Ok(self.next_free_now(&NoKey))
    }

    /// What the limiter holds now, read without reserving: the requests
    /// that would go at once, the wait, the rate and the burst (see
    /// [`Snapshot`]); with several limits, the binding one's.
    ///
    /// # Errors
    /// None from this limiter: the `Result` is the one every limiter
    /// returns.
    pub fn snapshot(&self) -> Result<Snapshot, Error> {
        Ok(self.snapshot_now(&NoKey))
    }
}

impl<C: Clock> Now<NoKey> for RateLimiter<C> {
    #[inline(always)]
    fn take_wait_now(
        &self,
        _: &NoKey,
        permits: u32,
        timeout: Option<Duration>,
    ) -> Option<Duration> {
        let wait = self.reserve_micros::<u64>(permits, timeout.map_or(u64::MAX, micros));
        wait.map(Duration::from_micros)
    }

    #[inline]
    fn take_now(
        &self,
        _: &NoKey,
        permits: u32,
        timeout: Option<Duration>,
    ) -> Option<Reservation<'_>> {
        let grant = self.reserve_micros::<Grant>(permits, timeout.map_or(u64::MAX, micros));
        grant.map(|grant| self.to_reservation(grant))
    }

    fn next_free_now(&self, _: &NoKey) -> Duration {
        Duration::from_micros(self.next_free_micros())
    }

    fn snapshot_now(&self, _: &NoKey) -> Snapshot {
        self.snapshot_locked()
    }

    fn take_if_free_now(&self, _: &NoKey, permits: u32) -> Option<Result<bool, Error>> {
        Some(check_permits(permits).map(|()| self.reserve_micros::<u64>(permits, 0).is_some()))
    }
}

in_process_store!(impl<C> for RateLimiter<C>, key NoKey, where C: Clock);

impl<C: Clock> Rate for RateLimiter<C> {
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        RateLimiter::set_rate(self, permits_per_second)
    }

    fn rate(&self) -> f64 {
        RateLimiter::rate(self)
    }

    fn clock(&self) -> &dyn Clock {
        &self.clock
    }
}

impl<C: Clock> Direct for RateLimiter<C> {
    type Store = Self;

    fn store(&self) -> &Self {
        self
    }
}

/// # Rate
impl<C: Clock> RateLimiter<C> {
    /// Changes the rate from now on. The next caller still repays the
    /// previous request at the old rate; stored permits are rescaled to the
    /// new burst size. With several limits, this is the first one's rate,
    /// and the others are scaled by the same factor (so that they keep
    /// their proportions; from or to an infinite rate, they all take this
    /// one); [`set_limit_rate`](Self::set_limit_rate) changes one alone.
    /// What waits to be given back then gives back nothing (it was charged
    /// at the old rate): erring towards limiting.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN; the
    /// limiter is then unchanged.
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        self.reconfigure(|limits, now| match limits.states() {
            [_] => limits.set_rate(None, permits_per_second, now),
            [first, ..] => {
                let factor = permits_per_second / first.permits_per_second();
                limits.scale(factor, permits_per_second, now)
            }
            [] => Ok(()),
        })
    }

    /// The stable rate, in permits per second, as last set (of the first
    /// limit, for a limiter built with several).
    pub fn rate(&self) -> f64 {
        self.lock().states()[0].permits_per_second()
    }

    /// Changes the rate of limit `index` alone (counted in the order the
    /// builder was given them, from 0), from now on. On a limiter with one
    /// limit, index 0 is [`set_rate`](Self::set_rate).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN, or
    /// there is no limit `index`; the limiter is then unchanged.
    pub fn set_limit_rate(&self, index: usize, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        crate::error::check_limit(index, self.lock().states().len())?;
        self.reconfigure(|limits, now| limits.set_rate(Some(index), permits_per_second, now))
    }

    /// The clock this limiter reads and sleeps on.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C: Clock> GiveBackTo for RateLimiter<C> {
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn give_back(&self, taken: Taken) {
        // Anything else is another limiter's: nothing of this one's.
        if let Taken::Logged(id) = taken {
            self.give_back_logged(id);
        }
    }

    fn keep(&self, taken: Taken) {
        if let Taken::Logged(id) = taken {
            self.keep_logged(id);
        }
    }
}

impl<C: Clock> fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits = self.limits_now();
        match limits.states() {
            [state] => f
                .debug_struct("RateLimiter")
                .field("state", state)
                .finish_non_exhaustive(),
            states => f
                .debug_struct("RateLimiter")
                .field("limits", &states)
                .finish_non_exhaustive(),
        }
    }
}
