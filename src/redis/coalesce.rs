//! Coalesced round trips, a group commit (what users are promised:
//! `RedisBackendBuilder::coalesce`).
//!
//! Every round trip of a key, a lone caller's included, runs as a task of
//! the backend's runtime, and every caller awaits its reply through a
//! channel of its own, on a timer of its own ([`wait`]): a caller stalled
//! or dropped holds up nobody but itself. Each request of a batch keeps a
//! single call's guarantees: cancelled while queued, nothing is sent or
//! charged ([`take_batch`]); cancelled after it was sent, or past its
//! deadline, its grant is given back when its reply comes ([`Waiting`],
//! [`run_batch`]); a batch that fails or times out fails every request in
//! it and queued behind it, once. A caller whose time runs out marks Redis
//! down only if a round trip of its key that was in flight when it came
//! is still unanswered, not if it waited for answered ones ([`wait`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::sync::oneshot::error::TryRecvError;

use super::backend::{Awaited, Backend, ProbeTarget, Scope};
use super::reply::Reply;
use super::round_trip::{Deadline, Failure, Lead, Remote, down, send};
use super::script::{Call, Request};
use crate::error::BackendError;

/// The most requests one batch carries: a batch holds Redis (which runs
/// one script at a time) for about 6 000 instructions per request (one
/// limit; `scripts/script-cost.sh`).
pub(crate) const MAX_BATCH: usize = 256;

/// The most requests queued for one key: beyond it, a caller makes a
/// round trip of its own.
const QUEUE_CAPACITY: usize = 4 * MAX_BATCH;

/// The most round trips of one key in flight at once: while Redis runs
/// one batch, the replies of the one before are handed out and the next
/// one fills.
const MAX_IN_FLIGHT: usize = 2;

/// How many requests must be queued for a batch to go while another round
/// trip of the key is in flight (with none in flight, any number goes).
/// Measured with 256 callers on one key (`PACELINE_BENCH_PART=4` of the
/// Redis benchmark): 32 gave 0.81 million reservations a second, 64 gave
/// 1.1 million, 128 0.87 million; a second batch that goes too small costs
/// a round trip for few, one that waits too long leaves Redis idle.
const SECOND_FLIGHT: usize = 64;

/// The round trips in flight of one limiter's keys, and the requests
/// queued behind them.
pub(crate) struct Coalescer {
    backend: Arc<Backend>,
    keys: Mutex<HashMap<Arc<str>, Slot>>,
    /// Numbers the slots of keys (see [`Slot::lead`]).
    next_lead: AtomicU64,
}

/// A key with round trips in flight.
struct Slot {
    /// Names this slot: a round trip that ends after its slot failed (and
    /// went) finds another number, or none, and changes nothing.
    lead: u64,
    /// Its round trips in flight, 1 to [`MAX_IN_FLIGHT`].
    in_flight: usize,
    /// Each of them while it is unanswered (see [`Unanswered`]), in any
    /// order; answered ones and `Weak::new()` in the other places.
    flights: Behind,
    queue: VecDeque<Queued>,
}

/// A round trip of a key while it is unanswered: the round trip holds the
/// other end until its reply comes (or it is given up on, 30 s after its
/// time ran out).
type Unanswered = Weak<()>;

/// A key's round trips that may be unanswered: the most in flight, and
/// one more whose reply came and which has not yet let go (its end starts
/// the next), so that a new one always finds a place. Copied for each
/// queued caller without allocating.
type Behind = [Unanswered; MAX_IN_FLIGHT + 1];

/// A request in its key's round trips: queued behind the one in flight, or
/// in a batch being sent (a lone caller's, a batch of one).
struct Queued {
    request: Request,
    /// When a try was queued: its timeout counts from its call, so the
    /// time it waits queued is taken off when its batch goes (see
    /// [`take_batch`]). (None for a call with no timeout, which reads no
    /// clock.)
    since: Option<tokio::time::Instant>,
    target: ProbeTarget,
    reply: oneshot::Sender<Result<Reply, Failure>>,
    /// Set by its caller if it stops waiting before its reply (see
    /// [`Waiting`]); dropped with the request, once its batch's task is done
    /// with it.
    _left: Left,
}

/// A caller that stopped waiting before its reply: its round trip is
/// awaited in the background (see [`Awaited`]) until its batch's task is
/// done with it, so that a grant Redis made late is told before the key
/// is carried back from its fallback.
type Left = Arc<OnceLock<Option<Awaited>>>;

/// Where a queued request's reply comes, the caller's [`Left`], and the
/// round trips of its key that were in flight when it came (its own
/// among them if it went at once).
type Replied = (oneshot::Receiver<Result<Reply, Failure>>, Left, Behind);

