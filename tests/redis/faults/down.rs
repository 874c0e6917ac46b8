//! A server killed (`SIGKILL`, restarted empty on the same port), or not
//! reachable when the service starts.

use super::*;

const MS: Duration = Duration::from_millis(1);

/// `SIGKILL`, then a new, empty server on the same port. (That the limiter
/// serves from its fallback and comes back: the `killed_redis_*` tests.) Here:
/// two instances of one limiter share the rate again after the restart, and
/// the key, lost in the crash, does not open with a burst: the probe's
/// resume call drops the stored permits a missing key would read as.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_on_the_same_port_instances_share_the_rate_again_without_a_burst() {
    let mut server = RedisServer::start();
    // The default burst: a missing key reads as 10 stored permits.
    let a = builder(server.client(), "restarted", 10.0)
        .await
        .build()
        .unwrap();
    let b = builder(server.client(), "restarted", 10.0)
        .await
        .build()
        .unwrap();
    assert!(a.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(b.try_acquire(1, Duration::ZERO).await.unwrap());

    server.kill();
    for limiter in [&a, &b] {
        for _ in 0..3 {
            let call = Instant::now();
            let result = limiter.try_acquire(1, Duration::ZERO).await;
            assert!(result.is_ok(), "the fallback serves: {result:?}");
            assert!(call.elapsed() <= CALL_BOUND, "{:?}", call.elapsed());
        }
        assert!(limiter.stats().degraded);
    }

    let restarted = Instant::now();
    server.restart();
    let took_a = recovered(&a, "a, after the restart").await;
    let took_b = recovered(&b, "b, after the restart").await;
    println!("restart: a back on Redis after {took_a:?}, b {took_b:?} later");
    // Whatever debt the fallbacks carried in, let it pass. The key stores
    // no burst: only what the clock stored since the resume, after the
    // restart began.
    let settled = Instant::now();
    let state = a.snapshot().await.unwrap();
    let (debt, stored) = (state.wait(), state.stored());
    assert!(debt <= 2 * INTERVAL, "{debt:?}");
    let since_restart = restarted.elapsed() + MS;
    assert!(
        stored <= since_restart.as_secs_f64() / INTERVAL.as_secs_f64(),
        "{stored} stored {since_restart:?} after the restart began"
    );
    tokio::time::sleep(debt + Duration::from_millis(10)).await;
    let (a_local, b_local) = (a.stats().fallback_calls, b.stats().fallback_calls);

    // On the clock of Redis, which runs no faster than ours: permits come
    // no sooner than one per interval after the debt ends, less what was
    // stored at the read; this many in `elapsed` since the read, at most.
    let most = |elapsed: Duration| {
        let accrued = (elapsed + MS).saturating_sub(debt).as_secs_f64() / INTERVAL.as_secs_f64();
        (stored + 1.0 + accrued).floor() as u32
    };
    assert!(a.try_acquire(1, Duration::ZERO).await.unwrap());
    // B sees A's permit: one rate, one key; and no stored permits (unless a
    // stalled machine let the interval pass).
    let b_got = b.try_acquire(1, Duration::ZERO).await.unwrap();
    assert!(
        !b_got || most(settled.elapsed()) >= 2,
        "b granted {:?} after the read",
        settled.elapsed()
    );
    let wait = b.snapshot().await.unwrap().wait();
    let since = settled.elapsed();
    let taken = 1 + u32::from(b_got);
    let due = (debt + INTERVAL * taken).saturating_sub(INTERVAL.mul_f64(stored));
    assert!(
        wait <= INTERVAL && wait + since + MS >= due,
        "{wait:?}, {since:?} after the read"
    );
    let mut granted = 0;
    for _ in 0..10 {
        for limiter in [&a, &b] {
            if limiter.try_acquire(1, Duration::ZERO).await.unwrap() {
                granted += 1;
            }
        }
    }
    let since = settled.elapsed();
    assert!(
        taken + granted <= most(since),
        "{granted} of 20 granted at once after the restart, {since:?} after the read"
    );
    let mut admin = server.connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg(a.redis_key())
        .query(&mut admin)
        .unwrap();
    assert!(exists, "the limiter's state is in the new server");
    for (limiter, local) in [(&a, a_local), (&b, b_local)] {
        let stats = limiter.stats();
        assert_eq!(stats.fallback_calls, local, "{stats:?}");
        assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_local_fallback_never_fails_and_recovers_after_restart() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, Fallback::Local).await;
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(!limiter.stats().degraded);

    server.kill();
    let (slowest, results) = timed_calls(&limiter, 50).await;
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert!(
        slowest <= RESPONSE_TIMEOUT + SLACK,
        "a call took {slowest:?}"
    );
    assert!(limiter.stats().degraded);
    let stats = limiter.stats();
    assert_eq!(stats.fallbacks, 1, "{stats:?}");
    assert!(stats.fallback_calls >= 50, "{stats:?}");

    server.restart();
    let restarted = Instant::now();
    while limiter.stats().degraded {
        assert!(
            restarted.elapsed() <= 2 * PROBE_INTERVAL + SLACK + RESPONSE_TIMEOUT,
            "still degraded {:?} after the restart",
            restarted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("back on Redis {:?} after the restart", restarted.elapsed());
    assert!(
        limiter
            .try_acquire(1, Duration::from_secs(1))
            .await
            .unwrap()
    );
    let mut conn = server.connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg(limiter.redis_key())
        .query(&mut conn)
        .unwrap();
    assert!(exists, "calls reach Redis again");
    assert_eq!(limiter.stats().recoveries, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_fail_closed_returns_backend_errors() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, Fallback::FailClosed).await;
    limiter.acquire(1).await.unwrap();
    server.kill();
    let (slowest, results) = timed_calls(&limiter, 20).await;
    assert!(
        slowest <= RESPONSE_TIMEOUT + SLACK,
        "a call took {slowest:?}"
    );
    for result in results {
        match result {
            Err(Error::Backend(e)) => assert!(e.to_string().contains("Redis"), "{e}"),
            other => panic!("expected Error::Backend, got {other:?}"),
        }
    }
    assert!(limiter.stats().degraded);
    assert!(matches!(limiter.snapshot().await, Err(Error::Backend(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_fail_open_grants() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, Fallback::FailOpen).await;
    server.kill();
    let (slowest, results) = timed_calls(&limiter, 20).await;
    assert!(
        slowest <= RESPONSE_TIMEOUT + SLACK,
        "a call took {slowest:?}"
    );
    assert!(
        results.into_iter().all(|r| r.unwrap()),
        "every call is granted"
    );
    assert_eq!(limiter.acquire(1_000_000).await.unwrap(), Duration::ZERO);
}

#[test]
fn blocking_calls_survive_a_killed_redis_too() {
    let mut server = RedisServer::start();
    let backend = backend_builder(server.client()).build_blocking().unwrap();
    let limiter = RateLimiter::builder()
        .permits_per_second(1000.0)
        .redis(&backend, "faults-blocking")
        .build()
        .unwrap();
    limiter.acquire_blocking(1).unwrap();
    server.kill();
    let start = Instant::now();
    for _ in 0..10 {
        limiter.acquire_blocking(1).unwrap();
    }
    assert!(start.elapsed() <= RESPONSE_TIMEOUT + SLACK + Duration::from_millis(20));
    assert!(limiter.stats().degraded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_starts_while_redis_is_down_and_switches_when_it_is_up() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    proxy.refuse_new(true);
    let start = Instant::now();
    let limiter = builder(proxy.client(), "down-at-start", 10.0)
        .await
        .build()
        .expect("builds while Redis is down");
    assert!(start.elapsed() <= RESPONSE_TIMEOUT * 2 + SLACK);
    assert!(limiter.stats().degraded);
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    // Failing fast is a choice.
    let strict = backend_builder(proxy.client())
        .require_connection(true)
        .build()
        .await;
    assert!(matches!(strict, Err(Error::Backend(_))), "{strict:?}");
    // Bad options still fail at once.
    let bad = builder(proxy.client(), "bad", -1.0).await.build();
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");

    proxy.refuse_new(false);
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("switches to Redis once it answers");
    assert_eq!(limiter.stats().recoveries, 1);
}

/// Callers that reach the fallback at the same instant are paced by it as
/// one limiter: the first of them opens it, and none is served before that
/// opening (which would erase its reservation and serve the next caller at
/// once too). The backend is down from the start, so every call goes
/// straight to the fallback; 4 threads released together, 200 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_open_the_fallback_together_are_paced_as_one() {
    const THREADS: usize = 4;
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    proxy.refuse_new(true);
    let backend = crate::support::poll::backend(proxy.client()).await;
    assert!(backend.stats().degraded);
    for round in 0..200 {
        let limiter = Arc::new(
            RateLimiter::builder()
                .redis(&backend, &format!("together-{round}"))
                .permits_per_second(1.0)
                .max_burst(Duration::ZERO)
                .build()
                .unwrap(),
        );
        let start = Arc::new(std::sync::Barrier::new(THREADS));
        let spawned = Instant::now();
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (limiter, start) = (Arc::clone(&limiter), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    futures::executor::block_on(limiter.reserve(1)).unwrap()
                })
            })
            .collect();
        let mut waits: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let took = spawned.elapsed();
        waits.sort();
        // One second apart from the opening, less the time between the
        // calls (a few microseconds; more on a loaded machine).
        for (i, wait) in waits.iter().enumerate() {
            let expected = Duration::from_secs(i as u64);
            assert!(
                *wait <= expected && *wait + took + MS >= expected,
                "round {round}: waits {waits:?}, {took:?} for the calls"
            );
        }
    }
}

/// A limiter saturated in Redis stays saturated when Redis dies: the local
/// fallback opens with the debt Redis last reported, not with a burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_opens_with_the_debt_not_a_burst() {
    let mut server = RedisServer::start();
    let limiter = builder(server.client(), "honest", 10.0)
        .await
        .build()
        .unwrap();
    // A burst of 10 and 5 more: about half a second of debt.
    for _ in 0..15 {
        limiter.reserve(1).await.unwrap();
    }
    server.kill();
    let mut granted = 0;
    for _ in 0..15 {
        if limiter.try_acquire(1, Duration::ZERO).await.unwrap() {
            granted += 1;
        }
    }
    assert!(limiter.stats().degraded);
    assert!(
        granted <= 1,
        "{granted} of 15 granted at once by the fallback"
    );
}

/// A restart that loses the key while a process owes it time: the
/// fallback opened the key behind the debt Redis had reported (callers
/// granted in Redis before the crash wait until then), and its own callers
/// come after that. Its carry-back finds the key gone: the debt it opened
/// behind is carried too, so that a process calling after the recovery
/// goes behind every caller this one granted, as it would had the key
/// survived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_the_key_keeps_the_debt_the_fallback_opened_behind() {
    let mut server = RedisServer::start();
    let limiter = builder(server.client(), "lost", 1.0)
        .await
        .max_burst(Duration::ZERO)
        .local_fraction(1.0)
        .build()
        .unwrap();
    // Five seconds of debt, reported (K0): granted in Redis, used by then.
    let warm = limiter.reservation(5).await.unwrap();
    assert!(warm.delay().is_zero());
    warm.keep();

    server.kill();
    // Served by the fallback, at K0.
    let local = limiter.reservation(1).await.unwrap();
    let local_moment = Instant::now() + local.keep();
    assert!(limiter.stats().degraded);
    server.restart();
    recovered(&limiter, "after the restart").await;
    // Carried back in the background: done once the fallback holds no key.
    within(Duration::from_secs(5), || limiter.stats().keys == 0)
        .await
        .expect("the key carried back");

    // Another process, started after the recovery.
    let other = builder(server.client(), "lost", 1.0)
        .await
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let next = other.reservation(1).await.unwrap();
    // After every permit granted: the five of the warm-up, then the
    // fallback's one.
    goes_after_the_fallbacks_permit(local_moment, Instant::now() + next.keep());
}

