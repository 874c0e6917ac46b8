//! A server frozen with `SIGSTOP`: round trips queued on its socket run
//! late, when it resumes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_does_not_hang_callers() {
    let server = RedisServer::start();
    for fallback in [Fallback::Local, Fallback::FailClosed] {
        let limiter = limiter(&server, fallback).await;
        limiter.acquire(1).await.unwrap();
        server.stop();
        let (slowest, results) = timed_calls(&limiter, 10).await;
        server.cont();
        assert!(
            slowest <= RESPONSE_TIMEOUT + SLACK,
            "{fallback:?}: a call took {slowest:?}"
        );
        match fallback {
            Fallback::Local => assert!(results.iter().all(|r| r.is_ok()), "{results:?}"),
            _ => assert!(
                results
                    .iter()
                    .all(|r| matches!(r, Err(Error::Backend(e)) if e.is_timeout() || e.to_string().contains("unavailable"))),
                "{results:?}"
            ),
        }
        // Once the server runs again the probe brings the limiter back.
        let resumed = Instant::now();
        while limiter.stats().degraded {
            assert!(
                resumed.elapsed() < Duration::from_secs(3),
                "never recovered"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            limiter
                .try_acquire(1, Duration::from_secs(1))
                .await
                .unwrap()
        );
    }
}

/// `SIGSTOP`: the connection stays open and nothing answers. With the local
/// fallback, calls come back within the response timeout and are paced
/// locally; the probe's attempts fail without flapping while the server is
/// frozen, and the limiter is back on Redis shortly after `SIGCONT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_with_the_local_fallback_paces_locally_and_recovers_after_sigcont() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "frozen-local", 10.0)
        .await
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();
    tokio::time::sleep(2 * INTERVAL).await;

    server.stop();
    let stopped = Instant::now();
    let mut granted_at = Vec::new();
    while stopped.elapsed() < Duration::from_millis(800) {
        let call = Instant::now();
        let reservation = limiter.reservation(1).await.expect("the fallback serves");
        let took = call.elapsed();
        assert!(took <= CALL_BOUND, "a call took {took:?}");
        reservation.wait().await;
        granted_at.push(stopped.elapsed());
    }
    println!("frozen, local fallback: permits granted at {granted_at:?}");
    // The first call waited for the response timeout; from then on the
    // fallback grants one permit per interval (it opened with no burst).
    assert!(granted_at.len() >= 6, "{granted_at:?}");
    // (A late wake-up shortens the next gap, so the check is against the
    // schedule: the k-th permit never comes before k intervals.)
    for (k, at) in granted_at.iter().enumerate() {
        let earliest = granted_at[0] + INTERVAL * k as u32;
        assert!(
            *at + Duration::from_millis(5) >= earliest,
            "permit {k} granted at {at:?}: {granted_at:?}"
        );
    }
    let stats = limiter.stats();
    assert!(limiter.stats().degraded);
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");

    server.cont();
    let took = recovered(&limiter, "after SIGCONT").await;
    println!("frozen, local fallback: back on Redis {took:?} after SIGCONT");
    // Calls reach Redis again: the fallback serves no more of them.
    let served_locally = limiter.stats().fallback_calls;
    for _ in 0..3 {
        let call = Instant::now();
        limiter.acquire(1).await.unwrap();
        assert!(call.elapsed() <= INTERVAL + SLACK, "{:?}", call.elapsed());
    }
    let stats = limiter.stats();
    assert_eq!(stats.fallback_calls, served_locally, "{stats:?}");
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
}

