//! The limiters: [`RateLimiter`] (one rate for every caller) and
//! [`KeyedRateLimiter`] (one per key), each one type over where its state
//! lives, its [`Store`]: [`Local`], this process, or
//! [`Redis`](crate::redis::Redis), shared by every process that names the
//! same limiter.
//!
//! The methods have the same names on every limiter, and each is written
//! once, over the engine the store provides. Those that never sleep
//! (`reserve`, `try_reserve`, `reservation`, `try_reservation`,
//! `snapshot`) answer in the store's way, its
//! [`Answer`](Store::Answer): at once on a [`Local`] limiter (the value
//! itself), with a future to await on a Redis one (a round trip).
//! `acquire` and `try_acquire` are `async` on both, and their `_blocking`
//! forms block the calling thread on both.

mod keyed;
mod single;
mod traits;

use std::hash::Hash;
use std::marker::PhantomData;

pub use traits::{KeyedLimiter, Limiter};

use crate::clock::Clock;
use crate::outbound::{InFlight, TakeSlot};
use crate::store::{Engine, OnlyKey, Rate};

/// Where a limiter's state lives: [`Local`] (this process) or
/// [`Redis`](crate::redis::Redis) (shared through Redis). A limiter's type
/// names it, `RateLimiter<Local>` or `RateLimiter<Redis>`; it is chosen on
/// the [`Builder`](crate::Builder).
///
/// Sealed: the crate's two stores are the only ones. (A limiter of your
/// own implements [`Limiter`] or [`KeyedLimiter`] instead, and stands
/// wherever this crate's limiters do behind `dyn`.)
pub trait Store: sealed::Sealed + Send + Sync + Sized + 'static {
    /// How a call that never sleeps answers: [`Local`]'s is the value
    /// itself (`T`: `limiter.reserve(1)?`); [`Redis`](crate::redis::Redis)'s
    /// a future of it, to await (`limiter.reserve(1).await?`).
    type Answer<'a, T: 'a>;
    /// The answer of `call`, a future that an in-process store's engine
    /// makes ready.
    #[doc(hidden)]
    fn answer<'a, T: 'a, F>(call: F) -> Self::Answer<'a, T>
    where
        F: std::future::Future<Output = T> + Send + 'a;
    /// The engine of a limiter with no key.
    #[doc(hidden)]
    type Single<C: Clock>: Engine<OnlyKey>;
    /// The engine of a keyed limiter.
    #[doc(hidden)]
    type Keyed<K: Key, C: Clock>;
    /// The slots for calls in flight of a limiter with no key.
    #[doc(hidden)]
    type SingleSlots<C: Clock>: TakeSlot<OnlyKey>;
    /// The slots for calls in flight of a keyed limiter.
    #[doc(hidden)]
    type KeyedSlots<K: Key, C: Clock>: InFlight;
    /// What the builder knows of the store before it builds.
    #[doc(hidden)]
    type Settings: Send + Clone;
}

mod sealed {
    pub trait Sealed {}
    pub trait Keys {}
}

/// The state lives in this process: a limiter is a few atomic words (one
/// for a bursty rate), a keyed limiter a sharded map whose memory follows
/// the active keys. Every call answers at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Local;

impl sealed::Sealed for Local {}

impl Store for Local {
    type Answer<'a, T: 'a> = T;

    #[inline(always)]
    fn answer<'a, T: 'a, F>(call: F) -> T
    where
        F: std::future::Future<Output = T> + Send + 'a,
    {
        crate::store::now(call)
    }

    type Single<C: Clock> = crate::local::Single<C>;
    type Keyed<K: Key, C: Clock> = crate::keyed::Keyed<K, C>;
    type SingleSlots<C: Clock> = crate::outbound::LocalSlots<OnlyKey>;
    type KeyedSlots<K: Key, C: Clock> = crate::outbound::LocalSlots<K>;
    type Settings = ();
}

#[cfg(feature = "redis")]
impl sealed::Sealed for crate::redis::Redis {}

