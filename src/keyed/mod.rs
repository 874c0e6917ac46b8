//! Keyed limiting: one rate per key, with memory that follows the active
//! keys: the engine of [`KeyedRateLimiter`](crate::KeyedRateLimiter).

mod fallback;
mod hasher;
mod rounds;
mod settings;
mod shard;
mod store;
#[cfg(test)]
mod tests;

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hasher::ShardHash;
use rounds::Rounds;
pub(crate) use shard::Mode;
use shard::{Dropped, Fast, LogId, Shard, Written};

use crate::clock::{Clock, SystemClock};
use crate::core::{Learning, Lesson, Limits, Policy, Shape, State};
use crate::meter::Metrics;
use crate::reservation::{GiveBack, GiveBackId};
use crate::{Key, Reservation};

/// The state of a keyed limiter in this process: the engine of a
/// [`KeyedRateLimiter<K, Local>`](crate::KeyedRateLimiter), whose
/// documentation says how it holds keys, sweeps them and gives back.
pub struct Keyed<K, C: Clock = SystemClock> {
    shards: Box<[Padded<Shard<K>>]>,
    /// Picks a key's shard (the shard's map hashes with its own, keyed
    /// hasher).
    hasher: ShardHash,
    clock: C,
    /// The rate as last set, as `f64` bits.
    rate_bits: AtomicU64,
    /// What `set_rate` scales. Held by a rate change from reading the rates
    /// to its last shard, so that two changes at once are made one after
    /// the other: neither passes the other on the shards, nor undoes the
    /// other's limit.
    reconfiguring: Shape,
    dropped_unfinished: AtomicU64,
    /// See [`dropped_until`](Self::dropped_until).
    dropped_until: AtomicU64,
    /// Whether keys may be held as words, so that a call tries the read
    /// lock first: one bursty limit, keys that start full.
    words: bool,
    /// How many limits every key has.
    limits: usize,
    /// The visits that sweep the shards no call reaches.
    rounds: Rounds,
    metrics: Metrics,
    /// The share of the rates an upstream reports that each key runs at:
    /// 1, or a Redis limiter's fallback's local fraction (its keys run at
    /// that share of the shared rates).
    share: f64,
    /// Whether any key ever learned from an upstream: until then a caller
    /// that waited does not take its shard's lock to ask whether a pause
    /// holds.
    learned: AtomicBool,
}

/// A shard on cache lines of its own, so that threads on different shards
/// do not write to the same line.
#[repr(align(128))]
struct Padded<T>(T);

/// A reservation of one key, as its [`Reservation`] holds it: the key and
/// what its shard gives it back with.
struct KeyedTaken<K> {
    key: K,
    ticket: LogId,
}

/// A granted reservation of one key: the wait in µs, what gives it back if
/// it was logged (it waits, and may be given back), and the limit that set
/// the wait.
type Grant = (u64, Option<LogId>, usize);

/// The number of shards: a few per CPU, a power of two, and under a cap
/// few enough that each shard's share is at least [`MIN_SHARD_CAP`] keys
/// (or the whole cap, in one shard).
fn shard_count(max_keys: Option<usize>) -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
    let wanted = (cpus * 4).next_power_of_two().clamp(4, 64);
    match max_keys {
        Some(cap) => wanted.min(prev_power_of_two(cap / MIN_SHARD_CAP)),
        None => wanted,
    }
}

/// The least share of a cap a shard holds, when the cap allows it: the
/// keys nearest to full are chosen within a shard, so a shard must hold
/// enough for that choice to mean something.
const MIN_SHARD_CAP: usize = 16;

fn prev_power_of_two(n: usize) -> usize {
    if n == 0 {
        1
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    }
}

