//! Whole-server outages, each one real: a server frozen with `SIGSTOP`
//! (round trips queued on its socket run late, when it resumes), a server
//! crashed with `SIGKILL` and restarted empty on the same port, a replica
//! that answers `READONLY`, a server busy with a script (`BUSY`), reloading
//! its data (`LOADING`) or cut off from its primary (`MASTERDOWN`), and a
//! cluster that loses one primary. Each test asserts what a user sees:
//! every call returns within the response timeout plus slack, the
//! configured fallback serves while Redis is unavailable, the limiter
//! switches once and back once, and nothing is charged twice.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::poll::{PROBE_INTERVAL, RESPONSE_TIMEOUT, SLACK, within};
use support::redis_cluster::RedisCluster;
use support::redis_server::{RedisServer, free_port};
use throttler::Error;
use throttler::redis::{Fallback, RedisBackend, RedisBuilder, RedisRateLimiter, RedisStats};

/// The longest any call may take: the response timeout plus slack.
const CALL_BOUND: Duration = RESPONSE_TIMEOUT.saturating_add(SLACK);
/// How long a limiter may take to go back to Redis once Redis works again:
/// a few probe intervals (each probe is a connection and one script call,
/// both bounded by the response timeout), plus slack.
const RECOVERY_BOUND: Duration = PROBE_INTERVAL
    .saturating_add(RESPONSE_TIMEOUT)
    .saturating_mul(3)
    .saturating_add(SLACK);
/// One interval at 10 permits per second.
const INTERVAL: Duration = Duration::from_millis(100);

fn builder(client: redis::Client, name: &str, rate: f64) -> RedisBuilder {
    RedisRateLimiter::builder(client, name)
        .permits_per_second(rate)
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
}

/// Waits, for up to 5 s, until `degraded` says no more, and asserts that
/// this came within `bound` of `since`; returns how long after `since`.
async fn back_on_redis(
    what: &str,
    since: Instant,
    bound: Duration,
    degraded: impl Fn() -> bool,
    stats: impl Fn() -> RedisStats,
) -> Duration {
    within(Duration::from_secs(5), || !degraded())
        .await
        .unwrap_or_else(|| panic!("{what}: still degraded 5 s later: {:?}", stats()));
    let took = since.elapsed();
    assert!(took <= bound, "{what}: back on Redis only after {took:?}");
    took
}

/// Waits until `limiter` is back on Redis, within [`RECOVERY_BOUND`] of now;
/// returns how long that took.
async fn recovered(limiter: &RedisRateLimiter, what: &str) -> Duration {
    back_on_redis(
        what,
        Instant::now(),
        RECOVERY_BOUND,
        || limiter.is_degraded(),
        || limiter.stats(),
    )
    .await
}

/// [`recovered`], for a limiter that went to its fallback once: prints how
/// long it took and checks that this was its one recovery.
async fn recovered_once(limiter: &RedisRateLimiter, what: &str) {
    let took = recovered(limiter, what).await;
    println!("{what}: back on Redis after {took:?}");
    assert_eq!(limiter.stats().recoveries, 1);
}

/// Calls `try_acquire(1, 10 ms)` every 10 ms for as long as `go_on` says,
/// asserting that each call returns `Ok` within [`CALL_BOUND`]; returns how
/// many calls were made.
async fn calls_while(limiter: &RedisRateLimiter, mut go_on: impl FnMut() -> bool) -> u64 {
    let mut calls = 0;
    while go_on() {
        let call = Instant::now();
        let result = limiter.try_acquire(1, Duration::from_millis(10)).await;
        assert!(result.is_ok(), "{result:?}");
        assert!(
            call.elapsed() <= CALL_BOUND,
            "a call took {:?}",
            call.elapsed()
        );
        calls += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    calls
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
            .max_burst(Duration::ZERO)
            .build()
            .await
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
    assert!(limiter.is_degraded());
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
    let pending = limiter.available_in().await.unwrap();
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
    assert!(!limiter.is_degraded());
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
                .max_burst(Duration::ZERO)
                .build()
                .await
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
                    // The caller waits for its permit in its own time.
                    (took, Instant::now() + reservation.commit())
                })
            })
            .collect();
        // When the last permit the fallback granted may be used.
        let mut local_end = Instant::now();
        for caller in callers {
            let (took, end) = caller.await.unwrap();
            assert!(took <= CALL_BOUND, "a caller got its answer after {took:?}");
            local_end = local_end.max(end);
        }
        // The switch happened about now; the probe's first connection
        // attempt runs from one to two probe intervals after it.
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        server.cont();
        let took = recovered(&limiter, "after SIGCONT").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
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
            wait <= local_left + 2 * INTERVAL + Duration::from_millis(60),
            "SIGCONT at {offset_ms} ms: charged twice: {wait:?}, the fallback owes {local_left:?}"
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
        .max_burst(Duration::ZERO)
        .build()
        .await
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
    assert!(limiter.is_degraded());
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
        .fallback(Fallback::FailClosed)
        .build()
        .await
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
    assert!(limiter.is_degraded());
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

