//! What the limiters count while Redis fails: each call the fallback
//! serves is one fallback call, however its key's carry-back made it wait.

use super::*;
use paceline::KeyedRateLimiter;

/// A key served by the fallback is being carried back when Redis fails
/// again (its carry-back waits for a round trip lost on a dead
/// connection): a call of the key then waits for the carry-back and is
/// served by the fallback once, counted once, as its limiter's and the
/// backend's fallback call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_waits_for_a_carry_back_is_one_fallback_call() {
    // Wide: the carry-back waits this long for the lost round trip, and
    // the calls below happen within it.
    const TIMEOUT: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let backend = backend_builder(proxy.client())
        .response_timeout(TIMEOUT)
        .coalesce(false)
        .build()
        .await
        .unwrap();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1_000.0)
        .redis(&backend, "counted")
        .build()
        .unwrap();
    let (held, other) = ("held".to_owned(), "other".to_owned());
    limiter.acquire(&held, 1).await.unwrap();
    limiter.acquire(&other, 1).await.unwrap();
    // The connection dies silently: the call's round trip is lost, still
    // awaited, and the fallback serves it.
    proxy.blackhole_existing();
    limiter.acquire(&held, 1).await.unwrap();
    assert_eq!(limiter.stats().fallback_calls, 1, "{:?}", limiter.stats());
    // The probe's fresh connection brings Redis back: the key's carry-back
    // starts, and waits for the lost round trip.
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("back on Redis");
    let back = Instant::now();
    // Redis refuses writes: another key's call finds it down, and the
    // fallback serves it.
    server.config_set("maxmemory-policy", "noeviction");
    server.config_set("maxmemory", "1");
    limiter.acquire(&other, 1).await.unwrap();
    assert!(limiter.stats().degraded, "{:?}", limiter.stats());
    // The held key's call: its carry-back is under way, so it waits for
    // that, then the fallback serves it.
    limiter.acquire(&held, 1).await.unwrap();
    let took = back.elapsed();
    let stats = limiter.stats();
    println!("{took:?} after the recovery: {stats:?}");
    // (If the carry-back had ended before, the call did not wait, and the
    // count holds all the same.)
    assert_eq!(stats.fallback_calls, 3, "{stats:?}");
    assert_eq!(backend.stats().fallback_calls, 3, "{:?}", backend.stats());
    server.config_set("maxmemory", "0");
}
