//! The HTTP layer in process, on the fake clock: per-client 429s with
//! `Retry-After`, keys that forged headers cannot choose, a bounded wait,
//! and the answers for a request with no key and for a limiter whose
//! backend fails.

#![cfg(feature = "http")]

use std::convert::Infallible;
use std::future::poll_fn;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::common::{Room, manual, noop, on, poll_once};
use crate::tower::{Stopped, keyed_limiter, keyed_stopped};
use ::http::{Request, Response, StatusCode};
use async_trait::async_trait;
use paceline::Local;
use paceline::clock::{Clock, FakeClock};
use paceline::http::{
    ClientIp, ClientIpSource, Global, Header, Headers, PeerIp, RateLimitLayer, Refused,
    TrustedProxies,
};
use paceline::outbound::OutboundLayer;
use paceline::{BackendError, Error, KeyedLimiter, KeyedRateLimiter};
use tower_layer::Layer;
use tower_service::Service;

mod client_ip;
mod documented;
mod forged_at_random;
mod hostile_clients;
mod hostile_headers;
mod layer_promises;

/// An HTTP service that answers 200 at once and counts its calls.
#[derive(Clone, Default)]
struct Ok200(Arc<AtomicU32>);

impl Service<Request<()>> for Ok200 {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        self.0.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(Response::new("ok".to_owned())))
    }
}

/// A request from `peer` (as a server stores the peer's address) with
/// `headers`.
fn from(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut request = Request::new(());
    let peer: SocketAddr = format!("{peer}:40000").parse().unwrap();
    request.extensions_mut().insert(peer);
    for (name, value) in headers {
        request.headers_mut().append(
            ::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    request
}

async fn send<S: Service<Request<()>, Response = Response<String>>>(
    service: &mut S,
    request: Request<()>,
) -> Response<String>
where
    S::Error: std::fmt::Debug,
{
    poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
    service.call(request).await.unwrap()
}

fn retry_after(response: &Response<String>) -> Option<&str> {
    response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap())
}

#[tokio::test(flavor = "current_thread")]
async fn each_client_gets_its_own_rate_and_forged_headers_change_nothing() {
    let clock = FakeClock::new();
    let inner = Ok200::default();
    let client_ip = ClientIp {
        peer: PeerIp::from_extension(|peer: &SocketAddr| peer.ip()),
        proxies: TrustedProxies::new(ClientIpSource::XForwardedFor, ["10.0.0.0/8"]).unwrap(),
    };
    let mut service =
        RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), client_ip).layer(inner.clone());
    // A direct client: its first request goes, its second is refused with
    // Retry-After rounded up (100 ms: 1 s).
    let direct = send(&mut service, from("198.51.100.1", &[])).await;
    assert_eq!(direct.status(), StatusCode::OK);
    let refused = send(&mut service, from("198.51.100.1", &[])).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some("1"));
    // Forging X-Forwarded-For from outside the proxies does not make a new key.
    let forged = from("198.51.100.1", &[("x-forwarded-for", "7.7.7.7")]);
    assert_eq!(
        send(&mut service, forged).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Through a trusted proxy: the client it reports is the key, and what
    // the client wrote to its left is ignored.
    let proxied = from("10.0.0.5", &[("x-forwarded-for", "203.0.113.7")]);
    assert_eq!(send(&mut service, proxied).await.status(), StatusCode::OK);
    let again = from("10.0.0.5", &[("x-forwarded-for", "6.6.6.6, 203.0.113.7")]);
    assert_eq!(
        send(&mut service, again).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // The inner service saw the two granted requests only, and nobody waited.
    assert_eq!(inner.0.load(Ordering::Relaxed), 2);
    assert_eq!(clock.now(), Duration::ZERO);
    // A refusal reserved nothing: once the interval passes, it goes.
    clock.advance(Duration::from_millis(100));
    let later = send(&mut service, from("198.51.100.1", &[])).await;
    assert_eq!(later.status(), StatusCode::OK);
}

/// Through a proxy that appends the peer it saw to `X-Forwarded-For` and
/// passes `Forwarded` on as the client sent it (nginx, HAProxy, the cloud
/// load balancers), played here by the peer 127.0.0.1: a client that sends
/// a new `Forwarded` each time is still one key. Of 50 sent at once at 1 a
/// second with a burst of 2, 3 go through.
#[tokio::test(flavor = "current_thread")]
async fn a_forwarded_header_the_proxy_passes_on_changes_nothing() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<IpAddr, _>::builder()
            .permits_per_second(1.0)
            .max_burst(Duration::from_secs(2))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let client_ip = ClientIp {
        peer: PeerIp::from_extension(|peer: &SocketAddr| peer.ip()),
        proxies: TrustedProxies::new(ClientIpSource::XForwardedFor, ["127.0.0.1"]).unwrap(),
    };
    let inner = Ok200::default();
    let mut service = RateLimitLayer::new(limiter, client_ip).layer(inner.clone());
    let mut through = 0;
    for i in 0..50 {
        let spoofed = format!("for=9.9.{}.{}", i / 256, i % 256);
        let request = from(
            "127.0.0.1",
            &[("forwarded", &spoofed), ("x-forwarded-for", "203.0.113.7")],
        );
        if send(&mut service, request).await.status() == StatusCode::OK {
            through += 1;
        }
    }
    assert_eq!(through, 3, "{through} of 50 through");
    assert_eq!(inner.0.load(Ordering::Relaxed), 3);
    // Another client through the same proxy has its own key.
    let other = from("127.0.0.1", &[("x-forwarded-for", "203.0.113.8")]);
    assert_eq!(send(&mut service, other).await.status(), StatusCode::OK);
}

