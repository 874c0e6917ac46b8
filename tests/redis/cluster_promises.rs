//! Probes of the Redis limiters on a three-primary Redis Cluster beyond
//! `cluster` and `faults::cluster`: hash-tagged names, concurrent leases,
//! several limits, hot keys, outbound calls, and a node killed and
//! restarted empty with the permits counted across both switches.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::limiter_state::Value;
use crate::support::poll::{PROBE_INTERVAL, RESPONSE_TIMEOUT, SLACK};
use crate::support::redis_cluster::RedisCluster;
use crate::support::within::within;
use paceline::outbound::Feedback;
use paceline::redis::{Fallback, RedisBackend};
use paceline::{KeyedRateLimiter, Limit, RateLimiter};

/// A backend with the tests' response timeout and probe interval.
async fn quick_backend(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::cluster_builder(cluster.client())
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
        .build()
        .await
        .unwrap()
}

/// A backend that waits 5 s for an answer (a loaded machine must not send
/// a call to the fallback).
async fn patient(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::cluster_builder(cluster.client())
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// Keeps serving the slots that are left when a node dies.
fn partial_coverage(cluster: &RedisCluster) {
    for node in &cluster.nodes {
        node.config_set("cluster-require-full-coverage", "no");
    }
}

/// The first of `candidates` whose Redis key (`key(c)`) is on `node`.
fn on_node(
    cluster: &RedisCluster,
    node: usize,
    prefix: &str,
    key: impl Fn(&str) -> String,
) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|c| cluster.node_for_key(&key(c)) == node)
        .unwrap()
}

/// The most of `times` (sorted) that fall in any window of `window`.
fn most_in_a_window(times: &[Instant], window: Duration) -> usize {
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end].duration_since(times[start]) >= window {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// A keyed limiter named with a hash tag keeps every key in one slot:
/// concurrent leases (the slots key beside each key) work there with no
/// CROSSSLOT error, the limit holds per key, and a drop frees a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_leases_work_on_a_cluster_with_and_without_hash_tags() {
    let cluster = RedisCluster::start();
    let backend = patient(&cluster).await;
    for name in ["{tenant-7}", "plain", "{tenant-7}x"] {
        let keyed = KeyedRateLimiter::<String>::builder()
            .permits_per_second(1_000.0)
            .limit(Limit::concurrent(2))
            .redis(&backend, name)
            .fallback(Fallback::FailClosed)
            .build()
            .unwrap();
        let single = RateLimiter::builder()
            .permits_per_second(1_000.0)
            .limit(Limit::concurrent(2))
            .redis(&backend, name)
            .fallback(Fallback::FailClosed)
            .build()
            .unwrap();
        let mut nodes = std::collections::BTreeSet::new();
        for k in 0..12 {
            let key = format!("user-{k}");
            nodes.insert(cluster.node_for_key(&keyed.redis_key(&key)));
            let a = keyed.hold_slot(&key, None).await.unwrap().unwrap();
            let b = keyed.hold_slot(&key, None).await.unwrap().unwrap();
            assert!(a.0 && b.0, "{name} {key}: held through Redis");
            let third = keyed
                .hold_slot(&key, Some(Duration::from_millis(20)))
                .await
                .unwrap();
            assert!(third.is_none(), "{name} {key}: a third slot");
            drop(a);
            let again = keyed
                .hold_slot(&key, Some(Duration::from_secs(2)))
                .await
                .unwrap();
            assert!(again.is_some_and(|s| s.0), "{name} {key}: freed");
            drop(b);
        }
        if name.starts_with('{') {
            assert_eq!(nodes.len(), 1, "{name}: one slot");
        } else {
            assert_eq!(nodes.len(), 3, "{name}: keys over every node");
        }
        let a = single.hold_slot(None).await.unwrap().unwrap();
        let b = single.hold_slot(None).await.unwrap().unwrap();
        assert!(a.0 && b.0);
        assert!(
            single
                .hold_slot(Some(Duration::from_millis(20)))
                .await
                .unwrap()
                .is_none()
        );
        // A call goes through too.
        drop((a, b));
        let call = keyed.call("user-0", 1).await.unwrap();
        drop(call);
        assert!(!keyed.stats().degraded && !single.stats().degraded);
    }
    assert_eq!(backend.stats().fallback_calls, 0);
}

