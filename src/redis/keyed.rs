//! [`KeyedRedisRateLimiter`]: one rate per key, shared through Redis.

use std::borrow::Borrow;
use std::fmt::{self, Display};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::Fallback;
use super::backend::Backend;
use super::builder::{check_limiter, fallback_setters};
use super::failover::{Failover, Naming, Parts};
use super::fallback::RedisStats;
use super::naming;
use crate::builder::{PolicyConfig, policy_setters};
use crate::clock::{Clock, SystemClock};
use crate::store::{Keyed, Store};
use crate::{Error, Reservation};

/// The default [`max_local_keys`](KeyedRedisBuilder::max_local_keys).
pub const DEFAULT_MAX_LOCAL_KEYS: usize = 100_000;

/// One rate per key (user, tenant, API key), shared by every process that
/// uses the same name, through a [`RedisBackend`](super::RedisBackend).
///
/// Each key is its own Redis key, `paceline:{name}:{key}` (the name and the
/// key's `Display` form, escaped so that no two pairs share a Redis key: see
/// [`redis_key`](Self::redis_key)), so a cluster spreads the keys over its
/// slots. Each key runs
/// the [algorithm](crate::core) in Redis exactly as a
/// [`RedisRateLimiter`](super::RedisRateLimiter) does, and expires once it
/// would read as idle, so the keys in Redis follow the users active within
/// one refill period.
///
/// On a cluster, the backend's health is kept per node: while a node is
/// down, the keys in its slots are served by the fallback and the others
/// stay on Redis (see [`RedisBackend`](super::RedisBackend)).
///
/// While the backend is degraded, [`Fallback::Local`] serves each key from
/// a [`KeyedRateLimiter`](crate::KeyedRateLimiter) in this process, at the
/// rate times `local_fraction`, holding at most
/// [`max_local_keys`](KeyedRedisBuilder::max_local_keys) keys. A key opens
/// there with nothing stored (no burst) and with the debt Redis last
/// reported for it, so a saturated key stays saturated. Once Redis is
/// back, a key the fallback served is carried back (what it granted goes
/// into the key's ticket in Redis) before any call of it reaches Redis;
/// the keys nobody calls are carried by a background task. Each permit
/// granted is counted once; where that cannot be known (debts beyond
/// `max_local_keys`), the limiter errs towards limiting. See the
/// crate's README, "When Redis fails".
///
/// ```no_run
/// use std::time::Duration;
/// use paceline::redis::RedisBackend;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::builder(paceline::redis::Client::open("redis://127.0.0.1:6379/")?)
///     .build()
///     .await?;
/// let per_user = backend
///     .keyed_limiter::<String>("api")
///     .permits_per_second(5.0)
///     .build()?;
/// if per_user.try_acquire("alice", 1, Duration::from_millis(50)).await? {
///     // serve alice
/// }
/// # Ok(()) }
/// ```
pub struct KeyedRedisRateLimiter<K, C: Clock = SystemClock> {
    inner: Arc<Failover<K, C>>,
}

/// Builds a [`KeyedRedisRateLimiter`]; see
/// [`RedisBackend::keyed_limiter`](super::RedisBackend::keyed_limiter).
#[must_use = "a builder does nothing until .build() is called"]
pub struct KeyedRedisBuilder<K, C = SystemClock> {
    pub(crate) backend: Arc<Backend>,
    pub(crate) name: String,
    pub(crate) config: PolicyConfig,
    pub(crate) fallback: Fallback,
    pub(crate) local_fraction: f64,
    pub(crate) max_local_keys: usize,
    pub(crate) clock: C,
    pub(crate) key: std::marker::PhantomData<fn(K)>,
}

impl<K, C: Clock + Clone> KeyedRedisBuilder<K, C> {
    policy_setters!();
    fallback_setters!();