/// A limiter written outside the crate, in front of a quota store that can
/// go down: while it is up, the keys' rates are a local limiter's; while
/// it is down, every call fails as the backend's failure.
struct QuotaStore {
    rates: KeyedRateLimiter<IpAddr, Local, FakeClock>,
    down: std::sync::atomic::AtomicBool,
}

impl QuotaStore {
    fn check(&self) -> Result<(), Error> {
        if self.down.load(Ordering::Relaxed) {
            let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
            let failure = BackendError::new("cannot reach the quota store").with_source(refused);
            return Err(Error::Backend(failure));
        }
        Ok(())
    }
}

#[async_trait]
impl KeyedLimiter<IpAddr> for QuotaStore {
    async fn reserve(&self, key: &IpAddr, permits: u32) -> Result<Duration, Error> {
        self.check()?;
        KeyedLimiter::reserve(&self.rates, key, permits).await
    }

    async fn try_reserve(
        &self,
        key: &IpAddr,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        self.check()?;
        KeyedLimiter::try_reserve(&self.rates, key, permits, timeout).await
    }

    async fn snapshot(&self, key: &IpAddr) -> Result<paceline::Snapshot, Error> {
        self.check()?;
        KeyedLimiter::snapshot(&self.rates, key).await
    }

    fn set_rate(&self, permits_per_second: f64) -> Result<(), Error> {
        KeyedLimiter::set_rate(&self.rates, permits_per_second)
    }

    fn rate(&self) -> f64 {
        KeyedLimiter::rate(&self.rates)
    }

