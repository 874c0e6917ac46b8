//! What `ThrottleExt::throttle` costs a stream, in one run:
//!
//! * **saturated**: 1 000 000 items that cost nothing to produce, throttled
//!   at 10^6 items per second on the real clock. The stream is always ahead
//!   of the rate, so it runs at the limiter's pace; the achieved rate over
//!   the configured one is printed after the group (the target is ≥ 0.99).
//! * **nothing owed**: a bare stream of 1 000 items next to the same stream
//!   throttled by a limiter at 10^9 per second (every permit is free, no
//!   timer is touched); the difference per item is what the adapter costs.
//!
//! ```text
//! cargo bench -p paceline-benches --bench stream
//! ```

use std::cell::Cell;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::{Stream, StreamExt, stream};
use paceline::RateLimiter;
use paceline::stream::ThrottleExt;

const SATURATED_ITEMS: u64 = 1_000_000;
const SATURATED_RATE: f64 = 1e6;
const FREE_ITEMS: u64 = 1_000;

/// Drains `items`, passing each through `black_box`; returns the time taken.
async fn drain<T>(items: impl Stream<Item = T>) -> Duration {
    let start = Instant::now();
    let mut items = std::pin::pin!(items);
    while let Some(item) = items.next().await {
        black_box(item);
    }
    start.elapsed()
}

fn saturated(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("stream, saturated at 10^6/s");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10))
        .sample_size(10)
        .sampling_mode(criterion::SamplingMode::Flat)
        .throughput(Throughput::Elements(SATURATED_ITEMS));
    // The slowest pass: the rate the stream is sure to achieve.
    let worst = Cell::new(Duration::ZERO);
    group.bench_function("1 000 000 items", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // A fresh limiter per pass: it starts with nothing stored.
                let limiter = Arc::new(RateLimiter::bursty(SATURATED_RATE).unwrap());
                let took =
                    runtime.block_on(drain(stream::iter(0..SATURATED_ITEMS).throttle(limiter)));
                worst.set(worst.get().max(took));
                total += took;
            }
            total
        })
    });
    group.finish();
    let configured = SATURATED_ITEMS as f64 / SATURATED_RATE;
    println!(
        "saturated: slowest pass {:.4} s for {SATURATED_ITEMS} items; \
         achieved / configured rate >= {:.4}",
        worst.get().as_secs_f64(),
        configured / worst.get().as_secs_f64()
    );
}

fn nothing_owed(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("stream, nothing owed");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .throughput(Throughput::Elements(FREE_ITEMS));
    group.bench_function("bare stream", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| runtime.block_on(drain(stream::iter(0..FREE_ITEMS))))
                .sum()
        })
    });
    let limiter = Arc::new(RateLimiter::bursty(1e9).unwrap());
    group.bench_function("throttled", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    runtime.block_on(drain(stream::iter(0..FREE_ITEMS).throttle(limiter.clone())))
                })
                .sum()
        })
    });
    group.finish();
}

criterion_group!(benches, saturated, nothing_owed);
criterion_main!(benches);
