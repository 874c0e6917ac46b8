//! A throwaway Redis Cluster of three masters (no replicas) on free loopback
//! ports, built with `redis-cli --cluster create`, torn down on drop.

use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::redis_server::{RedisServer, free_cluster_port};

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them into a cluster and
    /// waits until every node reports `cluster_state:ok`.
    pub fn start() -> RedisCluster {
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
        let output = Command::new("redis-cli")
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
        let cluster = RedisCluster { nodes };
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
}