    fn clock(&self) -> &dyn Clock {
        KeyedLimiter::clock(&self.rates)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_limiter_of_our_own_reports_its_backend_down_as_503() {
    let clock = FakeClock::new();
    let store = Arc::new(QuotaStore {
        rates: KeyedRateLimiter::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
        down: Default::default(),
    });
    // The error it fails with is the backend's, with its cause.
    store.down.store(true, Ordering::Relaxed);
    let key: IpAddr = "192.0.2.1".parse().unwrap();
    match store.reserve(&key, 1).await {
        Err(Error::Backend(failure)) => {
            assert!(!failure.is_timeout());
            assert!(std::error::Error::source(&failure).is_some());
            assert_eq!(
                failure.to_string(),
                "cannot reach the quota store: connection refused"
            );
        }
        other => panic!("{other:?}"),
    }
    store.down.store(false, Ordering::Relaxed);
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let inner = Ok200::default();
    let mut service = RateLimitLayer::new(Arc::clone(&store), peer).layer(inner.clone());
    let client = || from("192.0.2.1", &[]);
    // Up: the rate holds.
    assert_eq!(send(&mut service, client()).await.status(), StatusCode::OK);
    let refused = send(&mut service, client()).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Down: 503, the inner service not called, nothing reserved.
    store.down.store(true, Ordering::Relaxed);
    clock.advance(Duration::from_millis(100));
    let failed = send(&mut service, client()).await;
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after(&failed), None);
    assert_eq!(inner.0.load(Ordering::Relaxed), 1);
    // Up again: the permit that came back meanwhile goes.
    store.down.store(false, Ordering::Relaxed);
    assert_eq!(send(&mut service, client()).await.status(), StatusCode::OK);
    assert_eq!(inner.0.load(Ordering::Relaxed), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn a_bounded_wait_waits_within_it_and_refuses_past_it() {
    let clock = FakeClock::new();
    let limiter = keyed_limiter::<IpAddr>(&clock);
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let layer =
        RateLimitLayer::new(Arc::clone(&limiter), peer).max_wait(Duration::from_millis(150));
    let mut service = layer.layer(Ok200::default());
    let client = || from("192.0.2.1", &[]);
    for _ in 0..2 {
        assert_eq!(send(&mut service, client()).await.status(), StatusCode::OK);
    }
    // The second waited its 100 ms.
    assert_eq!(clock.now(), Duration::from_millis(100));
    // Another caller of the key takes the next permit: the next request
    // would wait 200 ms, past the bound: refused, reserving nothing.
    limiter.reserve(&"192.0.2.1".parse().unwrap(), 1).unwrap();
    let refused = send(&mut service, client()).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some("1"));
    assert_eq!(clock.now(), Duration::from_millis(100));
    // 60 ms later it would wait 140 ms: within the bound, it waits.
    clock.advance(Duration::from_millis(60));
    assert_eq!(send(&mut service, client()).await.status(), StatusCode::OK);
    assert_eq!(clock.now(), Duration::from_millis(300));
}

/// With a bounded wait, a response future dropped while its request waits
/// gives the request's permit back, and the inner service is not called.
#[tokio::test(flavor = "current_thread")]
async fn a_request_dropped_while_it_waits_gives_its_permit_back() {
    let limiter = keyed_stopped::<()>();
    let inner = Ok200::default();
    let mut service = RateLimitLayer::new(Arc::clone(&limiter), Global)
        .max_wait(Duration::from_secs(1))
        .layer(inner.clone());
    let client = || from("192.0.2.1", &[]);
    assert_eq!(send(&mut service, client()).await.status(), StatusCode::OK);
    poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
    {
        let mut waiting = std::pin::pin!(service.call(client()));
        let waker = std::task::Waker::noop();
        let polled = waiting.as_mut().poll(&mut Context::from_waker(waker));
        assert!(polled.is_pending());
        assert_eq!(
            limiter.snapshot(&()).unwrap().wait(),
            Duration::from_millis(200)
        );
    }
    assert_eq!(
        limiter.snapshot(&()).unwrap().wait(),
        Duration::from_millis(100)
    );
    assert_eq!(inner.0.load(Ordering::Relaxed), 1);
}

/// An HTTP service with room for one request at a time (see [`Room`]).
#[derive(Clone)]
struct OneAtATime(Room);

impl Service<Request<()>> for OneAtATime {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_take()
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        self.0.used();
        std::future::ready(Ok(Response::new("ok".to_owned())))
    }
}

/// Sends `request` through a clone of `service` made ready (then dropped,
/// as a router drops it) and polls the call once: it must wait. Returns
/// the waiting call.
fn a_waiting_call<S>(service: &S, request: Request<()>) -> S::Future
where
    S: Service<Request<()>> + Clone,
    S::Future: Unpin,
    S::Error: std::fmt::Debug,
{
    let mut clone = service.clone();
    assert!(matches!(clone.poll_ready(&mut noop()), Poll::Ready(Ok(()))));
    let mut waiting = clone.call(request);
    assert!(poll_once(std::pin::Pin::new(&mut waiting)).is_pending());
    waiting
}

/// Whether `service` (a fresh clone) is ready at once.
fn has_room<S: Service<Request<()>>>(service: &mut S) -> bool {
    matches!(service.poll_ready(&mut noop()), Poll::Ready(Ok(())))
}

/// A request that waits for its client's permit does not hold the inner
/// service's room meanwhile: another client's request, free now, goes at
/// once (each request through a fresh clone, as a router sends it); and
/// once its wait is over the request makes the inner service ready and is
/// answered.
#[tokio::test(flavor = "current_thread")]
async fn a_request_waiting_for_its_client_holds_no_room_of_the_inner_service() {
    let stopped = keyed_stopped::<IpAddr>();
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let inner = OneAtATime(Room::new());
    let service = RateLimitLayer::new(stopped, peer.clone())
        .max_wait(Duration::from_secs(1))
        .layer(inner.clone());
    let first = send(&mut service.clone(), from("192.0.2.1", &[])).await;
    assert_eq!(first.status(), StatusCode::OK);
    // The client's second request waits (for ever, on this clock).
    let _waiting = a_waiting_call(&service, from("192.0.2.1", &[]));
    let mut other = service.clone();
    assert!(
        has_room(&mut other),
        "another client's request waits for the inner service's room"
    );
    let answer = other.call(from("192.0.2.2", &[])).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    // On a clock that passes, a request that waited is answered.
    let clock = FakeClock::new();
    let service = RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer)
        .max_wait(Duration::from_secs(1))
        .layer(inner);
    for _ in 0..3 {
        let answer = send(&mut service.clone(), from("192.0.2.1", &[])).await;
        assert_eq!(answer.status(), StatusCode::OK);
    }
    assert_eq!(clock.now(), Duration::from_millis(200));
}

