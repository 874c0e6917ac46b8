//! Coalesced round trips: the reservations of one Redis key that arrive
//! while a round trip of that key is in flight wait, and go together in
//! one call of the script when it ends (a group commit). The script applies
//! them in order at one clock reading, exactly as the same calls one by one
//! would be; a lone caller goes at once.
//!
//! The guarantees of a single call hold for each request of a batch:
//!
//! - **Cancelled while queued**: nothing is sent for it, nothing charged.
//! - **Cancelled after it was sent**: its reply is given back, as an
//!   abandoned round trip's is.
//! - **An outage**: a batch that fails (or times out) fails every request
//!   in it, and every request queued behind it, once: each caller then goes
//!   to its fallback as a single call would. A batch that times out is
//!   still awaited in the background and its grants given back.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::backend::{Backend, ProbeTarget, Scope};
use super::round_trip::{Canceller, Ends, Failure, Lead, send, send_batch};
use super::script::{Call, Reply, Request};
use crate::error::BackendError;

/// The most requests one batch carries: a batch holds Redis (which runs
/// one script at a time) for about 16 000 instructions per request.
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
const SECOND_FLIGHT: usize = 32;

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
    queue: VecDeque<Queued>,
}

/// A request waiting for its key's round trip in flight to end.
struct Queued {
    request: Request,
    target: ProbeTarget,
    reply: oneshot::Sender<Result<Reply, Failure>>,
}

/// How a call goes.
pub(crate) enum Joined {
    /// At once, leading its key: the calls queued meanwhile go when it ends.
    Lead(Lead),
    /// Queued behind the key's round trip in flight: its reply comes here.
    Queued(oneshot::Receiver<Result<Reply, Failure>>),
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

    /// How a reservation of `target`'s key goes.
    pub(crate) fn join(self: &Arc<Self>, target: &ProbeTarget, request: Request) -> Joined {
        let mut keys = self.keys();
        let lead = match keys.get_mut(&target.key) {
            None => {
                let lead = self.next_lead.fetch_add(1, Ordering::Relaxed);
                let (in_flight, queue) = (1, VecDeque::new());
                let slot = Slot {
                    lead,
                    in_flight,
                    queue,
                };
                keys.insert(Arc::clone(&target.key), slot);
                lead
            }
            Some(slot) if slot.queue.len() >= QUEUE_CAPACITY => return Joined::Alone,
            Some(slot) => {
                let (reply, waiting) = oneshot::channel();
                slot.queue.push_back(Queued {
                    request,
                    target: target.clone(),
                    reply,
                });
                // Enough for a batch of its own while one is in flight.
                if slot.in_flight < MAX_IN_FLIGHT && slot.queue.len() >= SECOND_FLIGHT {
                    let (batch, lead) = (take_batch(slot), slot.lead);
                    slot.in_flight += 1;
                    drop(keys);
                    self.dispatch(&target.key, lead, batch);
                }
                return Joined::Queued(waiting);
            }
        };
        Joined::Lead(Lead::new(
            Arc::clone(self) as Arc<dyn Ends>,
            Arc::clone(&target.key),
            lead,
        ))
    }

    /// A round trip of `key`'s slot `lead` ended: `up`, Redis answered (the
    /// queued requests go as the next batch); else it failed (they fail,
    /// and the slot goes).
    fn finish(self: &Arc<Self>, key: &Arc<str>, lead: u64, up: bool) {
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
        slot.in_flight += 1;
        drop(keys);
        self.dispatch(key, lead, batch);
    }

    /// Sends `batch`, a round trip of `key`'s slot `lead`.
    fn dispatch(self: &Arc<Self>, key: &Arc<str>, lead: u64, batch: Vec<Queued>) {
        let lead = Lead::new(Arc::clone(self) as Arc<dyn Ends>, Arc::clone(key), lead);
        self.backend
            .spawn(run_batch(Arc::clone(&self.backend), batch, lead));
    }
}

/// The next batch of `slot`: the callers still waiting, in order, at most
/// [`MAX_BATCH`]; a caller gone while queued is dropped here, unsent.
fn take_batch(slot: &mut Slot) -> Vec<Queued> {
    let mut batch = Vec::new();
    while batch.len() < MAX_BATCH {
        match slot.queue.pop_front() {
            Some(queued) if queued.reply.is_closed() => {}
            Some(queued) => batch.push(queued),
            None => break,
        }
    }
    batch
}

impl Ends for Coalescer {
    fn ended(self: Arc<Self>, key: &Arc<str>, lead: u64, up: bool) {
        self.finish(key, lead, up);
    }
}

/// A queued caller's wait. It is bounded without a timer of its own:
/// every round trip of the key ends (or fails, failing the queue) within
/// the response timeout, and each end sends the next batch, so a caller
/// waits at most for the round trips in flight and the batches queued
/// before its own, each within the response timeout.
pub(crate) async fn wait(
    backend: &Arc<Backend>,
    target: &ProbeTarget,
    waiting: oneshot::Receiver<Result<Reply, Failure>>,
) -> Result<Reply, Failure> {
    match waiting.await {
        // The round trip it waited for, or its own, failed: its part of
        // Redis is down (marked here too, should it not be yet: it must be
        // before the caller is served by its fallback).
        Ok(Err(Failure::Down(Some(failure)))) => {
            backend.degrade(&failure, target.clone(), Scope::Key);
            Err(Failure::Down(Some(failure)))
        }
        Ok(result) => result,
        // The batch's task ended without a reply: its runtime shut down.
        Err(_) => Err(Failure::Down(Some(BackendError::new(format!(
            "the round trip of key {} ended without a reply",
            target.key
        ))))),
    }
}

/// Sends `batch` as one call, then hands each caller its reply; a caller
/// gone meanwhile gets its grant given back.
async fn run_batch(backend: Arc<Backend>, batch: Vec<Queued>, lead: Lead) {
    let target = batch[0].target.clone();
    // A batch of one goes as its own call, which costs Redis less.
    let sent = if let [queued] = &batch[..] {
        let call = Call::Reserve(queued.request);
        send(&backend, &target, call, Some(lead))
            .await
            .map(|reply| vec![reply])
    } else {
        let requests = batch.iter().map(|queued| queued.request).collect();
        send_batch(&backend, &target, requests, lead).await
    };
    match sent {
        Ok(replies) => {
            for (queued, reply) in batch.into_iter().zip(replies) {
                if let Err(Ok(Reply {
                    token: Some(token), ..
                })) = queued.reply.send(Ok(reply))
                {
                    let canceller = Canceller {
                        backend: Arc::clone(&backend),
                        target: target.clone(),
                    };
                    backend.spawn(canceller.cancel(token));
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
