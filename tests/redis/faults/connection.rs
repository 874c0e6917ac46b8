//! A connection that dies silently: a proxy that blackholes it.

use super::*;

/// The peer vanishes without FIN or RST: calls time out, the fallback
/// serves, and the probe's fresh connection brings the limiter back while
/// the old connection is still dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dead_connection_is_replaced() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = builder(proxy.client(), "silent", 1_000.0)
        .await
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();
    proxy.blackhole_existing();
    let start = Instant::now();
    let first = limiter.try_acquire(1, Duration::ZERO).await;
    let took = start.elapsed();
    assert!(matches!(first, Err(Error::Backend(_))), "{first:?}");
    assert!(took <= RESPONSE_TIMEOUT + SLACK, "the call took {took:?}");
    assert!(limiter.stats().degraded);
    let recovered = within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("the limiter went back to Redis");
    println!(
        "recovery after a silent connection death: {:?} after the failed call",
        recovered
    );
    assert!(
        limiter
            .try_acquire(1, Duration::from_secs(1))
            .await
            .unwrap()
    );
    let stats = limiter.stats();
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
}
