//! Rate limiting for tower services: [`RateLimitLayer`].
//!
//! Every clone of a layered service shares one limiter (an `Arc` of any
//! [`Limiter`], local or through Redis), so a service stack that clones its
//! services, as buffers and balancers do, still limits them together. Every
//! service here is `Clone + Send + Sync` with a `Send` response future, as
//! axum's `Router::layer` and `route_layer` and tonic ask: no buffer is
//! needed in front.
//!
//! - **Waiting** ([`RateLimitLayer::new`]): `poll_ready` acquires one
//!   permit as the limiter's `acquire` does (behind a pause learned from
//!   an upstream meanwhile too) and is ready once it is due; `call` uses
//!   it. A service dropped while it waits for its permit gives it back;
//!   once the permit is due it counts as used, even if the service is
//!   dropped before `call`.
//! - **Bounded** ([`RateLimitLayer::max_wait`]): as above, but a request
//!   that would wait longer than the bound is refused with [`Throttled`]
//!   (with `Duration::ZERO`, whenever no permit is free now). `poll_ready`
//!   is ready with the refusal, which `call` returns; a refusal reserves
//!   nothing, so a service polled again before `call` looks afresh. (One
//!   refused after it waited, woken inside a pause learned meanwhile that
//!   the rest of the bound does not cover, leaves what it reserved before
//!   the pause spent, as `try_acquire` does.)
//! - **Keyed** ([`RateLimitLayer::keyed`]): one rate per key, the key taken
//!   from each request; the wait happens in the response future, before the
//!   inner service is called, bounded per key by
//!   [`max_wait`](KeyedRateLimitLayer::max_wait). A request that waits lets
//!   go of the inner service's readiness (room that other keys' requests
//!   may need) and makes it ready again once its wait is over.
//!
//! ```
//! use std::sync::{Arc, Mutex, PoisonError};
//! use std::time::Duration;
//! use paceline::RateLimiter;
//! use paceline::tower::RateLimitLayer;
//! use tower_layer::Layer;
//! use tower_service::Service;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let limiter = Arc::new(RateLimiter::bursty(100.0)?);
//! let echo = tower_service_fn(|request: u32| async move { Ok::<_, std::io::Error>(request) });
//! let mut service = RateLimitLayer::new(limiter).layer(echo);
//! std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
//! assert_eq!(service.call(7).await?, 7);
//! # Ok(()) }
//! # // A minimal service from a function, for the example.
//! # fn tower_service_fn<F, Fut, Req, Res, E>(f: F) -> ServiceFn<F> where F: FnMut(Req) -> Fut, Fut: std::future::Future<Output = Result<Res, E>> { ServiceFn(f) }
//! # struct ServiceFn<F>(F);
//! # impl<F, Fut, Req, Res, E> Service<Req> for ServiceFn<F> where F: FnMut(Req) -> Fut, Fut: std::future::Future<Output = Result<Res, E>> {
//! #     type Response = Res; type Error = E; type Future = Fut;
//! #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), E>> { std::task::Poll::Ready(Ok(())) }
//! #     fn call(&mut self, request: Req) -> Fut { (self.0)(request) }
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{Either, MapErr, Ready, TryFutureExt, ready};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Error, KeyedLimiter, Limiter};

/// The error type of a rate-limited service: the inner service's error, a
/// limiter's [`Error`], or [`Throttled`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request refused, at once, because its wait would exceed the layer's
/// [`max_wait`](RateLimitLayer::max_wait); the inner service is not called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Throttled {
    /// How long until a permit is free (for a `Retry-After` header).
    pub retry_after: Duration,
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate limited: retry after {:?}", self.retry_after)
    }
}

impl std::error::Error for Throttled {}

/// A layer that rate-limits the services it wraps; see the
/// [module docs](self).
#[derive(Clone, Debug)]
pub struct RateLimitLayer<L> {
    limiter: L,
    /// The longest wait for a permit before refusing with [`Throttled`]
    /// (`None`: no bound; zero: the rejecting mode).
    max_wait: Option<Duration>,
}

impl<L> RateLimitLayer<L> {
    /// Waits for a permit in `poll_ready` (see the [module docs](self)).
    /// `limiter` is an `Arc` of any [`Limiter`] (or anything cloneable
    /// that derefs to one).
    pub fn new(limiter: L) -> Self {
        RateLimitLayer {
            limiter,
            max_wait: None,
        }
    }