/// `SIGKILL`, then a new, empty server on the same port. (That the limiter
/// serves from its fallback and comes back is in `redis_faults.rs`.) Here:
/// two instances of one limiter share the rate again after the restart, and
/// the key, lost in the crash, does not open with a burst: the probe's
/// resume call drops the stored permits a missing key would read as.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_on_the_same_port_instances_share_the_rate_again_without_a_burst() {
    let mut server = RedisServer::start();
    // The default burst: a missing key reads as 10 stored permits.
    let a = builder(server.client(), "restarted", 10.0)
        .build()
        .await
        .unwrap();
    let b = builder(server.client(), "restarted", 10.0)
        .build()
        .await
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
        assert!(limiter.is_degraded());
    }

    server.restart();
    let took_a = recovered(&a, "a, after the restart").await;
    let took_b = recovered(&b, "b, after the restart").await;
    println!("restart: a back on Redis after {took_a:?}, b {took_b:?} later");
    // Whatever debt the fallbacks carried in, let it pass.
    let debt = a.available_in().await.unwrap();
    assert!(debt <= 2 * INTERVAL, "{debt:?}");
    tokio::time::sleep(debt + Duration::from_millis(10)).await;
    let (a_local, b_local) = (a.stats().fallback_calls, b.stats().fallback_calls);

    assert!(a.try_acquire(1, Duration::ZERO).await.unwrap());
    // B sees A's permit: one rate, one key; and no stored permits.
    assert!(!b.try_acquire(1, Duration::ZERO).await.unwrap());
    let wait = b.available_in().await.unwrap();
    assert!(
        wait > Duration::from_millis(50) && wait <= INTERVAL,
        "{wait:?}"
    );
    let mut granted = 0;
    for _ in 0..10 {
        for limiter in [&a, &b] {
            if limiter.try_acquire(1, Duration::ZERO).await.unwrap() {
                granted += 1;
            }
        }
    }
    assert!(
        granted <= 1,
        "{granted} of 20 granted at once after the restart"
    );
    let mut admin = server.connection();
    let exists: bool = redis::cmd("EXISTS").arg(a.key()).query(&mut admin).unwrap();
    assert!(exists, "the limiter's state is in the new server");
    for (limiter, local) in [(&a, a_local), (&b, b_local)] {
        let stats = limiter.stats();
        assert_eq!(stats.fallback_calls, local, "{stats:?}");
        assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
    }
}

/// Starts a primary (whose replicas sync at once) and a replica of it, and
/// waits until the replica's link to its primary is up.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with(
        &["--repl-diskless-sync-delay", "0"],
        support::redis_server::free_cluster_port,
    );
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(
        &["--replicaof", "127.0.0.1", &port],
        support::redis_server::free_cluster_port,
    );
    wait_for_link(&replica);
    (primary, replica)
}

/// Waits until `replica` reports its link to its primary up.
fn wait_for_link(replica: &RedisServer) {
    let mut admin = replica.connection();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut admin)
            .unwrap();
        if info.lines().any(|l| l.trim() == "master_link_status:up") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never synced: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn replicaof(server: &RedisServer, primary: Option<&RedisServer>) {
    let mut admin = server.connection();
    let mut cmd = redis::cmd("REPLICAOF");
    match primary {
        Some(primary) => cmd.arg("127.0.0.1").arg(primary.port()),
        None => cmd.arg("NO").arg("ONE"),
    };
    let _: () = cmd.query(&mut admin).unwrap();
}

