//! Slots for calls in flight shared through Redis
//! ([`Limit::concurrent`](crate::Limit::concurrent)), as the
//! [`outbound`](crate::outbound) module tells: each slot a lease in a
//! sorted set beside the limiter's key, scored by when it expires on
//! Redis's clock, taken and released by a script of its own
//! (`lua/slots.lua`). What that leaves out:
//!
//! - Every take drops the expired leases first. The calls waiting for a
//!   slot stand in a line beside the leases (a sorted set of when each
//!   came, and one of when each last asked), and the free slots go to them
//!   first come, first served: a new call, or one that has just given its
//!   slot back, goes behind them. A waiting call asks again after a pause
//!   (2 ms, doubling to 200 ms), at most 10 ms for each call ahead of it;
//!   the first in line, 5 ms (or a tenth of how long it has been first),
//!   cut short by the earliest lease's expiry, by a release in its own
//!   process and by its own timeout. A slot freed in another process is
//!   so idle up to 5 ms before the first in line takes it (longer only if
//!   that call has been first over 50 ms: a slot held long). A call that
//!   gives up leaves the line in the
//!   background; one that has not asked for 500 ms (its process died, or
//!   its future is not polled) loses its place.
//! - A task the call owns renews its lease every third of the slot TTL,
//!   so a lease outlives its TTL only while its process lives. A renewal
//!   that meets an outage marks its part of Redis down, as a call does, so
//!   that the probe replaces a connection that died silently (the
//!   renewals after it go on the fresh one) even where no call comes. Each
//!   renewal says when the lease expires as last heard, and a lease gone
//!   before then was released: a renewal run after the release (the task
//!   polled on one thread as the call is dropped on another) takes nothing.
//! - A take whose reply is lost (the response timeout, or the caller
//!   dropped) is released in the background, as a dropped call's lease
//!   is; should that release be lost too, the lease expires with its
//!   TTL: errs towards limiting.
//! - While Redis is down, `FailClosed` fails the call with
//!   [`Error::Backend`](crate::Error::Backend); with `Local`, a call
//!   waiting for one of the fallback's slots when Redis comes back asks
//!   Redis instead (woken as the probe marks its part up). A lease held
//!   when Redis went away is renewed again once it is back (taken again
//!   if it expired meanwhile and there is room; one Redis lost, once it
//!   would have expired).
//! - Leases expire on Redis's clock: a step forwards longer than the slot
//!   TTL expires the live ones at once (up to twice the slots in flight,
//!   until the calls holding them end), and a step backwards keeps a dead
//!   process's lease for the TTL and the step.

mod script;

use std::borrow::Borrow;
use std::fmt::Display;
use std::hash::{BuildHasher, Hash, RandomState};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::{Either, select};
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

use script::{Keys, Removal};

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

/// The longest pause of a call first in line, until it has been first ten
/// times as long: a slot freed in another process waits for it that long
/// at most, then a tenth of how long it has been first. A call behind it
/// pauses twice as long for each call ahead.
const TURN_PAUSE: Duration = Duration::from_millis(5);