/// `SIGSTOP` with [`Fallback::FailClosed`]: every call is refused with
/// [`Error::Backend`], the first after the response timeout, the others at
/// once; the limiter is back on Redis shortly after `SIGCONT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_with_fail_closed_refuses_quickly_and_recovers_after_sigcont() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "frozen-closed", 10.0)
        .await
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();

    server.stop();
    let stopped = Instant::now();
    let mut calls = 0;
    while stopped.elapsed() < Duration::from_millis(600) {
        let call = Instant::now();
        let result = limiter.try_acquire(1, Duration::from_secs(1)).await;
        let took = call.elapsed();
        match result {
            Err(Error::Backend(e)) => {
                if calls == 0 {
                    assert!(e.is_timeout(), "the first refusal is a timeout: {e}");
                }
            }
            other => panic!("expected Error::Backend, got {other:?}"),
        }
        // The first call waits for the response timeout; later ones are
        // refused without a round trip.
        let bound = if calls == 0 { CALL_BOUND } else { SLACK };
        assert!(took <= bound, "call {calls} took {took:?}");
        calls += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(calls >= 10, "{calls}");
    let stats = limiter.stats();
    assert!(limiter.stats().degraded);
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");

    server.cont();
    let took = recovered(&limiter, "after SIGCONT").await;
    println!("frozen, fail closed: back on Redis {took:?} after SIGCONT");
    assert!(
        limiter
            .try_acquire(1, Duration::from_secs(1))
            .await
            .unwrap()
    );
    let stats = limiter.stats();
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
}

/// Callers whose round trips outlive the response timeout
/// are served by the local fallback, but their EVALSHAs were sent: they run
/// when the frozen server resumes. The limiter still awaits those replies
/// and gives each late reservation back, so the first caller after the
/// recovery is not charged a second time for what the fallback already
/// granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_that_outlive_the_response_timeout_are_not_charged_twice() {
    const CALLERS: usize = 20;
    let server = RedisServer::start();
    let limiter = Arc::new(
        builder(server.client(), "orphans", 10.0)
            .await
            .max_burst(Duration::ZERO)
            .build()
            .unwrap(),
    );
    // The key exists and the connection is warm; then let the debt of that
    // first permit pass, so the fallback opens with none.
    limiter.acquire(1).await.unwrap();
    tokio::time::sleep(2 * INTERVAL).await;

    server.stop();
    // 20 callers at once, as a burst of requests would come: each one's
    // EVALSHA is queued on the frozen server's socket, each one times out
    // and is served by the local fallback, which paces them at 10/s.
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let start = Instant::now();
                let reservation = limiter.reservation(1).await;
                let took = start.elapsed();
                let delay = match reservation {
                    Ok(reservation) => Ok(reservation.wait().await),
                    Err(e) => Err(e),
                };
                (took, delay)
            })
        })
        .collect();
    let mut delays = Vec::new();
    for caller in callers {
        let (took, delay) = caller.await.unwrap();
        assert!(took <= CALL_BOUND, "a caller got its answer after {took:?}");
        delays.push(delay.expect("the local fallback serves"));
    }
    delays.sort();
    let stats = limiter.stats();
    assert!(limiter.stats().degraded);
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
    assert!(stats.fallback_calls >= CALLERS as u64, "{stats:?}");
    // Paced locally, one interval apart (the fallback opened with no burst).
    for (i, delay) in delays.iter().enumerate() {
        let expected = INTERVAL * i as u32;
        assert!(
            delay.abs_diff(expected) <= Duration::from_millis(60),
            "caller {i} waited {delay:?} locally: {delays:?}"
        );
    }
    // Every caller has now been served and the local schedule has run out,
    // so the fallback owes nothing: the probe's resume call carries no debt
    // into Redis. The 20 queued reservations are all that Redis will see.
    tokio::time::sleep(INTERVAL).await;

    server.cont();
    let took = recovered(&limiter, "after SIGCONT").await;
    // The give-backs are sent as soon as the late replies arrive, in the
    // background, racing the probe's own two round trips (connection setup,
    // then the script); a caller that reaches Redis before them is
    // scheduled behind reservations that are about to be given back. (The
    // give-backs normally win: they need one round trip after the late
    // replies, the probe two.) Real callers come a little after the very
    // instant of recovery.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pending = limiter.snapshot().await.unwrap().wait();
    let start = Instant::now();
    let waited = limiter.acquire(1).await.unwrap();
    let elapsed = start.elapsed();
    println!(
        "late replies: back on Redis {took:?} after SIGCONT; wait then {pending:?}; \
         the first caller waited {waited:?} ({elapsed:?} in all)"
    );
    // What may legitimately remain: the 20 late reservations are given back
    // one by one as their replies arrive, the earliest first. Each one that
    // is not the latest moves the ticket back by its own charge if its
    // moment is still ahead; the first one's moment (the server's clock when
    // it ran) has passed by then, so its charge stays: one interval. The
    // fallback's own debt, which the probe's resume call carries into Redis,
    // is at most one more interval here (its next free moment is one
    // interval after its last permit, which has just passed). Plus slack.
    // Charged twice, the wait would be 1.9 s.
    assert!(
        waited <= 2 * INTERVAL + Duration::from_millis(50),
        "the first caller after recovery waited {waited:?}"
    );
    assert!(elapsed <= 2 * INTERVAL + SLACK, "{elapsed:?}");
    assert!(!limiter.stats().degraded);
    let stats = limiter.stats();
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
}