/// The outbound layer: a call that waits for its turn does not hold the
/// inner client's room meanwhile (room that other users of the client may
/// need, as a concurrency limit's slot), and makes the client ready once
/// its wait is over.
#[tokio::test(flavor = "current_thread")]
async fn an_outbound_call_waiting_for_its_turn_holds_no_room_of_the_inner_client() {
    let inner = OneAtATime(Room::new());
    let (stopped, _) = on(10.0, Stopped::default());
    let service = OutboundLayer::new(stopped).layer(inner.clone());
    let first = send(&mut service.clone(), from("192.0.2.1", &[])).await;
    assert_eq!(first.status(), StatusCode::OK);
    // The second call waits (for ever, on this clock).
    let _waiting = a_waiting_call(&service, from("192.0.2.1", &[]));
    // The client, used without the layer, has room.
    let mut unpaced = inner.clone();
    assert!(
        has_room(&mut unpaced),
        "a call waiting for its turn holds the inner client's room"
    );
    assert_eq!(
        unpaced.call(from("192.0.2.2", &[])).await.unwrap().status(),
        StatusCode::OK
    );
    // On a clock that passes, a call that waited makes the client ready
    // and is answered.
    let (limiter, clock) = on(10.0, FakeClock::new());
    let service = OutboundLayer::new(limiter).layer(inner);
    for _ in 0..3 {
        let answer = send(&mut service.clone(), from("192.0.2.1", &[])).await;
        assert_eq!(answer.status(), StatusCode::OK);
    }
    assert_eq!(clock.now(), Duration::from_millis(200));
}

