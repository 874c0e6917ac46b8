//! One shard of a keyed limiter: its keys behind one read-write lock, the
//! limits they share, and the bookkeeping that keeps the shard small.
//!
//! # Two ways to hold a key
//!
//! Every key runs the core's [`Limits`], the one algorithm. A key of one
//! bursty limit with nothing logged is held as one `u64`, the [word] (a
//! fixed-point *theoretical arrival time* relative to the shard's base), in
//! an `AtomicU64` of a table of its own, so that the entry costs the key and
//! eight bytes. The common call, on a
//! key already held, takes the shard's lock for reading and runs the word's
//! step with one compare-and-swap, so calls on keys of one shard run side
//! by side.
//!
//! Every other key is held once, as limits of its own, boxed: several
//! limits, the warming-up policy, a log in use, a state the word cannot hold
//! (a debt past the word's window, permits stored behind a debt), the local
//! fallback of a Redis limiter. Every call that is not the word's step takes
//! the lock for writing (a new key, a reservation that records what it took,
//! a give-back, a rate change, a sweep, any call on a key held as limits); a
//! key held as a word runs it on the shard's scratch limits
//! ([`Table::template`]) and goes back to a word if it can.
//!
//! # Exact give-backs
//!
//! A reservation that has to wait and may be given back is logged in its
//! key's limits, which makes its give-back exact (the key's limits are
//! replayed without it). The key is held as limits, and never swept as full,
//! while its log holds anything; it goes back to a word at its first call
//! (or the shard's next sweep) once every reservation in the log was given
//! back or kept, or its moment passed. A reservation gives back only to the
//! entry it was made on.
//!
//! As for the local limiter, a step from a word with permits stored may
//! differ from the core by a rounding, at most 1 µs (stored permits are
//! held as time to 2^-20 µs); from a word with nothing stored it agrees to
//! the bit.

mod evict;
mod fallback;
mod give_back;
mod held;
mod rates;
#[cfg(test)]
mod tests;
use evict::{SWEEP_MIN_LEN, Sweep, sweep_period};
pub(super) use held::LogId;
use held::{HELD_AS_LIMITS, Held, start};

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use crate::Snapshot;
use crate::core::word::{self, Config, Encoded, Step};
use crate::core::{Granted, Limits, State};
use crate::meter::Metrics;

/// One shard: its keys behind a read-write lock.
pub(super) struct Shard<K> {
    table: RwLock<Table<K>>,
}

/// The keys of one shard.
pub(super) struct Table<K> {
    /// The limits every key runs under, with the key's numbers. Their own
    /// numbers are scratch space, where a key held as a word runs a call
    /// under the write lock; their log is empty between calls.
    template: Limits,
    /// The word configuration (words are of generation 0), when keys are
    /// held as words: one bursty limit that fits, keys that start full.
    config: Option<Config>,
    /// While keys can be words, every key held (one held as limits marked
    /// [`HELD_AS_LIMITS`]).
    words: HashMap<K, AtomicU64, RandomState>,
    /// Keys held as limits of their own.
    limits: HashMap<K, Box<Held>, RandomState>,
    /// The serial of the next entry held as limits.
    next_serial: u64,
    /// When the last sweep by time (or to the cap) ran (µs).
    last_sweep: u64,
    /// The number of entries from which a new key sweeps first.
    sweep_len: usize,
    /// The least time between two sweeps by time ([`sweep_period`]).
    sweep_period: u64,
    /// If the limiter's keys are capped: the cap, over every shard (see
    /// `make_room`), and this shard's share of it.
    cap: Option<Cap>,
    /// How many keys every shard of the limiter holds together, as each
    /// last let go of its write lock, and this shard's own count then.
    held: Arc<AtomicUsize>,
    published: usize,
    /// The latest clock reading a call under the write lock used: readings
    /// taken before the lock are raised to it.
    last_now: u64,
    /// How a key not held starts, and whether full entries are swept.
    mode: Mode,
    /// The limiter's metrics: the keys-held gauge.
    pub(super) metrics: Metrics,
}

