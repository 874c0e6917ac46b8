//! What both Redis limiters share: their Redis keys, the script call, and
//! the fail-over to a local limiter and back, written once for one key
//! ([`OnlyKey`](crate::store::OnlyKey)) and for many.
//!
//! # The rule at every switch
//!
//! Each permit granted is counted once in the schedule every process sees;
//! where that cannot be known, the limiter errs towards limiting (the
//! user's view: `crate::redis`, "When Redis fails"). In the code's terms:
//!
//! - A key opens in the fallback with nothing stored (a warming-up limit
//!   cold: all stored, its stored permits slowing it) and its ticket at its
//!   *floor* (`floor`): the end of the debt Redis last reported for it (the
//!   latest end in its bucket, for a report that did not fit in memory) or
//!   for a late grant of it ([`Late`]), and no earlier than any ticket the
//!   fallback dropped to stay within `max_local_keys`. A late grant heard
//!   of before the key opens becomes part of its reported debt; one heard
//!   of while the key is held has its own charge (not the rest of the debt
//!   Redis reported with it, another process's among it) taken off what
//!   the key carries back (its caller was served by the fallback too, or
//!   never learned of it).
//! - A key the fallback holds is carried back (`carry`: one resume adds
//!   what it granted beyond the debt Redis had reported when it opened
//!   (`Books::opened`), at the shared rate, and drops the stored permits;
//!   one more carries that debt if Redis lost the key meanwhile) before
//!   any other call of it reaches Redis, and
//!   forgotten only then; its callers wait as `route::Patience` says. Keys nobody
//!   calls are carried by a background task (`carry_all`). A resume whose
//!   reply is lost may be applied and sent again: that errs towards limiting.
//! - After an outage in which the fallback dropped keys, the first call of
//!   a key whose reported debt ends before the latest dropped ticket is
//!   charged up to it, once, in the background (`charge_floor`), its
//!   callers waiting as for a carry-back.

