//! [`RedisRateLimiter`]: the algorithm runs in Redis, the waiting here.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use redis::RedisResult;
use redis::cluster::ClusterClient;

use super::backend::{Backend, ProbeTarget, Scope, blocking_section};
use super::builder::RedisBuilder;
use super::fallback::{Fallback, RedisStats};
use super::health::Zone;
use super::script::{self, Call, Reply, ScriptArgs, Token};
use crate::clock::{Clock, SystemClock};
use crate::core::{micros, stable_interval_micros};
use crate::error::{BackendError, check_permits};
use crate::reservation::{GiveBackTo, Pending, Taken};
use crate::{Error, Limiter, RateLimiter, Reservation};

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
    pub(crate) inner: Arc<Inner<C>>,
}

/// How long a round trip abandoned by its caller (dropped, or past the
/// response timeout) is still awaited, so that a reservation applied late
/// can be given back.
const ORPHAN_WAIT: Duration = Duration::from_secs(30);

/// The limiter's state, shared with its background tasks.
pub(crate) struct Inner<C: Clock> {
    pub(crate) backend: Arc<Backend>,
    pub(crate) key: Arc<str>,
    /// The part of the backend the key lives in (its slot on a cluster).
    pub(crate) zone: Zone,
    pub(crate) script_args: Arc<ScriptArgs>,
    /// The rate in force, as `f64` bits: passed with every call, so a change
    /// reaches Redis with the next reservation.
    pub(crate) rate_bits: AtomicU64,
    pub(crate) fallback: Fallback,
    /// The in-process limiter used by [`Fallback::Local`]; its clock is the
    /// one waits are slept on.
    pub(crate) local: RateLimiter<C>,
    pub(crate) local_fraction: f64,
    /// When the debt Redis last reported ends, on the local clock (µs): the
    /// local fallback starts from there.
    pub(crate) debt_until: AtomicU64,
    /// The ticket the local fallback opened with at the last switch (µs,
    /// local clock): what of its debt Redis already knows.
    pub(crate) opened_until: AtomicU64,
    /// Whether this limiter has served from its fallback since it last
    /// used Redis: its first call after the backend recovers then carries
    /// the fallback's debt into its key (see [`Inner::leave_fallback`]).
    pub(crate) serving_locally: AtomicBool,
    /// Held while the fallback opens, so that no caller is served from it
    /// before it has been restarted (see [`Inner::enter_fallback`]).
    pub(crate) opening: Mutex<()>,
}

/// Why a round trip gave no reply to use.
pub(crate) enum Failure {
    /// Redis answered that the call or the key is wrong: reported as is.
    Refused(Error),
    /// Redis is unavailable (degraded, failing, or too slow).
    Down(Option<BackendError>),
}

/// The local fallback's rate: a share of the shared rate, never rounded to 0.
pub(crate) fn local_rate(permits_per_second: f64, local_fraction: f64) -> f64 {
    (permits_per_second * local_fraction).max(f64::from_bits(1))
}

type RoundTrip = Pin<Box<dyn Future<Output = RedisResult<Reply>> + Send>>;

/// Sends a give-back for a reservation made in Redis.
pub(crate) struct Canceller {
    pub(crate) backend: Arc<Backend>,
    pub(crate) target: ProbeTarget,
}

impl Canceller {
    /// One round trip, bounded by the response timeout; a failure is only
    /// logged (the reservation then stays charged: the limiter errs towards
    /// limiting).
    pub(crate) async fn cancel(self, token: Token) {
        let Some(mut connection) = self.backend.connection() else {
            return;
        };
        let (key, call) = (&self.target.key, Call::Cancel(token));
        let sent = script::invoke(
            &mut connection,
            key,
            &call,
            self.target.rate,
            &self.target.script_args,
        );
        match tokio::time::timeout(self.backend.response_timeout, sent).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(key = %key, error = %e, "a give-back failed"),
            Err(_) => tracing::debug!(key = %key, "a give-back timed out"),
        }
    }
}