/// A cap on a limiter's keys: at most `keys` held by every shard together
/// (see `make_room`), and a shard's `share` of them, which sizes what it
/// drops at once.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cap {
    pub(super) keys: usize,
    pub(super) share: usize,
}

/// How a keyed limiter treats the keys it does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A key not held is full, so full entries can be (and are) dropped:
    /// the public keyed limiter.
    Full,
    /// A key not held starts with nothing stored and no debt, and entries
    /// stay until taken or capped (they record what each key ran up): a
    /// Redis keyed limiter's local fallback.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Empty,
}

/// What one call on a shard dropped to stay within its cap.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Dropped {
    /// Entries dropped before they read as full (the cap).
    pub(super) unfinished: u64,
    /// At least the latest ticket among them (0 if none): the fallback of
    /// a Redis limiter opens new keys no earlier, erring towards limiting.
    pub(super) latest: u64,
    /// A new key was let in at the cap by a shard holding less than its
    /// share of it: room is made in the shard holding the most (see
    /// `make_room`).
    pub(super) elsewhere: bool,
}

/// A fast call's outcome, when it needs no write lock.
pub(super) enum Fast {
    /// Granted: the wait in µs.
    Granted(u64),
    /// The debt does not fit in the timeout: nothing reserved.
    Refused,
}

impl<K> Shard<K> {
    /// The table, for reading. Nothing panics while it is held mid-update,
    /// so a poisoned lock is taken as it is.
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Table<K>> {
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The table, for writing: what the call adds or drops is counted in
    /// the keys-held gauge, and in the keys all shards hold, when the lock
    /// is let go.
    pub(super) fn write(&self) -> Written<'_, K> {
        let table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        let len = table.len();
        Written { table, len }
    }

    /// [`write`](Self::write), unless the table is locked already.
    pub(super) fn try_write(&self) -> Option<Written<'_, K>> {
        let table = match self.table.try_write() {
            Ok(table) => table,
            Err(TryLockError::Poisoned(table)) => table.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        let len = table.len();
        Some(Written { table, len })
    }
}

/// A write-locked table, and how many keys it held when locked.
pub(super) struct Written<'a, K> {
    table: RwLockWriteGuard<'a, Table<K>>,
    len: usize,
}

impl<K> std::ops::Deref for Written<'_, K> {
    type Target = Table<K>;

    fn deref(&self) -> &Table<K> {
        &self.table
    }
}

impl<K> std::ops::DerefMut for Written<'_, K> {
    fn deref_mut(&mut self) -> &mut Table<K> {
        &mut self.table
    }
}

impl<K> Drop for Written<'_, K> {
    fn drop(&mut self) {
        let len = self.table.len();
        if len != self.len {
            self.table
                .metrics
                .keys_changed(len as isize - self.len as isize);
            self.table.publish();
        }
    }
}

/// A table dropped with its limiter takes the keys it holds off the
/// gauge (which counts the keys its limiters hold).
impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        let len = self.len();
        if len > 0 {
            self.metrics.keys_changed(-(len as isize));
        }
    }
}

impl<K: Hash + Eq + Clone> Shard<K> {
    pub(super) fn new(
        template: Limits,
        hasher: RandomState,
        cap: Option<Cap>,
        held: Arc<AtomicUsize>,
        mode: Mode,
        now: u64,
    ) -> Self {
        let sweep_period = sweep_period(&template);
        let mut table = Table {
            template,
            config: None,
            words: HashMap::with_hasher(hasher.clone()),
            limits: HashMap::with_hasher(hasher),
            next_serial: 0,
            last_sweep: now,
            sweep_len: SWEEP_MIN_LEN,
            sweep_period,
            cap,
            held,
            published: 0,
            last_now: now,
            mode,
            metrics: Metrics::default(),
        };
        table.configure(now);
        Shard {
            table: RwLock::new(table),
        }
    }

