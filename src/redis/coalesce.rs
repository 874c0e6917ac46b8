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
use super::round_trip::{Canceller, Failure, send_batch};
use super::script::{Reply, Request};
use crate::error::BackendError;

/// The most requests one batch carries: a batch holds Redis (which runs
/// one script at a time) for about 16 000 instructions per request.
pub(crate) const MAX_BATCH: usize = 256;

/// The most requests queued for one key: beyond it, a caller makes a
/// round trip of its own.
const QUEUE_CAPACITY: usize = 4 * MAX_BATCH;

/// The round trips in flight of one limiter's keys, and the requests
/// queued behind them.
pub(crate) struct Coalescer {
    backend: Arc<Backend>,
    keys: Mutex<HashMap<Arc<str>, Slot>>,
    /// Numbers the round trips that lead a key (see [`Lead`]).
    next_lead: AtomicU64,
}

/// A key with a round trip in flight.
struct Slot {
    /// The round trip in flight.
    lead: u64,
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

/// The round trip in flight of a key. When it ends ([`finish`](Lead::finish),
/// or dropped unfinished), the requests queued behind it go as the next
/// batch, or fail with it.
pub(crate) struct Lead {
    id: LeadId,
    finished: bool,
}

/// Names a key's round trip in flight, to end it from elsewhere (its caller,
/// at the response timeout).
#[derive(Clone)]
pub(crate) struct LeadId {
    coalescer: Arc<Coalescer>,
    key: Arc<str>,
    lead: u64,
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
        match keys.get_mut(&target.key) {
            None => {
                let lead = self.next_lead.fetch_add(1, Ordering::Relaxed);
                let queue = VecDeque::new();
                keys.insert(Arc::clone(&target.key), Slot { lead, queue });
                Joined::Lead(Lead {
                    id: LeadId {
                        coalescer: Arc::clone(self),
                        key: Arc::clone(&target.key),
                        lead,
                    },
                    finished: false,
                })
            }
            Some(slot) if slot.queue.len() >= QUEUE_CAPACITY => Joined::Alone,
            Some(slot) => {
                let (reply, waiting) = oneshot::channel();
                slot.queue.push_back(Queued {
                    request,
                    target: target.clone(),
                    reply,
                });
                Joined::Queued(waiting)
            }
        }
    }

    /// The round trip `lead` of `key` ended: `up`, Redis answered (the
    /// queued requests go as the next batch); else it failed (they fail).
    fn finish(self: &Arc<Self>, key: &Arc<str>, lead: u64, up: bool) {
        let mut keys = self.keys();
        let Some(slot) = keys.get_mut(key).filter(|slot| slot.lead == lead) else {
            return;
        };
        if !up {
            let queue = keys.remove(key).map(|slot| slot.queue).unwrap_or_default();
            drop(keys);
            for queued in queue {
                let failure = BackendError::new(
                    format!("Redis failed the round trip of key {key} this call was queued behind"),
                    None,
                );
                let _ = queued.reply.send(Err(Failure::Down(Some(failure))));
            }
            return;
        }
        // The callers still waiting, in order; a caller gone while queued
        // is dropped here, unsent.
        let mut batch = Vec::new();
        while batch.len() < MAX_BATCH {
            match slot.queue.pop_front() {
                Some(queued) if queued.reply.is_closed() => {}
                Some(queued) => batch.push(queued),
                None => break,
            }
        }
        if batch.is_empty() {
            keys.remove(key);
            return;
        }
        let lead = self.next_lead.fetch_add(1, Ordering::Relaxed);
        slot.lead = lead;
        drop(keys);
        let lead = Lead {
            id: LeadId {
                coalescer: Arc::clone(self),
                key: Arc::clone(key),
                lead,
            },
            finished: false,
        };
        self.backend
            .spawn(run_batch(Arc::clone(&self.backend), batch, lead));
    }
}

impl Lead {
    pub(crate) fn id(&self) -> LeadId {
        self.id.clone()
    }

    /// The round trip ended: `up`, Redis answered.
    pub(crate) fn finish(mut self, up: bool) {
        self.finished = true;
        self.id.finish(up);
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        // Dropped unfinished: the round trip was abandoned before its reply
        // (its runtime shut down, or it outlived the wait for orphans).
        if !self.finished {
            self.id.finish(false);
        }
    }
}

impl LeadId {
    /// Ends the round trip (again: only the first end counts).
    pub(crate) fn finish(&self, up: bool) {
        self.coalescer.finish(&self.key, self.lead, up);
    }
}

/// A queued caller's wait: for the round trip in flight, then its own
/// batch's, each bounded by the response timeout (and both again here,
/// should an end be missed).
pub(crate) async fn wait(
    backend: &Arc<Backend>,
    target: &ProbeTarget,
    waiting: oneshot::Receiver<Result<Reply, Failure>>,
) -> Result<Reply, Failure> {
    let bound = backend.response_timeout.saturating_mul(2);
    match tokio::time::timeout(bound, waiting).await {
        // The round trip it waited for, or its own, failed: its part of
        // Redis is down (marked here too, should it not be yet: it must be
        // before the caller is served by its fallback).
        Ok(Ok(Err(Failure::Down(Some(failure))))) => {
            backend.degrade(&failure, target.clone(), Scope::Key);
            Err(Failure::Down(Some(failure)))
        }
        Ok(Ok(result)) => result,
        // The batch's task ended without a reply: its runtime shut down.
        Ok(Err(_)) => Err(Failure::Down(Some(BackendError::new(
            format!("the round trip of key {} ended without a reply", target.key),
            None,
        )))),
        Err(_) => {
            let failure = BackendError::timeout(format!(
                "Redis did not answer within {bound:?} (key {}, a coalesced call)",
                target.key
            ));
            backend.degrade(&failure, target.clone(), Scope::Key);
            Err(Failure::Down(Some(failure)))
        }
    }
}

/// Sends `batch` as one call, then hands each caller its reply; a caller
/// gone meanwhile gets its grant given back.
async fn run_batch(backend: Arc<Backend>, batch: Vec<Queued>, lead: Lead) {
    let target = batch[0].target.clone();
    let requests = batch.iter().map(|queued| queued.request).collect();
    match send_batch(&backend, &target, requests, lead).await {
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
