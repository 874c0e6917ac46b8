//! `RateLimiter<Redis>` against a real redis-server started per test: the same
//! verbs and semantics as the local limiter, one schedule for every instance
//! whatever its own clock, blocking use, bad input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::poll::patient_backend;
use crate::support::redis_server::RedisServer;
use paceline::clock::{Clock, FakeClock};
use paceline::redis::{Fallback, Redis, RedisBackend};
use paceline::{Error, Limit, Limiter, RateLimiter};
use redis::Commands;

const MS: Duration = Duration::from_millis(1);

async fn limiter(
    server: &RedisServer,
    name: &str,
    rate: f64,
    clock: &FakeClock,
) -> RateLimiter<Redis, FakeClock> {
    // Patient: a late reply on a loaded machine must not fail a call.
    let backend = patient_backend(server.client()).await;
    RateLimiter::builder()
        .redis(&backend, name)
        .permits_per_second(rate)
        .fallback(Fallback::FailClosed)
        .clock(clock.clone())
        .build()
        .expect("limiter")
}

#[tokio::test]
async fn a_new_key_is_full_then_paces_at_the_rate() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = limiter(&server, "paced", 10.0, &clock).await;
    assert_eq!(limiter.redis_key(), "paceline:v1:paced");
    // A missing key reads as idle for long: 10 stored permits, then one free
    // fresh permit, then the debt shows.
    let start = Instant::now();
    for i in 0..11 {
        assert_eq!(
            limiter.reserve(1).await.unwrap(),
            Duration::ZERO,
            "permit {i}"
        );
    }
    // Redis's clock runs between the calls by at most the time they take
    // here: the twelfth permit comes one interval after the first call, less
    // that (permits stored meanwhile can only make it later, never earlier).
    let second = Instant::now();
    let wait = limiter.reserve(1).await.unwrap();
    let since_first = start.elapsed();
    assert!(
        wait <= 100 * MS && wait + since_first + MS >= 100 * MS,
        "{wait:?}, {since_first:?} after the first call"
    );
    let third = Instant::now();
    let next = limiter.reserve(1).await.unwrap();
    let (since_first, since_second) = (start.elapsed(), second.elapsed());
    assert!(
        next <= wait + 100 * MS && next + since_first + MS >= 200 * MS,
        "{wait:?} then {next:?}, {since_first:?} after the first call"
    );
    // Once the debt shows, nothing is stored: the next one owes exactly one
    // more interval.
    if !wait.is_zero() {
        assert!(
            next + since_second + MS >= wait + 100 * MS,
            "{wait:?} then {next:?}, {since_second:?} after the twelfth call"
        );
    }
    let mut conn = server.connection();
    assert!(conn.exists::<_, bool>("paceline:v1:paced").unwrap());
    let ttl: i64 = conn.pttl("paceline:v1:paced").unwrap();
    // Full again a burst (1 s) after its next free moment, which is after
    // the thirteenth call: less what has passed since.
    let since_third = third.elapsed().as_millis() as i64;
    assert!(
        ttl + since_third + 1 >= 1000,
        "the key lives until it would be full again: {ttl} ms, {since_third} ms after the call"
    );
}

#[tokio::test]
async fn acquire_sleeps_the_wait_on_the_limiter_clock() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let backend = patient_backend(server.client()).await;
    let limiter = RateLimiter::builder()
        .redis(&backend, "sleepy")
        .permits_per_second(2.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    // (The fake clock's sleep takes no real time: Redis's clock moves
    // between the calls by at most the time they take here.)
    let start = Instant::now();
    assert_eq!(limiter.acquire(1).await.unwrap(), Duration::ZERO);
    let slept = limiter.acquire(1).await.unwrap();
    let since_first = start.elapsed();
    assert!(
        slept <= 500 * MS && slept + since_first + MS >= 500 * MS,
        "{slept:?}, {since_first:?} after the first call"
    );
    assert_eq!(clock.now(), slept, "slept on the fake clock, not for real");
}

