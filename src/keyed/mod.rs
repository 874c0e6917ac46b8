//! Keyed limiting: one rate per key, with memory that follows the active
//! keys. See [`KeyedRateLimiter`].

mod builder;
mod fallback;
mod hasher;
mod rounds;
mod settings;
mod shard;
mod store;

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hash};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

pub use builder::KeyedBuilder;
use hasher::ShardHasher;
use rounds::Rounds;
pub(crate) use shard::Mode;
use shard::{Dropped, Fast, Shard, Ticket, Written};

use crate::clock::{Clock, SystemClock};
use crate::core::{Limits, Policy, State};
use crate::metrics::Metrics;
use crate::reservation::{Pending, Taken};
use crate::store::{Now, Store};
use crate::{Error, Reservation, Snapshot};

/// One rate limiter per key (user, tenant, API key or client address), in
/// one object, with memory that follows the active keys.
///
/// A [`KeyedRateLimiter`] holds one [core](crate::core) state per key, each
/// with the same configuration. A key behaves exactly like its own
/// [`RateLimiter`](crate::RateLimiter) on the core algorithm, with one
/// difference: a key never seen, or idle long enough, starts **full**, as a
/// missing Redis key does: bursty with `max_burst` worth of stored permits,
/// warming-up cold. So a key whose state reads as full can be forgotten at
/// any moment with no visible change, and the limiter does forget them, as
/// part of ordinary calls (no background thread):
///
/// * a *sweep period* after a shard's last sweep by time (the refill
///   period, the time idle time takes to refill a key's burst, and at least
///   a second), the shard's entries that read as full and have been idle
///   for half a period are dropped: one pass per period, at the first call
///   on the shard, or at a call on any other key that visits it. Calls take
///   turns visiting the shards, one shard per call at most and every shard
///   about once a second (a visit does not wait for a shard in use, whose
///   own calls sweep it), so that a shard no call reaches sweeps too;
/// * when a new key finds a shard twice as large as after its last sweep,
///   the entries that read as full and have been idle since the last sweep
///   by time are dropped: a pass over `n` entries follows `n / 2` new keys
///   at least, a constant amount of work per call, amortized.
///
/// Memory therefore follows the keys active within about one sweep period,
/// in every shard, whichever keys the calls are on (a round of visits takes
/// a second, or as many calls as there are shards, whichever is longer),
/// not every key ever seen; a key in use is not dropped and made again at
/// every pass, even at a rate so high that it reads as full a moment after
/// each call.
///
/// For hostile key spaces (random client addresses), [`max_keys`] sets a
/// hard cap. When a shard is at its share of the cap and no entry there
/// reads as full, the least recently used sixteenth of the shard is dropped
/// at once (in one pass, so a flood of new keys costs constant work per key).
/// Those keys lose their debt: their next request finds them full again.
/// That is the price of a bound, and [`KeyedStats::dropped_unfinished`]
/// counts it.
///
/// Giving back a reservation (a dropped [`Reservation`], a cancelled
/// `acquire`) is exact, key by key, as for the
/// [`RateLimiter`](crate::RateLimiter): a reservation that has to wait is
/// logged in its key's [`Limits`](crate::core::Limits), and giving it back
/// replays the key's limits without it, so the key holds what it would hold
/// had it never been made, however many are given back and in whatever
/// order, as long as the key's log holds every request since the oldest
/// that may be given back ([`LOG_CAPACITY`](crate::core::LOG_CAPACITY)).
/// The log lives while one of its reservations may still be given back: a
/// key is not dropped as full meanwhile, and the first call on the key
/// once none can (or the key being dropped) takes it away. A rate change
/// empties every log: what was waiting then gives nothing back.
///
/// Keys are spread over shards, each a read-write lock and hash maps; calls
/// on keys in different shards do not contend. Every key runs the core's
/// [`Limits`](crate::core::Limits). A key of one bursty limit is held as
/// the [`RateLimiter`](crate::RateLimiter)'s one-word state (eight bytes
/// beside the key) while its log is empty, and the common call, on a key
/// already held, takes its shard's lock for reading and updates the word
/// with one compare-and-swap, so calls on one shard run side by side too.
/// Every other call (a new key, a reservation with a wait that may be given
/// back, a give-back, a rate change, any call on a key held as limits)
/// takes the lock for writing and runs the key's limits for a few hundred
/// nanoseconds at most; no call waits under the lock. A key of several
/// limits, a warming-up key, a key whose log is in use, and a bursty key
/// whose burst exceeds about two hours (or whose debt reaches further), is
/// held as limits of its own, boxed, and always takes the write lock. As
/// for the `RateLimiter`, a bursty key agrees with the core to the
/// microsecond but not always to the bit once stored permits have been
/// spent: stored permits are held as time, to 2^-20 µs, so a later wait may
/// differ from the core's by 1 µs.
///
/// ```
/// use std::time::Duration;
/// use paceline::KeyedRateLimiter;
/// use paceline::clock::FakeClock;
///
/// let limiter = KeyedRateLimiter::<String, _>::builder()
///     .permits_per_second(5.0)
///     .max_burst(Duration::from_secs(1)) // 5 permits at once per user
///     .max_keys(100_000)
///     .clock(FakeClock::new())
///     .build()?;
/// // A new user starts with a full burst; looked up by `&str`.
/// for _ in 0..5 {
///     assert_eq!(limiter.reserve("alice", 1)?, Duration::ZERO);
/// }
/// assert_eq!(limiter.reserve("alice", 1)?, Duration::ZERO); // charged to the next
/// assert_eq!(limiter.reserve("alice", 1)?, Duration::from_millis(200));
/// // Another user is not affected.
/// assert_eq!(limiter.try_reserve("bob", 1, Duration::ZERO)?, Some(Duration::ZERO));
/// assert_eq!(limiter.len(), 2);
/// # Ok::<(), paceline::Error>(())
/// ```
///
/// [`max_keys`]: KeyedBuilder::max_keys
///
/// `K` is the key type: anything `Hash + Eq + Clone + Send + Sync`. Methods
/// take `&Q` for any `Q` the key borrows as, so a `String`-keyed limiter
/// is asked with a `&str`. Share it with an [`Arc`](std::sync::Arc).
pub struct KeyedRateLimiter<K, C: Clock = SystemClock> {
    shards: Box<[Padded<Shard<K>>]>,
    /// Picks a key's shard (the shard's map hashes with its own, keyed
    /// hasher).
    hasher: BuildHasherDefault<ShardHasher>,
    clock: C,
    /// The rate as last set, as `f64` bits.
    rate_bits: AtomicU64,
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
}

