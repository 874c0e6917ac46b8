//! Several limits through Redis: the script with a key written with
//! another number of limits, bad arguments for several limits, and the
//! Redis limiters built with several limits (the same rules as locally,
//! shared through one key, and across an outage). The script's arithmetic
//! with one to three limits is held to `core::Limits` by the differential
//! test.

use crate::support::limiter_state::{Reserved, Value as Stored, script};
use crate::support::redis_server::RedisServer;
use redis::Value;

/// One limit's arguments, as the script takes them.
#[derive(Debug, Clone, Copy)]
struct Config {
    rate: f64,
    bursty: bool,
    micros: u64,
}

/// Runs the script on `key` with `first` and `second` (ARGV[1], ARGV[2])
/// for `limits`, at `now`.
fn call(
    connection: &mut redis::Connection,
    key: &str,
    first: &str,
    second: &str,
    limits: &[Config],
    now: u64,
) -> Value {
    let script = script();
    let mut invocation = script.key(key);
    invocation.arg(first).arg(second);
    for limit in limits {
        invocation
            .arg(format!("{:?}", limit.rate))
            .arg(if limit.bursty { "bursty" } else { "warming_up" })
            .arg(limit.micros)
            .arg("3.0");
    }
    invocation.arg(now);
    invocation.invoke(connection).unwrap()
}

/// A grant's wait, the limit that bound it and the key's debt after it.
fn granted(value: &Value) -> (u64, i64, u64) {
    let Value::BulkString(bytes) = value else {
        panic!("not a grant: {value:?}");
    };
    let value = Stored::decode(bytes).unwrap();
    let now = value.last_now_micros;
    let latest = value
        .limits
        .iter()
        .map(|l| l.next_free_micros)
        .fold(now, f64::max);
    (
        (value.moment_micros - now) as u64,
        value.bound as i64,
        (latest - now) as u64,
    )
}

/// A key written with one limit, or with another number of limits, is
/// read, not refused: its limits by position, the others full, and its log
/// dropped.
#[test]
fn a_value_with_another_number_of_limits_keeps_them_by_position() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    let t0: u64 = 5_000_000;
    let ten = Config {
        rate: 10.0,
        bursty: true,
        micros: 0,
    };
    let one = Config { rate: 1.0, ..ten };
    let half = Config { rate: 0.5, ..ten };
    for _ in 0..2 {
        call(&mut connection, "resized", "1", "-1", &[ten], t0);
    }
    // The one-limit key's ticket (t0 + 200 ms) is the first limit's.
    let reply = call(&mut connection, "resized", "1", "-1", &[ten, one], t0);
    assert_eq!(granted(&reply), (200_000, 0, 1_200_000));
    let value = Stored::read(&mut connection, "resized").unwrap();
    assert_eq!(
        (
            value.limits[0].next_free_micros,
            value.limits[1].next_free_micros
        ),
        ((t0 + 300_000) as f64, (t0 + 1_200_000) as f64)
    );
    // A third limit joins full; back to two, the third is dropped.
    let reply = call(&mut connection, "resized", "1", "-1", &[ten, one, half], t0);
    assert_eq!(granted(&reply), (1_200_000, 1, 3_200_000));
    let status = call(&mut connection, "resized", "status", "-1", &[ten, one], t0);
    let wait = Reserved::from_reply(&status, 2).unwrap().refused_wait();
    assert_eq!(wait, Some(2_200_000));
    // And back to one: the first limit alone, last charged at the moment
    // the second set (1.2 s).
    let reply = call(&mut connection, "resized", "1", "-1", &[ten], t0);
    assert_eq!(granted(&reply), (1_300_000, 0, 1_400_000));
    // A held reservation's log is dropped with a change of shape: it can
    // no longer be given back.
    call(&mut connection, "logged", "1+", "-1", &[ten], t0);
    let held = call(&mut connection, "logged", "1+", "-1", &[ten], t0);
    let Value::BulkString(bytes) = &held else {
        panic!("{held:?}");
    };
    let id = Stored::decode(bytes).unwrap().next_id as u64 - 1;
    call(&mut connection, "logged", "1", "-1", &[ten, one], t0);
    let cancel = call(
        &mut connection,
        "logged",
        "give_back",
        &id.to_string(),
        &[ten],
        t0,
    );
    assert_eq!(cancel, Value::Int(0));
    assert_eq!(
        Stored::read(&mut connection, "logged").unwrap().logged(),
        None
    );
}

mod limiters {
    //! The Redis limiters built with several limits: the same rules as
    //! locally, shared through one key, and across an outage.

    use std::time::{Duration, Instant};

    use crate::support::poll::{SLACK, backend, patient_backend};

