//! The local limiter's cost per call, side by side in one run with
//! `governor` (a GCRA limiter on one atomic) and with a plain port of the
//! core behind a `Mutex` (what the local limiter was before its lock-free
//! path). All on the real clock.
//!
//! ```text
//! cargo bench -p paceline-benches --bench local
//! ```
//!
//! "granted" limiters run at 10^9 permits per second, so every call is
//! granted at once; "refused" ones at one permit per hour, so every call
//! after the first is refused. Each call's outcome (granted or not) goes
//! through `black_box`, the way `governor`'s own benchmarks treat `check()`:
//! what a caller branches on. The contended cases run two threads on one
//! limiter and report wall time per call over both threads (the inverse of
//! the aggregate throughput). The `clock` group measures the ways to read
//! the time that a limiter could use. The `waiting` group measures what a
//! reservation that has to wait (and may be given back) costs in the log of
//! the core's `Limits` (one limit), with none or a thousand others waiting,
//! and a give-back among a thousand (a replay of the five hundred after
//! it), on a fake timeline (no clock).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::BatchSize;
use criterion::{Criterion, criterion_group, criterion_main};
use governor::{DefaultDirectRateLimiter, Quota};
use paceline::clock::{Clock, SystemClock};
use paceline::core::{Bursty, Limits, Policy, State, micros};
use paceline::{Limit, RateLimiter};

const FAST: f64 = 1e9;
const SLOW: f64 = 1.0 / 3600.0;

/// The core behind a lock, reading the clock under it: the local limiter
/// before its lock-free path.
struct MutexLimiter {
    state: Mutex<State>,
    clock: SystemClock,
}

impl MutexLimiter {
    fn bursty(rate: f64) -> Self {
        let clock = SystemClock::new();
        let state =
            State::new(Policy::Bursty(Bursty::default()), rate, clock.now_micros()).unwrap();
        MutexLimiter {
            state: Mutex::new(state),
            clock,
        }
    }

    fn try_reserve(&self, permits: u32, timeout: Duration) -> Option<Duration> {
        let mut state = self.state.lock().unwrap();
        state
            .try_reserve(permits, self.clock.now_micros(), micros(timeout))
            .map(Duration::from_micros)
    }
}

/// Whether a try was granted: what a caller branches on.
fn granted(result: Result<Option<Duration>, paceline::Error>) -> bool {
    matches!(result, Ok(Some(_)))
}

fn governor_granted() -> DefaultDirectRateLimiter {
    governor::RateLimiter::direct(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()))
}

fn governor_refused() -> DefaultDirectRateLimiter {
    let limiter =
        governor::RateLimiter::direct(Quota::with_period(Duration::from_secs(3600)).unwrap());
    assert!(limiter.check().is_ok());
    limiter
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("single thread");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40);

    let limiter = RateLimiter::bursty(FAST).unwrap();
    group.bench_function("paceline try_reserve granted", |b| {
        b.iter(|| black_box(granted(limiter.try_reserve(black_box(1), Duration::ZERO))))
    });
    let governor = governor_granted();
    group.bench_function("governor check granted", |b| {
        b.iter(|| black_box(governor.check().is_ok()))
    });
    let mutex = MutexLimiter::bursty(FAST);
    group.bench_function("mutex try_reserve granted", |b| {
        b.iter(|| black_box(mutex.try_reserve(black_box(1), Duration::ZERO).is_some()))
    });

    let limiter = RateLimiter::bursty(SLOW).unwrap();
    assert!(limiter.try_reserve(1, Duration::ZERO).unwrap().is_some());
    group.bench_function("paceline try_reserve refused", |b| {
        b.iter(|| black_box(granted(limiter.try_reserve(black_box(1), Duration::ZERO))))
    });
    let governor = governor_refused();
    group.bench_function("governor check refused", |b| {
        b.iter(|| black_box(governor.check().is_ok()))
    });
    let mutex = MutexLimiter::bursty(SLOW);
    assert!(mutex.try_reserve(1, Duration::ZERO).is_some());
    group.bench_function("mutex try_reserve refused", |b| {
        b.iter(|| black_box(mutex.try_reserve(black_box(1), Duration::ZERO).is_some()))
    });

    let limiter = RateLimiter::bursty(FAST).unwrap();
    group.bench_function("paceline reserve", |b| {
        b.iter(|| black_box(limiter.reserve(black_box(1)).is_ok()))
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // The async bencher's own cost, for comparison with `acquire`.
    group.bench_function("paceline reserve, in the async bencher", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(limiter.reserve(black_box(1)).is_ok()) })
    });
    group.bench_function("paceline acquire, no wait", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(limiter.acquire(black_box(1)).await.is_ok()) })
    });

    // Several limits, every one of them charged: the target is at most
    // twice one limit's `try_reserve granted`, in the same run.
    let two = RateLimiter::builder()
        .limit(Limit::per_second(FAST))
        .limit(Limit::per(FAST * 3600.0, Duration::from_secs(3600)))
        .build()
        .unwrap();
    group.bench_function("paceline two limits try_reserve granted", |b| {
        b.iter(|| black_box(granted(two.try_reserve(black_box(1), Duration::ZERO))))
    });

    let warming = RateLimiter::builder()
        .permits_per_second(FAST)
        .warmup(Duration::from_secs(1))
        .build()
        .unwrap();
    group.bench_function("paceline warming-up try_reserve granted", |b| {
        b.iter(|| black_box(granted(warming.try_reserve(black_box(1), Duration::ZERO))))
    });
    group.finish();
}

