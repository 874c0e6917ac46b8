//! Coalesced round trips (`.coalesce(true)`, the default): reservations of
//! one key that meet a round trip in flight go together in one call, and
//! each keeps every guarantee of a call of its own. Checked on a real
//! redis-server: the number of script calls Redis counted, the key's
//! schedule under saturation, callers that give up while queued or after
//! their batch was sent, an outage while a batch is in flight, and a caller
//! that leads its key's round trip and is then held unpolled or dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::support::limiter_state::{LimiterState, Value};
use crate::support::poll::{RESPONSE_TIMEOUT, backend_builder, builder};
use crate::support::proxy::Proxy;
use crate::support::redis_server::RedisServer;
use crate::support::within::within;
use paceline::redis::{Redis, RedisBackend, RedisBackendBuilder};
use paceline::{Builder, NoKey, RateLimiter};

/// A Redis limiter's builder at `rate` under `name`, on a backend of its
/// own built from `backend` (for the connection settings a test sets).
async fn builder_on(backend: RedisBackendBuilder, name: &str, rate: f64) -> Builder<NoKey, Redis> {
    RateLimiter::builder()
        .permits_per_second(rate)
        .redis(&backend.build().await.unwrap(), name)
}

fn reset_stats(server: &RedisServer) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.connection())
        .unwrap();
}

/// `tasks` tasks reserving 1 permit on `limiter` and sleeping until it is
/// theirs, until `run` after the first grant: the moment of every grant,
/// as the local clock reads it (the reply's arrival plus its wait), and the
/// key's state once the last reservation landed (read before its debt is
/// paid, as a paid key expires: `None` if this process was held up longer
/// than that).
async fn saturate(
    server: &RedisServer,
    limiter: &Arc<RateLimiter<Redis>>,
    tasks: usize,
    run: Duration,
) -> (Vec<Instant>, Option<LimiterState>) {
    let moments = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let reserving = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (limiter, moments) = (Arc::clone(limiter), moments.clone());
            let (stop, reserving) = (stop.clone(), reserving.clone());
            tokio::spawn(async move {
                loop {
                    reserving.fetch_add(1, Ordering::SeqCst);
                    if stop.load(Ordering::SeqCst) {
                        reserving.fetch_sub(1, Ordering::SeqCst);
                        break;
                    }
                    let wait = limiter.reserve(1).await.unwrap();
                    let moment = Instant::now() + wait;
                    moments.lock().unwrap().push(moment);
                    reserving.fetch_sub(1, Ordering::SeqCst);
                    tokio::time::sleep_until(moment.into()).await;
                }
            })
        })
        .collect();
    let first = loop {
        if let Some(first) = moments.lock().unwrap().iter().min() {
            break *first;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    tokio::time::sleep_until((first + run).into()).await;
    stop.store(true, Ordering::SeqCst);
    while reserving.load(Ordering::SeqCst) > 0 {
        tokio::task::yield_now().await;
    }
    let state = LimiterState::read(&mut server.connection(), "paceline:v1:hot");
    for handle in handles {
        handle.abort();
    }
    let mut moments = std::mem::take(&mut *moments.lock().unwrap());
    moments.sort();
    (moments, state)
}

/// 256 tasks on one key at 10 000/s with no burst, for 2 s: the key's
/// schedule holds every grant at least 1/rate after the one before (its
/// ticket moved by 100 µs per reservation at the least: no permit granted
/// twice), no grant is seen in real time before its place in that schedule,
/// and far fewer script calls than reservations went to Redis. All three
/// hold however slowly the machine runs this process; how close to rate ×
/// time a saturated key stays is the benchmark's to measure (it is within
/// 0.1% on a quiet machine, printed here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_hot_key_coalesces_and_keeps_its_schedule_exact() {
    const RATE: f64 = 10_000.0;
    const RUN: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let limiter = Arc::new(
        builder_on(
            backend_builder(server.client()).response_timeout(Duration::from_secs(2)),
            "hot",
            RATE,
        )
        .await
        .max_burst(Duration::ZERO)
        .build()
        .unwrap(),
    );
    // 50 ms of debt first: the tasks' reservations queue behind it, on the
    // grid of its ticket, which starts after `before`.
    let before = Instant::now();
    limiter.reserve(500).await.unwrap();
    let start = LimiterState::read(&mut server.connection(), "paceline:v1:hot");
    reset_stats(&server);
    let (moments, end) = saturate(&server, &limiter, 256, RUN).await;
    let calls = server.evalsha_calls();
    let total = moments.len() as u64;
    let in_window = moments.iter().filter(|m| **m < moments[0] + RUN).count();
    let expected = RUN.as_secs_f64() * RATE;
    println!(
        "{in_window} grants in {RUN:?} at {RATE}/s ({:+.3}%); {total} in all, in {calls} \
         script calls",
        (in_window as f64 - expected) / expected * 100.0
    );
    // Every reservation moved the ticket by one interval (100 µs, 2^20
    // units each) from where the first debt left it, or more where the key
    // went idle (this process held up longer than the 25.6 ms its 256 tasks
    // hold ahead): never less. A paid key expires: one held up past its
    // debt, at either end, leaves no span to read (a stalled machine), and
    // the two checks below still hold.
    let interval = 100u128 << 20;
    if let (Some(start), Some(end)) = (start, end) {
        let span = end.ticket_units() - start.ticket_units();
        let scheduled = u128::from(total) * interval;
        assert!(
            span >= scheduled,
            "{total} reservations in {span} units: some overlap"
        );
        println!("the schedule's gaps: {} µs", (span - scheduled) >> 20);
    } else {
        println!("the key expired before it was read: this process was held up");
    }
    // The k-th grant seen (each is its reply's arrival plus its wait, so
    // never before its place in the schedule, however late) comes at least
    // 50 ms + k intervals after `before`: none early. (Redis's clock and
    // this process's agree to well within the millisecond allowed.)
    for (k, moment) in moments.iter().enumerate() {
        let due = Duration::from_millis(50) + Duration::from_micros(100 * k as u64);
        assert!(
            *moment + Duration::from_millis(1) >= before + due,
            "grant {k} seen {:?} after the start, due at {due:?}",
            moment.duration_since(before)
        );
    }
    assert!(
        calls * 4 < total,
        "{calls} script calls for {total} reservations: not coalesced"
    );
}