/// One call of the script on `target`'s key, bounded by the response
/// timeout. A failure that is an outage degrades the backend (its probe
/// then runs on that key); a round trip abandoned by the timeout is awaited
/// in the background and a reservation it made given back.
pub(crate) async fn send(
    backend: &Arc<Backend>,
    target: &ProbeTarget,
    call: Call,
) -> Result<Reply, Failure> {
    let Some(mut connection) = backend.connection() else {
        let failure = BackendError::new(
            format!("no connection to {}", backend.target.describe()),
            None,
        );
        backend.degrade(&failure, target.clone(), Scope::Backend);
        return Err(Failure::Down(Some(failure)));
    };
    let canceller = matches!(call, Call::Reserve { .. }).then(|| Canceller {
        backend: Arc::clone(backend),
        target: target.clone(),
    });
    let (key, script_args, rate) = (
        Arc::clone(&target.key),
        Arc::clone(&target.script_args),
        target.rate,
    );
    let mut in_flight = InFlight {
        round_trip: Some(Box::pin(async move {
            script::invoke(&mut connection, &key, &call, rate, &script_args).await
        })),
        canceller,
    };
    let failure = match tokio::time::timeout(backend.response_timeout, in_flight.reply()).await {
        Ok(Ok(reply)) => return Ok(reply),
        Ok(Err(e)) if script::is_data_error(&e) => {
            return Err(Failure::Refused(Error::Backend(BackendError::new(
                format!("Redis refused the call on key {}", target.key),
                Some(Box::new(e)),
            ))));
        }
        Ok(Err(e)) => {
            let timed_out = e.is_timeout();
            BackendError::new(
                format!("Redis failed the call on key {}", target.key),
                Some(Box::new(e)),
            )
            .with_timeout(timed_out)
        }
        Err(_) => BackendError::timeout(format!(
            "Redis did not answer within {:?} (key {})",
            backend.response_timeout, target.key
        )),
    };
    // A timed-out round trip is dropped here: its reply is awaited in the
    // background and its reservation given back.
    drop(in_flight);
    backend.degrade(&failure, target.clone(), Scope::Key);
    Err(Failure::Down(Some(failure)))
}

/// A round trip in flight. If it is dropped before its reply (the caller's
/// future was dropped, or the response timeout passed), the reply is still
/// awaited in the background, and a reservation it carries is given back.
struct InFlight {
    round_trip: Option<RoundTrip>,
    canceller: Option<Canceller>,
}

impl InFlight {
    /// Awaits the reply (for as long as the caller does).
    async fn reply(&mut self) -> RedisResult<Reply> {
        let round_trip = self
            .round_trip
            .as_mut()
            .expect("a round trip is awaited once");
        let reply = round_trip.await;
        self.round_trip = None;
        reply
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let (Some(round_trip), Some(canceller)) = (self.round_trip.take(), self.canceller.take())
        else {
            return;
        };
        let backend = Arc::clone(&canceller.backend);
        backend.spawn(async move {
            if let Ok(Ok(Reply {
                token: Some(token), ..
            })) = tokio::time::timeout(ORPHAN_WAIT, round_trip).await
            {
                canceller.cancel(token).await;
            }
        });
    }
}