/// An outbound call whose turn has come, dropped while the client it let
/// go of is made ready again, was never sent: it costs nothing, and the
/// limiter reads as a twin's that never made it.
#[tokio::test(flavor = "current_thread")]
async fn an_outbound_call_dropped_before_it_is_sent_costs_nothing() {
    let (limiter, clock) = manual(10.0);
    let (twin, twin_clock) = manual(10.0);
    let client = OneAtATime(Room::new());
    let paced = OutboundLayer::new(Arc::clone(&limiter)).layer(client.clone());
    send(&mut paced.clone(), from("192.0.2.1", &[])).await;
    twin.reserve(1).unwrap();
    let mut waiting = a_waiting_call(&paced, from("192.0.2.1", &[]));
    // Its turn comes while another user of the client holds its room.
    let mut other = client.clone();
    assert!(has_room(&mut other));
    for clock in [&clock, &twin_clock] {
        clock.advance(Duration::from_millis(100));
    }
    assert!(poll_once(waiting.as_mut()).is_pending());
    drop(waiting);
    assert_eq!(limiter.snapshot().unwrap(), twin.snapshot().unwrap());
    assert_eq!(limiter.reserve(1).unwrap(), twin.reserve(1).unwrap());
}

#[tokio::test(flavor = "current_thread")]
async fn header_global_and_missing_keys() {
    let clock = FakeClock::new();
    let by_header = Header(::http::HeaderName::from_static("x-api-key"));
    let mut service =
        RateLimitLayer::new(keyed_limiter::<String>(&clock), by_header).layer(Ok200::default());
    let with = |key: &str| from("192.0.2.1", &[("x-api-key", key)]);
    assert_eq!(send(&mut service, with("a")).await.status(), StatusCode::OK);
    assert_eq!(send(&mut service, with("b")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&mut service, with("a")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Requests without the header share one key.
    assert_eq!(
        send(&mut service, from("192.0.2.1", &[])).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&mut service, from("192.0.2.2", &[])).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // One key for all.
    let mut global =
        RateLimitLayer::new(keyed_limiter::<()>(&clock), Global).layer(Ok200::default());
    assert_eq!(
        send(&mut global, from("192.0.2.1", &[])).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&mut global, from("192.0.2.2", &[])).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // No peer address where the extractor looks: a server error, not a
    // request let through unlimited.
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let inner = Ok200::default();
    let mut service =
        RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer).layer(inner.clone());
    let response = send(&mut service, Request::new(())).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(inner.0.load(Ordering::Relaxed), 0);
}

/// What axum's `Router::layer` asks of the layered service.
#[test]
fn the_service_fits_a_router() {
    fn fits<S>(_: &S)
    where
        S: Service<Request<()>> + Clone + Send + Sync + 'static,
        S::Future: Send + 'static,
    {
    }
    let clock = FakeClock::new();
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    fits(&RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer).layer(Ok200::default()));
}

fn header<'a>(response: &'a Response<String>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test(flavor = "current_thread")]
async fn every_response_says_what_remains() {
    let clock = FakeClock::new();
    // 10 per second with a burst of 5: a new key lets 6 through at once.
    let limiter = Arc::new(
        KeyedRateLimiter::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::from_millis(500))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let mut service = RateLimitLayer::new(limiter, peer)
        .headers(Headers::IetfAndLegacy)
        .layer(Ok200::default());
    let client = || from("192.0.2.1", &[]);
    for remaining in (0..6).rev() {
        let response = send(&mut service, client()).await;
        assert_eq!(response.status(), StatusCode::OK);
        // 6 at once refill in 600 ms: 10 per whole second.
        assert_eq!(
            header(&response, "ratelimit-policy"),
            Some("\"default\";q=10;w=1")
        );
        // Full again once the burst is back: 1 s rounded up.
        let expected = format!("\"default\";r={remaining};t=1");
        assert_eq!(header(&response, "ratelimit"), Some(expected.as_str()));
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("10"));
        assert_eq!(
            header(&response, "x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        assert_eq!(header(&response, "x-ratelimit-reset"), Some("1"));
        assert_eq!(retry_after(&response), None);
    }
    let refused = send(&mut service, client()).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some("1"));
    assert_eq!(header(&refused, "ratelimit"), Some("\"default\";r=0;t=1"));
    // 250 ms later two have come back.
    clock.advance(Duration::from_millis(250));
    let response = send(&mut service, client()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "ratelimit"), Some("\"default\";r=1;t=1"));
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_rate_reads_over_a_longer_window() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::builder()
            .permits_per_second(0.25)
            .max_burst(Duration::from_secs(8))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(limiter, Global)
        .policy_name("per \"minute\"\n")
        .headers(Headers::Ietf)
        .layer(Ok200::default());
    let response = send(&mut service, Request::new(())).await;
    // A burst of 3 (two stored, one more), back in 12 s: 3 per 12 s.
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some(r#""per \"minute\"?";q=3;w=12"#)
    );
    assert_eq!(
        header(&response, "ratelimit"),
        Some(r#""per \"minute\"?";r=2;t=4"#)
    );
    assert_eq!(header(&response, "x-ratelimit-limit"), None);
}

