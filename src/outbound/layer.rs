//! [`OutboundLayer`]: a tower layer for HTTP clients that paces their calls,
//! settles their costs and learns the upstream's limit.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::Feedback;
use crate::clock::Clock;
use crate::tower::{BoxError, take_ready};
use crate::{Cost, RateLimiter, Store};

/// Paces the requests of an HTTP client (any tower service from
/// `http::Request` to `http::Response`) to an upstream's limits: each request
/// reserves its estimate and waits for its turn ([`RateLimiter::call`]); its
/// real cost, read from the response, is settled and the response fed back
/// ([`Call::finish`](super::Call::finish)).
///
/// The estimate is one permit of every limit unless
/// [`estimate`](OutboundLayer::estimate) says otherwise; the real cost is the
/// estimate unless [`actual`](OutboundLayer::actual) reads one from the
/// response (a body is not read: for a cost in the body, use
/// [`Call`](super::Call)). The call ends as the response's head comes back:
/// with a [`Limit::concurrent`](crate::Limit::concurrent), a body still
/// streaming holds no slot (for that, call [`RateLimiter::call`] and keep
/// the `Call` until the body ends). Refused requests are returned as they
/// came, for the caller to retry: the limiter paces the retries too.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use paceline::{Cost, Limit, RateLimiter};
/// use paceline::outbound::OutboundLayer;
///
/// # fn main() -> Result<(), paceline::Error> {
/// // 3 500 requests and 90 000 tokens a minute, as the upstream documents
/// // them; its headers will say if it allows less.
/// let limiter = Arc::new(
///     RateLimiter::builder()
///         .limit(Limit::per(3_500.0, Duration::from_secs(60)).named("requests"))
///         .limit(Limit::per(90_000.0, Duration::from_secs(60)).named("tokens"))
///         .build()?,
/// );
/// let layer = OutboundLayer::new(limiter)
///     .estimate(|_: &http::Request<String>| Cost::each([1, 800]))
///     .actual(|response: &http::Response<String>| {
///         let tokens = response.headers().get("x-usage-tokens")?.to_str().ok()?;
///         // The upstream's word, bounded: no request costs more than a
///         // minute's tokens (a larger number keeps the estimate).
///         let tokens: u32 = tokens.parse().ok().filter(|t| *t <= 90_000)?;
///         Some(Cost::each([1, tokens]))
///     });
/// # let _ = layer;
/// # Ok(()) }
/// ```
pub struct OutboundLayer<S: Store, C: Clock, E = Unit, A = Estimated> {
    limiter: Arc<RateLimiter<S, C>>,
    estimate: E,
    actual: A,
}

/// The default estimate: one permit of every limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unit;

/// The default real cost: the estimate.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimated;

/// What a request is estimated to cost.
pub trait Estimate<B>: Clone + Send + Sync + 'static {
    /// The estimate for `request`.
    fn estimate(&self, request: &http::Request<B>) -> Cost;
}

impl<B> Estimate<B> for Unit {
    fn estimate(&self, _: &http::Request<B>) -> Cost {
        Cost::new(1)
    }
}

impl<B, F> Estimate<B> for F
where
    F: Fn(&http::Request<B>) -> Cost + Clone + Send + Sync + 'static,
{
    fn estimate(&self, request: &http::Request<B>) -> Cost {
        self(request)
    }
}

/// What a response says its request really cost; `None`: the estimate.
pub trait Actual<B>: Clone + Send + Sync + 'static {
    /// The real cost of the request `response` answers.
    fn actual(&self, response: &http::Response<B>) -> Option<Cost>;
}

impl<B> Actual<B> for Estimated {
    fn actual(&self, _: &http::Response<B>) -> Option<Cost> {
        None
    }
}

impl<B, F> Actual<B> for F
where
    F: Fn(&http::Response<B>) -> Option<Cost> + Clone + Send + Sync + 'static,
{
    fn actual(&self, response: &http::Response<B>) -> Option<Cost> {
        self(response)
    }
}

impl<S: Store, C: Clock> OutboundLayer<S, C> {
    /// Paces requests through `limiter`, each estimated at one permit of every
    /// limit and charged that.
    pub fn new(limiter: Arc<RateLimiter<S, C>>) -> Self {
        OutboundLayer {
            limiter,
            estimate: Unit,
            actual: Estimated,
        }
    }
}

impl<S: Store, C: Clock, E, A> OutboundLayer<S, C, E, A> {
    /// Estimates each request's cost with `estimate` (a function of the
    /// request, or any [`Estimate`]).
    pub fn estimate<E2>(self, estimate: E2) -> OutboundLayer<S, C, E2, A> {
        OutboundLayer {
            limiter: self.limiter,
            estimate,
            actual: self.actual,
        }
    }

    /// Reads each request's real cost from its response with `actual` (a
    /// function of the response, or any [`Actual`]); `None` keeps the
    /// estimate, and so does a cost that counts for a limit the limiter
    /// lacks (the response is returned all the same: the request was sent
    /// and answered). The cost is charged as given: an upstream that
    /// claims a huge one (a bug, or hostile) makes the next callers wait
    /// for it, so bound what is read from a response, as the type's example
    /// does.
    pub fn actual<A2>(self, actual: A2) -> OutboundLayer<S, C, E, A2> {
        OutboundLayer {
            limiter: self.limiter,
            estimate: self.estimate,
            actual,
        }
    }
}

impl<S: Store, C: Clock, E: Clone, A: Clone> Clone for OutboundLayer<S, C, E, A> {
    fn clone(&self) -> Self {
        OutboundLayer {
            limiter: Arc::clone(&self.limiter),
            estimate: self.estimate.clone(),
            actual: self.actual.clone(),
        }
    }
}