impl<C: Clock> Inner<C> {
    fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }

    fn canceller(&self) -> Canceller {
        Canceller {
            backend: Arc::clone(&self.backend),
            target: self.probe_target(),
        }
    }

    /// Where the backend's probe runs the script after this limiter's call
    /// failed: its own key.
    fn probe_target(&self) -> ProbeTarget {
        ProbeTarget {
            key: Arc::clone(&self.key),
            script_args: Arc::clone(&self.script_args),
            rate: self.rate(),
        }
    }

    /// One call to Redis, bounded by the response timeout, unless the
    /// backend is degraded. The first call after this limiter served from
    /// its fallback first carries the fallback's debt into the key.
    async fn round_trip(&self, call: Call) -> Result<Reply, Failure> {
        if self.backend.health.is_down(self.zone) {
            return Err(Failure::Down(None));
        }
        if self.serving_locally.load(Ordering::Acquire) {
            self.leave_fallback().await?;
        }
        self.send(call).await
    }

    /// Back on Redis after serving from the fallback: one resume call with
    /// the debt the fallback ran up beyond what Redis knew (read now, just
    /// before it is sent). One caller sends it; concurrent ones go on to
    /// Redis at once (the resume adds to the key's ticket, so the order
    /// does not matter). If Redis fails again, the limiter stays on its
    /// fallback, which keeps its debt.
    async fn leave_fallback(&self) -> Result<(), Failure> {
        if self
            .serving_locally
            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(());
        }
        let Some(resume) = self.recovery_call() else {
            return Ok(());
        };
        match self.send(resume).await {
            // A key that holds foreign data: the call itself reports it.
            Ok(_) | Err(Failure::Refused(_)) => Ok(()),
            Err(down) => {
                self.serving_locally.store(true, Ordering::Release);
                Err(down)
            }
        }
    }

    /// Serving from the fallback (once per switch): the local fallback
    /// starts with no stored permits and the debt Redis last reported.
    ///
    /// The flag is raised only once the fallback has restarted, under a
    /// lock: a concurrent caller that saw it raised earlier would reserve
    /// from the fallback, and the restart would then erase that
    /// reservation.
    fn enter_fallback(&self) {
        self.backend.health.count_fallback_call();
        if self.serving_locally.load(Ordering::Acquire) {
            return;
        }
        let _opening = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
        if self.serving_locally.load(Ordering::Acquire) {
            return;
        }
        let now = self.local.clock().now_micros();
        let opened_until = now.max(self.debt_until.load(Ordering::Relaxed));
        self.opened_until.store(opened_until, Ordering::Relaxed);
        self.local.restart_from(opened_until);
        self.serving_locally.store(true, Ordering::Release);
    }

    /// One call to Redis for this limiter's key (see [`send`]), noting the
    /// debt it reports.
    async fn send(&self, call: Call) -> Result<Reply, Failure> {
        let reply = send(&self.backend, &self.probe_target(), call).await?;
        self.note_debt(reply.debt_micros);
        Ok(reply)
    }

    /// Remembers when the debt Redis reported ends, on the local clock.
    fn note_debt(&self, debt_micros: u64) {
        let until = self.local.clock().now_micros().saturating_add(debt_micros);
        self.debt_until.store(until, Ordering::Relaxed);
    }

    /// Reserves through Redis, or through the fallback while Redis is down.
    /// `held`: the caller may give the reservation back (see
    /// [`Call::Reserve`]).
    async fn reserve(
        &self,
        permits: u32,
        timeout: Option<Duration>,
        held: bool,
    ) -> Result<Option<Reservation<'_>>, Error> {
        check_permits(permits)?;
        let call = Call::Reserve {
            permits,
            timeout,
            held,
        };
        match self.round_trip(call).await {
            Ok(reply) => Ok(reply.wait.map(|wait| {
                let pending = match reply.token {
                    Some(token) if !wait.is_zero() => Some(Pending {
                        owner: self as &dyn GiveBackTo,
                        taken: Taken::Redis(token),
                    }),
                    _ => None,
                };
                Reservation::new(wait, self.local.clock(), pending)
            })),
            Err(Failure::Refused(error)) => Err(error),
            Err(Failure::Down(failure)) => {
                self.enter_fallback();
                match self.fallback {
                    Fallback::Local => match timeout {
                        None => self.local.reservation(permits).map(Some),
                        Some(timeout) => self.local.try_reservation(permits, timeout),
                    },
                    Fallback::FailOpen => Ok(Some(Reservation::new(
                        Duration::ZERO,
                        self.local.clock(),
                        None,
                    ))),
                    Fallback::FailClosed => Err(self.closed_error(failure)),
                }
            }
        }
    }

    /// The current wait, from Redis or the fallback.
    async fn query(&self) -> Result<Duration, Error> {
        match self.round_trip(Call::Query).await {
            Ok(reply) => Ok(reply.wait.unwrap_or_default()),
            Err(Failure::Refused(error)) => Err(error),
            Err(Failure::Down(failure)) => {
                self.enter_fallback();
                match self.fallback {
                    Fallback::Local => Ok(self.local.available_in()),
                    Fallback::FailOpen => Ok(Duration::ZERO),
                    Fallback::FailClosed => Err(self.closed_error(failure)),
                }
            }
        }
    }

    fn closed_error(&self, failure: Option<BackendError>) -> Error {
        Error::Backend(failure.unwrap_or_else(|| {
            BackendError::new(
                format!(
                    "Redis is unavailable and the limiter fails closed (key {}; last error: {})",
                    self.key,
                    self.backend.health.last_error()
                ),
                None,
            )
        }))
    }

    /// What a recovery tells the script after the probe: after serving
    /// locally, resume (no burst, and the debt the fallback ran up on top
    /// of what Redis already knew); after refusing everything, nothing.
    ///
    /// The script adds that debt to the key's ticket rather than raising
    /// the ticket to it, so the order in which the resume and the
    /// give-backs of late replies reach Redis does not matter: a late
    /// reservation's charge is in the ticket until its give-back takes it
    /// out, and the fallback's grants stay in either way.
    fn recovery_call(&self) -> Option<Call> {
        match self.fallback {
            Fallback::FailClosed => None,
            Fallback::Local | Fallback::FailOpen => {
                let now = self.local.clock().now_micros();
                let local_until = now.saturating_add(micros(self.local.available_in()));
                let known_until = now.max(self.opened_until.load(Ordering::Relaxed));
                // Time at the local rate, which is local_fraction of the
                // shared one: the same permits take that share of the time
                // in Redis.
                let granted = local_until.saturating_sub(known_until);
                Some(Call::Resume {
                    debt_micros: (granted as f64 * self.local_fraction) as u64,
                })
            }
        }
    }
}

