//! What answers from a buggy or malicious upstream teach a limiter through
//! Redis, and so every worker of the fleet: the same as in this process.

use std::time::{Duration, SystemTime};

use crate::support::limiter_state::Value;
use crate::support::poll::patient_backend;
use crate::support::redis_server::RedisServer;
use crate::support::within::within;
use paceline::RateLimiter;
use paceline::outbound::Feedback;
use paceline::redis::Fallback;

/// Hostile answers, the same to a worker through Redis and to a limiter
/// in this process (each answer to a key of its own): neither errs, every
/// lesson lands (a lesson the script refused would be dropped in silence,
/// with a debug line), and the two learn the same rate from each, to the
/// bit.
#[tokio::test]
async fn hostile_answers_teach_redis_what_they_teach_the_core() {
    let server = RedisServer::start();
    let answers: [&[(&str, &str)]; 7] = [
        &[("RateLimit-Policy", "18446744073709551615;w=0.000000001")],
        &[
            ("RateLimit-Policy", "1;w=18446744073709551615"),
            ("X-RateLimit-Remaining", "18446744073709551615"),
        ],
        &[
            ("RateLimit-Policy", "3;w=7"),
            ("RateLimit", "r=18446744073709551615;t=99999999999"),
        ],
        &[
            ("RateLimit-Policy", "1;w=0.000000001"),
            ("X-RateLimit-Remaining", "0"),
        ],
        &[
            ("RateLimit-Policy", "7;w=0.3"),
            ("X-RateLimit-Reset", "Fri, 31 Dec 9999 23:59:59 GMT"),
        ],
        &[("RateLimit-Policy", "1;w=3"), ("X-RateLimit-Limit", "nan")],
        &[("RateLimit-Policy", "9007199254740993;w=3")],
    ];
    let mut con = server.connection();
    for (at, headers) in answers.into_iter().enumerate() {
        let name = format!("same{at}");
        let key = format!("paceline:v1:{name}");
        let redis = RateLimiter::builder()
            .permits_per_second(1_000.0)
            .max_burst(Duration::from_secs(5))
            .redis(&patient_backend(server.client()).await, &name)
            .fallback(Fallback::FailClosed)
            .build()
            .unwrap();
        let local = RateLimiter::builder()
            .permits_per_second(1_000.0)
            .max_burst(Duration::from_secs(5))
            .build()
            .unwrap();
        let pairs = headers.iter().map(|(n, v)| (*n, v.as_bytes()));
        let feedback = Feedback::from_headers(200, pairs, SystemTime::now());
        // Each call goes with an open one beside it, so that a cap on
        // what is left is logged, and a debt of 200 s after them keeps
        // the key (which expires, forgetting what it learned, once it
        // reads as full).
        let (open, call) = (redis.call(1).await.unwrap(), redis.call(1).await.unwrap());
        redis.reserve(200_000).await.unwrap();
        call.learn(&feedback);
        drop(call);
        let (open_here, here) = (local.call(1).await.unwrap(), local.call(1).await.unwrap());
        local.reserve(200_000).unwrap();
        here.learn(&feedback);
        drop((here, open_here));
        let want = local.rate();
        let mut got = None;
        within(Duration::from_secs(5), || {
            got = Value::read(&mut con, &key);
            got.as_ref()
                .and_then(|v| v.learned.as_ref())
                .is_some_and(|l| (l[4] * 0.97).min(1_000.0) == want)
        })
        .await
        .unwrap_or_else(|| panic!("answer {at}: the core runs at {want}, Redis holds {got:?}"));
        open.settle(3).unwrap();
        let snapshot = redis.snapshot().await.unwrap();
        assert_eq!(snapshot.rate(), want, "answer {at}");
    }
}

/// A cold warming-up key's stored permits slow it down (2 a second, cold
/// factor 3, 8 stored when cold: the callers go 1.375 s, 1.125 s, 875 ms,
/// 625 ms apart), so an answer that says nothing is left must not take
/// them away in Redis either: the script took all 7 left after the first
/// call, and the callers after it went 500 ms apart.
#[tokio::test]
async fn none_left_never_warms_a_cold_key_up() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .permits_per_second(2.0)
        .warmup(Duration::from_secs(4))
        .redis(&patient_backend(server.client()).await, "cold")
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap();
    let none_left = [("X-RateLimit-Remaining", &b"0"[..])];
    let none_left = Feedback::from_headers(200, none_left, SystemTime::now());
    limiter.call(1).await.unwrap().learn(&none_left);
    let mut con = server.connection();
    let mut value = None;
    within(Duration::from_secs(5), || {
        value = Value::read(&mut con, "paceline:v1:cold");
        value.as_ref().is_some_and(|v| v.learned.is_some())
    })
    .await
    .expect("the lesson never landed");
    let limit = &value.unwrap().limits[0];
    assert_eq!(limit.max_permits, 8.0);
    assert!(limit.stored_permits >= 7.0, "{limit:?}");
}