/// A server at its `maxclients` when the service starts: it accepts the
/// connection and answers `ERR max number of clients reached`. That is an
/// outage (waiting mends it), not a refusal of this client: the backend
/// builds and starts on its fallback, and switches once a connection is
/// free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_starts_while_redis_has_no_connection_to_spare() {
    let server = RedisServer::start();
    server.config_set("maxclients", "1");
    let hog = server.connection();
    let limiter = builder(server.client(), "full-house", 10.0)
        .await
        .build()
        .expect("builds while Redis has no connection to spare");
    assert!(limiter.stats().degraded);
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    drop(hog);
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("switches to Redis once a connection is free");
}

/// A key the fallback dropped at its cap while the server was down, the
/// server then killed for good and restarted empty: the key's first call
/// after the recovery charges it up to the ticket the fallback dropped,
/// and that charge finds the key lost. Five seconds of debt on `a`
/// reported (K0), the fallback's permit at K0, `a` dropped for `b`: the
/// next permit of `a` goes 1 s after the fallback's, as it would had the
/// key survived (before, 1 s after the recovery: the charge added only
/// the second past K0 to a fresh key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_a_key_the_fallback_dropped_keeps_its_debt() {
    let mut server = RedisServer::start();
    let backend = backend_builder(server.client()).build().await.unwrap();
    let limiter = paceline::KeyedRateLimiter::<String>::builder()
        .redis(&backend, "dropped-lost")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .local_fraction(1.0)
        .max_keys(1)
        .build()
        .unwrap();
    // Reported: `a` owes five seconds, `b` twenty (nearer to full, `a` is
    // the key the fallback drops).
    assert_eq!(limiter.reserve("a", 5).await.unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve("b", 20).await.unwrap(), Duration::ZERO);

    server.kill();
    let local = limiter.reserve("a", 1).await.unwrap();
    let local_moment = Instant::now() + local;
    assert!(limiter.stats().degraded);
    limiter.reserve("b", 1).await.unwrap();
    assert_eq!(limiter.stats().keys, 1, "`a` dropped at the cap");
    server.restart();
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("back on Redis after the restart");

    let next = limiter.reserve("a", 1).await.unwrap();
    goes_after_the_fallbacks_permit(local_moment, Instant::now() + next);
}

