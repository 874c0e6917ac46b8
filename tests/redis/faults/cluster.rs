//! A cluster that loses one primary, killed or frozen: only what lives on
//! it degrades.

use super::*;
use crate::support::redis_cluster::RedisCluster;
use paceline::KeyedRateLimiter;
use paceline::redis::RedisBackend;

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
        let node = cluster.node_for_key(&format!("paceline:v1:{name}"));
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
            let own = RateLimiter::builder()
                .permits_per_second(1_000.0)
                .redis(&cluster_backend(&cluster).await, name)
                .build()
                .unwrap();
            // The same key through the shared backend.
            let sharing = RateLimiter::builder()
                .redis(&shared, name)
                .permits_per_second(1_000.0)
                .build()
                .unwrap();
            for limiter in [own, sharing] {
                assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
                assert!(!limiter.stats().degraded);
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
            assert!(result.is_ok(), "{}: {result:?}", limiter.redis_key());
            slowest = slowest.max(call.elapsed());
        }
        for limiter in &others {
            assert!(
                !limiter.stats().degraded,
                "{}: {:?}",
                limiter.redis_key(),
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
        assert!(limiter.stats().degraded, "{}", limiter.redis_key());
        assert_eq!((stats.fallbacks, stats.recoveries), (1, 0), "{stats:?}");
        assert!(stats.fallback_calls >= rounds, "{stats:?}");
    }
    for limiter in others.iter().step_by(2) {
        let stats = limiter.stats();
        assert_eq!((stats.fallbacks, stats.fallback_calls), (0, 0), "{stats:?}");
    }
    assert!(victims.iter().all(|l| l.stats().degraded));
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

/// Runs [`recovers_once`] until the limiter switched once only: on a
/// loaded machine a late answer may make a second switch, and a limiter
/// that flaps makes one in every run.
async fn recovers_on_its_own_node_while_another_primary_is(other: Other) {
    for attempt in 1..=3 {
        let stats = recovers_once(other).await;
        if (stats.fallbacks, stats.recoveries) == (1, 1) {
            return;
        }
        println!("attempt {attempt}: switched more than once: {stats:?}");
    }
    panic!("the limiter switched more than once in each of 3 runs");
}

/// The scenario once; the limiter's stats at its end.
async fn recovers_once(other: Other) -> paceline::Stats {
    let mut cluster = RedisCluster::start();
    for node in &cluster.nodes {
        node.config_set("cluster-require-full-coverage", "no");
    }
    const HOME: usize = 0;
    const DEAD: usize = 1;
    let name = (0..)
        .map(|i| format!("home-{i}"))
        .find(|name| cluster.node_for_key(&format!("paceline:v1:{name}")) == HOME)
        .unwrap();
    let limiter = RateLimiter::builder()
        .permits_per_second(1_000.0)
        .redis(&cluster_backend(&cluster).await, &name)
        .build()
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
    assert!(!limiter.stats().degraded, "{:?}", limiter.stats());

    // Its own node freezes (for less than the cluster's node timeout, so
    // the cluster itself does not change): it degrades.
    cluster.nodes[HOME].stop();
    let frozen = Instant::now();
    while !limiter.stats().degraded {
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
        || limiter.stats().degraded,
        || limiter.stats(),
    )
    .await;
    println!("back on {what} {took:?} after SIGCONT");
    let stats = limiter.stats();
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(!limiter.stats().degraded);
    stats
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
    let names = two_names_per_node(&cluster, "api", |name| format!("paceline:v1:{name}"));
    let tenants = two_names_per_node(&cluster, "tenant", |t| format!("paceline:v1:tenants:{t}"));
    let limiters: Vec<Vec<RateLimiter<Redis>>> = names
        .iter()
        .map(|names| {
            names
                .iter()
                .map(|name| {
                    RateLimiter::builder()
                        .redis(&backend, name)
                        .permits_per_second(1_000.0)
                        .build()
                        .unwrap()
                })
                .collect()
        })
        .collect();
    let keyed = KeyedRateLimiter::<String>::builder()
        .redis(&backend, "tenants")
        .permits_per_second(1_000.0)
        .build()
        .unwrap();
    for (limiter, tenant) in limiters.iter().flatten().zip(tenants.iter().flatten()) {
        assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
        assert!(keyed.try_acquire(tenant, 1, Duration::ZERO).await.unwrap());
    }
    // The second limiter and tenant of the victim make no call from here.
    let active: Vec<&RateLimiter<Redis>> = limiters
        .iter()
        .enumerate()
        .flat_map(|(node, l)| if node == VICTIM { &l[..1] } else { &l[..] })
        .collect();
    let active_tenants: Vec<&String> = tenants
        .iter()
        .enumerate()
        .flat_map(|(node, t)| if node == VICTIM { &t[..1] } else { &t[..] })
        .collect();
    let healthy: Vec<&RateLimiter<Redis>> = limiters
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
            assert!(result.is_ok(), "{}: {result:?}", limiter.redis_key());
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
            assert!(!limiter.stats().degraded, "{}", limiter.redis_key());
        }
        // The keyed fallback holds the victim's one active tenant at most.
        assert!(
            keyed.stats().keys <= 1,
            "{} keys held locally",
            keyed.stats().keys
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = backend.stats();
    println!(
        "node {VICTIM} frozen for {:?}: slowest call {slowest:?}, {stats:?}",
        frozen.elapsed()
    );
    assert!(slowest <= CALL_BOUND, "a call took {slowest:?}");
    // The idle limiter on the node is marked down by the probe, which reads
    // the slot map: under a loaded test run that can take a probe or two
    // more (still well inside the cluster's node timeout).
    let idle_marked = within(Duration::from_secs(2), || {
        limiters[VICTIM].iter().all(|l| l.stats().degraded)
    })
    .await;
    assert!(idle_marked.is_some(), "{:?}", backend.stats());
    let stats = backend.stats();
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
        || backend.stats().degraded,
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
        assert!(!limiter.stats().degraded);
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
    within(Duration::from_secs(2), || keyed.stats().keys == 0)
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
    let hung = cluster.node_for_key("paceline-probe");
    let names = two_names_per_node(&cluster, "api", |name| format!("paceline:v1:{name}"));
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
    assert!(backend.stats().degraded);
    let limiters: Vec<(usize, RateLimiter<Redis>)> = names
        .iter()
        .enumerate()
        .flat_map(|(node, names)| names.iter().map(move |name| (node, name)))
        .map(|(node, name)| {
            let limiter = RateLimiter::builder()
                .redis(&backend, name)
                .permits_per_second(1_000.0)
                .build()
                .unwrap();
            (node, limiter)
        })
        .collect();
    let healthy_on_redis = || {
        limiters
            .iter()
            .all(|(node, limiter)| limiter.stats().degraded == (*node == hung))
    };
    let mut slowest = Duration::ZERO;
    while !healthy_on_redis() {
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}; degraded: {:?}",
            backend.stats(),
            limiters
                .iter()
                .map(|(node, l)| (*node, l.stats().degraded))
                .collect::<Vec<_>>()
        );
        for (_, limiter) in &limiters {
            let call = Instant::now();
            let result = limiter.try_acquire(1, Duration::from_millis(10)).await;
            assert!(result.is_ok(), "{}: {result:?}", limiter.redis_key());
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
        assert_eq!(
            limiter.stats().degraded,
            *node == hung,
            "{}",
            limiter.redis_key()
        );
    }
    assert_eq!(
        backend.stats().fallback_calls - before,
        2,
        "only the hung node's two limiters use their fallbacks"
    );
    cluster.nodes[hung].cont();
    within(Duration::from_secs(4), || !backend.stats().degraded)
        .await
        .unwrap_or_else(|| panic!("still degraded: {:?}", backend.stats()));
}

/// A backend of its own on `cluster` (one connection, as a process of its
/// own has), with the tests' timeout and probe interval.
async fn cluster_backend(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::cluster_builder(cluster.client())
        .response_timeout(RESPONSE_TIMEOUT)
        .probe_interval(PROBE_INTERVAL)
        .build()
        .await
        .unwrap()
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
