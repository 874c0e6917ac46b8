//! [`KeyedRedisRateLimiter`]: one rate per key, shared through Redis.

use std::any::Any;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;

use super::Fallback;
use super::backend::{Backend, ProbeTarget, blocking_section};
use super::builder::{KEY_PREFIX, check_limiter, fallback_setters};
use super::fallback::RedisStats;
use super::limiter::{Canceller, Failure, local_rate, send};
use super::script::{Call, ScriptArgs, Token};
use crate::builder::{PolicyConfig, policy_setters};
use crate::clock::{Clock, SystemClock};
use crate::core::{State, stable_interval_micros};
use crate::error::check_permits;
use crate::keyed::Mode;
use crate::reservation::{GiveBackTo, Pending, Taken};
use crate::{Error, KeyedLimiter, KeyedRateLimiter, Reservation};

/// The default [`max_local_keys`](RedisKeyedBuilder::max_local_keys).
pub const DEFAULT_MAX_LOCAL_KEYS: usize = 100_000;

/// One rate per key (user, tenant, API key), shared by every process that
/// uses the same name, through a [`RedisBackend`](super::RedisBackend).
///
/// Each key is its own Redis key, `throttler:{name}:{key}` (the name and the
/// key's `Display` form), so a cluster spreads the keys over its slots. (A
/// key whose text contains `{...}` puts the braces' content in charge of
/// the slot, as for any Redis key: such keys land together.) Each key runs
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
/// a [`KeyedRateLimiter`] in this process, at the rate times
/// `local_fraction`, holding at most
/// [`max_local_keys`](RedisKeyedBuilder::max_local_keys) keys. A key opens
/// there with nothing stored (no burst) and with the debt Redis last
/// reported for it, so a saturated key stays saturated. Once Redis is back, the first call
/// carries what the fallback granted its key into that key's Redis key
/// (added to its ticket; only what lies beyond the debt Redis had
/// reported), and starts a background task that does the same
/// for every other key the fallback holds (64 at a time), so keys that are
/// not called again still hand their debt over; the fallback then forgets
/// them.
///
/// ```no_run
/// use std::time::Duration;
/// use throttler::redis::RedisBackend;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::builder(redis::Client::open("redis://127.0.0.1:6379/")?)
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
    inner: Arc<KeyedInner<K, C>>,
}

struct KeyedInner<K, C: Clock> {
    backend: Arc<Backend>,
    /// `throttler:{name}:`
    prefix: String,
    script_args: Arc<ScriptArgs>,
    rate_bits: AtomicU64,
    fallback: Fallback,
    /// The local fallback: keys open empty, and an entry records what its
    /// key was granted locally until Redis hears of it.
    local: KeyedRateLimiter<K, C>,
    local_fraction: f64,
    /// Whether any key has been served locally since the fallback last
    /// held nothing (so a call on Redis must look for a debt to carry).
    served_locally: AtomicBool,
    /// Whether a background task is carrying the fallback's other keys back.
    carrying: AtomicBool,
    /// The backend's count of zones come back when the fallback's keys
    /// were last carried back: a new carry-back waits for a new recovery.
    carried_at: AtomicU64,
    /// When the debt Redis last reported for a key ends (µs, local clock),
    /// for keys that owed something: a key the fallback opens starts from
    /// there, and only what it grants beyond it goes back to Redis. At most
    /// `max_local_keys` entries.
    debts: Mutex<HashMap<K, u64>>,
    max_local_keys: usize,
    /// This limiter, for that task.
    this: Weak<KeyedInner<K, C>>,
}

/// A reservation of one key made in Redis: its Redis key and the script's
/// record.
struct RedisKeyTaken {
    key: Arc<str>,
    token: Token,
}

/// Builds a [`KeyedRedisRateLimiter`]; see
/// [`RedisBackend::keyed_limiter`](super::RedisBackend::keyed_limiter).
#[must_use = "a builder does nothing until .build() is called"]
pub struct RedisKeyedBuilder<K, C = SystemClock> {
    pub(crate) backend: Arc<Backend>,
    pub(crate) name: String,
    pub(crate) config: PolicyConfig,
    pub(crate) fallback: Fallback,
    pub(crate) local_fraction: f64,
    pub(crate) max_local_keys: usize,
    pub(crate) clock: C,
    pub(crate) key: std::marker::PhantomData<fn(K)>,
}