/// The longest pause of a call with `ahead` calls before it in line
/// (`first`: how long it has been first, if it is): for the first,
/// `TURN_PAUSE`, or a tenth of how long it has been first if that is
/// longer; for the others, twice `TURN_PAUSE` for each call ahead (the
/// next in line as often as the first: it is first once a slot is taken);
/// `MAX_PAUSE` at the most (the script keeps a call's place for 500 ms
/// after it last asked). (Not a tenth of its whole wait: a call that
/// waited long behind others must still take its turn at once, or every
/// slot handed from one process to another idles for it.)
fn turn_pause(ahead: u64, first: Option<Duration>) -> Duration {
    match first {
        Some(first) => TURN_PAUSE.max(first / 10).min(MAX_PAUSE),
        None => {
            let turns = u32::try_from(ahead.max(1)).unwrap_or(u32::MAX);
            (TURN_PAUSE * 2).saturating_mul(turns).min(MAX_PAUSE)
        }
    }
}

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
        // (The slots keys lie in the limiter key's slot, so in its zone:
        // on a cluster the builder refuses a name that would part them.)
        let target = self.failover.target(key);
        let keys = Arc::new(Keys::of(&target.key));
        let waker = (self.hasher.hash_one(&keys.slots) as usize) % self.wakers.len();
        let started = Instant::now();
        let deadline = timeout.and_then(|timeout| started.checked_add(timeout));
        // The call's id in the line, and a guard that takes it out of the
        // line unless it is served.
        let waiter = self.id("w");
        let mut lined = Unused::default();
        let mut pause = FIRST_PAUSE;
        // Since when the call has been first in line.
        let mut first_since = None;
        loop {
            if self.backend().health.is_down_key(&target.key)
                && let Some(taken) = self
                    .fallback(key, &target.key, None, deadline, started, clock)
                    .await
            {
                return taken;
            }
            let mut released = pin!(self.wakers[waker].notified());
            released.as_mut().enable();
            let id = self.id("");
            // (A call that cannot wait, its timeout passed, stays out of
            // the line, where it would stand ahead of others for nothing.)
            let waits = deadline.is_none_or(|deadline| Instant::now() < deadline);
            // Armed before the take is sent: Redis stands the call in line
            // even if the reply is never read (the future dropped mid round
            // trip); the leave follows the take on the connection.
            if waits && lined.0.is_none() {
                lined.0 = Some(Left(
                    Arc::clone(self.backend()),
                    Arc::clone(&keys),
                    Removal::Leave,
                    Arc::clone(&waiter),
                ));
            }
            match self
                .send_take(&target, &keys, &id, waits.then_some(&*waiter))
                .await
            {
                Ok(script::Answer::Granted { expires }) => {
                    // (The script took a call that came with its id out
                    // of the line.)
                    if waits {
                        lined.0 = None;
                    }
                    let lease = self.lease(&target, keys, id, waker, expires);
                    return Ok(Some(Taken {
                        slot: Slot::held(lease),
                        waited: started.elapsed(),
                    }));
                }
                Ok(script::Answer::Full { until_free, ahead }) => {
                    let now = Instant::now();
                    let first = (ahead == 0).then(|| now - *first_since.get_or_insert(now));
                    if ahead > 0 {
                        first_since = None;
                    }
                    let mut wait = pause.min(turn_pause(ahead, first));
                    if !until_free.is_zero() {
                        wait = wait.min(until_free);
                    }
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
                    let fallback =
                        self.fallback(key, &target.key, failure, deadline, started, clock);
                    if let Some(taken) = fallback.await {
                        return taken;
                    }
                    // Back: in line again from the start.
                    first_since = None;
                    pause = FIRST_PAUSE;
                }
            }
        }
    }

    /// An id of this limiter's, unique to it: `kind` tells a waiting call's
    /// (`w`) from a lease's (empty).
    fn id(&self, kind: &str) -> Arc<str> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}:{kind}{number}", self.origin).into()
    }

    /// One take of lease `id` on `keys` for the call `waiter` (`None`: one
    /// that does not wait), bounded by the response timeout. A failure that is an outage degrades the
    /// backend, as the limiter's own calls do; a take whose reply is not
    /// used is released.
    async fn send_take(
        &self,
        target: &ProbeTarget,
        keys: &Arc<Keys>,
        id: &Arc<str>,
        waiter: Option<&str>,
    ) -> Result<script::Answer, Failure> {
        let backend = self.backend();
        let mut connection = connection(backend, target)?;
        let mut unused = Unused(Some(Left(
            Arc::clone(backend),
            Arc::clone(keys),
            Removal::Release,
            Arc::clone(id),
        )));
        let sent = script::take(
            &mut connection,
            keys,
            id,
            self.calls,
            self.ttl,
            waiter,
            None,
        );
        let deadline = Deadline::new(backend, None);
        let slots = &keys.slots;
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

    /// A lease taken, until `expires` (µs on Redis's clock), of the
    /// limiter key `target`'s slots: renewed while it is held, released
    /// when dropped.
    fn lease(
        &self,
        target: &ProbeTarget,
        keys: Arc<Keys>,
        id: Arc<str>,
        waker: usize,
        expires: u64,
    ) -> Lease {
        let backend = Arc::clone(self.backend());
        let renewal = backend.runtime.handle().map(|handle| {
            let renew = renew(
                Arc::clone(&backend),
                target.clone(),
                Arc::clone(&keys),
                Arc::clone(&id),
                self.calls,
                self.ttl,
                expires,
            );
            handle.spawn(renew).abort_handle()
        });
        self.held.fetch_add(1, Ordering::Relaxed);
        Lease {
            backend,
            keys,
            id,
            renewal,
            wakers: (Arc::clone(&self.wakers), waker),
            held: Arc::clone(&self.held),
        }
    }

    /// A slot while Redis is down (for `redis_key`), as the limiter's
    /// fallback says; `None` if Redis came back while the call waited for
    /// one of the fallback's slots: it asks Redis again, as a call that
    /// comes now does (its place among the fallback's waiters given up).
    async fn fallback<Q>(
        &self,
        key: &Q,
        redis_key: &str,
        failure: Option<BackendError>,
        deadline: Option<Instant>,
        started: Instant,
        clock: &dyn Clock,
    ) -> Option<Result<Option<Taken<'_>>, Error>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
    {
        Some(match self.failover.fallback {
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
                let local = pin!(self.local.take_slot(key, left, clock));
                let back = pin!(self.backend().health.back_up(redis_key));
                let taken = match select(local, back).await {
                    Either::Left((taken, _)) => taken,
                    Either::Right(((), _)) => return None,
                };
                taken.map(|taken| {
                    taken.map(|taken| Taken {
                        slot: taken.slot,
                        waited: started.elapsed(),
                    })
                })
            }
        })
    }
}

