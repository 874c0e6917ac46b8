//! The keyed limiter's cost per call and memory per key, side by side in one
//! run with `governor`'s keyed limiter (`DefaultKeyedRateLimiter`: one GCRA
//! word per key in a sharded concurrent map). All on the real clock, with
//! `u64` keys.
//!
//! ```text
//! cargo bench -p paceline-benches --bench keyed
//! ```
//!
//! "granted" limiters run at 10^9 permits per second per key
//! (`KeyedRateLimiter::bursty(1e9)`, `Quota::per_second(10^9)`), so every
//! call is granted at once. Each call's outcome (granted or not) goes through
//! `black_box`, as in `benches/local.rs`.
//!
//! At that rate a key reads as full a nanosecond after each call, so this
//! crate's limiter may drop its entry at any sweep; a sweep drops only the
//! entries idle for a while (half a second here), so the keys in use stay
//! held, as in `governor`, which keeps every key it has seen.
//!
//! - `one hot key`: every call on the same key. Also on a warming-up limiter
//!   (1e9 per second, warming up for 1 s), whose keys are held as the
//!   core's numbers and run on the core under the shard's write lock: the
//!   cost of the general path.
//! - `100000 keys, round-robin`: each call on the next of 100 000 keys, all
//!   called once before measuring; 100 000 entries take megabytes, more
//!   than a core's own caches hold.
//! - `two threads, distinct keys`: each thread round-robin over its own
//!   1 000 keys; wall time per call over both threads (the inverse of the
//!   aggregate throughput), as the two-thread cases of `benches/local.rs`.
//!
//! Before the timings, a table of bytes per held key: a counting global
//! allocator measures each limiter's heap before and after one call on each
//! of 100 000 distinct keys. This crate's limiter runs at one permit per
//! second with its default one-second burst there, so that each key, one
//! permit short of full after its call, is held (and not swept) when the
//! heap is measured, well within the second. The allocator counts in the
//! timed cases too (one relaxed atomic add per allocation; the calls timed
//! allocate only when a map grows).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use governor::{DefaultKeyedRateLimiter, Quota};
use paceline::KeyedRateLimiter;

const FAST: f64 = 1e9;
/// Keys in the round-robin case.
const MANY_KEYS: u64 = 100_000;
/// Keys per thread in the two-thread case.
const KEYS_PER_THREAD: u64 = 1_000;

/// The system allocator, counting the bytes it currently holds out.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to `System` with the caller's arguments; the
// counter is bookkeeping only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            ALLOCATED.fetch_add(layout.size(), Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            ALLOCATED.fetch_add(layout.size(), Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(ptr, layout) };
        ALLOCATED.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller's contract.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            ALLOCATED.fetch_add(new_size, Relaxed);
            ALLOCATED.fetch_sub(layout.size(), Relaxed);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocated() -> usize {
    ALLOCATED.load(Relaxed)
}

/// Whether a try was granted: what a caller branches on.
fn granted(result: Result<Option<Duration>, paceline::Error>) -> bool {
    matches!(result, Ok(Some(_)))
}

fn paceline_granted() -> KeyedRateLimiter<u64> {
    KeyedRateLimiter::bursty(FAST).unwrap()
}

/// Grants every call too, on the general path.
fn paceline_warming_up() -> KeyedRateLimiter<u64> {
    KeyedRateLimiter::builder()
        .permits_per_second(FAST)
        .warmup(Duration::from_secs(1))
        .build()
        .unwrap()
}

fn governor_granted() -> DefaultKeyedRateLimiter<u64> {
    governor::RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()))
}

/// Calls `call` once on each key of `keys`, asserting it granted.
fn populate(keys: std::ops::Range<u64>, call: impl Fn(u64) -> bool) {
    for key in keys {
        assert!(call(key), "populating: key {key} refused");
    }
}

/// Bytes per held key: heap before and after one call on each of `keys`
/// distinct keys, for each limiter, printed as a table.
fn bytes_per_key() {
    const KEYS: u64 = 100_000;
    println!();
    println!("bytes per held key: heap held after one call on each of {KEYS} distinct u64 keys");
    println!("(counting global allocator; not a criterion timing)");
    println!();
    println!(
        "| {:<44} | {:>12} | {:>16} | {:>9} |",
        "limiter", "empty (B)", "with keys (B)", "B per key"
    );
    println!(
        "| {:-<44} | {:->11}: | {:->15}: | {:->8}: |",
        "", "", "", ""
    );

    // One permit per second with a one-second burst: a key starts full with
    // one permit and its call spends it, so it is held until refilled a
    // second later. The table is read well before then.
    let base = allocated();
    let limiter = KeyedRateLimiter::<u64>::bursty(1.0).unwrap();
    let empty = allocated();
    let start = Instant::now();
    populate(0..KEYS, |key| {
        granted(limiter.try_reserve(&key, 1, Duration::ZERO))
    });
    let full = allocated();
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_millis(500),
        "populating took {elapsed:?}: keys may have refilled"
    );
    assert_eq!(limiter.stats().keys, KEYS as usize, "every key held");
    row(
        "paceline KeyedRateLimiter (1/s, 1 s burst)",
        empty - base,
        full - base,
        KEYS,
    );
    drop(limiter);

    let base = allocated();
    let governor: DefaultKeyedRateLimiter<u64> =
        governor::RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1).unwrap()));
    let empty = allocated();
    populate(0..KEYS, |key| governor.check_key(&key).is_ok());
    let full = allocated();
    assert_eq!(governor.len(), KEYS as usize, "every key held");
    row(
        "governor DefaultKeyedRateLimiter (1/s)",
        empty - base,
        full - base,
        KEYS,
    );
    drop(governor);
    println!();
}