    /// The most keys the local fallback holds at once (least recently
    /// used first out), and the most debts Redis reported that it keeps
    /// per key. Default [`DEFAULT_MAX_LOCAL_KEYS`]; at least 1.
    ///
    /// Beyond it the limiter errs towards limiting: a debt that does not
    /// fit is kept as the latest among the keys of its hash bucket (a key
    /// there opens no earlier), and a key dropped from the fallback leaves
    /// its ticket as a floor for the keys that open after it and, after
    /// recovery, for the keys called before that moment.
    pub fn max_local_keys(mut self, max_local_keys: usize) -> Self {
        self.max_local_keys = max_local_keys;
        self
    }

    /// The clock waits are slept on (Redis's clock decides the waits).
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> KeyedRedisBuilder<K, C2> {
        KeyedRedisBuilder {
            backend: self.backend,
            name: self.name,
            config: self.config,
            fallback: self.fallback,
            local_fraction: self.local_fraction,
            max_local_keys: self.max_local_keys,
            clock,
            key: std::marker::PhantomData,
        }
    }

    /// Creates the limiter on the backend. Does no I/O.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options (an empty name, a bad
    /// rate or policy, a local fraction outside `(0, 1]`, `max_local_keys`
    /// of 0).
    pub fn build(self) -> Result<KeyedRedisRateLimiter<K, C>, Error>
    where
        K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    {
        check_limiter(&self.name, &self.config, self.local_fraction)?;
        if self.max_local_keys == 0 {
            return Err(Error::InvalidArgument(
                "max_local_keys must be at least 1 (got 0)".to_owned(),
            ));
        }
        let (policy, rate, more) = super::builder::shapes(&self.config)?;
        let prefix = naming::keyed_prefix(&self.backend.key_prefix, &self.name);
        let inner = Failover::new(Parts {
            backend: self.backend,
            naming: Naming::Keyed { prefix },
            policy,
            rate,
            more,
            fallback: self.fallback,
            local_fraction: self.local_fraction,
            max_local_keys: self.max_local_keys,
            clock: self.clock,
        })?;
        Ok(KeyedRedisRateLimiter { inner })
    }
}

impl<K, C: fmt::Debug> fmt::Debug for KeyedRedisBuilder<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRedisBuilder")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("fallback", &self.fallback)
            .field("max_local_keys", &self.max_local_keys)
            .finish_non_exhaustive()
    }
}

/// # Reserving and waiting
///
/// Each method is [`RedisRateLimiter`](super::RedisRateLimiter)'s for one
/// key, looked up by any `&Q` it borrows as, with the same
/// [errors](super::RedisRateLimiter#errors) and the same cancel safety,
/// graded in the crate's [cancel-safety table](crate#cancel-safety).
impl<K, C> KeyedRedisRateLimiter<K, C>
where
    K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// Reserves `permits` of `key`; the wait. Does not sleep.
    /// Cancel-safe: dropped in flight, what it reserved is given back.
    pub async fn reserve<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::reserve(&*self.inner, key, permits).await
    }

    /// Reserves `permits` of `key` if the wait fits in `timeout`; `None`,
    /// reserving nothing, otherwise.
    /// Cancel-safe: dropped in flight, what it reserved is given back.
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
        Store::try_reserve(&*self.inner, key, permits, timeout).await
    }

    /// Reserves `permits` of `key` as a [`Reservation`]: wait for it, or
    /// drop it to give the permits back.
    /// Cancel-safe: dropped in flight, what it reserved is given back.
    pub async fn reservation<Q>(&self, key: &Q, permits: u32) -> Result<Reservation<'_>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::reservation(&*self.inner, key, permits).await
    }

    /// [`reservation`](Self::reservation) if the wait fits in `timeout`.
    /// Cancel-safe: dropped in flight, what it reserved is given back.
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
        Store::try_reservation(&*self.inner, key, permits, timeout).await
    }

    /// Reserves `permits` of `key` and sleeps for the wait.
    /// Cancel-safe: dropped, in flight or asleep, it gives back what it
    /// took.
    pub async fn acquire<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::acquire(&*self.inner, key, permits).await
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
        Store::try_acquire(&*self.inner, key, permits, timeout).await
    }

    /// How long a request of `key` made now would wait; reserves nothing.
    /// Cancel-safe: it takes nothing.
    pub async fn available_in<Q>(&self, key: &Q) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::available_in(&*self.inner, key).await
    }

    /// [`acquire`](Self::acquire) on the calling thread.
    pub fn acquire_blocking<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Store::acquire_blocking(&*self.inner, key, permits)
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
        Store::try_acquire_blocking(&*self.inner, key, permits, timeout)
    }
}