    /// The table, write-locked, and the time now for it ([`Table::clamp`]
    /// of `read`, the clock read before the lock so that no call waits
    /// under it).
    pub(super) fn write_at(&self, read: u64) -> (Written<'_, K>, u64) {
        let mut table = self.write();
        let now = table.clamp(read);
        (table, now)
    }
}

impl<K> Table<K> {
    pub(super) fn len(&self) -> usize {
        // See `words`.
        match self.config {
            Some(_) => self.words.len(),
            None => self.limits.len(),
        }
    }

    /// Counts this shard's keys in those every shard holds (its lock held),
    /// if the keys are capped (nothing else reads the count).
    fn publish(&mut self) {
        if self.cap.is_none() {
            return;
        }
        let len = self.len();
        if len >= self.published {
            self.held.fetch_add(len - self.published, Relaxed);
        } else {
            self.held.fetch_sub(self.published - len, Relaxed);
        }
        self.published = len;
    }

    /// How many keys every shard holds together now: the others' as they
    /// let go of their locks, this one's as it is.
    fn held_by_all(&self) -> usize {
        (self.held.load(Relaxed) + self.len()).saturating_sub(self.published)
    }

    /// The limits every key runs under (see the field).
    pub(super) fn template(&self) -> &Limits {
        &self.template
    }

    /// When the next sweep by time is due.
    fn next_sweep(&self) -> u64 {
        match self.mode {
            Mode::Full => self.last_sweep.saturating_add(self.sweep_period),
            Mode::Empty => u64::MAX,
        }
    }
}

