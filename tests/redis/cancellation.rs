//! Callers that give up (`timeout(d, acquire(n))`, a dropped waiter, a
//! caller dropped mid round trip): what they reserved through Redis is
//! given back. Formerly in `redis_reliability.rs`.

use std::time::{Duration, Instant};

use crate::support::poll::{backend_builder, patient_backend};
use crate::support::proxy::Proxy;
use crate::support::redis_server::RedisServer;
use paceline::RateLimiter;

const MS: Duration = Duration::from_millis(1);

/// `timeout(1 ms, acquire(1))`, twenty times, at 1/s: each caller's
/// reservation is given back, so at most one interval of debt is left
/// instead of about twenty seconds. On loopback the round trip usually ends
/// within the millisecond and the caller is dropped while it sleeps (its
/// reservation's give-back); one dropped while its EVALSHA is still out is
/// given back from the late reply (see
/// `a_caller_dropped_mid_round_trip_gives_its_reservation_back`, which
/// forces that case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_acquires_through_redis_leave_at_most_one_interval_of_debt() {
    const INTERVAL: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    // Patient, and one a second: a caller's wait outlasts its millisecond
    // however late a loaded machine polls it (at 10/s, a poll 100 ms late
    // finds the wait over as well, and the acquire done), and a late reply
    // does not send a call to the fallback.
    let limiter = RateLimiter::builder()
        .permits_per_second(1.0)
        .redis(&patient_backend(server.client()).await, "dropped")
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let mut timed_out = 0;
    for _ in 0..20 {
        if tokio::time::timeout(Duration::from_millis(1), limiter.acquire(1))
            .await
            .is_err()
        {
            timed_out += 1;
        }
    }
    assert!(timed_out >= 15, "{timed_out} of 20 timed out");
    // Give-backs are sent in the background: until they land (5 s at
    // most), the debt may read higher.
    let landing = Instant::now();
    let debt = loop {
        let debt = limiter.snapshot().await.unwrap().wait();
        if debt <= INTERVAL || landing.elapsed() > Duration::from_secs(5) {
            break debt;
        }
        tokio::time::sleep(5 * MS).await;
    };
    println!("debt after 20 dropped acquires: {debt:?} ({timed_out} timed out)");
    assert!(debt <= INTERVAL, "debt left: {debt:?}");
    let stats = limiter.stats();
    assert!(!stats.degraded && stats.fallbacks == 0, "{stats:?}");
}

/// Callers that give up while their EVALSHA is still on the wire (a proxy
/// holds each request for 1 s; they wait 20 ms) have still reserved in
/// Redis: each late reply is awaited in the background and its reservation
/// given back. The debt left falls under one interval while keeping them
/// all would still leave more than two. The response timeout (5 s) never
/// abandons these round trips: this is the caller's drop alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_dropped_mid_round_trip_gives_its_reservation_back() {
    const CALLERS: u32 = 6;
    const LATENCY: Duration = Duration::from_secs(1);
    const INTERVAL: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let backend = backend_builder(proxy.client())
        .response_timeout(Duration::from_secs(5))
        .coalesce(false)
        .build()
        .await
        .unwrap();
    let limiter = RateLimiter::builder()
        .permits_per_second(1.0)
        .redis(&backend, "dropped-in-flight")
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    // The connection is open and the key holds one interval of debt.
    assert!(limiter.acquire(1).await.unwrap().is_zero());
    proxy.set_latency(LATENCY);
    let start = Instant::now();
    for i in 0..CALLERS {
        let dropped = tokio::time::timeout(Duration::from_millis(20), limiter.acquire(1)).await;
        assert!(dropped.is_err(), "caller {i} was not dropped: {dropped:?}");
    }
    let sent = start.elapsed();
    // Every request is still on its way to Redis (each takes 1 s); the
    // replies and the give-backs travel without delay.
    assert!(sent < LATENCY, "the callers took {sent:?}");
    proxy.set_latency(Duration::ZERO);
    // The last request reaches Redis 1 s after it was sent, its reply comes
    // back and its give-back goes out at once. A reservation is given back
    // only while its moment lies ahead (one whose moment passed before its
    // give-back arrived was "used"): once they land, every one kept has its
    // moment in the past, so the ticket is less than one interval ahead.
    // Kept, the reservations would end about CALLERS intervals after the
    // first request reached Redis (at `start` plus the latency, or later):
    // until less than two intervals of that are left, the two differ. The
    // debt is read once every request has reached Redis and come back: a
    // script call each (none coalesced), and one for each give-back (the
    // first request may have no wait to give back).
    // (Read before the first snapshot, itself a script call.)
    let mut landed = false;
    loop {
        let kept = (LATENCY + INTERVAL * CALLERS).saturating_sub(start.elapsed());
        landed = landed || server.evalsha_calls() >= u64::from(1 + CALLERS + CALLERS - 1);
        let debt = match landed {
            true => limiter.snapshot().await.unwrap().wait(),
            false => Duration::MAX,
        };
        if debt <= INTERVAL {
            println!(
                "debt after {CALLERS} callers dropped mid-round-trip: {debt:?} \
                 (about {kept:?} had they kept their reservations)"
            );
            break;
        }
        assert!(
            kept > INTERVAL * 2,
            "{kept:?} left had they kept their reservations, and {}",
            match landed {
                true => format!("{debt:?} of debt left"),
                false => format!("only {} script calls", server.evalsha_calls()),
            }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = limiter.stats();
    assert_eq!(stats.fallbacks, 0, "{stats:?}");
    assert!(!limiter.stats().degraded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_gives_its_slot_to_the_next_caller_through_redis() {
    const INTERVAL: Duration = Duration::from_secs(10);
    let server = RedisServer::start();
    // Patient, and one each 10 s: B's moment is still ahead when its
    // give-back lands, however late a loaded machine runs.
    let limiter = RateLimiter::builder()
        .permits_per_second(0.1)
        .redis(&patient_backend(server.client()).await, "slots")
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let a = limiter.reservation(1).await.unwrap();
    let second = Instant::now();
    let b = limiter.reservation(1).await.unwrap();
    // From before C's call: Redis's clock read C's slot after this.
    let third = Instant::now();
    let c = limiter.reservation(1).await.unwrap();
    let between = second.elapsed();
    // Redis's clock and this process's agree to a few ms only on a loaded
    // machine (once 10.4 ms there while 7.3 ms passed here): 100 ms of
    // slack, against the 10 s an interval counted wrong would be off.
    const CLOCKS: Duration = Duration::from_millis(100);
    assert!(a.delay().is_zero());
    // C one interval after B, less what Redis's clock ran between them.
    let (b_delay, c_delay) = (b.delay(), c.delay());
    assert!(
        c_delay <= b_delay + INTERVAL && c_delay + between + CLOCKS >= b_delay + INTERVAL,
        "{b_delay:?} {c_delay:?}, {between:?} apart"
    );
    drop(b);
    // The give-back lands in the background: within 5 s, half an interval,
    // the key's ticket is back at C's slot.
    let dropped = Instant::now();
    while limiter.snapshot().await.unwrap().wait() > c_delay && dropped.elapsed() < INTERVAL / 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let d = limiter.reservation(1).await.unwrap();
    let between = third.elapsed();
    // D is scheduled at C's slot (less the real time that passed since
    // before C's call, which Redis's clock cannot outrun), not one
    // interval later.
    assert!(
        d.delay() <= c_delay && d.delay() + between + CLOCKS >= c_delay,
        "C at {c_delay:?}, D at {:?}, {between:?} later",
        d.delay()
    );
    a.keep();
    c.keep();
    d.keep();
}