mod calls;
mod ending;
mod impls;
mod local;
mod route;

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::future::Future;
use std::hash::{BuildHasher, Hash, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use super::Fallback;
use super::backend::{Backend, Late, ProbeTarget, Recover};
use super::coalesce::{self, Coalescer, Joined};
use super::health::{Zone, hash_tag};
use super::naming;
use super::reply::{Reply, Stored};
use super::round_trip::{Failure, Remote, send};
use super::runtime::blocking_section;
use super::script::{Call, Kept, LogId, Request, ScriptArgs};
use crate::clock::Clock;
use crate::core::{Policy, Shape, State, micros, share_of, stable_interval_micros};
use crate::error::BackendError;
use crate::keyed::Keyed;
use crate::keyed::Mode;
use crate::limiter::Key;
use crate::meter::Metrics;
use crate::reservation::{GiveBack, GiveBackId, GivesBack};
use crate::store::{Engine, Rate, now};
use crate::{Error, Reservation, Snapshot, Stats};
use ending::Ending;
use route::Waited;

/// Where a limiter's keys live in Redis.
pub(crate) enum Naming {
    /// One Redis key, in one zone.
    Single { key: Arc<str>, zone: Zone },
    /// One Redis key per key: the prefix, then the key (escaped).
    Keyed { prefix: String },
}

/// How many buckets hold the known debts that do not fit in memory.
const BUCKETS: usize = 64;

/// How many keys are carried back at once in the background.
const CARRY_CONCURRENCY: usize = 64;

/// A Redis limiter's shared state: one type for one key and for many.
pub struct Failover<K, C: Clock> {
    pub(crate) backend: Arc<Backend>,
    /// The key's round trips in flight, when reservations are coalesced.
    coalescer: Option<Arc<Coalescer>>,
    naming: Naming,
    script_args: Arc<ScriptArgs>,
    /// The rate in force, as `f64` bits: passed with every call, so a change
    /// reaches Redis with the next one.
    rate_bits: AtomicU64,
    /// What `set_rate` scales; see [`reconfiguring`](Self::reconfiguring).
    reconfiguring: Shape,
    pub(crate) fallback: Fallback,
    /// The local fallback (a key held here owes Redis what it granted). Its
    /// clock is the one waits are slept on.
    pub(crate) local: Keyed<K, C>,
    local_fraction: f64,
    max_local_keys: usize,
    /// Whether the fallback may hold keys or debts are known: if not, calls
    /// skip the lock.
    active: AtomicBool,
    /// How many debts are known (while none is, a call with no debt skips
    /// the lock).
    known_len: AtomicUsize,
    books: Mutex<Books<K>>,
    /// Woken whenever a key's carry-back ends.
    carried: Notify,
    /// Woken whenever a round trip awaited in the background ends.
    answered: Notify,
    /// Whether the background carry-back runs, and whether it runs again
    /// once done (keys were opened meanwhile).
    carrying_all: AtomicBool,
    again: AtomicBool,
    /// Whether this limiter may be paused by an upstream's refusals: it
    /// opened a call, sent a lesson, or heard that a key learned something.
    /// Until then a caller that waited does not ask Redis whether a pause
    /// holds (a limiter that only paces pays no round trip for it).
    pub(super) learns: AtomicBool,
    /// Whether the backend tells this limiter of its recoveries.
    registered: AtomicBool,
    /// The calls its fallback served ([`Stats::fallback_calls`]; the
    /// backend counts every limiter's).
    fallback_calls: AtomicU64,
    bucket_hasher: RandomState,
    this: Weak<Self>,
    /// What its calls are counted in (named after its Redis key or prefix).
    metrics: Metrics,
}

/// What the fail-over remembers, under one lock: every change to the
/// fallback's keys happens under it too.
struct Books<K> {
    /// When the debt Redis last reported for a key ends (µs, local clock),
    /// for keys that owed something: at most `max_local_keys`.
    known: Ending<K, u64>,
    /// What `known` said of a key the fallback holds when it opened there:
    /// what it carries back is what it granted beyond that (what Redis
    /// granted meanwhile, to a round trip sent before the switch or a
    /// call's settle, is in Redis already). At most twice
    /// `max_local_keys` (those of keys dropped at the cap among them).
    opened: HashMap<K, u64>,
    /// The known debts that did not fit: the latest end per bucket of keys.
    overflow: [u64; BUCKETS],
    /// Keys whose debt is on its way to Redis: their callers wait.
    carrying: HashSet<K>,
    /// Keys charged up to the fallback's dropped keys' ticket
    /// `floored_for` (see `charge_floor`): at most `max_local_keys`.
    floored: HashSet<K>,
    floored_for: u64,
    /// The late grants of a key (see [`Late`]), by Redis key: at most
    /// `max_local_keys`.
    late: Ending<Arc<str>, LateGrants>,
    /// How many round trips whose callers stopped waiting are awaited in
    /// the background, by Redis key (a late grant among them is not known).
    awaited: HashMap<Arc<str>, usize>,
    /// What each key running below its configured rates learned in Redis
    /// from an upstream (see `calls`), per its last reply that said so, and
    /// when that came (a count of such replies, `learned_count`): at most
    /// `max_local_keys`, those heard of longest ago forgotten first (their
    /// Redis keys may have expired with what they learned). The key opens
    /// in the fallback at those rates (at its share). (A snapshot from
    /// Redis reads them from its status.)
    learned: HashMap<K, (crate::core::Adopted, u64)>,
    learned_count: u64,
    /// What calls made in Redis sent it while it was down that the
    /// fallback cannot hold (a keep; a lesson, for a limiter that fails
    /// open or closed), with when it came (µs, local clock): sent once it
    /// is back, at most `max_local_keys` or 1 024 (`calls::MIN_QUEUED`),
    /// whichever is more.
    queued: Vec<(K, Call, u64)>,
    /// When a refusal's pause of a key ends (µs, local clock), and whether
    /// only this process knows it: as a reply from Redis said (Redis knows
    /// it), or as the fallback learned it before it carried the key back
    /// (as debt: Redis knows no pause then). What a caller that waited is
    /// told as it wakes while Redis is down, and, of the pauses Redis does
    /// not know, beside what Redis says. At most `max_local_keys`.
    paused: Ending<K, (u64, bool)>,
}

/// What a key's late grants (see [`Late`]) left in Redis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LateGrants {
    /// When the debt Redis reported with them ends (µs, local clock): the
    /// key opens in the fallback no earlier.
    until: u64,
    /// What they charged themselves (µs, at the shared rate): what a
    /// carry-back takes off the fallback's debt at most (the rest of that
    /// debt may be another process's).
    charge: u64,
}

