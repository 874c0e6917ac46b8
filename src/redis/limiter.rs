//! [`RedisRateLimiter`]: the algorithm runs in Redis, the waiting here.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use redis::cluster::ClusterClient;
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

use super::builder::RedisBuilder;
use super::connection::Connection;
use super::fallback::{Fallback, Health, RedisStats, probe};
use super::script::{self, Call, ScriptArgs};
use crate::clock::{Clock, SystemClock};
use crate::core::stable_interval_micros;
use crate::error::{BackendError, check_permits};
use crate::{Error, Limiter, RateLimiter};

/// A rate limiter shared by every process that uses the same Redis key.
///
/// Each reservation is one round trip: an EVALSHA of `lua/reserve.lua`, which
/// runs the [core algorithm](crate::core) inside Redis on Redis's own clock
/// (`TIME`), so all callers share one schedule whatever their own clocks say.
/// The wait it returns is slept here, on the limiter's clock. Every call is
/// bounded by the response timeout; when Redis is unavailable the
/// [`Fallback`] takes over until a probe sees Redis answer again.
///
/// The verbs and types are those of the local [`RateLimiter`], and it
/// implements [`Limiter`], so an `Arc<dyn Limiter>` can be either.
///
/// ```no_run
/// use std::time::Duration;
/// use throttler::redis::{Fallback, RedisRateLimiter};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// let limiter = RedisRateLimiter::builder(client, "orders-api")
///     .permits_per_second(50.0)
///     .max_burst(Duration::from_secs(2))
///     .fallback(Fallback::Local)
///     .response_timeout(Duration::from_millis(200))
///     .build()
///     .await?;
/// limiter.acquire(1).await?;
/// if limiter.try_acquire(1, Duration::from_millis(50)).await? {
///     // go
/// }
/// # Ok(()) }
/// ```
pub struct RedisRateLimiter<C: Clock = SystemClock> {
    inner: Arc<Inner<C>>,
}

/// The runtime the limiter's Redis I/O and probe run on.
pub(crate) enum RuntimeRef {
    /// The runtime the limiter was built in.
    Borrowed(Handle),
    /// A runtime of its own (`build_blocking`); shut down on drop.
    Owned(Option<Runtime>),
}

impl RuntimeRef {
    fn handle(&self) -> Option<Handle> {
        match self {
            RuntimeRef::Borrowed(handle) => Some(handle.clone()),
            RuntimeRef::Owned(runtime) => runtime.as_ref().map(|r| r.handle().clone()),
        }
    }
}

pub(crate) struct Inner<C: Clock> {
    pub(crate) key: String,
    pub(crate) connection: Connection,
    pub(crate) script_args: ScriptArgs,
    /// The rate in force, as `f64` bits: passed with every call, so a change
    /// reaches Redis with the next reservation.
    pub(crate) rate_bits: AtomicU64,
    pub(crate) fallback: Fallback,
    /// The in-process limiter used by [`Fallback::Local`]; its clock is the
    /// one waits are slept on.
    pub(crate) local: RateLimiter<C>,
    pub(crate) local_fraction: f64,
    pub(crate) response_timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) health: Arc<Health>,
    pub(crate) runtime: RuntimeRef,
}

/// The local fallback's rate: a share of the shared rate, never rounded to 0.
pub(crate) fn local_rate(permits_per_second: f64, local_fraction: f64) -> f64 {
    (permits_per_second * local_fraction).max(f64::from_bits(1))
}