impl<K, C: Clock + Clone> RedisKeyedBuilder<K, C> {
    policy_setters!();
    fallback_setters!();

    /// The most keys the local fallback holds at once (least recently
    /// used first out). Default [`DEFAULT_MAX_LOCAL_KEYS`]; at least 1.
    pub fn max_local_keys(mut self, max_local_keys: usize) -> Self {
        self.max_local_keys = max_local_keys;
        self
    }

    /// The clock waits are slept on (Redis's clock decides the waits).
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> RedisKeyedBuilder<K, C2> {
        RedisKeyedBuilder {
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
        let (policy, rate) = self.config.policy()?;
        let local = KeyedRateLimiter::from_parts(
            State::new(policy.clone(), local_rate(rate, self.local_fraction), 0)?,
            self.clock,
            Some(self.max_local_keys),
            Mode::Empty,
        );
        Ok(KeyedRedisRateLimiter {
            inner: Arc::new_cyclic(|this| KeyedInner {
                backend: self.backend,
                prefix: format!("{KEY_PREFIX}{}:", self.name),
                script_args: Arc::new(ScriptArgs::new(&policy, rate)),
                rate_bits: AtomicU64::new(rate.to_bits()),
                fallback: self.fallback,
                local,
                local_fraction: self.local_fraction,
                served_locally: AtomicBool::new(false),
                carrying: AtomicBool::new(false),
                carried_at: AtomicU64::new(0),
                debts: Mutex::new(HashMap::new()),
                max_local_keys: self.max_local_keys,
                this: this.clone(),
            }),
        })
    }
}

impl<K, C: fmt::Debug> fmt::Debug for RedisKeyedBuilder<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisKeyedBuilder")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("fallback", &self.fallback)
            .field("max_local_keys", &self.max_local_keys)
            .finish_non_exhaustive()
    }
}