/// # Reserving and waiting
impl<K: Key, C: Clock> Keyed<K, C> {
    /// A limiter whose keys each enforce every one of `limits` (the first
    /// one's rate is the limiter's), holding keys not seen as `mode` says.
    pub(crate) fn from_limits(
        limits: Vec<State>,
        clock: C,
        max_keys: Option<usize>,
        mode: Mode,
    ) -> Self {
        let shards = shard_count(max_keys);
        // One keyed hasher for every shard's maps.
        let map_hasher = RandomState::new();
        // The cap is over every shard together; a shard's share of it
        // sizes what it drops at once.
        let cap = max_keys.map(|keys| shard::Cap {
            keys,
            share: (keys / shards).max(1),
        });
        let held = Arc::new(AtomicUsize::new(0));
        let rate_bits = AtomicU64::new(limits[0].permits_per_second().to_bits());
        let now = clock.now_micros();
        let words = matches!(&limits[..], [state] if matches!(state.policy(), Policy::Bursty(_)))
            && mode == Mode::Full;
        let count = limits.len();
        let template = Limits::new(limits).expect("a keyed limiter has limits");
        Keyed {
            shards: (0..shards)
                .map(|_| {
                    let template = template.clone();
                    let held = Arc::clone(&held);
                    Padded(Shard::new(
                        template,
                        map_hasher.clone(),
                        cap,
                        held,
                        mode,
                        now,
                    ))
                })
                .collect(),
            hasher: ShardHash::new(),
            clock,
            rate_bits,
            reconfiguring: Mutex::new(template.ceilings().into()),
            dropped_unfinished: AtomicU64::new(0),
            dropped_until: AtomicU64::new(0),
            words,
            limits: count,
            rounds: Rounds::new(shards, now, mode == Mode::Full),
            metrics: Metrics::default(),
            share: 1.0,
            learned: AtomicBool::new(false),
        }
    }

    /// Runs each key at `share` of the rates an upstream reports (a
    /// fallback's local fraction): its own rates are that share already.
    #[cfg(feature = "redis")]
    pub(crate) fn with_share(mut self, share: f64) -> Self {
        self.share = share;
        self
    }