#[tokio::test]
async fn try_acquire_refuses_without_touching_the_key() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let backend = patient_backend(server.client()).await;
    // One each 10 s: the tries below stay refused however long the loop of
    // forty calls takes on a loaded machine (short of 5 s).
    let limiter = RateLimiter::builder()
        .redis(&backend, "tries")
        .permits_per_second(0.1)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    let start = Instant::now();
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    let mut conn = server.connection();
    let before: Vec<u8> = redis::cmd("DUMP")
        .arg("paceline:v1:tries")
        .query(&mut conn)
        .unwrap();
    for _ in 0..20 {
        assert!(!limiter.try_acquire(5, 5000 * MS).await.unwrap());
        assert_eq!(limiter.try_reserve(1, Duration::ZERO).await.unwrap(), None);
    }
    let after: Vec<u8> = redis::cmd("DUMP")
        .arg("paceline:v1:tries")
        .query(&mut conn)
        .unwrap();
    assert_eq!(before, after, "a refused try writes nothing");
    assert!(
        limiter
            .try_acquire(1, Duration::from_secs(20))
            .await
            .unwrap()
    );
    // Two intervals after the first call, less the time since.
    let wait = limiter.snapshot().await.unwrap().wait();
    let since_first = start.elapsed();
    assert!(
        wait <= 20_000 * MS && wait + since_first + MS >= 20_000 * MS,
        "{wait:?}, {since_first:?} after the first call"
    );
}

/// Only Redis's clock drives the algorithm: an instance whose own clock is a
/// year ahead shares the schedule of one on the real clock.
#[tokio::test]
async fn instances_with_disagreeing_clocks_share_one_schedule() {
    let server = RedisServer::start();
    let future = FakeClock::new();
    future.advance(Duration::from_secs(365 * 24 * 3600));
    let ahead_backend = patient_backend(server.client()).await;
    let ahead = RateLimiter::builder()
        .redis(&ahead_backend, "shared")
        .permits_per_second(4.0)
        .max_burst(Duration::ZERO)
        .clock(future.clone())
        .build()
        .unwrap();
    let real_backend = patient_backend(server.client()).await;
    let real = RateLimiter::builder()
        .redis(&real_backend, "shared")
        .permits_per_second(4.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    // Each wait is its slot on Redis's clock since the first call, less
    // the time since then (Redis's clock moves no more than that).
    let start = Instant::now();
    assert_eq!(ahead.reserve(1).await.unwrap(), Duration::ZERO);
    let w1 = (real.reserve(1).await.unwrap(), start.elapsed());
    let w2 = (ahead.reserve(1).await.unwrap(), start.elapsed());
    let w3 = (real.reserve(1).await.unwrap(), start.elapsed());
    for ((wait, since_first), slots) in [(w1, 1), (w2, 2), (w3, 3)] {
        let expected = 250 * MS * slots;
        assert!(
            wait <= expected && wait + since_first + MS >= expected,
            "{wait:?} vs {expected:?}, {since_first:?} after the first call"
        );
    }
}

#[tokio::test]
async fn set_rate_reaches_redis_with_the_next_call() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let backend = RedisBackend::builder(server.client())
        // Patient: a late reply on a loaded machine must not fail a call.
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let limiter = RateLimiter::builder()
        .redis(&backend, "rates")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .clock(clock)
        .build()
        .unwrap();
    // Redis's clock runs between the calls by at most the time they take
    // here, however loaded the machine: the waits are bounded by that.
    let start = Instant::now();
    limiter.reserve(1).await.unwrap();
    limiter.set_rate(100.0).unwrap();
    assert_eq!(limiter.rate(), 100.0);
    // The old debt is repaid at the old rate: 1 s after the first call.
    let second = Instant::now();
    let wait = limiter.reserve(1).await.unwrap();
    let since_first = start.elapsed();
    assert!(
        wait <= 1000 * MS && wait + since_first + MS >= 1000 * MS,
        "{wait:?}, {since_first:?} after the first call"
    );
    // Then 10 ms per permit.
    let next = limiter.reserve(1).await.unwrap();
    let since_second = second.elapsed();
    assert!(
        next <= wait + 10 * MS && next + since_second + MS >= wait + 10 * MS,
        "{wait:?} then {next:?}, {since_second:?} after the second call"
    );
    assert!(matches!(
        limiter.set_rate(0.0),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(limiter.rate(), 100.0);
}

/// Several limits keep their proportions through `set_rate` to an infinite
/// rate and back, the rates passed to Redis, as in this process: 10/s
/// with 1 000 an hour came back from `f64::INFINITY` as 10/s twice, the
/// hourly quota gone.
#[tokio::test]
async fn several_limits_keep_their_proportions_through_an_infinite_rate_and_back() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = RateLimiter::builder()
        .redis(&backend, "shape")
        .limit(Limit::per_second(10.0))
        .limit(Limit::per(1000.0, Duration::from_secs(3600)))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    limiter.set_rate(f64::INFINITY).unwrap();
    limiter.set_rate(10.0).unwrap();
    assert_eq!(limiter.rate(), 10.0);
    let slowest = limiter.slowest_rate();
    assert!((slowest - 1000.0 / 3600.0).abs() < 1e-12, "{slowest}");
}

#[tokio::test]
async fn warming_up_over_redis_starts_cold() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = RateLimiter::builder()
        .redis(&backend, "cold")
        .permits_per_second(10.0)
        .warmup(Duration::from_secs(1))
        .build()
        .unwrap();
    let start = Instant::now();
    limiter.reserve(1).await.unwrap();
    let first_paid = limiter.reserve(1).await.unwrap();
    let since_first = start.elapsed();
    // Cold: the first permit costs close to 3 × 100 ms (at most that), far
    // more than the warm 100 ms, less what Redis's clock ran meanwhile.
    assert!(
        first_paid <= 300 * MS && first_paid + since_first >= 200 * MS,
        "{first_paid:?}, {since_first:?} after the first call"
    );
}

