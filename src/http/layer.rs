//! The layer: [`RateLimitLayer`], its builder, and the service it makes.

use std::future::{Future, poll_fn};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ::http::header::RETRY_AFTER;
use ::http::{HeaderValue, Request, Response, StatusCode};
use futures::FutureExt;
use futures::future::{self, Either, Join, Map, Ready};
use tower_layer::Layer;
use tower_service::Service;

use super::headers::{Headers, PolicyName, retry_after_secs, write_headers};
use super::key::KeyExtractor;
use crate::tower::take_ready;
use crate::{KeyedLimiter, Snapshot};

/// What a refused request is told: passed to the hook that shapes its
/// response ([`RateLimitLayer::on_refused`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Refused {
    /// How long until the request would go: `Retry-After`, before it is
    /// rounded up to whole seconds.
    pub retry_after: Duration,
    /// The key's state when it was refused.
    pub snapshot: Snapshot,
}

/// Shapes the response to a refused request: any
/// `Fn(&Refused) -> Response<R>` closure, or [`EmptyBody`] (the default).
/// The layer then adds `Retry-After` and the rate-limit headers, unless the
/// response already has them; the status is the hook's (return
/// `429 Too Many Requests` unless you have a reason not to).
pub trait OnRefused<R>: Clone + Send + Sync + 'static {
    /// The response to a refused request.
    fn response(&self, refused: &Refused) -> Response<R>;
}

impl<R, F> OnRefused<R> for F
where
    F: Fn(&Refused) -> Response<R> + Clone + Send + Sync + 'static,
{
    fn response(&self, refused: &Refused) -> Response<R> {
        self(refused)
    }
}

/// The default refusal: `429 Too Many Requests` with an empty body.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmptyBody;

impl<R: Default> OnRefused<R> for EmptyBody {
    fn response(&self, _: &Refused) -> Response<R> {
        answer(StatusCode::TOO_MANY_REQUESTS)
    }
}

/// Limits HTTP requests per key, answering a refused one with
/// `429 Too Many Requests`, `Retry-After` in whole seconds (rounded up),
/// and the rate-limit headers on every response; see
/// [`RateLimitLayer::new`].
#[derive(Debug, Clone)]
pub struct RateLimitLayer<L, X, H = EmptyBody> {
    limiter: L,
    extractor: X,
    config: Config<H>,
}

/// What a layer and its services share besides the limiter and extractor.
#[derive(Debug, Clone)]
struct Config<H> {
    max_wait: Duration,
    headers: Headers,
    /// The policy's name, and its `RateLimit-Policy` value.
    policy: Arc<PolicyName>,
    on_refused: H,
}