/// A limiter pointed at a read-only replica: the replica answers, but the
/// script's write is refused with `READONLY`. The limiter starts degraded,
/// its fallback serves for as long as that lasts, without flapping, and it
/// goes to Redis once the replica is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_degrades_once_and_recovers_when_promoted() {
    let (_primary, replica) = primary_and_replica();
    let mut admin = replica.connection();
    let read_only: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("replica-read-only")
        .query(&mut admin)
        .unwrap();
    assert_eq!(read_only, ["replica-read-only", "yes"]);

    let start = Instant::now();
    let limiter = builder(replica.client(), "replica", 10.0)
        .max_burst(Duration::ZERO)
        .build()
        .await
        .expect("builds: the fallback serves while the script is refused");
    assert!(start.elapsed() <= CALL_BOUND, "{:?}", start.elapsed());
    assert!(limiter.is_degraded());

    let start = Instant::now();
    let mut granted = 0;
    while start.elapsed() < Duration::from_secs(1) {
        let call = Instant::now();
        let reservation = limiter.reservation(1).await.expect("the fallback serves");
        assert!(call.elapsed() <= CALL_BOUND, "{:?}", call.elapsed());
        reservation.wait().await;
        granted += 1;
    }
    let stats = limiter.stats();
    println!("1 s on a read-only replica: {granted} permits, {stats:?}");
    // Paced locally at 10/s.
    assert!((9..=12).contains(&granted), "{granted}");
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
    assert!(limiter.is_degraded());

    replicaof(&replica, None);
    let took = recovered(&limiter, "after REPLICAOF NO ONE").await;
    println!("read-only replica: back on Redis {took:?} after the promotion");
    let served_locally = limiter.stats().fallback_calls;
    limiter.acquire(1).await.unwrap();
    limiter.acquire(1).await.unwrap();
    let stats = limiter.stats();
    assert_eq!(stats.fallback_calls, served_locally, "{stats:?}");
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
    let exists: bool = redis::cmd("EXISTS")
        .arg(limiter.key())
        .query(&mut admin)
        .unwrap();
    assert!(exists);
}

/// The same with [`Fallback::FailClosed`]: every call is refused with
/// [`Error::Backend`] at once; a limiter that requires a connection does
/// not build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_with_fail_closed_refuses_at_once() {
    let (_primary, replica) = primary_and_replica();
    let start = Instant::now();
    let strict = builder(replica.client(), "replica-closed", 10.0)
        .fallback(Fallback::FailClosed)
        .require_connection(true)
        .build()
        .await;
    assert!(matches!(strict, Err(Error::Backend(_))), "{strict:?}");
    assert!(start.elapsed() <= CALL_BOUND, "{:?}", start.elapsed());

    let limiter = builder(replica.client(), "replica-closed", 10.0)
        .fallback(Fallback::FailClosed)
        .build()
        .await
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        let call = Instant::now();
        let result = limiter.try_acquire(1, Duration::from_secs(1)).await;
        // The error says why.
        assert!(
            matches!(&result, Err(Error::Backend(e)) if e.to_string().contains("read only")),
            "{result:?}"
        );
        assert!(call.elapsed() <= SLACK, "{:?}", call.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = limiter.stats();
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
}

/// After a failover the old primary, demoted to a replica, still answers on
/// the limiter's connection, with `READONLY` to every script call. The
/// limiter degrades once and stays degraded, then recovers when the server
/// is a primary again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_demoted_to_a_replica_degrades_once_without_flapping() {
    let other = RedisServer::start_with(
        &["--repl-diskless-sync-delay", "0"],
        support::redis_server::free_cluster_port,
    );
    let server = RedisServer::start();
    let limiter = builder(server.client(), "demoted", 100.0)
        .build()
        .await
        .unwrap();
    limiter.acquire(1).await.unwrap();
    assert!(!limiter.is_degraded());

    replicaof(&server, Some(&other));
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < Duration::from_secs(1) {
        let call = Instant::now();
        let result = limiter.try_acquire(1, Duration::from_millis(50)).await;
        assert!(result.is_ok(), "{result:?}");
        assert!(call.elapsed() <= CALL_BOUND, "{:?}", call.elapsed());
        calls += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = limiter.stats();
    println!("1 s on a demoted primary: {calls} calls, {stats:?}");
    assert!(limiter.is_degraded());
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");

    replicaof(&server, None);
    recovered_once(&limiter, "demoted primary, after REPLICAOF NO ONE").await;
}

