//! One `RedisBackend`, many limiters: one connection and one health state
//! for all of them, limiters built without I/O, start while down, and each
//! limiter's fallback debt carried into its own key on recovery.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::poll::{RESPONSE_TIMEOUT, SLACK, backend, backend_builder, patient_backend};
use crate::support::proxy::Proxy;
use crate::support::redis_server::RedisServer;
use crate::support::within::within;
use paceline::redis::{Fallback, RedisBackend};
use paceline::{Error, KeyedRateLimiter, RateLimiter};

const MS: Duration = Duration::from_millis(1);

/// The clients connected to `server` other than the test's own: lines of
/// `CLIENT LIST` without `name=observer`.
fn clients(observer: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(observer).unwrap();
    list.lines()
        .filter(|l| !l.contains("name=observer"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_limiters_share_one_connection_and_keep_their_own_keys() {
    let server = RedisServer::start();
    let mut observer = server.connection();
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("observer")
        .query(&mut observer)
        .unwrap();
    // Patient: a late reply must not send a call to the fallback.
    let backend = patient_backend(server.client()).await;
    let limiters: Vec<_> = (0..20)
        .map(|i| {
            Arc::new(
                RateLimiter::builder()
                    .redis(&backend, &format!("shared-{i}"))
                    // One each 10 s: the keys live for tens of seconds,
                    // past a loaded machine's delays before they are
                    // listed (at one a second they could expire first).
                    .permits_per_second(0.1)
                    .max_burst(Duration::ZERO)
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    // 64 tasks over the 20 limiters, at once.
    let start = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let limiter = Arc::clone(&limiters[t % 20]);
            tokio::spawn(async move { limiter.reserve(1).await.unwrap() })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(clients(&mut observer), 1, "one data connection");
    // Each key is its own limiter: 64 reservations over 20 keys at 0.1/s
    // with no burst leave each key 3 or 4 intervals of debt, not 64, from
    // its first call: less the time since (Redis's clock moves no more).
    for limiter in &limiters {
        let wait = limiter.snapshot().await.unwrap().wait();
        let since_first = start.elapsed();
        assert!(
            wait <= 40_000 * MS && wait + since_first + MS >= 30_000 * MS,
            "{}: {wait:?}, {since_first:?} after the first call",
            limiter.redis_key()
        );
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("paceline:v1:shared-*")
        .query(&mut observer)
        .unwrap();
    assert_eq!(keys.len(), 20);
    assert!(!backend.stats().degraded);
    assert_eq!(backend.stats().fallbacks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_a_limiter_does_no_io_and_checks_its_options() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let backend = backend(proxy.client()).await;
    let accepted = proxy.accepted();
    let start = Instant::now();
    for i in 0..1000 {
        RateLimiter::builder()
            .redis(&backend, &format!("cheap-{i}"))
            .permits_per_second(5.0)
            .build()
            .unwrap();
    }
    // A stall detector (a quiet machine takes well under a second, a
    // starved one over ten): that no connection was opened is checked
    // below.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(proxy.accepted(), accepted, "building opened connections");
    for bad in [
        RateLimiter::builder()
            .redis(&backend, "")
            .permits_per_second(5.0)
            .build(),
        RateLimiter::builder()
            .redis(&backend, "x")
            .permits_per_second(-1.0)
            .build(),
        RateLimiter::builder().redis(&backend, "x").build(),
        RateLimiter::builder()
            .redis(&backend, "x")
            .permits_per_second(5.0)
            .local_fraction(0.0)
            .build(),
    ] {
        assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    }
    let bad = RedisBackend::builder(server.client())
        .response_timeout(Duration::ZERO)
        .build()
        .await;
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_starts_while_redis_is_down() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    proxy.refuse_new(true);
    let start = Instant::now();
    let backend = backend(proxy.client()).await;
    assert!(start.elapsed() <= RESPONSE_TIMEOUT * 2 + SLACK);
    assert!(backend.stats().degraded);
    let limiter = RateLimiter::builder()
        .redis(&backend, "down-at-start")
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    // Served locally: paced at 10/s from an empty burst; 10 permits at
    // once leave a second of local debt.
    let opened = Instant::now();
    assert_eq!(limiter.reserve(10).await.unwrap(), Duration::ZERO);
    let granted = Instant::now();
    // Refused, unless a stalled machine let the second pass.
    let again = limiter.try_acquire(1, Duration::ZERO).await.unwrap();
    assert!(!again || opened.elapsed() >= Duration::from_secs(1));
    let strict = RedisBackend::builder(proxy.client())
        .response_timeout(RESPONSE_TIMEOUT)
        .require_connection(true)
        .build()
        .await;
    assert!(matches!(strict, Err(Error::Backend(_))), "{strict:?}");

    let answering = Instant::now();
    proxy.refuse_new(false);
    within(Duration::from_secs(5), || !backend.stats().degraded)
        .await
        .expect("switches to Redis once it answers");
    // What is left of the local debt is carried into the key by the first
    // call through Redis: the debt ends 1 s after the local grant, and is
    // carried after Redis answers again, before this call returns.
    let wait = limiter.reserve(1).await.unwrap();
    let left = Duration::from_secs(1).saturating_sub(opened.elapsed());
    let most = Duration::from_secs(1).saturating_sub(answering - granted);
    if !again {
        assert!(
            wait + MS >= left && wait <= most + MS,
            "waits {wait:?}, the local debt left {left:?} (at most {most:?})"
        );
    }
    assert_eq!(backend.stats().recoveries, 1);
}

/// A Redis that answers and refuses this client (no such database, a wrong
/// password, none) is no outage: the build fails, whatever
/// `require_connection` says, rather than starting on a fallback that would
/// serve until someone reads the logs. The right settings build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_this_client_fails_the_build() {
    let server = RedisServer::start();
    let port = server.port();
    let build = |url: String| async move {
        RedisBackend::builder(redis::Client::open(url).unwrap())
            .response_timeout(RESPONSE_TIMEOUT)
            .require_connection(false)
            .build()
            .await
    };
    let refused = |built: &Result<RedisBackend, Error>, why: &str| match built {
        Err(Error::Backend(error)) => assert!(!error.is_timeout(), "{why}: {error}"),
        Ok(backend) => panic!("{why}: built, degraded {}", backend.stats().degraded),
        Err(other) => panic!("{why}: {other}"),
    };
    // Databases are 0 to 15 by default.
    refused(
        &build(format!("redis://127.0.0.1:{port}/99")).await,
        "no such database",
    );
    server.config_set("requirepass", "sekrit");
    refused(
        &build(format!("redis://:wrong@127.0.0.1:{port}/")).await,
        "a wrong password",
    );
    refused(
        &build(format!("redis://127.0.0.1:{port}/")).await,
        "no password",
    );
    let backend = build(format!("redis://:sekrit@127.0.0.1:{port}/"))
        .await
        .expect("the right password builds");
    assert!(!backend.stats().degraded);
    let limiter = RateLimiter::builder()
        .redis(&backend, "refused-then-right")
        .permits_per_second(10.0)
        .build()
        .unwrap();
    assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
    assert_eq!(limiter.stats().fallback_calls, 0);
    // (The blocking builder starts the same way.)
    let blocking = tokio::task::spawn_blocking(move || {
        RedisBackend::builder(
            redis::Client::open(format!("redis://:wrong@127.0.0.1:{port}/")).unwrap(),
        )
        .response_timeout(RESPONSE_TIMEOUT)
        .build_blocking()
    })
    .await
    .unwrap();
    refused(&blocking, "a wrong password, blocking");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_outage_degrades_every_limiter_and_each_carries_its_own_debt_back() {
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = |name: &str| {
        RateLimiter::builder()
            .redis(&backend, name)
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .fallback(Fallback::Local)
            .build()
            .unwrap()
    };
    let (busy, idle) = (limiter("busy"), limiter("idle"));
    busy.reserve(1).await.unwrap();
    idle.reserve(1).await.unwrap();
    server.kill();
    // The first failure degrades the backend: both limiters serve locally,
    // each call within the response timeout.
    let local = Instant::now();
    for _ in 0..5 {
        let start = Instant::now();
        busy.reserve(1).await.unwrap();
        assert!(start.elapsed() <= RESPONSE_TIMEOUT + SLACK);
    }
    let start = Instant::now();
    idle.reserve(1).await.unwrap();
    assert!(start.elapsed() <= RESPONSE_TIMEOUT + SLACK);
    assert!(backend.stats().degraded);
    assert_eq!(backend.stats().fallbacks, 1);

    server.restart();
    within(Duration::from_secs(5), || !backend.stats().degraded)
        .await
        .expect("recovers after the restart");
    // Each key is empty after the restart; each limiter carries its own
    // local debt into it: 5 intervals for `busy` from its first local
    // call, less the time since (at most 5 more than Redis knew), 1 for
    // `idle`.
    let busy_wait = busy.reserve(1).await.unwrap();
    let since_local = local.elapsed();
    let idle_wait = idle.reserve(1).await.unwrap();
    assert!(
        busy_wait <= 600 * MS && busy_wait + since_local + MS >= 500 * MS,
        "busy: {busy_wait:?}, {since_local:?} after its first local call"
    );
    assert!(idle_wait <= 150 * MS, "idle: {idle_wait:?}");
    assert!(
        busy_wait + since_local + MS >= idle_wait + 350 * MS,
        "busy: {busy_wait:?}, idle: {idle_wait:?}"
    );
}

/// `Stats::fallback_calls` on a limiter counts the calls its own fallback
/// served; the backend's, those of all its limiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limiter_counts_the_calls_its_own_fallback_served() {
    let server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = |name: &str| {
        KeyedRateLimiter::<String>::builder()
            .redis(&backend, name)
            .permits_per_second(1000.0)
            .fallback(Fallback::Local)
            .build()
            .unwrap()
    };
    let (busy, idle, untouched) = (limiter("busy"), limiter("idle"), limiter("untouched"));
    for limiter in [&busy, &idle, &untouched] {
        limiter.reserve(&"k".to_owned(), 1).await.unwrap();
    }
    let mut server = server;
    server.kill();
    for user in 0..5 {
        busy.reserve(&format!("u{user}"), 1).await.unwrap();
    }
    busy.snapshot(&"u0".to_owned()).await.unwrap();
    idle.reserve(&"k".to_owned(), 1).await.unwrap();
    assert!(untouched.stats().degraded);
    let served =
        |limiter: &KeyedRateLimiter<String, paceline::redis::Redis>| limiter.stats().fallback_calls;
    assert_eq!(
        (served(&busy), served(&idle), served(&untouched)),
        (6, 1, 0)
    );
    assert_eq!(backend.stats().fallback_calls, 7);
}

#[test]
fn a_blocking_backend_serves_blocking_limiters() {
    let server = RedisServer::start();
    // Patient: a late reply must not send a call to the fallback.
    let backend = backend_builder(server.client())
        .response_timeout(Duration::from_secs(5))
        .build_blocking()
        .unwrap();
    let limiter = RateLimiter::builder()
        .redis(&backend, "blocking")
        .permits_per_second(20.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let start = Instant::now();
    assert_eq!(limiter.acquire_blocking(1).unwrap(), Duration::ZERO);
    let waited = limiter.acquire_blocking(1).unwrap();
    // The second waited one interval less what Redis's clock ran between
    // the calls; either way the two took at least the interval here.
    let took = start.elapsed();
    assert!(
        waited <= 50 * MS && took + MS >= 50 * MS,
        "{waited:?}, {took:?} for both"
    );
    // The next is due 100 ms after the first at the earliest: refused
    // unless the machine stalled that long.
    let granted = limiter.try_acquire_blocking(1, Duration::ZERO).unwrap();
    assert!(!granted || start.elapsed() >= 100 * MS);
    // A clone of the handle is the same backend.
    let again = backend.clone();
    assert_eq!(again.stats(), backend.stats());
}

/// Keys start with `paceline:` unless the builder sets another prefix,
/// then the version of the key layout; limiters with the same prefix share
/// their keys, and a prefix that could alias another limiter's keys is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_prefix_is_paceline_unless_set() {
    let server = RedisServer::start();
    let default_backend = RedisBackend::builder(server.client())
        .build()
        .await
        .unwrap();
    let default = RateLimiter::builder()
        .redis(&default_backend, "orders")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(default.redis_key(), "paceline:v1:orders");
    let tenant_backend = RedisBackend::builder(server.client())
        .key_prefix("tenant-7")
        .build()
        .await
        .unwrap();
    let tenant = RateLimiter::builder()
        .redis(&tenant_backend, "orders")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(tenant.redis_key(), "tenant-7:v1:orders");
    assert_eq!(tenant.reserve(1).await.unwrap(), Duration::ZERO);
    // A second process with that prefix shares the key.
    let backend = paceline::redis::RedisBackend::builder(server.client())
        .key_prefix("tenant-7")
        .build()
        .await
        .unwrap();
    let keyed = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "orders")
        .permits_per_second(1.0)
        .build()
        .unwrap();
    assert_eq!(keyed.redis_key(&"k".to_owned()), "tenant-7:v1:orders:k");
    let other = RateLimiter::builder()
        .redis(&backend, "orders")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    assert!(!other.try_acquire(1, Duration::ZERO).await.unwrap());
    // The default limiter of that name has its own key, untouched.
    assert!(default.try_acquire(1, Duration::ZERO).await.unwrap());
    for bad in ["", "a:b", "{tag}"] {
        let refused = RedisBackend::builder(server.client())
            .key_prefix(bad)
            .build()
            .await
            .and_then(|backend| {
                RateLimiter::builder()
                    .redis(&backend, "orders")
                    .permits_per_second(1.0)
                    .build()
            });
        assert!(
            matches!(refused, Err(paceline::Error::InvalidArgument(_))),
            "{bad:?}"
        );
    }
}

/// A timeout too long to add to the clock (`Duration::MAX`) means none, as
/// for Tokio's timers: calls are served, none panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_response_timeout_is_no_timeout() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.client())
        .response_timeout(Duration::MAX)
        .probe_interval(Duration::MAX)
        .build()
        .await
        .unwrap();
    let limiter = RateLimiter::builder()
        .redis(&backend, "endless")
        .permits_per_second(10.0)
        .build()
        .unwrap();
    let keyed = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "endless-keyed")
        .permits_per_second(10.0)
        .build()
        .unwrap();
    for _ in 0..3 {
        limiter.reserve(1).await.unwrap();
        keyed.reserve("a", 1).await.unwrap();
    }
    let blocking = tokio::task::spawn_blocking(move || limiter.acquire_blocking(1).map(drop));
    blocking.await.unwrap().unwrap();
    assert_eq!(keyed.stats().fallback_calls, 0);
}