    /// Learns what an upstream answered to a call on `key` (see
    /// [`Limits::learn`]), the rates it reports taken at this limiter's
    /// share.
    pub(crate) fn learn_key<Q>(&self, key: &Q, lesson: &Lesson, learning: &Learning)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut shared;
        let lesson = if self.share == 1.0 {
            lesson
        } else {
            shared = lesson.clone();
            for reported in &mut shared.limits {
                reported.rate = reported
                    .rate
                    .map(|rate| crate::core::share_of(rate, self.share));
            }
            &shared
        };
        let (mut shard, now) = self.shard_now(key);
        // (Under the shard's lock, before the lesson: a caller that sees it
        // waits for the lock, then finds the pause.)
        self.learned.store(true, Relaxed);
        let dropped = shard.learn(key, now, lesson, learning);
        drop(shard);
        self.count_dropped(dropped);
    }

    /// Whether any key ever learned from an upstream.
    pub(crate) fn ever_learned(&self) -> bool {
        self.learned.load(Relaxed)
    }

    /// Records into `metrics` from now on.
    pub(crate) fn with_metrics(mut self, metrics: Metrics) -> Self {
        for shard in &self.shards {
            shard.0.write().metrics = metrics.clone();
        }
        self.metrics = metrics;
        self
    }

    /// The shard of `key`.
    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> &Shard<K> {
        let hash = self.hasher.hash_one(key);
        &self.shards[hasher::index(hash, self.shards.len())].0
    }

    /// `key`'s shard, write-locked, and the time now for it (see
    /// [`Shard::write_at`]).
    /// Every call but the common one comes here, and takes its turn
    /// visiting the shards, as that one does.
    fn shard_now<Q: Hash + ?Sized>(&self, key: &Q) -> (Written<'_, K>, u64) {
        let read = self.clock.now_micros();
        if self.rounds.due(read) {
            self.visit(read);
        }
        self.shard(key).write_at(read)
    }

    /// Counts the entries a call dropped before they read as full, and
    /// makes room in the shard holding the most if the call's shard let a
    /// new key in at the cap (see [`Dropped::elsewhere`]).
    fn count_dropped(&self, dropped: Dropped) {
        if dropped.elsewhere {
            self.make_room_elsewhere();
        }
        if dropped.unfinished > 0 {
            self.dropped_unfinished
                .fetch_add(dropped.unfinished, Relaxed);
            self.dropped_until.fetch_max(dropped.latest, Relaxed);
        }
    }

    /// Brings the keys back to the cap from the shard that holds the most,
    /// where a new key's shard held too few to choose from.
    #[cold]
    fn make_room_elsewhere(&self) {
        let fullest = self
            .shards
            .iter()
            .map(|padded| &padded.0)
            .max_by_key(|shard| shard.read().len());
        if let Some(shard) = fullest {
            let (mut table, now) = shard.write_at(self.clock.now_micros());
            let dropped = table.make_room_for_others(now);
            drop(table);
            self.count_dropped(dropped);
        }
    }

    /// Reserves `permits` of `key` if its debt fits in `timeout` µs
    /// (`u64::MAX`: always); the wait in µs and, when `record` is set (for
    /// a [`Reservation`]) and it has to wait, what gives it back.
    #[inline(always)]
    fn reserve_micros<Q>(&self, key: &Q, permits: u32, timeout: u64, record: bool) -> Option<Grant>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let read = self.clock.now_micros();
        if self.rounds.due(read) {
            self.visit(read);
        }
        let shard = self.shard(key);
        // The common call: a key held as a word, a step with no wait to
        // log, under the read lock.
        let only_at_once = record;
        if self.words
            && let Some(fast) = shard.read().fast(key, read, permits, timeout, only_at_once)
        {
            return match fast {
                Fast::Granted(wait) => Some((wait, None, 0)),
                Fast::Refused => None,
            };
        }
        self.reserve_locked(shard, key, read, permits, timeout, record)
    }

    /// [`reserve_micros`](Self::reserve_micros) under `shard`'s write lock:
    /// out of line, so that the common call stays small where it is inlined.
    #[inline(never)]
    fn reserve_locked<Q>(
        &self,
        shard: &Shard<K>,
        key: &Q,
        read: u64,
        permits: u32,
        timeout: u64,
        record: bool,
    ) -> Option<Grant>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (mut shard, now) = shard.write_at(read);
        let (grant, dropped) = shard.reserve(key, now, permits, timeout, record);
        drop(shard);
        self.count_dropped(dropped);
        grant.map(|(granted, ticket)| {
            let limit = granted.bound_by.unwrap_or(0);
            (granted.wait_micros, ticket, limit)
        })
    }

    /// Reserves `cost` of `key` for an open call if its debt fits in
    /// `timeout` µs; the wait in µs and what settles it.
    fn open_call<Q>(&self, key: &Q, cost: &crate::core::Cost, timeout: u64) -> Option<Grant>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (mut shard, now) = self.shard_now(key);
        let (grant, dropped) = shard.open_call(key, now, cost, timeout);
        drop(shard);
        self.count_dropped(dropped);
        grant.map(|(granted, ticket)| {
            let limit = granted.bound_by.unwrap_or(0);
            (granted.wait_micros, ticket, limit)
        })
    }

    /// Makes the visit due at `read`, unless another call claimed it: the
    /// next shard in turn sweeps if its sweep period has passed (see
    /// [`Rounds`]).
    #[cold]
    #[inline(never)]
    fn visit(&self, read: u64) {
        if let Some(index) = self.rounds.claim(read) {
            self.shards[index].0.visit(read);
        }
    }

    /// A grant as a reservation: one with a wait can be given back.
    fn to_reservation<Q>(&self, key: &Q, grant: Grant) -> Reservation<'_>
    where
        K: Borrow<Q>,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        let (wait, Some(ticket), limit) = grant else {
            return Reservation::new(Duration::ZERO, &self.clock, None);
        };
        let taken = KeyedTaken {
            key: key.to_owned(),
            ticket,
        };
        Reservation::new(
            Duration::from_micros(wait),
            &self.clock,
            Some(GiveBack {
                owner: self,
                taken: GiveBackId::Boxed(Box::new(taken)),
            }),
        )
        .for_limit(limit)
    }
}
