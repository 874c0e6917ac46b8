//! One shard of a keyed limiter: its keys' states behind one read-write
//! lock, the configuration they share, and the bookkeeping that keeps the
//! shard small.
//!
//! # Two ways to hold a key
//!
//! A bursty key's state is one `u64`, the lock-free local limiter's
//! [word](crate::local::word) (a fixed-point *theoretical arrival time*
//! relative to the shard's base), in an `AtomicU64`. The common call, on a
//! key already held, takes the shard's lock for reading and runs the word's
//! step with one compare-and-swap, so calls on keys of one shard run side by
//! side; an entry costs the key and eight bytes.
//!
//! Every other call takes the lock for writing and runs the
//! [core](crate::core) on the key's state, decoded from its word and encoded
//! back: a new key, a reservation that records what it took (to be given
//! back), a give-back, a rate change, a sweep. A state the word cannot hold
//! (a warming-up policy, a debt past the word's window, permits stored
//! behind a debt, the local fallback of a Redis limiter) is kept as the
//! core's numbers in a second map, and runs on the core under the write lock.
//!
//! # Exact give-backs
//!
//! A reservation that has to wait and may be given back is noted in its
//! key's [`Ledger`], in a third map, which makes its give-back exact: nobody
//! is ever scheduled earlier than a key that never made the cancelled
//! reservations would schedule them (the reasoning is the ledger's). While a
//! key has a ledger, every call on it runs under the write lock, through
//! the ledger; the read-locked step is for keys without one (a look at
//! whether the shard holds any ledger at all, then at the key). A ledger
//! lives while it can still change what a give-back does: while one of its
//! reservations may still wait, then while the last of them could still be
//! restored (nothing noted since, the key still in the state it left). It
//! goes at the first call on its key after that (or at the shard's next
//! sweep), or with its key when the key is dropped; a key is never swept as
//! full while one of its reservations may still wait.
//!
//! As for the local limiter, a step from a word with permits stored may
//! differ from the core by a rounding, at most 1 µs (stored permits are
//! held as time to 2^-20 µs); from a word with nothing stored it agrees to
//! the bit.

mod entry;
mod evict;
mod fallback;
mod give_back;
use entry::{Entry, Waiting};
use evict::{SWEEP_MIN_LEN, Sweep, sweep_period};

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use crate::Snapshot;
use crate::core::word::{self, Config, Encoded, Step};
use crate::core::{GiveBack, Ledger, Reserved, State};
use crate::metrics::Metrics;

/// A reservation with a wait, made under the write lock: the core's record
/// and the serial of the ledger it was noted in, to give it back with.
#[derive(Debug)]
pub(super) struct Recorded {
    pub(super) reserved: Reserved,
    serial: u64,
}

/// One shard: its keys behind a read-write lock.
pub(super) struct Shard<K> {
    table: RwLock<Table<K>>,
}

/// The keys of one shard.
pub(super) struct Table<K> {
    /// The configuration every key runs under: a key's state is this with
    /// the key's numbers.
    template: State,
    /// The word configuration (words are of generation 0), when keys are
    /// held as words.
    config: Option<Config>,
    /// Keys held as words.
    words: HashMap<K, AtomicU64, RandomState>,
    /// Keys held as the core's numbers.
    states: HashMap<K, Entry, RandomState>,
    /// The ledgers of the keys with reservations that may still be waiting
    /// (each such key is held in `words` or `states` too). Empty, and
    /// holding no memory, when no key has one.
    ledgers: HashMap<K, Waiting, RandomState>,
    /// The serial of the next ledger.
    next_serial: u64,
    /// When the last sweep by time (or to the cap) ran (µs).
    last_sweep: u64,
    /// The number of entries from which a new key sweeps first.
    sweep_len: usize,
    /// The least time between two sweeps by time: the refill period, and
    /// at least [`SWEEP_MIN_PERIOD`].
    sweep_period: u64,
    /// The most entries this shard may hold, if capped.
    cap: Option<usize>,
    /// The latest clock reading a call under the write lock used: readings
    /// taken before the lock are raised to it.
    last_now: u64,
    /// How a key not held starts, and whether full entries are swept.
    mode: Mode,
    /// The limiter's metrics: the keys-held gauge.
    pub(super) metrics: Metrics,
}