/// Two threads, `iters` calls each, started together; returns half the wall
/// time, so that criterion's time per iteration is wall time per call.
fn two_threads(iters: u64, call: impl Fn() + Sync) -> Duration {
    let barrier = Barrier::new(3);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                barrier.wait();
                for _ in 0..iters {
                    call();
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // The scope joins both threads before returning.
        start
    })
    .elapsed()
        / 2
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("two threads, granted");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);

    let limiter = RateLimiter::bursty(FAST).unwrap();
    group.bench_function("paceline try_reserve", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, || {
                black_box(granted(limiter.try_reserve(black_box(1), Duration::ZERO)));
            })
        })
    });
    let governor = governor_granted();
    group.bench_function("governor check", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, || {
                black_box(governor.check().is_ok());
            })
        })
    });
    let mutex = MutexLimiter::bursty(FAST);
    group.bench_function("mutex try_reserve", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, || {
                black_box(mutex.try_reserve(black_box(1), Duration::ZERO).is_some());
            })
        })
    });
    group.finish();
}

fn clock_reads(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);

    let clock = quanta::Clock::new();
    let origin = clock.now();
    let origin_raw = clock.raw();
    group.bench_function("quanta now", |b| {
        b.iter(|| black_box(clock.now().saturating_duration_since(origin)))
    });
    group.bench_function("quanta raw", |b| b.iter(|| black_box(clock.raw())));
    group.bench_function("quanta raw + delta_as_nanos", |b| {
        b.iter(|| black_box(clock.delta_as_nanos(origin_raw, clock.raw())))
    });
    let system = SystemClock::new();
    group.bench_function("SystemClock now_micros", |b| {
        b.iter(|| black_box(system.now_micros()))
    });
    let std_origin = Instant::now();
    group.bench_function("std Instant elapsed", |b| {
        b.iter(|| black_box(std_origin.elapsed()))
    });
    {
        // `recent` is only as fresh as its upkeep thread makes it.
        let _upkeep = quanta::Upkeep::new(Duration::from_millis(1))
            .start()
            .unwrap();
        group.bench_function("quanta recent (1 ms upkeep thread)", |b| {
            b.iter(|| black_box(clock.recent().saturating_duration_since(origin)))
        });
    }
    group.finish();
}

/// One bursty limit at 1 000 permits/s with `waiting` reservations of one
/// permit waiting in its log, made at t = 0, and their ids.
fn waiting_limits(waiting: usize) -> (Limits, Vec<u64>) {
    let state = State::new(Policy::Bursty(Bursty::default()), 1_000.0, 0).unwrap();
    let mut limits = Limits::new(vec![state]).unwrap();
    // The first goes at once; the others wait, and are logged.
    limits.reserve(1, 0, true);
    let held = (0..waiting)
        .map(|_| limits.reserve(1, 0, true).id.unwrap())
        .collect();
    (limits, held)
}

fn waiting(c: &mut Criterion) {
    let mut group = c.benchmark_group("waiting");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40);
    for others in [0, 1_000] {
        group.bench_function(format!("reserve held, {others} waiting"), |b| {
            b.iter_batched_ref(
                || waiting_limits(others),
                |(limits, _)| black_box(limits.reserve(1, 0, true)),
                BatchSize::SmallInput,
            )
        });
    }
    group.bench_function("give_back of the middle one, 1000 waiting", |b| {
        b.iter_batched_ref(
            || waiting_limits(1_000),
            |(limits, held)| black_box(limits.give_back(held[500], 0)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, single_thread, contended, clock_reads, waiting);
criterion_main!(benches);
