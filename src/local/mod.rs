//! The in-process limiter: the [core algorithm](crate::core) on one atomic
//! word.
//!
//! A bursty limiter keeps its whole state in one `u64` (see [`word`] for the
//! representation and why it is equivalent to the core), so a reservation is
//! a clock read, a load, a little arithmetic and one compare-and-swap: no
//! lock, no allocation, and a refusal writes nothing. Rate changes, rare
//! rebases of the fixed-point window, the warming-up policy (whose stored
//! permits have a price that does not fold into one number), and
//! reservations that have to wait and may be given back (an `acquire`, a
//! [`Reservation`]: they are noted in the core's [`Ledger`], which makes
//! their give-backs exact) go through a lock and run the core's own code.

mod outcome;
mod slot;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::builder::Builder;
use crate::clock::{Clock, SystemClock};
use crate::core::word::{self, Encoded, Quick, Settings, Step};
use crate::core::{Ledger, Limits, State, micros, stable_interval_micros};
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
/// lock; a warming-up one under a short lock. Waiting always happens outside,
/// so a sleeping caller never blocks others.
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
/// longer than about two hours and the warming-up policy (whose stored
/// permits have a price) run the core itself under a lock.
///
/// So does a reservation that has to wait and can be given back (an
/// `acquire` that sleeps, a [`Reservation`] with a delay): it is noted in
/// the core's [`Ledger`], and the limiter stays under the lock until every
/// such reservation's wait is over. That is what makes giving it back exact:
/// nobody is ever scheduled before a limiter that never made it would
/// schedule them. A caller that has to wait is about to sleep anyway; an
/// `acquire` with nothing owed, and every `reserve` and `try_reserve`, stay
/// on the lock-free word while no such reservation waits.
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
    /// Serializes rate changes, rebases and reservations that can be given
    /// back.
    locked: Mutex<Locked>,
    clock: C,
    metrics: Metrics,
}

/// What the lock holds.
struct Locked {
    /// The configuration as a core [`State`] (its two state fields are
    /// stale while the word holds the state), and the state itself in
    /// mutex mode.
    state: State,
    /// The reservations still waiting that can be given back (see
    /// [`Ledger`]). While it holds any, the limiter is in mutex mode: every
    /// reservation goes through it.
    ledger: Ledger,
    /// Several limits, for a limiter built with more than one: the word
    /// then stays in mutex mode, and every call goes through them (`state`
    /// and `ledger` are unused).
    limits: Option<Limits>,
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

