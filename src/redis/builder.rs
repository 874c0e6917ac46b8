//! Configuration and construction of a [`RedisRateLimiter`].

use crate::builder::limit_states;
use crate::core::Policy;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redis-cluster")]
use redis::cluster::ClusterClient;

use super::Fallback;
use super::backend::{Backend, Connecting};
use super::connection::Target;
use super::failover::{Failover, Naming, Parts};
use super::limiter::RedisRateLimiter;
use super::naming;
use super::runtime::{RuntimeRef, current_runtime, own_runtime};
use crate::Error;
use crate::builder::{PolicyConfig, policy_setters};
use crate::clock::{Clock, SystemClock};

/// The default [`response_timeout`](RedisBuilder::response_timeout).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(200);

/// The default [`probe_interval`](RedisBuilder::probe_interval).
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The fallback setters of a limiter's builder (fields `fallback` and
/// `local_fraction`).
macro_rules! fallback_setters {
    () => {
        /// What to do while Redis is unavailable. Default
        /// [`Fallback::Local`](crate::redis::Fallback::Local).
        pub fn fallback(mut self, fallback: crate::redis::Fallback) -> Self {
            self.fallback = fallback;
            self
        }

        /// With [`Fallback::Local`](crate::redis::Fallback::Local), the
        /// share of the rate this process allows itself while degraded:
        /// `1.0 / N` when N processes share the key, so that together they
        /// stay near the rate. Default 1.0; must be in `(0, 1]`.
        pub fn local_fraction(mut self, local_fraction: f64) -> Self {
            self.local_fraction = local_fraction;
            self
        }
    };
}
pub(crate) use fallback_setters;

/// The connection setters of a backend's builder (its field `connecting`,
/// a [`Connecting`](super::backend::Connecting)).
macro_rules! connection_setters {
    () => {
        /// How long one call waits for Redis before the fallback takes
        /// over. Default 200 ms; must be more than zero.
        pub fn response_timeout(mut self, response_timeout: std::time::Duration) -> Self {
            self.connecting.response_timeout = response_timeout;
            self
        }

        /// How often a degraded backend probes Redis to see whether it is
        /// back (a fresh connection, and the script on it). Default 500 ms;
        /// must be more than zero.
        pub fn probe_interval(mut self, probe_interval: std::time::Duration) -> Self {
            self.connecting.probe_interval = probe_interval;
            self
        }

        /// Whether building fails when Redis does not answer. Default
        /// `false`: the limiters then start degraded (their fallbacks serve,
        /// a warning is logged) and switch to Redis as soon as the probe
        /// sees the script work, so a service can start while Redis is
        /// down. Set it to fail fast instead; bad options fail at once
        /// either way.
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
        /// call holds per request: a caller waits at most the response
        /// timeout, whether or not the key's other callers are polled (the
        /// round trips run on the limiter's runtime, not in a caller's
        /// future); a caller that gives up while queued sends and is
        /// charged nothing; one that gives up after its batch was sent has
        /// its grant given back; a batch that fails sends each of its
        /// callers to the fallback once. With `false`, every call is its
        /// own round trip.
        pub fn coalesce(mut self, coalesce: bool) -> Self {
            self.connecting.coalesce = coalesce;
            self
        }

        /// What every Redis key of the limiters starts with, before a `:`
        /// and the limiter's name. Default `paceline`
        /// ([`DEFAULT_KEY_PREFIX`](crate::redis::DEFAULT_KEY_PREFIX)).
        /// Set `throttler` to share the keys of limiters that ran this
        /// crate under its former name (the values' format is the same).
        /// Must be non-empty, without `:`, `{` or `}`: checked when built.
        pub fn key_prefix(mut self, key_prefix: &str) -> Self {
            self.connecting.key_prefix = key_prefix.to_owned();
            self
        }
    };
}
pub(crate) use connection_setters;

/// Builds a [`RedisRateLimiter`]; see [`RedisRateLimiter::builder`].
///
/// Rate and policy options are those of the local
/// [`Builder`](crate::Builder); the others say how to talk to Redis and what
/// to do when it does not answer.
#[must_use = "a builder does nothing until .build() is called"]
pub struct RedisBuilder<C = SystemClock> {
    target: Target,
    name: String,
    config: PolicyConfig,
    fallback: Fallback,
    local_fraction: f64,
    connecting: Connecting,
    clock: C,
}

impl RedisBuilder<SystemClock> {
    pub(crate) fn single(client: redis::Client, name: &str) -> Self {
        Self::new(Target::Single(client), name)
    }

    #[cfg(feature = "redis-cluster")]
    pub(crate) fn cluster(client: ClusterClient, name: &str) -> Self {
        Self::new(Target::Cluster(Box::new(client)), name)
    }

    fn new(target: Target, name: &str) -> Self {
        RedisBuilder {
            target,
            name: name.to_owned(),
            config: PolicyConfig::default(),
            fallback: Fallback::default(),
            local_fraction: 1.0,
            connecting: Connecting::default(),
            clock: SystemClock::new(),
        }
    }
}

impl<C: Clock + Clone> RedisBuilder<C> {
    policy_setters!();

    fallback_setters!();
    connection_setters!();

    /// The clock waits are slept on (Redis's clock decides the waits).
    /// Default: [`SystemClock`].
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> RedisBuilder<C2> {
        RedisBuilder {
            target: self.target,
            name: self.name,
            config: self.config,
            fallback: self.fallback,
            local_fraction: self.local_fraction,
            connecting: self.connecting,
            clock,
        }
    }

