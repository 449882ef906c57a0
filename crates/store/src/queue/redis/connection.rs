//! One connection type over a standalone Redis and a Redis Cluster.
//!
//! Standalone uses a [`MultiplexedConnection`] (every concurrent request pipelined on one socket) that is
//! dropped on an I/O error and re-opened by the next call, so a Redis restart costs the calls in flight
//! (answered [`StoreError::Unavailable`], which the gate turns into a fail-closed 503) and nothing more. A
//! cluster uses redis-rs's [`ClusterConnection`], which follows `MOVED`/`ASK` and reconnects by itself.
//! Both get connect and response timeouts, so an unreachable Redis fails a request quickly instead of
//! hanging it.

use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, RedisError, ScriptInvocation};

use crate::queue::StoreError;

/// How long connecting, and each request, may take before it counts as "Redis unreachable".
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Opening a connection.
    pub connect: Duration,
    /// One request's answer.
    pub response: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(2),
        }
    }
}

/// A standalone or cluster connection.
pub(crate) enum Connection {
    Standalone {
        client: redis::Client,
        current: Mutex<Option<MultiplexedConnection>>,
        timeouts: Timeouts,
    },
    Cluster(ClusterConnection),
}

/// Maps a Redis failure to the store's error: a reply of the wrong shape means data this version does not
/// understand; everything else (refused, reset, timed out, cluster down, script error) means "cannot be
/// served now", so callers fail closed.
pub(crate) fn store_error(error: &RedisError) -> StoreError {
    match error.kind() {
        redis::ErrorKind::TypeError => StoreError::Corrupt(error.to_string()),
        _ => StoreError::Unavailable(format!("redis: {error}")),
    }
}

impl Connection {
    /// Connects to one standalone server.
    pub(crate) async fn standalone(url: &str, timeouts: Timeouts) -> Result<Connection, StoreError> {
        let client = redis::Client::open(url).map_err(|e| StoreError::Unavailable(format!("{url}: {e}")))?;
        let connection = Connection::Standalone {
            client,
            current: Mutex::new(None),
            timeouts,
        };
        connection.standalone_connection().await?;
        Ok(connection)
    }

    /// Connects to a cluster through any of its nodes.
    pub(crate) async fn cluster(urls: &[String], timeouts: Timeouts) -> Result<Connection, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(urls.to_vec())
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .retries(2)
            .build()
            .map_err(|e| store_error(&e))?;
        let connection = client.get_async_connection().await.map_err(|e| store_error(&e))?;
        Ok(Connection::Cluster(connection))
    }

    async fn standalone_connection(&self) -> Result<MultiplexedConnection, StoreError> {
        let Connection::Standalone {
            client,
            current,
            timeouts,
        } = self
        else {
            unreachable!("only called on standalone connections");
        };
        if let Some(connection) = current.lock().clone() {
            return Ok(connection);
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(timeouts.connect)
            .set_response_timeout(timeouts.response);
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| store_error(&e))?;
        *current.lock() = Some(connection.clone());
        Ok(connection)
    }

    fn forget_broken(&self, error: &RedisError) {
        if let Connection::Standalone { current, .. } = self {
            if error.is_io_error()
                || error.is_connection_dropped()
                || error.is_timeout()
                || error.is_unrecoverable_error()
            {
                *current.lock() = None;
            }
        }
    }

    /// Runs a script (EVALSHA, loading it on `NOSCRIPT`).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let result = match self {
            Connection::Standalone { .. } => {
                let mut connection = self.standalone_connection().await?;
                invocation.invoke_async(&mut connection).await
            }
            Connection::Cluster(connection) => invocation.invoke_async(&mut connection.clone()).await,
        };
        result.map_err(|error| {
            self.forget_broken(&error);
            store_error(&error)
        })
    }

    /// Runs one command.
    pub(crate) async fn query<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        let result = match self {
            Connection::Standalone { .. } => {
                let mut connection = self.standalone_connection().await?;
                command.query_async(&mut connection).await
            }
            Connection::Cluster(connection) => command.query_async(&mut connection.clone()).await,
        };
        result.map_err(|error| {
            self.forget_broken(&error);
            store_error(&error)
        })
    }
}