    /// The word that publishes `state` at `now` in the generation after
    /// `word`'s (see [`word::publish`]), its configuration written first.
    fn publish(&self, word: u64, state: &State, now: u64) -> u64 {
        let (new, config) = word::publish(word, state, now);
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
    pub(crate) fn from_parts(state: State, clock: C) -> Self {
        let now = clock.now_micros();
        let slots = Slots([Slot::default(), Slot::default()]);
        // Published as the generation after the last one, i.e. generation 0.
        let word = slots.publish(u64::MAX, &state, now);
        RateLimiter {
            word: Word(AtomicU64::new(word)),
            slots,
            locked: Mutex::new(Locked {
                state,
                ledger: Ledger::new(),
                limits: None,
            }),
            clock,
            metrics: Metrics::default(),
        }
    }

    /// Records into `metrics` from now on.
    pub(crate) fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// A limiter that enforces every one of `limits` (see [`Limits`]): its
    /// word stays in mutex mode, so that every call reaches them.
    pub(crate) fn from_limits(limits: Limits, clock: C) -> Self {
        let limiter = Self::from_parts(limits.states()[0].clone(), clock);
        let word = word::mutex_mode(limiter.word.0.load(Acquire));
        limiter.word.0.store(word, Release);
        limiter.lock().limits = Some(limits);
        limiter
    }

    /// The locked part, whatever a panicking thread left behind: nothing
    /// panics while it is held mid-update.
    fn lock(&self) -> MutexGuard<'_, Locked> {
        self.locked.lock().unwrap_or_else(PoisonError::into_inner)
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
                    // One that can be given back waits in the ledger.
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

    /// [`reserve_micros`](Self::reserve_micros) under the lock, on the core
    /// itself: in mutex mode, to rebase, or when the word was written with a
    /// later clock reading than the caller's.
    #[cold]
    #[inline(never)]
    fn reserve_locked<O: Outcome>(&self, permits: u32, timeout: u64) -> Option<O> {
        let mut guard = self.lock();
        if let Some(limits) = &mut guard.limits {
            let now = self.clock.now_micros();
            let granted = limits.try_reserve(permits, now, timeout, O::GIVES_BACK)?;
            let bound_by = granted.bound_by.unwrap_or(0);
            return Some(O::from_limits(granted.wait_micros, granted.id, bound_by));
        }
        let (moment, record, now) = self.transact_in(&mut guard, |state, ledger, now| {
            state.can_acquire(now, timeout).then(|| {
                let (moment, record) = O::reserve(state, ledger, permits, now);
                (moment, record, now)
            })
        })?;
        Some(O::from_locked(moment.saturating_sub(now), record))
    }

    /// The word for `state` at `now`, in `current`'s generation if it fits
    /// there, else in a new one (or mutex mode).
    fn encode(&self, current: u64, state: &State, now: u64) -> u64 {
        match word::encode(current, state, now, &self.slots.of(current).config()) {
            Encoded::Word(new) => new,
            Encoded::Rebase | Encoded::Mutex => self.slots.publish(current, state, now),
        }
    }

    /// Gives back an unused reservation, through the ledger (see
    /// [`Ledger::give_back`]).
    fn give_back_taken(&self, taken: Taken) {
        match taken {
            Taken::Core(reserved) => self.update_locked(|state, ledger, now| {
                ledger.give_back(state, &reserved, now);
            }),
            Taken::Logged(id) => {
                if let Some(limits) = &mut self.lock().limits {
                    limits.give_back(id, self.clock.now_micros());
                }
            }
            Taken::Boxed(_) => {}
        }
        // Anything else is another limiter's: nothing of this one's.
    }

    /// Applies `update` to the core state and its ledger under the lock,
    /// whatever mode the word is in, and publishes the result.
    fn update_locked(&self, mut update: impl FnMut(&mut State, &mut Ledger, u64)) {
        self.transact(|state, ledger, now| {
            update(state, ledger, now);
            Some(())
        });
    }

    /// Runs `update` on the core state and its ledger under the lock,
    /// whatever mode the word is in: on the locked core in mutex mode, else
    /// on the state the word stands for, retried until its compare-and-swap
    /// wins. `None` from `update` changes nothing (a refused try). The word
    /// stays in (or enters) mutex mode while the ledger holds anything.
    #[cold]
    #[inline(never)]
    fn transact<R>(
        &self,
        update: impl FnMut(&mut State, &mut Ledger, u64) -> Option<R>,
    ) -> Option<R> {
        self.transact_in(&mut self.lock(), update)
    }

    /// [`transact`](Self::transact) with the lock held.
    fn transact_in<R>(
        &self,
        locked: &mut Locked,
        mut update: impl FnMut(&mut State, &mut Ledger, u64) -> Option<R>,
    ) -> Option<R> {
        loop {
            let current = self.word.0.load(Acquire);
            let now = self.clock.now_micros();
            if word::is_mutex(current) {
                let result = update(&mut locked.state, &mut locked.ledger, now)?;
                // Leave mutex mode if the word can hold the state again.
                if locked.ledger.is_empty() {
                    let new = self.slots.publish(current, &locked.state, now);
                    if !word::is_mutex(new) {
                        self.word.0.store(new, Release);
                    }
                }
                return Some(result);
            }
            // The word holds the state, so the ledger holds nothing.
            let mut state = self.state_at(&locked.state, current, now);
            let result = update(&mut state, &mut locked.ledger, now)?;
            let new = if locked.ledger.is_empty() {
                self.encode(current, &state, now)
            } else {
                word::mutex_mode(current)
            };
            if self
                .word
                .0
                .compare_exchange(current, new, AcqRel, Acquire)
                .is_ok()
            {
                if word::is_mutex(new) {
                    locked.state = state;
                }
                return Some(result);
            }
            // Lost to a reservation on the word: what the ledger noted of
            // this attempt is void (it was empty, and is again).
            locked.ledger.clear();
        }
    }

    /// The core state that `current` (not mutex mode) stands for at `now`,
    /// with the configuration in `locked`.
    fn state_at(&self, locked: &State, current: u64, now: u64) -> State {
        let config = self.slots.of(current).config();
        let decoded = word::decode(current, now, &config);
        let mut state = locked.clone();
        state.stored_permits = decoded.stored;
        state.next_free_micros = decoded.next_free;
        state.next_free_fraction = decoded.fraction;
        state
    }

    /// The state now, for `Debug`.
    fn state_now(&self) -> State {
        let locked = self.lock();
        let current = self.word.0.load(Acquire);
        if word::is_mutex(current) {
            locked.state.clone()
        } else {
            self.state_at(&locked.state, current, self.clock.now_micros())
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

    /// The wait in µs of a request made now.
    fn next_free_micros(&self) -> u64 {
        let current = self.word.0.load(Acquire);
        let now = self.clock.now_micros();
        let next_free = if word::is_mutex(current) {
            let locked = self.lock();
            match &locked.limits {
                Some(limits) => limits.earliest(now).0,
                None => locked.state.query_earliest_available(),
            }
        } else {
            let config = self.slots.of(current).config();
            word::decode(current, now, &config).next_free
        };
        next_free.saturating_sub(now)
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
        let locked = self.lock();
        let now = self.clock.now_micros();
        if let Some(limits) = &locked.limits {
            return Snapshot::of_limits(limits, now);
        }
        let current = self.word.0.load(Acquire);
        if word::is_mutex(current) {
            Snapshot::of(&locked.state, now, 0)
        } else {
            Snapshot::of(&self.state_at(&locked.state, current, now), now, 0)
        }
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
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN; the
    /// limiter is then unchanged.
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        let mut locked = self.lock();
        if let Some(limits) = &mut locked.limits {
            let first = limits.states()[0].permits_per_second;
            let factor = permits_per_second / first;
            let now = self.clock.now_micros();
            return Ok(limits.scale(factor, permits_per_second, now)?);
        }
        loop {
            let current = self.word.0.load(Acquire);
            let now = self.clock.now_micros();
            let mut state = if word::is_mutex(current) {
                locked.state.clone()
            } else {
                self.state_at(&locked.state, current, now)
            };
            state.set_rate(permits_per_second, now)?;
            // A new generation even if the configuration is unchanged: every
            // reservation computed with the old one must retry.
            let new = self.slots.publish(current, &state, now);
            if self
                .word
                .0
                .compare_exchange(current, new, AcqRel, Acquire)
                .is_ok()
            {
                locked.state = state;
                // Terms at the old rate: what is waiting now gives back only
                // if it is the latest (erring late).
                locked.ledger.clear();
                return Ok(());
            }
        }
    }

    /// The stable rate, in permits per second, as last set (of the first
    /// limit, for a limiter built with several).
    pub fn rate(&self) -> f64 {
        let locked = self.lock();
        match &locked.limits {
            Some(limits) => limits.states()[0].permits_per_second,
            None => locked.state.permits_per_second,
        }
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
        let mut locked = self.lock();
        let count = locked.limits.as_ref().map_or(1, |l| l.states().len());
        crate::error::check_limit(index, count)?;
        match &mut locked.limits {
            Some(limits) => {
                let now = self.clock.now_micros();
                Ok(limits.set_rate(Some(index), permits_per_second, now)?)
            }
            None => {
                drop(locked);
                self.set_rate(permits_per_second)
            }
        }
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
        self.give_back_taken(taken);
    }

    fn keep(&self, taken: Taken) {
        if let Taken::Core(reserved) = taken {
            self.update_locked(|_, ledger, _| ledger.keep(&reserved));
        }
    }
}

impl<C: Clock> fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits = self.lock().limits.clone();
        match limits {
            Some(limits) => f
                .debug_struct("RateLimiter")
                .field("limits", &limits.states())
                .finish_non_exhaustive(),
            None => f
                .debug_struct("RateLimiter")
                .field("state", &self.state_now())
                .finish_non_exhaustive(),
        }
    }
}