/// With `.coalesce(false)` every reservation is a script call of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_coalescing_every_reservation_is_its_own_call() {
    let server = RedisServer::start();
    let limiter = Arc::new(
        builder_on(
            // Patient: a late reply must not send a call to the fallback,
            // which would leave it out of Redis's count.
            backend_builder(server.client())
                .response_timeout(Duration::from_secs(5))
                .coalesce(false),
            "alone",
            1e9,
        )
        .await
        .build()
        .unwrap(),
    );
    reset_stats(&server);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                for _ in 0..50 {
                    limiter.reserve(1).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(server.evalsha_calls(), 64 * 50);
}

/// A limiter at 10/s with no burst behind a proxy that delays every
/// chunk by `latency` each way from now on; its connection is open, the
/// key was used once and that permit's interval has passed, and Redis's
/// call counts start from zero.
async fn behind_a_slow_proxy(
    name: &str,
    latency: Duration,
) -> (RedisServer, Proxy, Arc<RateLimiter<Redis>>) {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = Arc::new(
        builder_on(
            backend_builder(proxy.client()).response_timeout(Duration::from_secs(2)),
            name,
            10.0,
        )
        .await
        .max_burst(Duration::ZERO)
        .build()
        .unwrap(),
    );
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    tokio::time::sleep(Duration::from_millis(150)).await;
    reset_stats(&server);
    proxy.set_latency(latency);
    (server, proxy, limiter)
}

