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
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::core::word::{self, Quick, Step};
use crate::core::{Cost, Learning, Lesson, Limits, Shape, State, reshape, stable_interval_micros};
use crate::meter::Metered;
use crate::meter::Metrics;
use crate::reservation::{GiveBack, GiveBackId, GivesBack, Reservation};
use crate::store::{AtOnce, OnlyKey, Rate};
use crate::{Error, Snapshot, Stats};

use outcome::{Grant, Outcome};
use slot::Slot;

/// A limiter's state in this process: the engine of a
/// [`RateLimiter<Local>`](crate::RateLimiter). See the module's
/// documentation for how it runs.
pub struct Single<C: Clock = SystemClock> {
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
    /// Whether it ever learned from an upstream: until then a caller that
    /// waited does not take the lock to ask whether a pause holds.
    learned: AtomicBool,
    /// What `set_rate` scales; held by a rate change (before `limits`).
    shape: Shape,
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

impl<C: Clock> Single<C> {
    /// A limiter that enforces every one of `limits` (see [`Limits`]): on
    /// the word if they are one bursty limit, else in mutex mode.
    pub(crate) fn from_limits(limits: Limits, clock: C) -> Self {
        let now = clock.now_micros();
        let slots = Slots([Slot::default(), Slot::default()]);
        // Published as the generation after the last one, i.e. generation 0.
        let word = slots.publish(u64::MAX, &limits, now);
        Single {
            word: Word(AtomicU64::new(word)),
            slots,
            shape: Mutex::new(limits.ceilings().into()),
            limits: Mutex::new(limits),
            clock,
            metrics: Metrics::default(),
            learned: AtomicBool::new(false),
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
    ///
    /// The common step of an under-used limiter (stored permits spent, some
    /// left) is tried first on its own, with only the prepared step between
    /// the load and the compare-and-swap; if another thread wrote the word
    /// first, or the step needs more, the loop goes on out of line.
    #[inline(always)]
    fn reserve_micros<O: Outcome>(&self, permits: u32, timeout: u64) -> Option<O> {
        let first = self.word.0.load(Acquire);
        if word::is_mutex(first) {
            // The lock path reads the clock itself, under the lock.
            return self.reserve_locked(permits, timeout);
        }
        let now = self.clock.now_micros();
        if word::has_stored(first) {
            let quick = Quick::new(first, now, permits, self.slots.of(first));
            let current = self.word.0.load(Acquire);
            let current = match quick.apply(current) {
                Some(new) => match self
                    .word
                    .0
                    .compare_exchange_weak(current, new, AcqRel, Acquire)
                {
                    Ok(_) => return Some(O::from_word(0)),
                    Err(actual) => actual,
                },
                None => current,
            };
            return self.reserve_contended(first, current, now, permits, timeout);
        }
        self.step_loop(first, now, permits, timeout)
    }

    /// [`reserve_micros`](Self::reserve_micros) after its first try, from
    /// `current`, out of line: the step prepared for `first`'s generation
    /// again while it applies (as it does under contention), else
    /// [`word::step`].
    #[inline(never)]
    fn reserve_contended<O: Outcome>(
        &self,
        first: u64,
        mut current: u64,
        now: u64,
        permits: u32,
        timeout: u64,
    ) -> Option<O> {
        let quick = Quick::new(first, now, permits, self.slots.of(first));
        loop {
            let Some(new) = quick.apply(current) else {
                return self.step_loop(current, now, permits, timeout);
            };
            match self
                .word
                .0
                .compare_exchange_weak(current, new, AcqRel, Acquire)
            {
                Ok(_) => return Some(O::from_word(0)),
                Err(actual) => current = actual,
            }
        }
    }

    /// Steps from `current` at `now` and writes the result, until a
    /// compare-and-swap succeeds, or the step is refused or needs the lock.
    ///
    /// A refusal writes nothing, so no compare-and-swap checks that the
    /// configuration it read is `current`'s: since `current` was loaded
    /// (before the clock was read, on the first step) the word may have
    /// moved on by two generations, to the same slot, rewritten with another
    /// base (a reservation logged, then the log emptied later; two rate
    /// changes), and the step have read the old ticket as one that much
    /// later. So a refusal stands only if the word is still of `current`'s
    /// generation once the step has read the slot; else it steps again
    /// from the word as it is.
    #[inline(always)]
    fn step_loop<O: Outcome>(
        &self,
        mut current: u64,
        now: u64,
        permits: u32,
        timeout: u64,
    ) -> Option<O> {
        loop {
            let (new, wait) =
                match word::step(current, now, permits, timeout, self.slots.of(current)) {
                    Step::Refused => {
                        // The slot's loads before the word's (acquired in
                        // turn for the next step's).
                        fence(Acquire);
                        let seen = self.word.0.load(Acquire);
                        if word::same_generation(seen, current) {
                            return None;
                        }
                        current = seen;
                        continue;
                    }
                    // One that can be given back waits in the log.
                    Step::Granted { wait, .. } if O::GIVES_BACK && wait > 0 => {
                        return self.reserve_locked(permits, timeout);
                    }
                    Step::Granted { word, wait } => (word, wait),
                    Step::Slow => return self.reserve_locked(permits, timeout),
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
                Some(GiveBack { owner: self, taken }),
            )
            .for_limit(limit),
            _ => Reservation::new(Duration::ZERO, &self.clock, None),
        }
    }
}

impl<C: Clock> AtOnce<OnlyKey> for Single<C> {
    #[inline(always)]
    fn reserve_at_once(&self, _: &OnlyKey, permits: u32, timeout: u64) -> Option<Reservation<'_>> {
        let grant = self.reserve_micros::<Grant>(permits, timeout);
        grant.map(|grant| self.to_reservation(grant))
    }

    #[inline(always)]
    fn wait_at_once(&self, _: &OnlyKey, permits: u32, timeout: u64) -> Option<u64> {
        self.reserve_micros::<u64>(permits, timeout)
    }

    fn call_at_once(&self, _: &OnlyKey, cost: &Cost, timeout: u64) -> Option<Reservation<'_>> {
        let granted = self.open_call(cost, timeout);
        granted.map(|granted| {
            let taken = granted.id.map(|id| GiveBack {
                owner: self,
                taken: GiveBackId::Logged(id),
            });
            Reservation::new(
                Duration::from_micros(granted.wait_micros),
                &self.clock,
                taken,
            )
            .for_limit(granted.bound_by.unwrap_or(0))
        })
    }