impl<L, X> RateLimitLayer<L, X> {
    /// Limits requests per key with `limiter` (an `Arc` of any
    /// [`KeyedLimiter`], local or through Redis), the key found by
    /// `extractor` ([`ClientIp`](super::ClientIp), [`PeerIp`](super::PeerIp),
    /// [`Header`](super::Header), [`Global`](super::Global) with a limiter
    /// keyed by `()`, or a closure).
    ///
    /// A request whose key has no permit free is refused at once (see
    /// [`max_wait`](Self::max_wait)): it reserves nothing, the inner
    /// service is not called, and the answer is `429 Too Many Requests`
    /// (see [`on_refused`](Self::on_refused)) with `Retry-After`. Every
    /// response carries the rate-limit headers (see
    /// [`headers`](Self::headers)). A limiter that fails (Redis down with
    /// `Fallback::FailClosed`) answers `503 Service Unavailable`; a
    /// request whose key cannot be found, `500 Internal Server Error`.
    ///
    /// # The headers
    ///
    /// With the key's [`Snapshot`] after the request: for a granted request
    /// through Redis, the state its own reply said the script left
    /// ([`Reservation::snapshot`](crate::Reservation::snapshot), so other
    /// processes' requests after it do not count); otherwise a second call
    /// to the limiter (through Redis, a second round trip: for a granted
    /// request, turn the headers off with [`Headers::None`] where that
    /// matters; a refusal reads its wait so, for `Retry-After`, whatever
    /// the headers). A request that waited reads it as of its answer:
    ///
    /// * `RateLimit-Policy: "default";q=Q;w=W`: the rate as `Q` requests
    ///   per `W` seconds, `W` the shortest whole number of seconds (at
    ///   least 1) in which a drained key gets its whole burst back, and `Q`
    ///   the requests the rate allows in `W`, or the burst if that is more.
    /// * `RateLimit: "default";r=R;t=T`: `R` requests would go now, one
    ///   after another ([`Snapshot::remaining`]; 0 on a refusal); `T`
    ///   seconds (rounded up) until the key is full again
    ///   ([`Snapshot::full_in`]).
    /// * `Retry-After` on a refusal: the wait, rounded up, at least 1.
    ///
    /// With several limits the snapshot, and so each header, is the limit
    /// that binds after the request (the fewest requests that would go now):
    /// `R` is exact, and the policy can change from one response to the next
    /// (`q=10;w=1` while the per-second limit binds, `q=5;w=60` once the
    /// per-minute one does), so a client that paces itself by the first
    /// policy it sees can be refused. For a warming-up limiter, `Q` is the
    /// stable rate's: a cold key grants less until it warms up.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use paceline::KeyedRateLimiter;
    /// use paceline::http::{ClientIp, ClientIpSource, PeerIp, RateLimitLayer, TrustedProxies};
    ///
    /// let limiter = Arc::new(
    ///     KeyedRateLimiter::<IpAddr>::builder()
    ///         .permits_per_second(10.0)
    ///         .max_burst(Duration::from_secs(1))
    ///         .build()?,
    /// );
    /// // The client's address, behind the load balancers at 10.0.0.0/8,
    /// // which append it to X-Forwarded-For (axum: `ConnectInfo<SocketAddr>`,
    /// // with `into_make_service_with_connect_info`).
    /// let key = ClientIp {
    ///     peer: PeerIp::from_extension(|peer: &SocketAddr| peer.ip()),
    ///     proxies: TrustedProxies::new(ClientIpSource::XForwardedFor, ["10.0.0.0/8"])?,
    /// };
    /// let layer = RateLimitLayer::new(limiter, key).policy_name("per-client");
    /// // axum: Router::new().route(..).layer(layer)
    /// # let _ = layer;
    /// # Ok::<(), paceline::Error>(())
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the response future (the client hung up) while it waits
    /// gives back the permit it waits for, as dropping
    /// [`try_acquire`](KeyedLimiter::try_acquire) does; once its wait is
    /// over (the inner service being made ready again, or called), the
    /// permit is used.
    pub fn new(limiter: L, extractor: X) -> Self {
        RateLimitLayer {
            limiter,
            extractor,
            config: Config {
                max_wait: Duration::ZERO,
                headers: Headers::Ietf,
                policy: Arc::new(PolicyName::new("\"default\"".into())),
                on_refused: EmptyBody,
            },
        }
    }
}

impl<L, X, H> RateLimitLayer<L, X, H> {
    /// Lets a request wait up to `max_wait` for its key's permit before
    /// it is refused. Default zero: refuse at once. A request that waits
    /// lets go of the inner service's readiness meanwhile (room that other
    /// clients' requests may need) and makes it ready again once its wait
    /// is over.
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.config.max_wait = max_wait;
        self
    }

    /// Which rate-limit headers every response carries. Default
    /// [`Headers::Ietf`].
    #[must_use]
    pub fn headers(mut self, headers: Headers) -> Self {
        self.config.headers = headers;
        self
    }

    /// The policy's name in the headers (default `default`). Characters
    /// a header cannot carry are replaced by `?`.
    #[must_use]
    pub fn policy_name(mut self, name: &str) -> Self {
        let mut quoted = String::with_capacity(name.len() + 2);
        quoted.push('"');
        for c in name.chars() {
            match c {
                '"' | '\\' => {
                    quoted.push('\\');
                    quoted.push(c);
                }
                ' '..='~' => quoted.push(c),
                _ => quoted.push('?'),
            }
        }
        quoted.push('"');
        self.config.policy = Arc::new(PolicyName::new(quoted.into()));
        self
    }

    /// Shapes the response to a refused request (a JSON body, a different
    /// status): a closure from [`Refused`] to a response. The layer adds
    /// `Retry-After` and the rate-limit headers unless it set them.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use std::sync::Arc;
    /// use http::{Response, StatusCode};
    /// use paceline::KeyedRateLimiter;
    /// use paceline::http::{PeerIp, RateLimitLayer, Refused};
    ///
    /// let limiter = Arc::new(KeyedRateLimiter::<IpAddr>::bursty(10.0)?);
    /// let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    /// let layer = RateLimitLayer::new(limiter, peer).on_refused(|refused: &Refused| {
    ///     let body = format!(r#"{{"error":"slow down","retry_ms":{}}}"#, refused.retry_after.as_millis());
    ///     Response::builder()
    ///         .status(StatusCode::TOO_MANY_REQUESTS)
    ///         .header("content-type", "application/json")
    ///         .body(body)
    ///         .unwrap()
    /// });
    /// # let _ = layer;
    /// # Ok::<(), paceline::Error>(())
    /// ```
    pub fn on_refused<G>(self, on_refused: G) -> RateLimitLayer<L, X, G> {
        let Config {
            max_wait,
            headers,
            policy,
            ..
        } = self.config;
        RateLimitLayer {
            limiter: self.limiter,
            extractor: self.extractor,
            config: Config {
                max_wait,
                headers,
                policy,
                on_refused,
            },
        }
    }
}