impl<K, C> KeyedInner<K, C>
where
    K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }

    /// The Redis key of `key`, and what the script needs with it.
    fn target<Q: Display + ?Sized>(&self, key: &Q) -> ProbeTarget {
        ProbeTarget {
            key: format!("{}{key}", self.prefix).into(),
            script_args: Arc::clone(&self.script_args),
            rate: self.rate(),
        }
    }

    /// One call for `key` on Redis, unless the backend is degraded. The
    /// first call on a key the fallback served first carries the debt it
    /// ran up there into the Redis key.
    async fn round_trip<Q>(
        &self,
        key: &Q,
        target: &ProbeTarget,
        call: Call,
    ) -> Result<super::script::Reply, Failure>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.backend.health.is_down_key(&target.key) {
            return Err(Failure::Down(None));
        }
        if self.served_locally.load(Ordering::Acquire) {
            self.leave_fallback(key, target).await?;
        }
        send(&self.backend, target, call).await
    }

    /// Carries `key`'s local debt into Redis (one resume call), if the
    /// fallback holds the key. If Redis fails meanwhile, the key goes back
    /// to the fallback with its debt.
    async fn leave_fallback<Q>(&self, key: &Q, target: &ProbeTarget) -> Result<(), Failure>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.local.is_empty() {
            self.served_locally.store(false, Ordering::Release);
            return Ok(());
        }
        // The other keys the fallback served go back in the background,
        // whether or not they are called again.
        self.carry_back_the_rest();
        let Some(debt) = self.local.take_debt(key) else {
            return Ok(());
        };
        // Time at the local rate: the same permits take local_fraction of
        // it at the shared rate.
        let resume = Call::Resume {
            debt_micros: (self.unknown_part(key, debt) as f64 * self.local_fraction) as u64,
        };
        match send(&self.backend, target, resume).await {
            Ok(_) | Err(Failure::Refused(_)) => Ok(()),
            Err(down) => {
                self.local.open(key, debt);
                Err(down)
            }
        }
    }

    /// Remembers how long `key` owes after a Redis reply (or forgets it).
    fn note_debt<Q>(&self, key: &Q, debt_micros: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut debts = self.debts.lock().unwrap_or_else(PoisonError::into_inner);
        if debt_micros == 0 {
            if !debts.is_empty() {
                debts.remove(key);
            }
            return;
        }
        let now = self.local.clock().now_micros();
        let until = now.saturating_add(debt_micros);
        if let Some(known) = debts.get_mut(key) {
            *known = until;
            return;
        }
        if debts.len() >= self.max_local_keys {
            debts.retain(|_, until| *until > now);
            if debts.len() >= self.max_local_keys {
                return;
            }
        }
        debts.insert(key.to_owned(), until);
    }

    /// How much of `debt_micros`, a key's local debt, Redis does not know
    /// of: what lies beyond the debt it last reported for the key (which is
    /// forgotten).
    fn unknown_part<Q>(&self, key: &Q, debt_micros: u64) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.local.clock().now_micros();
        let known = self
            .debts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
            .map_or(0, |until| until.saturating_sub(now));
        debt_micros.saturating_sub(known)
    }

    /// Carries every key the fallback holds back to Redis (one resume per
    /// key, 64 in flight), once: a key whose part of the backend is still
    /// down (its cluster node), or whose resume finds Redis down again,
    /// stays with the fallback, with its debt. While a part is down, the
    /// next carry-back waits for a part to come back.
    fn carry_back_the_rest(&self) {
        let recoveries = self.backend.health.zone_recoveries();
        if (self.backend.health.any_down() && self.carried_at.load(Ordering::Acquire) == recoveries)
            || self.carrying.swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.carried_at.store(recoveries, Ordering::Release);
        let this = self.this.clone();
        self.backend.spawn(async move {
            let Some(inner) = this.upgrade() else {
                return;
            };
            let debts = inner.local.drain_debts();
            futures::stream::iter(debts)
                .for_each_concurrent(64, |(key, debt)| {
                    let inner = &inner;
                    async move {
                        let target = inner.target(&key);
                        if inner.backend.health.is_down_key(&target.key) {
                            inner.local.open(&key, debt);
                            inner.served_locally.store(true, Ordering::Release);
                            return;
                        }
                        let unknown = inner.unknown_part(&key, debt);
                        if unknown == 0 {
                            return;
                        }
                        let resume = Call::Resume {
                            debt_micros: (unknown as f64 * inner.local_fraction) as u64,
                        };
                        if let Err(Failure::Down(_)) = send(&inner.backend, &target, resume).await {
                            inner.local.open(&key, debt);
                            inner.served_locally.store(true, Ordering::Release);
                        }
                    }
                })
                .await;
            inner.carrying.store(false, Ordering::Release);
        });
    }

    /// The fallback is about to serve `key`: it opens with nothing stored.
    fn enter_fallback<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.backend.health.count_fallback_call();
        self.served_locally.store(true, Ordering::Release);
        if self.fallback == Fallback::Local {
            // The key opens with the debt Redis last reported for it.
            let now = self.local.clock().now_micros();
            let known = self
                .debts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(key)
                .map_or(0, |until| until.saturating_sub(now));
            self.local.open(key, known);
        }
    }

    fn closed_error(&self, failure: Option<crate::BackendError>) -> Error {
        Error::Backend(failure.unwrap_or_else(|| {
            crate::BackendError::new(
                format!(
                    "Redis is unavailable and the limiter fails closed (keys {}*; last error: {})",
                    self.prefix,
                    self.backend.health.last_error()
                ),
                None,
            )
        }))
    }

    /// Reserves `permits` of `key` through Redis, or through the fallback
    /// while Redis is down.
    /// `held`: the caller may give the reservation back (see
    /// [`Call::Reserve`]).
    async fn reserve<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
        held: bool,
    ) -> Result<Option<Reservation<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        check_permits(permits)?;
        let target = self.target(key);
        let call = Call::Reserve {
            permits,
            timeout,
            held,
        };
        match self.round_trip(key, &target, call).await {
            Ok(reply) => {
                self.note_debt(key, reply.debt_micros);
                Ok(reply.wait.map(|wait| {
                    let pending = match reply.token {
                        Some(token) if !wait.is_zero() => Some(Pending {
                            owner: self as &dyn GiveBackTo,
                            taken: Taken::Keyed(Box::new(RedisKeyTaken {
                                key: Arc::clone(&target.key),
                                token,
                            })),
                        }),
                        _ => None,
                    };
                    Reservation::new(wait, self.local.clock(), pending)
                }))
            }
            Err(Failure::Refused(error)) => Err(error),
            Err(Failure::Down(failure)) => {
                self.enter_fallback(key);
                match self.fallback {
                    Fallback::Local => match timeout {
                        None => self.local.reservation(key, permits).map(Some),
                        Some(timeout) => self.local.try_reservation(key, permits, timeout),
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

    /// The current wait of `key`, from Redis or the fallback.
    async fn query<Q>(&self, key: &Q) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let target = self.target(key);
        match self.round_trip(key, &target, Call::Query).await {
            Ok(reply) => {
                self.note_debt(key, reply.debt_micros);
                Ok(reply.wait.unwrap_or_default())
            }
            Err(Failure::Refused(error)) => Err(error),
            Err(Failure::Down(failure)) => {
                self.backend.health.count_fallback_call();
                match self.fallback {
                    Fallback::Local => Ok(self.local.available_in(key)),
                    Fallback::FailOpen => Ok(Duration::ZERO),
                    Fallback::FailClosed => Err(self.closed_error(failure)),
                }
            }
        }
    }
}

impl<K, C> GiveBackTo for KeyedInner<K, C>
where
    K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn give_back(&self, taken: Taken) {
        let Taken::Keyed(taken) = taken else {
            return;
        };
        match (taken as Box<dyn Any + Send + Sync>).downcast::<RedisKeyTaken>() {
            Ok(taken) => {
                let canceller = Canceller {
                    backend: Arc::clone(&self.backend),
                    target: ProbeTarget {
                        key: taken.key,
                        script_args: Arc::clone(&self.script_args),
                        rate: self.rate(),
                    },
                };
                self.backend.spawn(canceller.cancel(taken.token));
            }
            // The local fallback's own reservation.
            Err(local) => GiveBackTo::give_back(&self.local, Taken::Keyed(local)),
        }
    }

    fn keep(&self, taken: Taken) {
        let Taken::Keyed(taken) = taken else {
            return;
        };
        // A reservation of the local fallback: its ledger forgets it.
        if let Err(local) = (taken as Box<dyn Any + Send + Sync>).downcast::<RedisKeyTaken>() {
            GiveBackTo::keep(&self.local, Taken::Keyed(local));
        }
    }
}

/// # Reserving and waiting
///
/// ## Cancel safety
///
/// Every async method here is cancel-safe, as those of
/// [`RedisRateLimiter`](super::RedisRateLimiter): a round trip whose future
/// is dropped is awaited in the background and a reservation it made is
/// given back as soon as its reply arrives; a reservation dropped before
/// its wait has passed is given back by one call to the script, sent in the
/// background. A give-back that cannot be delivered leaves the reservation
/// charged: the limiter errs towards limiting.
impl<K, C> KeyedRedisRateLimiter<K, C>
where
    K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// Reserves `permits` of `key` and returns the wait; does not sleep.
    ///
    /// # Cancel safety
    /// Cancel-safe: see the [section above](#cancel-safety).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `permits` is 0; [`Error::Backend`] if
    /// Redis fails and the fallback is [`Fallback::FailClosed`], or the key
    /// holds something else.
    pub async fn reserve<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let reserved = self.inner.reserve(key, permits, None, false).await?;
        Ok(reserved.map_or(Duration::ZERO, Reservation::commit))
    }

    /// Reserves `permits` of `key` if the wait fits in `timeout`; `None`,
    /// reserving nothing, otherwise.
    ///
    /// # Cancel safety
    /// Cancel-safe: see the [section above](#cancel-safety).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn try_reserve<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let reserved = self
            .inner
            .reserve(key, permits, Some(timeout), false)
            .await?;
        Ok(reserved.map(Reservation::commit))
    }

    /// Reserves `permits` of `key` as a [`Reservation`]: wait for it, or
    /// drop it to give the permits back.
    ///
    /// # Cancel safety
    /// Cancel-safe: see the [section above](#cancel-safety).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn reservation<Q>(&self, key: &Q, permits: u32) -> Result<Reservation<'_>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let reservation = self.inner.reserve(key, permits, None, true).await?;
        Ok(reservation.expect("a plain reservation is always granted"))
    }

    /// [`reservation`](Self::reservation) if the permits can be used within
    /// `timeout`; `None`, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    /// Cancel-safe: see the [section above](#cancel-safety).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn try_reservation<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.reserve(key, permits, Some(timeout), true).await
    }

    /// Reserves `permits` of `key` and sleeps for the wait.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future before the wait has passed gives the
    /// permits back (see the [section above](#cancel-safety)).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn acquire<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        Ok(self.reservation(key, permits).await?.wait().await)
    }

    /// Acquires `permits` of `key` if the wait fits in `timeout`, sleeping
    /// for it; `false` at once, reserving nothing, otherwise.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn try_acquire<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        Ok(
            crate::reservation::wait_if_granted(self.try_reservation(key, permits, timeout).await?)
                .await,
        )
    }

    /// How long a request of `key` made now would wait; reserves nothing.
    ///
    /// # Cancel safety
    /// Cancel-safe: it changes nothing.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn available_in<Q>(&self, key: &Q) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.query(key).await
    }

    /// [`acquire`](Self::acquire) on the calling thread (see
    /// [`RedisRateLimiter::acquire_blocking`](super::RedisRateLimiter::acquire_blocking)).
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve); [`Error::InvalidArgument`] on a thread
    /// of a current-thread runtime the backend runs on.
    pub fn acquire_blocking<Q>(&self, key: &Q, permits: u32) -> Result<Duration, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (inner, key) = (Arc::clone(&self.inner), key.to_owned());
        let wait = self.inner.backend.block_on(async move {
            let limiter = KeyedRedisRateLimiter { inner };
            limiter.reserve::<K>(&key, permits).await
        })??;
        self.sleep_blocking(wait);
        Ok(wait)
    }

    /// [`try_acquire`](Self::try_acquire) on the calling thread.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Self::acquire_blocking).
    pub fn try_acquire_blocking<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Duration,
    ) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (inner, key) = (Arc::clone(&self.inner), key.to_owned());
        let wait = self.inner.backend.block_on(async move {
            let limiter = KeyedRedisRateLimiter { inner };
            limiter.try_reserve::<K>(&key, permits, timeout).await
        })??;
        match wait {
            Some(wait) => {
                self.sleep_blocking(wait);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn sleep_blocking(&self, wait: Duration) {
        if !wait.is_zero() {
            blocking_section(|| self.inner.local.clock().sleep_blocking(wait));
        }
    }
}

/// # Rate and health
impl<K, C> KeyedRedisRateLimiter<K, C>
where
    K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// Changes the rate of every key from now on (each key's next call
    /// carries it to Redis).
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

    /// The stable rate of every key, in permits per second.
    pub fn rate(&self) -> f64 {
        self.inner.rate()
    }

    /// The clock waits are slept on.
    pub fn clock(&self) -> &C {
        self.inner.local.clock()
    }

    /// Whether calls are being served by the fallback now, for some keys at
    /// least (the backend is degraded; on a cluster, a node is down).
    pub fn is_degraded(&self) -> bool {
        self.inner.backend.health.any_down()
    }

    /// The backend's health counters.
    pub fn stats(&self) -> RedisStats {
        self.inner.backend.health.stats()
    }

    /// The keys the local fallback holds now (served locally, not yet
    /// carried back to Redis): at most `max_local_keys`.
    pub fn local_len(&self) -> usize {
        self.inner.local.len()
    }

    /// The Redis key of `key`: `throttler:{name}:{key}`.
    pub fn redis_key<Q: Display + ?Sized>(&self, key: &Q) -> String {
        format!("{}{key}", self.inner.prefix)
    }
}