/// Callers queued behind a slow round trip that give up before it ends
/// send nothing and are charged nothing: only the first caller's permit
/// is on the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_while_queued_are_never_sent() {
    const LATENCY: Duration = Duration::from_millis(200);
    let (server, proxy, limiter) = behind_a_slow_proxy("queued", LATENCY).await;
    // The lead: one reservation, in flight for 200 ms.
    let lead = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.reserve(1).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Twenty callers queue behind it and give up after 50 ms.
    let queued: Vec<_> = (0..20)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(50), limiter.reserve(1)).await
            })
        })
        .collect();
    for caller in queued {
        assert!(caller.await.unwrap().is_err(), "a queued caller was served");
    }
    assert_eq!(lead.await.unwrap(), Duration::ZERO);
    proxy.set_latency(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(server.evalsha_calls(), 1, "only the lead was sent");
    // The key holds the lead's permit alone: one interval from its moment.
    let debt = limiter.snapshot().await.unwrap().wait();
    assert!(debt <= Duration::from_millis(100), "debt {debt:?}");
}

/// Callers whose batch was sent, and who give up before its reply, have
/// their reservations given back: the key ends where it was before them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_after_their_batch_was_sent_give_it_back() {
    // Each way: a round trip takes twice this. Long enough that a loaded
    // machine's delays fit in each step below, which waits for what Redis
    // counted, not for a time.
    const LATENCY: Duration = Duration::from_millis(500);
    let (server, proxy, limiter) = behind_a_slow_proxy("sent", LATENCY).await;
    let lead = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.reserve(1).await.unwrap() }
    });
    // Once the lead reached Redis, its reply is on its way back for
    // `LATENCY`: ten callers queue behind it meanwhile, and their batch
    // goes when the reply is back.
    let calls = |n: u64| evalsha_reached(&server, n, Duration::from_secs(10));
    calls(1).await.expect("the lead reached Redis");
    let queued: Vec<_> = (0..10)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { drop(limiter.reservation(1).await) })
        })
        .collect();
    lead.await.unwrap();
    // Once the batch reached Redis, its reply is on its way back for
    // `LATENCY`: the callers give up meanwhile, after it was sent.
    calls(2).await.expect("the batch reached Redis");
    for caller in &queued {
        caller.abort();
    }
    for caller in queued {
        let gave_up = caller.await.is_err_and(|e| e.is_cancelled());
        assert!(gave_up, "a queued caller was served");
    }
    proxy.set_latency(Duration::ZERO);
    // The batch's reply arrives; the give-backs go out at once: the lead,
    // the batch, and a give-back per grant that can return anything (the
    // first of the batch was granted at once: the lead's interval had
    // passed when the batch reached Redis, and a give-back of a grant that
    // did not wait, with later ones after it, returns nothing, so it has
    // none).
    calls(2 + 9).await.expect("the give-backs reached Redis");
    // (And no more come.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.evalsha_calls(), 2 + 9);
    // Kept, the ten would leave about a second of debt.
    let debt = limiter.snapshot().await.unwrap().wait();
    assert!(debt <= Duration::from_millis(100), "debt {debt:?}");
}