/// A name with a `}` and no hash tag (`a}b`) would put a limiter's slots
/// key in another slot than its key (on another node, maybe), whose
/// outage it then took for its key's: the healthy node of its key went to
/// the fallback, and the backend flapped every probe interval. On a
/// cluster such a name cannot hold calls in flight: refused when built,
/// saying how to name it; with a hash tag, or without a concurrent limit,
/// it builds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_parts_a_key_from_its_slots_holds_no_calls_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backend = quick_backend(&cluster).await;
    let build = |name: &str, calls: bool| {
        let builder = RateLimiter::builder().permits_per_second(1_000.0);
        let builder = match calls {
            true => builder.limit(Limit::concurrent(4)),
            false => builder,
        };
        builder.redis(&backend, name).build()
    };
    match build("a}b", true) {
        Err(paceline::Error::InvalidArgument(message)) => {
            assert!(message.contains("{a}b}"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(build("a}b", false).is_ok());
    assert!(build("{a}b", true).is_ok());
    assert!(build("ab", true).is_ok());
}

/// A keyed limiter named `{tenant-7}` keeps all its keys on one node. When
/// another node dies, none of its keys is served by its fallback, so its
/// stats must not say it is degraded (`Stats::degraded`: "whether calls are
/// being served by the fallback now (...; on a cluster, some of its keys)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_tagged_keyed_limiter_is_not_degraded_by_another_nodes_outage() {
    let mut cluster = RedisCluster::start();
    partial_coverage(&cluster);
    let backend = quick_backend(&cluster).await;
    let keyed = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1_000.0)
        .redis(&backend, "{tenant-7}")
        .build()
        .unwrap();
    let home = cluster.node_for_key(&keyed.redis_key("x"));
    let dead = (home + 1) % 3;
    let victim = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .redis(
            &backend,
            &on_node(&cluster, dead, "victim", |n| format!("paceline:v1:{n}")),
        )
        .build()
        .unwrap();
    assert!(victim.try_acquire(1, Duration::ZERO).await.unwrap());
    cluster.nodes[dead].kill();
    let r = victim.try_acquire(1, Duration::ZERO).await;
    assert!(r.is_ok(), "{r:?}");
    within(Duration::from_secs(2), || victim.stats().degraded)
        .await
        .expect("the victim degrades");
    for k in 0..20 {
        let r = keyed.try_acquire(&format!("k{k}"), 1, Duration::ZERO).await;
        assert!(r.is_ok(), "{r:?}");
    }
    // None of its keys is held by its fallback: all went to Redis.
    assert_eq!(keyed.stats().keys, 0, "{:?}", keyed.stats());
    assert!(
        !keyed.stats().degraded,
        "no key of {{tenant-7}} (node {home}) is on the dead node {dead}: {:?}",
        keyed.stats()
    );
}

/// Two limits and coalesced hot keys on a cluster: 200 tasks on each of
/// three keys (one per node) get no more than the burst plus what the rate
/// refills, on every limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_keys_with_two_limits_are_exact_on_every_node() {
    let cluster = RedisCluster::start();
    let backend = patient(&cluster).await;
    let keyed = Arc::new(
        KeyedRateLimiter::<String>::builder()
            .limit(Limit::per_second(50.0).burst(20))
            .limit(Limit::per_second(1_000.0).burst(500))
            .redis(&backend, "hot")
            .build()
            .unwrap(),
    );
    let keys: Vec<String> = (0..3)
        .map(|n| on_node(&cluster, n, "k", |k| keyed.redis_key(k)))
        .collect();
    let start = Instant::now();
    let granted: Vec<Arc<AtomicU64>> = keys.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        for _ in 0..200 {
            let (keyed, key, granted) = (Arc::clone(&keyed), key.clone(), Arc::clone(&granted[i]));
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    if keyed.try_acquire(&key, 1, Duration::ZERO).await.unwrap() {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    for (i, g) in granted.iter().enumerate() {
        let g = g.load(Ordering::Relaxed);
        let bound = 20.0 + 1.0 + 50.0 * elapsed;
        assert!(
            g as f64 <= bound && g >= 20,
            "key {} (node {i}): {g} granted in {elapsed:.3}s (bound {bound})",
            keys[i]
        );
    }
    assert_eq!(backend.stats().fallback_calls, 0);
}

/// An outbound call on each node's key learns a 429: the lesson lands on
/// that key, on its node, and nowhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lesson_lands_on_its_keys_node() {
    let cluster = RedisCluster::start();
    let backend = patient(&cluster).await;
    let keyed = KeyedRateLimiter::<String>::builder()
        .limit(Limit::per_second(100.0).burst(1))
        .limit(Limit::per_second(10_000.0).burst(1))
        .redis(&backend, "upstream")
        .fallback(Fallback::FailClosed)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..3)
        .map(|n| on_node(&cluster, n, "api", |k| keyed.redis_key(k)))
        .collect();
    for (node, key) in keys.iter().enumerate() {
        let call = keyed.call(key, 1).await.unwrap();
        call.learn(&Feedback::new(429).with_retry_after(Duration::from_millis(100)));
        drop(call);
        let mut con = cluster.nodes[node].connection();
        let redis_key = keyed.redis_key(key);
        within(Duration::from_secs(5), || {
            Value::read(&mut con, &redis_key).is_some_and(|v| v.learned.is_some())
        })
        .await
        .unwrap_or_else(|| panic!("{redis_key} on node {node} learned nothing"));
    }
    for key in &keys {
        let v = Value::read(
            &mut cluster.nodes[cluster.node_for_key(&keyed.redis_key(key))].connection(),
            &keyed.redis_key(key),
        )
        .unwrap();
        assert_eq!(v.learned.as_ref().unwrap()[0], 0.7, "{key}");
        assert_eq!(v.limits[0].permits_per_second, 70.0, "{key}");
    }
    assert!(!keyed.stats().degraded);
}