/// # Rate and health
impl<K, C> KeyedRedisRateLimiter<K, C>
where
    K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// Changes the rate of every key from now on (each key's next call
    /// carries it to Redis). With several limits, the first one's rate;
    /// the others scale alike.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        self.inner.set_rate(permits_per_second)
    }

    /// Changes the rate of limit `index` alone, for every key, as
    /// [`RedisRateLimiter::set_limit_rate`](super::RedisRateLimiter::set_limit_rate).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN, or
    /// there is no limit `index`.
    pub fn set_limit_rate(&self, index: usize, permits_per_second: f64) -> Result<(), Error> {
        self.inner.set_limit_rate(index, permits_per_second)
    }

    /// The stable rate of every key, in permits per second.
    pub fn rate(&self) -> f64 {
        self.inner.rate()
    }

    /// The clock waits are slept on.
    pub fn clock(&self) -> &C {
        self.inner.clock()
    }

    /// Whether calls are being served by the fallback now, for some keys at
    /// least (the backend is degraded; on a cluster, a node is down).
    pub fn is_degraded(&self) -> bool {
        self.inner.is_degraded()
    }

    /// The backend's health counters, with the keys this limiter's fallback
    /// holds now ([`local_keys`](RedisStats::local_keys): at most
    /// `max_local_keys`).
    pub fn stats(&self) -> RedisStats {
        RedisStats {
            local_keys: self.inner.local_len(),
            ..self.inner.backend.health.stats()
        }
    }

    /// The keys the local fallback holds now.
    #[deprecated(note = "read stats().local_keys, named like KeyedStats::keys")]
    pub fn local_len(&self) -> usize {
        self.inner.local_len()
    }

    /// The Redis key of `key`: `paceline:{name}:{key}`, with `\` and `:`
    /// escaped in the name (as `\\` and `\:`) and `\`, `{` and `}` in the
    /// key (as `\\`, `\(` and `\)`). No two (limiter, key) pairs, keyed
    /// or not, share a Redis key, and a key's text cannot choose its
    /// cluster slot (it holds no brace once escaped); braces in the *name*
    /// are kept, so a name such as `{tenant-7}` puts the limiter and all
    /// its keys in one slot.
    ///
    /// ```
    /// # use paceline::redis::KeyedRedisRateLimiter;
    /// # fn show(limiter: &KeyedRedisRateLimiter<String>) {
    /// // For a limiter named "api":
    /// assert_eq!(limiter.redis_key("alice"), "paceline:api:alice");
    /// assert_eq!(limiter.redis_key("{x}:y"), "paceline:api:\\(x\\):y");
    /// # }
    /// ```
    pub fn redis_key<Q: Display + ?Sized>(&self, key: &Q) -> String {
        self.inner.redis_key(key).to_string()
    }
}

impl<K, C> Keyed<K> for KeyedRedisRateLimiter<K, C>
where
    K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    type Store = Failover<K, C>;

    fn store(&self) -> &Self::Store {
        &self.inner
    }
}

impl<K, C: Clock> fmt::Debug for KeyedRedisRateLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRedisRateLimiter")
            .field("prefix", &self.inner.describe())
            .field("fallback", &self.inner.fallback)
            .field("stats", &self.inner.backend.health.stats())
            .finish_non_exhaustive()
    }
}