/// A reservation of one key made in Redis: its Redis key and the script's
/// record.
struct RedisKeyTaken {
    key: Arc<str>,
    token: LogId,
}

/// The wake-up of a caller whose key is being carried back.
type Carried<'a> = Pin<Box<Notified<'a>>>;

/// A key marked as being carried back: dropped (the carry-back ended, or
/// its task was dropped unrun), the mark goes and the key's callers wake.
struct Marked<K: Hash + Eq, C: Clock> {
    failover: Arc<Failover<K, C>>,
    key: K,
}

impl<K, C: Clock> Failover<K, C> {
    fn books(&self) -> MutexGuard<'_, Books<K>> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A limiter the backend tells of recoveries leaves its list as it drops.
impl<K, C: Clock> Drop for Failover<K, C> {
    fn drop(&mut self) {
        if self.registered.load(Ordering::Acquire) {
            self.backend
                .forget_recovery(std::ptr::from_ref(self).cast());
        }
    }
}

impl<K: Hash + Eq, C: Clock> Drop for Marked<K, C> {
    fn drop(&mut self) {
        self.failover.books().carrying.remove(&self.key);
        self.failover.carried.notify_waiters();
    }
}

/// What a key's floor asks of a call after an outage (see
/// `charge_floor`).
pub(super) enum Floor<'a> {
    /// Nothing more: the call goes to Redis.
    Charged,
    /// The key is being charged by another call: wait for that.
    Busy(Carried<'a>),
    /// This call started the key's charge: wait for it, then go.
    Charging(Carried<'a>),
}

/// The options a Redis limiter is built from.
pub(crate) struct Parts<C> {
    pub(crate) backend: Arc<Backend>,
    pub(crate) naming: Naming,
    /// Each limit's policy and shared rate (at least one).
    pub(crate) limits: Vec<(Policy, f64)>,
    pub(crate) fallback: Fallback,
    pub(crate) local_fraction: f64,
    pub(crate) max_local_keys: usize,
    pub(crate) clock: C,
}

impl<K: Key + Display, C: Clock> Failover<K, C> {
    pub(crate) fn new(parts: Parts<C>) -> Result<Arc<Self>, Error> {
        let limits = &parts.limits;
        // The fallback's limits: each a share of its shared rate.
        let local_states = limits
            .iter()
            .map(|(policy, rate)| {
                State::new(policy.clone(), share_of(*rate, parts.local_fraction), 0)
            })
            .collect::<Result<Vec<State>, _>>()?;
        let metrics = Metrics::named(Some(match &parts.naming {
            Naming::Single { key, .. } => key,
            Naming::Keyed { prefix } => prefix.trim_end_matches(':'),
        }));
        // The keys the fallback holds are the limiter's, on its gauge.
        let local = Keyed::from_limits(
            local_states,
            parts.clock,
            Some(parts.max_local_keys),
            Mode::Empty,
        )
        .with_share(parts.local_fraction)
        .with_metrics(metrics.clone());
        let coalescer = parts
            .backend
            .options
            .coalesce
            .then(|| Coalescer::new(Arc::clone(&parts.backend)));
        Ok(Arc::new_cyclic(|this| Failover {
            backend: parts.backend,
            coalescer,
            naming: parts.naming,
            script_args: Arc::new(ScriptArgs::new(limits)),
            rate_bits: AtomicU64::new(limits[0].1.to_bits()),
            reconfiguring: Mutex::new(limits.iter().map(|limit| limit.1).collect()),
            fallback: parts.fallback,
            local,
            local_fraction: parts.local_fraction,
            max_local_keys: parts.max_local_keys,
            active: AtomicBool::new(false),
            learns: AtomicBool::new(false),
            fallback_calls: AtomicU64::new(0),
            known_len: AtomicUsize::new(0),
            books: Mutex::new(Books {
                known: Ending::default(),
                opened: HashMap::new(),
                overflow: [0; BUCKETS],
                carrying: HashSet::new(),
                floored: HashSet::new(),
                floored_for: 0,
                late: Ending::default(),
                awaited: HashMap::new(),
                learned: HashMap::new(),
                learned_count: 0,
                queued: Vec::new(),
                paused: Ending::default(),
            }),
            carried: Notify::new(),
            answered: Notify::new(),
            carrying_all: AtomicBool::new(false),
            again: AtomicBool::new(false),
            registered: AtomicBool::new(false),
            bucket_hasher: RandomState::new(),
            this: this.clone(),
            metrics,
        }))
    }

    fn now(&self) -> u64 {
        self.local.clock().now_micros()
    }

    /// The Redis key of `key`.
    pub(crate) fn redis_key<Q: Display + ?Sized>(&self, key: &Q) -> Arc<str> {
        match &self.naming {
            Naming::Single { key, .. } => Arc::clone(key),
            Naming::Keyed { prefix } => naming::keyed_key(prefix, key).into(),
        }
    }

    /// The Redis key of `key`, and what the script needs with it.
    pub(crate) fn target<Q: Display + ?Sized>(&self, key: &Q) -> ProbeTarget {
        let late: Weak<dyn Late> = self.this.clone();
        ProbeTarget {
            key: self.redis_key(key),
            script_args: Arc::clone(&self.script_args),
            late: Some(late),
        }
    }

    /// Whether calls on `target`'s key are served by the fallback.
    fn is_down(&self, target: &ProbeTarget) -> bool {
        match &self.naming {
            Naming::Single { zone, .. } => self.backend.health.is_down(*zone),
            Naming::Keyed { .. } => self.backend.health.is_down_key(&target.key),
        }
    }

    /// Whether calls are served by the fallback now, for some keys at least
    /// (a keyed limiter whose name has a hash tag: its one slot).
    pub(crate) fn is_degraded(&self) -> bool {
        let health = &self.backend.health;
        match &self.naming {
            Naming::Single { zone, .. } => health.is_down(*zone),
            Naming::Keyed { prefix } if hash_tag(prefix.as_bytes()).is_some() => {
                health.is_down_key(prefix)
            }
            Naming::Keyed { .. } => health.any_down(),
        }
    }

    /// Reserves `permits` of `key` through Redis, or through the fallback
    /// while Redis is down ([`Engine::take`]). `held`: the caller may give
    /// the reservation back (see [`Call::Reserve`]).
    async fn take<Q>(
        &self,
        key: &Q,
        permits: u32,
        timeout: Option<Duration>,
        held: bool,
    ) -> Result<Option<Reservation<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        // A call that waited for a carry-back has less than the response
        // timeout left: held, so that a reply that comes too late (the
        // fallback serving it meanwhile) can be given back by its id.
        let call = |timeout, waited: bool| {
            Call::Reserve(Request {
                permits,
                timeout,
                held: held || waited,
            })
        };
        self.reserve_routed(
            key,
            timeout,
            call,
            |reply, target| self.granted(reply, target),
            |local, timeout| now(Engine::take(local, key, permits, timeout)),
        )
        .await
    }

    /// What every reservation shares: reserves for `key` with `call`
    /// through Redis, its reply read by `granted`, or with `local` through
    /// the fallback while Redis is down. Each is given the try's `timeout`,
    /// less the time the caller waited for its key's carry-back (see
    /// [`Waited::timeout`]); `call` is told whether it waited.
    pub(super) async fn reserve_routed<'a, Q>(
        &'a self,
        key: &Q,
        timeout: Option<Duration>,
        call: impl Fn(Option<Duration>, bool) -> Call,
        granted: impl Fn(Reply, &ProbeTarget) -> Option<Reservation<'a>>,
        local: impl Fn(&'a Keyed<K, C>, Option<Duration>) -> Result<Option<Reservation<'a>>, Error>,
    ) -> Result<Option<Reservation<'a>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        let target = &self.target(key);
        let (call, granted, local) = (&call, &granted, &local);
        self.routed(
            key,
            target,
            |waited| async move {
                let call = call(Waited::timeout(waited, timeout), waited.is_some());
                let budget = waited.map(|waited| waited.budget);
                let reply = self.send(key, target, call, budget).await?;
                Ok(granted(reply, target))
            },
            |failure, patient, waited| {
                let timeout = Waited::timeout(waited, timeout);
                let serve = |keyed| local(keyed, timeout);
                self.serve_locally(key, target, failure, patient, serve)
            },
        )
        .await
    }