/// How a keyed limiter treats the keys it does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A key not held is full, so full entries can be (and are) dropped:
    /// the public keyed limiter.
    Full,
    /// A key not held starts with nothing stored and no debt, and entries
    /// stay until taken or capped: a Redis keyed limiter's local fallback,
    /// whose keys open with no burst and whose entries record what each
    /// key ran up locally.
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
    /// the keys-held gauge when the lock is let go.
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
        }
    }
}

impl<K: Hash + Eq + Clone> Shard<K> {
    pub(super) fn new(
        template: State,
        hasher: RandomState,
        cap: Option<usize>,
        mode: Mode,
        now: u64,
    ) -> Self {
        let sweep_period = sweep_period(&template);
        let mut table = Table {
            template,
            config: None,
            words: HashMap::with_hasher(hasher.clone()),
            states: HashMap::with_hasher(hasher.clone()),
            ledgers: HashMap::with_hasher(hasher),
            next_serial: 0,
            last_sweep: now,
            sweep_len: SWEEP_MIN_LEN,
            sweep_period,
            cap,
            last_now: now,
            mode,
            metrics: Metrics::default(),
        };
        table.configure(now);
        Shard {
            table: RwLock::new(table),
        }
    }

    /// The table, write-locked, and the time now for it: `read` (the clock,
    /// read before the lock so that no call waits under it) raised to the
    /// shard's latest reading, so that time never runs backwards for a key.
    /// Sweeps first if a sweep is due by time.
    pub(super) fn write_at(&self, read: u64) -> (Written<'_, K>, u64) {
        let mut table = self.write();
        let now = table.clamp(read);
        (table, now)
    }
}

impl<K> Table<K> {
    pub(super) fn len(&self) -> usize {
        self.words.len() + self.states.len()
    }

