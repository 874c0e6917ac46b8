//! A throwaway Redis Cluster of three masters (no replicas) on free loopback
//! ports, built with `redis-cli --cluster create`, torn down on drop.

use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::redis_server::{RedisServer, free_cluster_port};

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    /// One cluster at a time per test binary: two clusters (six servers,
    /// one of them often hung) on a 2-core machine starve each other's
    /// 100 ms response timeouts.
    _alone: MutexGuard<'static, ()>,
}

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them into a cluster and
    /// waits until every node reports `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        let alone = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ],
                    free_cluster_port,
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let cli = std::env::var("PACELINE_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned());
        let output = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli (installed with redis-server): {e}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster {
            nodes,
            _alone: alone,
        };
        cluster.wait_until_ok();
        cluster
    }

    fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        for node in &self.nodes {
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.connection())
                    .unwrap_or_default();
                if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster never became ok: {info}"
                );
                sleep(Duration::from_millis(50));
            }
        }
    }

    /// A cluster client seeded with every node.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>())
            .expect("a valid cluster client")
    }

    /// A cluster client seeded with every node, giving up on connecting to
    /// a node after `timeout`.
    pub fn client_with_connection_timeout(
        &self,
        timeout: Duration,
    ) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClientBuilder::new(self.nodes.iter().map(|n| n.url()))
            .connection_timeout(timeout)
            .build()
            .expect("a valid cluster client")
    }

    /// The index in [`nodes`](Self::nodes) of the primary that serves
    /// `key`'s slot, as the cluster reports it (`CLUSTER KEYSLOT`, then
    /// `CLUSTER SLOTS`, asked of the first node that answers).
    pub fn node_for_key(&self, key: &str) -> usize {
        let mut admin = self
            .nodes
            .iter()
            .find_map(|n| {
                n.client()
                    .get_connection_with_timeout(Duration::from_secs(1))
                    .ok()
            })
            .expect("a node that answers");
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut admin)
            .expect("CLUSTER KEYSLOT");
        let ranges: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut admin)
            .expect("CLUSTER SLOTS");
        let redis::Value::Array(ranges) = ranges else {
            panic!("unexpected CLUSTER SLOTS reply: {ranges:?}");
        };
        for range in ranges {
            // [start, end, [ip, port, id, ...] (the primary), replicas...]
            let redis::Value::Array(range) = range else {
                continue;
            };
            let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end))) =
                (range.first(), range.get(1))
            else {
                continue;
            };
            if !(*start..=*end).contains(&slot) {
                continue;
            }
            let Some(redis::Value::Array(primary)) = range.get(2) else {
                panic!("no primary for slot {slot}: {range:?}");
            };
            let Some(redis::Value::Int(port)) = primary.get(1) else {
                panic!("no port for slot {slot}: {primary:?}");
            };
            return self
                .nodes
                .iter()
                .position(|n| i64::from(n.port()) == *port)
                .unwrap_or_else(|| panic!("slot {slot} is on port {port}, not one of ours"));
        }
        panic!("no node serves slot {slot}");
    }
}