/// A key whose ids run out (its next_id written elsewhere, here 2^53 - 2:
/// one id left) gives its last to a held reservation, then none: a batch
/// of held reservations that waits finds none left, and its callers, who
/// give their grants up at once, give back nothing, not the reservation
/// that holds the last id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_finds_no_id_left_gives_back_no_other_reservation() {
    const LATENCY: Duration = Duration::from_millis(200);
    const LAST_ID: f64 = 9_007_199_254_740_990.0; // 2^53 - 2
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    // One permit in 10 s: every reservation below waits, and the held one
    // stays in the key's log (its moment ahead) to the end.
    let limiter = Arc::new(
        builder_on(
            backend_builder(proxy.client()).response_timeout(Duration::from_secs(2)),
            "last-id",
            0.1,
        )
        .await
        .max_burst(Duration::ZERO)
        .build()
        .unwrap(),
    );
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    let key = "paceline:v1:last-id";
    let mut con = server.connection();
    let value = Value::read(&mut con, key).unwrap();
    let value = Value {
        next_id: LAST_ID,
        ..value
    };
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value.encode())
        .arg("PX")
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    let held = limiter.reservation(1).await.unwrap();
    let logged = |con: &mut redis::Connection| {
        let value = Value::read(con, key).unwrap();
        value
            .log
            .iter()
            .map(|request| request[0])
            .collect::<Vec<f64>>()
    };
    assert_eq!(logged(&mut con), [LAST_ID], "the held one has the last id");
    reset_stats(&server);
    proxy.set_latency(LATENCY);
    // A lead in flight; ten callers queue behind it, go as one batch once
    // its reply is back, and give their grants up as soon as they come.
    let lead = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.reserve(1).await.unwrap() }
    });
    let calls = |n: u64| evalsha_reached(&server, n, Duration::from_secs(10));
    calls(1).await.expect("the lead reached Redis");
    let queued: Vec<_> = (0..10)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let reservation = limiter.reservation(1).await.unwrap();
                assert!(reservation.delay() > Duration::ZERO);
            })
        })
        .collect();
    lead.await.unwrap();
    for caller in queued {
        caller.await.unwrap();
    }
    proxy.set_latency(Duration::ZERO);
    // (Any give-backs they sent have landed.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        server.evalsha_calls() >= 2,
        "the ten went in batches behind the lead"
    );
    assert!(
        logged(&mut con).contains(&LAST_ID),
        "the held reservation with the last id was given back by another: {:?}",
        logged(&mut con)
    );
    // Its own give-back takes it, from a key still read.
    drop(held);
    within(Duration::from_secs(10), || {
        !logged(&mut server.connection()).contains(&LAST_ID)
    })
    .await
    .expect("the held reservation was given back");
}

/// A try queued behind its key's round trip counts its timeout from its
/// call, not from its batch's: the time it waited queued is part of its
/// wait. At 10/s a lead reserves 2.2 s of permits; a try of 1 s, called
/// once the lead reached Redis, waits for the lead's reply (`LATENCY`),
/// then its batch reads Redis's clock `LATENCY` later, 1.6 s after the
/// lead: 0.6 s owed then, 2.2 s from its call (1.4 s from its batch's
/// dispatch: refused). Counted from the batch's clock reading, it fits and
/// is granted a moment about 2.2 s after its call. (It is refused while
/// the try's lateness after the lead and its batch's lateness past
/// `LATENCY` add up to less than 0.4 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_queued_behind_a_round_trip_counts_its_timeout_from_its_call() {
    const LATENCY: Duration = Duration::from_millis(800);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = Arc::new(
        builder_on(
            backend_builder(proxy.client()).response_timeout(Duration::from_secs(10)),
            "queued-try",
            10.0,
        )
        .await
        .max_burst(Duration::ZERO)
        .build()
        .unwrap(),
    );
    // (The connection open and the script loaded; the permit's interval
    // passed.)
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    tokio::time::sleep(Duration::from_millis(150)).await;
    reset_stats(&server);
    proxy.set_latency(LATENCY);
    let lead = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.reserve(22).await.unwrap() }
    });
    within(Duration::from_secs(10), || server.evalsha_calls() >= 1)
        .await
        .expect("the lead reached Redis");
    let called = Instant::now();
    let fits = limiter
        .try_acquire(1, Duration::from_secs(1))
        .await
        .unwrap();
    let took = called.elapsed();
    assert_eq!(lead.await.unwrap(), Duration::ZERO);
    assert_eq!(server.evalsha_calls(), 2, "the try went behind the lead");
    assert!(
        !fits,
        "a try of 1 s was granted {took:?} after its call, its permit about 2.2 s after it"
    );
}