impl<C: Clock> Inner<C> {
    fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }

    /// One call: to Redis while it is healthy, to the fallback otherwise.
    async fn call(&self, call: Call) -> Result<Option<Duration>, Error> {
        if let Call::Reserve { permits, .. } = call {
            check_permits(permits)?;
        }
        if self.health.is_degraded() {
            return self.serve_fallback(call, None);
        }
        let mut connection = self.connection.clone();
        let invocation = script::invoke(
            &mut connection,
            &self.key,
            call,
            self.rate(),
            &self.script_args,
        );
        let failure = match tokio::time::timeout(self.response_timeout, invocation).await {
            Ok(Ok(reply)) => return script::decode(reply, &self.key),
            Ok(Err(e)) if script::is_data_error(&e) => {
                return Err(Error::Backend(BackendError::new(
                    format!("Redis refused the call on key {}", self.key),
                    Some(Box::new(e)),
                )));
            }
            Ok(Err(e)) => {
                let timed_out = e.is_timeout();
                BackendError::new(
                    format!("Redis failed the call on key {}", self.key),
                    Some(Box::new(e)),
                )
                .with_timeout(timed_out)
            }
            Err(_) => BackendError::timeout(format!(
                "Redis did not answer within {:?} (key {})",
                self.response_timeout, self.key
            )),
        };
        self.degrade(&failure);
        self.serve_fallback(call, Some(failure))
    }

    /// Switches to the fallback (once) and starts the probe.
    fn degrade(&self, failure: &BackendError) {
        if !self.health.degrade(&failure.to_string()) {
            return;
        }
        tracing::warn!(
            key = %self.key,
            fallback = ?self.fallback,
            error = %failure,
            "Redis is unavailable; serving from the fallback until it answers again"
        );
        if let Some(handle) = self.runtime.handle() {
            handle.spawn(probe(
                Arc::clone(&self.health),
                self.connection.clone(),
                self.key.clone(),
                self.probe_interval,
                self.response_timeout,
            ));
        }
    }

    fn serve_fallback(
        &self,
        call: Call,
        failure: Option<BackendError>,
    ) -> Result<Option<Duration>, Error> {
        self.health.count_fallback_call();
        match (self.fallback, call) {
            (Fallback::Local, Call::Reserve { permits, timeout: None }) => {
                self.local.reserve(permits).map(Some)
            }
            (Fallback::Local, Call::Reserve { permits, timeout: Some(timeout) }) => {
                self.local.try_reserve(permits, timeout)
            }
            (Fallback::Local, Call::Query) => Ok(Some(self.local.available_in())),
            (Fallback::FailOpen, _) => Ok(Some(Duration::ZERO)),
            (Fallback::FailClosed, _) => Err(Error::Backend(failure.unwrap_or_else(|| {
                BackendError::new(
                    format!(
                        "Redis is unavailable and the limiter fails closed (key {}; last error: {})",
                        self.key,
                        self.health.last_error()
                    ),
                    None,
                )
            }))),
        }
    }
}

impl<C: Clock> Drop for Inner<C> {
    fn drop(&mut self) {
        self.health.close();
        if let RuntimeRef::Owned(runtime) = &mut self.runtime {
            if let Some(runtime) = runtime.take() {
                // Never blocks, so dropping the limiter is fine anywhere.
                runtime.shutdown_background();
            }
        }
    }
}

/// # Constructors
impl RedisRateLimiter<SystemClock> {
    /// A builder for a limiter on one Redis server, sharing the key
    /// `throttler:{name}` with every other limiter of that name.
    pub fn builder(client: redis::Client, name: &str) -> RedisBuilder<SystemClock> {
        RedisBuilder::single(client, name)
    }

    /// A builder for a limiter on a Redis Cluster. Each limiter is one key,
    /// so limiters spread over the cluster's nodes.
    pub fn cluster_builder(client: ClusterClient, name: &str) -> RedisBuilder<SystemClock> {
        RedisBuilder::cluster(client, name)
    }
}

/// # Reserving and waiting
impl<C: Clock> RedisRateLimiter<C> {
    pub(crate) fn from_inner(inner: Inner<C>) -> Self {
        RedisRateLimiter {
            inner: Arc::new(inner),
        }
    }

    /// Reserves `permits` and returns the wait before they may be used.
    /// Does not sleep.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; [`Error::Backend`] if
    /// Redis fails and the fallback is [`Fallback::FailClosed`], or the key
    /// holds something else.
    pub async fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        let reserved = self
            .inner
            .call(Call::Reserve {
                permits,
                timeout: None,
            })
            .await?;
        Ok(reserved.unwrap_or_default())
    }

    /// Reserves `permits` if the wait fits in `timeout` and returns it;
    /// `None`, reserving nothing, otherwise. Does not sleep.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        self.inner
            .call(Call::Reserve {
                permits,
                timeout: Some(timeout),
            })
            .await
    }

    /// Reserves `permits` and sleeps for the wait; returns the time slept.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        Limiter::acquire(self, permits).await
    }

    /// Acquires `permits` if the wait fits in `timeout`, sleeping for it;
    /// returns `false` at once, reserving nothing, otherwise.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Limiter::try_acquire(self, permits, timeout).await
    }

    /// How long a request made now would wait; reserves nothing.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve), but never for the arguments.
    pub async fn available_in(&self) -> Result<Duration, Error> {
        Ok(self.inner.call(Call::Query).await?.unwrap_or_default())
    }
}