#[tokio::test]
async fn works_through_the_limiter_trait() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter: Arc<dyn Limiter> = Arc::new(limiter(&server, "dyn", 5.0, &clock).await);
    let start = Instant::now();
    for _ in 0..6 {
        assert_eq!(limiter.acquire(1).await.unwrap(), Duration::ZERO);
    }
    // One interval after the first call, less the time since.
    let slept = limiter.acquire(1).await.unwrap();
    let since_first = start.elapsed();
    assert!(
        slept <= 200 * MS && slept + since_first + MS >= 200 * MS,
        "{slept:?}, {since_first:?} after the first call"
    );
    assert_eq!(limiter.clock().now(), slept, "slept on the fake clock");
    assert!(matches!(
        limiter.reserve(0).await,
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn build_blocking_serves_a_program_without_runtime() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.client())
        // Patient: a late reply on a loaded machine must not fail a call.
        .response_timeout(Duration::from_secs(5))
        .build_blocking()
        .unwrap();
    let limiter = RateLimiter::builder()
        .redis(&backend, "batch")
        .permits_per_second(20.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let start = Instant::now();
    for _ in 0..5 {
        limiter.acquire_blocking(1).unwrap();
    }
    let elapsed = start.elapsed();
    assert!(
        elapsed >= 190 * MS && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    // Twenty permits: the next caller owes a second, which no delay of a
    // loaded machine between the two calls pays off.
    assert!(
        limiter
            .try_acquire_blocking(20, Duration::from_secs(1))
            .unwrap()
    );
    assert!(!limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    // Threads share it.
    let limiter = Arc::new(limiter);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            std::thread::spawn(move || limiter.acquire_blocking(1).unwrap())
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_blocking_inside_a_runtime_and_drop_there() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.client())
        .build_blocking()
        .unwrap();
    let limiter = RateLimiter::builder()
        .redis(&backend, "inside")
        .permits_per_second(100.0)
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();
    drop(backend);
    drop(limiter); // must not panic inside an async context
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_from_plain_threads_use_the_builders_runtime() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.client())
        .build()
        .await
        .unwrap();
    let limiter = Arc::new(
        RateLimiter::builder()
            .redis(&backend, "mixed")
            .permits_per_second(1000.0)
            .build()
            .unwrap(),
    );
    let l = Arc::clone(&limiter);
    let granted = tokio::task::spawn_blocking(move || {
        (0..10)
            .filter(|_| l.try_acquire_blocking(1, Duration::from_secs(1)).unwrap())
            .count()
    })
    .await
    .unwrap();
    assert_eq!(granted, 10);
}

#[tokio::test(flavor = "current_thread")]
async fn a_blocking_call_on_a_current_thread_runtime_is_an_error_not_a_deadlock() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.client())
        .build()
        .await
        .unwrap();
    let limiter = RateLimiter::builder()
        .redis(&backend, "deadlock")
        .permits_per_second(10.0)
        .build()
        .unwrap();
    match limiter.acquire_blocking(1) {
        Err(Error::InvalidArgument(message)) => {
            assert!(message.contains("current-thread"), "{message}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn script_flush_and_flushall_mid_run_are_harmless() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = limiter(&server, "flushed", 1000.0, &clock).await;
    let mut conn = server.connection();
    for round in 0..5 {
        for _ in 0..20 {
            limiter.reserve(1).await.unwrap();
        }
        if round % 2 == 0 {
            redis::cmd("SCRIPT").arg("FLUSH").exec(&mut conn).unwrap();
        } else {
            redis::cmd("FLUSHALL").exec(&mut conn).unwrap();
        }
        assert!(
            limiter
                .try_acquire(1, Duration::from_secs(1))
                .await
                .unwrap()
        );
    }
    assert!(!limiter.stats().degraded);
}

#[tokio::test]
async fn a_key_of_another_type_is_a_clear_error_whatever_the_fallback() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let _: () = conn
        .hset("paceline:v1:taken", "owner", "someone else")
        .unwrap();
    for fallback in [Fallback::Local, Fallback::FailOpen, Fallback::FailClosed] {
        let backend = RedisBackend::builder(server.client())
            .build()
            .await
            .unwrap();
        let limiter = RateLimiter::builder()
            .redis(&backend, "taken")
            .permits_per_second(10.0)
            .fallback(fallback)
            .build()
            .unwrap();
        match limiter.acquire(1).await {
            Err(Error::Backend(e)) => {
                let text = Error::Backend(e).to_string();
                assert!(
                    text.contains("WRONGTYPE") && text.contains("paceline:v1:taken"),
                    "{text}"
                );
            }
            other => panic!("{fallback:?}: expected Error::Backend, got {other:?}"),
        }
        assert!(!limiter.stats().degraded, "a data error is not an outage");
    }
    let value: std::collections::HashMap<String, String> =
        conn.hgetall("paceline:v1:taken").unwrap();
    assert_eq!(
        value,
        [("owner".to_string(), "someone else".to_string())].into(),
        "other data is never overwritten"
    );
}

#[tokio::test]
async fn a_foreign_string_value_is_an_error_and_left_untouched() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    // A string, the limiter's type, but not a state: someone else's data.
    let _: () = conn.set("paceline:v1:junk", "lots of junk").unwrap();
    let clock = FakeClock::new();
    let limiter = limiter(&server, "junk", 2.0, &clock).await;
    for _ in 0..3 {
        match limiter.reserve(1).await {
            Err(Error::Backend(e)) => assert!(e.to_string().contains("refused"), "{e}"),
            other => panic!("expected Error::Backend, got {other:?}"),
        }
    }
    assert!(
        !limiter.stats().degraded,
        "a foreign value is not an outage"
    );
    let value: String = conn.get("paceline:v1:junk").unwrap();
    assert_eq!(value, "lots of junk", "other data is never overwritten");
}