/// What a keyed limiter's key must be:
/// `Hash + Eq + Clone + Send + Sync + 'static`, as `String`, `u64` or `IpAddr`
/// are (implemented for every such type). A Redis limiter's key is also
/// `Display`: its text names the key in Redis.
pub trait Key: Hash + Eq + Clone + Send + Sync + 'static {}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Key for K {}

/// A rate limiter: one rate (or several [limits](crate::Limit)) for every
/// caller, in this process ([`Local`], the default) or shared through Redis
/// ([`Redis`](crate::redis::Redis)).
///
/// It hands out permits with the reservation-based algorithm described in
/// [`design`](crate::design): a request goes as soon as the previous caller's
/// debt is paid, and its own cost is charged to the next caller. Share it
/// with an [`Arc`](std::sync::Arc); it implements [`Limiter`], so an
/// `Arc<dyn Limiter>` can be either kind.
///
/// In this process a bursty limiter reserves with one atomic
/// compare-and-swap and no lock; a warming-up one, or one of several
/// limits, under a short lock. Waiting always happens outside, so a
/// sleeping caller never blocks others.
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
pub type RateLimiter<S = Local, C = crate::clock::SystemClock> = Pacer<NoKey, S, C>;

/// One rate limiter per key (user, tenant, API key or client address), in
/// this process ([`Local`], the default) or shared through Redis
/// ([`Redis`](crate::redis::Redis)), with memory that follows the active keys.
///
/// A [`KeyedRateLimiter`] holds one [state](crate::design) per key, each
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
/// cap on the keys held, over every shard together: below it nothing
/// is dropped. When a new key finds the limiter at the cap, its shard drops
/// the entries that read as full, and if none does, the keys nearest to
/// reading as full, a sixteenth of the shard's share of the cap at once (in
/// one pass, so a flood of new keys costs constant work per key): the keys
/// that lose the least, not those deepest in debt or paused. A shard that
/// holds less than its share of the cap leaves that to the shard holding
/// the most, where the choice is wider (the few keys of a sparse shard may
/// all be in use). Those keys
/// lose their debt: their next request finds them full again.
/// That is the price of a bound, and [`Stats::dropped_unfinished`]
/// counts it.
///
/// Giving back a reservation is exact, key by key, as for the
/// [`RateLimiter`](crate::RateLimiter) (see the crate's
/// [table](crate#cancel-safety)): a key is not dropped as full while a
/// reservation of its may still be given back, and a rate change makes
/// what was waiting give nothing back.
///
/// Keys are spread over shards, each a read-write lock and hash maps;
/// calls on keys in different shards do not contend. The common call (a
/// key of one bursty limit, already held) takes its shard's lock for
/// reading and updates the key's one-word state (eight bytes beside the
/// key) with one compare-and-swap, so calls on one shard run side by side
/// too; every other call takes the lock for writing for a few hundred
/// nanoseconds (a sweep, for its pass), and no call waits under the
/// lock. As for the `RateLimiter`, a bursty key agrees with the core to
/// the microsecond, not always to the bit, once stored permits have been
/// spent.
///
/// ```
/// use std::time::Duration;
/// use paceline::{KeyedRateLimiter, Limit};
/// use paceline::clock::FakeClock;
///
/// let limiter = KeyedRateLimiter::<String>::builder()
///     .limit(Limit::per_second(5.0).burst(5)) // 5 requests at once per user
///     .max_keys(100_000)
///     .clock(FakeClock::new())
///     .build()?;
/// // A new user starts with a full burst; looked up by `&str`.
/// for _ in 0..5 {
///     assert_eq!(limiter.reserve("alice", 1)?, Duration::ZERO);
/// }
/// assert_eq!(limiter.reserve("alice", 1)?, Duration::from_millis(200));
/// // Another user is not affected.
/// assert_eq!(limiter.try_reserve("bob", 1, Duration::ZERO)?, Some(Duration::ZERO));
/// assert_eq!(limiter.stats().keys, 2);
/// # Ok::<(), paceline::Error>(())
/// ```
///
/// [`max_keys`]: crate::Builder::max_keys
///
/// `K` is the key type: anything `Hash + Eq + Clone + Send + Sync` (a
/// [`Key`]; through Redis, `Display` too). Methods take `&Q` for any `Q`
/// the key borrows as, so a `String`-keyed limiter is asked with a `&str`.
/// Share it with an [`Arc`](std::sync::Arc); it implements
/// [`KeyedLimiter`]. Through Redis, the same algorithm runs in Redis for
/// each key, and this process holds only the keys its fallback serves
/// while Redis is down (see [`redis`](crate::redis)).
pub type KeyedRateLimiter<K, S = Local, C = crate::clock::SystemClock> = Pacer<PerKey<K>, S, C>;