/// Redis dies while a batch is in flight: every caller in it (and queued
/// behind it) is served by the local fallback, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_mid_batch_sends_each_caller_to_its_fallback_once() {
    const CALLERS: u64 = 30;
    let mut server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = Arc::new(
        builder_on(
            backend_builder(proxy.client()).response_timeout(Duration::from_millis(300)),
            "outage",
            1000.0,
        )
        .await
        .build()
        .unwrap(),
    );
    limiter.reserve(1).await.unwrap();
    // On a loaded machine that first call (a connection, the script's
    // load) may outrun the timeout and go to the fallback: counted from
    // once the limiter is on Redis.
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("on Redis before the outage");
    let before = limiter.stats();
    proxy.set_latency(Duration::from_millis(100));
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.reserve(1).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.kill();
    for caller in callers {
        caller.await.unwrap().expect("the fallback serves");
    }
    let stats = limiter.stats();
    assert!(limiter.stats().degraded);
    assert_eq!(stats.fallbacks - before.fallbacks, 1, "{stats:?}");
    assert_eq!(
        stats.fallback_calls - before.fallback_calls,
        CALLERS,
        "{stats:?}, {before:?} before"
    );
}

/// A caller queued behind a slow round trip whose own wait ends before its
/// batch's reply (its timer runs from when it queued, the batch's from when
/// it was sent) is served by the fallback; its batch's reply comes later,
/// in time for the batch, with the grant Redis made for it too (at once:
/// no id to give it back by). Redis is back before that reply: the key's
/// carry-back must wait for it, as for a call of its own whose caller
/// stopped waiting, so that the grant is known and the caller counts once,
/// not twice (which put the next caller most of an interval late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_left_its_batch_in_flight_is_carried_back_once() {
    // Each way. The lead reaches Redis at L (its interval ends at L + I);
    // the caller queues then and stops waiting at L + 5 s; its batch goes
    // at 2L, reaches Redis at 3L (granted at once) and its reply comes at
    // 4L, within the batch's own 5 s (to 7L).
    const LATENCY: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_secs(3);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = Arc::new(
        builder_on(
            backend_builder(proxy.client()).response_timeout(Duration::from_secs(5)),
            "left-in-flight",
            1.0 / INTERVAL.as_secs_f64(),
        )
        .await
        .max_burst(Duration::ZERO)
        .local_fraction(1.0)
        .build()
        .unwrap(),
    );
    // The connection opens, charging nothing.
    limiter.snapshot().await.unwrap();
    reset_stats(&server);
    proxy.set_latency(LATENCY);
    let calls = |n: u64| evalsha_reached(&server, n, Duration::from_secs(20));
    let lead = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.acquire(1).await.unwrap() }
    });
    calls(1).await.expect("the lead reached Redis");
    let queued = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.acquire(1).await.unwrap() }
    });
    lead.await.unwrap();
    // The batch reached Redis, granted at once: its reply, read by the
    // proxy now, comes one way later. Redis answers at once from now on.
    calls(2).await.expect("the batch reached Redis");
    let granted = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_latency(Duration::ZERO);
    queued.await.unwrap();
    assert_eq!(limiter.stats().fallback_calls, 1, "{:?}", limiter.stats());
    within(Duration::from_secs(20), || !limiter.stats().degraded)
        .await
        .expect("back on Redis");
    let next = limiter.reservation(1).await.unwrap();
    let next_moment = Instant::now() + next.keep();
    let after = next_moment.saturating_duration_since(granted);
    println!("the caller that left its batch was granted in Redis; the next {after:?} after it");
    // One interval after its grant in Redis (the fallback's, a little
    // later, counted in it); the fallback's carried on top, later still.
    assert!(
        after + INTERVAL / 3 >= INTERVAL && after < INTERVAL + INTERVAL / 3,
        "the next caller went {after:?} after the grant of the one that left its batch"
    );
}

