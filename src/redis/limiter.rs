//! [`Redis`]: the store of a limiter shared through Redis, and the methods
//! of a `RateLimiter<Redis>` and a `KeyedRateLimiter<K, Redis>` that make a
//! round trip (`async` where a local limiter's are plain functions).

use std::borrow::Borrow;
use std::fmt::{self, Display};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::Fallback;
use super::backend::Backend;
use super::failover::Failover;
use crate::clock::Clock;
use crate::limiter::{Key, Store};
use crate::store::{self, Engine, NoKey};
use crate::{Error, KeyedRateLimiter, RateLimiter, Reservation, Snapshot};

/// The state lives in Redis, shared by every process whose limiter has the
/// same name: `RateLimiter<Redis>`, `KeyedRateLimiter<K, Redis>`.
///
/// Each reservation is one round trip, a call of the crate's Lua script
/// (`lua/`), which runs the [algorithm](crate::core) inside Redis on
/// Redis's own clock (`TIME`), so every process shares one schedule
/// whatever its own clock says. The wait it returns is slept here. Every
/// call is bounded by the backend's response timeout; while Redis is
/// unavailable the limiter's [`Fallback`] serves. Made with
/// [`Builder::redis`](crate::Builder::redis) on a [`RedisBackend`](super::RedisBackend).
///
/// ```no_run
/// use std::time::Duration;
/// use paceline::{KeyedRateLimiter, RateLimiter};
/// use paceline::redis::{Client, Fallback, RedisBackend};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = RedisBackend::builder(Client::open("redis://127.0.0.1:6379/")?)
///     .build()
///     .await?;
/// let orders = RateLimiter::builder()
///     .permits_per_second(50.0)
///     .redis(&redis, "orders-api")
///     .fallback(Fallback::Local)
///     .build()?;
/// orders.acquire(1).await?;
/// let per_user = KeyedRateLimiter::<String>::builder()
///     .permits_per_second(5.0)
///     .redis(&redis, "api")
///     .build()?;
/// if per_user.try_acquire("alice", 1, Duration::from_millis(50)).await? {
///     // serve alice
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Redis;

impl Store for Redis {
    type Single<C: Clock> = Arc<Failover<NoKey, C>>;
    type Keyed<K: Key, C: Clock> = Arc<Failover<K, C>>;
    type Settings = Settings;
}

/// What a builder knows of a Redis limiter before it builds it.
pub struct Settings {
    pub(crate) backend: Arc<Backend>,
    pub(crate) name: String,
    pub(crate) fallback: Fallback,
    pub(crate) local_fraction: f64,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("name", &self.name)
            .field("fallback", &self.fallback)
            .field("local_fraction", &self.local_fraction)
            .finish_non_exhaustive()
    }
}

