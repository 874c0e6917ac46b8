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

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::core::{GiveBack, Ledger, Reserved, State};
use crate::local::word::{self, Config, Encoded, Slot, Step};

/// One key's state as the core's numbers: its stored permits and ticket.
/// (Its ticket also tells when it was last used: a reservation moves it to
/// at least its moment, so the entries whose tickets lie furthest back are
/// the least recently used.)
#[derive(Debug, Clone, Copy)]
struct Entry {
    stored_permits: f64,
    next_free_micros: u64,
    next_free_fraction: u32,
}

impl Entry {
    /// The key's part of `state`.
    fn of(state: &State) -> Entry {
        Entry {
            stored_permits: state.stored_permits,
            next_free_micros: state.next_free_micros,
            next_free_fraction: state.next_free_fraction,
        }
    }

    /// The state a word stands for at `now`.
    fn decoded(word: u64, now: u64, config: &Config) -> Entry {
        let decoded = word::decode(word, now, config);
        Entry {
            stored_permits: decoded.stored,
            next_free_micros: decoded.next_free,
            next_free_fraction: decoded.fraction,
        }
    }

    /// Puts the key's part into `state` (the configuration's).
    fn load_into(&self, state: &mut State) {
        state.stored_permits = self.stored_permits;
        state.next_free_micros = self.next_free_micros;
        state.next_free_fraction = self.next_free_fraction;
    }

    /// The key's state under `template`'s configuration.
    fn state(&self, template: &State) -> State {
        let mut state = template.clone();
        self.load_into(&mut state);
        state
    }
}

/// A key's [`Ledger`], beside its entry, while a reservation noted in it may
/// still be waiting.
#[derive(Debug)]
struct Waiting {
    ledger: Ledger,
    /// Tells this ledger from the key's earlier and later ones: a
    /// reservation gives back only through the ledger it was noted in.
    serial: u64,
    /// The latest moment of the reservations noted in it with a wait: from
    /// then on none can wait any more, and the ledger is needed only to
    /// restore the latest of them (see [`Waiting::needed`]).
    until: u64,
    /// The key's state right after the last reservation noted with a wait,
    /// while nothing else has been noted since and it has not been
    /// restored: as long as the key is still in that state, giving that
    /// reservation back restores it exactly, even once its moment has
    /// passed (as [`Ledger::give_back`] does).
    last: Option<Entry>,
}

impl Waiting {
    /// Whether the ledger can still change what a give-back does, with the
    /// key in `state` at `now`: while one of its reservations may still
    /// wait, or its last one may still be restored. Once neither holds, its
    /// reservations give back nothing, as they would through it, and later
    /// ones run through a new ledger exactly as through this one (its next
    /// call would merge every group).
    fn needed(&self, state: &Entry, now: u64) -> bool {
        now < self.until
            || self.last.is_some_and(|last| {
                !self.ledger.is_empty()
                    && last.stored_permits.to_bits() == state.stored_permits.to_bits()
                    && last.next_free_micros == state.next_free_micros
                    && last.next_free_fraction == state.next_free_fraction
            })
    }
}

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
    /// The word configuration (in slot 0; words are of generation 0), when
    /// keys are held as words.
    config: Option<Config>,
    slots: [Slot; 2],
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

/// The least time between two sweeps by time (µs); see [`Sweep`].
const SWEEP_MIN_PERIOD: u64 = 1_000_000;

/// See [`SWEEP_MIN_PERIOD`].
const SWEEP_MIN_LEN: usize = 64;

/// A pass that drops entries reading as full, as part of an ordinary call.
/// Which entries reading as full it drops depends on why it runs, so that a
/// key in use is not dropped and made again at every pass (at a high rate,
/// a key reads as full a moment after each call).
#[derive(Debug, Clone, Copy)]
enum Sweep {
    /// At the first call a sweep period (the refill period, and at least
    /// [`SWEEP_MIN_PERIOD`]) after the last sweep by time: the entries idle
    /// for half a period at least, so that a shard flooded once shrinks as
    /// soon as it is used again. One pass per period.
    Time,
    /// When a new key finds the shard twice as large as after the last
    /// sweep (and [`SWEEP_MIN_LEN`] at least): the entries idle since the
    /// last sweep by time. A pass over `n` entries follows at least `n / 2`
    /// new keys: constant work per call, amortized.
    Growth,
    /// When a new key finds the shard at its cap: every entry that reads as
    /// full, before any that does not is dropped.
    Cap,
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