#[async_trait]
impl<K, C> KeyedLimiter<K> for KeyedRedisRateLimiter<K, C>
where
    K: Display + Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    async fn reserve(&self, key: &K, permits: u32) -> Result<Duration, Error> {
        KeyedRedisRateLimiter::reserve(self, key, permits).await
    }

    async fn try_reserve(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        KeyedRedisRateLimiter::try_reserve(self, key, permits, timeout).await
    }

    async fn reservation(&self, key: &K, permits: u32) -> Result<Reservation<'_>, Error> {
        KeyedRedisRateLimiter::reservation(self, key, permits).await
    }

    async fn try_reservation(
        &self,
        key: &K,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Reservation<'_>>, Error> {
        KeyedRedisRateLimiter::try_reservation(self, key, permits, timeout).await
    }

    async fn available_in(&self, key: &K) -> Result<Duration, Error> {
        KeyedRedisRateLimiter::available_in(self, key).await
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        KeyedRedisRateLimiter::set_rate(self, permits_per_second)
    }

    fn rate(&self) -> f64 {
        KeyedRedisRateLimiter::rate(self)
    }

    fn clock(&self) -> &dyn Clock {
        self.inner.local.clock()
    }
}

impl<K, C: Clock> fmt::Debug for KeyedRedisRateLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRedisRateLimiter")
            .field("prefix", &self.inner.prefix)
            .field("fallback", &self.inner.fallback)
            .field("stats", &self.inner.backend.health.stats())
            .finish_non_exhaustive()
    }
}