/// # Reserving, through Redis
///
/// What each method does is said on [`Limiter`](crate::Limiter); here each
/// is one round trip (or an answer from the fallback), bounded by the
/// response timeout. Cancel-safe: a call dropped in flight has what it
/// reserved given back when its reply arrives (see the crate's
/// [table](crate#cancel-safety)).
///
/// # Errors
/// [`Error::InvalidArgument`] if `permits` is 0; [`Error::Backend`] if
/// Redis fails and the fallback is
/// [`FailClosed`](super::Fallback::FailClosed), or if the key holds
/// something this limiter did not write.
impl<C: Clock> RateLimiter<Redis, C> {
    /// Reserves `permits` now; the wait before they may be used. Does not
    /// sleep; nothing gives the permits back.
    pub async fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        store::reserve(&self.engine, &NoKey, permits).await
    }

    /// Reserves `permits` if the wait fits in `timeout`; `None`, reserving
    /// nothing, otherwise. Does not sleep.
    pub async fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        store::try_reserve(&self.engine, &NoKey, permits, timeout).await
    }

    /// Reserves `permits` as a [`Reservation`]: wait for it, or drop it to
    /// give the permits back (one more script call, in the background).
    pub async fn reservation(&self, permits: u32) -> Result<Reservation<'_>, Error> {
        store::reservation(&self.engine, &NoKey, permits).await
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`;
    /// `None`, reserving nothing, otherwise.
    pub async fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        store::try_reservation(&self.engine, &NoKey, permits, timeout).await
    }

    /// How long a request made now would wait; reserves nothing.
    pub async fn available_in(&self) -> Result<Duration, Error> {
        self.engine.next_free(&NoKey).await
    }

    /// What the limiter holds now, read in one round trip on Redis's clock
    /// without reserving (see [`Snapshot`]); with several limits, the
    /// binding one's.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        self.engine.snapshot(&NoKey).await
    }

    /// The Redis key holding the limiter's state: `paceline:v1:{name}` (the
    /// backend's [`key_prefix`](super::RedisBackendBuilder::key_prefix),
    /// the version of the key layout, and the name with `\` and `:`
    /// escaped as `\\` and `\:`, so that it is no keyed limiter's key).
    pub fn redis_key(&self) -> String {
        self.engine.redis_key(&NoKey).to_string()
    }
}

/// # Reserving and waiting, through Redis, per key
///
/// The methods of [`RateLimiter<Redis>`](RateLimiter#reserving-through-redis),
/// for one key, looked up by any `&Q` it borrows as, with the same errors
/// and cancel safety.
impl<K: Key + Display, C: Clock> KeyedRateLimiter<K, Redis, C> {
    /// Reserves `permits` of `key`; the wait. Does not sleep.
    pub async fn reserve<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        store::reserve(&self.engine, key, permits).await
    }

    /// Reserves `permits` of `key` if the wait fits in `timeout`; `None`,
    /// reserving nothing, otherwise.
    pub async fn try_reserve<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        store::try_reserve(&self.engine, key, permits, timeout).await
    }

    /// Reserves `permits` of `key` as a [`Reservation`]: wait for it, or
    /// drop it to give the permits back.
    pub async fn reservation<Q>(&self, key: &Q, permits: u32) -> Result<Reservation<'_>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        store::reservation(&self.engine, key, permits).await
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`.
    pub async fn try_reservation<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        store::try_reservation(&self.engine, key, permits, timeout).await
    }

    /// Reserves `permits` of `key` and sleeps for the wait. Cancel-safe:
    /// dropped, in flight or asleep, it gives back what it took.
    pub async fn acquire<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        store::acquire(&self.engine, key, permits).await
    }

    /// [`acquire`](Self::acquire) if the wait fits in `timeout`; `false` at
    /// once, reserving nothing, otherwise. Cancel-safe as `acquire`.
    pub async fn try_acquire<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        store::try_acquire(&self.engine, key, permits, timeout).await
    }

    /// [`acquire`](Self::acquire) on the calling thread (the round trip
    /// runs on the backend's runtime).
    pub fn acquire_blocking<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        store::acquire_blocking(&self.engine, key, permits)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    pub fn try_acquire_blocking<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        store::try_acquire_blocking(&self.engine, key, permits, timeout)
    }

    /// How long a request of `key` made now would wait; reserves nothing.
    pub async fn available_in<Q>(&self, key: &Q) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        self.engine.next_free(key).await
    }

    /// What `key` holds now, read in one round trip without reserving; a
    /// key not held in Redis reads as a new key starts, full.
    pub async fn snapshot<Q>(&self, key: &Q) -> Result<Snapshot, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        self.engine.snapshot(key).await
    }

    /// The Redis key of `key`: `paceline:v1:{name}:{key}`, with `\` and `:`
    /// escaped in the name (as `\\` and `\:`) and `\`, `{` and `}` in the
    /// key (as `\\`, `\(` and `\)`). No two (limiter, key) pairs, keyed or
    /// not, share a Redis key, and a key's text cannot choose its cluster
    /// slot (it holds no brace once escaped); braces in the *name* are
    /// kept, so a name such as `{tenant-7}` puts the limiter and all its
    /// keys in one slot.
    pub fn redis_key<Q: Display + ?Sized>(&self, key: &Q) -> String {
        self.engine.redis_key(key).to_string()
    }
}