    /// Waits at most `max_wait` for a permit: a request that would wait
    /// longer reserves nothing and fails at once with [`Throttled`] (the
    /// wait it would have needed); zero refuses unless a permit is free now.
    /// E.g. `.max_wait(Duration::from_millis(50))`.
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// One rate per key: `key_of` gives each request's key, and the wait
    /// happens in the response future.
    pub fn keyed<F>(limiter: L, key_of: F) -> KeyedRateLimitLayer<L, F> {
        KeyedRateLimitLayer {
            limiter,
            key_of,
            max_wait: None,
        }
    }
}

impl<S, L: Clone> Layer<S> for RateLimitLayer<L> {
    type Service = RateLimit<S, L>;

    fn layer(&self, inner: S) -> RateLimit<S, L> {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            max_wait: self.max_wait,
            permit: Permit::None,
        }
    }
}

/// The permit a service holds between `poll_ready` and `call`.
enum Permit {
    /// None yet: `poll_ready` starts reserving one.
    None,
    /// Taken and due (free now, or waited for): nothing to wait for or
    /// give back.
    Free,
    /// Waiting for it: a [`Waiting`] future.
    Pending(Waiting),
    /// Refused (rejecting mode): `call` fails with this.
    Refused(Duration),
    /// The limiter failed: `call` fails with this.
    Failed(Error),
}

/// A permit being acquired, owned by a service: `None` once it is due,
/// `Some(wait)` once refused (rejecting mode), an error if the limiter
/// failed. In a mutex only so that the service is `Sync` (axum's `.layer`
/// requires it): it is only ever reached through `&mut`, with `get_mut`,
/// which takes no lock. Dropped before it completes, it gives the permit
/// back (the limiter's `acquire` is cancel-safe).
type Waiting = Mutex<Pin<Box<dyn Future<Output = Result<Option<Duration>, Error>> + Send>>>;

/// Acquires one permit on `limiter` (only if due within `max_wait`, when
/// there is one): as the limiter's own `acquire`, so that a pause learned
/// from an upstream while it waits is waited for too.
fn acquire<L>(limiter: L, max_wait: Option<Duration>) -> Waiting
where
    L: Deref<Target: Limiter> + Send + 'static,
{
    Mutex::new(Box::pin(async move {
        match max_wait {
            None => drop(limiter.acquire(1).await?),
            Some(max_wait) => {
                if !limiter.try_acquire(1, max_wait).await? {
                    return Ok(Some(limiter.snapshot().await?.wait()));
                }
            }
        }
        Ok(None)
    }))
}

/// A service rate-limited by a [`RateLimitLayer`]. Clones share the
/// limiter; each holds its own permit between `poll_ready` and `call`.
pub struct RateLimit<S, L> {
    inner: S,
    limiter: L,
    max_wait: Option<Duration>,
    permit: Permit,
}

impl<S: Clone, L: Clone> Clone for RateLimit<S, L> {
    /// A clone starts without a permit (readiness is not cloned).
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            max_wait: self.max_wait,
            permit: Permit::None,
        }
    }
}

impl<S: fmt::Debug, L> fmt::Debug for RateLimit<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's, with its
    /// error boxed, or an error at once (a refusal, a limiter's failure).
    pub struct ResponseFuture<F, R, E> {
        #[pin]
        inner: Either<MapErr<F, fn(E) -> BoxError>, Ready<Result<R, BoxError>>>,
    }
}

