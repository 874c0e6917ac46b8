//! The [`Builder`]'s Redis options: [`redis`](Builder::redis) and what a
//! limiter shared through Redis does while Redis is down.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use super::failover::{Failover, Naming, Parts};
use super::health::hash_tag;
use super::leases::Slots;
use super::limiter::{Redis, Settings};
use super::{Fallback, RedisBackend, naming};
use crate::builder::{Builder, concurrency, limit_states};
use crate::clock::Clock;
use crate::error::invalid;
use crate::limiter::{Key, Local, NoKey, PerKey};
use crate::{Error, KeyedRateLimiter, RateLimiter};

/// The default response timeout of a [`RedisBackend`]: how long one call
/// waits for Redis before the fallback takes over.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(200);

/// The default probe interval of a [`RedisBackend`]: how often a degraded
/// backend tries Redis again.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The keys a keyed Redis limiter's fallback holds at most, unless
/// [`max_keys`](Builder::max_keys) says otherwise.
const DEFAULT_MAX_LOCAL_KEYS: usize = 100_000;

/// The most limits a Redis limiter holds: all of a key's live in one value,
/// which the script reads with one fixed layout.
pub(crate) const MAX_LIMITS: usize = 16;

/// # Shared through Redis (feature `redis`)
impl<K, C: Clock> Builder<K, Local, C> {
    /// Shares the limiter through Redis, on `backend` (which does the I/O:
    /// building the limiter does none), under `name`: every limiter of
    /// that name, in any process, shares one schedule, in the Redis key
    /// `paceline:v1:name` (see `redis_key`, and
    /// [Key names](crate::redis#running-redis-for-this) for a keyed one's).
    ///
    /// The rate and policy options are the same as in this process; what
    /// the limiter does while Redis is down is [`fallback`](Self::fallback)
    /// and [`local_fraction`](Self::local_fraction), and
    /// [`max_keys`](Builder::max_keys) caps the keys its fallback holds
    /// (100 000 by default for a keyed limiter).
    pub fn redis(self, backend: &RedisBackend, name: &str) -> Builder<K, Redis, C> {
        self.with_store(Settings {
            backend: Arc::clone(&backend.backend),
            name: name.to_owned(),
            fallback: Fallback::default(),
            local_fraction: 1.0,
            slot_ttl: super::DEFAULT_SLOT_TTL,
        })
    }
}

/// # Calls in flight through Redis
impl<K, C: Clock> Builder<K, Redis, C> {
    /// How long a slot of a
    /// [`Limit::concurrent`](crate::Limit::concurrent) lives in Redis
    /// unless its holder renews it (every third of this, while its call
    /// lasts): how long the slots of a process that died holding them stay
    /// taken. Default [`DEFAULT_SLOT_TTL`](super::DEFAULT_SLOT_TTL) (30 s); at least 10 ms and at
    /// most a year (building a limiter that has a `Limit::concurrent` with
    /// another is an [`Error::InvalidArgument`]; without one it is unused),
    /// and best well above the backend's response timeout.
    pub fn slot_ttl(mut self, ttl: Duration) -> Self {
        self.store_mut().slot_ttl = ttl;
        self
    }
}