/// A learning margin in its range, (0, 1], so small that a reported rate
/// times it rounds to 0: the script wrote a rate of 0 into the key, then
/// refused the key as a value it does not recognise, so that every call
/// on it failed (`Error::Backend`) until it expired; in this process the
/// cap was dropped, the limit left at 1 000/s where the upstream allowed
/// one a day. Both now run at the slowest rate there is, to the bit.
#[tokio::test]
async fn a_cap_that_underflows_teaches_redis_what_it_teaches_the_core() {
    let server = RedisServer::start();
    let learning = paceline::outbound::Learning::default().margin(5e-324);
    let redis = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .learning(learning)
        .redis(&patient_backend(server.client()).await, "tiny")
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap();
    let local = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .learning(learning)
        .build()
        .unwrap();
    let one_a_day = [("RateLimit-Policy", &b"1;w=86400"[..])];
    let one_a_day = Feedback::from_headers(200, one_a_day, SystemTime::now());
    // (An open call and a debt keep the key, as above.)
    let (open, call) = (redis.call(1).await.unwrap(), redis.call(1).await.unwrap());
    redis.reserve(200_000).await.unwrap();
    call.learn(&one_a_day);
    drop(call);
    local.call(1).await.unwrap().learn(&one_a_day);
    let mut con = server.connection();
    within(Duration::from_secs(5), || {
        Value::read(&mut con, "paceline:v1:tiny").is_some_and(|v| v.learned.is_some())
    })
    .await
    .expect("the lesson never landed");
    assert_eq!(local.snapshot().unwrap().rate(), 5e-324);
    assert_eq!(redis.snapshot().await.unwrap().rate(), 5e-324);
    open.settle(3).unwrap();
    assert_eq!(redis.try_reserve(1, Duration::ZERO).await.unwrap(), None);
}

/// An unlimited limiter (no rate of its own: it runs at what the upstream
/// reports) at the smallest fallback share there is, that learned in
/// Redis that the upstream allows one a day: when Redis dies, the
/// fallback runs at its share of one a day, the slowest rate there is.
/// The share of the cap rounded to 0, and the fallback dropped what the
/// key learned: unlimited while Redis was down, its second grant at once
/// after the first.
#[tokio::test]
async fn a_learned_cap_whose_share_underflows_still_binds_the_fallback() {
    let mut server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .permits_per_second(f64::INFINITY)
        .redis(&patient_backend(server.client()).await, "tiny-share")
        .fallback(Fallback::Local)
        .local_fraction(1e-320)
        .clock(paceline::clock::FakeClock::new())
        .build()
        .unwrap();
    // Refused for a minute: the pause keeps the key, which would read as
    // full and expire at once.
    let one_a_day: [(&str, &[u8]); 2] =
        [("RateLimit-Policy", b"1;w=86400"), ("Retry-After", b"60")];
    let one_a_day = Feedback::from_headers(429, one_a_day, SystemTime::now());
    limiter.call(1).await.unwrap().learn(&one_a_day);
    let mut con = server.connection();
    within(Duration::from_secs(5), || {
        Value::read(&mut con, "paceline:v1:tiny-share").is_some_and(|v| v.learned.is_some())
    })
    .await
    .expect("the lesson never landed");
    // A grant's reply carries what the key learned.
    limiter.reserve(1).await.unwrap();
    server.kill();
    let first = limiter.reserve(1).await.unwrap();
    assert!(limiter.stats().degraded, "{:?}", limiter.stats());
    assert_eq!(limiter.snapshot().await.unwrap().rate(), 5e-324);
    let next = limiter.reserve(1).await.unwrap();
    assert!(
        next.saturating_sub(first) > Duration::from_secs(86_400),
        "the fallback granted at {first:?}, then at {next:?}, where the upstream allows one a day"
    );
}

/// The same cap learned by the fallback itself, while Redis is down, binds
/// it at its share, the slowest rate there is (the share of the reported
/// rate rounded to 0, and the lesson's rate was dropped: every grant at
/// once, unlimited).
#[tokio::test]
async fn a_cap_learned_in_the_fallback_whose_share_underflows_still_binds_it() {
    let mut server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .permits_per_second(f64::INFINITY)
        .redis(&patient_backend(server.client()).await, "tiny-share-down")
        .fallback(Fallback::Local)
        .local_fraction(1e-320)
        .clock(paceline::clock::FakeClock::new())
        .build()
        .unwrap();
    server.kill();
    let first = limiter.reserve(1).await.unwrap();
    assert!(limiter.stats().degraded, "{:?}", limiter.stats());
    let one_a_day = [("RateLimit-Policy", &b"1;w=86400"[..])];
    let one_a_day = Feedback::from_headers(200, one_a_day, SystemTime::now());
    limiter.call(1).await.unwrap().learn(&one_a_day);
    assert_eq!(limiter.snapshot().await.unwrap().rate(), 5e-324);
    // (The grant after the lesson goes at once, as nothing is owed; the
    // next waits for it.)
    assert_eq!(limiter.reserve(1).await.unwrap(), first);
    let next = limiter.reserve(1).await.unwrap();
    assert!(
        next.saturating_sub(first) > Duration::from_secs(86_400),
        "the fallback granted at {first:?}, then at {next:?}, where the upstream allows one a day"
    );
}