/// The other half of item 6: while the fallback still owes time (it granted
/// permits whose waits have not all passed), the probe's resume call carries
/// that debt into Redis, so that callers through Redis queue behind the
/// callers the fallback scheduled. The late replies' give-backs must return
/// only their own charges, not that debt. The server resumes while the
/// probe is connecting (its resume then lands among the give-backs), at
/// several points of that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_give_backs_do_not_erase_the_debt_the_fallback_carried_into_redis() {
    const CALLERS: usize = 20;
    for offset_ms in [100, 115, 130, 145, 160, 175] {
        let server = RedisServer::start();
        let limiter = Arc::new(
            builder(server.client(), "carried", 10.0)
                .await
                .max_burst(Duration::ZERO)
                .build()
                .unwrap(),
        );
        limiter.acquire(1).await.unwrap();
        tokio::time::sleep(2 * INTERVAL).await;

        server.stop();
        let callers: Vec<_> = (0..CALLERS)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    let start = Instant::now();
                    let reservation = limiter.reservation(1).await.unwrap();
                    let took = start.elapsed();
                    // The caller waits for its permit in its own time. It
                    // was granted between the two readings: its moment is
                    // no sooner than `start` plus its delay, no later than
                    // now plus it (a loaded machine only parts them).
                    let delay = reservation.keep();
                    (took, start + delay, Instant::now() + delay)
                })
            })
            .collect();
        // When the last permit the fallback granted may be used, at the
        // soonest and at the latest.
        let (mut local_end, mut local_end_late) = (Instant::now(), Instant::now());
        for caller in callers {
            let (took, end, end_late) = caller.await.unwrap();
            assert!(took <= CALL_BOUND, "a caller got its answer after {took:?}");
            local_end = local_end.max(end);
            local_end_late = local_end_late.max(end_late);
        }
        // The switch happened about now; the probe's first connection
        // attempt runs from one to two probe intervals after it.
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        server.cont();
        let took = recovered(&limiter, "after SIGCONT").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Read before and after the call: however late it runs, Redis's
        // schedule is read between the two.
        let left_before = local_end_late.saturating_duration_since(Instant::now());
        let reservation = limiter.reservation(1).await.unwrap();
        let wait = reservation.delay();
        let local_left = local_end.saturating_duration_since(Instant::now());
        drop(reservation);
        println!(
            "SIGCONT {offset_ms} ms after the switch: back on Redis after {took:?}; \
             the first caller's wait {wait:?}, the fallback's schedule ends in {local_left:?}"
        );
        // The fallback's next free moment is one interval after its last
        // permit, and the resume call carries it into Redis: at least that
        // (less slack for the time between the readings), and at most one
        // more interval, left by the earliest late reservation (see the test
        // above), plus slack.
        assert!(
            wait + Duration::from_millis(60) >= local_left + INTERVAL,
            "SIGCONT at {offset_ms} ms: the first caller through Redis waits {wait:?} while the \
             fallback's callers are scheduled for {local_left:?} more"
        );
        assert!(
            wait <= left_before + 2 * INTERVAL + Duration::from_millis(60),
            "SIGCONT at {offset_ms} ms: charged twice: {wait:?}, the fallback owes {left_before:?}"
        );
    }
}