    use crate::support::redis_server::RedisServer;
    use crate::support::within::within;
    use paceline::{KeyedRateLimiter, Limit, RateLimiter, redis::Fallback};

    const S: Duration = Duration::from_secs(1);

    /// A wait `got`, read now, of one due `expected` after the first call
    /// (made after `first`): at most that, less no more than the time since,
    /// which is all Redis's clock can have run meanwhile.
    fn close(got: Duration, expected: Duration, first: Instant) -> bool {
        got <= expected && got + first.elapsed() + Duration::from_millis(1) >= expected
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_limiter_waits_for_the_latest_limit_and_gives_back_to_all() {
        let server = RedisServer::start();
        // Patient: a late reply must not send a call to the fallback.
        let backend = patient_backend(server.client()).await;
        let limiter = RateLimiter::builder()
            .redis(&backend, "several")
            .limit(Limit::per_second(100.0).burst(1))
            .limit(Limit::per(6.0, Duration::from_secs(60)).burst(2))
            .build()
            .unwrap();
        // The per-minute limit starts with its one stored permit, the
        // per-second one with none: the first goes at once, the second
        // waits 10 ms (per second) and is charged 10 s per minute.
        let first = Instant::now();
        assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
        let second = limiter.reserve(1).await.unwrap();
        assert!(second <= Duration::from_millis(10), "{second:?}");
        let held = limiter.reservation(1).await.unwrap();
        assert!(close(held.delay(), 10 * S, first), "{:?}", held.delay());
        assert_eq!(held.limit(), Some(1));
        assert!(close(
            limiter.snapshot().await.unwrap().wait(),
            20 * S,
            first
        ));
        // Refused: nothing charged.
        assert_eq!(limiter.try_reserve(1, S).await.unwrap(), None);
        assert!(close(
            limiter.snapshot().await.unwrap().wait(),
            20 * S,
            first
        ));
        // Given back in the background, to both limits.
        drop(held);
        let mut wait = limiter.snapshot().await.unwrap().wait();
        for _ in 0..100 {
            if close(wait, 10 * S, first) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            wait = limiter.snapshot().await.unwrap().wait();
        }
        assert!(close(wait, 10 * S, first), "{wait:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_limit_s_rate_changes_alone_or_all_scale() {
        let server = RedisServer::start();
        // Patient: a late reply must not send a call to the fallback.
        let backend = patient_backend(server.client()).await;
        let limiter = RateLimiter::builder()
            .redis(&backend, "several-rates")
            .limit(Limit::per_second(100.0).burst(1))
            .limit(Limit::per(6.0, Duration::from_secs(60)).burst(1))
            .build()
            .unwrap();
        let first = Instant::now();
        assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
        assert_eq!(limiter.slowest_rate(), 0.1);
        // One a second instead of one per 10 s: the debt already owed stays.
        limiter.set_limit_rate(1, 1.0).unwrap();
        assert_eq!((limiter.rate(), limiter.slowest_rate()), (100.0, 1.0));
        let wait = limiter.reserve(1).await.unwrap();
        assert!(close(wait, 10 * S, first), "{wait:?}");
        assert!(close(
            limiter.snapshot().await.unwrap().wait(),
            11 * S,
            first
        ));
        // Halving the first halves them all: 2 s apart now.
        limiter.set_rate(50.0).unwrap();
        assert_eq!(limiter.slowest_rate(), 0.5);
        let wait = limiter.reserve(1).await.unwrap();
        assert!(close(wait, 11 * S, first), "{wait:?}");
        assert!(close(
            limiter.snapshot().await.unwrap().wait(),
            13 * S,
            first
        ));
        assert!(limiter.set_limit_rate(2, 1.0).is_err());
        assert!(limiter.set_limit_rate(0, f64::NAN).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_keyed_redis_limiter_keeps_every_limit_per_key() {
        let server = RedisServer::start();
        // Patient: a late reply must not send a call to the fallback.
        let backend = patient_backend(server.client()).await;
        let limiter = KeyedRateLimiter::<String>::builder()
            .redis(&backend, "several-keyed")
            .limit(Limit::per_second(10.0).burst(3))
            .limit(Limit::per(3.0, Duration::from_secs(3600)).burst(4))
            .build()
            .unwrap();
        // Each key starts full: 2 at once per second, 3 an hour. Three go
        // at once, the fourth 100 ms later (charged a third of the hour),
        // the fifth not within a second.
        let first = Instant::now();
        for _ in 0..3 {
            let granted = limiter.try_reserve("a", 1, Duration::ZERO).await.unwrap();
            assert_eq!(granted, Some(Duration::ZERO));
        }
        let fourth = limiter.try_reserve("a", 1, S).await.unwrap().unwrap();
        assert!(fourth <= Duration::from_millis(100), "{fourth:?}");
        assert_eq!(limiter.try_reserve("a", 1, S).await.unwrap(), None);
        let other = limiter.try_reserve("b", 1, Duration::ZERO).await.unwrap();
        assert_eq!(other, Some(Duration::ZERO));
        let wait = limiter.snapshot("a").await.unwrap().wait();
        assert!(close(wait, 1200 * S, first), "{wait:?}");
    }

    /// Redis killed: the fallback serves every limit locally (at their
    /// share), and after the restart each limit's debt is carried back, so
    /// the key does not open with a burst.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outage_is_served_locally_and_every_limit_carried_back() {
        let mut server = RedisServer::start();
        let backend = backend(server.client()).await;
        let limiter = RateLimiter::builder()
            .redis(&backend, "several-outage")
            .limit(Limit::per_second(1000.0).burst(1))
            .limit(Limit::per(60.0, Duration::from_secs(60)).burst(1))
            .fallback(Fallback::Local)
            .build()
            .unwrap();
        assert_eq!(limiter.reserve(1).await.unwrap(), Duration::ZERO);
        server.kill();
        // Served locally: the per-minute limit binds (1 s apart), and the
        // key opens at the debt Redis reported (1 s).
        let first = limiter.reserve(1).await.unwrap();
        assert!(limiter.stats().degraded);
        assert!(first <= S + SLACK, "{first:?}");
        let second = limiter.reserve(1).await.unwrap();
        assert!(second > first && second <= 2 * S + SLACK, "{second:?}");
        server.restart();
        within(5 * S, || !limiter.stats().degraded)
            .await
            .expect("back on Redis");
        // The fallback's grants were carried into Redis: the next waits
        // behind them, per minute, as if Redis had granted them.
        let after = limiter.snapshot().await.unwrap().wait();
        println!("fallback waits {first:?}, {second:?}; after the carry-back {after:?}");
        assert!(after >= S, "carried back: {after:?}");
        assert!(after <= 3 * S + SLACK, "{after:?}");
    }
}

mod shared {
    //! Three processes' worth of limiters (three backends, three
    //! connections) share one key with two limits: in every sliding
    //! window, the grants stay within each limit.

    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use crate::support::poll::backend;
    use crate::support::redis_server::RedisServer;
    use paceline::Limit;

    /// Each limit: (permits per second, burst).
    const LIMITS: [(f64, f64); 2] = [(100.0, 10.0), (30.0, 20.0)];
    const RUN: Duration = Duration::from_secs(2);
    /// Wake-ups run late, never early: grants can bunch up by that much.
    const JITTER: Duration = Duration::from_millis(25);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_processes_on_one_key_never_over_grant_any_limit() {
        let server = RedisServer::start();
        let grants = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let mut tasks = Vec::new();
        let mut backends = Vec::new();
        for _ in 0..3 {
            let backend = backend(server.client()).await;
            let limiter = Arc::new(
                paceline::RateLimiter::builder()
                    .redis(&backend, "shared-quota")
                    .limit(Limit::per_second(LIMITS[0].0).burst(LIMITS[0].1 as u64 + 1))
                    .limit(Limit::per(60.0, Duration::from_secs(2)).burst(LIMITS[1].1 as u64 + 1))
                    .build()
                    .unwrap(),
            );
            for _ in 0..4 {
                let limiter = Arc::clone(&limiter);
                let grants = Arc::clone(&grants);
                tasks.push(tokio::spawn(async move {
                    while start.elapsed() < RUN {
                        limiter.acquire(1).await.unwrap();
                        grants.lock().unwrap().push(start.elapsed());
                    }
                }));
            }
            backends.push(backend);
        }
        for task in tasks {
            task.await.unwrap();
        }
        drop(backends);
        let mut grants = grants.lock().unwrap().clone();
        grants.sort();
        // Over the run: the second limit's burst and rate, plus what the
        // last requests reserved past the end.
        let total = grants.len() as f64;
        let most = LIMITS[1].1 + LIMITS[1].0 * (RUN + JITTER).as_secs_f64() + 12.0;
        assert!(total <= most, "{total} grants in {RUN:?}, at most {most}");
        assert!(
            total >= LIMITS[1].0 * RUN.as_secs_f64() * 0.8,
            "{total} grants: too few"
        );
        for (rate, burst) in LIMITS {
            for (a, &first) in grants.iter().enumerate() {
                for (b, &last) in grants.iter().enumerate().skip(a) {
                    let window = (last - first + JITTER).as_secs_f64();
                    let allowed = burst + rate * window + 2.0;
                    let count = (b - a + 1) as f64;
                    assert!(
                        count <= allowed,
                        "{count} grants within {:?} at {rate}/s, burst {burst}",
                        last - first
                    );
                }
            }
        }
    }
}
