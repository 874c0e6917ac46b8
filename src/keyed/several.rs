//! The keys of a keyed limiter built with several limits: each key's
//! [`Limits`] in a sharded map, every call under its shard's lock.
//!
//! A key not held starts full, every limit of it, as a key of a one-limit
//! keyed limiter does; so a key that reads as full again (every limit full,
//! nothing waiting to be given back) is forgotten with no visible change:
//! at a call a sweep period after the shard's last sweep (a call on the
//! shard, or one on another shard visiting it in turn: see the keyed
//! limiter's rounds), or when the shard has doubled since. Under a cap, a new key at the cap first sweeps,
//! then drops the least recently used sixteenth of the shard (those keys
//! lose their debt, counted as for one limit).
//!
//! As a Redis limiter's local fallback (`empty`), a key not held starts
//! with nothing stored and no debt, keys stay until taken or capped, and a
//! key opens at a floor: every limit's ticket there.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use super::shard::Dropped;
use crate::Snapshot;
use crate::core::{Granted, InvalidRate, Limits, State, stable_interval_micros};
use crate::metrics::Metrics;

/// The fewest entries from which a shard sweeps because it doubled.
const SWEEP_MIN_LEN: usize = 64;

/// The least time between two sweeps by time, µs.
const SWEEP_MIN_PERIOD: u64 = 1_000_000;

pub(super) struct Several<K> {
    shards: Vec<Mutex<Shard<K>>>,
    hasher: RandomState,
    /// The limits every key starts from, full; their rates are the
    /// limiter's.
    template: Mutex<Vec<State>>,
    /// Each shard's share of the cap.
    cap: Option<usize>,
    /// Tells a key's entry from its earlier and later ones.
    next_serial: AtomicU64,
    /// Whether keys not held start empty and are never swept (a Redis
    /// limiter's fallback), rather than full.
    empty: bool,
    /// The limiter's metrics: the keys-held gauge.
    pub(super) metrics: Metrics,
}

struct Shard<K> {
    keys: HashMap<K, Held, RandomState>,
    last_sweep: u64,
    sweep_len: usize,
    sweep_period: u64,
}

struct Held {
    limits: Limits,
    serial: u64,
}

/// A locked shard, and how many keys it held when locked.
struct Locked<'a, K> {
    shard: MutexGuard<'a, Shard<K>>,
    len: usize,
    metrics: &'a Metrics,
}

impl<K> std::ops::Deref for Locked<'_, K> {
    type Target = Shard<K>;

    fn deref(&self) -> &Shard<K> {
        &self.shard
    }
}

impl<K> std::ops::DerefMut for Locked<'_, K> {
    fn deref_mut(&mut self) -> &mut Shard<K> {
        &mut self.shard
    }
}

impl<K> Drop for Locked<'_, K> {
    fn drop(&mut self) {
        let len = self.shard.keys.len();
        if len != self.len {
            self.metrics.keys_changed(len as isize - self.len as isize);
        }
    }
}

/// A held reservation's way back: the entry it was made on, and its id in
/// that entry's log.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket {
    serial: u64,
    id: u64,
}

