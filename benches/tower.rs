//! What the tower layer adds to a call when nothing is owed: a bare
//! service next to the same service behind `RateLimitLayer` (waiting mode,
//! a local limiter at 10^9 permits per second, so every permit is free),
//! each driven through `poll_ready` and `call` and awaited, in one run.
//!
//! ```text
//! cargo bench -p paceline-benches --bench tower --features tower
//! ```

use std::future::poll_fn;
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use paceline::RateLimiter;
use paceline::tower::RateLimitLayer;
use tower_layer::Layer;
use tower_service::Service;

/// A service that answers at once.
#[derive(Clone)]
struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<u64, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u64) -> Self::Future {
        std::future::ready(Ok(request))
    }
}

fn layer(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("tower, nothing owed");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    group.bench_function("bare service", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(Echo, iters)))
    });
    let limiter = Arc::new(RateLimiter::bursty(1e9).unwrap());
    let limited = RateLimitLayer::new(limiter).layer(Echo);
    group.bench_function("behind RateLimitLayer", |b| {
        b.iter_custom(|iters| runtime.block_on(drive(limited.clone(), iters)))
    });
    group.finish();
}

/// `iters` calls through `service`, each made ready first; the time taken.
async fn drive<S: Service<u64>>(mut service: S, iters: u64) -> Duration
where
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for i in 0..iters {
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        black_box(service.call(black_box(i)).await.unwrap());
    }
    start.elapsed()
}

criterion_group!(benches, layer);
criterion_main!(benches);