    /// The table, for writing.
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, Table<K>> {
        self.table.write().unwrap_or_else(PoisonError::into_inner)
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
            slots: Default::default(),
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
    pub(super) fn write_at(&self, read: u64) -> (RwLockWriteGuard<'_, Table<K>>, u64) {
        let mut table = self.write();
        let now = table.clamp(read);
        (table, now)
    }
}

/// The least time between two sweeps by time, for keys of `template`.
fn sweep_period(template: &State) -> u64 {
    template.refill_micros().max(SWEEP_MIN_PERIOD)
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
        if self.config.is_none() || now >= self.next_sweep() {
            return None;
        }
        // A key with a ledger runs through it, under the write lock.
        if !self.ledgers.is_empty() && self.ledgers.contains_key(key) {
            return None;
        }
        let cell = self.words.get(key)?;
        let mut current = cell.load(Relaxed);
        loop {
            match word::step(current, now, permits, timeout, &self.slots) {
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
        if let Some(config) = &self.config {
            self.slots[0].store(config);
        }
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

    /// Drops the entries that read as full at `now` and were last used
    /// before `before` (see [`Sweep`]), except those with a reservation that
    /// may still wait, then the ledgers no longer needed (see
    /// [`Waiting::needed`]), and gives memory back once the maps are mostly
    /// empty.
    fn sweep(&mut self, now: u64, kind: Sweep) {
        let before = match kind {
            Sweep::Time => {
                self.last_sweep = now;
                now.saturating_sub(self.sweep_period / 2)
            }
            Sweep::Growth => self.last_sweep,
            Sweep::Cap => u64::MAX,
        };
        let template = &self.template;
        let ledgers = &self.ledgers;
        // Even reading as full, a key whose give-backs may still move its
        // state is kept with its ledger. (One whose reservations have all
        // passed their moment goes: restoring the last one would leave it
        // full too.)
        let waits =
            |key: &K| !ledgers.is_empty() && ledgers.get(key).is_some_and(|w| now < w.until);
        if let Some(config) = &self.config {
            self.words.retain(|key, cell| {
                let word = *cell.get_mut();
                !(word::last_use(word, config) < before
                    && reads_as_full(template, &Entry::decoded(word, now, config), now)
                    && !waits(key))
            });
        }
        self.states.retain(|key, entry| {
            !(entry.next_free_micros < before && reads_as_full(template, entry, now) && !waits(key))
        });
        self.forget_ledgers(now);
        self.sweep_len = (2 * self.len()).max(SWEEP_MIN_LEN);
        // After a flood of keys a map keeps its size: give the memory back
        // once it is mostly empty.
        for (len, capacity) in [
            (self.words.len(), self.words.capacity()),
            (self.states.len(), self.states.capacity()),
        ] {
            if capacity > 4 * len.max(SWEEP_MIN_LEN) {
                self.words.shrink_to(2 * self.words.len());
                self.states.shrink_to(2 * self.states.len());
                break;
            }
        }
    }

    /// Makes room for one more entry: a sweep by growth when the shard has
    /// doubled since the last sweep; under the cap, the entries that read as
    /// full and, if that is not enough, the least recently used sixteenth
    /// of the shard (so that a flood of new keys costs a constant amount of
    /// work per key, amortized).
    fn make_room(&mut self, now: u64) -> Dropped {
        if self.mode == Mode::Full && self.len() >= self.sweep_len {
            self.sweep(now, Sweep::Growth);
        }
        let Some(cap) = self.cap else {
            return Dropped::default();
        };
        if self.len() < cap {
            return Dropped::default();
        }
        if self.mode == Mode::Full {
            self.sweep(now, Sweep::Cap);
            if self.len() < cap {
                return Dropped::default();
            }
        }
        let batch = (cap / 16).max(1).min(self.len());
        let mut stamps: Vec<u64> = match &self.config {
            Some(config) => self
                .words
                .values_mut()
                .map(|cell| word::last_use(*cell.get_mut(), config))
                .collect(),
            None => Vec::new(),
        };
        stamps.extend(self.states.values().map(|entry| entry.next_free_micros));
        let (_, cutoff, _) = stamps.select_nth_unstable(batch - 1);
        let cutoff = *cutoff;
        let mut left = batch;
        if let Some(config) = &self.config {
            self.words.retain(|_, cell| {
                if left > 0 && word::last_use(*cell.get_mut(), config) <= cutoff {
                    left -= 1;
                    false
                } else {
                    true
                }
            });
        }
        self.states.retain(|_, entry| {
            if left > 0 && entry.next_free_micros <= cutoff {
                left -= 1;
                false
            } else {
                true
            }
        });
        // The dropped keys' ledgers go with them.
        self.forget_ledgers(now);
        Dropped {
            unfinished: (batch - left) as u64,
            latest: if left < batch { cutoff } else { 0 },
        }
    }

    /// Drops the ledgers of the keys no longer held and those no longer
    /// needed (see [`Waiting::needed`]), and gives the memory back once
    /// the map is mostly empty.
    fn forget_ledgers(&mut self, now: u64) {
        if self.ledgers.is_empty() {
            return;
        }
        let (words, states, config) = (&self.words, &self.states, self.config.as_ref());
        self.ledgers.retain(|key, waiting| {
            held_entry(words, states, config, key, now)
                .is_some_and(|entry| waiting.needed(&entry, now))
        });
        self.release_ledgers();
    }

    /// Drops the ledger of `key`.
    fn forget_ledger<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.ledgers.remove(key);
        self.release_ledgers();
    }

    /// Gives the ledger map's memory back: all of it once no key has a
    /// ledger, most of it once it is mostly empty.
    fn release_ledgers(&mut self) {
        let (len, capacity) = (self.ledgers.len(), self.ledgers.capacity());
        if len == 0 {
            if capacity > 0 {
                self.ledgers.shrink_to_fit();
            }
        } else if capacity > 4 * len.max(SWEEP_MIN_LEN) {
            self.ledgers.shrink_to(2 * len);
        }
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

    /// The ticket of `key` (at `now`), if held.
    pub(super) fn ticket<Q>(&self, key: &Q, now: u64) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        held_entry(&self.words, &self.states, self.config.as_ref(), key, now)
            .map(|entry| entry.next_free_micros)
    }

    /// The keys held.
    pub(super) fn keys(&self) -> impl Iterator<Item = &K> {
        self.states.keys().chain(self.words.keys())
    }

    /// Removes `key` if its ticket (at `now`) is at most `until`; whether
    /// it is no longer held.
    pub(super) fn forget_if_paid<Q>(&mut self, key: &Q, until: u64, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.ticket(key, now) {
            None => true,
            Some(ticket) if ticket <= until => {
                if !self.ledgers.is_empty() {
                    self.forget_ledger(key);
                }
                self.states.remove(key);
                self.words.remove(key);
                true
            }
            Some(_) => false,
        }
    }

    /// Holds `key` with nothing stored and the ticket at `until`, unless it
    /// is held already.
    pub(super) fn open<Q>(&mut self, key: &Q, until: u64, now: u64) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.states.contains_key(key) || self.words.contains_key(key) {
            return Dropped::default();
        }
        let dropped = self.make_room(now);
        let mut state = self.full_state(now);
        state.stored_permits = 0.0;
        state.next_free_micros = until.max(now);
        self.put(key, &state, now);
        dropped
    }

    /// Forgets a reservation of `key` that will never be given back (its
    /// permits were kept), in the ledger it was noted in (see
    /// [`Ledger::keep`]): the ledger stays as small as what may still be
    /// given back, and goes once nothing is left in it to give back.
    pub(super) fn keep<Q>(&mut self, key: &Q, taken: &Recorded)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.ledgers.is_empty() {
            return;
        }
        let Some(waiting) = self.ledgers.get_mut(key) else {
            return;
        };
        if waiting.serial != taken.serial {
            return;
        }
        waiting.ledger.keep(&taken.reserved);
        if waiting.ledger.is_empty() {
            // Nothing left that could be given back, nor restored.
            self.forget_ledger(key);
        }
    }