impl<S: Store, C: Clock, E, A> fmt::Debug for OutboundLayer<S, C, E, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboundLayer").finish_non_exhaustive()
    }
}

impl<S: Store, C: Clock, E: Clone, A: Clone, Svc> Layer<Svc> for OutboundLayer<S, C, E, A> {
    type Service = Outbound<Svc, S, C, E, A>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Outbound {
            inner,
            layer: self.clone(),
        }
    }
}

/// A client service paced by an [`OutboundLayer`].
pub struct Outbound<Svc, S: Store, C: Clock, E, A> {
    inner: Svc,
    layer: OutboundLayer<S, C, E, A>,
}

impl<Svc: Clone, S: Store, C: Clock, E: Clone, A: Clone> Clone for Outbound<Svc, S, C, E, A> {
    fn clone(&self) -> Self {
        Outbound {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc, S: Store, C: Clock, E, A> fmt::Debug for Outbound<Svc, S, C, E, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbound").finish_non_exhaustive()
    }
}

/// A call whose turn has come, its request not yet sent (its client is
/// being made ready again): dropped unsent (the request dropped, or the
/// client failing), it costs nothing, as a call dropped before its turn
/// gives its estimate back (while the limiter's log holds it, as
/// [`Call::settle`](super::Call::settle) says: after a refusal's pause,
/// which empties the log, its charge stays).
struct Unsent<'a>(Option<super::Call<'a>>);

impl<'a> Unsent<'a> {
    /// The call, its request sent now (which is when it went).
    fn sent(mut self) -> Option<super::Call<'a>> {
        let mut call = self.0.take();
        if let Some(call) = &mut call {
            call.sending();
        }
        call
    }
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if let Some(call) = self.0.take() {
            // (A cost of 0 counts for no limit the limiter lacks: never
            // refused.)
            let _ = call.settle(Cost::new(0));
        }
    }
}

/// The response future of an [`Outbound`] service.
pub type OutboundFuture<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

impl<Svc, S, C, E, A, ReqB, ResB> Service<http::Request<ReqB>> for Outbound<Svc, S, C, E, A>
where
    Svc: Service<http::Request<ReqB>, Response = http::Response<ResB>> + Clone + Send + 'static,
    Svc::Error: Into<BoxError>,
    Svc::Future: Send,
    S: Store,
    C: Clock,
    RateLimiter<S, C>: Send + Sync,
    E: Estimate<ReqB>,
    A: Actual<ResB>,
    ReqB: Send + 'static,
    ResB: 'static,
{
    type Response = http::Response<ResB>;
    type Error = BoxError;
    type Future = OutboundFuture<http::Response<ResB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    /// Waits for the request's turn, sends it, then settles its cost and
    /// learns from its response ([`Call::finish`](super::Call::finish)). A
    /// request that must wait lets go of the inner service's readiness
    /// meanwhile and makes it ready again after its wait; if a refusal's
    /// pause came while the service was made ready, the request is not sent
    /// into it but waits its turn again, behind the pause, and is charged
    /// again: the pause emptied the limiter's log, so its first charge is
    /// not given back (as a caller's that wakes inside a pause is not),
    /// erring towards limiting. Cancel-safe:
    /// dropped while it waits, it gives the estimate back; dropped after
    /// its wait but before the request is sent (the inner service made
    /// ready again, or failing to be), it costs nothing; dropped while the
    /// request is in flight, the call ends at its estimate.
    fn call(&mut self, request: http::Request<ReqB>) -> Self::Future {
        let ready = take_ready(&mut self.inner);
        let layer = self.layer.clone();
        Box::pin(async move {
            let estimate = layer.estimate.estimate(&request);
            let mut inner = ready;
            // The end of the last pause it waited its turn again behind.
            let mut behind = None;
            let unsent = loop {
                // A call that goes at once uses the service made ready. One
                // that waits (its turn, a slot, Redis) lets go of that
                // readiness, which may be room that other users of the
                // client need (a concurrency limit's slot, a buffer's
                // place), and makes a fresh clone ready once its wait is
                // over.
                let mut let_go = false;
                let mut turn = pin!(layer.limiter.call(estimate.clone()));
                let call = poll_fn(|cx| {
                    let polled = turn.as_mut().poll(cx);
                    if polled.is_pending() && !let_go {
                        inner = inner.clone();
                        let_go = true;
                    }
                    polled
                })
                .await?;
                let unsent = Unsent(Some(call));
                if !let_go {
                    break unsent;
                }
                let mut waited = false;
                poll_fn(|cx| {
                    let polled = inner.poll_ready(cx);
                    waited |= polled.is_pending();
                    polled
                })
                .await
                .map_err(Into::into)?;
                // A refusal learned while the client was made ready again
                // pauses this request too, as it does a caller that wakes
                // inside it: it is not sent into the pause, but waits its
                // turn again, behind the pause. Its first charge stays (the
                // pause emptied the log: settled at 0 unsent, it gives
                // nothing back), as a woken caller's does. Once for each
                // pause: behind it, its turn is after it.
                if !waited {
                    break unsent;
                }
                match layer.limiter.paused().await {
                    Some(until) if behind != Some(until) => behind = Some(until),
                    _ => break unsent,
                }
            };
            let call = unsent.sent();
            let response = inner.call(request).await.map_err(Into::into)?;
            let feedback = Feedback::from_response(&response);
            match (call, layer.actual.actual(&response)) {
                // A cost the limiter cannot hold ends the call at its
                // estimate; the upstream's answer is the caller's either way.
                (Some(call), Some(actual)) => drop(call.finish(&feedback, actual)),
                (Some(call), None) => call.learn(&feedback),
                (None, _) => {}
            }
            Ok(response)
        })
    }
}