/// Asserts that the next caller after the recovery, at `next_moment`, goes
/// a second (at 1/s) after the fallback's last permit, at `local_moment`,
/// less slack for the time between the readings.
fn goes_after_the_fallbacks_permit(local_moment: Instant, next_moment: Instant) {
    println!(
        "the fallback's permit in {:?} after the recovery; the next then {:?}",
        local_moment.saturating_duration_since(Instant::now()),
        next_moment.saturating_duration_since(Instant::now()),
    );
    assert!(
        next_moment >= local_moment + SECOND - Duration::from_millis(300),
        "the next caller goes {:?} before the fallback's permit is paid for",
        (local_moment + SECOND).saturating_duration_since(next_moment)
    );
}

/// [`a_restart_that_lost_the_key_keeps_the_debt_the_fallback_opened_behind`]
/// with two limits, 1/s and 10/s: the fallback's grants are four seconds
/// of the first and 0.4 s of the second, and the reply to the carry-back's
/// resume (the latest of the limits' debts) shows the key lost. Every
/// limit gets back the whole debt the key opened behind: the other
/// process's next permit goes 4 s after the fallback's four, as the first
/// limit says (before, 0.4 s after: the debt carried again was less the
/// spread of the fallback's debts, as if every limit had been charged the
/// least of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_a_key_of_two_limits_keeps_the_debt_of_each() {
    // Ten seconds of debt on the first limit, one on the second; four
    // permits from the fallback.
    let (local, next) = lost_key_of_two_limits("lost-two", 10, 4).await;
    assert!(
        next >= local + 4 * SECOND - Duration::from_millis(300),
        "the next caller goes {:?} before the fallback's permits are paid for",
        (local + 4 * SECOND).saturating_duration_since(next)
    );
}