/// A limiter with several limits coalesces too, and its batches keep every
/// limit: 64 tasks trying for permits as fast as they can get a reply, for
/// about a second, get the per-minute limit's burst and what it refills in
/// that time, no more, in far fewer script calls than tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_coalesce_and_keep_every_limit() {
    use paceline::Limit;
    let server = RedisServer::start();
    let limiter = Arc::new(
        RateLimiter::builder()
            .redis(
                &RedisBackend::builder(server.client())
                    .response_timeout(Duration::from_secs(2))
                    .build()
                    .await
                    .unwrap(),
                "several-hot",
            )
            .limit(Limit::per_second(1_000.0).burst(21))
            .limit(Limit::per(600.0, Duration::from_secs(60)).burst(31))
            .build()
            .unwrap(),
    );
    reset_stats(&server);
    let start = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let (mut tries, mut granted) = (0u64, 0u64);
                while start.elapsed() < Duration::from_secs(1) {
                    tries += 1;
                    granted += u64::from(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
                }
                (tries, granted)
            })
        })
        .collect();
    let (mut tries, mut granted) = (0, 0);
    for task in tasks {
        let (t, g) = task.await.unwrap();
        tries += t;
        granted += g;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let calls = server.evalsha_calls();
    println!("{granted} of {tries} tries granted in {elapsed:.3} s, in {calls} script calls");
    // The per-minute limit binds: its burst of 30, one more at once (its
    // cost is pre-consumed: the next caller pays), then 10/s.
    let most = 31.0 + 10.0 * elapsed;
    assert!(
        granted as f64 <= most,
        "{granted} granted, at most {most:.1}"
    );
    assert!(
        granted as f64 >= most - 3.0,
        "{granted} granted, {most:.1} allowed"
    );
    assert!(calls * 4 < tries, "{calls} script calls for {tries} tries");
}

// A caller that leads its key's round trip and is then held unpolled (a
// `select!` arm not polled, a `join!` beside blocking work) holds up no
// other caller of the key: the round trip goes on without it.

/// How long a caller that led its key's round trip is held unpolled.
const HOLD: Duration = Duration::from_secs(3);

/// The most another caller of the key may take meanwhile: two round trips
/// on loopback (the one it queued behind and its own), with room for a
/// loaded machine, and well under the hold.
const PROMPT: Duration = Duration::from_secs(1);

/// A call, boxed so that it can be held on a task of its own.
type Held = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A lead held unpolled, or dropped, mid round trip.
mod held;

/// A batch Redis refuses (its key holds a value that is not the limiter's)
/// fails each of its callers with the same error, said once: the copy for
/// each caller was made from the error's whole text, prefix included, so
/// it read "backend error: backend error: Redis refused …".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batchs_callers_each_get_the_error_said_once() {
    let server = RedisServer::start();
    let backend = backend_builder(server.client()).build().await.unwrap();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1_000.0)
            .redis(&backend, "refused-batch")
            .build()
            .unwrap(),
    );
    let _: () = redis::cmd("SET")
        .arg(limiter.redis_key())
        .arg("not the limiter's")
        .query(&mut server.connection())
        .unwrap();
    reset_stats(&server);
    let callers: Vec<_> = (0..64)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.reserve(1).await })
        })
        .collect();
    for caller in callers {
        let error = caller.await.unwrap().unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, paceline::Error::Backend(_)), "{error:?}");
        assert_eq!(text.matches("backend error").count(), 1, "{text}");
        assert!(text.contains("not recognise"), "{text}");
    }
    // Some went in a batch (fewer script calls than callers), or the test
    // proved nothing.
    let calls = server.script_calls();
    assert!(
        calls < 64,
        "{calls} script calls for 64 callers: none was batched"
    );
}