/// How a call goes.
pub(crate) enum Joined {
    /// In its key's round trips: sent at once, leading the key, if none is
    /// in flight (the calls queued meanwhile go when it ends), else queued
    /// behind them. Its reply comes here (see [`wait`]).
    Waiting(Replied),
    /// At once, on its own: the key's queue is full.
    Alone,
}

impl Coalescer {
    pub(crate) fn new(backend: Arc<Backend>) -> Arc<Coalescer> {
        Arc::new(Coalescer {
            backend,
            keys: Mutex::default(),
            next_lead: AtomicU64::new(0),
        })
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<Arc<str>, Slot>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How a reservation of `target`'s key goes (see [`Joined`]).
    pub(crate) fn join(self: &Arc<Self>, target: &ProbeTarget, request: Request) -> Joined {
        let mut keys = self.keys();
        match keys.get_mut(&target.key) {
            None => {
                let lead = self.next_lead.fetch_add(1, Ordering::Relaxed);
                let mut slot = Slot {
                    lead,
                    in_flight: 0,
                    flights: Behind::default(),
                    queue: VecDeque::new(),
                };
                let held = slot.fly();
                let (queued, waiting) = Queued::new(request, target, slot.flights.clone());
                keys.insert(Arc::clone(&target.key), slot);
                drop(keys);
                self.dispatch(&target.key, lead, vec![queued], held);
                Joined::Waiting(waiting)
            }
            Some(slot) if slot.queue.len() >= QUEUE_CAPACITY => Joined::Alone,
            Some(slot) => {
                // Enough for a batch of its own while one is in flight.
                let second =
                    slot.in_flight < MAX_IN_FLIGHT && slot.queue.len() + 1 >= SECOND_FLIGHT;
                let held = second.then(|| slot.fly());
                let (queued, waiting) = Queued::new(request, target, slot.flights.clone());
                slot.queue.push_back(queued);
                if let Some(held) = held {
                    let (batch, lead) = (take_batch(slot), slot.lead);
                    drop(keys);
                    self.dispatch(&target.key, lead, batch, held);
                }
                Joined::Waiting(waiting)
            }
        }
    }

    /// A round trip of `key`'s slot `lead` ended: `up`, Redis answered (the
    /// queued requests go as the next batch); else it failed (they fail,
    /// and the slot goes).
    pub(crate) fn finish(self: &Arc<Self>, key: &Arc<str>, lead: u64, up: bool) {
        let mut keys = self.keys();
        let Some(slot) = keys.get_mut(key).filter(|slot| slot.lead == lead) else {
            return;
        };
        if !up {
            let queue = keys.remove(key).map(|slot| slot.queue).unwrap_or_default();
            drop(keys);
            for queued in queue {
                let failure = BackendError::new(format!(
                    "Redis failed the round trip of key {key} this call was queued behind"
                ));
                let _ = queued.reply.send(Err(Failure::Down(Some(failure))));
            }
            return;
        }
        slot.in_flight -= 1;
        let batch = take_batch(slot);
        if batch.is_empty() {
            if slot.in_flight == 0 {
                keys.remove(key);
            }
            return;
        }
        let held = slot.fly();
        drop(keys);
        self.dispatch(key, lead, batch, held);
    }

    /// Sends `batch`, a round trip of `key`'s slot `lead`, which holds
    /// `held` until its reply comes.
    fn dispatch(self: &Arc<Self>, key: &Arc<str>, lead: u64, batch: Vec<Queued>, held: Arc<()>) {
        let (coalescer, key) = (Arc::clone(self), Arc::clone(key));
        let lead = Lead::new(move |up| {
            let _ = &held;
            coalescer.finish(&key, lead, up);
        });
        self.backend
            .spawn(run_batch(Arc::clone(&self.backend), batch, lead));
    }
}

impl Slot {
    /// One more round trip in flight: what it holds while unanswered.
    fn fly(&mut self) -> Arc<()> {
        let held = Arc::new(());
        self.in_flight += 1;
        let answered = self
            .flights
            .iter()
            .position(|flight| flight.strong_count() == 0);
        debug_assert!(answered.is_some(), "more round trips than places");
        self.flights[answered.unwrap_or(0)] = Arc::downgrade(&held);
        held
    }
}

impl Queued {
    /// A request of `target`'s key, and where its reply comes; `behind`:
    /// the key's round trips in flight as it came.
    fn new(request: Request, target: &ProbeTarget, behind: Behind) -> (Queued, Replied) {
        let (reply, waiting) = oneshot::channel();
        let target = target.clone();
        let left = Left::default();
        let since = request.timeout.map(|_| tokio::time::Instant::now());
        let queued = Queued {
            request,
            since,
            target,
            reply,
            _left: Arc::clone(&left),
        };
        (queued, (waiting, left, behind))
    }
}

/// The next batch of `slot`: the callers still waiting, in order, at most
/// [`MAX_BATCH`]; a caller gone while queued is dropped here, unsent. A
/// try's timeout is what is left of it: the wait it fits counts from its
/// call, as a call of its own sent then would count it (one queued behind
/// a round trip that drains the key's debt meanwhile would otherwise be
/// granted up to that round trip more than its timeout, from its call).
fn take_batch(slot: &mut Slot) -> Vec<Queued> {
    let mut batch = Vec::new();
    while batch.len() < MAX_BATCH {
        match slot.queue.pop_front() {
            Some(queued) if queued.reply.is_closed() => {}
            Some(mut queued) => {
                if let (Some(timeout), Some(since)) = (&mut queued.request.timeout, queued.since) {
                    *timeout = timeout.saturating_sub(since.elapsed());
                }
                batch.push(queued);
            }
            None => break,
        }
    }
    batch
}

/// A caller's wait for the reply of its key's round trip, on a timer of
/// its own (its [`Deadline`]). Past it, the caller goes to its fallback as
/// a single call that timed out does; its request, left queued, is never
/// sent, and one sent is given back when its reply comes ([`Waiting`]).
/// It marks Redis down only if a round trip of its key in flight when it
/// came (its own, if it went at once) is still unanswered: one that only
/// waited for round trips Redis answered, and then for its own batch, gave
/// Redis less than the response timeout (its batch's round trip, given the
/// whole of it, marks Redis down if it does not answer).
pub(crate) async fn wait(
    backend: &Arc<Backend>,
    target: &ProbeTarget,
    waiting: Replied,
    budget: Option<Duration>,
) -> Result<Reply, Failure> {
    let (replied, left, behind) = waiting;
    let mut waiting = Waiting {
        replied,
        left,
        backend,
        target,
    };
    let deadline = Deadline::new(backend, budget);
    let failure = match tokio::time::timeout(deadline.limit, &mut waiting.replied).await {
        // Its round trip failed: marked down here too, should it not be yet,
        // as it must be before the fallback serves the caller.
        Ok(Ok(Err(Failure::Down(Some(failure))))) => failure,
        Ok(Ok(result)) => return result,
        // The batch's task ended without a reply: its runtime shut down.
        Ok(Err(_)) => BackendError::new(format!(
            "the round trip of key {} ended without a reply",
            target.key
        )),
        Err(_) if behind.iter().all(|flight| flight.strong_count() == 0) => {
            return Err(Failure::Down(Some(
                BackendError::new(format!(
                    "the call's time ran out while it waited behind round trips of key {} that \
                     Redis answered",
                    target.key
                ))
                .with_timeout(true),
            )));
        }
        Err(_) => deadline.passed(&target.key)?,
    };
    Err(down(backend, target, failure, Scope::Key))
}

/// A caller's end of its reply's channel. Dropped before the reply was
/// read (the caller gave up, or timed out), it closes the channel: a reply
/// sent later finds it closed and is given back by the batch's task (its
/// round trip awaited meanwhile: see [`Left`]), and one sent already is
/// given back here.
struct Waiting<'a> {
    replied: oneshot::Receiver<Result<Reply, Failure>>,
    left: Left,
    backend: &'a Arc<Backend>,
    target: &'a ProbeTarget,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let reply = match self.replied.try_recv() {
            Err(TryRecvError::Empty) => {
                // (Before the channel closes: the batch's task, finding it
                // closed, tells the late grant, then lets it go.)
                let _ = self.left.set(self.target.awaited());
                self.replied.close();
                self.replied.try_recv()
            }
            // (Read already, or its batch's task gone.)
            other => other,
        };
        if let Ok(Ok(reply)) = reply {
            Remote::new(self.backend, self.target).give_back_unread(reply);
        }
    }
}

/// Sends `batch` as one call, then hands each caller its reply; a caller
/// gone meanwhile gets its grant given back.
async fn run_batch(backend: Arc<Backend>, batch: Vec<Queued>, lead: Lead) {
    let target = batch[0].target.clone();
    // A batch of one goes as its own call, which costs Redis less.
    let sent = if let [queued] = &batch[..] {
        let call = Call::Reserve(queued.request);
        send(&backend, &target, call, Some(lead), None)
            .await
            .map(|reply| vec![reply])
    } else {
        let requests = batch.iter().map(|queued| queued.request).collect();
        send(&backend, &target, Call::Batch(requests), Some(lead), None).await
    };
    match sent {
        Ok(replies) => {
            for (queued, reply) in batch.into_iter().zip(replies) {
                if let Err(Ok(reply)) = queued.reply.send(Ok(reply)) {
                    Remote::new(&backend, &target).give_back_unread(reply);
                }
            }
        }
        Err(failure) => {
            for queued in batch {
                let _ = queued.reply.send(Err(failure.share()));
            }
        }
    }
}
