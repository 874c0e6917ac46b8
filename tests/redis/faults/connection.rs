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

/// The connection is reset after Redis ran the script and before its reply
/// came back: the grant stays charged in Redis (its id never reached the
/// caller, so nothing gives it back, wrongly or not), the fallback serves
/// the caller, and its grant is carried back too. The permit is counted
/// twice, erring towards limiting, never once less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_lost_after_the_script_ran_is_charged_twice_never_given_back() {
    const ONE_WAY: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let backend = backend_builder(proxy.client())
        .response_timeout(4 * ONE_WAY)
        .coalesce(false)
        .build()
        .await
        .unwrap();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1.0)
            .max_burst(Duration::ZERO)
            .redis(&backend, "reset-after")
            .local_fraction(1.0)
            .build()
            .unwrap(),
    );
    // A second of debt, reported (K0).
    limiter.reservation(1).await.unwrap().keep();
    proxy.set_latency(ONE_WAY);
    let lost = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            let reservation = limiter.reservation(1).await.unwrap();
            Instant::now() + reservation.keep()
        })
    };
    // The request reaches Redis after one way; its reply, read by the
    // proxy then, is due one way later: reset between the two.
    tokio::time::sleep(ONE_WAY + ONE_WAY / 2).await;
    proxy.reset_all();
    proxy.set_latency(Duration::ZERO);
    let lost_moment = lost.await.unwrap();
    assert_eq!(limiter.stats().fallback_calls, 1, "{:?}", limiter.stats());
    recovered(&limiter, "after the reset").await;
    let next = limiter.reservation(1).await.unwrap();
    let next_moment = Instant::now() + next.keep();
    let after = next_moment.saturating_duration_since(lost_moment);
    println!("the caller whose reply was lost went at K0; the next {after:?} after it");
    // One second for its permit, a second more for the charge Redis kept
    // (if a stalled proxy reset the connection before the request went,
    // Redis charged nothing: one second): never less, never more.
    assert!(
        after + Duration::from_millis(300) >= SECOND && after <= 2 * SECOND + SLACK,
        "the next caller went {after:?} after the one whose reply was lost"
    );
}
