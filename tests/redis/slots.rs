//! Calls in flight through Redis (`Limit::concurrent`): slots are leases in
//! a sorted set beside the limiter's key, shared by every process; a
//! normal drop frees one at once, and a worker killed while it holds some
//! (a real child process: this test binary, run again) has them back
//! after the slot TTL, not before. While Redis is down the fallback says.
//!
//! Most tests hold slots with the crate's hidden test hook `hold_slot`
//! (feature `internals`), which takes one as a call does, without a call
//! to run; `a_call_through_redis_holds_a_lease_or_none` and the tests
//! after it go through `call` itself.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::poll::{SLACK, backend, backend_builder, patient_backend};

use crate::support::proxy::Proxy;
use crate::support::redis_server::RedisServer;
use crate::support::within::within;
use paceline::redis::{Fallback, Redis, RedisBackend};
use paceline::{Error, KeyedRateLimiter, Limit, RateLimiter};
use redis::Commands;

const MS: Duration = Duration::from_millis(1);

/// The slots key of the limiter `name` (see `redis_key`).
fn slots_key(name: &str) -> String {
    format!("{{paceline:v1:{name}}}\\slots")
}

/// A limiter `name` on a backend of its own (as another process has), with
/// `calls` slots that live `ttl`.
async fn limiter(
    server: &RedisServer,
    name: &str,
    calls: u32,
    ttl: Duration,
    fallback: Fallback,
) -> RateLimiter<Redis> {
    limiter_on(&backend(server.client()).await, name, calls, ttl, fallback)
}

/// The same on `backend`.
fn limiter_on(
    backend: &RedisBackend,
    name: &str,
    calls: u32,
    ttl: Duration,
    fallback: Fallback,
) -> RateLimiter<Redis> {
    let builder = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .limit(Limit::concurrent(calls))
        .redis(backend, name)
        .slot_ttl(ttl)
        .fallback(fallback);
    // A share of the slots is the local fallback's only.
    let builder = if fallback == Fallback::Local {
        builder.local_fraction(0.5)
    } else {
        builder
    };
    builder.build().unwrap()
}