/// One node is killed, then restarted empty (same port, its cluster
/// config kept). A keyed limiter with one key per node, 10 per second
/// and no burst, called every 10 ms throughout: the keys of the two other
/// nodes never leave Redis (the backend's fallback serves the victim's key
/// only), no key is granted more than its rate allows in any second
/// (plus the one burst a vanished key may give), and the victim's key is
/// back in Redis on its node, carrying the fallback's debt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_and_restarted_empty_counts_every_permit_once() {
    let mut cluster = RedisCluster::start();
    partial_coverage(&cluster);
    const VICTIM: usize = 2;
    // (1 s for an answer: a killed node is seen at once, and on a loaded
    // machine a healthy one's answer may come later than the tests' usual
    // 100 ms, which would send its key to the fallback.)
    let timeout = Duration::from_secs(1);
    let backend = RedisBackend::cluster_builder(cluster.client())
        .response_timeout(timeout)
        .probe_interval(PROBE_INTERVAL)
        .build()
        .await
        .unwrap();
    let keyed = KeyedRateLimiter::<String>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .redis(&backend, "restart")
        .local_fraction(1.0)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..3)
        .map(|n| on_node(&cluster, n, "key", |k| keyed.redis_key(k)))
        .collect();
    let start = Instant::now();
    let (mut killed, mut restarted) = (false, false);
    // A restarted primary answers CLUSTERDOWN for up to the node timeout
    // (its rejoin delay, 5 s here) before it serves its slots again: call
    // on until a second after the backend is back, for up to 15 s.
    let mut back: Option<Instant> = None;
    let rounds = call_each_node(&keyed, &backend, &keys, VICTIM, || {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "never back on Redis: {:?}",
            backend.stats()
        );
        if restarted && back.is_none() && !backend.stats().degraded {
            back = Some(Instant::now());
        }
        if !killed && start.elapsed() >= Duration::from_millis(800) {
            cluster.nodes[VICTIM].kill();
            killed = true;
        }
        if !restarted && start.elapsed() >= Duration::from_millis(2_000) {
            cluster.nodes[VICTIM].restart();
            restarted = true;
        }
        back.is_none_or(|at| at.elapsed() < Duration::from_secs(1))
    })
    .await;
    // 10 per second, and one more: the first of a window at its edge. The
    // victim's key vanished with the restart: one burst more (one permit
    // at max_burst 0).
    rounds.check(
        &backend,
        timeout,
        |node| if node == VICTIM { 12 } else { 11 },
    );
    // The victim's key is in Redis on its node again: a reservation there
    // (five seconds of debt, so that the key outlives a loaded machine's
    // delay before the look: at no burst it expires once its debt is paid)
    // is served by Redis, not by the fallback.
    let redis_key = keyed.redis_key(&keys[VICTIM]);
    let served_locally = backend.stats().fallback_calls;
    keyed.reserve(&keys[VICTIM], 50).await.unwrap();
    assert_eq!(backend.stats().fallback_calls, served_locally);
    let mut con = cluster.nodes[VICTIM].connection();
    let exists: bool = redis::cmd("EXISTS")
        .arg(&redis_key)
        .query(&mut con)
        .unwrap();
    assert!(exists, "{redis_key} is not on node {VICTIM}");
    assert_eq!(keyed.stats().keys, 0, "{:?}", keyed.stats());
}

