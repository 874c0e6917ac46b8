//! Configuration and construction of a [`RedisRateLimiter`].

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use redis::cluster::ClusterClient;
use tokio::runtime::Handle;

use super::Fallback;
use super::backend::{Backend, RuntimeRef};
use super::connection::{Link, Target};
use super::fallback::Health;
use super::limiter::{Inner, RedisRateLimiter, local_rate};
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
    require_connection: bool,
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
            require_connection: false,
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

    /// How often a degraded limiter probes Redis to see whether it is back
    /// (a fresh connection, and the limiter's script on it). Default 500 ms.
    pub fn probe_interval(mut self, probe_interval: Duration) -> Self {
        self.probe_interval = probe_interval;
        self
    }

    /// Whether building fails when Redis does not answer. Default `false`:
    /// the limiter then starts degraded (its fallback serves, a warning is
    /// logged) and switches to Redis as soon as the probe sees the script
    /// work, so a service can start while Redis is down. Set it to fail
    /// fast instead; bad options fail at once either way.
    pub fn require_connection(mut self, require_connection: bool) -> Self {
        self.require_connection = require_connection;
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
            require_connection: self.require_connection,
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
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options or when not called inside
    /// a Tokio runtime; with `require_connection(true)`, [`Error::Backend`]
    /// if Redis cannot be reached.
    pub async fn build(self) -> Result<RedisRateLimiter<C>, Error> {
        self.check()?;
        let handle = Handle::try_current().map_err(|_| {
            Error::InvalidArgument(
                "RedisBuilder::build() must run inside a Tokio runtime; \
                 use build_blocking() in a program without one"
                    .to_owned(),
            )
        })?;
        let require = self.require_connection;
        let limiter = self.assemble(RuntimeRef::Borrowed(handle))?;
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
        let require = self.require_connection;
        // From here on the runtime belongs to the limiter, which shuts it
        // down without blocking when dropped, on every path.
        let limiter = self.assemble(RuntimeRef::Owned(Some(runtime)))?;
        let starting = RedisRateLimiter::from_arc(Arc::clone(&limiter.inner));
        limiter
            .inner
            .backend
            .block_on(async move { starting.start(require).await })??;
        Ok(limiter)
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

    /// The limiter, not yet connected (degraded until
    /// [`start`](RedisRateLimiter::start)).
    fn assemble(self, runtime: RuntimeRef) -> Result<RedisRateLimiter<C>, Error> {
        let (policy, rate) = self.config.policy()?;
        let now = self.clock.now_micros();
        let local = RateLimiter::from_parts(
            State::new(policy.clone(), local_rate(rate, self.local_fraction), now)?,
            self.clock,
        );
        let backend = Arc::new(Backend {
            target: self.target,
            link: Link::default(),
            health: Health::default(),
            runtime,
            response_timeout: self.response_timeout,
            probe_interval: self.probe_interval,
        });
        Ok(RedisRateLimiter::from_arc(Arc::new_cyclic(|this| Inner {
            backend,
            key: format!("{KEY_PREFIX}{}", self.name).into(),
            script_args: Arc::new(ScriptArgs::new(&policy, rate)),
            rate_bits: AtomicU64::new(rate.to_bits()),
            fallback: self.fallback,
            local,
            local_fraction: self.local_fraction,
            debt_until: AtomicU64::new(0),
            opened_until: AtomicU64::new(0),
            this: this.clone(),
        })))
    }
}
