//! What the HTTP layer adds to a request when nothing is owed, headers
//! included, next to tower_governor's layer on the same request in the same
//! run: a bare service, then each layer in front of it, keyed by the
//! peer's address (axum's `ConnectInfo`), with its rate-limit headers and
//! without. Every request is built the same way (a fresh `Request` with
//! the peer in its extensions), so the differences are the layers'.
//!
//! ```text
//! cargo bench -p paceline-benches --bench http --features http
//! ```

use std::convert::Infallible;
use std::future::poll_fn;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use paceline::KeyedRateLimiter;
use paceline::http::{Headers, PeerIp, RateLimitLayer};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_layer::Layer;
use tower_service::Service;

/// A service that answers 200 at once.
#[derive(Clone)]
struct Ok200;

impl Service<Request<()>> for Ok200 {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
}

/// A request from one of 64 peers.
fn request(i: u64) -> Request<()> {
    let mut request = Request::new(());
    let peer = SocketAddr::from(([192, 0, 2, (i % 64) as u8], 40_000));
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn layers(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("http, nothing owed");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    group.bench_function("bare service", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(Ok200, iters)))
    });

    let limiter = Arc::new(
        KeyedRateLimiter::<std::net::IpAddr>::builder()
            .permits_per_second(1e9)
            .build()
            .unwrap(),
    );
    let peer = PeerIp::from_extension(|info: &ConnectInfo<SocketAddr>| info.0.ip());
    let ours = RateLimitLayer::new(Arc::clone(&limiter), peer.clone()).layer(Ok200);
    group.bench_function("paceline http::RateLimitLayer, headers", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(ours.clone(), iters)))
    });
    let quiet = RateLimitLayer::new(limiter, peer)
        .headers(Headers::None)
        .layer(Ok200);
    group.bench_function("paceline http::RateLimitLayer, no headers", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(quiet.clone(), iters)))
    });

    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .unwrap();
    let governor = GovernorLayer::new(Arc::new(config)).layer(Ok200);
    group.bench_function("tower_governor GovernorLayer, headers", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(governor.clone(), iters)))
    });
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000)
        .finish()
        .unwrap();
    let governor = GovernorLayer::new(Arc::new(config)).layer(Ok200);
    group.bench_function("tower_governor GovernorLayer, no headers", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(governor.clone(), iters)))
    });
    group.finish();
}

/// `iters` requests through `service`, each made ready first; the time
/// taken. Every response must be a 200.
async fn drive<S>(mut service: S, iters: u64) -> Duration
where
    S: Service<Request<()>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..iters {
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        let response = service.call(request(i)).await.unwrap();
        assert_eq!(response.status(), 200);
        black_box(response);
    }
    start.elapsed()
}

criterion_group!(benches, layers);
criterion_main!(benches);
