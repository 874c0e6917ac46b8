//! One call of the script on one Redis key: bounded by the response
//! timeout, degrading the backend when Redis is down, and giving back a
//! reservation whose reply comes too late or to nobody.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;

use super::backend::{Backend, ProbeTarget, Scope};
use super::script::{self, Call, Reply, Token};
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