/// A shard on cache lines of its own, so that threads on different shards
/// do not write to the same line.
#[repr(align(128))]
struct Padded<T>(T);

/// What a [`KeyedRateLimiter`] has had to do to stay within its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeyedStats {
    /// Entries held now.
    pub keys: usize,
    /// Entries dropped to the [`max_keys`](KeyedBuilder::max_keys) cap before
    /// they read as full: keys that lost their debt (dropping a full entry
    /// changes nothing and is not counted).
    pub dropped_unfinished: u64,
}

/// A reservation of one key, as its [`Reservation`] holds it: the key and
/// what its shard gives it back with.
struct KeyedTaken<K> {
    key: K,
    ticket: Ticket,
}

/// A granted reservation of one key: the wait in µs, what gives it back if
/// it was logged (it waits, and may be given back), and the limit that set
/// the wait.
type Grant = (u64, Option<Ticket>, usize);

/// # Constructors
impl<K> KeyedRateLimiter<K, SystemClock>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A bursty limiter per key at `permits_per_second`, with the default
    /// burst (one second's worth), on the system clock.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn bursty(permits_per_second: f64) -> Result<Self, Error> {
        Self::builder()
            .permits_per_second(permits_per_second)
            .build()
    }

    /// A warming-up limiter per key at `permits_per_second`, cold for
    /// `warmup`, on the system clock.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn warming_up(permits_per_second: f64, warmup: Duration) -> Result<Self, Error> {
        Self::builder()
            .permits_per_second(permits_per_second)
            .warmup(warmup)
            .build()
    }

    /// A builder: the policy setters of [`Builder`](crate::Builder), plus
    /// [`max_keys`](KeyedBuilder::max_keys).
    pub fn builder() -> KeyedBuilder<K, SystemClock> {
        KeyedBuilder::new()
    }
}

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
/// least recently used keys are chosen within a shard, so a shard must hold
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
impl<K, C> KeyedRateLimiter<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
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
        // Each shard's share of the cap, rounded down: together, at most
        // max_keys.
        let cap = max_keys.map(|cap| (cap / shards).max(1));
        let rate_bits = AtomicU64::new(limits[0].permits_per_second().to_bits());
        let now = clock.now_micros();
        let words = matches!(&limits[..], [state] if matches!(state.policy(), Policy::Bursty(_)))
            && mode == Mode::Full;
        let count = limits.len();
        let template = Limits::new(limits).expect("a keyed limiter has limits");
        KeyedRateLimiter {
            shards: (0..shards)
                .map(|_| {
                    let template = template.clone();
                    Padded(Shard::new(template, map_hasher.clone(), cap, mode, now))
                })
                .collect(),
            hasher: BuildHasherDefault::default(),
            clock,
            rate_bits,
            dropped_unfinished: AtomicU64::new(0),
            dropped_until: AtomicU64::new(0),
            words,
            limits: count,
            rounds: Rounds::new(shards, now, mode == Mode::Full),
            metrics: Metrics::default(),
        }
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
    fn shard_now<Q: Hash + ?Sized>(&self, key: &Q) -> (Written<'_, K>, u64) {
        let read = self.clock.now_micros();
        self.shard(key).write_at(read)
    }

    /// Counts the entries a call dropped before they read as full.
    fn count_dropped(&self, dropped: Dropped) {
        if dropped.unfinished > 0 {
            self.dropped_unfinished
                .fetch_add(dropped.unfinished, Relaxed);
            self.dropped_until.fetch_max(dropped.latest, Relaxed);
        }
    }

    /// Reserves `permits` of `key` if its debt fits in `timeout` µs
    /// (`u64::MAX`: always); the wait in µs and, when `record` is set (for
    /// a [`Reservation`]) and it has to wait, what gives it back.
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
        let (mut shard, now) = shard.write_at(read);
        let (grant, dropped) = shard.reserve(key, now, permits, timeout, record);
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
            Some(Pending {
                owner: self,
                taken: Taken::Boxed(Box::new(taken)),
            }),
        )
        .for_limit(limit)
    }
}

