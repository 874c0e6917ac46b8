//! One shard of a keyed limiter: its keys' states under one lock, the
//! configuration they share, and the bookkeeping that keeps the shard small.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::Hash;

use crate::core::{GiveBack, Reserved, State};

/// One key's state: the core's stored permits and ticket. (Its ticket also
/// tells when it was last used: a reservation moves it to at least its
/// moment, so the entries whose tickets lie furthest back are the least
/// recently used.)
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
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

/// The keys of one shard.
#[derive(Debug)]
pub(super) struct Shard<K> {
    /// The configuration every key runs under: a key's state is this with
    /// the key's two numbers (its own two are scratch space for that).
    template: State,
    entries: HashMap<K, Entry, RandomState>,
    /// Calls since the last sweep of full entries, and when it ran (µs).
    calls_since_sweep: usize,
    last_sweep: u64,
    /// The refill period (at least 1 ms): an entry with no debt that has
    /// been idle this long reads as full.
    sweep_period: u64,
    /// The most entries this shard may hold, if capped.
    cap: Option<usize>,
    /// The latest clock reading a call on this shard used: readings taken
    /// before the lock are raised to it, so time never runs backwards for
    /// a key.
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
    Empty,
}

/// A sweep runs once the calls since the last one reach the shard's size
/// (and this many at least), so that its cost, one pass over the entries, is
/// spread over as many calls as there are entries; and also at the first
/// call a refill period after the last one, when every entry idle since
/// before it and out of debt has become full (so that a shard flooded once
/// shrinks as soon as it is used again, at the cost of one pass per refill
/// period).
const SWEEP_MIN_CALLS: usize = 64;

/// The shortest time between two sweeps triggered by time, in µs.
const SWEEP_MIN_PERIOD: u64 = 1_000;

/// What one call on a shard dropped to stay within its cap.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Dropped {
    /// Entries dropped before they read as full (the cap).
    pub(super) unfinished: u64,
}

impl<K> Shard<K> {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn template(&self) -> &State {
        &self.template
    }
}

impl<K: Hash + Eq> Shard<K> {
    pub(super) fn new(
        template: State,
        hasher: RandomState,
        cap: Option<usize>,
        mode: Mode,
    ) -> Self {
        Shard {
            sweep_period: template.refill_micros().max(SWEEP_MIN_PERIOD),
            template,
            entries: HashMap::with_hasher(hasher),
            calls_since_sweep: 0,
            last_sweep: 0,
            cap,
            last_now: 0,
            mode,
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

    /// Counts a call; once enough calls have passed, drops the entries that
    /// read as full.
    fn tick(&mut self, now: u64) {
        if self.mode == Mode::Empty {
            return;
        }
        self.calls_since_sweep += 1;
        if self.calls_since_sweep >= self.entries.len().max(SWEEP_MIN_CALLS)
            || now.saturating_sub(self.last_sweep) >= self.sweep_period
        {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: u64) {
        self.calls_since_sweep = 0;
        self.last_sweep = now;
        let template = &self.template;
        self.entries
            .retain(|_, entry| !reads_as_full(template, entry, now));
        // After a flood of keys the table keeps its size: give the memory
        // back once it is mostly empty.
        if self.entries.capacity() > 4 * self.entries.len().max(SWEEP_MIN_CALLS) {
            self.entries.shrink_to(2 * self.entries.len());
        }
    }

    /// `now` as read before the lock, never below the shard's last reading.
    pub(super) fn clamp(&mut self, now: u64) -> u64 {
        let now = now.max(self.last_now);
        self.last_now = now;
        now
    }

    /// Makes room for one more entry under the cap: first the entries that
    /// read as full, then, if that is not enough, the least recently used
    /// sixteenth of the shard (so that a flood of new keys costs a constant
    /// amount of work per key, amortized).
    fn make_room(&mut self, now: u64) -> Dropped {
        let Some(cap) = self.cap else {
            return Dropped::default();
        };
        if self.entries.len() < cap {
            return Dropped::default();
        }
        self.sweep(now);
        if self.entries.len() < cap {
            return Dropped::default();
        }
        let batch = (cap / 16).max(1).min(self.entries.len());
        let mut tickets: Vec<u64> = self.entries.values().map(|e| e.next_free_micros).collect();
        let (_, cutoff, _) = tickets.select_nth_unstable(batch - 1);
        let cutoff = *cutoff;
        let mut left = batch;
        self.entries.retain(|_, entry| {
            if left > 0 && entry.next_free_micros <= cutoff {
                left -= 1;
                false
            } else {
                true
            }
        });
        Dropped {
            unfinished: batch as u64,
        }
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
        self.tick(now);
        if let Some(entry) = self.entries.get_mut(key) {
            // The template's own two numbers are scratch space: the key's
            // state is run in place, with no copy of the configuration.
            let state = &mut self.template;
            entry.load_into(state);
            let result = step(state);
            if result.is_some() {
                *entry = Entry::of(state);
            }
            return (result, Dropped::default());
        }
        let mut state = self.full_state(now);
        let Some(result) = step(&mut state) else {
            return (None, Dropped::default());
        };
        let dropped = self.make_room(now);
        self.entries.insert(key.to_owned(), Entry::of(&state));
        (Some(result), dropped)
    }

    /// The ticket of `key` (`now` for a missing key).
    pub(super) fn next_free<Q>(&self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries
            .get(key)
            .map_or(now, |entry| entry.next_free_micros)
    }

    /// Removes every key and returns each with its ticket.
    pub(super) fn drain(&mut self) -> Vec<(K, u64)> {
        self.entries
            .drain()
            .map(|(key, entry)| (key, entry.next_free_micros))
            .collect()
    }

    /// Removes `key` and returns its ticket, if held.
    pub(super) fn take<Q>(&mut self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entries.remove(key).map(|entry| entry.next_free_micros)
    }

    /// Holds `key` with nothing stored and the ticket at `until`, unless it
    /// is held already.
    pub(super) fn open<Q>(&mut self, key: &Q, until: u64, now: u64) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.entries.contains_key(key) {
            return Dropped::default();
        }
        let dropped = self.make_room(now);
        self.entries.insert(
            key.to_owned(),
            Entry {
                stored_permits: 0.0,
                next_free_micros: until.max(now),
                next_free_fraction: 0,
            },
        );
        dropped
    }

    /// Gives back a reservation of `key`. A key no longer here was dropped
    /// as full or to the cap: it reads as full, with nothing to give back.
    pub(super) fn give_back<Q>(&mut self, key: &Q, taken: &Reserved, now: u64) -> GiveBack
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let template = &self.template;
        let Some(entry) = self.entries.get_mut(key) else {
            return GiveBack::Nothing;
        };
        let mut state = entry.state(template);
        let outcome = state.give_back(taken, now);
        *entry = Entry::of(&state);
        outcome
    }

    /// Changes every key's rate at `now`, as `State::set_rate` does for one
    /// limiter. The rate has been checked.
    pub(super) fn set_rate(&mut self, permits_per_second: f64, now: u64) {
        let template = self.template.clone();
        for entry in self.entries.values_mut() {
            let mut state = entry.state(&template);
            state
                .set_rate(permits_per_second, now)
                .expect("the rate was checked");
            *entry = Entry::of(&state);
        }
        self.template
            .set_rate(permits_per_second, now)
            .expect("the rate was checked");
        self.sweep_period = self.template.refill_micros().max(SWEEP_MIN_PERIOD);
    }
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
