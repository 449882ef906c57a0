//! One connection type over a standalone Redis, the master a Redis Sentinel names, and a Redis Cluster.
//!
//! Standalone uses a [`MultiplexedConnection`] (every concurrent request pipelined on one socket) that is
//! dropped on an I/O error and re-opened by the next call, so a Redis restart costs the calls in flight
//! (answered [`StoreError::Unavailable`], which the gate turns into a fail-closed 503) and nothing more. A
//! cluster uses redis-rs's [`ClusterConnection`], which follows `MOVED`/`ASK` and reconnects by itself.
//! Sentinel (`redis+sentinel://…`, [`crate::redis_sentinel`]) is the standalone path with the address
//! asked of the sentinels on every reconnect, and reconnects on `READONLY`/`LOADING` too.
//! Both get connect and response timeouts, so an unreachable Redis fails a request quickly instead of
//! hanging it.

use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, RedisError, ScriptInvocation};

use crate::queue::StoreError;
use crate::redact::{redact_url, scrub_credentials};
use crate::redis_sentinel::{is_sentinel_url, Sentinel};

/// `error` with the credentials of every URL in `urls` removed from its message.
fn scrubbed(error: StoreError, urls: &[String]) -> StoreError {
    let scrub = |message: String| urls.iter().fold(message, |m, url| scrub_credentials(&m, url));
    match error {
        StoreError::Unavailable(message) => StoreError::Unavailable(scrub(message)),
        StoreError::Corrupt(message) => StoreError::Corrupt(scrub(message)),
        other @ StoreError::TooManyQueues { .. } => other,
    }
}

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

/// A standalone, sentinel or cluster connection.
pub(crate) enum Connection {
    Standalone {
        client: redis::Client,
        current: Mutex<Option<MultiplexedConnection>>,
        timeouts: Timeouts,
    },
    /// The master the sentinels name; like standalone to every caller (one server, all keys).
    Sentinel(Sentinel),
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
    /// Connects. One URL: a standalone server, unless that server says it runs in cluster mode (then it is
    /// used as the cluster's seed); a `redis+sentinel://` URL: the master its sentinels name. Several
    /// URLs: the nodes of a cluster. The flag says "cluster".
    pub(crate) async fn open(urls: &[String], timeouts: Timeouts) -> Result<(Connection, bool), StoreError> {
        crate::redis_sentinel::check_redis_urls(urls).map_err(StoreError::Unavailable)?;
        match urls {
            [] => Err(StoreError::Unavailable("no redis URL given".into())),
            [url] if is_sentinel_url(url) => Ok((
                Connection::Sentinel(Sentinel::connect(url, timeouts).await?),
                false,
            )),
            [url] => {
                let standalone = Connection::standalone(url, timeouts).await?;
                let info: String = standalone.query(redis::cmd("INFO").arg("cluster")).await?;
                if info.contains("cluster_enabled:1") {
                    Ok((Connection::cluster(urls, timeouts).await?, true))
                } else {
                    Ok((standalone, false))
                }
            }
            _ => Ok((Connection::cluster(urls, timeouts).await?, true)),
        }
    }

    /// Connects to one standalone server.
    pub(crate) async fn standalone(url: &str, timeouts: Timeouts) -> Result<Connection, StoreError> {
        let unavailable = |message: String| StoreError::Unavailable(scrub_credentials(&message, url));
        let client =
            redis::Client::open(url).map_err(|e| unavailable(format!("{}: {e}", redact_url(url))))?;
        let connection = Connection::Standalone {
            client,
            current: Mutex::new(None),
            timeouts,
        };
        connection
            .standalone_connection()
            .await
            .map_err(|error| match error {
                StoreError::Unavailable(message) => unavailable(format!("{}: {message}", redact_url(url))),
                other => other,
            })?;
        Ok(connection)
    }

