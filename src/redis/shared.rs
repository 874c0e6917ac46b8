//! One connection for many limiters: [`RedisBackend`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redis-cluster")]
use redis::cluster::ClusterClient;

use super::backend::{Backend, Connecting, ProbeTarget};
use super::connection::Target;
use super::runtime::{current_runtime, own_runtime};
use crate::{Error, Stats};

/// Redis as the limiters of a process share it: one connection
/// (multiplexed), one health state and one probe, for every limiter made on
/// it with [`Builder::redis`](crate::Builder::redis). A cheap `Clone`
/// handle: clones share it all.
///
/// When a call of any of its limiters finds Redis unavailable, the backend
/// is *degraded*: every limiter serves from its own fallback, and one probe
/// (a fresh connection, and the script on the key whose call failed) runs
/// until the script works again. Each limiter then carries its fallback's
/// debt into its own key with its first call (see [`redis`](super)).
///
/// On a cluster, the health state is kept per node: a node that is down or
/// hung degrades only the limiters and keys in its slots (the
/// [table](super#when-redis-fails) says how). [`stats`](Self::stats) says
/// whether any part is down; a limiter's own `stats()` whether its key's
/// is.
///
/// ```no_run
/// use paceline::RateLimiter;
/// use paceline::redis::RedisBackend;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = RedisBackend::builder(paceline::redis::Client::open("redis://127.0.0.1:6379/")?)
///     .build()
///     .await?;
/// // Both limiters use the backend's one connection; building them does no I/O.
/// let search = RateLimiter::builder().permits_per_second(10.0).redis(&redis, "search-api").build()?;
/// let orders = RateLimiter::builder().permits_per_second(50.0).redis(&redis, "orders-api").build()?;
/// search.acquire(1).await?;
/// orders.acquire(1).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) backend: Arc<Backend>,
}

/// # Constructors
impl RedisBackend {
    /// A backend on one Redis server.
    pub fn builder(client: redis::Client) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Target::Single(client))
    }

    /// A backend on a Redis Cluster (feature `redis-cluster`): each
    /// limiter's key lives on the node that owns its slot. Build the client
    /// with a connection timeout below the backend's response timeout
    /// (`ClusterClientBuilder::connection_timeout`; the client's default is
    /// 1 s): a cluster connection that reconnects to a node which accepts
    /// connections but does not answer (a hung process) holds every request
    /// until it gives up on that node, which would keep the limiters on
    /// their fallbacks on every node.
    #[cfg(feature = "redis-cluster")]
    pub fn cluster_builder(client: ClusterClient) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Target::Cluster(Box::new(client)))
    }
}

/// # Health
impl RedisBackend {
    /// The backend's health, over all its limiters: whether any part of
    /// Redis is down now (on a cluster, any node), and how often its
    /// limiters switched to their fallbacks and back (see [`Stats`]). The
    /// keys held and calls in flight are each limiter's own (its `stats`),
    /// so they read zero here.
    pub fn stats(&self) -> Stats {
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

    /// How long one call waits for Redis before the fallback takes
    /// over. Default 200 ms
    /// ([`DEFAULT_RESPONSE_TIMEOUT`](super::DEFAULT_RESPONSE_TIMEOUT)); must
    /// be more than zero. `Duration::MAX` is none: a call waits for Redis
    /// as long as it takes (a hung server then holds its callers).
    pub fn response_timeout(mut self, response_timeout: Duration) -> Self {
        self.connecting.response_timeout = response_timeout;
        self
    }

    /// How often a degraded backend probes Redis to see whether it is
    /// back (a fresh connection, and the script on it). Default 500 ms;
    /// must be more than zero.
    pub fn probe_interval(mut self, probe_interval: Duration) -> Self {
        self.connecting.probe_interval = probe_interval;
        self
    }

    /// Whether building fails when Redis does not answer. Default
    /// `false`: the limiters then start degraded (their fallbacks serve,
    /// a warning is logged) and switch to Redis as soon as the probe
    /// sees the script work, so a service can start while Redis is
    /// down. Set it to fail fast instead; bad options fail at once
    /// either way, and so does a Redis that answers and refuses this
    /// client (a wrong password or user, no permission for the script, a
    /// database that does not exist): a mistake that waiting cannot mend,
    /// which a fallback would only hide.
    pub fn require_connection(mut self, require_connection: bool) -> Self {
        self.connecting.require_connection = require_connection;
        self
    }

    /// Whether reservations of one Redis key that arrive while a round
    /// trip of that key is in flight wait for it and then go together,
    /// in one call of the script (up to 256 at a time). Default `true`.
    ///
    /// The script applies a batch in order at one reading of Redis's
    /// clock: each request gets exactly what it would have got had the
    /// same calls arrived one by one at that moment. A lone caller goes
    /// at once, so nothing waits without contention; under contention a
    /// hot key serves several times more reservations per second, as
    /// Redis runs one script at a time. Every guarantee of a single
    /// call holds per request: a try's timeout counts from its call (the
    /// time it waited queued is taken off it); a caller waits at most the
    /// response timeout, whether or not the key's other callers are
    /// polled (the round trips run on the backend's runtime, not in a
    /// caller's future); a caller that gives up while queued sends and is
    /// charged nothing; one that gives up after its batch was sent has
    /// its grant given back; a batch that fails sends each of its
    /// callers to the fallback once. A caller whose time runs out after
    /// it waited behind round trips of its key that Redis answered in
    /// time goes to the fallback without marking Redis down, which only a
    /// round trip unanswered for the whole response timeout does. With
    /// `false`, every call is its own round trip.
    pub fn coalesce(mut self, coalesce: bool) -> Self {
        self.connecting.coalesce = coalesce;
        self
    }

    /// What every Redis key of the limiters starts with, before `:v1:`
    /// (the version of the key layout) and the limiter's name. Default
    /// `paceline` ([`DEFAULT_KEY_PREFIX`](super::DEFAULT_KEY_PREFIX)).
    /// Must be non-empty, without `:`, `{` or `}`: checked when built.
    pub fn key_prefix(mut self, key_prefix: &str) -> Self {
        self.connecting.key_prefix = key_prefix.to_owned();
        self
    }

    /// Creates the backend on the current Tokio runtime, after one attempt
    /// to reach Redis (a connection and the script, within the response
    /// timeout).
    ///
    /// Its connections and background work run on that runtime: once it
    /// shuts down, or is no longer driven (a current-thread runtime whose
    /// `block_on` returned), Redis is out of reach and the limiters serve
    /// on their fallback, the blocking calls too (the first waits for the
    /// runtime at most twice the response timeout and a second, or twice
    /// that if the runtime stops in the middle of its round trip, which is
    /// waited for rather than served twice; the ones after it are served
    /// at once until the runtime's probe finds Redis again);
    /// [`build_blocking`](Self::build_blocking) gives the backend a runtime
    /// of its own.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future drops the connection being made;
    /// nothing else exists yet.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options or when not called inside
    /// a Tokio runtime; [`Error::Backend`] if Redis refuses this client
    /// (see [`require_connection`](Self::require_connection)), and with
    /// `require_connection(true)` if it cannot be reached.
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
        backend.block_on(
            async move { starting.start(require, ProbeTarget::backend()).await },
            None,
        )??;
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