fn live(server: &RedisServer, name: &str) -> usize {
    server.connection().zcard(slots_key(name)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_on_one_redis_share_k_and_a_drop_frees_at_once() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let a = limiter(&server, "shared", 3, ttl, Fallback::FailClosed).await;
    let b = limiter(&server, "shared", 3, ttl, Fallback::FailClosed).await;
    let (held, a1) = a.hold_slot(None).await.unwrap().unwrap();
    assert!(held);
    let (_, a2) = a.hold_slot(None).await.unwrap().unwrap();
    let (_, b1) = b.hold_slot(Some(Duration::ZERO)).await.unwrap().unwrap();
    assert_eq!(live(&server, "shared"), 3);
    assert_eq!((a.stats().in_flight, b.stats().in_flight), (2, 1));
    // Full for both: a try that cannot wait is refused at once.
    assert!(a.hold_slot(Some(Duration::ZERO)).await.unwrap().is_none());
    assert!(b.hold_slot(Some(50 * MS)).await.unwrap().is_none());
    // The key lives as long as its leases.
    let pttl: i64 = server.connection().pttl(slots_key("shared")).unwrap();
    assert!(pttl > 29_000 && pttl <= 30_000, "{pttl}");
    // A slot dropped in one process goes to a waiter of the other well
    // before any TTL: the waiter polls again within 200 ms.
    let started = Instant::now();
    let release = async {
        tokio::time::sleep(100 * MS).await;
        drop(a1);
    };
    let (taken, ()) = tokio::join!(b.hold_slot(Some(Duration::from_secs(5))), release);
    let (_, b2) = taken.unwrap().expect("the freed slot");
    let took = started.elapsed();
    assert!(took < 300 * MS + SLACK, "{took:?}");
    assert_eq!(live(&server, "shared"), 3);
    // A waiter of the same process is woken by the release itself.
    let started = Instant::now();
    let release = async {
        tokio::time::sleep(100 * MS).await;
        drop(b1);
    };
    let (taken, ()) = tokio::join!(b.hold_slot(Some(Duration::from_secs(5))), release);
    let b3 = taken.unwrap().expect("the freed slot");
    assert!(
        started.elapsed() < 100 * MS + SLACK,
        "{:?}",
        started.elapsed()
    );
    drop((a2, b2, b3));
    let freed = within(Duration::from_secs(1), || live(&server, "shared") == 0).await;
    assert!(freed.is_some(), "every lease is released");
    assert_eq!((a.stats().in_flight, b.stats().in_flight), (0, 0));
    let exists: bool = server.connection().exists(slots_key("shared")).unwrap();
    assert!(!exists, "an empty set is no key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_k_slots_are_held_across_limiters_under_many_tasks() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        // A backend patient with a loaded machine: what is tested is the
        // count of slots, and a late answer would fail the call (closed).
        let backend = patient_backend(server.client()).await;
        let limiter = Arc::new(limiter_on(&backend, "busy", 3, ttl, Fallback::FailClosed));
        for task in 0..12u64 {
            let (limiter, now, most) = (limiter.clone(), now.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let (_, slot) = limiter
                        .hold_slot(Some(Duration::from_secs(20)))
                        .await
                        .unwrap()
                        .expect("a slot within 20 s");
                    let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(in_flight, Ordering::SeqCst);
                    assert!(in_flight <= 3, "{in_flight} slots held");
                    tokio::time::sleep(MS * (1 + task % 3) as u32).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    drop(slot);
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 3);
    let freed = within(Duration::from_secs(1), || live(&server, "busy") == 0).await;
    assert!(freed.is_some(), "every lease is released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_renewed_while_it_is_held() {
    let server = RedisServer::start();
    let ttl = 300 * MS;
    let a = limiter(&server, "renewed", 1, ttl, Fallback::FailClosed).await;
    let b = limiter(&server, "renewed", 1, ttl, Fallback::FailClosed).await;
    let held = a.hold_slot(None).await.unwrap().unwrap();
    // Three TTLs later the lease is still live, and still the only one.
    tokio::time::sleep(3 * ttl).await;
    assert!(b.hold_slot(Some(Duration::ZERO)).await.unwrap().is_none());
    assert_eq!(live(&server, "renewed"), 1);
    drop(held);
    let (_, taken) = b
        .hold_slot(Some(Duration::from_secs(1)))
        .await
        .unwrap()
        .unwrap();
    drop(taken);
}

/// The child's side of `a_killed_worker_has_its_slots_back_after_the_ttl`:
/// holds every slot of the limiter it is told of, says so, and waits to
/// be killed. Does nothing when run by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the worker process of a_killed_worker_has_its_slots_back_after_the_ttl"]
async fn worker_holding_slots() {
    let Ok(told) = std::env::var("PACELINE_SLOTS_WORKER") else {
        return;
    };
    let [port, name, calls, ttl_ms] = told.split(' ').collect::<Vec<_>>()[..] else {
        panic!("PACELINE_SLOTS_WORKER: {told}");
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let limiter = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .limit(Limit::concurrent(calls.parse().unwrap()))
        .redis(&backend(client).await, name)
        .slot_ttl(Duration::from_millis(ttl_ms.parse().unwrap()))
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..calls.parse().unwrap() {
        held.push(
            limiter
                .hold_slot(Some(Duration::ZERO))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    println!("held");
    tokio::time::sleep(Duration::from_secs(3_600)).await;
}

/// A child process, killed when dropped.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_has_its_slots_back_after_the_ttl_and_not_before() {
    let server = RedisServer::start();
    let ttl = Duration::from_millis(1_500);
    let mut worker = Worker(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "slots::worker_holding_slots",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(
                "PACELINE_SLOTS_WORKER",
                format!("{} killed 2 {}", server.port(), ttl.as_millis()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = worker.0.stdout.take().unwrap();
    let said = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line == "held")
    });
    assert!(said.await.unwrap(), "the worker took its slots");
    let here = limiter(&server, "killed", 2, ttl, Fallback::FailClosed).await;
    // Alive, it renews them: two TTLs on, they are still taken.
    tokio::time::sleep(2 * ttl).await;
    assert!(
        here.hold_slot(Some(Duration::ZERO))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(live(&server, "killed"), 2);
    // Killed (SIGKILL: nothing is released), they come back once their
    // TTL has passed since their last renewal (every third of it), and
    // not before.
    let _ = worker.0.kill();
    let _ = worker.0.wait();
    let killed = Instant::now();
    // The last renewal was at most a third of the TTL before the kill
    // (give or take a timer's lateness): a half is safe.
    let early = here.hold_slot(Some(ttl / 2)).await.unwrap();
    assert!(
        early.is_none(),
        "a slot came back {:?} after the kill",
        killed.elapsed()
    );
    let (held, slot) = here
        .hold_slot(Some(2 * ttl))
        .await
        .unwrap()
        .expect("the dead worker's slots come back");
    assert!(held);
    let back = killed.elapsed();
    assert!(
        back >= ttl / 2 && back <= ttl + SLACK,
        "back after {back:?}"
    );
    let (_, second) = here.hold_slot(Some(ttl)).await.unwrap().unwrap();
    assert_eq!(live(&server, "killed"), 2);
    drop((slot, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_the_fallback_says() {
    let mut server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let local = limiter(&server, "down", 4, ttl, Fallback::Local).await;
    let open = limiter(&server, "down", 4, ttl, Fallback::FailOpen).await;
    let closed = limiter(&server, "down", 4, ttl, Fallback::FailClosed).await;
    let (_, before) = local.hold_slot(None).await.unwrap().unwrap();
    server.kill();
    // Local: half of the 4 slots here (local_fraction 0.5); the lease held
    // before Redis went is not among them.
    let (held, one) = local.hold_slot(None).await.unwrap().unwrap();
    assert!(held);
    let (_, two) = local.hold_slot(None).await.unwrap().unwrap();
    assert!(local.hold_slot(Some(20 * MS)).await.unwrap().is_none());
    assert_eq!(local.stats().in_flight, 3);
    drop(one);
    assert!(
        local
            .hold_slot(Some(Duration::ZERO))
            .await
            .unwrap()
            .is_some()
    );
    // FailOpen: no slot, no bound.
    for _ in 0..10 {
        let (held, _) = open.hold_slot(None).await.unwrap().unwrap();
        assert!(!held);
    }
    // FailClosed: the call fails.
    assert!(matches!(
        closed.hold_slot(None).await,
        Err(Error::Backend(_))
    ));
    drop((before, two));
    assert_eq!(local.stats().in_flight, 0);
}

/// A call waiting for one of the fallback's slots when Redis comes back
/// asks Redis, as a call that comes then does: it is not held until a call
/// that took the fallback's slot ends. (It waited for that call: a call of
/// a minute kept it a minute, with Redis's slots free.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_in_the_fallback_goes_to_redis_once_it_is_back() {
    let mut server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    // 2 slots; the fallback's share, 1.
    let local = limiter(&server, "back", 2, ttl, Fallback::Local).await;
    server.kill();
    let (held, first) = local.hold_slot(None).await.unwrap().unwrap();
    assert!(held);
    let mut waiting = Box::pin(local.hold_slot(None));
    assert!(
        tokio::time::timeout(100 * MS, &mut waiting).await.is_err(),
        "the fallback holds one slot"
    );
    server.restart();
    // Back within the probe's interval (500 ms), and a round trip.
    let (held, second) = tokio::time::timeout(Duration::from_secs(10), &mut waiting)
        .await
        .expect("still waiting for the fallback's slot, Redis back")
        .unwrap()
        .unwrap();
    assert!(held);
    assert!(!local.stats().degraded);
    assert_eq!(live(&server, "back"), 1, "its slot is a lease in Redis");
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slots_key_holding_something_else_is_an_error_whatever_the_fallback() {
    let server = RedisServer::start();
    // The leases' key, then each key of the line.
    for suffix in ["", "\\line", "\\asked"] {
        let name = format!("taken{}", suffix.len());
        let key = slots_key(&name) + suffix;
        let _: () = server.connection().set(&key, "x").unwrap();
        let limiter = limiter(
            &server,
            &name,
            2,
            Duration::from_secs(5),
            Fallback::FailOpen,
        )
        .await;
        let error = limiter.hold_slot(None).await.err();
        assert!(matches!(error, Some(Error::Backend(_))), "{key}: {error:?}");
        // The reply reads as the script wrote it, the key and what it holds.
        let text = error.unwrap().to_string();
        assert!(text.contains("paceline: the slots key"), "{text}");
        assert!(text.contains("holds a string"), "{text}");
        assert!(!limiter.stats().degraded);
        let left: String = server.connection().get(&key).unwrap();
        assert_eq!(left, "x", "untouched");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_limiters_keys_have_slots_of_their_own() {
    let server = RedisServer::start();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1_000.0)
        .limit(Limit::concurrent(1))
        .redis(
            &backend_builder(server.client()).build().await.unwrap(),
            "api",
        )
        .build()
        .unwrap();
    let alice = limiter.hold_slot("alice", None).await.unwrap().unwrap();
    let bob = limiter
        .hold_slot("bob", Some(Duration::ZERO))
        .await
        .unwrap();
    assert!(bob.is_some());
    let again = limiter
        .hold_slot("alice", Some(Duration::ZERO))
        .await
        .unwrap();
    assert!(again.is_none());
    let key = format!("{{{}}}\\slots", limiter.redis_key("alice"));
    let live: usize = server.connection().zcard(&key).unwrap();
    assert_eq!(live, 1);
    drop((alice, bob));
}

/// Through `call`: a call that is served holds a lease until it ends; one
/// that fails (calls are not yet served through Redis on this branch)
/// leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_redis_holds_a_lease_or_none() {
    let server = RedisServer::start();
    let limiter = limiter(
        &server,
        "calls",
        2,
        Duration::from_secs(30),
        Fallback::FailClosed,
    )
    .await;
    match limiter.call(1).await {
        Ok(call) => {
            assert_eq!(live(&server, "calls"), 1);
            assert_eq!(limiter.stats().in_flight, 1);
            drop(call);
        }
        Err(_) => assert_eq!(limiter.stats().in_flight, 0),
    }
    let freed = within(Duration::from_secs(1), || live(&server, "calls") == 0).await;
    assert!(freed.is_some(), "no lease is left");
}

/// Two limiters (two processes) share `k` = 2 through real calls,
/// cancelled by `timeout` wherever they are (mid round trip, pausing for a
/// slot, sleeping for their place): never more than 2 in flight, and once
/// every task is done no lease is left (long before the TTL). Patient
/// backends: a round trip a loaded machine makes late is not a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_cancelled_at_random_points_never_exceed_k_nor_leave_a_lease() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let now = Arc::new(AtomicUsize::new(0));
    let mut limiters = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let backend = patient_backend(server.client()).await;
        let limiter = Arc::new(limiter_on(
            &backend,
            "cancelled",
            2,
            ttl,
            Fallback::FailClosed,
        ));
        limiters.push(limiter.clone());
        for task in 0..10u64 {
            let (limiter, now) = (limiter.clone(), now.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..30u64 {
                    let bound = Duration::from_micros(50 + (task * 211 + round * 389) % 20_000);
                    let Ok(call) = tokio::time::timeout(bound, limiter.call(1)).await else {
                        continue;
                    };
                    let call = call.unwrap();
                    let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(in_flight <= 2, "{in_flight} calls in flight");
                    tokio::time::sleep(MS * (1 + task % 3) as u32).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    drop(call);
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    for limiter in &limiters {
        assert_eq!(limiter.stats().in_flight, 0);
    }
    let freed = within(Duration::from_secs(2), || live(&server, "cancelled") == 0).await;
    assert!(
        freed.is_some(),
        "{} leases left (TTL 30 s)",
        live(&server, "cancelled")
    );
}

/// Redis stopped for longer than a lease's renewal period while a call
/// holds it: once Redis is back the lease is renewed and still counts past
/// the TTL it was first taken for (the other process is refused), and the
/// call's end frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_across_a_stop_is_renewed_and_still_counts() {
    let server = RedisServer::start();
    // Renewed every 300 ms.
    let ttl = 900 * MS;
    let a = limiter(&server, "stopped", 1, ttl, Fallback::FailClosed).await;
    let b = limiter(&server, "stopped", 1, ttl, Fallback::FailClosed).await;
    let taken = Instant::now();
    let call = a.call(1).await.unwrap();
    server.stop();
    tokio::time::sleep(500 * MS).await;
    server.cont();
    // Past the first TTL and what a renewal sent during the stop gave:
    // only renewals since hold the lease.
    tokio::time::sleep((2 * ttl + 200 * MS).saturating_sub(taken.elapsed())).await;
    assert!(b.try_call(1, Duration::ZERO).await.unwrap().is_none());
    assert_eq!(live(&server, "stopped"), 1);
    drop(call);
    let got = b.try_call(1, Duration::from_secs(2)).await.unwrap();
    assert!(got.is_some(), "the slot was not freed");
    drop(got);
    let freed = within(Duration::from_secs(2), || live(&server, "stopped") == 0).await;
    assert!(freed.is_some(), "{} leases left", live(&server, "stopped"));
}

/// The connection dies silently (its peer vanishes: no FIN, no RST) while
/// a call holds a lease, and the process makes no other call: the lease's
/// renewals, which time out on it, take the backend to its fallback as a
/// call's round trip would, so that the probe's fresh connection replaces
/// the dead one and the renewals after it hold the lease past its TTL.
/// (Before, a renewal's failure was only logged: the dead connection was
/// never replaced, the lease expired after its TTL with the call still in
/// flight, and another process took its slot: 2 in flight of 1.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_a_silently_dead_connection_is_renewed_on_a_fresh_one() {
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    // Renewed every 800 ms.
    let ttl = 2_400 * MS;
    let name = "dead-link";
    let a = limiter_on(
        &backend(proxy.client()).await,
        name,
        1,
        ttl,
        Fallback::FailClosed,
    );
    let b = limiter(&server, name, 1, ttl, Fallback::FailClosed).await;
    let taken = Instant::now();
    // (Its round trip went through the proxy: the connection is open.)
    let call = a.call(1).await.unwrap();
    proxy.blackhole_existing();
    // Past twice the TTL: only renewals through a fresh connection hold
    // the lease.
    tokio::time::sleep((2 * ttl + 300 * MS).saturating_sub(taken.elapsed())).await;
    assert_eq!(live(&server, name), 1, "the lease expired in flight");
    assert!(
        b.try_call(1, Duration::ZERO).await.unwrap().is_none(),
        "another process took the slot of a call in flight"
    );
    drop(call);
    let freed = within(Duration::from_secs(2), || live(&server, name) == 0).await;
    assert!(freed.is_some(), "{} leases left", live(&server, name));
}

/// A call whose take is sent while Redis is stopped and which is dropped
/// before the reply: Redis applies the take once it is back, and the lease
/// is released in the background, not left for its TTL (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_dropped_while_redis_is_stopped_leaves_no_lease() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let ttl = Duration::from_secs(30);
    let a = limiter_on(&backend, "late", 1, ttl, Fallback::FailClosed);
    // The script loaded and the connection made.
    drop(a.call(1).await.unwrap());
    let freed = within(Duration::from_secs(1), || live(&server, "late") == 0).await;
    assert!(freed.is_some());
    server.stop();
    let dropped = tokio::time::timeout(30 * MS, a.call(1)).await;
    assert!(dropped.is_err(), "Redis answered while stopped");
    assert_eq!(a.stats().in_flight, 0);
    tokio::time::sleep(300 * MS).await;
    server.cont();
    let freed = within(Duration::from_secs(2), || live(&server, "late") == 0).await;
    assert!(
        freed.is_some(),
        "{} lease left (TTL 30 s)",
        live(&server, "late")
    );
}

/// `slot_ttl` is bounded above too: a TTL the slots script could not hand
/// Redis (`Duration::MAX`, or 10^14 s) built, then every call failed with
/// Redis's "value is not an integer or out of range", and the backend
/// took that for an outage of every limiter on it. It is refused when
/// built; a year, the most, works.
#[tokio::test]
async fn a_slot_ttl_past_a_year_is_refused_when_built() {
    let server = RedisServer::start();
    let backend = backend(server.client()).await;
    let year = Duration::from_secs(365 * 24 * 3600);
    let build = |ttl: Duration, name: &str| {
        RateLimiter::builder()
            .permits_per_second(1_000.0)
            .limit(Limit::concurrent(2))
            .redis(&backend, name)
            .slot_ttl(ttl)
            .fallback(Fallback::FailClosed)
            .build()
    };
    for ttl in [
        year + Duration::from_millis(1),
        Duration::from_secs(100_000_000_000_000),
        Duration::MAX,
    ] {
        match build(ttl, "huge-ttl") {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains("slot_ttl"), "{message}");
            }
            other => panic!("slot_ttl {ttl:?}: {other:?}"),
        }
    }
    let limiter = build(year, "a-year").unwrap();
    let call = limiter.call(1).await;
    assert!(call.is_ok(), "{:?}", call.err());
    assert!(!limiter.stats().degraded);
}

/// How many slots `looping` takes in turn (each held `hold`, then given back
/// and asked for again at once, as a worker's loop does) after `waiting`
/// has asked for one, until `waiting` has it (`None`: not within 400).
async fn taken_before_a_waiter(
    looping: &RateLimiter<Redis>,
    waiting: &RateLimiter<Redis>,
    hold: Duration,
) -> Option<usize> {
    let asked = Arc::new(AtomicUsize::new(usize::MAX));
    let served = Arc::new(AtomicUsize::new(usize::MAX));
    let taken = AtomicUsize::new(0);
    let worker = async {
        for _ in 0..400 {
            if served.load(Ordering::SeqCst) != usize::MAX {
                break;
            }
            let (_, slot) = looping
                .hold_slot(Some(Duration::from_secs(10)))
                .await
                .unwrap()
                .expect("the worker's slot within 10 s");
            taken.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            drop(slot);
        }
    };
    let waiter = async {
        // Asks once the worker has its third slot.
        while taken.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(MS).await;
        }
        asked.store(taken.load(Ordering::SeqCst), Ordering::SeqCst);
        let slot = waiting
            .hold_slot(Some(Duration::from_secs(20)))
            .await
            .unwrap();
        served.store(taken.load(Ordering::SeqCst), Ordering::SeqCst);
        drop(slot);
    };
    tokio::join!(worker, waiter);
    let (asked, served) = (asked.load(Ordering::SeqCst), served.load(Ordering::SeqCst));
    (served != usize::MAX && taken.load(Ordering::SeqCst) < 400).then(|| served - asked)
}

/// A worker that gives its slot back and asks again at once does not keep
/// it from a call of another process that waits: the calls waiting for a
/// slot stand in a line in Redis, served first come, first served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_worker_does_not_keep_its_slot_from_another_process() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let worker = limiter(&server, "fair", 1, ttl, Fallback::FailClosed).await;
    let other = limiter(&server, "fair", 1, ttl, Fallback::FailClosed).await;
    let before = taken_before_a_waiter(&worker, &other, 20 * MS).await;
    assert!(matches!(before, Some(0..=2)), "{before:?}");
}

/// The same within one process: a release wakes the process's waiters, and
/// the one that has waited longest has the slot, not the worker asking
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_worker_does_not_keep_its_slot_from_a_waiter_beside_it() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let limiter = limiter(&server, "fair", 1, ttl, Fallback::FailClosed).await;
    let before = taken_before_a_waiter(&limiter, &limiter, 20 * MS).await;
    assert!(matches!(before, Some(0..=2)), "{before:?}");
}

/// Calls waiting in two processes are served in the order they came, each
/// as soon as the slot before it is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_waiting_in_two_processes_are_served_in_the_order_they_came() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let a = limiter(&server, "order", 1, ttl, Fallback::FailClosed).await;
    let b = limiter(&server, "order", 1, ttl, Fallback::FailClosed).await;
    let (_, first) = a.hold_slot(None).await.unwrap().unwrap();
    let served = std::sync::Mutex::new(Vec::new());
    let wait = |number: usize| {
        let (limiter, served) = (if number.is_multiple_of(2) { &a } else { &b }, &served);
        async move {
            // One asks every 60 ms, alternately in each process.
            tokio::time::sleep(60 * MS * number as u32).await;
            let taken = limiter.hold_slot(Some(Duration::from_secs(20))).await;
            let (_, slot) = taken.unwrap().expect("a slot within 20 s");
            served.lock().unwrap().push(number);
            tokio::time::sleep(20 * MS).await;
            drop(slot);
        }
    };
    let release = async {
        tokio::time::sleep(400 * MS).await;
        drop(first);
    };
    tokio::join!(wait(1), wait(2), wait(3), wait(4), wait(5), release);
    assert_eq!(served.into_inner().unwrap(), [1, 2, 3, 4, 5]);
}

/// A call that gives up waiting leaves the line at once: the next call
/// takes the slot freed after it without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_gives_up_leaves_the_line() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let a = limiter(&server, "gives-up", 1, ttl, Fallback::FailClosed).await;
    let b = limiter(&server, "gives-up", 1, ttl, Fallback::FailClosed).await;
    let (_, held) = a.hold_slot(None).await.unwrap().unwrap();
    assert!(b.hold_slot(Some(100 * MS)).await.unwrap().is_none());
    drop(held);
    // Served as soon as the slot is free: the call that gave up no longer
    // stands ahead of it (it would for 400 ms more).
    let started = Instant::now();
    let next = a.hold_slot(Some(300 * MS)).await.unwrap();
    assert!(next.is_some(), "{:?}", started.elapsed());
}

/// A call that stands in line and is then no longer polled (its future
/// kept, not dropped) holds up the calls behind it for about 500 ms, not
/// for ever: it loses its place. Polled again, it goes behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_line_that_is_not_polled_loses_its_place() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let a = limiter(&server, "parked", 1, ttl, Fallback::FailClosed).await;
    let b = limiter(&server, "parked", 1, ttl, Fallback::FailClosed).await;
    let (_, held) = a.hold_slot(None).await.unwrap().unwrap();
    let mut parked = std::pin::pin!(b.hold_slot(Some(Duration::from_secs(20))));
    // Polled until it stands in line, then parked.
    tokio::select! {
        _ = &mut parked => panic!("the slot is held"),
        () = tokio::time::sleep(100 * MS) => {}
    }
    drop(held);
    let started = Instant::now();
    let taken = a.hold_slot(Some(Duration::from_secs(10))).await.unwrap();
    let (_, next) = taken.expect("the slot, once the parked call lost its place");
    let took = started.elapsed();
    // (The parked call last asked up to 10 ms before the slot was freed,
    // later if the machine is slow: 500 ms after that, it has lost its
    // place. Served at once, it would have kept none.)
    assert!(took >= 250 * MS && took < 600 * MS + SLACK, "{took:?}");
    let late = async {
        let taken = parked.await.unwrap();
        assert!(taken.is_some(), "served once the slot is given back");
    };
    let release = async {
        tokio::time::sleep(50 * MS).await;
        drop(next);
    };
    tokio::join!(late, release);
}

/// A call that cannot wait (its timeout zero) does not stand in the line:
/// one script call, and nothing left that another call would find ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_cannot_wait_stays_out_of_the_line() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let a = limiter(&server, "no-wait", 1, ttl, Fallback::FailClosed).await;
    let b = limiter(&server, "no-wait", 1, ttl, Fallback::FailClosed).await;
    let (_, held) = a.hold_slot(None).await.unwrap().unwrap();
    let before = server.script_calls();
    assert!(b.hold_slot(Some(Duration::ZERO)).await.unwrap().is_none());
    tokio::time::sleep(100 * MS).await;
    assert_eq!(server.script_calls() - before, 1, "a take, and no leave");
    let lined: usize = server.connection().zcard(line_key("no-wait")).unwrap();
    assert_eq!(lined, 0);
    drop(held);
}