/// A value whose clock lies at the end of time (2^53 µs, where time
/// saturates), or close to it: on it every ticket saturates at once, and
/// each reservation would wait a second, a µs or nothing. It is not the
/// limiter's: an error, not unlimited grants.
#[tokio::test]
async fn a_value_with_a_clock_at_the_end_of_time_is_an_error_not_unlimited_grants() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let clock = FakeClock::new();
    let limiter = limiter(&server, "end-of-time", 10.0, &clock).await;
    let key = limiter.redis_key();
    for last_now in [1u64 << 53, (1 << 53) - 1, (1 << 53) - 1_000_000] {
        let _: () = conn.del(&key).unwrap();
        limiter.reserve(1).await.unwrap();
        let mut value: Vec<u8> = conn.get(&key).unwrap();
        // The head: the marker, then shape and last_now.
        value[12..20].copy_from_slice(&(last_now as f64).to_le_bytes());
        let _: () = conn.set(&key, &value).unwrap();
        let mut granted = 0;
        for _ in 0..30 {
            match limiter.try_acquire(1, Duration::from_secs(1)).await {
                Ok(true) => granted += 1,
                Ok(false) => {}
                Err(Error::Backend(e)) => {
                    assert!(e.to_string().contains("does not recognise"), "{e}");
                }
                Err(other) => panic!("{last_now}: {other:?}"),
            }
        }
        assert_eq!(granted, 0, "last_now {last_now}: granted {granted} of 30");
        let after: Vec<u8> = conn.get(&key).unwrap();
        assert_eq!(after, value, "last_now {last_now}: the value changed");
        assert!(!limiter.stats().degraded);
    }
}