/// The one limiter type, keyed by `K` ([`NoKey`] or [`PerKey`]), its state
/// in `S`, on clock `C`: named by its two aliases, [`RateLimiter`]
/// (`Pacer<NoKey, S, C>`) and [`KeyedRateLimiter`]
/// (`Pacer<PerKey<K>, S, C>`), whose pages say what each does.
///
/// The methods that take no key are written once for both (the rate, the
/// clock, the counts); those that reserve come in two forms of the same
/// names, with a key and without.
pub struct Pacer<K: Keys, S: Store = Local, C: Clock = crate::clock::SystemClock> {
    pub(crate) engine: K::Engine<S, C>,
    pub(crate) upstream: crate::outbound::Upstream,
    pub(crate) slots: K::Slots<S, C>,
}

/// How a [`RateLimiter`] is keyed: not at all. A type, never a value.
#[derive(Debug)]
pub enum NoKey {}

/// How a [`KeyedRateLimiter`] is keyed: by a [`Key`] of type `K`. A
/// type, never a value.
pub struct PerKey<K>(PhantomData<fn(K)>, NoKey);

impl<K> std::fmt::Debug for PerKey<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PerKey")
    }
}

/// What a [`Pacer`] is keyed by: [`NoKey`] (a [`RateLimiter`]) or
/// [`PerKey`] (a [`KeyedRateLimiter`]). Sealed: these are the only ones.
pub trait Keys: sealed::Keys + Sized + 'static {
    /// The engine of such a limiter on store `S`.
    #[doc(hidden)]
    type Engine<S: Store, C: Clock>;
    /// Its slots for calls in flight.
    #[doc(hidden)]
    type Slots<S: Store, C: Clock>: InFlight;
}

impl sealed::Keys for NoKey {}

impl Keys for NoKey {
    type Engine<S: Store, C: Clock> = S::Single<C>;
    type Slots<S: Store, C: Clock> = S::SingleSlots<C>;
}

impl<K: Key> sealed::Keys for PerKey<K> {}

impl<K: Key> Keys for PerKey<K> {
    type Engine<S: Store, C: Clock> = S::Keyed<K, C>;
    type Slots<S: Store, C: Clock> = S::KeyedSlots<K, C>;
}

/// What a limiter has done to stay within its bounds, and how it is served:
/// read with `stats()` on any limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Keys held in this process: a keyed limiter's entries (those not
    /// known to read as full); a Redis limiter's keys its fallback holds
    /// (served locally, not yet carried back to Redis).
    pub keys: usize,
    /// Keys dropped to stay within the cap on keys held before they read
    /// as full: keys that lost their debt (dropping a full one changes
    /// nothing and is not counted).
    pub dropped_unfinished: u64,
    /// Whether calls are being served by the fallback now (a Redis limiter;
    /// on a cluster, some of its keys).
    pub degraded: bool,
    /// How many times a Redis limiter switched to its fallback.
    pub fallbacks: u64,
    /// How many times it switched back to Redis.
    pub recoveries: u64,
    /// How many calls its fallback served (a limiter's own; in a Redis
    /// backend's `stats`, every limiter's).
    pub fallback_calls: u64,
    /// Calls of this process that hold a slot of the limiter's
    /// [`Limit::concurrent`](crate::Limit::concurrent) now (through Redis,
    /// a lease or a slot of its fallback), over all keys.
    pub in_flight: usize,
}