    fn snapshot_at_once(&self, _: &OnlyKey) -> Snapshot {
        self.snapshot_locked()
    }

    fn paused_at_once(&self, _: &OnlyKey) -> Option<u64> {
        if !self.learned.load(Ordering::Acquire) {
            return None;
        }
        let now = self.clock.now_micros();
        self.lock().paused_until(now)
    }
}

impl<C: Clock> Metered for Single<C> {
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

impl<C: Clock> Rate for Single<C> {
    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        let shape = self.shape.lock().unwrap_or_else(PoisonError::into_inner);
        self.reconfigure(|limits, now| limits.set_first_rate(&shape, permits_per_second, now))
    }

    fn set_limit_rate(&self, index: usize, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        crate::error::check_limit(index, self.lock().states().len())?;
        let mut shape = self.shape.lock().unwrap_or_else(PoisonError::into_inner);
        self.reconfigure(|limits, now| limits.set_rate(Some(index), permits_per_second, now))?;
        reshape(&mut shape, &self.lock().ceilings());
        Ok(())
    }

    fn rate(&self) -> f64 {
        self.lock().states()[0].permits_per_second()
    }

    fn slowest_rate(&self) -> f64 {
        crate::core::slowest(self.lock().states().iter().map(State::permits_per_second))
    }

    fn clock(&self) -> &dyn Clock {
        &self.clock
    }

    fn stats(&self) -> Stats {
        Stats::default()
    }

    fn limit_count(&self) -> usize {
        self.lock().states().len()
    }
}

impl<C: Clock> GivesBack for Single<C> {
    fn give_back(&self, taken: GiveBackId) -> bool {
        self.on_logged(&taken, |limits, id, now| limits.give_back(id, now))
    }

    fn keep(&self, taken: GiveBackId) {
        self.on_logged(&taken, |limits, id, now| limits.keep(id, now));
    }

    fn settle(&self, taken: &GiveBackId, charged: &Cost, actual: &Cost) {
        self.on_logged(taken, |limits, id, now| {
            limits.settle(id, charged, actual, now);
            true
        });
    }

    fn learn(&self, _: &GiveBackId, lesson: &Lesson, learning: &Learning) {
        self.learned.store(true, Ordering::Release);
        self.learn_locked(lesson, learning);
    }
}

impl<C: Clock> fmt::Debug for Single<C> {
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