/// Reservations that went together in one batch, on a key that learned a
/// lower rate from an upstream, read their state at that rate, as the
/// key's own read does: the batch's reply carries what the key learned
/// (it did not: the five read the configured 100 a second, not 9.7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_on_a_key_that_learned_reads_the_learned_rate() {
    const LATENCY: Duration = Duration::from_millis(200);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let limiter = Arc::new(
        builder_on(
            backend_builder(proxy.client()).response_timeout(Duration::from_secs(2)),
            "batch-learned",
            100.0,
        )
        .await
        .build()
        .unwrap(),
    );
    let call = limiter.call(1).await.unwrap();
    call.learn(&paceline::outbound::Feedback::from_headers(
        200,
        [("RateLimit-Policy", &b"10;w=1"[..])],
        std::time::SystemTime::now(),
    ));
    drop(call);
    let mut learned = 100.0;
    for _ in 0..400 {
        learned = limiter.snapshot().await.unwrap().rate();
        if learned < 100.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(learned < 100.0, "the key never learned: {learned}");
    // A debt of 10 s keeps the key (which forgets what it learned once it
    // expires, when it reads as full).
    limiter.reserve(100).await.unwrap();
    reset_stats(&server);
    proxy.set_latency(LATENCY);
    // A lead in flight, and five callers queued behind it: one batch.
    let lead = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { kept_snapshot(&limiter).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let queued: Vec<_> = (0..5)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { kept_snapshot(&limiter).await })
        })
        .collect();
    let mut rates = vec![lead.await.unwrap().unwrap().rate()];
    for caller in queued {
        rates.push(caller.await.unwrap().unwrap().rate());
    }
    assert_eq!(server.evalsha_calls(), 2, "the lead, then one batch");
    assert_eq!(rates, [learned; 6]);
}

/// A reservation of one permit's own snapshot; the reservation is kept.
async fn kept_snapshot(limiter: &RateLimiter<Redis>) -> Option<paceline::Snapshot> {
    let reservation = limiter.reservation(1).await.unwrap();
    let snapshot = reservation.snapshot();
    reservation.keep();
    snapshot
}

/// Redis answers every round trip well within the response timeout (1.4 s
/// of 2 s), but a caller queued behind one waits for it and then for its
/// own batch (2.8 s): past its time it goes to its fallback, as promised,
/// and Redis, which was never given the whole response timeout for that
/// caller's request, is not marked down (it was: every limiter of the
/// backend then served from its fallback until the probe saw Redis again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_queued_past_its_time_does_not_mark_a_prompt_redis_down() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    const LATENCY: Duration = Duration::from_millis(700);
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let backend = backend_builder(proxy.client())
        .response_timeout(TIMEOUT)
        .build()
        .await
        .unwrap();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1_000.0)
            .redis(&backend, "queued-past-its-time")
            .build()
            .unwrap(),
    );
    // The connection opens and the script loads.
    limiter.snapshot().await.unwrap();
    proxy.set_latency(LATENCY);
    let lead = tokio::spawn({
        let limiter = Arc::clone(&limiter);
        async move { limiter.reserve(1).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    let queued = limiter.reserve(1).await;
    let waited = start.elapsed();
    assert_eq!(lead.await.unwrap().unwrap(), Duration::ZERO);
    println!(
        "the queued caller waited {waited:?}: {queued:?}; {:?}",
        backend.stats()
    );
    assert_eq!(queued.unwrap(), Duration::ZERO);
    assert!(
        waited < TIMEOUT + Duration::from_millis(500),
        "waited {waited:?}"
    );
    assert_eq!(backend.stats().fallbacks, 0, "{:?}", backend.stats());
    assert!(!backend.stats().degraded);
    // A lone caller is served by Redis, as every round trip was in time.
    limiter.reserve(1).await.unwrap();
    assert_eq!(limiter.stats().fallbacks, 0, "{:?}", limiter.stats());
}

/// Waits until `server` has counted `n` EVALSHA calls, at most `limit`:
/// how long that took, or `None`.
async fn evalsha_reached(server: &RedisServer, n: u64, limit: Duration) -> Option<Duration> {
    within(limit, || server.evalsha_calls() >= n).await
}