impl<K: Hash + Eq + Clone> Several<K> {
    pub(super) fn new(
        template: Vec<State>,
        shards: usize,
        cap: Option<usize>,
        empty: bool,
    ) -> Self {
        let hasher = RandomState::new();
        let period = sweep_period(&template);
        Several {
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard {
                        keys: HashMap::with_hasher(hasher.clone()),
                        last_sweep: 0,
                        sweep_len: SWEEP_MIN_LEN,
                        sweep_period: period,
                    })
                })
                .collect(),
            hasher,
            template: Mutex::new(template),
            cap,
            next_serial: AtomicU64::new(1),
            empty,
            metrics: Metrics::default(),
        }
    }

    /// The shard of `key`, locked: what the call adds or drops is counted
    /// in the keys-held gauge when the lock is let go.
    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> Locked<'_, K> {
        let index = (self.hasher.hash_one(key) >> 32) as usize % self.shards.len();
        self.locked(lock(&self.shards[index]))
    }

    fn locked<'a>(&'a self, shard: MutexGuard<'a, Shard<K>>) -> Locked<'a, K> {
        let len = shard.keys.len();
        Locked {
            shard,
            len,
            metrics: &self.metrics,
        }
    }

    /// Sweeps shard `index` if a sweep is due at `now` (as its own next
    /// call would), unless it is locked: a visit from a call on another
    /// shard, which never waits for this one.
    pub(super) fn visit(&self, index: usize, now: u64) {
        let shard = match self.shards[index].try_lock() {
            Ok(shard) => shard,
            Err(TryLockError::Poisoned(shard)) => shard.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if !self.empty {
            self.locked(shard).sweep(now, false);
        }
    }

    /// Reserves `permits` of `key` at `now` if the wait fits in `timeout`
    /// µs; the grant, with the way back for a held one that waits.
    pub(super) fn reserve<Q>(
        &self,
        key: &Q,
        permits: u32,
        now: u64,
        timeout: u64,
        held: bool,
    ) -> (Option<(Granted, Option<Ticket>)>, Dropped)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut shard = self.shard(key);
        let dropped = self.hold(&mut shard, key, now, now);
        let entry = shard.keys.get_mut(key).expect("just inserted");
        let granted = entry.limits.try_reserve(permits, now, timeout, held);
        let serial = entry.serial;
        let grant = granted.map(|g| (g, g.id.map(|id| Ticket { serial, id })));
        (grant, dropped)
    }

    /// Holds `key` if it is not held yet: full at `now` (empty, with every
    /// ticket at `until`, for a fallback), making room under the cap.
    fn hold<Q>(&self, shard: &mut Shard<K>, key: &Q, until: u64, now: u64) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut dropped = if self.empty {
            Dropped::default()
        } else {
            shard.sweep(now, false)
        };
        if !shard.keys.contains_key(key) {
            if let Some(cap) = self.cap
                && shard.keys.len() >= cap
            {
                let more = shard.make_room(now, cap, !self.empty);
                dropped.unfinished += more.unfinished;
                dropped.latest = dropped.latest.max(more.latest);
            }
            let held = Held {
                limits: self.fresh(until.max(now)),
                serial: self.next_serial.fetch_add(1, Relaxed),
            };
            shard.keys.insert(key.to_owned(), held);
        }
        dropped
    }

    /// Every limit of a key not held, at `at`: full, or (for a fallback)
    /// empty.
    fn fresh(&self, at: u64) -> Limits {
        let states = lock(&self.template)
            .iter()
            .map(|template| {
                let mut state = template.clone();
                state.stored_permits = if self.empty { 0.0 } else { state.max_permits };
                state.next_free_micros = at;
                state.next_free_fraction = 0;
                state
            })
            .collect();
        Limits::new(states).expect("a keyed limiter has limits")
    }

    /// Holds `key` with nothing stored and every ticket at `until`, unless
    /// it is held already (a fallback opening a key at its floor).
    pub(super) fn open<Q>(&self, key: &Q, until: u64, now: u64) -> Dropped
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut shard = self.shard(key);
        self.hold(&mut shard, key, until, now)
    }

    /// Each limit's ticket of `key`, if it is held.
    pub(super) fn tickets<Q>(&self, key: &Q) -> Option<Vec<u64>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard(key);
        let entry = shard.keys.get(key)?;
        Some(
            entry
                .limits
                .states()
                .iter()
                .map(|s| s.next_free_micros)
                .collect(),
        )
    }

    /// Forgets `key` if none of its tickets lies after `until`; whether it
    /// is no longer held.
    pub(super) fn forget_if_paid<Q>(&self, key: &Q, until: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut shard = self.shard(key);
        match shard.keys.get(key) {
            None => true,
            Some(entry) if entry.limits.last_used() <= until => {
                shard.keys.remove(key);
                true
            }
            Some(_) => false,
        }
    }

    /// The keys held now.
    pub(super) fn keys(&self) -> Vec<K> {
        let mut keys = Vec::new();
        for shard in &self.shards {
            keys.extend(lock(shard).keys.keys().cloned());
        }
        keys
    }

    /// Gives back the reservation `ticket` of `key` at `now`, if its entry
    /// is still the one it was made on.
    pub(super) fn give_back<Q>(&self, key: &Q, ticket: Ticket, now: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(entry) = self.shard(key).keys.get_mut(key)
            && entry.serial == ticket.serial
        {
            entry.limits.give_back(ticket.id, now);
        }
    }

    /// What `key` holds at `now` (a key not held: full, or empty for a
    /// fallback).
    pub(super) fn snapshot_of<Q>(&self, key: &Q, now: u64) -> Snapshot
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard(key);
        match shard.keys.get(key) {
            Some(entry) => Snapshot::of_limits(&entry.limits, now),
            None => {
                drop(shard);
                Snapshot::of_limits(&self.fresh(now), now)
            }
        }
    }

    /// Every limit's configuration, at the rates in force.
    pub(super) fn templates(&self) -> Vec<State> {
        lock(&self.template).clone()
    }

    /// How long a request of `key` made at `now` would wait, µs.
    pub(super) fn wait_of<Q>(&self, key: &Q, now: u64) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard(key);
        shard
            .keys
            .get(key)
            .map_or(0, |entry| entry.limits.earliest(now).0 - now)
    }

    /// Scales every limit of every key (and of keys to come) by `factor`,
    /// or sets them all to `otherwise` (see [`Limits::scale`]).
    pub(super) fn scale(&self, factor: f64, otherwise: f64, now: u64) -> Result<(), InvalidRate> {
        let mut template = Limits::new(lock(&self.template).clone()).expect("limits");
        template.scale(factor, otherwise, 0)?;
        self.replace_template(template.states().to_vec());
        for shard in &self.shards {
            let mut shard = lock(shard);
            for entry in shard.keys.values_mut() {
                entry.limits.scale(factor, otherwise, now)?;
            }
        }
        Ok(())
    }

    /// Sets the rate of limit `index` of every key.
    pub(super) fn set_limit_rate(
        &self,
        index: usize,
        rate: f64,
        now: u64,
    ) -> Result<(), InvalidRate> {
        stable_interval_micros(rate)?;
        let mut template = lock(&self.template).clone();
        if let Some(state) = template.get_mut(index) {
            state.set_rate(rate, 0)?;
        }
        self.replace_template(template);
        for shard in &self.shards {
            let mut shard = lock(shard);
            for entry in shard.keys.values_mut() {
                entry.limits.set_rate(Some(index), rate, now)?;
            }
        }
        Ok(())
    }

    fn replace_template(&self, template: Vec<State>) {
        let period = sweep_period(&template);
        *lock(&self.template) = template;
        for shard in &self.shards {
            lock(shard).sweep_period = period;
        }
    }

    /// The limits' count and the first one's rate.
    pub(super) fn shape(&self) -> (usize, f64) {
        let template = lock(&self.template);
        (template.len(), template[0].permits_per_second)
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).keys.len()).sum()
    }
}