#[tokio::test]
async fn bad_options_and_arguments_are_clear_errors() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.client())
        .build()
        .await
        .unwrap();
    let build = |b: paceline::Builder<paceline::NoKey, Redis>| b.build().map(drop);
    let connect =
        |b: paceline::redis::RedisBackendBuilder| async move { b.build().await.map(drop) };
    for (built, mentions) in [
        (
            build(RateLimiter::builder().redis(&backend, "x")),
            "permits_per_second",
        ),
        (
            build(
                RateLimiter::builder()
                    .redis(&backend, "x")
                    .permits_per_second(-1.0),
            ),
            "permits_per_second",
        ),
        (
            build(
                RateLimiter::builder()
                    .redis(&backend, "")
                    .permits_per_second(1.0),
            ),
            "name",
        ),
        (
            build(
                RateLimiter::builder()
                    .redis(&backend, "x")
                    .permits_per_second(1.0)
                    .local_fraction(0.0),
            ),
            "local_fraction",
        ),
        (
            // A share of the rate for a fallback that serves no rate.
            build(
                RateLimiter::builder()
                    .redis(&backend, "x")
                    .permits_per_second(1.0)
                    .fallback(paceline::redis::Fallback::FailClosed)
                    .local_fraction(0.5),
            ),
            "Fallback::Local only",
        ),
        (
            // A cap on the keys of a fallback that holds one: not ignored
            // in silence, as on a limiter in this process.
            build(
                RateLimiter::builder()
                    .redis(&backend, "x")
                    .permits_per_second(1.0)
                    .max_keys(10),
            ),
            "max_keys",
        ),
        (
            // All of a key's limits live in one value, of at most 16.
            build(
                (0..17).fold(RateLimiter::builder().redis(&backend, "x"), |b, _| {
                    b.limit(Limit::per_second(1.0))
                }),
            ),
            "at most 16 limits",
        ),
        (
            connect(RedisBackend::builder(server.client()).response_timeout(Duration::ZERO)).await,
            "response_timeout",
        ),
        (
            connect(RedisBackend::builder(server.client()).probe_interval(Duration::ZERO)).await,
            "probe_interval",
        ),
        (
            build(
                RateLimiter::builder()
                    .redis(&backend, "x")
                    .limit(Limit::per_second(1.0).cold_factor(2.0)),
            ),
            "cold_factor",
        ),
    ] {
        match built {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains(mentions), "{m:?} should mention {mentions}")
            }
            other => panic!("expected InvalidArgument mentioning {mentions}, got {other:?}"),
        }
    }
    // Sixteen are served.
    let sixteen = (0..16)
        .fold(RateLimiter::builder().redis(&backend, "sixteen"), |b, i| {
            b.limit(Limit::per_second(f64::from(i + 1)))
        })
        .build()
        .unwrap();
    assert_eq!(
        sixteen.try_reserve(1, Duration::ZERO).await.unwrap(),
        Some(Duration::ZERO)
    );
    assert!(!sixteen.stats().degraded);
    let limiter = RateLimiter::builder()
        .redis(&backend, "x")
        .permits_per_second(1.0)
        .build()
        .unwrap();
    assert!(matches!(
        limiter.reserve(0).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        limiter.try_acquire(0, MS).await,
        Err(Error::InvalidArgument(_))
    ));
    // Extreme values saturate.
    limiter.set_rate(1e-300).unwrap();
    limiter.reserve(u32::MAX).await.unwrap();
    assert!(limiter.reserve(u32::MAX).await.unwrap() > Duration::from_secs(100 * 365 * 24 * 3600));
    assert!(
        limiter
            .try_reserve(1, Duration::MAX)
            .await
            .unwrap()
            .is_some()
    );
    limiter.set_rate(f64::INFINITY).unwrap();
    limiter.reserve(1).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_server_fails_a_strict_build_quickly_and_clearly() {
    let server = RedisServer::start();
    let url = server.url();
    drop(server); // nothing listens on that port any more
    let start = Instant::now();
    let result = RedisBackend::builder(redis::Client::open(url).unwrap())
        .response_timeout(100 * MS)
        .require_connection(true)
        .build()
        .await
        .and_then(|backend| {
            RateLimiter::builder()
                .redis(&backend, "nowhere")
                .permits_per_second(1.0)
                .build()
        });
    match result {
        Err(Error::Backend(e)) => assert!(e.to_string().contains("cannot connect"), "{e}"),
        other => panic!("expected Error::Backend, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

/// Two limits' rates changed at once from two threads are both made: each
/// change reads the rates and writes them back whole, one after the other.
/// (Each read them, changed its own and wrote them back, so that one could
/// undo the other's: the limiter went on at a rate nobody had set.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_rates_changed_from_two_threads_are_both_made() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = Arc::new(
        RateLimiter::builder()
            .redis(&backend, "two-limits")
            .limit(Limit::per_second(10.0))
            .limit(Limit::per_second(1000.0))
            .build()
            .unwrap(),
    );
    let barrier = Arc::new(std::sync::Barrier::new(3));
    let threads: Vec<_> = (0..2)
        .map(|index| {
            let (limiter, barrier) = (Arc::clone(&limiter), Arc::clone(&barrier));
            std::thread::spawn(move || {
                for round in 0..300u32 {
                    barrier.wait();
                    // The limit that changes to the slower rate alternates,
                    // so that the slowest rate shows either's change.
                    let slow = (round % 2 == 0) == (index == 0);
                    let rate = f64::from(round) + if slow { 1.0 } else { 5000.0 };
                    limiter.set_limit_rate(index, rate).unwrap();
                    barrier.wait();
                }
            })
        })
        .collect();
    let barrier = Arc::clone(&barrier);
    let limiter = Arc::clone(&limiter);
    tokio::task::spawn_blocking(move || {
        for round in 0..300u32 {
            barrier.wait();
            barrier.wait();
            assert_eq!(
                limiter.slowest_rate(),
                f64::from(round) + 1.0,
                "round {round}"
            );
        }
    })
    .await
    .unwrap();
    for thread in threads {
        thread.join().unwrap();
    }
}

/// Every future of a Redis limiter is `Send`, so a task can be spawned with
/// it on a multi-thread runtime: each method, with and without a key (a
/// `String` key asked with `&String` or `&str`), on the limiter and through
/// the traits, the reservations and calls held across an await. Checked
/// when the tests build: `spawned` is never called.
#[test]
fn every_future_can_be_spawned() {
    fn spawned(
        single: Arc<RateLimiter<Redis>>,
        keyed: Arc<paceline::KeyedRateLimiter<String, Redis>>,
    ) -> Vec<tokio::task::JoinHandle<Result<(), Error>>> {
        let shared: Arc<dyn Limiter> = single.clone();
        let shared_keyed: Arc<dyn paceline::KeyedLimiter<String>> = keyed.clone();
        let zero = Duration::ZERO;
        vec![
            tokio::spawn(async move {
                single.reserve(1).await?;
                single.try_reserve(1, zero).await?;
                single.snapshot().await?;
                single.acquire(1).await?;
                single.try_acquire(1, zero).await?;
                let reservation = single.reservation(1).await?;
                tokio::task::yield_now().await;
                reservation.wait().await;
                drop(single.try_reservation(1, zero).await?);
                let call = single.call(1).await?;
                tokio::task::yield_now().await;
                drop(single.try_call(1, zero).await?);
                call.settle(1)
            }),
            tokio::spawn(async move {
                let key = String::from("alice");
                keyed.reserve(&key, 1).await?;
                keyed.try_reserve(key.as_str(), 1, zero).await?;
                keyed.snapshot(&key).await?;
                keyed.acquire(&key, 1).await?;
                keyed.try_acquire(key.as_str(), 1, zero).await?;
                let reservation = keyed.reservation(&key, 1).await?;
                tokio::task::yield_now().await;
                reservation.wait().await;
                drop(keyed.try_reservation(key.as_str(), 1, zero).await?);
                let call = keyed.call(key.as_str(), 1).await?;
                tokio::task::yield_now().await;
                drop(keyed.try_call(&key, 1, zero).await?);
                call.settle(1)
            }),
            tokio::spawn(async move {
                shared.acquire(1).await?;
                let reservation = shared.reservation(1).await?;
                tokio::task::yield_now().await;
                reservation.wait().await;
                shared.try_acquire(1, zero).await.map(drop)
            }),
            tokio::spawn(async move {
                let key = String::from("bob");
                shared_keyed.acquire(&key, 1).await?;
                let reservation = shared_keyed.reservation(&key, 1).await?;
                tokio::task::yield_now().await;
                reservation.wait().await;
                shared_keyed.try_acquire(&key, 1, zero).await.map(drop)
            }),
            tokio::spawn(async move {
                let client = paceline::redis::Client::open("redis://127.0.0.1:1/").unwrap();
                RedisBackend::builder(client).build().await.map(drop)
            }),
        ]
    }
    let _ = spawned as fn(_, _) -> _;
}