/// A server busy with another client's script that does not end answers
/// `BUSY` to everything else: the limiter degrades once (no flapping while
/// its probe keeps getting `BUSY`), its fallback serves within the response
/// timeout, and it goes back to Redis once the script is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_busy_with_a_long_script_degrades_once_and_recovers_after_script_kill() {
    let server = RedisServer::start();
    server.config_set("busy-reply-threshold", "50");
    let mut admin = server.connection();
    let limiter = builder(server.client(), "busy", 1_000.0)
        .build()
        .await
        .unwrap();
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());

    // Read-only, so that SCRIPT KILL may stop it.
    let mut hog = server.connection();
    let hog = std::thread::spawn(move || {
        redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query::<()>(&mut hog)
    });
    let start = Instant::now();
    let calls = calls_while(&limiter, || start.elapsed() < Duration::from_secs(1)).await;
    let stats = limiter.stats();
    println!("1 s of BUSY: {calls} calls, {stats:?}");
    assert!(limiter.is_degraded());
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");

    let _: () = redis::cmd("SCRIPT").arg("KILL").query(&mut admin).unwrap();
    assert!(hog.join().unwrap().is_err(), "the script was killed");
    recovered_once(&limiter, "BUSY, after SCRIPT KILL").await;
}

/// A server reloading its dataset answers `LOADING` to everything: the
/// limiter degrades once (its probe keeps getting `LOADING` too), its
/// fallback serves within the response timeout, and it goes back to Redis
/// once the data is loaded. (Two million keys take about a second to load.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_loading_its_dataset_degrades_once_and_recovers_when_loaded() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"], free_port);
    let mut admin = server.connection();
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(2_000_000)
        .query(&mut admin)
        .unwrap();
    let limiter = builder(server.client(), "loading", 1_000.0)
        .build()
        .await
        .unwrap();
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());

    // Saves the dataset (the server does not answer meanwhile) and loads
    // it again, answering LOADING. The limiter's first call waits for the
    // loading, so that it is a call, not only the probe, that gets LOADING.
    let mut watcher = server.connection();
    let reload =
        std::thread::spawn(move || redis::cmd("DEBUG").arg("RELOAD").query::<()>(&mut admin));
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < Duration::from_secs(30), "never loading");
        match redis::cmd("PING").query::<String>(&mut watcher) {
            Err(e) if e.code() == Some("LOADING") => break,
            Err(e) => panic!("PING while reloading: {e:?}"),
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert!(!limiter.is_degraded());
    let calls = calls_while(&limiter, || {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the reload never ended"
        );
        !reload.is_finished()
    })
    .await;
    reload.join().unwrap().unwrap();
    let stats = limiter.stats();
    println!("{:?} of reload: {calls} calls, {stats:?}", start.elapsed());
    assert_eq!(stats.fallbacks, 1, "degraded once while loading: {stats:?}");
    recovered_once(&limiter, "LOADING, after the reload").await;
}

/// A server made a replica of a primary it cannot reach, and told not to
/// serve stale data, answers `MASTERDOWN`: the limiter degrades once, its
/// fallback serves, and it goes back to Redis when the server is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_its_primary_degrades_once_and_recovers_when_promoted() {
    let server = RedisServer::start();
    let limiter = builder(server.client(), "masterdown", 1_000.0)
        .build()
        .await
        .unwrap();
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());

    server.config_set("replica-serve-stale-data", "no");
    let mut admin = server.connection();
    let nowhere = free_port(); // nothing listens there
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(nowhere)
        .query(&mut admin)
        .unwrap();
    let refused = redis::cmd("GET")
        .arg("x")
        .query::<Option<String>>(&mut admin);
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some("MASTERDOWN"),
        "{refused:?}"
    );

    let start = Instant::now();
    let calls = calls_while(&limiter, || start.elapsed() < Duration::from_secs(1)).await;
    let stats = limiter.stats();
    println!("1 s of MASTERDOWN: {calls} calls, {stats:?}");
    assert!(limiter.is_degraded());
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
    assert_eq!(
        stats.fallback_calls, calls,
        "every call served by the fallback"
    );

    replicaof(&server, None);
    recovered_once(&limiter, "MASTERDOWN, after REPLICAOF NO ONE").await;
}

