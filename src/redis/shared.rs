//! One connection for many limiters: [`RedisBackend`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redis-cluster")]
use redis::cluster::ClusterClient;

use super::Fallback;
use super::backend::{Backend, Connecting, ProbeTarget};
use super::builder::{assemble_limiter, connection_setters, fallback_setters};
use super::connection::Target;
use super::fallback::RedisStats;
use super::keyed::{DEFAULT_MAX_LOCAL_KEYS, KeyedRedisBuilder};
use super::limiter::RedisRateLimiter;
use super::runtime::{current_runtime, own_runtime};
use crate::Error;
use crate::builder::{PolicyConfig, policy_setters};
use crate::clock::{Clock, SystemClock};

/// Redis as many limiters share it: one connection (multiplexed), one
/// health state and one probe, for every limiter made from it with
/// [`limiter`](Self::limiter). A cheap `Clone` handle: clones share it all.
///
/// When a call of any of its limiters finds Redis unavailable, the backend
/// is *degraded*: every limiter serves from its own fallback, and one probe
/// (a fresh connection, and the script on the key whose call failed) runs
/// until the script works again. Each limiter then carries its fallback's
/// debt into its own key with its first call (see
/// [`RedisRateLimiter`]).
///
/// On a cluster, the health state is kept per node: a node that is down or
/// hung degrades only the limiters (and keyed limiters' keys) in its slots.
/// The first call that finds it down marks its key's slot; the probe then
/// reads the cluster's slot map and marks the node's other slots too, so
/// their calls go to their fallbacks at once instead of each waiting for
/// the response timeout. The probe runs the script on that node only, and
/// everything on it comes back together. [`is_degraded`](Self::is_degraded)
/// says whether any part is down; a limiter's own
/// [`is_degraded`](RedisRateLimiter::is_degraded) whether its key's is.
///
/// ```no_run
/// use paceline::redis::RedisBackend;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::builder(paceline::redis::Client::open("redis://127.0.0.1:6379/")?)
///     .build()
///     .await?;
/// // Both limiters use the backend's one connection; building them does no I/O.
/// let search = backend.limiter("search-api").permits_per_second(10.0).build()?;
/// let orders = backend.limiter("orders-api").permits_per_second(50.0).build()?;
/// search.acquire(1).await?;
/// orders.acquire(1).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    backend: Arc<Backend>,
}

/// # Constructors
impl RedisBackend {
    /// A backend on one Redis server.
    pub fn builder(client: redis::Client) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Target::Single(client))
    }

    /// A backend on a Redis Cluster (feature `redis-cluster`): each
    /// limiter's key lives on the node that owns its slot. Build the client
    /// with a connection timeout below the backend's response timeout, as
    /// for [`RedisRateLimiter::cluster_builder`].
    #[cfg(feature = "redis-cluster")]
    pub fn cluster_builder(client: ClusterClient) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Target::Cluster(Box::new(client)))
    }
}

/// # Limiters
impl RedisBackend {
    /// A builder for a limiter named `name` on this backend, sharing the key
    /// `paceline:{name}` with every other limiter of that name. Its
    /// [`build`](RedisLimiterBuilder::build) does no I/O.
    pub fn limiter(&self, name: &str) -> RedisLimiterBuilder<SystemClock> {
        RedisLimiterBuilder {
            backend: Arc::clone(&self.backend),
            name: name.to_owned(),
            config: PolicyConfig::default(),
            fallback: Fallback::default(),
            local_fraction: 1.0,
            clock: SystemClock::new(),
        }
    }

    /// A builder for a keyed limiter named `name` on this backend: one
    /// rate per key, each key its own Redis key `paceline:{name}:{key}`.
    /// Its [`build`](KeyedRedisBuilder::build) does no I/O.
    pub fn keyed_limiter<K>(&self, name: &str) -> KeyedRedisBuilder<K, SystemClock> {
        KeyedRedisBuilder {
            backend: Arc::clone(&self.backend),
            name: name.to_owned(),
            config: PolicyConfig::default(),
            fallback: Fallback::default(),
            local_fraction: 1.0,
            max_local_keys: DEFAULT_MAX_LOCAL_KEYS,
            clock: SystemClock::new(),
            key: std::marker::PhantomData,
        }
    }

