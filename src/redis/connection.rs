//! Where a limiter talks to Redis: one multiplexed connection, replaced as
//! a whole when the probe proves a fresh one works.

use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
#[cfg(feature = "redis-cluster")]
use redis::cluster::ClusterClient;
#[cfg(feature = "redis-cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "redis-cluster")]
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::error::BackendError;

/// A server or a cluster (with the `redis-cluster` feature), and how to
/// open a connection to it.
#[derive(Clone)]
pub(crate) enum Target {
    Single(redis::Client),
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<ClusterClient>),
}

impl Target {
    /// What the target is, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Target::Single(client) => format!("Redis at {}", client.get_connection_info().addr()),
            #[cfg(feature = "redis-cluster")]
            Target::Cluster(_) => "the Redis cluster".to_owned(),
        }
    }

    /// Whether the target is a cluster (whose health is kept per slot).
    pub(crate) fn is_cluster(&self) -> bool {
        match self {
            Target::Single(_) => false,
            #[cfg(feature = "redis-cluster")]
            Target::Cluster(_) => true,
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
                #[cfg(feature = "redis-cluster")]
                Target::Cluster(client) => {
                    client.get_async_connection().await.map(Connection::Cluster)
                }
            }
        };
        match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => {
                let timed_out = e.is_timeout();
                Err(
                    BackendError::new(format!("cannot connect to {}", self.describe()))
                        .with_source(e)
                        .with_timeout(timed_out),
                )
            }
            Err(_) => Err(BackendError::new(format!(
                "cannot connect to {}: no answer within {timeout:?}",
                self.describe()
            ))
            .with_timeout(true)),
        }
    }
}

/// Whether `failure` is Redis answering and refusing this client: a wrong
/// password or user, no permission for the script or its keys, a database
/// that does not exist, a bad client setting. Waiting mends none of these,
/// unlike an outage; a server still loading or a cluster still forming is
/// an outage. `connecting`: it came from opening a connection.
pub(crate) fn refuses_client(failure: &BackendError, connecting: bool) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    let Some(error) = std::error::Error::source(failure)
        .and_then(|source| source.downcast_ref::<redis::RedisError>())
    else {
        return false;
    };
    matches!(error.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
        || matches!(
            error.kind(),
            ErrorKind::AuthenticationFailed
                | ErrorKind::InvalidClientConfig
                | ErrorKind::Server(ServerErrorKind::NoPerm)
        )
        // The setup a new connection runs (its database, its protocol)
        // refused: said as a plain error (`ERR`).
        || (connecting
            && error.kind() == ErrorKind::Server(ServerErrorKind::ResponseError))
}

/// A multiplexed connection shared by every task of a limiter: cloning it is
/// cheap and clones pipeline their requests on the same socket(s).
#[derive(Clone)]
pub(crate) enum Connection {
    Single(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterConnection),
}

impl Connection {
    /// Sends `cmd` to any one node of a cluster; `None` on a single server.
    #[cfg_attr(not(feature = "redis-cluster"), allow(unused_variables))]
    pub(crate) async fn ask_any_node(&self, cmd: Cmd) -> Option<RedisResult<Value>> {
        match self {
            Connection::Single(_) => None,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => Some(
                c.clone()
                    .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                    .await,
            ),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
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
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
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