impl<C: Clock> GiveBackTo for Inner<C> {
    fn give_back(&self, taken: Taken) {
        match taken {
            Taken::Redis(token) => {
                let canceller = self.canceller();
                self.backend.spawn(canceller.cancel(token));
            }
            other => self.local.give_back(other),
        }
    }

    fn keep(&self, taken: Taken) {
        // A reservation of the local fallback: its ledger forgets it.
        if !matches!(taken, Taken::Redis(_)) {
            GiveBackTo::keep(&self.local, taken);
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
    ///
    /// Build the client with a connection timeout below the limiter's
    /// [`response_timeout`](RedisBuilder::response_timeout)
    /// (`ClusterClientBuilder::connection_timeout`; the client's default is
    /// 1 s): a cluster connection that reconnects to a node which accepts
    /// connections but does not answer (a hung process) holds every request
    /// until it gives up on that node, which would keep the limiter on its
    /// fallback on every node.
    pub fn cluster_builder(client: ClusterClient, name: &str) -> RedisBuilder<SystemClock> {
        RedisBuilder::cluster(client, name)
    }
}

/// # Reserving and waiting
///
/// ## Cancel safety
///
/// Every async method here is cancel-safe. A round trip whose future is
/// dropped still runs in Redis (the command was sent): its reply is awaited
/// in the background (up to 30 s) and a reservation it made is given back
/// as soon as it arrives, as it is when a round trip outlives the response
/// timeout and the fallback serves the call instead. A reservation dropped
/// before its wait has passed is given back by one call to the same script,
/// sent in the background. When a give-back cannot be delivered (Redis down,
/// or a reply later than 30 s), the reservation stays charged: the limiter
/// errs towards limiting, never towards granting twice.
///
/// A give-back is exact, as in-process: the script keeps a
/// [`Ledger`](crate::core::Ledger) in the key's value while reservations
/// that may be given back wait on the key (those of
/// [`reservation`](Self::reservation), [`acquire`](Self::acquire) and the
/// `try_` forms of both), so however many are given back, in whatever
/// order, nobody is scheduled before a limiter that never made them would
/// schedule them, and with no more than
/// [`Ledger::SHARED_CAPACITY`](crate::core::Ledger::SHARED_CAPACITY) (64)
/// waiting at once the key ends where that limiter would. Beyond that, a
/// rate change, or a give-back that reaches Redis after the reservation's
/// moment, it errs towards limiting. [`reserve`](Self::reserve) and
/// [`try_reserve`](Self::try_reserve) hand out a wait, not a handle, so
/// their reservations take no place in the ledger (a key used only through
/// them keeps none and pays nothing for it); if such a round trip is
/// abandoned, its give-back is exact while it is the key's latest change,
/// and otherwise returns only what the ledger knows lies before it, erring
/// towards limiting. A reservation whose wait runs to its
/// end stays in the ledger until its moment has passed;
/// [`Reservation::commit`](crate::Reservation::commit) sends nothing.
impl<C: Clock> RedisRateLimiter<C> {
    pub(crate) fn from_arc(inner: Arc<Inner<C>>) -> Self {
        RedisRateLimiter { inner }
    }

    /// The first attempt to reach Redis: a fresh connection and the
    /// script's probe on this limiter's key. On failure the limiter starts
    /// degraded (or, when `require` is set, building fails).
    pub(crate) async fn start(&self, require: bool) -> Result<(), Error> {
        let target = self.inner.probe_target();
        self.inner.backend.start(require, target).await
    }

    /// Reserves `permits` and returns the wait before they may be used.
    /// Does not sleep. The permits are the caller's: nothing gives them back
    /// (see [`reservation`](Self::reservation)).
    ///
    /// # Cancel safety
    /// Cancel-safe: see the [section above](#cancel-safety).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; [`Error::Backend`] if
    /// Redis fails and the fallback is [`Fallback::FailClosed`], or the key
    /// holds something else.
    pub async fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        let reserved = self.inner.reserve(permits, None, false).await?;
        Ok(reserved.map_or(Duration::ZERO, Reservation::commit))
    }

    /// Reserves `permits` if the wait fits in `timeout` and returns it;
    /// `None`, reserving nothing, otherwise. Does not sleep.
    ///
    /// # Cancel safety
    /// Cancel-safe: see the [section above](#cancel-safety).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        let reserved = self.inner.reserve(permits, Some(timeout), false).await?;
        Ok(reserved.map(Reservation::commit))
    }