/// A key's slot is resharded from its node to another while the limiter
/// is in use: first ASK (the slot migrating, the key moved), then MOVED
/// (the slot handed over). The limiter follows the redirects: no error,
/// no fallback, and the key's debt moves with it (nothing granted twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resharded_key_keeps_its_debt_through_ask_and_moved() {
    let cluster = RedisCluster::start();
    let backend = quick_backend(&cluster).await;
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .redis(&backend, "moving")
        .build()
        .unwrap();
    let key = limiter.redis_key();
    let from = cluster.node_for_key(&key);
    let to = (from + 1) % 3;
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&key)
        .query(&mut cluster.nodes[from].connection())
        .unwrap();
    let id = |n: usize| -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut cluster.nodes[n].connection())
            .unwrap()
    };
    let (from_id, to_id) = (id(from), id(to));
    // Three seconds of debt.
    assert!(limiter.try_acquire(30, Duration::ZERO).await.unwrap());
    let refused = |phase: &'static str| {
        let limiter = &limiter;
        async move {
            let r = limiter.try_acquire(1, Duration::ZERO).await;
            assert!(matches!(r, Ok(false)), "{phase}: {r:?}");
            assert!(!limiter.stats().degraded, "{phase}: {:?}", limiter.stats());
        }
    };
    refused("before").await;
    let setslot = |n: usize, args: &[&str]| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot);
        for a in args {
            cmd.arg(*a);
        }
        let _: () = cmd
            .query(&mut cluster.nodes[n].connection())
            .unwrap_or_else(|e| panic!("SETSLOT {args:?} on {n}: {e}"));
    };
    setslot(to, &["IMPORTING", &from_id]);
    setslot(from, &["MIGRATING", &to_id]);
    refused("migrating, key still on the source").await;
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(cluster.nodes[to].port())
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&key)
        .query(&mut cluster.nodes[from].connection())
        .unwrap();
    refused("migrating, key on the target (ASK)").await;
    for n in [to, from, (from + 2) % 3] {
        setslot(n, &["NODE", &to_id]);
    }
    refused("handed over (MOVED)").await;
    let stats = backend.stats();
    assert_eq!((stats.fallbacks, stats.fallback_calls), (0, 0), "{stats:?}");
    assert_eq!(cluster.node_for_key(&key), to);
    let wait = limiter.snapshot().await.unwrap().wait();
    assert!(wait >= Duration::from_secs(2), "the debt moved: {wait:?}");
}