fn row(name: &str, empty: usize, full: usize, keys: u64) {
    println!(
        "| {:<44} | {:>12} | {:>16} | {:>9.1} |",
        name,
        empty,
        full,
        (full - empty) as f64 / keys as f64
    );
}

fn one_hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("one hot key");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40);

    let key = 42u64;
    let limiter = paceline_granted();
    group.bench_function("paceline try_reserve", |b| {
        b.iter(|| {
            black_box(granted(limiter.try_reserve(
                black_box(&key),
                black_box(1),
                Duration::ZERO,
            )))
        })
    });
    let warming_up = paceline_warming_up();
    group.bench_function("paceline try_reserve, warming-up", |b| {
        b.iter(|| {
            black_box(granted(warming_up.try_reserve(
                black_box(&key),
                black_box(1),
                Duration::ZERO,
            )))
        })
    });
    let governor = governor_granted();
    group.bench_function("governor check_key", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&key)).is_ok()))
    });
    group.finish();
}

fn round_robin(c: &mut Criterion) {
    let mut group = c.benchmark_group("100000 keys, round-robin");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40);

    // Each limiter is populated just before its benchmark runs.
    let limiter = paceline_granted();
    populate(0..MANY_KEYS, |key| {
        granted(limiter.try_reserve(&key, 1, Duration::ZERO))
    });
    group.bench_function("paceline try_reserve", |b| {
        let mut next = 0u64;
        b.iter(|| {
            let key = next;
            next = if next + 1 == MANY_KEYS { 0 } else { next + 1 };
            black_box(granted(limiter.try_reserve(
                black_box(&key),
                black_box(1),
                Duration::ZERO,
            )))
        })
    });
    assert_eq!(
        limiter.stats().keys,
        MANY_KEYS as usize,
        "every key in use held"
    );
    drop(limiter);

    let governor = governor_granted();
    populate(0..MANY_KEYS, |key| governor.check_key(&key).is_ok());
    group.bench_function("governor check_key", |b| {
        let mut next = 0u64;
        b.iter(|| {
            let key = next;
            next = if next + 1 == MANY_KEYS { 0 } else { next + 1 };
            black_box(governor.check_key(black_box(&key)).is_ok())
        })
    });
    group.finish();
}

/// Two threads, `iters` calls each, started together, thread `t` calling
/// `call` round-robin on the keys `t * KEYS_PER_THREAD ..` (its own);
/// returns half the wall time, so that criterion's time per iteration is
/// wall time per call.
fn two_threads(iters: u64, call: impl Fn(u64) + Sync) -> Duration {
    let barrier = Barrier::new(3);
    std::thread::scope(|scope| {
        for thread in 0..2 {
            let (barrier, call) = (&barrier, &call);
            scope.spawn(move || {
                let first = thread * KEYS_PER_THREAD;
                let mut offset = 0;
                barrier.wait();
                for _ in 0..iters {
                    call(first + offset);
                    offset = if offset + 1 == KEYS_PER_THREAD {
                        0
                    } else {
                        offset + 1
                    };
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

fn distinct_keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("two threads, distinct keys");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(30);

    let keys = 0..2 * KEYS_PER_THREAD;
    let limiter = paceline_granted();
    populate(keys.clone(), |key| {
        granted(limiter.try_reserve(&key, 1, Duration::ZERO))
    });
    group.bench_function("paceline try_reserve", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |key| {
                black_box(granted(limiter.try_reserve(
                    black_box(&key),
                    black_box(1),
                    Duration::ZERO,
                )));
            })
        })
    });

    assert_eq!(
        limiter.stats().keys,
        keys.clone().count(),
        "every key in use held"
    );

    let governor = governor_granted();
    populate(keys, |key| governor.check_key(&key).is_ok());
    group.bench_function("governor check_key", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |key| {
                black_box(governor.check_key(black_box(&key)).is_ok());
            })
        })
    });
    group.finish();
}

criterion_group!(benches, one_hot_key, round_robin, distinct_keys);

fn main() {
    bytes_per_key();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
