//! One call of the script on one Redis key: bounded by the response
//! timeout, degrading the backend when Redis is down, and giving back a
//! reservation whose reply comes too late or to nobody.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use redis::{RedisError, RedisResult};

use super::backend::{Backend, ProbeTarget, Scope};
use super::connection::Connection;
use super::reply::Reply;
use super::script::{self, Answer, Call, LogId};
use crate::Error;
use crate::error::BackendError;

/// How long a round trip abandoned by its caller (dropped, or past the
/// response timeout) is still awaited, so that a reservation applied late
/// can be given back.
const ORPHAN_WAIT: Duration = Duration::from_secs(30);

/// Why a round trip gave no reply to use.
pub(crate) enum Failure {
    /// Redis answered that the call or the key is wrong: reported as is.
    Refused(Error),
    /// Redis is unavailable (degraded, failing, or too slow).
    Down(Option<BackendError>),
}

/// A round trip that leads its key's coalesced calls. When it ends
/// ([`finish`](Lead::finish), or dropped unfinished: failed), the calls
/// queued behind it go as the next batch, or fail with it.
pub(crate) struct Lead {
    id: LeadId,
    finished: bool,
}

/// Names a [`Lead`], to fail it from elsewhere (its round trip's task, at
/// the response timeout, while the reply is still awaited): what ends it,
/// told whether Redis answered (ending it again changes nothing).
#[derive(Clone)]
pub(crate) struct LeadId(Arc<dyn Fn(bool) + Send + Sync>);

impl Lead {
    /// The lead that `end` ends, told whether Redis answered.
    pub(crate) fn new(end: impl Fn(bool) + Send + Sync + 'static) -> Lead {
        Lead {
            id: LeadId(Arc::new(end)),
            finished: false,
        }
    }

    /// The round trip ended: `up`, Redis answered.
    fn finish(mut self, up: bool) {
        self.finished = true;
        (self.id.0)(up);
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        // Dropped unfinished: the round trip was abandoned before its reply
        // (its runtime shut down, or it outlived the wait for orphans).
        if !self.finished {
            self.id.fail();
        }
    }
}

impl LeadId {
    /// Ends the round trip as failed (again, or after its slot failed:
    /// nothing changes).
    fn fail(&self) {
        (self.0)(false);
    }
}

impl Failure {
    /// The same failure, for another caller of a batch.
    pub(crate) fn share(&self) -> Failure {
        match self {
            Failure::Refused(Error::Backend(error)) => {
                Failure::Refused(Error::Backend(copy(error)))
            }
            Failure::Refused(Error::InvalidArgument(why)) => {
                Failure::Refused(Error::InvalidArgument(why.clone()))
            }
            Failure::Down(failure) => Failure::Down(failure.as_ref().map(copy)),
        }
    }
}

/// A copy of `error` in its own words (its source's included, not its
/// source).
fn copy(error: &BackendError) -> BackendError {
    BackendError::new(error.to_string()).with_timeout(error.is_timeout())
}

type RoundTrip<T> = Pin<Box<dyn Future<Output = RedisResult<T>> + Send>>;

/// Sends a give-back for a reservation made in Redis.
#[derive(Clone)]
pub(crate) struct Remote {
    pub(crate) backend: Arc<Backend>,
    pub(crate) target: ProbeTarget,
}

impl Remote {
    pub(crate) fn new(backend: &Arc<Backend>, target: &ProbeTarget) -> Remote {
        Remote {
            backend: Arc::clone(backend),
            target: target.clone(),
        }
    }

    /// Gives back, in the background, what `answer` holds, which its
    /// caller never read; a grant that cannot be given back is told to its
    /// limiter (see [`Late`](super::backend::Late)).
    pub(crate) fn give_back_unread<T: Answer>(self, answer: T) {
        let (tokens, kept) = answer.tokens();
        if let Some(kept) = kept {
            self.target.note_late(kept);
        }
        if tokens.is_empty() {
            return;
        }
        let backend = Arc::clone(&self.backend);
        backend.spawn(async move {
            for token in tokens {
                self.clone().give_back(token).await;
            }
        });
    }