impl<S, L: Clone, X: Clone, H: Clone> Layer<S> for RateLimitLayer<L, X, H> {
    type Service = RateLimit<S, L, X, H>;

    fn layer(&self, inner: S) -> RateLimit<S, L, X, H> {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            extractor: self.extractor.clone(),
            config: self.config.clone(),
        }
    }
}

/// An HTTP service limited per key by a [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S, L, X, H = EmptyBody> {
    inner: S,
    limiter: L,
    extractor: X,
    config: Config<H>,
}

/// A response with only a status.
fn answer<R: Default>(status: StatusCode) -> Response<R> {
    let mut response = Response::new(R::default());
    *response.status_mut() = status;
    response
}

/// The headers a granted request's response gets once the inner service
/// answers: which, the policy's name, and the key's snapshot after the
/// grant (`None`: none).
#[derive(Debug)]
struct Pending(Option<(Headers, Arc<PolicyName>, Snapshot)>);

/// What adds a granted request's headers to its response.
type AddHeaders<R, E> = fn((Result<Response<R>, E>, Pending)) -> Result<Response<R>, E>;

/// Adds a granted request's headers to its response.
fn add_headers<R, E>(
    (result, Pending(pending)): (Result<Response<R>, E>, Pending),
) -> Result<Response<R>, E> {
    let mut response = result?;
    if let Some((kind, policy, snapshot)) = pending {
        write_headers(response.headers_mut(), kind, &policy, &snapshot, false);
    }
    Ok(response)
}

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's, with the
    /// headers added, when the limiter answered at once (a request with its
    /// permit free, or refused at once, on a limiter in this process); boxed
    /// otherwise (a wait, a Redis round trip).
    pub struct ResponseFuture<F, R, E>
    where
        F: Future,
    {
        #[pin]
        inner: Answered<F, R, E>,
    }
}

/// What a [`ResponseFuture`] holds: the inner service's future and the
/// headers to add, an answer at once, or a boxed wait.
type Answered<F, R, E> = Either<
    Map<Join<F, Ready<Pending>>, AddHeaders<R, E>>,
    Either<
        Ready<Result<Response<R>, E>>,
        Pin<Box<dyn Future<Output = Result<Response<R>, E>> + Send>>,
    >,
>;

impl<F, R, E> Future for ResponseFuture<F, R, E>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

impl<F: Future, R, E> std::fmt::Debug for ResponseFuture<F, R, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// An answer at once: `response`.
fn at_once<F: Future, R, E>(response: Response<R>) -> ResponseFuture<F, R, E> {
    let inner = Either::Right(Either::Left(future::ready(Ok(response))));
    ResponseFuture { inner }
}

/// A try of one permit of `key` with no wait, if `limiter` answers it at
/// once (one in this process does): whether it was granted.
fn tried_at_once<K: Sync, T: KeyedLimiter<K> + ?Sized>(limiter: &T, key: &K) -> Option<bool> {
    let mut tried = limiter.try_reserve(key, 1, Duration::ZERO);
    match tried.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(granted)) => Some(granted.is_some()),
        _ => None,
    }
}

