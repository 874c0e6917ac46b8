//! Where a limiter talks to Redis: one multiplexed connection, replaced as
//! a whole when the probe proves a fresh one works.

use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};

use crate::error::BackendError;

/// A server or a cluster, and how to open a connection to it.
#[derive(Clone)]
pub(crate) enum Target {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

impl Target {
    /// What the target is, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Target::Single(client) => format!("Redis at {}", client.get_connection_info().addr()),
            Target::Cluster(_) => "the Redis cluster".to_owned(),
        }
    }

    /// Opens a new connection, within `timeout`.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<Connection, BackendError> {
        let connecting = async {
            match self {
                Target::Single(client) => {
                    // Every call is bounded by the limiter itself; a second
                    // timer per request here would only cost time.
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(None);
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .map(Connection::Single)
                }
                Target::Cluster(client) => {
                    client.get_async_connection().await.map(Connection::Cluster)
                }
            }
        };
        match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => {
                let timed_out = e.is_timeout();
                Err(BackendError::new(
                    format!("cannot connect to {}", self.describe()),
                    Some(Box::new(e)),
                )
                .with_timeout(timed_out))
            }
            Err(_) => Err(BackendError::timeout(format!(
                "cannot connect to {}: no answer within {timeout:?}",
                self.describe()
            ))),
        }
    }
}

/// A multiplexed connection shared by every task of a limiter: cloning it is
/// cheap and clones pipeline their requests on the same socket(s).
#[derive(Clone)]
pub(crate) enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection calls use now: none until one has worked, then the last
/// one the probe proved.
#[derive(Default)]
pub(crate) struct Link {
    current: RwLock<Option<Connection>>,
}

impl Link {
    /// A clone of the current connection, if there is one.
    pub(crate) fn get(&self) -> Option<Connection> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes `connection` the one calls use; the old one closes when the
    /// last call on it ends.
    pub(crate) fn replace(&self, connection: Connection) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(connection);
    }
}
