//! The local limiter's lock: [`Limits`] run in mutex mode, the moves between
//! the word and the lock, rate changes and give-backs.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
use std::sync::{MutexGuard, PoisonError};

use super::Single;
use super::outcome::Outcome;
use crate::clock::Clock;
use crate::core::word::{self, Encoded, Settings};
use crate::core::{Cost, Granted, InvalidRate, Learning, Lesson, Limits};
use crate::reservation::GiveBackId;
use crate::{Error, Snapshot};

impl<C: Clock> Single<C> {
    /// The limits, whatever a panicking thread left behind: nothing panics
    /// while they are held mid-update.
    pub(super) fn lock(&self) -> MutexGuard<'_, Limits> {
        self.limits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`reserve_micros`](Self::reserve_micros) under the lock, on the
    /// limits themselves: in mutex mode, to rebase, for a reservation that
    /// waits and may be given back (it is logged), or when the word was
    /// written with a later clock reading than the caller's.
    #[cold]
    #[inline(never)]
    pub(super) fn reserve_locked<O: Outcome>(&self, permits: u32, timeout: u64) -> Option<O> {
        let granted = self.transact(&mut self.lock(), |limits, now| {
            limits.try_reserve(permits, now, timeout, O::GIVES_BACK)
        })?;
        Some(O::from_granted(granted))
    }

    /// Runs `update` on the limits under the lock for the logged
    /// reservation or open call `taken` (anything else is another
    /// limiter's: nothing of this one's), given its id and the time;
    /// `false` changes nothing (once the word holds the state again, the
    /// log has emptied: the moment passed, or a rate changed).
    pub(super) fn on_logged(
        &self,
        taken: &GiveBackId,
        update: impl Fn(&mut Limits, u64, u64) -> bool,
    ) -> bool {
        let GiveBackId::Logged(id) = *taken else {
            return false;
        };
        let done = self.transact(&mut self.lock(), |limits, now| {
            update(limits, id, now).then_some(())
        });
        done.is_some()
    }

    /// Reserves `cost` for an open call if the wait fits in `timeout` µs
    /// (see [`Limits::open`]): it is logged, so the limiter is in mutex
    /// mode until the call ends.
    pub(super) fn open_call(&self, cost: &Cost, timeout: u64) -> Option<Granted> {
        self.transact(&mut self.lock(), |limits, now| {
            limits.open(cost, now, timeout)
        })
    }

    /// Learns what an upstream answered (see [`Limits::learn`]): a rate
    /// change, published as one.
    pub(super) fn learn_locked(&self, lesson: &Lesson, learning: &Learning) {
        let learned = self.reconfigure(|limits, now| {
            limits.learn(lesson, now, learning);
            Ok(())
        });
        debug_assert!(learned.is_ok(), "learning sets valid rates");
    }

    /// Runs `update` on the limits under the lock (held in `limits`),
    /// whatever mode the word is in: in mutex mode on the limits as they
    /// are, else on the state the word stands for, retried until its
    /// compare-and-swap wins. `None` from `update` changes nothing (a
    /// refused try). The word stays in (or enters) mutex mode while the
    /// log holds anything, and comes back as soon as the limits fit it.
    fn transact<R>(
        &self,
        limits: &mut Limits,
        mut update: impl FnMut(&mut Limits, u64) -> Option<R>,
    ) -> Option<R> {
        loop {
            let current = self.word.0.load(Acquire);
            let now = self.clock.now_micros();
            if word::is_mutex(current) {
                let result = update(limits, now)?;
                // Leave mutex mode if the word can hold the limits again.
                let new = self.slots.publish(current, limits, now);
                if !word::is_mutex(new) {
                    self.word.0.store(new, Release);
                }
                return Some(result);
            }
            // The word holds the state, so nothing is logged.
            self.load(limits, current, now);
            let result = update(limits, now)?;
            let new = if limits.log_is_empty() {
                self.encode(current, limits, now)
            } else {
                word::mutex_mode(current)
            };
            if self
                .word
                .0
                .compare_exchange(current, new, AcqRel, Acquire)
                .is_ok()
            {
                return Some(result);
            }
            // Lost to a reservation on the word: what the log noted of
            // this attempt is void (it was empty, and is again).
            limits.clear_log();
        }
    }

    /// Applies `change` (a rate change) to the limits at `now`, whatever
    /// mode the word is in, and publishes them in a new generation even if
    /// nothing changed: every reservation computed with the old
    /// configuration must retry. The rate gauge follows the first limit
    /// (learned or set: one place for both).
    pub(super) fn reconfigure(
        &self,
        change: impl Fn(&mut Limits, u64) -> Result<(), InvalidRate>,
    ) -> Result<(), Error> {
        let mut limits = self.lock();
        loop {
            let current = self.word.0.load(Acquire);
            let now = self.clock.now_micros();
            let mut next = limits.clone();
            if !word::is_mutex(current) {
                self.load(&mut next, current, now);
            }
            change(&mut next, now)?;
            let new = self.slots.publish(current, &next, now);
            if self
                .word
                .0
                .compare_exchange(current, new, AcqRel, Acquire)
                .is_ok()
            {
                *limits = next;
                self.metrics.rate(limits.states()[0].permits_per_second());
                return Ok(());
            }
        }
    }

    /// Loads into `limits` (one limit, nothing logged) the state that
    /// `current` (not mutex mode) stands for at `now`.
    fn load(&self, limits: &mut Limits, current: u64, now: u64) {
        let config = self.slots.of(current).config();
        word::decode_into(current, now, &config, &mut limits.states_mut()[0]);
    }

    /// The word for `limits` (one limit, nothing logged) at `now`, in
    /// `current`'s generation if it fits there, else in a new one (or mutex
    /// mode).
    fn encode(&self, current: u64, limits: &Limits, now: u64) -> u64 {
        let config = self.slots.of(current).config();
        match word::encode(current, &limits.states()[0], now, &config) {
            Encoded::Word(new) => new,
            Encoded::Rebase | Encoded::Mutex => self.slots.publish(current, limits, now),
        }
    }

    /// The limits as they stand now (the word's state loaded into the one
    /// limit, outside mutex mode), read under the lock, as
    /// [`snapshot_locked`](Self::snapshot_locked) reads them: the word's
    /// slot is not rewritten meanwhile.
    pub(super) fn limits_now(&self) -> Limits {
        let guard = self.lock();
        let mut limits = guard.clone();
        let current = self.word.0.load(Acquire);
        if !word::is_mutex(current) {
            self.load(&mut limits, current, self.clock.now_micros());
        }
        drop(guard);
        limits
    }

    /// What the limits hold now (see [`Snapshot::of_limits`]).
    pub(super) fn snapshot_locked(&self) -> Snapshot {
        let limits = self.lock();
        let now = self.clock.now_micros();
        let current = self.word.0.load(Acquire);
        if word::is_mutex(current) {
            return Snapshot::of_limits(&limits, now);
        }
        let config = self.slots.of(current).config();
        Snapshot::of_word(current, now, &config, &limits.states()[0])
    }
}
