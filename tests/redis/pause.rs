//! Callers waiting through Redis when a refusal's pause comes: they go
//! behind it, on every form (blocking, keyed, several limits, the
//! fallback), and a limiter that only paces pays no round trip for it. On
//! the real clock, asserting only what load cannot fake.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::poll::{backend, patient_backend};
use crate::support::redis_server::RedisServer;
use paceline::outbound::{Call, Feedback};
use paceline::redis::{Fallback, Redis};
use paceline::{KeyedRateLimiter, Limit, RateLimiter};

fn refused(pause: Duration) -> Feedback {
    Feedback::new(429).with_retry_after(pause)
}

/// 30 ms after the callers began waiting, the upstream refuses `first`,
/// asking for `pause`: when the limiter learned it, since `start`.
async fn refuse(first: Call<'_>, start: Instant, pause: Duration) -> Duration {
    tokio::time::sleep(Duration::from_millis(30)).await;
    first.learn(&refused(pause));
    start.elapsed()
}

/// Two instances (processes: a backend each) of a limiter at 10/s, no
/// burst, named `name`, on `server`.
async fn two_instances(server: &RedisServer, name: &str) -> [Arc<RateLimiter<Redis>>; 2] {
    let mut instances = Vec::new();
    for _ in 0..2 {
        let limiter = RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .redis(&patient_backend(server.client()).await, name)
            .fallback(Fallback::FailClosed)
            .build()
            .unwrap();
        instances.push(Arc::new(limiter));
    }
    [instances.remove(0), instances.remove(0)]
}

/// A caller that went `after` the start went no sooner than the pause
/// learned at `learned` ended (a late wake-up only makes it later).
fn behind(after: Duration, learned: Duration, pause: Duration, what: &str) {
    assert!(
        after + Duration::from_millis(5) >= learned + pause,
        "{what}: went {after:?} after the start, inside the pause learned at {learned:?}"
    );
}

/// A Redis limiter that never calls an upstream pays no status round
/// trip: one EVALSHA per acquire, waited or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pacing_only_redis_limiter_pays_one_round_trip_per_acquire() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .redis(&patient_backend(server.client()).await, "pacing")
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();
    let before = server.evalsha_calls();
    let mut waited = 0;
    for _ in 0..5 {
        // (Each waits 100 ms, unless the one before woke that late.)
        if limiter.acquire(1).await.unwrap() > Duration::ZERO {
            waited += 1;
        }
    }
    assert!(waited > 0);
    assert_eq!(server.evalsha_calls() - before, 5);
}

/// An instance that only acquires, sharing the key with one that calls
/// and is refused: its waiters go behind the pause? (The docs: "once its
/// limiter has called an upstream or learned anything".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_only_instance_waiters_go_behind_the_pause() {
    let pause = Duration::from_secs(2);
    let server = RedisServer::start();
    let [one, two] = two_instances(&server, "acq-only").await;
    // The key learned something long before: a refusal with a short pause.
    let early = one.call(1).await.unwrap();
    early.learn(&refused(Duration::from_millis(1)));
    drop(early);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Two has reserved since (its replies could tell it the key learned).
    two.acquire(1).await.unwrap();
    let start = Instant::now();
    let first = one.call(1).await.unwrap();
    let waiter = {
        let two = Arc::clone(&two);
        tokio::spawn(async move {
            two.acquire(1).await.unwrap();
            start.elapsed()
        })
    };
    let learned = refuse(first, start, pause).await;
    let after = waiter.await.unwrap();
    behind(after, learned, pause, "the waiter");
}

/// acquire_blocking and try_acquire_blocking on a Redis limiter go behind
/// a pause learned while they slept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_acquires_through_redis_go_behind_the_pause() {
    let pause = Duration::from_secs(2);
    let server = RedisServer::start();
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .redis(&patient_backend(server.client()).await, "blocking")
            .fallback(Fallback::FailClosed)
            .build()
            .unwrap(),
    );
    for how in ["acquire", "try"] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start = Instant::now();
        let first = limiter.call(1).await.unwrap();
        let waiter = {
            let limiter = Arc::clone(&limiter);
            tokio::task::spawn_blocking(move || {
                let went = match how {
                    "acquire" => limiter.acquire_blocking(1).map(|_| true).unwrap(),
                    _ => limiter
                        .try_acquire_blocking(1, Duration::from_millis(600))
                        .unwrap(),
                };
                (went, start.elapsed())
            })
        };
        let learned = refuse(first, start, pause).await;
        let (went, after) = waiter.await.unwrap();
        if how == "try" {
            assert!(!went, "{how}: went {after:?}, inside the pause");
        } else {
            behind(after, learned, pause, how);
        }
        // Let the pause end before the next round.
        tokio::time::sleep(pause).await;
    }
}