    pub(super) fn template(&self) -> &State {
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
    /// the key is not a word or has a ledger, or the step needs the core). With
    /// `only_at_once`, a grant that would wait is left to the write lock too
    /// (which records it).
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
        // A key with a ledger runs through it, under the write lock.
        if !self.ledgers.is_empty() && self.ledgers.contains_key(key) {
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

    /// Sets the word configuration for the template at `now` (none if its
    /// keys cannot be words), re-encoding every key held.
    fn configure(&mut self, now: u64) {
        let old = self.config;
        self.config = match self.mode {
            Mode::Full => Config::new(&self.template, now),
            Mode::Empty => None,
        };
        let template = &self.template;
        let mut moved = Vec::new();
        match (old, self.config) {
            (None, None) => {}
            (Some(old), new) => {
                for (key, cell) in self.words.iter_mut() {
                    let entry = Entry::decoded(*cell.get_mut(), now, &old);
                    match new.map(|new| word::encode(0, &entry.state(template), now, &new)) {
                        Some(Encoded::Word(new)) => *cell.get_mut() = new,
                        _ => moved.push((key.clone(), entry)),
                    }
                }
                for (key, entry) in moved {
                    self.words.remove(&key);
                    self.states.insert(key, entry);
                }
            }
            (None, Some(_)) => {}
        }
        // Entries held as numbers become words where they can.
        if self.config.is_some() && !self.states.is_empty() {
            let states = std::mem::take(&mut self.states);
            for (key, entry) in states {
                let state = entry.state(&self.template);
                match self.encode(&state, now) {
                    Some(word) => {
                        self.words.insert(key, AtomicU64::new(word));
                    }
                    None => {
                        self.states.insert(key, entry);
                    }
                }
            }
        }
    }

    /// `state` as a word, if the configuration holds words and this state
    /// fits one (rebasing the shard first if that is what it takes).
    fn encode(&mut self, state: &State, now: u64) -> Option<u64> {
        let config = self.config?;
        match word::encode(0, state, now, &config) {
            Encoded::Word(word) => Some(word),
            Encoded::Mutex => None,
            Encoded::Rebase if word::worth_rebasing(&config, now) => {
                self.configure(now);
                match word::encode(0, state, now, &self.config?) {
                    Encoded::Word(word) => Some(word),
                    _ => None,
                }
            }
            Encoded::Rebase => None,
        }
    }

    /// The state of `key` at `now`, if held.
    fn get<Q>(&mut self, key: &Q, now: u64) -> Option<State>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(config) = &self.config
            && let Some(cell) = self.words.get_mut(key)
        {
            return Some(Entry::decoded(*cell.get_mut(), now, config).state(&self.template));
        }
        self.states
            .get(key)
            .map(|entry| entry.state(&self.template))
    }

    /// Holds `state` as `key`'s, held already or not, as a word if it can.
    fn put<Q>(&mut self, key: &Q, state: &State, now: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.encode(state, now) {
            Some(word) => {
                if let Some(cell) = self.words.get_mut(key) {
                    *cell.get_mut() = word;
                    return;
                }
                self.states.remove(key);
                self.words.insert(key.to_owned(), AtomicU64::new(word));
            }
            None => {
                if let Some(entry) = self.states.get_mut(key) {
                    *entry = Entry::of(state);
                    return;
                }
                self.words.remove(key);
                self.states.insert(key.to_owned(), Entry::of(state));
            }
        }
    }

    /// The state of a key that is not here: a limiter idle for a long time,
    /// full (bursty) or cold (warming-up), whose next request goes now.
    fn full_state(&self, now: u64) -> State {
        let mut state = self.template.clone();
        state.stored_permits = match self.mode {
            Mode::Full => state.max_permits,
            Mode::Empty => 0.0,
        };
        state.next_free_micros = now;
        state.next_free_fraction = 0;
        state
    }

    /// `now` as read before the lock, never below the shard's last reading;
    /// sweeps first if one is due by time.
    pub(super) fn clamp(&mut self, now: u64) -> u64 {
        let now = now.max(self.last_now);
        self.last_now = now;
        if now >= self.next_sweep() {
            self.sweep(now, Sweep::Time);
        }
        now
    }

    /// Reserves `permits` of `key` at `now` if its debt fits in `timeout`
    /// µs (`u64::MAX`: always), under the write lock. Returns the wait and,
    /// for a reservation that has to wait and is `record`ed (to be given
    /// back), what to give it back with; and what had to be dropped to make
    /// room for a new key.
    ///
    /// A key with a ledger runs through it, every reservation noted. A
    /// recorded reservation that has to wait is noted in its key's ledger,
    /// a new one if the key has none. A plain reservation of a key without
    /// one loses nothing by running on the state alone.
    pub(super) fn reserve<Q>(
        &mut self,
        key: &Q,
        now: u64,
        permits: u32,
        timeout: u64,
        record: bool,
    ) -> (Option<(u64, Option<Recorded>)>, Dropped)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if !self.ledgers.is_empty() && self.ledgers.contains_key(key) {
            let grant = self.reserve_noted(key, now, permits, timeout, record);
            return (grant, Dropped::default());
        }
        let mut ledger = Ledger::new();
        let (grant, dropped) = self.update(key, now, |state| {
            if !fits(state, now, timeout) {
                return None;
            }
            Some(if record {
                let reserved = ledger.reserve_recorded(state, permits, now);
                let wait = reserved.moment_micros.saturating_sub(now);
                (wait, Some((reserved, Entry::of(state))))
            } else {
                (state.reserve(permits, now), None)
            })
        });
        let Some((wait, noted)) = grant else {
            return (None, dropped);
        };
        // Only a reservation that has to wait has a group in the ledger, and
        // can be given back.
        let recorded = match noted {
            Some((reserved, after)) if reserved.waiting_id.is_some() => {
                let serial = self.next_serial;
                self.next_serial += 1;
                let waiting = Waiting {
                    ledger,
                    serial,
                    until: reserved.moment_micros,
                    last: Some(after),
                };
                self.ledgers.insert(key.to_owned(), waiting);
                Some(Recorded { reserved, serial })
            }
            _ => None,
        };
        (Some((wait, recorded)), dropped)
    }