/// A round trip sent before the switch whose reply comes after it, in
/// time: its caller is granted by Redis while the fallback already holds
/// the key and grants from the debt Redis reported before. Both grants are
/// made; each must then count once in the schedule every process sees:
/// the carry-back adds what the fallback granted beyond the debt it opened
/// at, not beyond the debt Redis reported since (which holds the grant of
/// the reply that came in time, not the fallback's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_from_redis_after_the_switch_does_not_hide_the_fallbacks_grants() {
    let server = RedisServer::start();
    let backend = backend_builder(server.client())
        // Long enough for the second round trip's reply to come in time
        // after the first one's timed out, on a loaded machine.
        .response_timeout(2 * SECOND)
        .probe_interval(Duration::from_millis(500))
        .coalesce(false)
        .build()
        .await
        .unwrap();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1.0)
            .max_burst(Duration::ZERO)
            .redis(&backend, "in-time")
            .local_fraction(1.0)
            .build()
            .unwrap(),
    );
    // Ten seconds of debt, reported: the fallback opens after it, at K0.
    let warm = limiter.reservation(10).await.unwrap();
    assert!(warm.delay().is_zero());
    warm.keep();

    server.stop();
    // Times out: the switch. (It charges nothing anywhere.)
    let trigger = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.try_acquire(1, Duration::ZERO).await })
    };
    tokio::time::sleep(Duration::from_millis(900)).await;
    // Sent before the switch, answered after it, in time.
    let in_time = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            let reservation = limiter.reservation(1).await.unwrap();
            Instant::now() + reservation.keep()
        })
    };
    within(Duration::from_secs(10), || limiter.stats().degraded)
        .await
        .expect("the first round trip times out");
    assert_eq!(trigger.await.unwrap().ok(), Some(false));
    // Served by the fallback, at K0.
    let local = limiter.reservation(1).await.unwrap();
    let local_moment = Instant::now() + local.keep();
    server.cont();
    let redis_moment = in_time.await.unwrap();
    assert_eq!(
        limiter.stats().fallback_calls,
        2,
        "the second round trip was answered in time: {:?}",
        limiter.stats()
    );
    recovered(&limiter, "after SIGCONT").await;
    // The next caller, once the fallback's key is carried back.
    let next = limiter.reservation(1).await.unwrap();
    let next_moment = Instant::now() + next.keep();
    let first = local_moment.min(redis_moment);
    println!(
        "from the first of two grants (fallback {:?}, Redis {:?} after it): the next at {:?}",
        local_moment.saturating_duration_since(first),
        redis_moment.saturating_duration_since(first),
        next_moment.saturating_duration_since(first),
    );
    // Two permits at 1/s went from K0 on (one each side): the next goes
    // two seconds after the first of them, less slack.
    assert!(
        next_moment >= first + 2 * SECOND - Duration::from_millis(300),
        "the next caller goes {:?} after the first of two permits granted from K0",
        next_moment.saturating_duration_since(first)
    );
}

/// A reservation Redis reported before the switch, given back while the
/// server hangs: the give-back waits on the frozen socket and runs after
/// SIGCONT, once the fallback has opened the key behind it and granted
/// from there. Redis then owes less than the debt the key opened at: the
/// carry-back puts the fallback's grants where its callers wait, after
/// that debt, not after what Redis owes once the give-back ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_that_runs_after_the_switch_frees_no_slot_the_fallback_granted() {
    let server = RedisServer::start();
    let limiter = Arc::new(
        builder(server.client(), "given-back-late", 1.0)
            .await
            .max_burst(Duration::ZERO)
            .local_fraction(1.0)
            .build()
            .unwrap(),
    );
    limiter.reservation(1).await.unwrap().keep();
    // Held, a second ahead: the debt reported ends two seconds ahead (K0).
    let held = limiter.reservation(1).await.unwrap();
    assert!(held.delay() > SECOND / 2, "{:?}", held.delay());
    server.stop();
    // Given back on the frozen socket: it runs once the server resumes.
    drop(held);
    // The switch: the fallback opens the key at K0 and grants there.
    let local = limiter.reservation(1).await.unwrap();
    let local_moment = Instant::now() + local.keep();
    assert!(limiter.stats().degraded);
    server.cont();
    recovered(&limiter, "after SIGCONT").await;
    let next = limiter.reservation(1).await.unwrap();
    let next_moment = Instant::now() + next.keep();
    let after = next_moment.saturating_duration_since(local_moment);
    println!("the fallback's permit at K0; the next through Redis {after:?} after it");
    assert!(
        after + Duration::from_millis(300) >= SECOND,
        "the next caller went {after:?} after the fallback's permit"
    );
}