/// The line's key of the limiter `name` (beside its slots key).
fn line_key(name: &str) -> String {
    slots_key(name) + "\\line"
}

/// A call dropped while its first take is in flight (Redis stopped, as a
/// slow round trip would be, and an outer `timeout` that gives up): the
/// take stands the call in line once Redis runs it, and the dropped
/// future must take it out again, as it does for a later take. Before:
/// nothing is sent to take it out, and the freed slot stays idle behind a
/// call that no longer exists until its place lapses (500 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_during_its_first_take_leaves_no_place_in_line() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let ttl = Duration::from_secs(30);
    let a = limiter(&server, "first-take", 1, ttl, Fallback::FailClosed).await;
    let b = limiter_on(&backend, "first-take", 1, ttl, Fallback::FailClosed);
    let (_, held) = a.hold_slot(None).await.unwrap().unwrap();
    // The script loaded and b's connection made (a call that cannot wait
    // leaves the line itself).
    assert!(b.hold_slot(Some(Duration::ZERO)).await.unwrap().is_none());
    let empty = within(Duration::from_secs(1), || {
        let n: usize = server.connection().zcard(line_key("first-take")).unwrap();
        n == 0
    })
    .await;
    assert!(empty.is_some());
    server.stop();
    let dropped = tokio::time::timeout(30 * MS, b.hold_slot(Some(Duration::from_secs(20)))).await;
    assert!(dropped.is_err(), "Redis answered while stopped");
    tokio::time::sleep(100 * MS).await;
    server.cont();
    // Redis runs b's take, then whatever b's drop sent after it.
    tokio::time::sleep(100 * MS).await;
    let in_line: usize = server.connection().zcard(line_key("first-take")).unwrap();
    drop(held);
    let started = Instant::now();
    let next = a.hold_slot(Some(300 * MS)).await.unwrap();
    assert_eq!(in_line, 0, "a dropped call still stands in line");
    assert!(next.is_some(), "{:?}", started.elapsed());
}