impl<K: Hash + Eq> Shard<K> {
    /// Drops the entries that read as full, if a sweep period has passed
    /// or the shard doubled since the last sweep (or at once, `now`).
    fn sweep(&mut self, now: u64, at_once: bool) -> Dropped {
        let due = now >= self.last_sweep.saturating_add(self.sweep_period)
            || self.keys.len() >= self.sweep_len;
        if at_once || due {
            self.keys
                .retain(|_, entry| !entry.limits.reads_as_full(now));
            self.last_sweep = now;
            self.sweep_len = (2 * self.keys.len()).max(SWEEP_MIN_LEN);
        }
        Dropped::default()
    }

    /// Makes room for one more key under `cap`: the entries that read as
    /// full, then the least recently used sixteenth.
    fn make_room(&mut self, now: u64, cap: usize, sweep: bool) -> Dropped {
        if sweep {
            self.sweep(now, true);
        }
        let mut dropped = Dropped::default();
        if self.keys.len() < cap {
            return dropped;
        }
        let mut last_used: Vec<u64> = self.keys.values().map(|e| e.limits.last_used()).collect();
        let count = (self.keys.len() / 16).max(1);
        let (_, &mut threshold, _) = last_used.select_nth_unstable(count - 1);
        let mut left = count;
        self.keys.retain(|_, entry| {
            let used = entry.limits.last_used();
            if left > 0 && used <= threshold {
                left -= 1;
                dropped.unfinished += 1;
                dropped.latest = dropped.latest.max(used);
                false
            } else {
                true
            }
        });
        dropped
    }
}

/// The least time between two sweeps by time: the longest refill period
/// of the limits, and at least a second.
fn sweep_period(template: &[State]) -> u64 {
    template
        .iter()
        .map(State::refill_micros)
        .max()
        .unwrap_or(0)
        .max(SWEEP_MIN_PERIOD)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