    /// Gives back a reservation of `key`, through the ledger it was noted
    /// in (see [`Ledger::give_back`]).
    ///
    /// Without that ledger, nothing is given back: the key was dropped (as
    /// full, where it still reads as full, or to the cap), or its ledger was
    /// no longer needed (every reservation noted in it had passed its
    /// moment, and the last could no longer be restored), and through it
    /// the reservation would give nothing back either. A give-back still
    /// does to the key's present ledger, if any, what a give-back of a
    /// reservation it no longer holds does: it merges the groups whose
    /// moment has passed (so that their reservations are no longer the
    /// latest, as with one ledger all along).
    pub(super) fn give_back<Q>(&mut self, key: &Q, taken: &Recorded, now: u64) -> GiveBack
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.ledgers.is_empty() || !self.ledgers.contains_key(key) {
            return GiveBack::Nothing;
        }
        let mut state = self.get(key, now).expect("a key with a ledger is held");
        let waiting = self.ledgers.get_mut(key).expect("just seen");
        let outcome = if waiting.serial == taken.serial {
            let outcome = waiting.ledger.give_back(&mut state, &taken.reserved, now);
            if outcome == GiveBack::Restored {
                // The last reservation with a wait, undone.
                waiting.last = None;
            }
            outcome
        } else {
            // No group of this ledger, and a moment passed: nothing, once
            // the groups whose moment has passed have merged (as a
            // give-back through one ledger all along would merge them).
            waiting.ledger.expire(now);
            GiveBack::Nothing
        };
        if !waiting.needed(&Entry::of(&state), now) {
            self.forget_ledger(key);
        }
        self.put(key, &state, now);
        outcome
    }

    /// Changes every key's rate at `now`, as `State::set_rate` does for one
    /// limiter. The rate has been checked.
    pub(super) fn set_rate(&mut self, permits_per_second: f64, now: u64) {
        // Every key as numbers, under the old configuration...
        if let Some(config) = self.config.take() {
            let words = std::mem::take(&mut self.words);
            self.states.extend(
                words
                    .into_iter()
                    .map(|(key, cell)| (key, Entry::decoded(cell.into_inner(), now, &config))),
            );
        }
        let template = self.template.clone();
        for entry in self.states.values_mut() {
            let mut state = entry.state(&template);
            state
                .set_rate(permits_per_second, now)
                .expect("the rate was checked");
            *entry = Entry::of(&state);
        }
        // Terms at the old rate: what is waiting now gives back only what
        // the ledger can still vouch for (erring late).
        for waiting in self.ledgers.values_mut() {
            waiting.ledger.clear();
            waiting.last = None;
        }
        self.template
            .set_rate(permits_per_second, now)
            .expect("the rate was checked");
        self.sweep_period = sweep_period(&self.template);
        // ... then as words under the new one, where they fit.
        self.configure(now);
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

/// Whether `entry` reads as full at `now`, i.e. as a missing key does: its
/// ticket has passed and idle time has refilled every stored permit (the
/// core's own resync decides, to the bit). Dropping it then changes nothing
/// a caller can see.
fn reads_as_full(template: &State, entry: &Entry, now: u64) -> bool {
    // A ticket at `now` with a fraction still lies ahead.
    if entry.next_free_micros > now
        || (entry.next_free_micros == now && entry.next_free_fraction > 0)
    {
        return false;
    }
    let mut state = entry.state(template);
    state.resync(now);
    state.stored_permits.to_bits() == state.max_permits.to_bits()
}