/// What is left in Redis unless it is disarmed: a take sent whose answer
/// is not used (`release` its lease, in case Redis applied it), or a call
/// that waits in line (`leave` it); removed in the background when
/// dropped.
#[derive(Default)]
struct Unused(Option<Left>);

/// What an [`Unused`] removes: lease or waiting call `id` of `keys`.
struct Left(Arc<Backend>, Arc<Keys>, Removal, Arc<str>);

impl Drop for Unused {
    fn drop(&mut self) {
        if let Some(Left(backend, keys, removal, id)) = self.0.take() {
            Arc::clone(&backend).spawn(remove(backend, keys, removal, id, None));
        }
    }
}

/// A lease held by a call: renewed while it lives, released when dropped.
struct Lease {
    backend: Arc<Backend>,
    keys: Arc<Keys>,
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
        let released = remove(
            Arc::clone(&self.backend),
            Arc::clone(&self.keys),
            Removal::Release,
            Arc::clone(&self.id),
            Some(self.wakers.clone()),
        );
        self.backend.spawn(released);
    }
}

/// Removes a lease or a waiting call from the line,
/// bounded by the response timeout, then wakes this process's waiters of
/// its key; a failure is only logged (the lease then expires with its TTL,
/// the call loses its place once it has not asked for a moment).
async fn remove(
    backend: Arc<Backend>,
    keys: Arc<Keys>,
    removal: Removal,
    id: Arc<str>,
    wakers: Option<(Arc<[Notify]>, usize)>,
) {
    if let Some(mut connection) = backend.connection() {
        let sent = script::remove(&mut connection, &keys, removal, &id);
        let what = if removal == Removal::Leave {
            "a call's leaving the slots' line"
        } else {
            "a slot's release"
        };
        unheeded(&backend, &keys.slots, what, sent).await;
    }
    if let Some((wakers, index)) = wakers
        && let Some(waker) = wakers.get(index)
    {
        waker.notify_waiters();
    }
}

/// Renews a lease of the limiter key `target`'s slots every third of its
/// TTL, for as long as its call holds it (the task is aborted when the
/// lease is dropped), each renewal saying when the lease `expires` as last
/// heard: one that runs after the lease's release (sent as the lease was
/// dropped, on another thread) finds it gone before then, and takes no
/// slot. A renewal that meets an outage (no answer within the response
/// timeout, or Redis failing it) marks its part of Redis down, as a call's
/// round trip does: the probe then replaces a connection that died
/// silently, which the next renewals use, even if the process makes no
/// other call (the lease would otherwise expire with its call in flight).
async fn renew(
    backend: Arc<Backend>,
    target: ProbeTarget,
    keys: Arc<Keys>,
    id: Arc<str>,
    calls: u32,
    ttl: Duration,
    mut expires: u64,
) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        let Some(mut connection) = backend.connection() else {
            continue;
        };
        let sent = script::take(&mut connection, &keys, &id, calls, ttl, None, Some(expires));
        let deadline = Deadline::new(&backend, None);
        let failure = match tokio::time::timeout(deadline.limit, sent).await {
            Ok(Ok(script::Answer::Granted { expires: renewed })) => {
                expires = renewed;
                continue;
            }
            Ok(Ok(script::Answer::Full { .. })) => {
                tracing::warn!(
                    key = %keys.slots,
                    "a call's slot lease was lost before it was renewed, and is not taken again \
                     (before its TTL has passed, or while the slots are all taken)"
                );
                continue;
            }
            Ok(Err(e)) => failed(e, "slot's renewal", &keys.slots),
            Err(_) => deadline.passed(&keys.slots),
        };
        match failure {
            Ok(failure) => {
                tracing::debug!(key = %keys.slots, error = %failure, "a slot's renewal failed");
                down(&backend, &target, failure, Scope::Key);
            }
            Err(_) => tracing::debug!(key = %keys.slots, "a slot's renewal was refused"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_call_asks_the_sooner_the_nearer_it_is_to_its_turn() {
        // 10 ms for each call ahead, 200 ms at the most.
        assert_eq!(turn_pause(1, None), 10 * MS);
        assert_eq!(turn_pause(3, None), 30 * MS);
        assert_eq!(turn_pause(u64::MAX, None), MAX_PAUSE);
        // The first in line: 5 ms, until it has been first over 50 ms,
        // then a tenth of that, whatever it waited before.
        assert_eq!(turn_pause(0, Some(Duration::ZERO)), 5 * MS);
        assert_eq!(turn_pause(0, Some(40 * MS)), 5 * MS);
        assert_eq!(turn_pause(0, Some(700 * MS)), 70 * MS);
        assert_eq!(turn_pause(0, Some(Duration::from_secs(60))), MAX_PAUSE);
    }
}