    /// What `key` holds now, from Redis (one round trip, on its clock) or
    /// the fallback.
    async fn status<Q>(&self, key: &Q) -> Result<Snapshot, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        // At the rates in force: what the key learned, as the status says
        // (whichever process taught it).
        self.read_status(
            key,
            |stored| stored.snapshot(&self.script_args),
            |failure, patient| self.snapshot_locally(key, failure, patient),
        )
        .await
    }

    /// `key`'s status from Redis, read by `read`; `local` while its part
    /// of Redis is down (see [`routed`](Self::routed)).
    async fn read_status<'a, Q, T>(
        &'a self,
        key: &Q,
        read: impl Fn(Stored) -> T,
        local: impl Fn(Option<BackendError>, bool) -> Result<Result<T, Error>, Carried<'a>>,
    ) -> Result<T, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        let target = &self.target(key);
        let read = &read;
        self.routed(
            key,
            target,
            |_| async move {
                let stored: Stored = send(&self.backend, target, Call::Status, None, None).await?;
                Ok(read(stored))
            },
            |failure, patient, _| local(failure, patient),
        )
        .await
    }

    /// A granted reply, as a reservation that gives itself back if dropped.
    fn granted(&self, reply: Reply, target: &ProbeTarget) -> Option<Reservation<'_>> {
        let waits = reply.wait.is_some_and(|wait| !wait.is_zero());
        let taken = reply.token.filter(|_| waits).map(|token| RedisKeyTaken {
            key: Arc::clone(&target.key),
            token,
        });
        self.reservation(reply, taken)
    }

    /// A granted reply, as a reservation; one `taken` names gives itself
    /// back through this limiter if dropped (see [`GivesBack`]).
    pub(super) fn reservation<T: std::any::Any + Send + Sync>(
        &self,
        reply: Reply,
        taken: Option<T>,
    ) -> Option<Reservation<'_>> {
        let wait = reply.wait?;
        let pending = taken.map(|taken| GiveBack {
            owner: self as &dyn GivesBack,
            taken: GiveBackId::Boxed(Box::new(taken)),
        });
        let reservation = Reservation::new(wait, self.local.clock(), pending);
        Some(
            reservation
                .for_limit(reply.limit)
                .with_after(reply.after, &self.script_args),
        )
    }

    /// Gives back, in the background, what the script gave `token` in
    /// `key` (a held reservation, an open call).
    pub(super) fn give_back_in_redis(&self, key: Arc<str>, token: LogId) {
        let remote = Remote {
            backend: Arc::clone(&self.backend),
            target: ProbeTarget {
                key,
                script_args: Arc::clone(&self.script_args),
                late: None,
            },
        };
        self.backend.spawn(remote.give_back(token));
    }

    /// One call for `key` to Redis (see [`send`]) within `budget` (see
    /// [`Waited`]), noting the debt it reports.
    async fn send<Q>(
        &self,
        key: &Q,
        target: &ProbeTarget,
        call: Call,
        budget: Option<Duration>,
    ) -> Result<Reply, Failure>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let backend = &self.backend;
        let reply = match (&self.coalescer, &call) {
            (Some(coalescer), Call::Reserve(request)) => match coalescer.join(target, *request) {
                Joined::Waiting(waiting) => coalesce::wait(backend, target, waiting, budget).await,
                Joined::Alone => send(backend, target, call, None, budget).await,
            },
            _ => send(backend, target, call, None, budget).await,
        }?;
        self.note_debt(key, reply.debt_micros);
        if reply.learned.is_some() {
            self.learns.store(true, Ordering::Relaxed);
            self.note_learned(key, &reply);
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests;