    /// Reserves `permits` as a [`Reservation`]: wait for it, or drop it to
    /// give the permits back.
    ///
    /// # Cancel safety
    /// Cancel-safe: see the [section above](#cancel-safety).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn reservation(&self, permits: u32) -> Result<Reservation<'_>, Error> {
        let reserved = self.inner.reserve(permits, None, true).await?;
        Ok(reserved
            .unwrap_or_else(|| Reservation::new(Duration::ZERO, self.inner.local.clock(), None)))
    }

    /// [`reservation`](Self::reservation) if the permits can be used within
    /// `timeout`; `None`, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    /// Cancel-safe: see the [section above](#cancel-safety).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        self.inner.reserve(permits, Some(timeout), true).await
    }

    /// Reserves `permits` and sleeps for the wait; returns the time slept.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future gives back what it had taken (see
    /// the [section above](#cancel-safety)), so
    /// `tokio::time::timeout(d, limiter.acquire(n))` bounds a wait correctly.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn acquire(&self, permits: u32) -> Result<Duration, Error> {
        Ok(self.reservation(permits).await?.wait().await)
    }

    /// Acquires `permits` if the wait fits in `timeout`, sleeping for it;
    /// returns `false` at once, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn try_acquire(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        Ok(
            crate::reservation::wait_if_granted(self.try_reservation(permits, timeout).await?)
                .await,
        )
    }

    /// How long a request made now would wait; reserves nothing.
    ///
    /// # Cancel safety
    /// Cancel-safe: it changes nothing.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve), but never for the arguments.
    pub async fn available_in(&self) -> Result<Duration, Error> {
        self.inner.query().await
    }
}

/// # Blocking
///
/// For threads that are not async tasks. The Redis call runs on the
/// limiter's runtime (its own if built with
/// [`build_blocking`](RedisBuilder::build_blocking)) and the calling thread
/// sleeps for the wait. They work from a plain thread, from
/// `spawn_blocking`, and from a task of a multi-thread Tokio runtime (the
/// worker hands its other tasks to another thread while it blocks).
impl<C: Clock> RedisRateLimiter<C> {
    /// [`acquire`](Self::acquire) on the calling thread.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve); also [`Error::InvalidArgument`] when
    /// called on a thread of a current-thread Tokio runtime that the limiter
    /// runs on (it would stop that runtime): use `acquire().await` there.
    pub fn acquire_blocking(&self, permits: u32) -> Result<Duration, Error> {
        check_permits(permits)?;
        let wait =
            self.run_blocking(move |limiter| async move { limiter.reserve(permits).await })?;
        self.sleep_blocking(wait);
        Ok(wait)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Self::acquire_blocking).
    pub fn try_acquire_blocking(&self, permits: u32, timeout: Duration) -> Result<bool, Error> {
        check_permits(permits)?;
        let wait = self.run_blocking(move |limiter| async move {
            limiter.try_reserve(permits, timeout).await
        })?;
        Ok(wait.map(|wait| self.sleep_blocking(wait)).is_some())
    }

    /// Runs one call on the limiter's runtime while this thread blocks.
    fn run_blocking<T, F>(&self, call: impl FnOnce(RedisRateLimiter<C>) -> F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let limiter = RedisRateLimiter::from_arc(Arc::clone(&self.inner));
        self.inner.backend.block_on(call(limiter))?
    }

    fn sleep_blocking(&self, wait: Duration) {
        if !wait.is_zero() {
            blocking_section(|| self.inner.local.clock().sleep_blocking(wait));
        }
    }
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
        self.inner.backend.health.is_down(self.inner.zone)
    }

    /// Health counters: fallbacks, recoveries, calls served by the
    /// fallback. They are the backend's: a limiter sharing a
    /// [`RedisBackend`](super::RedisBackend) sees the counts of all its
    /// limiters. `degraded` is this limiter's, as [`is_degraded`](Self::is_degraded).
    pub fn stats(&self) -> RedisStats {
        RedisStats {
            degraded: self.is_degraded(),
            ..self.inner.backend.health.stats()
        }
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

    async fn reservation(&self, permits: u32) -> Result<Reservation<'_>, Error> {
        RedisRateLimiter::<C>::reservation(self, permits).await
    }

    async fn try_reservation(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        RedisRateLimiter::<C>::try_reservation(self, permits, timeout).await
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