/// [`a_restart_that_lost_a_key_of_two_limits_keeps_the_debt_of_each`],
/// the fallback's debts spread wider than the debt the key opened behind:
/// five seconds of the first limit reported, twelve permits from the
/// fallback (12 s of the first limit, 1.2 s of the second). The resume's
/// reply, 12 s, reads the same whether Redis kept the key (its debt on
/// the second limit) or lost it; what Redis holds of each limit tells,
/// and the key lost gets its five seconds back (before, the next permit
/// went about 4 s before the fallback's were paid for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_a_key_of_two_limits_is_told_whatever_the_fallback_carries() {
    // Five seconds of debt on the first limit, 0.5 s on the second; twelve
    // permits from the fallback.
    let (local, next) = lost_key_of_two_limits("lost-two-wide", 5, 12).await;
    assert!(
        next >= local + 12 * SECOND - Duration::from_millis(300),
        "the next caller goes {:?} before the fallback's permits are paid for",
        (local + 12 * SECOND).saturating_duration_since(next)
    );
}

/// A limiter of two limits, 1/s and 10/s (burst 1 each), on `name`:
/// `reported` permits through Redis (K0), Redis killed, `local` permits
/// from the fallback at K0, Redis restarted empty and the key carried back
/// (the fallback holds no key); then another process's next permit.
/// Returns when the fallback's permits and that one may be used.
async fn lost_key_of_two_limits(name: &str, reported: u32, local: u32) -> (Instant, Instant) {
    let mut server = RedisServer::start();
    let build = |backend: &paceline::redis::RedisBackend| {
        RateLimiter::builder()
            .redis(backend, name)
            .limit(paceline::Limit::per_second(1.0).burst(1))
            .limit(paceline::Limit::per_second(10.0).burst(1))
            .local_fraction(1.0)
            .build()
            .unwrap()
    };
    let backend = backend_builder(server.client()).build().await.unwrap();
    let limiter = build(&backend);
    assert_eq!(limiter.reserve(reported).await.unwrap(), Duration::ZERO);

    server.kill();
    let wait = limiter.reserve(local).await.unwrap();
    let local_moment = Instant::now() + wait;
    assert!(limiter.stats().degraded);
    server.restart();
    recovered(&limiter, "after the restart").await;
    // Carried back in the background: done once the fallback holds no key.
    within(Duration::from_secs(5), || limiter.stats().keys == 0)
        .await
        .expect("the key carried back");

    let other_backend = backend_builder(server.client()).build().await.unwrap();
    let other = build(&other_backend);
    let next = other.reserve(1).await.unwrap();
    let next_moment = Instant::now() + next;
    println!(
        "the fallback's permits in {:?} after the restart; the other process's next then {:?}",
        local_moment.saturating_duration_since(Instant::now()),
        next_moment.saturating_duration_since(Instant::now()),
    );
    (local_moment, next_moment)
}

/// A key the fallback opens stores no burst, which the other processes may
/// have spent; a warming-up one starts cold, as a key Redis never saw
/// does, not warm (it started warm: at 10/s with a cold factor of 3 and
/// the fallback's own clock, the second request came 100 ms after the
/// first instead of about 300).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warming_up_key_opened_in_the_fallback_starts_cold() {
    use paceline::clock::FakeClock;
    let mut server = RedisServer::start();
    let clock = FakeClock::new();
    let backend = patient_backend(server.client()).await;
    let keyed = paceline::KeyedRateLimiter::<String>::builder()
        .redis(&backend, "cold")
        .permits_per_second(10.0)
        .warmup(SECOND)
        .local_fraction(1.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    server.kill();
    assert_eq!(keyed.reserve("a", 1).await.unwrap(), Duration::ZERO);
    assert!(keyed.stats().degraded);
    let second = keyed.reserve("a", 1).await.unwrap();
    assert!(
        second > Duration::from_millis(250),
        "the second request of a cold key waits only {second:?}"
    );
}
