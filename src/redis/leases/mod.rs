//! Slots for calls in flight shared through Redis
//! ([`Limit::concurrent`](crate::Limit::concurrent)), as the
//! [`outbound`](crate::outbound) module tells: each slot a lease in a
//! sorted set beside the limiter's key, scored by when it expires on
//! Redis's clock, taken and released by a script of its own
//! (`lua/slots.lua`). What that leaves out:
//!
//! - Every take drops the expired leases first. A waiting call's pause
//!   (2 ms, doubling to 200 ms) is cut short by its own timeout too.
//! - A task the call owns renews its lease every third of the slot TTL,
//!   so a lease outlives its TTL only while its process lives.
//! - A take whose reply is lost (the response timeout, or the caller
//!   dropped) is released in the background, as a dropped call's lease
//!   is; should that release be lost too, the lease expires with its
//!   TTL: errs towards limiting.
//! - While Redis is down, `FailClosed` fails the call with
//!   [`Error::Backend`](crate::Error::Backend). A lease held when Redis
//!   went away is renewed again once it is back (taken again if it
//!   expired meanwhile and there is room).

mod script;

use std::borrow::Borrow;
use std::fmt::Display;
use std::hash::{BuildHasher, Hash, RandomState};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::select;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::Fallback;
use super::backend::{Backend, ProbeTarget, Scope};
use super::failover::Failover;
use super::round_trip::{Deadline, Failure, connection, down, failed, unheeded};
use crate::Error;
use crate::clock::Clock;
use crate::error::BackendError;
use crate::limiter::Key;
use crate::outbound::{InFlight, LocalSlots, Slot, TakeSlot, Taken};

pub(crate) use script::slots_key;

/// The default time to live of a slot's lease in Redis (see
/// [`Builder::slot_ttl`](crate::Builder::slot_ttl)).
pub const DEFAULT_SLOT_TTL: Duration = Duration::from_secs(30);

/// The shortest slot TTL a builder takes, and the longest (a year: what
/// Redis keeps exact, with room to spare).
const MIN_SLOT_TTL: Duration = Duration::from_millis(10);
const MAX_SLOT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The first pause of a call waiting for a slot, and the longest.
const FIRST_PAUSE: Duration = Duration::from_millis(2);
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// How many wake-ups a limiter's waiters share (by their slots key's hash):
/// a release in this process wakes those of its key at once.
const WAKERS: usize = 32;

/// The slots of a Redis limiter: leases per key, and a local share of
/// them for its fallback. Empty (one word) without a concurrent limit.
pub struct Leases<K, C: Clock>(Option<Box<Inner<K, C>>>);

/// What the leases of a limiter with a concurrent limit share.
struct Inner<K, C: Clock> {
    failover: Arc<Failover<K, C>>,
    calls: u32,
    ttl: Duration,
    /// The fallback's slots.
    local: LocalSlots<K>,
    wakers: Arc<[Notify]>,
    /// Leases held in this process.
    held: Arc<AtomicUsize>,
    /// What makes this limiter's lease ids its own, and their count.
    origin: u64,
    next: AtomicU64,
    /// Picks a key's wake-up.
    hasher: RandomState,
}

/// What a Redis builder says of its slots, read before it builds the
/// limiter's fail-over.
pub(crate) struct Slots {
    calls: Option<u32>,
    ttl: Duration,
    local_fraction: f64,
}

impl Slots {
    /// The slots of a limiter that lets `calls` in flight (`None`: no
    /// such limit) on leases that live `ttl`, its fallback holding
    /// `local_fraction` of them; checked.
    pub(crate) fn new(
        calls: Option<u32>,
        ttl: Duration,
        local_fraction: f64,
    ) -> Result<Slots, Error> {
        if calls.is_some() && !(MIN_SLOT_TTL..=MAX_SLOT_TTL).contains(&ttl) {
            return Err(Error::InvalidArgument(format!(
                "slot_ttl must be at least {MIN_SLOT_TTL:?} and at most a year, \
                 {MAX_SLOT_TTL:?} (got {ttl:?})"
            )));
        }
        Ok(Slots {
            calls,
            ttl,
            local_fraction,
        })
    }

