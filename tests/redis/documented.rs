//! Probes of the Redis limiters' documented promises.

use std::time::Duration;

use crate::support::poll::patient_backend;
use crate::support::redis_server::RedisServer;
use paceline::{KeyedRateLimiter, Limit, RateLimiter};

/// `Reservation::snapshot`: "What a limiter shared through Redis held right
/// after this reservation, as the script's reply said". A fresh key with a
/// burst of 5: after one, 4 remain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_says_what_it_left() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "probe-snap")
        .limit(Limit::per(5.0, Duration::from_secs(500)))
        .build()
        .unwrap();
    let key = "k".to_owned();
    let reservation = limiter.reservation(&key, 1).await.unwrap();
    let after = reservation.snapshot().expect("a Redis reply's snapshot");
    assert_eq!((after.remaining(), after.burst()), (4, 5));
    assert_eq!(reservation.delay(), Duration::ZERO);
    assert!(!reservation.can_give_back(), "nothing to wait for");
    reservation.keep();
}

/// The module docs: "Its state is one key (84 bytes for one limit ...)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_limit_is_84_bytes() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = RateLimiter::builder()
        .redis(&backend, "probe-size")
        .permits_per_second(10.0)
        .build()
        .unwrap();
    limiter.reserve(1).await.unwrap();
    limiter.reserve(1).await.unwrap();
    let mut con = server.connection();
    let kind: String = redis::cmd("TYPE")
        .arg(limiter.redis_key())
        .query(&mut con)
        .unwrap();
    let len: u64 = match kind.as_str() {
        "string" => redis::cmd("STRLEN")
            .arg(limiter.redis_key())
            .query(&mut con)
            .unwrap(),
        other => panic!("a {other}"),
    };
    assert_eq!(len, 84);
}

/// Through Redis the same: a reservation dropped after `set_rate` (which
/// reaches the key with its next call) keeps its permits; the next caller
/// owes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_dropped_after_set_rate_keeps_its_permits_through_redis() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let limiter = RateLimiter::builder()
        .redis(&backend, "dropped-after-set-rate")
        .limit(Limit::per_second(1.0).burst(1))
        .build()
        .unwrap();
    limiter.reserve(1).await.unwrap();
    let second = limiter.reservation(1).await.unwrap();
    assert!(second.delay() > Duration::from_millis(800), "{second:?}");
    assert!(second.can_give_back());
    limiter.set_rate(0.5).unwrap();
    drop(second);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Given back, the next would owe the first's second alone.
    let next = limiter.reserve(1).await.unwrap();
    assert!(
        next >= Duration::from_millis(1500),
        "the next waited {next:?}"
    );
}