#[tokio::test(flavor = "current_thread")]
async fn a_hook_shapes_the_refusal_and_the_layer_adds_what_it_left_out() {
    let clock = FakeClock::new();
    let layer =
        RateLimitLayer::new(keyed_limiter::<()>(&clock), Global).on_refused(|refused: &Refused| {
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .header("content-type", "application/json")
                .body(format!(
                    r#"{{"retry_ms":{},"remaining":{}}}"#,
                    refused.retry_after.as_millis(),
                    refused.snapshot.remaining()
                ))
                .unwrap()
        });
    let mut service = layer.layer(Ok200::default());
    assert_eq!(
        send(&mut service, Request::new(())).await.status(),
        StatusCode::OK
    );
    let refused = send(&mut service, Request::new(())).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body(), r#"{"retry_ms":100,"remaining":0}"#);
    assert_eq!(header(&refused, "content-type"), Some("application/json"));
    assert_eq!(retry_after(&refused), Some("1"));
    assert_eq!(header(&refused, "ratelimit"), Some("\"default\";r=0;t=1"));
    // Headers off: a refusal still says when to retry, nothing else.
    let mut quiet = RateLimitLayer::new(keyed_limiter::<()>(&clock), Global)
        .headers(Headers::None)
        .layer(Ok200::default());
    let granted = send(&mut quiet, Request::new(())).await;
    assert_eq!(header(&granted, "ratelimit"), None);
    let refused = send(&mut quiet, Request::new(())).await;
    assert_eq!(retry_after(&refused), Some("1"));
    assert_eq!(header(&refused, "ratelimit-policy"), None);
}

/// At 5 per second with a burst of 10, a client gets 10 at once, and the
/// policy header says 10 (its burst, refilled in 2 s: 10 per 2 s).
#[tokio::test(flavor = "current_thread")]
async fn a_burst_of_n_lets_n_through_and_the_policy_says_n() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::builder()
            .limit(paceline::Limit::per_second(5.0).burst(10))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let inner = Ok200::default();
    let mut service = RateLimitLayer::new(limiter, peer)
        .headers(Headers::Ietf)
        .layer(inner.clone());
    let mut through = 0;
    for _ in 0..20 {
        let response = send(&mut service, from("192.0.2.1", &[])).await;
        if response.status() == StatusCode::OK {
            through += 1;
            assert_eq!(
                header(&response, "ratelimit-policy"),
                Some("\"default\";q=10;w=2")
            );
        }
    }
    assert_eq!(through, 10);
    assert_eq!(inner.0.load(Ordering::Relaxed), 10);
}