/// A three-primary cluster (no replicas) loses one primary. Limiters whose
/// keys are on it degrade, and their fallback serves; limiters whose keys
/// are on the other two primaries never notice, whether each has a backend
/// of its own or they all share one. The cluster is configured
/// to keep serving the slots it still covers (by default a cluster that
/// has lost slots refuses every key once it declares the node failed), and
/// to declare the failure within a second, so that the test runs through
/// that change too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_loses_a_primary_degrades_only_the_limiters_on_it() {
    let mut cluster = RedisCluster::start();
    for node in &cluster.nodes {
        node.config_set("cluster-require-full-coverage", "no");
        node.config_set("cluster-node-timeout", "1000");
    }
    // Two limiters per node: those on node 1 will lose their node.
    const VICTIM: usize = 1;
    let mut names: Vec<Vec<String>> = vec![Vec::new(); cluster.nodes.len()];
    for i in 0.. {
        let name = format!("shard-{i}");
        let node = cluster.node_for_key(&format!("throttler:{name}"));
        if names[node].len() < 2 {
            names[node].push(name);
        }
        if names.iter().all(|n| n.len() == 2) {
            break;
        }
    }
    let shared = RedisBackend::cluster_builder(cluster.client())
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
        .build()
        .await
        .unwrap();
    let mut victims = Vec::new();
    let mut others = Vec::new();
    for (node, names) in names.iter().enumerate() {
        for name in names {
            let own = RedisRateLimiter::cluster_builder(cluster.client(), name)
                .permits_per_second(1_000.0)
                .response_timeout(RESPONSE_TIMEOUT)
                .probe_interval(PROBE_INTERVAL)
                .build()
                .await
                .unwrap();
            // The same key through the shared backend.
            let sharing = shared
                .limiter(name)
                .permits_per_second(1_000.0)
                .build()
                .unwrap();
            for limiter in [own, sharing] {
                assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
                assert!(!limiter.is_degraded());
                if node == VICTIM {
                    victims.push(limiter);
                } else {
                    others.push(limiter);
                }
            }
        }
    }

    let victim_port = cluster.nodes[VICTIM].port();
    let mut survivor = cluster.nodes[0].connection();
    cluster.nodes[VICTIM].kill();
    let killed = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut rounds = 0;
    // Calls for a second, and on until half a second after the survivors
    // have declared the node failed.
    let mut declared: Option<Duration> = None;
    loop {
        let elapsed = killed.elapsed();
        if declared.is_none() && declared_failed(&mut survivor, victim_port) {
            declared = Some(elapsed);
        }
        match declared {
            Some(at) if elapsed >= Duration::from_secs(1).max(at + Duration::from_millis(500)) => {
                break;
            }
            _ => assert!(
                elapsed < Duration::from_secs(6),
                "the survivors never declared the node failed"
            ),
        }
        for limiter in victims.iter().chain(&others) {
            let call = Instant::now();
            let result = limiter.try_acquire(1, Duration::from_millis(10)).await;
            assert!(result.is_ok(), "{}: {result:?}", limiter.key());
            slowest = slowest.max(call.elapsed());
        }
        for limiter in &others {
            assert!(
                !limiter.is_degraded(),
                "{}: {:?}",
                limiter.key(),
                limiter.stats()
            );
        }
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut survivor)
        .unwrap();
    let state = info
        .lines()
        .find(|l| l.starts_with("cluster_state"))
        .unwrap_or_default()
        .trim()
        .to_owned();
    println!(
        "cluster without node {VICTIM}: declared failed after {declared:?}; {rounds} rounds \
         over {:?}, slowest call {slowest:?}, {state}",
        killed.elapsed()
    );
    assert!(slowest <= CALL_BOUND, "a call took {slowest:?}");
    // Limiters with backends of their own: their own counts. Those sharing
    // one: the backend's, which switched once for both victims.
    for limiter in victims.iter().step_by(2) {
        let stats = limiter.stats();
        assert!(limiter.is_degraded(), "{}", limiter.key());
        assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
        assert!(stats.fallback_calls >= rounds, "{stats:?}");
    }
    for limiter in others.iter().step_by(2) {
        let stats = limiter.stats();
        assert_eq!((stats.fallbacks, stats.fallback_calls), (0, 0), "{stats:?}");
    }
    assert!(victims.iter().all(RedisRateLimiter::is_degraded));
    let stats = shared.stats();
    println!("the shared backend: {stats:?}");
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
    assert!(
        stats.fallback_calls >= 2 * rounds && stats.fallback_calls <= 2 * rounds + 2,
        "{stats:?}: only the two victims' calls, {rounds} rounds"
    );
}