/// One primary freezes (SIGSTOP) for 1.5 s, under its node timeout, while a
/// keyed limiter (one key per node, 10 per second, no burst) is called
/// every 10 ms on a cluster client that gives up on a node after 50 ms,
/// as the docs advise. The other nodes' keys never use the fallback, no
/// call takes longer than the response timeout (plus slack), and no key
/// is granted more than its rate in any second across both switches (a
/// late reply's reservation is given back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_counts_every_permit_once_across_both_switches() {
    let cluster = RedisCluster::start();
    const VICTIM: usize = 0;
    // (500 ms for an answer, not the tests' usual 100 ms: on a loaded
    // machine a healthy node's answer may come that late, and its key would
    // go to the fallback. The freeze outlasts it three times.)
    let timeout = Duration::from_millis(500);
    let backend = RedisBackend::cluster_builder(
        cluster.client_with_connection_timeout(Duration::from_millis(50)),
    )
    .response_timeout(timeout)
    .probe_interval(PROBE_INTERVAL)
    .build()
    .await
    .unwrap();
    let keyed = KeyedRateLimiter::<String>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .redis(&backend, "frozen")
        .local_fraction(1.0)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..3)
        .map(|n| on_node(&cluster, n, "key", |k| keyed.redis_key(k)))
        .collect();
    let start = Instant::now();
    let (mut stopped, mut resumed) = (false, false);
    let rounds = call_each_node(&keyed, &backend, &keys, VICTIM, || {
        if !stopped && start.elapsed() >= Duration::from_millis(800) {
            cluster.nodes[VICTIM].stop();
            stopped = true;
        }
        if !resumed && start.elapsed() >= Duration::from_millis(2_300) {
            cluster.nodes[VICTIM].cont();
            resumed = true;
        }
        start.elapsed() < Duration::from_millis(4_500)
    })
    .await;
    rounds.check(&backend, timeout, |_| 11);
    within(Duration::from_secs(2), || keyed.stats().keys == 0)
        .await
        .unwrap_or_else(|| panic!("not carried back: {:?}", keyed.stats()));
}

/// What calling one key per node every 10 ms gave: each node's grants'
/// moments, the slowest call, and the calls of healthy nodes' keys that
/// the fallback served.
struct Rounds {
    grants: BTreeMap<usize, Vec<Instant>>,
    slowest: Duration,
    healthy_fallback_calls: u64,
}

/// Calls each of `keys` (the key of node `i` at `i`) every 10 ms, as long
/// as `go_on` (run before each round: it kills, stops or restarts the
/// `victim` at its moments) says.
async fn call_each_node(
    keyed: &KeyedRateLimiter<String, paceline::redis::Redis>,
    backend: &RedisBackend,
    keys: &[String],
    victim: usize,
    mut go_on: impl FnMut() -> bool,
) -> Rounds {
    let mut rounds = Rounds {
        grants: BTreeMap::new(),
        slowest: Duration::ZERO,
        healthy_fallback_calls: 0,
    };
    while go_on() {
        for (node, key) in keys.iter().enumerate() {
            let before = backend.stats().fallback_calls;
            let call = Instant::now();
            let r = keyed.try_acquire(key, 1, Duration::ZERO).await;
            rounds.slowest = rounds.slowest.max(call.elapsed());
            assert!(r.is_ok(), "{key}: {r:?}");
            if node != victim && backend.stats().fallback_calls != before {
                rounds.healthy_fallback_calls += 1;
            }
            if r.unwrap() {
                rounds.grants.entry(node).or_default().push(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rounds
}

impl Rounds {
    /// No call past the response timeout (and slack), no healthy key on
    /// the fallback, one switch each way, and no node's key granted more
    /// than `bound(node)` in any second, nor starved.
    fn check(&self, backend: &RedisBackend, timeout: Duration, bound: impl Fn(usize) -> usize) {
        let stats = backend.stats();
        println!(
            "{stats:?}; slowest call {:?}; grants per node: {:?}",
            self.slowest,
            self.grants
                .iter()
                .map(|(n, g)| (n, g.len()))
                .collect::<Vec<_>>()
        );
        assert!(
            self.slowest <= timeout + SLACK,
            "a call took {:?}",
            self.slowest
        );
        assert_eq!(
            self.healthy_fallback_calls, 0,
            "healthy keys served by the fallback"
        );
        assert_eq!((stats.fallbacks, stats.recoveries), (1, 1), "{stats:?}");
        for (node, times) in &self.grants {
            let most = most_in_a_window(times, Duration::from_secs(1));
            assert!(
                most <= bound(*node),
                "node {node}'s key: {most} grants in one second ({} in all)",
                times.len()
            );
            assert!(
                times.len() >= 30,
                "node {node}'s key starved: {}",
                times.len()
            );
        }
    }
}
