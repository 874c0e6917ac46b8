//! The Redis limiter on a three-master Redis Cluster: limiter keys land on
//! every node and each key is limited on its own.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::redis_cluster::RedisCluster;
use paceline::RateLimiter;
use paceline::redis::RedisBackend;

/// A backend of its own on `cluster` (one connection, as a process of its
/// own has), patient: a late reply on a loaded machine must not send a call
/// to the fallback.
async fn own_backend(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::cluster_builder(cluster.client())
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("cluster backend")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_are_limited_independently_across_nodes() {
    let cluster = RedisCluster::start();
    let mut limiters = Vec::new();
    for i in 0..30 {
        let limiter = RateLimiter::builder()
            .redis(&own_backend(&cluster).await, &format!("tenant-{i}"))
            .permits_per_second(1.0)
            .max_burst(Duration::from_secs(2))
            .build()
            .expect("cluster limiter");
        limiters.push(limiter);
    }
    for (i, limiter) in limiters.iter().enumerate() {
        // A new key is full: 2 stored + 1 fresh permit at once, then refused
        // (unless a stalled machine let the interval pass).
        let start = Instant::now();
        for n in 0..3 {
            assert!(
                limiter.try_acquire(1, Duration::ZERO).await.unwrap(),
                "key {i}, permit {n}"
            );
        }
        let fourth = limiter.try_acquire(1, Duration::ZERO).await.unwrap();
        assert!(
            !fourth || start.elapsed() >= Duration::from_secs(1),
            "key {i} over its limit"
        );
        // Each permit past the 3 costs a second from the first call: the
        // wait is that less the time since (Redis's clock moves no more).
        let wait = limiter.snapshot().await.unwrap().wait();
        let since_first = start.elapsed();
        let due = Duration::from_secs(1 + u64::from(fourth));
        assert!(
            wait <= Duration::from_secs(1) && wait + since_first + Duration::from_millis(1) >= due,
            "key {i}: {wait:?}, {since_first:?} after its first call"
        );
        assert!(!limiter.stats().degraded);
    }
    // The keys are spread over the nodes: each node holds some of them.
    let mut nodes_with_keys = HashSet::new();
    for (n, node) in cluster.nodes.iter().enumerate() {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("paceline:*")
            .query(&mut node.connection())
            .unwrap();
        if !keys.is_empty() {
            nodes_with_keys.insert(n);
        }
    }
    assert_eq!(
        nodes_with_keys.len(),
        3,
        "30 keys should land on all 3 masters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_a_key_on_the_cluster() {
    let cluster = RedisCluster::start();
    let a = RateLimiter::builder()
        .redis(&own_backend(&cluster).await, "shared")
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let b = RateLimiter::builder()
        .redis(&own_backend(&cluster).await, "shared")
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    let start = Instant::now();
    assert!(a.try_acquire(1, Duration::ZERO).await.unwrap());
    // Refused, unless a stalled machine let the interval pass.
    let second = b.try_acquire(1, Duration::ZERO).await.unwrap();
    assert!(
        !second || start.elapsed() >= Duration::from_millis(100),
        "the second instance sees the first one's debt"
    );
    // One interval per permit granted from the first call on, less the
    // time since (Redis's clock moves no more).
    let wait = b.reserve(1).await.unwrap();
    let since_first = start.elapsed();
    let due = Duration::from_millis(100 * (1 + u64::from(second)));
    assert!(
        wait <= Duration::from_millis(100) && wait + since_first + Duration::from_millis(1) >= due,
        "{wait:?}, {since_first:?} after the first call"
    );
}
