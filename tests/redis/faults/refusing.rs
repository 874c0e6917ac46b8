//! A server that answers with an error: a read-only replica (`READONLY`),
//! one cut off from its primary (`MASTERDOWN`), busy with a script
//! (`BUSY`), loading its data (`LOADING`), or out of memory (`OOM`).

use super::*;

/// A Redis limiter's builder at `rate` under `name`, on a patient backend
/// of its own on `client`: the fault is an error reply, which comes at
/// once, and a call that merely runs late on a loaded machine must not
/// send the limiter to its fallback (a second switch each way) as well.
async fn refused(
    client: redis::Client,
    name: &str,
    rate: f64,
) -> paceline::Builder<paceline::NoKey, Redis> {
    RateLimiter::builder()
        .permits_per_second(rate)
        .redis(&patient_backend(client).await, name)
}

/// Starts a primary (whose replicas sync at once) and a replica of it, and
/// waits until the replica's link to its primary is up.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with(
        &["--repl-diskless-sync-delay", "0"],
        crate::support::redis_server::free_cluster_port,
    );
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(
        &["--replicaof", "127.0.0.1", &port],
        crate::support::redis_server::free_cluster_port,
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
    let limiter = refused(replica.client(), "replica", 10.0)
        .await
        .max_burst(Duration::ZERO)
        .build()
        .expect("builds: the fallback serves while the script is refused");
    assert!(start.elapsed() <= CALL_BOUND, "{:?}", start.elapsed());
    assert!(limiter.stats().degraded);

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
    assert!(limiter.stats().degraded);

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
        .arg(limiter.redis_key())
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
    // The connection is the backend's: it is the backend that does not
    // build (a limiter's fallback plays no part in that).
    let strict = backend_builder(replica.client())
        .require_connection(true)
        .build()
        .await;
    assert!(matches!(strict, Err(Error::Backend(_))), "{strict:?}");
    assert!(start.elapsed() <= CALL_BOUND, "{:?}", start.elapsed());

    let limiter = builder(replica.client(), "replica-closed", 10.0)
        .await
        .fallback(Fallback::FailClosed)
        .build()
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
        crate::support::redis_server::free_cluster_port,
    );
    let server = RedisServer::start();
    let limiter = refused(server.client(), "demoted", 100.0)
        .await
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();
    assert!(!limiter.stats().degraded);

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
    assert!(limiter.stats().degraded);
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");

    replicaof(&server, None);
    recovered_once(&limiter, "demoted primary, after REPLICAOF NO ONE").await;
}

/// A server made a replica of a primary it cannot reach, and told not to
/// serve stale data, answers `MASTERDOWN`: the limiter degrades once, its
/// fallback serves, and it goes back to Redis when the server is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_its_primary_degrades_once_and_recovers_when_promoted() {
    let server = RedisServer::start();
    let limiter = refused(server.client(), "masterdown", 1_000.0)
        .await
        .build()
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
    assert!(limiter.stats().degraded);
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
    assert_eq!(
        stats.fallback_calls, calls,
        "every call served by the fallback"
    );

    replicaof(&server, None);
    recovered_once(&limiter, "MASTERDOWN, after REPLICAOF NO ONE").await;
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
        .await
        .build()
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
    assert!(limiter.stats().degraded);
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
    // Patient: the fault is an error reply, which comes at once; a call
    // before the reload that merely runs late on a loaded machine must not
    // send the limiter to its fallback first.
    let limiter = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .redis(&patient_backend(server.client()).await, "loading")
        .build()
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
        assert!(start.elapsed() < Duration::from_secs(120), "never loading");
        match redis::cmd("PING").query::<String>(&mut watcher) {
            Err(e) if e.code() == Some("LOADING") => break,
            Err(e) => panic!("PING while reloading: {e:?}"),
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert!(!limiter.stats().degraded);
    let calls = calls_while(&limiter, || {
        // (A hang's guard: saving and loading 2 million keys takes seconds,
        // and on a loaded machine tens of them.)
        assert!(
            start.elapsed() < Duration::from_secs(120),
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

/// Redis answers PING but refuses the script's writes: the limiter
/// degrades once and stays degraded (no flapping) until writes work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_writes_degrades_once_without_flapping() {
    let server = RedisServer::start();
    let limiter = refused(server.client(), "oom", 1_000.0)
        .await
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();
    server.config_set("maxmemory-policy", "noeviction");
    server.config_set("maxmemory", "1");
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < Duration::from_secs(2) {
        let call = Instant::now();
        let granted = limiter.try_acquire(1, Duration::from_millis(50)).await;
        assert!(granted.is_ok(), "{granted:?}");
        assert!(call.elapsed() <= RESPONSE_TIMEOUT + SLACK);
        calls += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = limiter.stats();
    println!("2 s of refused writes: {calls} calls, {stats:?}");
    assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
    assert!(limiter.stats().degraded);
    server.config_set("maxmemory", "0");
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("back on Redis once writes work");
}