/// # While Redis is down
impl<T, C: Clock> Builder<T, Redis, C> {
    /// What to do while Redis is unavailable. Default
    /// [`Fallback::Local`].
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.store_mut().fallback = fallback;
        self
    }

    /// With [`Fallback::Local`], the share of the rate this process allows
    /// itself while degraded: `1.0 / N` when N processes share the key, so
    /// that together they stay near the rate; a key that learned a lower
    /// rate from an upstream runs at this share of that one (at the slowest
    /// rate there is, 5e-324/s, where the share rounds to 0). Default 1.0;
    /// must be in `(0, 1]`, and a share below 1 with another fallback is
    /// refused when built (it would do nothing).
    pub fn local_fraction(mut self, local_fraction: f64) -> Self {
        self.store_mut().local_fraction = local_fraction;
        self
    }

    /// The slots for calls in flight the options describe, checked: on a
    /// cluster, a name with a `}` but no hash tag would put each key's
    /// slots in another slot than the key, whose outage the limiter would
    /// take for its key's.
    fn slots(&self) -> Result<Slots, Error> {
        let settings = self.store();
        let calls = concurrency(self.config())?;
        let name = &settings.name;
        let parted = name.contains('}') && hash_tag(name.as_bytes()).is_none();
        if calls.is_some() && parted && settings.backend.health.is_cluster() {
            return invalid(format!(
                "a limiter named {name:?} cannot hold calls in flight (Limit::concurrent) on a \
                 Redis Cluster: a '}}' with no hash tag puts its slots in another slot than its \
                 key; name it without the '}}', or with a hash tag ({{{name}}} is one)"
            ));
        }
        Slots::new(calls, settings.slot_ttl, settings.local_fraction)
    }

    /// The failover of a limiter named as `naming` says, holding at most
    /// `max_keys` keys in its fallback (`None`: one, and no cap may be set).
    fn failover<K>(
        mut self,
        naming: Naming,
        max_keys: Option<usize>,
    ) -> Result<Arc<Failover<K, C>>, Error>
    where
        K: Key + Display,
    {
        let (clock, _, cap) = self.parts()?;
        if cap.is_some() && max_keys.is_none() {
            return invalid(
                "max_keys caps the keys a keyed limiter's fallback holds, and a RateLimiter's \
                 holds one: remove it, or build a KeyedRateLimiter",
            );
        }
        let settings = self.store();
        if settings.name.is_empty() {
            return invalid("the limiter's name (its Redis key) must not be empty");
        }
        let local_fraction = settings.local_fraction;
        if !(local_fraction > 0.0 && local_fraction <= 1.0) {
            return invalid(format!(
                "local_fraction must be in (0, 1] (got {local_fraction})"
            ));
        }
        if local_fraction != 1.0 && settings.fallback != Fallback::Local {
            return invalid(format!(
                "local_fraction ({local_fraction}) shares the rate out while Redis is down \
                 with Fallback::Local only, and the fallback is {:?}: remove one of them",
                settings.fallback
            ));
        }
        let limits = limit_states(self.config(), 0)?;
        if limits.len() > MAX_LIMITS {
            return invalid(format!(
                "a Redis limiter holds at most {MAX_LIMITS} limits, all in one value (got {})",
                limits.len()
            ));
        }
        Failover::new(Parts {
            backend: Arc::clone(&settings.backend),
            naming,
            limits: limits
                .iter()
                .map(|s| (s.policy().clone(), s.permits_per_second()))
                .collect(),
            fallback: settings.fallback,
            local_fraction,
            max_local_keys: cap.or(max_keys).unwrap_or(1),
            clock,
        })
    }
}

impl<C: Clock> Builder<NoKey, Redis, C> {
    /// Checks the options and creates the limiter on its backend. Does no
    /// I/O: it uses the backend's connection and health as they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options: an empty name, a bad
    /// rate, policy or limit, more than 16 limits, a local fraction outside
    /// `(0, 1]` or with a fallback other than `Local`, `max_keys` (its
    /// fallback holds one key), a [`learning`](Builder::learning) value out
    /// of its range, a [`slot_ttl`](Builder::slot_ttl) out of its range.
    pub fn build(self) -> Result<RateLimiter<Redis, C>, Error> {
        let backend = &self.store().backend;
        let key: Arc<str> =
            naming::single_key(&backend.options.key_prefix, &self.store().name).into();
        let zone = backend.health.zone_of(&key);
        // The fallback holds the limiter's one state.
        let upstream = self.upstream()?;
        let slots = self.slots()?;
        let engine = self.failover(Naming::Single { key, zone }, None)?;
        let slots = slots.leases(&engine)?;
        Ok(RateLimiter {
            engine,
            upstream,
            slots,
        })
    }
}

impl<K: Key + Display, C: Clock> Builder<PerKey<K>, Redis, C> {
    /// Checks the options and creates the limiter on its backend. Does no
    /// I/O.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options: an empty name, a bad
    /// rate, policy or limit, more than 16 limits, a local fraction outside
    /// `(0, 1]` or with a fallback other than `Local`, `max_keys(0)`, a
    /// [`learning`](Builder::learning) value out of its range, a
    /// [`slot_ttl`](Builder::slot_ttl) out of its range.
    pub fn build(self) -> Result<KeyedRateLimiter<K, Redis, C>, Error> {
        let prefix =
            naming::keyed_prefix(&self.store().backend.options.key_prefix, &self.store().name);
        let upstream = self.upstream()?;
        let slots = self.slots()?;
        let engine = self.failover(Naming::Keyed { prefix }, Some(DEFAULT_MAX_LOCAL_KEYS))?;
        let slots = slots.leases(&engine)?;
        Ok(KeyedRateLimiter {
            engine,
            upstream,
            slots,
        })
    }
}