/// A limiter whose backend's runtime is gone is served by its fallback,
/// which learns the refusal: a blocking acquire that slept through it goes
/// behind its pause, as an async one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_on_the_fallback_of_a_gone_runtime_goes_behind_the_pause() {
    let pause = Duration::from_secs(1);
    let server = RedisServer::start();
    let client = server.client();
    let limiter = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let backend = runtime.block_on(backend(client));
        RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .redis(&backend, "gone-runtime")
            .build()
            .unwrap()
    })
    .join()
    .unwrap();
    let limiter = Arc::new(limiter);
    let start = Instant::now();
    let first = limiter.call(1).await.unwrap();
    assert!(limiter.stats().degraded);
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::task::spawn_blocking(move || {
            limiter.acquire_blocking(1).unwrap();
            start.elapsed()
        })
    };
    let learned = refuse(first, start, pause).await;
    let after = waiter.await.unwrap();
    behind(after, learned, pause, "acquire_blocking");
}

/// Keyed through Redis: the refusing key's waiter goes behind its pause,
/// another key's at its moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_redis_pause_holds_only_its_key() {
    let pause = Duration::from_secs(2);
    let server = RedisServer::start();
    let limiter = Arc::new(
        KeyedRateLimiter::<String>::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .redis(&patient_backend(server.client()).await, "keyed-pause")
            .fallback(Fallback::FailClosed)
            .build()
            .unwrap(),
    );
    let start = Instant::now();
    let first = limiter.call("a", 1).await.unwrap();
    limiter.acquire("b", 1).await.unwrap();
    let waiters = ["a", "b"].map(|key| {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            limiter.acquire(key, 1).await.unwrap();
            start.elapsed()
        })
    });
    let learned = refuse(first, start, pause).await;
    let [a, b] = waiters;
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert!(
        a + Duration::from_millis(5) >= learned + pause,
        "a went {a:?}"
    );
    assert!(b < learned + pause / 2, "b went {b:?}");
}

/// Several limits (and a concurrent one) through Redis: the waiter goes
/// behind the pause (the status reply is read for every shape).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_through_redis_go_behind_the_pause() {
    let pause = Duration::from_secs(2);
    let server = RedisServer::start();
    for (name, concurrent) in [("several", false), ("several-slots", true)] {
        let mut builder = RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .limit(Limit::per_second(1000.0).burst(100).named("tokens"));
        if concurrent {
            builder = builder.limit(Limit::concurrent(4));
        }
        let limiter = Arc::new(
            builder
                .redis(&patient_backend(server.client()).await, name)
                .fallback(Fallback::FailClosed)
                .build()
                .unwrap(),
        );
        let start = Instant::now();
        let first = limiter.call(1).await.unwrap();
        let waiters = ["call", "acquire"].map(|how| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                match how {
                    "call" => drop(limiter.call(1).await.unwrap()),
                    _ => drop(limiter.acquire(1).await.unwrap()),
                }
                start.elapsed()
            })
        });
        let learned = refuse(first, start, pause).await;
        for (how, waiter) in ["call", "acquire"].into_iter().zip(waiters) {
            let after = waiter.await.unwrap();
            behind(after, learned, pause, &format!("{name} {how}"));
        }
    }
}

/// On the local fallback (Redis dead): a waiter goes behind a pause the
/// fallback learned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_fallback_waiters_go_behind_the_pause() {
    let pause = Duration::from_secs(2);
    let mut server = RedisServer::start();
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .redis(
                &crate::support::poll::backend(server.client()).await,
                "fallback-pause",
            )
            .fallback(Fallback::Local)
            .build()
            .unwrap(),
    );
    limiter.acquire(1).await.unwrap();
    server.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    let first = limiter.call(1).await.unwrap();
    let waiter = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            limiter.acquire(1).await.unwrap();
            start.elapsed()
        })
    };
    let learned = refuse(first, start, pause).await;
    let after = waiter.await.unwrap();
    assert!(limiter.stats().degraded);
    behind(after, learned, pause, "the waiter");
}

/// A refusal learned by one instance while another's callers wait: those
/// whose moments fall inside its pause go behind it, not inside it (each
/// asks Redis as it wakes, once its limiter calls an upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_waiting_in_another_instance_go_behind_a_refusals_pause() {
    let pause = Duration::from_secs(2);
    let server = RedisServer::start();
    let [one, two] = two_instances(&server, "paused").await;
    let start = Instant::now();
    let first = one.call(1).await.unwrap();
    // The other instance's callers: a call, then an acquire, 100 and
    // 200 ms after the first.
    let waiters = ["call", "acquire"].map(|how| {
        let two = Arc::clone(&two);
        tokio::spawn(async move {
            match how {
                "call" => drop(two.call(1).await.unwrap()),
                _ => drop(two.acquire(1).await.unwrap()),
            }
            start.elapsed()
        })
    });
    let learned = refuse(first, start, pause).await;
    for (how, waiter) in ["call", "acquire"].into_iter().zip(waiters) {
        behind(waiter.await.unwrap(), learned, pause, how);
    }
}