impl<K: Hash + Eq + Clone> Table<K> {
    /// Reserves `permits` of `key`, if held as a word, with the lock held
    /// for reading: `None` if the call needs the write lock (a sweep is due,
    /// the key is not a word, or the step needs the limits). With
    /// `only_at_once`, a grant that would wait is left to the write lock too
    /// (which logs it).
    #[inline]
    pub(super) fn fast<Q>(
        &self,
        key: &Q,
        now: u64,
        permits: u32,
        timeout: u64,
        only_at_once: bool,
    ) -> Option<Fast>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let config = self.config.as_ref()?;
        if now >= self.next_sweep() {
            return None;
        }
        let cell = self.words.get(key)?;
        let mut current = cell.load(Relaxed);
        loop {
            match word::step(current, now, permits, timeout, config) {
                Step::Refused => return Some(Fast::Refused),
                Step::Slow => return None,
                Step::Granted { wait, .. } if only_at_once && wait > 0 => return None,
                Step::Granted { word: new, wait } => {
                    // The configuration cannot change under the read lock:
                    // only the word can, by another caller on this key.
                    match cell.compare_exchange_weak(current, new, Relaxed, Relaxed) {
                        Ok(_) => return Some(Fast::Granted(wait)),
                        Err(seen) => current = seen,
                    }
                }
            }
        }
    }

    /// `now` as read before the lock, raised to the shard's last reading so
    /// that time never runs backwards for a key; sweeps first if one is due
    /// by time.
    pub(super) fn clamp(&mut self, now: u64) -> u64 {
        let now = now.max(self.last_now);
        self.last_now = now;
        if now >= self.next_sweep() {
            self.sweep(now, Sweep::Time);
        }
        now
    }

    /// Reserves `permits` of `key` at `now` if its debt fits in `timeout`
    /// µs (`u64::MAX`: always), under the write lock, as its limits do. A
    /// `held` reservation that has to wait is logged, and returned with its
    /// ticket to give it back with. [`Dropped`]: as for
    /// [`update`](Self::update).
    pub(super) fn reserve<Q>(
        &mut self,
        key: &Q,
        now: u64,
        permits: u32,
        timeout: u64,
        held: bool,
    ) -> (Option<(Granted, Option<LogId>)>, Dropped)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.grant(key, now, |limits| {
            limits.try_reserve(permits, now, timeout, held)
        })
    }

    /// Reserves `cost` of `key` at `now` for an open call if its debt fits
    /// in `timeout` µs (see [`Limits::open`]), as [`reserve`](Self::reserve).
    pub(super) fn open_call<Q>(
        &mut self,
        key: &Q,
        now: u64,
        cost: &crate::core::Cost,
        timeout: u64,
    ) -> (Option<(Granted, Option<LogId>)>, Dropped)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.grant(key, now, |limits| limits.open(cost, now, timeout))
    }

    /// [`update`](Self::update) with a step that grants: the grant with
    /// its ticket, if it was logged.
    fn grant<Q>(
        &mut self,
        key: &Q,
        now: u64,
        step: impl FnOnce(&mut Limits) -> Option<Granted>,
    ) -> (Option<(Granted, Option<LogId>)>, Dropped)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (grant, dropped) = self.update(key, now, step);
        let grant = grant.map(|(granted, serial)| {
            let ticket = granted.id.map(|id| LogId { serial, id });
            (granted, ticket)
        });
        (grant, dropped)
    }

    /// Learns what an upstream answered to a call on `key` at `now` (see
    /// [`Limits::learn`]), as [`update`](Self::update).
    pub(super) fn learn<Q>(
        &mut self,
        key: &Q,
        now: u64,
        lesson: &crate::core::Lesson,
        learning: &crate::core::Learning,
    ) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (_, dropped) = self.update(key, now, |limits| {
            limits.learn(lesson, now, learning);
            Some(())
        });
        dropped
    }

    /// Runs `step` on the limits of `key` at `now` (a key not held starts
    /// as [`Mode`] says) and keeps what it leaves if it returns `Some`.
    /// Returns `step`'s result with the serial of the entry it ran on
    /// (meaningful while that entry logs anything), and what had to be
    /// dropped to make room for a new key.
    fn update<Q, R>(
        &mut self,
        key: &Q,
        now: u64,
        step: impl FnOnce(&mut Limits) -> Option<R>,
    ) -> (Option<(R, u64)>, Dropped)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if !self.limits.is_empty()
            && let Some(entry) = self.limits.get_mut(key)
        {
            let serial = entry.serial;
            let result = step(&mut entry.limits);
            if result.is_some() {
                self.settle(key, now);
            }
            return (result.map(|r| (r, serial)), Dropped::default());
        }
        // (A key marked as held as limits was found above.)
        let dropped = match (&self.config, self.words.get_mut(key)) {
            (Some(config), Some(cell)) => {
                let state = &mut self.template.states_mut()[0];
                word::decode_into(*cell.get_mut(), now, config, state);
                Dropped::default()
            }
            _ => {
                // Room first, while the template holds the configured
                // limits: a sweep reads their rates and bursts, which a
                // step can change (a lesson), and would drop keys as full
                // by another key's learned burst. (A new key's step is
                // never refused: it starts with no debt.)
                let dropped = self.make_room(now);
                for state in self.template.states_mut() {
                    start(state, self.mode, now);
                }
                dropped
            }
        };
        let Some(result) = step(&mut self.template) else {
            return (None, dropped);
        };
        let serial = self.keep_scratch(key, now);
        (Some((result, serial)), dropped)
    }

    /// [`Limits::paused_until`] of `key`, if it is held by its limits.
    pub(super) fn paused_until<Q>(&self, key: &Q, now: u64) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.limits.get(key)?.limits.paused_until(now)
    }

    /// What `key` holds at `now` (a missing key: as it would start).
    pub(super) fn snapshot_of<Q>(&self, key: &Q, now: u64) -> Snapshot
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = now.max(self.last_now);
        if let Some(entry) = self.limits.get(key) {
            return Snapshot::of_limits(&entry.limits, now);
        }
        if let Some(config) = &self.config
            && let Some(cell) = self.words.get(key)
        {
            let template = &self.template.states()[0];
            return Snapshot::of_word(cell.load(Relaxed), now, config, template);
        }
        let snapshots = self.template.states().iter().enumerate().map(|(i, s)| {
            let mut state = s.clone();
            start(&mut state, self.mode, now);
            Snapshot::of(&state, now, i)
        });
        Snapshot::binding(snapshots).expect("limits are never empty")
    }
}

impl<K> fmt::Debug for Shard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard").finish_non_exhaustive()
    }
}