/// # The rate, the clock and the counts, on every limiter
impl<K: Keys, S: Store, C: Clock> Pacer<K, S, C>
where
    K::Engine<S, C>: Rate,
{
    /// Changes the rate from now on (of every key, for a keyed limiter).
    /// The next caller (of each key) still repays the previous request at
    /// the old rate; stored permits keep their share of the burst, which
    /// spans the same time at the new rate (see
    /// [`Limit::burst`](crate::Limit::burst)). With several limits, this is
    /// the first one's rate, and the others are scaled by the same factor,
    /// so that they keep the proportions they were built with or last given
    /// by [`set_limit_rate`](Self::set_limit_rate) (which changes one alone)
    /// with the first rate finite. To an infinite rate they all go
    /// infinite, and one that would scale some to zero or past a finite
    /// rate gives them all this one; the next change brings them back in
    /// proportion. What waits to be given back then gives back
    /// nothing (it was charged at the old rate): erring towards limiting.
    ///
    /// In this process a keyed limiter visits every key held (shard by
    /// shard; calls on other shards go on meanwhile); through Redis each
    /// key takes it with its next call. At an infinite rate a warming-up
    /// key stores nothing and reads as full, so an idle one may be
    /// forgotten: back at a finite rate, it starts cold, as a key never
    /// seen does, where one still held starts warm.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the
    /// rate is zero, negative or NaN; the limiter is then unchanged.
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), crate::Error> {
        self.engine.set_rate(permits_per_second)
    }

    /// Changes the rate of limit `index` alone (counted in the order the
    /// builder was given them, from 0), from now on. On a limiter with one
    /// limit, index 0 is [`set_rate`](Self::set_rate).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the
    /// rate is zero, negative or NaN, or there is no limit `index`; the
    /// limiter is then unchanged.
    pub fn set_limit_rate(
        &self,
        index: usize,
        permits_per_second: f64,
    ) -> Result<(), crate::Error> {
        self.engine.set_limit_rate(index, permits_per_second)
    }

    /// The stable rate, in permits per second, as last set (of the first
    /// limit, for a limiter built with several); in this process, what a
    /// [`RateLimiter`] learned from an upstream makes of it (see
    /// [`outbound`](crate::outbound)), through Redis the rate set (the
    /// learned one is in a snapshot).
    pub fn rate(&self) -> f64 {
        self.engine.rate()
    }

    /// The slowest of its limits' stable rates, in permits per second, as
    /// [`rate`](Self::rate) reads them: the rate it sustains (`rate` itself
    /// with one limit).
    pub fn slowest_rate(&self) -> f64 {
        self.engine.slowest_rate()
    }

    /// The clock this limiter reads and sleeps on.
    pub fn clock(&self) -> &dyn Clock {
        self.engine.clock()
    }

    /// What the limiter has done to stay within its bounds and how it is
    /// served: the keys held in this process, those dropped at the cap
    /// before they read as full, the calls in flight, and for a Redis
    /// limiter whether it is on its fallback and how often it switched
    /// (see [`Stats`]).
    pub fn stats(&self) -> Stats {
        Stats {
            in_flight: self.slots.in_flight(),
            ..self.engine.stats()
        }
    }
}

impl<K: Keys, S: Store, C: Clock> Pacer<K, S, C> {
    /// A call for `key` (`call` and `try_call`, with a key and without).
    pub(crate) async fn call_for<Q>(
        &self,
        key: &Q,
        estimate: crate::Cost,
        timeout: Option<std::time::Duration>,
    ) -> Result<Option<crate::outbound::Call<'_>>, crate::Error>
    where
        Q: ?Sized + Sync,
        K::Engine<S, C>: Engine<Q>,
        K::Slots<S, C>: TakeSlot<Q>,
    {
        let (engine, slots, upstream) = (&self.engine, &self.slots, &self.upstream);
        crate::store::call(engine, slots, key, estimate, timeout, upstream).await
    }
}

impl<K: Keys, S: Store, C: Clock> std::fmt::Debug for Pacer<K, S, C>
where
    K::Engine<S, C>: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.engine.fmt(f)
    }
}
