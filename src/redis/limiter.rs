//! [`Redis`]: the store of a limiter shared through Redis, and what a
//! `RateLimiter<Redis>` and a `KeyedRateLimiter<K, Redis>` add: their keys'
//! names in Redis.

use std::fmt::{self, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::Fallback;
use super::backend::Backend;
use super::failover::Failover;
use crate::clock::Clock;
use crate::limiter::{Key, Store};
use crate::store::OnlyKey;
use crate::{KeyedRateLimiter, RateLimiter};

/// The state lives in Redis, shared by every process whose limiter has the
/// same name: `RateLimiter<Redis>`, `KeyedRateLimiter<K, Redis>`.
///
/// Each reservation is one round trip to the crate's script, on Redis's
/// clock; the wait it returns is slept here, and while Redis is
/// unavailable the limiter's [`Fallback`] serves (see [`redis`](super)).
/// Made with [`Builder::redis`](crate::Builder::redis) on a
/// [`RedisBackend`](super::RedisBackend).
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
    type Answer<'a, T: 'a> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

    fn answer<'a, T: 'a, F>(call: F) -> Self::Answer<'a, T>
    where
        F: Future<Output = T> + Send + 'a,
    {
        Box::pin(call)
    }

    type Single<C: Clock> = Arc<Failover<OnlyKey, C>>;
    type Keyed<K: Key, C: Clock> = Arc<Failover<K, C>>;
    type SingleSlots<C: Clock> = super::leases::Leases<OnlyKey, C>;
    type KeyedSlots<K: Key, C: Clock> = super::leases::Leases<K, C>;
    type Settings = Settings;
}

/// What a builder knows of a Redis limiter before it builds it.
#[derive(Clone)]
pub struct Settings {
    pub(crate) backend: Arc<Backend>,
    pub(crate) name: String,
    pub(crate) fallback: Fallback,
    pub(crate) local_fraction: f64,
    pub(crate) slot_ttl: std::time::Duration,
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

/// # Redis
impl<C: Clock> RateLimiter<Redis, C> {
    /// The Redis key holding the limiter's state: `paceline:v1:name` (the
    /// backend's [`key_prefix`](super::RedisBackendBuilder::key_prefix),
    /// the version of the key layout, and the name with `\` and `:`
    /// escaped as `\\` and `\:`, so that it is no keyed limiter's key).
    pub fn redis_key(&self) -> String {
        self.engine.redis_key(&OnlyKey).to_string()
    }
}

/// # Redis
impl<K: Key + Display, C: Clock> KeyedRateLimiter<K, Redis, C> {
    /// The Redis key of `key`: `paceline:v1:name:key`, with `\` and `:`
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