/// # Blocking
///
/// For threads that are not async tasks. The Redis call runs on the
/// limiter's runtime (its own if built with
/// [`build_blocking`](RedisBuilder::build_blocking)) and the calling thread
/// sleeps for the wait.
impl<C: Clock> RedisRateLimiter<C> {
    /// [`acquire`](Self::acquire) on the calling thread.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve); also [`Error::InvalidArgument`] when
    /// called on a current-thread Tokio runtime that the limiter uses (it
    /// would deadlock): use `acquire().await` there.
    pub fn acquire_blocking(&self, permits: u32) -> Result<Duration, Error> {
        let wait = self
            .run_blocking(Call::Reserve {
                permits,
                timeout: None,
            })?
            .unwrap_or_default();
        if !wait.is_zero() {
            self.inner.local.clock().sleep_blocking(wait);
        }
        Ok(wait)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Self::acquire_blocking).
    pub fn try_acquire_blocking(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        match self.run_blocking(Call::Reserve {
            permits,
            timeout: Some(timeout),
        })? {
            Some(wait) => {
                if !wait.is_zero() {
                    self.inner.local.clock().sleep_blocking(wait);
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn run_blocking(&self, call: Call) -> Result<Option<Duration>, Error> {
        let Some(handle) = self.inner.runtime.handle() else {
            return Err(shut_down());
        };
        if matches!(self.inner.runtime, RuntimeRef::Borrowed(_))
            && Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::CurrentThread)
        {
            return Err(Error::InvalidArgument(
                "a blocking call on a current-thread Tokio runtime would deadlock: \
                 use the async method (e.g. acquire().await), or build the limiter \
                 with build_blocking()"
                    .to_owned(),
            ));
        }
        let inner = Arc::clone(&self.inner);
        let task = handle.spawn(async move { inner.call(call).await });
        futures::executor::block_on(task).unwrap_or_else(|_| Err(shut_down()))
    }
}

fn shut_down() -> Error {
    Error::Backend(BackendError::new(
        "the limiter's Tokio runtime has shut down",
        None,
    ))
}

/// # Rate and health
impl<C: Clock> RedisRateLimiter<C> {
    /// Changes the rate from now on, for every process sharing the key: the
    /// next reservation carries it to Redis, which rescales the stored
    /// permits. (Processes that still pass the old rate change it back on
    /// their next call: give them all the same rate.)
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the rate is zero, negative or NaN.
    pub fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        stable_interval_micros(permits_per_second)?;
        self.inner
            .local
            .set_rate(local_rate(permits_per_second, self.inner.local_fraction))?;
        self.inner
            .rate_bits
            .store(permits_per_second.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    /// The stable rate, in permits per second.
    pub fn rate(&self) -> f64 {
        self.inner.rate()
    }

    /// Whether calls are being served by the fallback because Redis is
    /// unavailable.
    pub fn is_degraded(&self) -> bool {
        self.inner.health.is_degraded()
    }

    /// Health counters: fallbacks, recoveries, calls served by the fallback.
    pub fn stats(&self) -> RedisStats {
        self.inner.health.stats()
    }

    /// The Redis key holding this limiter's state (`throttler:{name}`).
    pub fn key(&self) -> &str {
        &self.inner.key
    }
}

#[async_trait]
impl<C: Clock> Limiter for RedisRateLimiter<C> {
    async fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        RedisRateLimiter::<C>::reserve(self, permits).await
    }

    async fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        RedisRateLimiter::<C>::try_reserve(self, permits, timeout).await
    }

    async fn available_in(&self) -> Result<Duration, Error> {
        RedisRateLimiter::<C>::available_in(self).await
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        RedisRateLimiter::<C>::set_rate(self, permits_per_second)
    }

    fn rate(&self) -> f64 {
        RedisRateLimiter::<C>::rate(self)
    }

    fn clock(&self) -> &dyn Clock {
        self.inner.local.clock()
    }
}

impl<C: Clock> fmt::Debug for RedisRateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("key", &self.inner.key)
            .field("rate", &self.rate())
            .field("fallback", &self.inner.fallback)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