    /// [`reserve`](Self::reserve) of a key with a ledger: through it.
    fn reserve_noted<Q>(
        &mut self,
        key: &Q,
        now: u64,
        permits: u32,
        timeout: u64,
        record: bool,
    ) -> Option<(u64, Option<Recorded>)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut state = self.get(key, now).expect("a key with a ledger is held");
        if !fits(&state, now, timeout) {
            return None;
        }
        let waiting = self.ledgers.get_mut(key).expect("just seen");
        // Noted: the last reservation with a wait is no longer the latest.
        waiting.last = None;
        let (moment, recorded) = if record {
            let reserved = waiting.ledger.reserve_recorded(&mut state, permits, now);
            let recorded = reserved.waiting_id.is_some().then(|| {
                waiting.until = waiting.until.max(reserved.moment_micros);
                waiting.last = Some(Entry::of(&state));
                Recorded {
                    reserved,
                    serial: waiting.serial,
                }
            });
            (reserved.moment_micros, recorded)
        } else {
            (waiting.ledger.reserve(&mut state, permits, now), None)
        };
        if !waiting.needed(&Entry::of(&state), now) {
            self.forget_ledger(key);
        }
        self.put(key, &state, now);
        Some((moment.saturating_sub(now), recorded))
    }

    /// Runs `step` on the state of `key` at `now` (a missing key reads as
    /// full) and keeps the result if `step` returns `Some`. Returns `step`'s
    /// result, and what had to be dropped to make room for a new key.
    pub(super) fn update<Q, R>(
        &mut self,
        key: &Q,
        now: u64,
        step: impl FnOnce(&mut State) -> Option<R>,
    ) -> (Option<R>, Dropped)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // One lookup for a key held either way.
        if let Some(entry) = self.states.get_mut(key) {
            // The template's own numbers are scratch space: the key's state
            // runs in place, with no copy of the configuration.
            let state = &mut self.template;
            entry.load_into(state);
            let result = step(state);
            if result.is_some() {
                *entry = Entry::of(state);
                if self.config.is_some() {
                    // It may fit a word again (a debt back in the window).
                    let state = self.template.clone();
                    self.put(key, &state, now);
                }
            }
            return (result, Dropped::default());
        }
        if let Some(config) = self.config
            && let Some(cell) = self.words.get_mut(key)
        {
            let mut state = Entry::decoded(*cell.get_mut(), now, &config).state(&self.template);
            let result = step(&mut state);
            if result.is_some() {
                match word::encode(0, &state, now, &config) {
                    Encoded::Word(word) => *cell.get_mut() = word,
                    _ => self.put(key, &state, now), // a rebase, or numbers
                }
            }
            return (result, Dropped::default());
        }
        let mut state = self.full_state(now);
        let Some(result) = step(&mut state) else {
            return (None, Dropped::default());
        };
        let dropped = self.make_room(now);
        self.put(key, &state, now);
        (Some(result), dropped)
    }

    /// What `key` holds at `now` (a missing key: as it would start).
    pub(super) fn snapshot_of<Q>(&self, key: &Q, now: u64) -> Snapshot
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = now.max(self.last_now);
        match held_entry(&self.words, &self.states, self.config.as_ref(), key, now) {
            Some(entry) => Snapshot::of(&entry.state(&self.template), now, 0),
            None => Snapshot::of(&self.full_state(now), now, 0),
        }
    }

    /// The ticket of `key` (`now` for a missing key).
    pub(super) fn next_free<Q>(&self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(config) = &self.config
            && let Some(cell) = self.words.get(key)
        {
            return word::decode(cell.load(Relaxed), now, config)
                .next_free
                .max(now);
        }
        self.states
            .get(key)
            .map_or(now, |entry| entry.next_free_micros)
    }
}

impl<K> fmt::Debug for Shard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard").finish_non_exhaustive()
    }
}

/// Whether a reservation at `now` fits in `timeout` µs (`u64::MAX`: always).
fn fits(state: &State, now: u64, timeout: u64) -> bool {
    timeout == u64::MAX || state.can_acquire(now, timeout)
}

/// The entry of `key` at `now`, held in `words` (under `config`) or in
/// `states`.
fn held_entry<K, Q>(
    words: &HashMap<K, AtomicU64, RandomState>,
    states: &HashMap<K, Entry, RandomState>,
    config: Option<&Config>,
    key: &Q,
    now: u64,
) -> Option<Entry>
where
    K: Borrow<Q> + Hash + Eq,
    Q: Hash + Eq + ?Sized,
{
    if let Some(config) = config
        && let Some(cell) = words.get(key)
    {
        return Some(Entry::decoded(cell.load(Relaxed), now, config));
    }
    states.get(key).copied()
}