/// # Reserving and waiting
///
/// Each method is [`KeyedLimiter`](crate::KeyedLimiter)'s for one key,
/// which says what it does; here the ones that do not sleep are plain
/// functions. A key is looked up by any `&Q` it borrows as. Give-backs are
/// exact, key by key, through the key's log (see
/// [`Limits`](crate::core::Limits));
/// cancel safety: see the crate's [table](crate#cancel-safety).
impl<K, C> KeyedRateLimiter<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// Reserves `permits` of `key`; the wait before they may be used.
    /// Does not sleep; nothing gives the permits back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn reserve<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Now::reserve_now(self, key, permits)
    }

    /// Reserves `permits` of `key` if the wait fits in `timeout`; `None`,
    /// reserving nothing, otherwise. Does not sleep.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn try_reserve<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Now::try_reserve_now(self, key, permits, timeout)
    }

    /// Reserves `permits` of `key` as a [`Reservation`]: wait for it, or
    /// drop it to give the permits back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn reservation<Q>(&self, key: &Q, permits: u32) -> Result<Reservation<'_>, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Now::reservation_now(self, key, permits)
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`;
    /// `None`, reserving nothing, otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn try_reservation<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Now::try_reservation_now(self, key, permits, timeout)
    }

    /// Reserves `permits` of `key` and sleeps until they may be used; the
    /// time slept. Cancel-safe: dropped, it gives the permits back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub async fn acquire<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::acquire(self, key, permits).await
    }

    /// [`acquire`](Self::acquire) if the wait fits in `timeout`; `false` at
    /// once, reserving nothing, otherwise. Cancel-safe as `acquire`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub async fn try_acquire<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::try_acquire(self, key, permits, timeout).await
    }

    /// [`acquire`](Self::acquire) on the calling thread, which it blocks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn acquire_blocking<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::acquire_blocking(self, key, permits)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0.
    pub fn try_acquire_blocking<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::try_acquire_blocking(self, key, permits, timeout)
    }

    /// How long a request of `key` made now would wait (zero for a key not
    /// held); reserves nothing.
    ///
    /// # Errors
    /// None from this limiter: the `Result` is the one every limiter
    /// returns.
    pub fn available_in<Q>(&self, key: &Q) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Ok(self.wait_of(key))
    }

    /// What `key` holds now, read without reserving (see [`Snapshot`]): a
    /// key not held reads as a new key starts, full.
    ///
    /// # Errors
    /// None from this limiter: the `Result` is the one every limiter
    /// returns.
    pub fn snapshot<Q>(&self, key: &Q) -> Result<Snapshot, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Ok(self.snapshot_of(key))
    }
}