    /// Whether any of the backend's limiters serve from their fallbacks now
    /// (on a cluster: whether any node is marked down).
    pub fn is_degraded(&self) -> bool {
        self.backend.health.any_down()
    }

    /// The backend's health counters, over all its limiters.
    pub fn stats(&self) -> RedisStats {
        self.backend.health.stats()
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("target", &self.backend.target.describe())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[must_use = "a builder does nothing until .build() is called"]
pub struct RedisBackendBuilder {
    target: Target,
    connecting: Connecting,
}

impl RedisBackendBuilder {
    fn new(target: Target) -> Self {
        RedisBackendBuilder {
            target,
            connecting: Connecting::default(),
        }
    }

    connection_setters!();

    /// Creates the backend on the current Tokio runtime, after one attempt
    /// to reach Redis (a connection and the script, within the response
    /// timeout).
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future drops the connection being made;
    /// nothing else exists yet.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options or when not called inside
    /// a Tokio runtime; with `require_connection(true)`, [`Error::Backend`]
    /// if Redis cannot be reached.
    pub async fn build(self) -> Result<RedisBackend, Error> {
        self.connecting.check()?;
        let runtime = current_runtime("RedisBackendBuilder")?;
        let require = self.connecting.require_connection;
        let backend = RedisBackend {
            backend: Arc::new(Backend::new(self.target, runtime, &self.connecting)),
        };
        backend
            .backend
            .start(require, ProbeTarget::backend())
            .await?;
        Ok(backend)
    }

    /// Creates the backend with a small runtime of its own, for programs
    /// with no async runtime (its limiters' `*_blocking` methods). Never
    /// panics, whatever fails.
    ///
    /// # Errors
    /// As [`build`](Self::build); [`Error::Backend`] if the runtime cannot
    /// be started.
    pub fn build_blocking(self) -> Result<RedisBackend, Error> {
        self.connecting.check()?;
        let runtime = own_runtime()?;
        let require = self.connecting.require_connection;
        let backend = Arc::new(Backend::new(self.target, runtime, &self.connecting));
        let starting = Arc::clone(&backend);
        backend
            .block_on(async move { starting.start(require, ProbeTarget::backend()).await })??;
        Ok(RedisBackend { backend })
    }
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("target", &self.target.describe())
            .field("connecting", &self.connecting)
            .finish()
    }
}

/// Builds a [`RedisRateLimiter`] on a [`RedisBackend`]; see
/// [`RedisBackend::limiter`]. The rate and policy setters are those of the
/// local [`Builder`](crate::Builder).
#[must_use = "a builder does nothing until .build() is called"]
pub struct RedisLimiterBuilder<C = SystemClock> {
    backend: Arc<Backend>,
    name: String,
    config: PolicyConfig,
    fallback: Fallback,
    local_fraction: f64,
    clock: C,
}

impl<C: Clock + Clone> RedisLimiterBuilder<C> {
    policy_setters!();

    fallback_setters!();

    /// The clock waits are slept on (Redis's clock decides the waits).
    /// Default: [`SystemClock`].
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> RedisLimiterBuilder<C2> {
        RedisLimiterBuilder {
            backend: self.backend,
            name: self.name,
            config: self.config,
            fallback: self.fallback,
            local_fraction: self.local_fraction,
            clock,
        }
    }

    /// Creates the limiter on the backend. Does no I/O: it uses the
    /// backend's connection and health as they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options (an empty name, a bad
    /// rate or policy, a local fraction outside `(0, 1]`).
    pub fn build(self) -> Result<RedisRateLimiter<C>, Error> {
        assemble_limiter(
            self.backend,
            &self.name,
            &self.config,
            self.fallback,
            self.local_fraction,
            self.clock,
        )
    }
}

impl<C: fmt::Debug> fmt::Debug for RedisLimiterBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiterBuilder")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("fallback", &self.fallback)
            .field("local_fraction", &self.local_fraction)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}