/// The response to a refused request: the hook's, with `Retry-After` and
/// the headers added.
fn refusal<R, H: OnRefused<R>>(config: &Config<H>, snapshot: Snapshot) -> Response<R> {
    let refused = Refused {
        retry_after: snapshot.wait(),
        snapshot,
    };
    let mut response = config.on_refused.response(&refused);
    let headers = response.headers_mut();
    if !headers.contains_key(RETRY_AFTER) {
        let secs = retry_after_secs(refused.retry_after);
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    write_headers(
        headers,
        config.headers,
        &config.policy,
        &refused.snapshot,
        true,
    );
    response
}

impl<S, L, T, X, H, B, R> Service<Request<B>> for RateLimit<S, L, X, H>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
    L: Deref<Target = T> + Clone + Send + Sync + 'static,
    T: KeyedLimiter<X::Key> + ?Sized,
    X: KeyExtractor<B>,
    H: OnRefused<R>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, R, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(key) = self.extractor.key(&request) else {
            let response = answer(StatusCode::INTERNAL_SERVER_ERROR);
            return at_once(response);
        };
        let config = &self.config;
        // A limiter in this process answers at once: no future to box.
        let free = match self.limiter.take_now(&key, 1) {
            Some(Ok(true)) => Some(true),
            // Not free, and no wait allowed: asked again as the try it is,
            // so that the limiter counts the refusal (`take_now` counts a
            // grant only).
            Some(Ok(false)) if config.max_wait.is_zero() => tried_at_once(&*self.limiter, &key),
            _ => None,
        };
        match free {
            Some(true) => {
                let pending = match config.headers {
                    Headers::None => None,
                    kind => self
                        .limiter
                        .snapshot_now(&key)
                        .map(|snapshot| (kind, Arc::clone(&config.policy), snapshot)),
                };
                let answered =
                    future::join(self.inner.call(request), future::ready(Pending(pending)));
                let add: AddHeaders<R, S::Error> = add_headers;
                let inner = Either::Left(answered.map(add));
                return ResponseFuture { inner };
            }
            Some(false) => {
                if let Some(snapshot) = self.limiter.snapshot_now(&key) {
                    let response = refusal(config, snapshot);
                    return at_once(response);
                }
            }
            _ => {}
        }
        let ready = take_ready(&mut self.inner);
        let (limiter, config) = (self.limiter.clone(), self.config.clone());
        let waits = Box::pin(async move {
            match limiter.try_reservation(&key, 1, config.max_wait).await {
                Ok(Some(reservation)) => {
                    // One that waits lets go of the inner service's
                    // readiness meanwhile (room that other clients' requests
                    // may need: a concurrency limit's slot, a buffer's
                    // place), and makes a fresh clone ready after.
                    let waits = !reservation.delay().is_zero();
                    let mut inner = ready;
                    if waits {
                        // (The ready one drops as its clone replaces it.)
                        inner = inner.clone();
                    }
                    // What the limiter's answer to this request said (one
                    // round trip through Redis), as of its answer after its
                    // wait; or else a read of its own once the wait is
                    // over, which counts the requests of the key reserved
                    // meanwhile (queued behind it: read before the wait and
                    // aged, `t` missed them).
                    let replied = reservation.snapshot();
                    let waited = reservation.wait().await;
                    let snapshot = match (config.headers, replied) {
                        (Headers::None, _) => None,
                        (_, Some(after)) if waited.is_zero() => Some(after),
                        (_, Some(after)) => Some(after.aged(waited)),
                        _ => limiter.snapshot(&key).await.ok(),
                    };
                    let pending = snapshot.map(|after| (config.headers, config.policy, after));
                    if waits && let Err(error) = poll_fn(|cx| inner.poll_ready(cx)).await {
                        return Err(error);
                    }
                    add_headers((inner.call(request).await, Pending(pending)))
                }
                Ok(None) => match limiter.snapshot(&key).await {
                    Ok(snapshot) => Ok(refusal(&config, snapshot)),
                    Err(_) => Ok(answer(StatusCode::SERVICE_UNAVAILABLE)),
                },
                Err(_) => Ok(answer(StatusCode::SERVICE_UNAVAILABLE)),
            }
        });
        let inner = Either::Right(Either::Right(
            waits as Pin<Box<dyn Future<Output = _> + Send>>,
        ));
        ResponseFuture { inner }
    }
}
