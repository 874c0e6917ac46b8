//! Configuration and construction of a [`RedisRateLimiter`].

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use tokio::runtime::Handle;

use super::Fallback;
use super::connection::Connection;
use super::limiter::{Inner, RedisRateLimiter, RuntimeRef, local_rate};
use super::script::ScriptArgs;
use crate::builder::{PolicyConfig, policy_setters};
use crate::clock::{Clock, SystemClock};
use crate::core::State;
use crate::error::BackendError;
use crate::{Error, RateLimiter};

/// Every key is `throttler:` followed by the limiter's name.
pub const KEY_PREFIX: &str = "throttler:";

/// The default [`response_timeout`](RedisBuilder::response_timeout).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(200);

/// The default [`probe_interval`](RedisBuilder::probe_interval).
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(500);

enum Target {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

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
    response_timeout: Duration,
    probe_interval: Duration,
    clock: C,
}

impl RedisBuilder<SystemClock> {
    pub(crate) fn single(client: redis::Client, name: &str) -> Self {
        Self::new(Target::Single(client), name)
    }

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
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            clock: SystemClock::new(),
        }
    }
}

impl<C: Clock + Clone> RedisBuilder<C> {
    policy_setters!();

    /// What to do while Redis is unavailable. Default [`Fallback::Local`].
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// With [`Fallback::Local`], the share of the rate this process allows
    /// itself while degraded: `1.0 / N` when N processes share the key, so
    /// that together they stay near the rate. Default 1.0; must be in
    /// `(0, 1]`.
    pub fn local_fraction(mut self, local_fraction: f64) -> Self {
        self.local_fraction = local_fraction;
        self
    }

    /// How long one call waits for Redis before the fallback takes over.
    /// Default 200 ms.
    pub fn response_timeout(mut self, response_timeout: Duration) -> Self {
        self.response_timeout = response_timeout;
        self
    }

    /// How often a degraded limiter PINGs Redis to see whether it is back.
    /// Default 500 ms.
    pub fn probe_interval(mut self, probe_interval: Duration) -> Self {
        self.probe_interval = probe_interval;
        self
    }

    /// The clock waits are slept on (Redis's clock decides the waits).
    /// Default: [`SystemClock`].
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> RedisBuilder<C2> {
        RedisBuilder {
            target: self.target,
            name: self.name,
            config: self.config,
            fallback: self.fallback,
            local_fraction: self.local_fraction,
            response_timeout: self.response_timeout,
            probe_interval: self.probe_interval,
            clock,
        }
    }

    /// Connects and creates the limiter, on the current Tokio runtime (which
    /// needs its time driver, as `#[tokio::main]` has).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options or when not called inside
    /// a Tokio runtime; [`Error::Backend`] if Redis cannot be reached.
    pub async fn build(self) -> Result<RedisRateLimiter<C>, Error> {
        let handle = Handle::try_current().map_err(|_| {
            Error::InvalidArgument(
                "RedisBuilder::build() must run inside a Tokio runtime; \
                 use build_blocking() in a program without one"
                    .to_owned(),
            )
        })?;
        self.build_on(RuntimeRef::Borrowed(handle)).await
    }

    /// Connects and creates the limiter with a small runtime of its own (one
    /// worker thread), for programs with no async runtime: use the
    /// `*_blocking` methods. Also works when called from inside a runtime.
    ///
    /// # Errors
    /// As [`build`](Self::build).
    pub fn build_blocking(self) -> Result<RedisRateLimiter<C>, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("throttler-redis")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::Backend(BackendError::new(
                    "cannot start the limiter's runtime",
                    Some(Box::new(e)),
                ))
            })?;
        let handle = runtime.handle().clone();
        let task = handle.spawn(self.connect());
        let connected = futures::executor::block_on(task);
        let (builder, connection) = match connected {
            Ok(result) => result?,
            Err(e) => {
                return Err(Error::Backend(BackendError::new(
                    "the connecting task failed",
                    Some(Box::new(e)),
                )));
            }
        };
        builder.assemble(connection, RuntimeRef::Owned(Some(runtime)))
    }

    async fn build_on(self, runtime: RuntimeRef) -> Result<RedisRateLimiter<C>, Error> {
        let (builder, connection) = self.connect().await?;
        builder.assemble(connection, runtime)
    }

    fn check(&self) -> Result<(), Error> {
        if self.name.is_empty() {
            return Err(Error::InvalidArgument(
                "the limiter's name (its Redis key) must not be empty".to_owned(),
            ));
        }
        if !(self.local_fraction > 0.0 && self.local_fraction <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "local_fraction must be in (0, 1] (got {})",
                self.local_fraction
            )));
        }
        for (what, value) in [
            ("response_timeout", self.response_timeout),
            ("probe_interval", self.probe_interval),
        ] {
            if value.is_zero() {
                return Err(Error::InvalidArgument(format!(
                    "{what} must be more than zero"
                )));
            }
        }
        self.config.policy().map(|_| ())
    }

    /// Checks the options and opens the connection, within a deadline.
    async fn connect(self) -> Result<(Self, Connection), Error> {
        self.check()?;
        let deadline = (self.response_timeout * 5).max(Duration::from_secs(1));
        let what = match &self.target {
            Target::Single(client) => format!("Redis at {}", client.get_connection_info().addr()),
            Target::Cluster(_) => "the Redis cluster".to_owned(),
        };
        let connecting = async {
            match &self.target {
                Target::Single(client) => {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.response_timeout))
                        // Every call is bounded by `response_timeout` in the
                        // limiter itself; a second timer per request here
                        // would only cost time.
                        .set_response_timeout(None)
                        .set_number_of_retries(2)
                        .set_min_delay(Duration::from_millis(10))
                        .set_max_delay(self.probe_interval);
                    ConnectionManager::new_with_config(client.clone(), config)
                        .await
                        .map(Connection::Single)
                }
                Target::Cluster(client) => {
                    client.get_async_connection().await.map(Connection::Cluster)
                }
            }
        };
        match tokio::time::timeout(deadline, connecting).await {
            Ok(Ok(connection)) => Ok((self, connection)),
            Ok(Err(e)) => Err(Error::Backend(BackendError::new(
                format!("cannot connect to {what}"),
                Some(Box::new(e)),
            ))),
            Err(_) => Err(Error::Backend(BackendError::timeout(format!(
                "cannot connect to {what}: no answer within {deadline:?}"
            )))),
        }
    }

    fn assemble(
        self,
        connection: Connection,
        runtime: RuntimeRef,
    ) -> Result<RedisRateLimiter<C>, Error> {
        let (policy, rate) = self.config.policy()?;
        let now = self.clock.now_micros();
        let local = RateLimiter::from_parts(
            State::new(policy.clone(), local_rate(rate, self.local_fraction), now)?,
            self.clock,
        );
        Ok(RedisRateLimiter::from_inner(Inner {
            key: format!("{KEY_PREFIX}{}", self.name),
            connection,
            script_args: ScriptArgs::new(&policy, rate),
            rate_bits: AtomicU64::new(rate.to_bits()),
            fallback: self.fallback,
            local,
            local_fraction: self.local_fraction,
            response_timeout: self.response_timeout,
            probe_interval: self.probe_interval,
            health: Arc::default(),
            runtime,
        }))
    }
}