impl<F, R, E> Future for ResponseFuture<F, R, E>
where
    F: Future<Output = Result<R, E>>,
{
    type Output = Result<R, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

impl<F, R, E> fmt::Debug for ResponseFuture<F, R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, L, Req> Service<Req> for RateLimit<S, L>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    L: Deref<Target: Limiter> + Clone + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // A refusal or a failure an earlier poll found reserved nothing:
        // polled again before `call`, the service looks afresh (the wait may
        // have passed since).
        if let Permit::Refused(_) | Permit::Failed(_) = self.permit {
            self.permit = Permit::None;
        }
        loop {
            match &mut self.permit {
                // Nothing owed: no reservation to hold, no future.
                Permit::None => {
                    self.permit = match self.limiter.take_now(1) {
                        Some(Ok(true)) => Permit::Free,
                        Some(Err(error)) => Permit::Failed(error),
                        Some(Ok(false)) | None => {
                            Permit::Pending(acquire(self.limiter.clone(), self.max_wait))
                        }
                    };
                }
                Permit::Pending(waiting) => {
                    let future = waiting.get_mut().unwrap_or_else(PoisonError::into_inner);
                    self.permit = match future.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(None)) => Permit::Free,
                        Poll::Ready(Ok(Some(retry_after))) => Permit::Refused(retry_after),
                        Poll::Ready(Err(error)) => Permit::Failed(error),
                    };
                }
                // The permit is free or due: the inner service must be ready
                // too.
                Permit::Free => return self.inner.poll_ready(cx).map_err(Into::into),
                // A refusal or a failure is the answer `call` gives.
                Permit::Refused(_) | Permit::Failed(_) => return Poll::Ready(Ok(())),
            }
        }
    }

    fn call(&mut self, request: Req) -> Self::Future {
        match std::mem::replace(&mut self.permit, Permit::None) {
            Permit::Free => {}
            Permit::Refused(retry_after) => {
                let inner = Either::Right(ready(Err(Throttled { retry_after }.into())));
                return ResponseFuture { inner };
            }
            Permit::Failed(error) => {
                let inner = Either::Right(ready(Err(error.into())));
                return ResponseFuture { inner };
            }
            _ => panic!("RateLimit::call before poll_ready returned Ready"),
        }
        let boxed = Into::<BoxError>::into as fn(S::Error) -> BoxError;
        let inner = Either::Left(self.inner.call(request).map_err(boxed));
        ResponseFuture { inner }
    }
}

/// The service made ready, to go with a request into its response future;
/// a fresh clone, to be made ready again, takes its place.
pub(crate) fn take_ready<S: Clone>(service: &mut S) -> S {
    let clone = service.clone();
    std::mem::replace(service, clone)
}

/// A layer with one rate per key; see [`RateLimitLayer::keyed`].
#[derive(Clone, Debug)]
pub struct KeyedRateLimitLayer<L, F> {
    limiter: L,
    key_of: F,
    max_wait: Option<Duration>,
}

impl<L, F> KeyedRateLimitLayer<L, F> {
    /// As [`RateLimitLayer::max_wait`], for the request's key.
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }
}

impl<S, L: Clone, F: Clone> Layer<S> for KeyedRateLimitLayer<L, F> {
    type Service = KeyedRateLimit<S, L, F>;

    fn layer(&self, inner: S) -> KeyedRateLimit<S, L, F> {
        KeyedRateLimit {
            inner,
            limiter: self.limiter.clone(),
            key_of: self.key_of.clone(),
            max_wait: self.max_wait,
        }
    }
}

/// A service rate-limited per key by a [`KeyedRateLimitLayer`] (see
/// [`RateLimitLayer::keyed`]).
#[derive(Clone, Debug)]
pub struct KeyedRateLimit<S, L, F> {
    inner: S,
    limiter: L,
    key_of: F,
    max_wait: Option<Duration>,
}

impl<S, L, F, K, Req> Service<Req> for KeyedRateLimit<S, L, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    Req: Send + 'static,
    L: Deref<Target: KeyedLimiter<K>> + Clone + Send + 'static,
    K: Send + Sync + 'static,
    F: Fn(&Req) -> K,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let key = (self.key_of)(&request);
        let ready = take_ready(&mut self.inner);
        // Free now (a limiter in this process answers at once): the service
        // made ready takes it.
        if let Some(Ok(true)) = self.limiter.take_now(&key, 1) {
            let mut ready = ready;
            return Box::pin(ready.call(request).map_err(Into::into));
        }
        // Otherwise it waits without the inner service's readiness, which
        // may be room that requests of other keys need (a concurrency
        // limit's slot, a buffer's place): a fresh clone is made ready once
        // the wait is over.
        let mut inner = ready.clone();
        drop(ready);
        let (limiter, max_wait) = (self.limiter.clone(), self.max_wait);
        Box::pin(async move {
            match max_wait {
                None => {
                    limiter.acquire(&key, 1).await?;
                }
                Some(max_wait) => {
                    if !limiter.try_acquire(&key, 1, max_wait).await? {
                        let retry_after = limiter.snapshot(&key).await?.wait();
                        return Err(Box::new(Throttled { retry_after }) as BoxError);
                    }
                }
            }
            std::future::poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            inner.call(request).await.map_err(Into::into)
        })
    }
}