    /// The leases of the limiter `failover` serves.
    pub(crate) fn leases<K, C: Clock>(
        &self,
        failover: &Arc<Failover<K, C>>,
    ) -> Result<Leases<K, C>, Error> {
        let Some(calls) = self.calls else {
            return Ok(Leases(None));
        };
        // The fallback's share: at least one slot.
        let share = (f64::from(calls) * self.local_fraction).floor() as u32;
        let origin =
            RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()));
        Ok(Leases(Some(Box::new(Inner {
            failover: Arc::clone(failover),
            calls,
            ttl: self.ttl,
            local: LocalSlots::new(Some(share.max(1))),
            wakers: (0..WAKERS).map(|_| Notify::new()).collect(),
            held: Arc::new(AtomicUsize::new(0)),
            origin,
            next: AtomicU64::new(0),
            hasher: RandomState::new(),
        }))))
    }
}

impl<K: Send + Sync, C: Clock> InFlight for Leases<K, C> {
    fn in_flight(&self) -> usize {
        self.0.as_ref().map_or(0, |inner| {
            inner.held.load(Ordering::Relaxed) + inner.local.in_flight()
        })
    }
}

impl<K, C, Q> TakeSlot<Q> for Leases<K, C>
where
    K: Key + Display + Borrow<Q>,
    C: Clock,
    Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    async fn take_slot<'s>(
        &'s self,
        key: &Q,
        timeout: Option<Duration>,
        clock: &dyn Clock,
    ) -> Result<Option<Taken<'s>>, Error> {
        match self.0.as_deref() {
            None => Ok(Some(Taken::free())),
            Some(inner) => inner.take(key, timeout, clock).await,
        }
    }
}

impl<K: Key + Display, C: Clock> Inner<K, C> {
    fn backend(&self) -> &Arc<Backend> {
        &self.failover.backend
    }

    /// Takes a lease of `key`, polling while every slot is taken, at most
    /// `timeout`; from the fallback while Redis is down.
    async fn take<Q>(
        &self,
        key: &Q,
        timeout: Option<Duration>,
        clock: &dyn Clock,
    ) -> Result<Option<Taken<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        // (The slots key lies in the limiter key's slot, so in its zone:
        // on a cluster the builder refuses a name that would part them.)
        let target = self.failover.target(key);
        let slots: Arc<str> = slots_key(&target.key).into();
        let waker = (self.hasher.hash_one(&*slots) as usize) % self.wakers.len();
        let started = Instant::now();
        let deadline = timeout.and_then(|timeout| started.checked_add(timeout));
        let mut pause = FIRST_PAUSE;
        loop {
            if self.backend().health.is_down_key(&target.key) {
                return self.fallback(key, None, deadline, started, clock).await;
            }
            let mut released = pin!(self.wakers[waker].notified());
            released.as_mut().enable();
            let id: Arc<str> = format!(
                "{:016x}:{}",
                self.origin,
                self.next.fetch_add(1, Ordering::Relaxed)
            )
            .into();
            match self.send_take(&target, &slots, &id).await {
                Ok(script::Answer::Granted) => {
                    let lease = self.lease(slots, id, waker);
                    return Ok(Some(Taken {
                        slot: Slot::held(lease),
                        waited: started.elapsed(),
                    }));
                }
                Ok(script::Answer::Full { until_free }) => {
                    let now = Instant::now();
                    let mut wait = pause.min(until_free.max(Duration::from_millis(1)));
                    if let Some(deadline) = deadline {
                        if now >= deadline {
                            return Ok(None);
                        }
                        wait = wait.min(deadline - now);
                    }
                    select(released, pin!(tokio::time::sleep(wait))).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                Err(Failure::Refused(error)) => return Err(error),
                Err(Failure::Down(failure)) => {
                    return self.fallback(key, failure, deadline, started, clock).await;
                }
            }
        }
    }

    /// One take of lease `id` on `slots`, bounded by the response timeout.
    /// A failure that is an outage degrades the backend, as the limiter's
    /// own calls do; a take whose reply is not used is released.
    async fn send_take(
        &self,
        target: &ProbeTarget,
        slots: &Arc<str>,
        id: &Arc<str>,
    ) -> Result<script::Answer, Failure> {
        let backend = self.backend();
        let mut connection = connection(backend, target)?;
        let mut unused = Unused(Some((
            Arc::clone(backend),
            Arc::clone(slots),
            Arc::clone(id),
        )));
        let sent = script::take(&mut connection, slots, id, self.calls, self.ttl);
        let deadline = Deadline::new(backend, None);
        let failure = match tokio::time::timeout(deadline.limit, sent).await {
            Ok(Ok(answer)) => {
                unused.0 = None;
                return Ok(answer);
            }
            // A take Redis refused took nothing.
            Ok(Err(e)) => failed(e, "slots call", slots).inspect_err(|_| unused.0 = None)?,
            Err(_) => deadline.passed(slots)?,
        };
        Err(down(backend, target, failure, Scope::Key))
    }