/// The slots script run on the slots keys of the limiter `name` with
/// `args`, as the crate sends it (read from the source tree).
fn slots_script(server: &RedisServer, name: &str, args: &[&str]) -> Vec<i64> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/lua/slots.lua");
    let source = std::fs::read_to_string(path).unwrap();
    let slots = slots_key(name);
    redis::cmd("EVAL")
        .arg(source)
        .arg(3)
        .arg(&slots)
        .arg(format!("{slots}\\line"))
        .arg(format!("{slots}\\asked"))
        .arg(args)
        .query(&mut server.connection())
        .unwrap()
}

/// A renewal sent before its lease's release and run after it (the
/// renewal task polled on one thread while the call is dropped on
/// another, its release sent from a third) takes no slot: it says when
/// the lease expires as last heard, and the lease is gone before then.
/// Before: it took the lease again, a slot held for the whole TTL (30 s by
/// default) for a call that had ended. A lease that expired (Redis away
/// past its TTL) is still taken again by its next renewal.
#[test]
fn a_renewal_run_after_its_release_takes_no_slot() {
    let server = RedisServer::start();
    let ttl = "30000000";
    let taken = slots_script(&server, "raced", &["take", "lease", "2", ttl, "call"]);
    assert_eq!(taken[..2], [1, 1]);
    let expires = taken[2].to_string();
    slots_script(&server, "raced", &["release", "lease"]);
    let renewal = ["take", "lease", "2", ttl, "", &expires];
    let renewed = slots_script(&server, "raced", &renewal);
    assert_eq!(renewed[0], 0, "a renewal run after the release took a slot");
    assert_eq!(live(&server, "raced"), 0);
    // A lease of 1 ms, expired: its renewal takes it again.
    let taken = slots_script(&server, "expired", &["take", "lease", "2", "1000", "call"]);
    assert_eq!(taken[..2], [1, 1]);
    std::thread::sleep(20 * MS);
    let expires = taken[2].to_string();
    let renewal = ["take", "lease", "2", "1000", "", &expires];
    assert_eq!(slots_script(&server, "expired", &renewal)[..2], [1, 1]);
}