    /// Creates the limiter on the current Tokio runtime (which needs its
    /// time driver, as `#[tokio::main]` has), after one attempt to reach
    /// Redis (a connection and the limiter's script, within the response
    /// timeout).
    ///
    /// If Redis does not answer, the limiter starts degraded and connects in
    /// the background (see [`require_connection`](Self::require_connection)).
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future drops the connection being made;
    /// nothing else exists yet.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options or when not called inside
    /// a Tokio runtime; with `require_connection(true)`, [`Error::Backend`]
    /// if Redis cannot be reached.
    pub async fn build(self) -> Result<RedisRateLimiter<C>, Error> {
        self.check()?;
        let runtime = current_runtime("RedisBuilder")?;
        let require = self.connecting.require_connection;
        let limiter = self.assemble(runtime)?;
        limiter.start(require).await?;
        Ok(limiter)
    }

    /// Creates the limiter with a small runtime of its own (one worker
    /// thread), for programs with no async runtime: use the `*_blocking`
    /// methods. Works from a plain thread, from `spawn_blocking` and from a
    /// task of any Tokio runtime; never panics, whatever fails.
    ///
    /// # Errors
    /// As [`build`](Self::build); [`Error::Backend`] if the runtime cannot
    /// be started.
    pub fn build_blocking(self) -> Result<RedisRateLimiter<C>, Error> {
        self.check()?;
        let runtime = own_runtime()?;
        let require = self.connecting.require_connection;
        // From here on the runtime belongs to the limiter, which shuts it
        // down without blocking when dropped, on every path.
        let limiter = self.assemble(runtime)?;
        let starting = RedisRateLimiter::from_arc(Arc::clone(&limiter.inner));
        limiter
            .inner
            .backend
            .block_on(async move { starting.start(require).await })??;
        Ok(limiter)
    }

    fn check(&self) -> Result<(), Error> {
        self.connecting.check()?;
        check_limiter(&self.name, &self.config, self.local_fraction)
    }

    /// The limiter, not yet connected (degraded until
    /// [`start`](RedisRateLimiter::start)), on a backend of its own.
    fn assemble(self, runtime: RuntimeRef) -> Result<RedisRateLimiter<C>, Error> {
        let backend = Arc::new(Backend::new(self.target, runtime, &self.connecting));
        assemble_limiter(
            backend,
            &self.name,
            &self.config,
            self.fallback,
            self.local_fraction,
            self.clock,
        )
    }
}

/// Checks a limiter's options.
pub(crate) fn check_limiter(
    name: &str,
    config: &PolicyConfig,
    local_fraction: f64,
) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(
            "the limiter's name (its Redis key) must not be empty".to_owned(),
        ));
    }
    if !(local_fraction > 0.0 && local_fraction <= 1.0) {
        return Err(Error::InvalidArgument(format!(
            "local_fraction must be in (0, 1] (got {local_fraction})"
        )));
    }
    limit_states(config, 0).map(|_| ())
}

/// The policy and rate of a builder's first limit, and the others.
pub(crate) type Shapes = (Policy, f64, Vec<(Policy, f64)>);

/// The limits a builder's options describe, as [`Parts`] takes them.
pub(crate) fn shapes(config: &PolicyConfig) -> Result<Shapes, Error> {
    let mut states = limit_states(config, 0)?.into_iter();
    let first = states.next().expect("at least one limit");
    let more = states.map(|s| (s.policy, s.permits_per_second)).collect();
    Ok((first.policy, first.permits_per_second, more))
}

/// A limiter named `name` on `backend` (no I/O: it uses the backend's
/// connection and health as they are).
pub(crate) fn assemble_limiter<C: Clock>(
    backend: Arc<Backend>,
    name: &str,
    config: &PolicyConfig,
    fallback: Fallback,
    local_fraction: f64,
    clock: C,
) -> Result<RedisRateLimiter<C>, Error> {
    check_limiter(name, config, local_fraction)?;
    let (policy, rate, more) = shapes(config)?;
    let key: Arc<str> = naming::single_key(&backend.key_prefix, name).into();
    let zone = backend.health.zone_of(&key);
    let failover = Failover::new(Parts {
        backend,
        naming: Naming::Single { key, zone },
        policy,
        rate,
        more,
        fallback,
        local_fraction,
        // The fallback holds the limiter's one state.
        max_local_keys: 1,
        clock,
    })?;
    Ok(RedisRateLimiter::from_arc(failover))
}

/// # Constructors
impl RedisRateLimiter<SystemClock> {
    /// A builder for a limiter on one Redis server, sharing the key
    /// `paceline:{name}` with every other limiter of that name.
    pub fn builder(client: redis::Client, name: &str) -> RedisBuilder<SystemClock> {
        RedisBuilder::single(client, name)
    }

    /// A builder for a limiter on a Redis Cluster (feature `redis-cluster`).
    /// Each limiter is one key, so limiters spread over the cluster's nodes.
    ///
    /// Build the client with a connection timeout below the limiter's
    /// [`response_timeout`](RedisBuilder::response_timeout)
    /// (`ClusterClientBuilder::connection_timeout`; the client's default is
    /// 1 s): a cluster connection that reconnects to a node which accepts
    /// connections but does not answer (a hung process) holds every request
    /// until it gives up on that node, which would keep the limiter on its
    /// fallback on every node.
    #[cfg(feature = "redis-cluster")]
    pub fn cluster_builder(client: ClusterClient, name: &str) -> RedisBuilder<SystemClock> {
        RedisBuilder::cluster(client, name)
    }
}