/// A limiter degraded by a fault on its own node goes back to Redis as soon
/// as that node answers, even while another primary of the cluster is dead:
/// its probe runs the script on its key's node only (a probe that needed
/// every primary, as a cluster-wide `PING` does, would keep it degraded for
/// as long as the unrelated node is down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_recovers_on_its_own_node_while_another_primary_is_dead() {
    recovers_on_its_own_node_while_another_primary_is(Other::Dead).await;
}

/// The same, while the other primary hangs instead (a stopped process: its
/// connections open, but nothing answers), which a fresh connection to the
/// cluster waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_recovers_on_its_own_node_while_another_primary_hangs() {
    recovers_on_its_own_node_while_another_primary_is(Other::Hung).await;
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Other {
    Dead,
    Hung,
}

async fn recovers_on_its_own_node_while_another_primary_is(other: Other) {
    let mut cluster = RedisCluster::start();
    for node in &cluster.nodes {
        node.config_set("cluster-require-full-coverage", "no");
    }
    const HOME: usize = 0;
    const DEAD: usize = 1;
    let name = (0..)
        .map(|i| format!("home-{i}"))
        .find(|name| cluster.node_for_key(&format!("throttler:{name}")) == HOME)
        .unwrap();
    let limiter = RedisRateLimiter::cluster_builder(cluster.client(), &name)
        .permits_per_second(1_000.0)
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
        .build()
        .await
        .unwrap();
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());

    // An unrelated primary dies or hangs: the limiter does not notice.
    match other {
        Other::Dead => cluster.nodes[DEAD].kill(),
        Other::Hung => cluster.nodes[DEAD].stop(),
    }
    for _ in 0..10 {
        assert!(limiter.try_acquire(1, Duration::ZERO).await.is_ok());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!limiter.is_degraded(), "{:?}", limiter.stats());

    // Its own node freezes (for less than the cluster's node timeout, so
    // the cluster itself does not change): it degrades.
    cluster.nodes[HOME].stop();
    let frozen = Instant::now();
    while !limiter.is_degraded() {
        assert!(frozen.elapsed() < Duration::from_secs(2), "never degraded");
        let call = Instant::now();
        assert!(limiter.try_acquire(1, Duration::ZERO).await.is_ok());
        assert!(
            call.elapsed() <= CALL_BOUND,
            "a call took {:?}",
            call.elapsed()
        );
    }
    tokio::time::sleep(Duration::from_millis(300).saturating_sub(frozen.elapsed())).await;
    cluster.nodes[HOME].cont();
    let resumed = Instant::now();

    // Its node answers again, the other one still does not. A fresh
    // connection to the cluster waits for a hung node: up to the cluster
    // client's connection timeout (1 s by default) for its first
    // connections, and again for its connections to every node of the
    // slot map.
    let bound = match other {
        Other::Dead => RECOVERY_BOUND,
        Other::Hung => RECOVERY_BOUND + Duration::from_secs(2),
    };
    let what = format!("its own node, with node {DEAD} still {other:?}");
    let took = back_on_redis(
        &what,
        resumed,
        bound,
        || limiter.is_degraded(),
        || limiter.stats(),
    )
    .await;
    println!("back on {what} {took:?} after SIGCONT");
    let stats = limiter.stats();
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(!limiter.is_degraded());
}

/// Two names per node of `cluster` whose Redis keys (`key(name)`) that
/// node serves, found in order among `prefix-0`, `prefix-1`, ...
fn two_names_per_node(
    cluster: &RedisCluster,
    prefix: &str,
    key: impl Fn(&str) -> String,
) -> Vec<Vec<String>> {
    let mut names: Vec<Vec<String>> = vec![Vec::new(); cluster.nodes.len()];
    for i in 0.. {
        let name = format!("{prefix}-{i}");
        let node = cluster.node_for_key(&key(&name));
        if names[node].len() < 2 {
            names[node].push(name);
        }
        if names.iter().all(|n| n.len() == 2) {
            return names;
        }
    }
    unreachable!()
}