/// An IPv6 client is keyed by its /64: a new address in it with every
/// request does not escape its limit; another /64 is another client; behind
/// proxies the client they name is keyed alike; `ipv6_prefix(128)` keys
/// each address.
#[tokio::test(flavor = "current_thread")]
async fn ipv6_clients_are_keyed_by_their_prefix() {
    let clock = FakeClock::new();
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let mut service =
        RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer.clone()).layer(Ok200::default());
    let direct = |client: &str| from(&format!("[{client}]"), &[]);
    assert_eq!(
        send(&mut service, direct("2001:db8:0:1::1")).await.status(),
        StatusCode::OK
    );
    for same_site in ["2001:db8:0:1::2", "2001:db8:0:1:ffff:ffff:ffff:ffff"] {
        let refused = send(&mut service, direct(same_site)).await.status();
        assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS, "{same_site}");
    }
    assert_eq!(
        send(&mut service, direct("2001:db8:0:2::1")).await.status(),
        StatusCode::OK
    );

    let client_ip = ClientIp {
        peer: peer.clone(),
        proxies: TrustedProxies::new(ClientIpSource::XForwardedFor, ["10.0.0.0/8"]).unwrap(),
    };
    let mut proxied =
        RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), client_ip).layer(Ok200::default());
    let via = |client: &str| from("10.0.0.5", &[("x-forwarded-for", client)]);
    assert_eq!(
        send(&mut proxied, via("2001:db8:0:3::1")).await.status(),
        StatusCode::OK
    );
    let refused = send(&mut proxied, via("2001:db8:0:3::2")).await.status();
    assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);

    let mut each = RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer.ipv6_prefix(128))
        .layer(Ok200::default());
    for address in ["2001:db8:0:4::1", "2001:db8:0:4::2"] {
        assert_eq!(
            send(&mut each, direct(address)).await.status(),
            StatusCode::OK,
            "{address}"
        );
    }
}

/// An IPv4 client that reaches an IPv6 server through a NAT64 or SIIT
/// translator has its address in the last 32 bits of the well-known prefix
/// `64:ff9b::/96` (RFC 6052), and is keyed by that IPv4 address. Before,
/// every such client was keyed by the prefix's /64: one key for all of
/// them, which one client used up for the others.
#[tokio::test(flavor = "current_thread")]
async fn ipv4_clients_translated_into_ipv6_are_keyed_by_their_ipv4_address() {
    let clock = FakeClock::new();
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let mut service =
        RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer).layer(Ok200::default());
    for client in ["[64:ff9b::192.0.2.1]", "[64:ff9b::192.0.2.2]"] {
        let status = send(&mut service, from(client, &[])).await.status();
        assert_eq!(status, StatusCode::OK, "{client}");
    }
    // The same client as it is, and translated: one key.
    for client in ["192.0.2.1", "[64:ff9b::c000:202]"] {
        let status = send(&mut service, from(client, &[])).await.status();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{client}");
    }
    // Outside the /96, the /64 as before.
    assert_eq!(
        send(&mut service, from("[64:ff9b::1:0:0]", &[]))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&mut service, from("[64:ff9b::2:0:0]", &[]))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A network's own translator puts its IPv4 clients under the local-use
/// prefix `64:ff9b:1::/48` (RFC 8215), where it likes (a /96 of its
/// choosing, or a shorter prefix): each is keyed by its whole address.
/// Before, every client of a /96 translator there shared its /64, one key
/// that one client used up for the others.
#[tokio::test(flavor = "current_thread")]
async fn ipv4_clients_translated_under_the_local_use_prefix_are_keyed_apart() {
    let clock = FakeClock::new();
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let mut service =
        RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer).layer(Ok200::default());
    for client in [
        "[64:ff9b:1:a::192.0.2.1]",
        "[64:ff9b:1:a::192.0.2.2]",
        "[64:ff9b:1:c000:2:1:100::]",
    ] {
        let status = send(&mut service, from(client, &[])).await.status();
        assert_eq!(status, StatusCode::OK, "{client}");
    }
    let again = send(&mut service, from("[64:ff9b:1:a::192.0.2.1]", &[])).await;
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    // Next to the prefix, an IPv6 client's /64 as any other's.
    for (client, status) in [
        ("[64:ff9b:2:a::1]", StatusCode::OK),
        ("[64:ff9b:2:a::2]", StatusCode::TOO_MANY_REQUESTS),
    ] {
        assert_eq!(send(&mut service, from(client, &[])).await.status(), status);
    }
}
