//! Keyed limiting through Redis: one backend, many keys, each its own Redis
//! key; one connection; keys that expire once idle; a local fallback bounded
//! by `max_keys` whose debts go back to Redis key by key.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::poll::{RESPONSE_TIMEOUT, SLACK, backend, patient_backend};

#[cfg(feature = "redis-cluster")]
use crate::support::redis_cluster::RedisCluster;
use crate::support::redis_server::RedisServer;
use crate::support::within::within;
use paceline::redis::{Redis, RedisBackend};
use paceline::{Error, KeyedLimiter, KeyedRateLimiter, RateLimiter};

const MS: Duration = Duration::from_millis(1);

fn keyed(backend: &RedisBackend, rate: f64) -> KeyedRateLimiter<String, Redis> {
    KeyedRateLimiter::<String>::builder()
        .redis(backend, "api")
        .permits_per_second(rate)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_is_its_own_redis_key_and_limited_alone() {
    let server = RedisServer::start();
    // Patient: a late reply on a loaded machine must not send a call to
    // the fallback.
    let backend = patient_backend(server.client()).await;
    // One each 2 s: alice's debt (4 s after her first call) outlasts the
    // tries below however late they run.
    let limiter = keyed(&backend, 0.5);
    let (alice, bob) = ("alice".to_owned(), "bob".to_owned());
    let start = Instant::now();
    assert_eq!(limiter.reserve(&alice, 1).await.unwrap(), Duration::ZERO);
    let wait = limiter.reserve(&alice, 1).await.unwrap();
    let since_first = start.elapsed();
    // Redis's clock moves between the calls by at most the time they take.
    assert!(
        wait <= 2000 * MS && wait + since_first + MS >= 2000 * MS,
        "{wait:?}, {since_first:?} after the first call"
    );
    assert!(
        !limiter
            .try_acquire(&alice, 1, Duration::ZERO)
            .await
            .unwrap()
    );
    // One saturated key leaves another untouched.
    assert_eq!(limiter.snapshot(&bob).await.unwrap().wait(), Duration::ZERO);
    assert!(limiter.try_acquire(&bob, 1, Duration::ZERO).await.unwrap());
    assert_eq!(limiter.redis_key(&alice), "paceline:v1:api:alice");
    // A `String`-keyed limiter is asked with a `&str` too.
    let owed = limiter.snapshot("alice").await.unwrap().wait();
    let since_first = start.elapsed();
    assert!(
        owed <= 4000 * MS && owed + since_first + MS >= 4000 * MS,
        "{owed:?}, {since_first:?} after the first call"
    );
    assert!(
        !limiter
            .try_acquire("alice", 1, Duration::ZERO)
            .await
            .unwrap()
    );
    let mut con = server.connection();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("paceline:v1:api:*")
        .query(&mut con)
        .unwrap();
    keys.sort();
    assert_eq!(keys, ["paceline:v1:api:alice", "paceline:v1:api:bob"]);
    // The trait object works the same.
    let shared: Arc<dyn KeyedLimiter<String>> = Arc::new(limiter);
    assert!(!shared.try_acquire(&alice, 1, Duration::ZERO).await.unwrap());
    // Bad input.
    assert!(matches!(
        shared.reserve(&bob, 0).await,
        Err(Error::InvalidArgument(_))
    ));
    let bad = KeyedRateLimiter::<u64>::builder()
        .redis(&backend, "x")
        .permits_per_second(1.0)
        .max_keys(0)
        .build();
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_keys_use_one_connection_and_expire_once_idle() {
    let server = RedisServer::start();
    let mut observer = server.connection();
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("observer")
        .query(&mut observer)
        .unwrap();
    // Patient: every key must reach Redis, and a call that merely runs
    // late on a loaded machine would be served by the fallback instead.
    let backend = patient_backend(server.client()).await;
    // 1/s with a burst of 1 s: a key one permit short is full again a
    // second later, and expires then (its TTL has up to a second of slack).
    let limiter = Arc::new(
        KeyedRateLimiter::<u64>::builder()
            .redis(&backend, "users")
            .permits_per_second(1.0)
            .max_burst(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    let tasks: Vec<_> = (0..64u64)
        .map(|t| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                for key in (t..10_000).step_by(64) {
                    limiter.reserve(&key, 1).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.fallbacks, stats.fallback_calls),
        (0, 0),
        "every call went to Redis: {stats:?}"
    );
    // One data connection; a connection closed before (a build's check)
    // may still be listed until a loaded server reads its close, so the
    // list is read again for up to two seconds before the count is held.
    let mut list = String::new();
    for _ in 0..20 {
        list = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut observer)
            .unwrap();
        if list
            .lines()
            .filter(|l| !l.contains("name=observer"))
            .count()
            == 1
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let clients = list
        .lines()
        .filter(|l| !l.contains("name=observer"))
        .count();
    assert_eq!(clients, 1, "one data connection for 10 000 keys:\n{list}");
    // Every key was written: those not yet expired, and those expired
    // already (the first ones, on a machine slow enough to take a second).
    let size: usize = redis::cmd("DBSIZE").query(&mut observer).unwrap();
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut observer)
        .unwrap();
    let expired: usize = stats
        .lines()
        .find_map(|line| line.strip_prefix("expired_keys:"))
        .map_or(0, |n| n.trim().parse().unwrap());
    assert!(size + expired >= 10_000, "{size} keys, {expired} expired");
    // Each key's TTL is about 2 s; Redis's own expiry cycle, starved on a
    // loaded machine, may take a few more to find the last of them.
    let gone = within(Duration::from_secs(10), || {
        redis::cmd("DBSIZE").query::<usize>(&mut observer).unwrap() == 0
    })
    .await;
    assert!(gone.is_some(), "idle keys did not expire");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_the_fallback_serves_within_max_local_keys() {
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = KeyedRateLimiter::<u64>::builder()
        .redis(&backend, "down")
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .max_keys(100)
        .build()
        .unwrap();
    limiter.reserve(&1, 1).await.unwrap();
    server.kill();
    for key in 0..1_000u64 {
        let start = Instant::now();
        limiter.reserve(&key, 1).await.unwrap();
        assert!(start.elapsed() <= RESPONSE_TIMEOUT + SLACK);
        assert!(
            limiter.stats().keys <= 100,
            "{} keys held",
            limiter.stats().keys
        );
    }
    assert!(limiter.stats().degraded);
    assert_eq!(limiter.stats().fallbacks, 1);
    // A key served locally opens with no burst: 10/s, one at once.
    assert!(!limiter.try_acquire(&999, 1, Duration::ZERO).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_carries_its_own_local_debt_back_to_redis() {
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = keyed(&backend, 10.0);
    let (busy, quiet) = ("busy".to_owned(), "quiet".to_owned());
    limiter.reserve(&quiet, 1).await.unwrap();
    server.kill();
    // Served locally: 10 permits at once leave a second of debt on `busy`.
    let opened = Instant::now();
    assert_eq!(limiter.reserve(&busy, 10).await.unwrap(), Duration::ZERO);
    let granted = Instant::now();
    assert!(limiter.stats().degraded);
    let restarted = Instant::now();
    server.restart();
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("recovers after the restart");
    let wait = limiter.reserve(&busy, 1).await.unwrap();
    // The debt ends 1 s after the local grant; it is carried (and read
    // back) after the restart began and before this call returned.
    let left = Duration::from_secs(1).saturating_sub(opened.elapsed());
    let most = Duration::from_secs(1).saturating_sub(restarted - granted);
    assert!(
        wait + MS >= left && wait <= most + MS,
        "busy waits {wait:?}, its local debt left {left:?} (at most {most:?})"
    );
    assert_eq!(limiter.stats().keys, 0, "the fallback forgot the key");
    // A key the fallback never served starts afresh in the new server.
    assert_eq!(limiter.reserve(&quiet, 1).await.unwrap(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_opens_in_the_fallback_with_the_debt_redis_reported() {
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = keyed(&backend, 10.0);
    // Saturated in Redis: 10 permits at once leave a second of debt.
    let asked = Instant::now();
    assert_eq!(
        limiter.reserve("saturated", 10).await.unwrap(),
        Duration::ZERO
    );
    assert_eq!(limiter.reserve("idle", 1).await.unwrap(), Duration::ZERO);
    let reported = Instant::now();
    server.kill();
    // The fallback does not open with a clean slate: the saturated key
    // stays saturated, the other owes only its one interval.
    let serving = Instant::now();
    let wait = limiter.reserve("saturated", 1).await.unwrap();
    // The debt ends 1 s after its reply came, between `asked` and
    // `reported`; the fallback served between `serving` and now.
    let least = Duration::from_secs(1).saturating_sub(asked.elapsed());
    let most = Duration::from_secs(1).saturating_sub(serving - reported);
    assert!(limiter.stats().degraded);
    assert!(
        wait + MS >= least && wait <= most + MS,
        "the saturated key waits {wait:?}, Redis's debt left {least:?} to {most:?}"
    );
    let idle = limiter.reserve("idle", 1).await.unwrap();
    assert!(idle <= 100 * MS, "{idle:?}");
    // Back on Redis (a new, empty server, which lost the key): the debt
    // Redis had reported goes back too, with the interval the fallback
    // granted beyond it (unless it had all but passed: less than a
    // response timeout of it is not told from a reply read late).
    server.restart();
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("recovers after the restart");
    // (Read before the call: its wait counts from a moment after.)
    let most = (1100 * MS).saturating_sub(reported.elapsed());
    let wait = limiter.reserve("saturated", 1).await.unwrap();
    let least = (1100 * MS).saturating_sub(asked.elapsed() + RESPONSE_TIMEOUT);
    assert!(
        wait + MS >= least && wait <= most + MS,
        "saturated carried {wait:?} back, its debt and its interval left {least:?} to {most:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_not_called_again_carry_their_debt_back_too() {
    let mut server = RedisServer::start();
    // (Patient: the kill is seen at once, and a late answer on a loaded
    // machine must not send the limiter to its fallback once more.)
    let backend = patient_backend(server.client()).await;
    let limiter = keyed(&backend, 10.0);
    limiter.reserve("first", 1).await.unwrap();
    server.kill();
    // Twenty keys served locally, each left with ten seconds of debt (what
    // is left of it once the restart, the recovery and the carry are done,
    // seconds on a loaded machine, is still more than a second).
    for i in 0..20 {
        assert_eq!(
            limiter.reserve(&format!("user{i}"), 100).await.unwrap(),
            Duration::ZERO
        );
    }
    assert_eq!(limiter.stats().keys, 20);
    server.restart();
    within(Duration::from_secs(5), || !limiter.stats().degraded)
        .await
        .expect("recovers after the restart");
    // One call on another key: the others go back in the background.
    limiter.reserve("someone-else", 1).await.unwrap();
    within(Duration::from_secs(2), || limiter.stats().keys == 0)
        .await
        .expect("the fallback's keys are carried back");
    let mut con = server.connection();
    for i in 0..20 {
        let key = format!("user{i}");
        let wait = limiter.snapshot(&key).await.unwrap().wait();
        assert!(
            wait > 1000 * MS,
            "{key}: only {wait:?} of its local debt reached Redis"
        );
        let exists: bool = redis::cmd("EXISTS")
            .arg(limiter.redis_key(&key))
            .query(&mut con)
            .unwrap();
        assert!(exists, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_backends_and_192_tasks_never_over_grant_a_key() {
    const RATE: f64 = 20.0;
    const RUN: Duration = Duration::from_millis(1_000);
    let server = RedisServer::start();
    let mut backends = Vec::new();
    for _ in 0..3 {
        // Patient: a call that runs late on a loaded machine must not send
        // a process to its fallback, whose share of the rate is not under test.
        backends.push(patient_backend(server.client()).await);
    }
    let limiters: Vec<_> = backends.iter().map(|b| Arc::new(keyed(b, RATE))).collect();
    let granted: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    let start = Instant::now();
    let tasks: Vec<_> = (0..192usize)
        .map(|t| {
            let limiter = Arc::clone(&limiters[t % 3]);
            let granted = Arc::clone(&granted);
            tokio::spawn(async move {
                let mut i = t;
                while start.elapsed() < RUN {
                    let key = i % 8;
                    if limiter
                        .try_acquire(&format!("k{key}"), 1, Duration::ZERO)
                        .await
                        .unwrap()
                    {
                        granted[key].fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    for (key, count) in granted.iter().enumerate() {
        let count = count.load(Ordering::Relaxed);
        // At most one permit at once and RATE per second after it.
        let most = 1.0 + RATE * elapsed;
        assert!(
            count as f64 <= most + 1.0,
            "key {key}: {count} granted in {elapsed:.2} s"
        );
        assert!(
            count as f64 >= 0.5 * RATE * elapsed,
            "key {key}: only {count}"
        );
    }
}

#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serves_keys_on_every_node_through_one_backend() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::cluster_builder(cluster.client())
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    // (One every 10 s: the try right after a grant is refused however late
    // it comes on a loaded machine.)
    let limiter = keyed(&backend, 0.1);
    let mut nodes = std::collections::HashSet::new();
    for i in 0..30 {
        let key = format!("user{i}");
        assert_eq!(limiter.reserve(&key, 1).await.unwrap(), Duration::ZERO);
        assert!(!limiter.try_acquire(&key, 1, Duration::ZERO).await.unwrap());
        nodes.insert(cluster.node_for_key(&limiter.redis_key(&key)));
    }
    assert_eq!(nodes.len(), 3, "keys on every node: {nodes:?}");
    assert!(!limiter.stats().degraded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_keys_that_read_alike_never_share_a_redis_key() {
    let server = RedisServer::start();
    let backend = patient_backend(server.client()).await;
    let build = |name: &str| {
        KeyedRateLimiter::<String>::builder()
            .redis(&backend, name)
            .permits_per_second(1.0)
            .max_burst(Duration::ZERO)
            .build()
            .unwrap()
    };
    let (api, api_admin) = (build("api"), build("api:admin"));
    let single = RateLimiter::builder()
        .redis(&backend, "api:admin:x")
        .permits_per_second(1.0)
        .max_burst(Duration::ZERO)
        .build()
        .unwrap();
    // Ten seconds of debt on one of them...
    assert_eq!(api.reserve("admin:x", 10).await.unwrap(), Duration::ZERO);
    // ...and none on the others, which read alike before escaping.
    assert!(api_admin.try_acquire("x", 1, Duration::ZERO).await.unwrap());
    assert!(single.try_acquire(1, Duration::ZERO).await.unwrap());
    let keys = [
        api.redis_key("admin:x"),
        api_admin.redis_key("x"),
        single.redis_key(),
    ];
    assert_eq!(
        keys,
        [
            "paceline:v1:api:admin:x",
            "paceline:v1:api\\:admin:x",
            "paceline:v1:api\\:admin\\:x"
        ]
    );
    // A client's braces do not pick the slot.
    assert_eq!(api.redis_key("{victim}"), "paceline:v1:api:\\(victim\\)");
    let mut con = server.connection();
    for key in &keys {
        let exists: bool = redis::cmd("EXISTS").arg(key).query(&mut con).unwrap();
        assert!(exists, "{key}");
    }
}