    /// One round trip, bounded by the response timeout; a failure is only
    /// logged (the reservation then stays charged: the limiter errs towards
    /// limiting).
    pub(crate) async fn give_back(self, token: LogId) {
        let Some(mut connection) = self.backend.connection() else {
            return;
        };
        let (key, call) = (&self.target.key, Call::GiveBack(token));
        let sent = script::invoke::<Reply>(&mut connection, key, &call, &self.target.script_args);
        unheeded(&self.backend, key, "a give-back", sent).await;
    }
}

/// A round trip (a `what` on `key`) whose failure nobody is told of,
/// bounded by the response timeout: its reply, or `None` once its failure
/// is logged.
pub(crate) async fn unheeded<T>(
    backend: &Backend,
    key: &str,
    what: &str,
    sent: impl Future<Output = RedisResult<T>>,
) -> Option<T> {
    match tokio::time::timeout(backend.options.response_timeout, sent).await {
        Ok(Ok(reply)) => Some(reply),
        Ok(Err(e)) => {
            tracing::debug!(key = %key, error = %e, "{what} failed");
            None
        }
        Err(_) => {
            tracing::debug!(key = %key, "{what} timed out");
            None
        }
    }
}

/// One call of the script on `target`'s key, within its [`Deadline`]. An
/// outage degrades the backend (its probe then runs on that key); a round
/// trip abandoned by its caller or the deadline is given back
/// ([`InFlight`]). `lead`: the call leads its key's coalesced calls (see
/// [`Lead`]).
pub(crate) async fn send<T: Answer>(
    backend: &Arc<Backend>,
    target: &ProbeTarget,
    call: Call,
    lead: Option<Lead>,
    budget: Option<Duration>,
) -> Result<T, Failure> {
    // (With no connection, a lead dropped unfinished fails the calls
    // queued behind it.)
    let mut connection = connection(backend, target)?;
    // A reply abandoned by its caller holds reservations to give back.
    let gives_back = matches!(call, Call::Reserve(_) | Call::Open { .. } | Call::Batch(_));
    let remote = gives_back.then(|| Remote::new(backend, target));
    let (key, args) = (Arc::clone(&target.key), Arc::clone(&target.script_args));
    let led = lead.as_ref().map(|lead| lead.id.clone());
    // Timed once: as it ends, or as its deadline passes (its reply, if it
    // comes, is then none of the caller's).
    let metrics = backend.health.metrics();
    let timed = metrics.timing().then(|| Timed {
        metrics: metrics.clone(),
        started: std::time::Instant::now(),
        done: Arc::new(AtomicBool::new(false)),
    });
    let timeout = timed.clone();
    let mut in_flight = InFlight {
        round_trip: Some(Box::pin(async move {
            let reply = script::invoke(&mut connection, &key, &call, &args).await;
            if let Some(timed) = timed {
                timed.end(Some(reply.is_ok()));
            }
            // The calls queued behind this one go next, or fail with it.
            if let Some(lead) = lead {
                lead.finish(match &reply {
                    Err(e) => script::is_data_error(e),
                    Ok(_) => true,
                });
            }
            reply
        })),
        remote,
    };
    let deadline = Deadline::new(backend, budget);
    let failure = match tokio::time::timeout(deadline.limit, in_flight.reply()).await {
        Ok(Ok(reply)) => return Ok(reply),
        Ok(Err(e)) => failed(e, "call", &target.key)?,
        Err(_) => {
            if let Some(timed) = timeout {
                timed.end(None);
            }
            deadline.passed(&target.key)?
        }
    };
    // Given back in the background (see `InFlight`).
    drop(in_flight);
    let failure = down(backend, target, failure, Scope::Key);
    // The calls queued behind a round trip that timed out fail with it.
    if let Some(led) = led {
        led.fail();
    }
    Err(failure)
}

/// A round trip's timing, recorded once by whichever comes first: its
/// reply, or its deadline.
#[derive(Clone)]
struct Timed {
    metrics: crate::meter::BackendMetrics,
    started: std::time::Instant,
    done: Arc<AtomicBool>,
}

impl Timed {
    /// Records it, if not yet: `ok`, whether it succeeded (`None`: its
    /// deadline passed).
    fn end(&self, ok: Option<bool>) {
        if !self.done.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.metrics.call(self.started.elapsed(), ok);
        }
    }
}