/// One backend shared by six limiters and a keyed limiter on a three-primary
/// cluster, and one primary freezes. Only what lives on that node serves
/// from the fallback: its limiters and keys, including a limiter and a key
/// that make no call during the outage (the probe reads the slot map and
/// marks the node's other slots down, so they do not each wait for a
/// timeout first). Every limiter and key on the other nodes stays on Redis
/// throughout. When the node answers again, everything is back, with one
/// switch each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_cluster_backend_degrades_only_what_lives_on_a_frozen_node() {
    let cluster = RedisCluster::start();
    const VICTIM: usize = 1;
    let backend = RedisBackend::cluster_builder(cluster.client())
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
        .build()
        .await
        .unwrap();
    let names = two_names_per_node(&cluster, "api", |name| format!("throttler:{name}"));
    let tenants = two_names_per_node(&cluster, "tenant", |t| format!("throttler:tenants:{t}"));
    let limiters: Vec<Vec<RedisRateLimiter>> = names
        .iter()
        .map(|names| {
            names
                .iter()
                .map(|name| {
                    backend
                        .limiter(name)
                        .permits_per_second(1_000.0)
                        .build()
                        .unwrap()
                })
                .collect()
        })
        .collect();
    let keyed = backend
        .keyed_limiter::<String>("tenants")
        .permits_per_second(1_000.0)
        .build()
        .unwrap();
    for (limiter, tenant) in limiters.iter().flatten().zip(tenants.iter().flatten()) {
        assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
        assert!(keyed.try_acquire(tenant, 1, Duration::ZERO).await.unwrap());
    }
    // The second limiter and tenant of the victim make no call from here.
    let active: Vec<&RedisRateLimiter> = limiters
        .iter()
        .enumerate()
        .flat_map(|(node, l)| if node == VICTIM { &l[..1] } else { &l[..] })
        .collect();
    let active_tenants: Vec<&String> = tenants
        .iter()
        .enumerate()
        .flat_map(|(node, t)| if node == VICTIM { &t[..1] } else { &t[..] })
        .collect();
    let healthy: Vec<&RedisRateLimiter> = limiters
        .iter()
        .enumerate()
        .filter(|(node, _)| *node != VICTIM)
        .flat_map(|(_, l)| l)
        .collect();

    // Frozen for less than the cluster's node timeout (5 s), so that the
    // cluster itself does not change.
    cluster.nodes[VICTIM].stop();
    let frozen = Instant::now();
    let (mut slowest, mut victim_calls) = (Duration::ZERO, 0);
    while frozen.elapsed() < Duration::from_millis(1_500) {
        for limiter in &active {
            let call = Instant::now();
            let result = limiter.try_acquire(1, Duration::from_millis(10)).await;
            assert!(result.is_ok(), "{}: {result:?}", limiter.key());
            slowest = slowest.max(call.elapsed());
        }
        for tenant in &active_tenants {
            let call = Instant::now();
            let result = keyed
                .try_acquire(*tenant, 1, Duration::from_millis(10))
                .await;
            assert!(result.is_ok(), "{tenant}: {result:?}");
            slowest = slowest.max(call.elapsed());
        }
        victim_calls += 2;
        for limiter in &healthy {
            assert!(!limiter.is_degraded(), "{}", limiter.key());
        }
        // The keyed fallback holds the victim's one active tenant at most.
        assert!(
            keyed.stats().local_keys <= 1,
            "{} keys held locally",
            keyed.stats().local_keys
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = backend.stats();
    println!(
        "node {VICTIM} frozen for {:?}: slowest call {slowest:?}, {stats:?}",
        frozen.elapsed()
    );
    assert!(slowest <= CALL_BOUND, "a call took {slowest:?}");
    assert!(limiters[VICTIM].iter().all(RedisRateLimiter::is_degraded));
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
    // Only the victim's calls were served by a fallback (the first of each
    // may have waited for Redis and then been served by the fallback too).
    assert!(
        stats.fallback_calls <= victim_calls && stats.fallback_calls + 4 >= victim_calls,
        "{} calls served by a fallback, {victim_calls} on the frozen node",
        stats.fallback_calls
    );

    cluster.nodes[VICTIM].cont();
    let resumed = Instant::now();
    let took = back_on_redis(
        &format!("node {VICTIM}"),
        resumed,
        RECOVERY_BOUND,
        || backend.is_degraded(),
        || backend.stats(),
    )
    .await;
    println!("back on node {VICTIM} {took:?} after SIGCONT");
    let stats = backend.stats();
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
    for limiter in limiters.iter().flatten() {
        assert!(
            limiter
                .try_acquire(1, Duration::from_millis(10))
                .await
                .unwrap()
        );
        assert!(!limiter.is_degraded());
    }
    for tenant in tenants.iter().flatten() {
        assert!(
            keyed
                .try_acquire(tenant, 1, Duration::from_millis(10))
                .await
                .unwrap()
        );
    }
    assert_eq!(backend.stats().fallback_calls, stats.fallback_calls);
    within(Duration::from_secs(2), || keyed.stats().local_keys == 0)
        .await
        .expect("the victim's tenant is carried back to Redis");
}

/// A shared backend built while one primary of the cluster hangs starts
/// degraded (its first connection, bounded by the response timeout, waits
/// for the hung node), and serves every call from the fallbacks at once.
/// Its probe, which waits longer, then connects without the hung node, and
/// although its script fails there (on the hung node, where the backend's
/// own probe key lives), limiters on the other nodes go to Redis; those on
/// the hung node stay on their fallbacks, and no call takes longer than the
/// response timeout. The cluster client gives up on a node after 50 ms, as
/// the README advises (below the response timeout): a client that waits
/// longer stalls every request while it reconnects to the hung node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_cluster_backend_built_while_a_primary_hangs_serves_the_others_from_redis() {
    let cluster = RedisCluster::start();
    // The node of the backend's own probe key, which its first probe uses.
    let hung = cluster.node_for_key("throttler-probe");
    let names = two_names_per_node(&cluster, "api", |name| format!("throttler:{name}"));
    cluster.nodes[hung].stop();
    let started = Instant::now();
    let backend = RedisBackend::cluster_builder(
        cluster.client_with_connection_timeout(Duration::from_millis(50)),
    )
    .response_timeout(RESPONSE_TIMEOUT)
    .probe_interval(PROBE_INTERVAL)
    .build()
    .await
    .unwrap();
    assert!(started.elapsed() <= CALL_BOUND, "{:?}", started.elapsed());
    assert!(backend.is_degraded());
    let limiters: Vec<(usize, RedisRateLimiter)> = names
        .iter()
        .enumerate()
        .flat_map(|(node, names)| names.iter().map(move |name| (node, name)))
        .map(|(node, name)| {
            let limiter = backend
                .limiter(name)
                .permits_per_second(1_000.0)
                .build()
                .unwrap();
            (node, limiter)
        })
        .collect();
    let healthy_on_redis = || {
        limiters
            .iter()
            .all(|(node, limiter)| limiter.is_degraded() == (*node == hung))
    };
    let mut slowest = Duration::ZERO;
    while !healthy_on_redis() {
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}; degraded: {:?}",
            backend.stats(),
            limiters
                .iter()
                .map(|(node, l)| (*node, l.is_degraded()))
                .collect::<Vec<_>>()
        );
        for (_, limiter) in &limiters {
            let call = Instant::now();
            let result = limiter.try_acquire(1, Duration::from_millis(10)).await;
            assert!(result.is_ok(), "{}: {result:?}", limiter.key());
            slowest = slowest.max(call.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "the other nodes' limiters on Redis {:?} after the build, slowest call {slowest:?}",
        started.elapsed()
    );
    assert!(slowest <= CALL_BOUND, "a call took {slowest:?}");
    let before = backend.stats().fallback_calls;
    for (node, limiter) in &limiters {
        assert!(
            limiter
                .try_acquire(1, Duration::from_millis(10))
                .await
                .unwrap()
        );
        assert_eq!(limiter.is_degraded(), *node == hung, "{}", limiter.key());
    }
    assert_eq!(
        backend.stats().fallback_calls - before,
        2,
        "only the hung node's two limiters use their fallbacks"
    );
    cluster.nodes[hung].cont();
    within(Duration::from_secs(4), || !backend.is_degraded())
        .await
        .unwrap_or_else(|| panic!("still degraded: {:?}", backend.stats()));
}

/// Whether the node on `port` is flagged `fail` (not only `fail?`) in
/// `CLUSTER NODES` as the connected node sees it.
fn declared_failed(survivor: &mut redis::Connection, port: u16) -> bool {
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(survivor).unwrap();
    let address = format!("127.0.0.1:{port}@");
    nodes.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        fields.get(1).is_some_and(|a| a.starts_with(&address))
            && fields
                .get(2)
                .is_some_and(|flags| flags.split(',').any(|f| f == "fail"))
    })
}