    /// Connects to a cluster through any of its nodes.
    pub(crate) async fn cluster(urls: &[String], timeouts: Timeouts) -> Result<Connection, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(urls.to_vec())
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .retries(2)
            .build()
            .map_err(|e| scrubbed(store_error(&e), urls))?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(|e| scrubbed(store_error(&e), urls))?;
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
        if let Connection::Sentinel(sentinel) = self {
            sentinel.forget_if_stale(error);
        }
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
            Connection::Sentinel(sentinel) => {
                let mut connection = sentinel.connection().await?;
                invocation.invoke_async(&mut connection).await
            }
            Connection::Cluster(connection) => invocation.invoke_async(&mut connection.clone()).await,
        };
        result.map_err(|error| {
            self.forget_broken(&error);
            store_error(&error)
        })
    }

    /// Runs a pipeline (all of its keys in one slot on a cluster).
    pub(crate) async fn pipeline<T: FromRedisValue>(
        &self,
        pipeline: &redis::Pipeline,
    ) -> Result<T, StoreError> {
        let result = match self {
            Connection::Standalone { .. } => {
                let mut connection = self.standalone_connection().await?;
                pipeline.query_async(&mut connection).await
            }
            Connection::Sentinel(sentinel) => {
                let mut connection = sentinel.connection().await?;
                pipeline.query_async(&mut connection).await
            }
            Connection::Cluster(connection) => pipeline.query_async(&mut connection.clone()).await,
        };
        result.map_err(|error| {
            self.forget_broken(&error);
            store_error(&error)
        })
    }

    /// Deletes every key matching `pattern` (tests and teardown). Standalone only: on a cluster the keys
    /// are spread over nodes that one `SCAN` does not visit, so it answers an error there.
    pub(crate) async fn purge_matching(&self, pattern: &str) -> Result<u64, StoreError> {
        if matches!(self, Connection::Cluster(_)) {
            return Err(StoreError::Unavailable(
                "deleting keys by pattern is not supported on a cluster".into(),
            ));
        }
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .query(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            if !keys.is_empty() {
                deleted += self.query::<u64>(redis::cmd("DEL").arg(keys)).await?;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    /// Runs one command.
    pub(crate) async fn query<T: FromRedisValue>(&self, command: &Cmd) -> Result<T, StoreError> {
        let result = match self {
            Connection::Standalone { .. } => {
                let mut connection = self.standalone_connection().await?;
                command.query_async(&mut connection).await
            }
            Connection::Sentinel(sentinel) => {
                let mut connection = sentinel.connection().await?;
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

/// Percent-encodes `%`, `{` and `}` in free text that becomes part of a key: a brace would move the hash
/// tag and put the key in another slot.
pub(crate) fn escape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    escape_into(&mut out, raw);
    out
}

/// [`escape`], appended to `out` (a key built in one buffer, as the hot poll path does).
pub(crate) fn escape_into(out: &mut String, raw: &str) {
    for c in raw.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            other => out.push(other),
        }
    }
}

/// Reads a script's array reply field by field.
pub(crate) struct Reply(std::vec::IntoIter<redis::Value>);

impl Reply {
    pub(crate) fn new(value: redis::Value) -> Result<Reply, StoreError> {
        match value {
            redis::Value::Array(items) => Ok(Reply(items.into_iter())),
            redis::Value::Nil => Ok(Reply(Vec::new().into_iter())),
            other => Err(StoreError::Corrupt(format!(
                "expected an array reply, got {other:?}"
            ))),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    fn next(&mut self) -> Result<redis::Value, StoreError> {
        self.0
            .next()
            .ok_or_else(|| StoreError::Corrupt("script reply is too short".into()))
    }

    pub(crate) fn int(&mut self) -> Result<i64, StoreError> {
        let value = self.next()?;
        redis::from_redis_value::<i64>(&value).map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.next()? {
            redis::Value::Nil => Ok(Vec::new()),
            value => {
                redis::from_redis_value::<Vec<u8>>(&value).map_err(|e| StoreError::Corrupt(e.to_string()))
            }
        }
    }

    pub(crate) fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?).map_err(|e| StoreError::Corrupt(e.to_string()))
    }

    /// A float stored as text; empty means absent.
    pub(crate) fn opt_f64(&mut self) -> Result<Option<f64>, StoreError> {
        let raw = self.string()?;
        if raw.is_empty() {
            return Ok(None);
        }
        raw.parse()
            .map(Some)
            .map_err(|_| StoreError::Corrupt(format!("not a number: {raw:?}")))
    }

    pub(crate) fn array(&mut self) -> Result<Reply, StoreError> {
        Reply::new(self.next()?)
    }
}