    /// A lease taken: renewed while it is held, released when dropped.
    fn lease(&self, slots: Arc<str>, id: Arc<str>, waker: usize) -> Lease {
        let backend = Arc::clone(self.backend());
        let renewal = backend.runtime.handle().map(|handle| {
            let renew = renew(
                Arc::clone(&backend),
                Arc::clone(&slots),
                Arc::clone(&id),
                self.calls,
                self.ttl,
            );
            handle.spawn(renew).abort_handle()
        });
        self.held.fetch_add(1, Ordering::Relaxed);
        Lease {
            backend,
            slots,
            id,
            renewal,
            wakers: (Arc::clone(&self.wakers), waker),
            held: Arc::clone(&self.held),
        }
    }

    /// A slot while Redis is down, as the limiter's fallback says.
    async fn fallback<Q>(
        &self,
        key: &Q,
        failure: Option<BackendError>,
        deadline: Option<Instant>,
        started: Instant,
        clock: &dyn Clock,
    ) -> Result<Option<Taken<'_>>, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        match self.failover.fallback {
            Fallback::FailOpen => Ok(Some(Taken {
                slot: Slot::default(),
                waited: started.elapsed(),
            })),
            Fallback::FailClosed => Err(Error::Backend(failure.unwrap_or_else(|| {
                BackendError::new(format!(
                    "Redis is unavailable and the limiter fails closed (slots of {}; last \
                     error: {})",
                    self.failover.describe(),
                    self.backend().health.last_error()
                ))
            }))),
            Fallback::Local => {
                let left =
                    deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
                let taken = self.local.take_slot(key, left, clock).await?;
                Ok(taken.map(|taken| Taken {
                    slot: taken.slot,
                    waited: started.elapsed(),
                }))
            }
        }
    }
}

/// A take sent whose answer is not used: released in the background
/// when dropped, in case Redis applied it.
struct Unused(Option<(Arc<Backend>, Arc<str>, Arc<str>)>);

impl Drop for Unused {
    fn drop(&mut self) {
        if let Some((backend, slots, id)) = self.0.take() {
            Arc::clone(&backend).spawn(release(backend, slots, id, None));
        }
    }
}

/// A lease held by a call: renewed while it lives, released when dropped.
struct Lease {
    backend: Arc<Backend>,
    slots: Arc<str>,
    id: Arc<str>,
    renewal: Option<AbortHandle>,
    wakers: (Arc<[Notify]>, usize),
    held: Arc<AtomicUsize>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        self.held.fetch_sub(1, Ordering::Relaxed);
        let released = release(
            Arc::clone(&self.backend),
            Arc::clone(&self.slots),
            Arc::clone(&self.id),
            Some(self.wakers.clone()),
        );
        self.backend.spawn(released);
    }
}

/// Removes a lease, bounded by the response timeout, then wakes this
/// process's waiters of its key; a failure is only logged (the lease then
/// expires with its TTL).
async fn release(
    backend: Arc<Backend>,
    slots: Arc<str>,
    id: Arc<str>,
    wakers: Option<(Arc<[Notify]>, usize)>,
) {
    if let Some(mut connection) = backend.connection() {
        let sent = script::release(&mut connection, &slots, &id);
        unheeded(&backend, &slots, "a slot's release", sent).await;
    }
    if let Some((wakers, index)) = wakers
        && let Some(waker) = wakers.get(index)
    {
        waker.notify_waiters();
    }
}

/// Renews a lease every third of its TTL, for as long as its call holds it
/// (the task is aborted when the lease is dropped).
async fn renew(backend: Arc<Backend>, slots: Arc<str>, id: Arc<str>, calls: u32, ttl: Duration) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        let Some(mut connection) = backend.connection() else {
            continue;
        };
        let sent = script::take(&mut connection, &slots, &id, calls, ttl);
        if let Some(script::Answer::Full { .. }) =
            unheeded(&backend, &slots, "a slot's renewal", sent).await
        {
            tracing::warn!(
                key = %slots,
                "a call's slot lease expired before it was renewed, and the slots were all taken"
            );
        }
    }
}