/// The connection calls use; with none (none has worked yet), the whole
/// backend is marked down, and that is the call's failure.
pub(crate) fn connection(
    backend: &Arc<Backend>,
    target: &ProbeTarget,
) -> Result<Connection, Failure> {
    backend.connection().ok_or_else(|| {
        let failure = BackendError::new(format!("no connection to {}", backend.target.describe()));
        down(backend, target, failure, Scope::Backend)
    })
}

/// A call on `target`'s key met an outage, `failure`: the zone `scope`
/// names is marked down (the probe then runs the script on that key).
pub(crate) fn down(
    backend: &Arc<Backend>,
    target: &ProbeTarget,
    failure: BackendError,
    scope: Scope,
) -> Failure {
    backend.degrade(&failure, target.clone(), scope);
    Failure::Down(Some(failure))
}

/// Why a round trip (a `what` on `key`) that Redis answered with `error`
/// gave no reply: Redis refused it (the key or the call is wrong, which a
/// fallback cannot fix: reported as is, `Err`), or failed it (`Ok`: the
/// outage to mark its part down with).
pub(crate) fn failed(error: RedisError, what: &str, key: &str) -> Result<BackendError, Failure> {
    if script::is_data_error(&error) {
        return Err(Failure::Refused(Error::Backend(
            BackendError::new(format!("Redis refused the {what} on key {key}")).with_source(error),
        )));
    }
    let timed_out = error.is_timeout();
    Ok(
        BackendError::new(format!("Redis failed the {what} on key {key}"))
            .with_source(error)
            .with_timeout(timed_out),
    )
}

/// A round trip in flight. If it is dropped before its reply (the caller's
/// future was dropped, or the response timeout passed), the reply is still
/// awaited in the background, and the reservations it carries given back.
/// (A round trip that leads its key's coalesced calls runs in a task of its
/// own, which fails them at the response timeout: see [`send`].)
struct InFlight<T: Answer> {
    round_trip: Option<RoundTrip<T>>,
    remote: Option<Remote>,
}

impl<T: Answer> InFlight<T> {
    /// Awaits the reply (for as long as the caller does).
    async fn reply(&mut self) -> RedisResult<T> {
        let round_trip = self
            .round_trip
            .as_mut()
            .expect("a round trip is awaited once");
        let reply = round_trip.await;
        self.round_trip = None;
        reply
    }
}

impl<T: Answer> Drop for InFlight<T> {
    fn drop(&mut self) {
        let (Some(round_trip), Some(remote)) = (self.round_trip.take(), self.remote.take()) else {
            return;
        };
        let backend = Arc::clone(&remote.backend);
        let awaited = remote.target.awaited();
        backend.spawn(async move {
            if let Ok(Ok(reply)) = tokio::time::timeout(ORPHAN_WAIT, round_trip).await {
                remote.give_back_unread(reply);
            }
            drop(awaited);
        });
    }
}

/// How long a call waits for its reply: the response timeout, or what is
/// left of the caller's time (its budget) if that is shorter.
pub(crate) struct Deadline {
    pub(crate) limit: Duration,
    budget: bool,
}

impl Deadline {
    pub(crate) fn new(backend: &Backend, budget: Option<Duration>) -> Deadline {
        let budget = budget.filter(|budget| *budget < backend.options.response_timeout);
        Deadline {
            limit: budget.unwrap_or(backend.options.response_timeout),
            budget: budget.is_some(),
        }
    }

    /// The deadline of a call on `key` passed: Redis's time ran out (the
    /// failure to mark its part down with), or the caller's budget (the
    /// fallback serves it, and Redis, not given its full time, is not marked
    /// down).
    pub(crate) fn passed(&self, key: &str) -> Result<BackendError, Failure> {
        if self.budget {
            return Err(Failure::Down(Some(
                BackendError::new(format!(
                    "the call's time ran out after it waited for key {key} to be carried back"
                ))
                .with_timeout(true),
            )));
        }
        Ok(BackendError::new(format!(
            "Redis did not answer within {:?} (key {key})",
            self.limit
        ))
        .with_timeout(true))
    }
}
