//! Redis Sentinel (SPEC part 4: `--redis redis+sentinel://host:port[,host:port…]/<master name>`): the
//! sentinel URL, and a connection to whichever server the sentinels name master now.
//!
//! # URL
//! `redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/<master name>[/<db>][?sentinel_username=…&sentinel_password=…]`
//! - the hosts are the **sentinels** (port 26379 when left out; `[::1]:26379` for IPv6), asked in order;
//! - the user-info is the **data nodes'** credentials (master and replicas share them, as Sentinel needs);
//! - `sentinel_username` / `sentinel_password` are the sentinels' own, when they have `requirepass`;
//! - `rediss+sentinel://` (TLS) is refused: this build's redis crate has no TLS feature.
//!
//! # Discovery, and following a failover
//! The first call, and the first after the connection was dropped, asks the sentinels in order
//! `SENTINEL get-master-addr-by-name <name>`, connects to the address the first one that answers gives,
//! and checks with `ROLE` that it is a master (Sentinel's client protocol: a sentinel may be stale, and a
//! server it names may still be a replica mid-failover). A master that fails the check sends us to the
//! next sentinel. The connection is dropped on an I/O error, a timeout, `READONLY` (we reached a master
//! that was demoted to a replica) and `LOADING` (a restarted server still reading its data), so the next
//! call discovers again: rankgate follows a failover without a restart, and the calls made while no
//! master answers fail with [`StoreError::Unavailable`] (the waiting room's fail-closed 503).
//!
//! Why not redis-rs's own `sentinel` module (0.32): it connects to sentinels and checks a master's role
//! with no connect or response timeout (a black-holed sentinel would hang discovery, and every request
//! waiting on it), asks `SENTINEL MASTERS` and needs `&mut self` (a lock held across the whole
//! discovery). What it would save us is one command and one `ROLE` check; the connection, its reuse and
//! its timeouts are the standalone path's anyway.

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion, RedisConnectionInfo, RedisError};

use crate::queue::StoreError;
use crate::redact::{redact_url, scrub_credentials};
use crate::redis_connection::{store_error, Timeouts};

/// The port of a sentinel given without one: Sentinel's default.
const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// Whether `url` is a sentinel URL (`redis+sentinel://` or `rediss+sentinel://`, any case).
pub fn is_sentinel_url(url: &str) -> bool {
    let lower = url.trim_start().to_ascii_lowercase();
    lower.starts_with("redis+sentinel://") || lower.starts_with("rediss+sentinel://")
}

/// A `--redis` value split at its commas (a Cluster's node list) joined back when it is one sentinel URL,
/// whose own sentinels are comma-separated: `redis+sentinel://a:1,b:2/m` came in as `[…a:1, b:2/m]`.
pub fn join_split_sentinel_url(urls: Vec<String>) -> Vec<String> {
    match urls.first() {
        Some(first) if is_sentinel_url(first) && urls.len() > 1 => vec![urls.join(",")],
        _ => urls,
    }
}

/// Checks the `redis` setting before anything connects: every URL free of control characters; a
/// sentinel URL well formed and alone (a Cluster's node list cannot contain one). The error names
/// `redis` and shows URLs only redacted.
pub fn check_redis_urls(urls: &[String]) -> Result<(), String> {
    for url in urls {
        if url.chars().any(char::is_control) {
            return Err(format!(
                "redis: URL {:?} contains a control character",
                redact_url(&url.replace(char::is_control, "?"))
            ));
        }
    }
    match urls {
        [url] if is_sentinel_url(url) => SentinelUrl::parse(url).map(|_| ()),
        _ => match urls.iter().find(|url| is_sentinel_url(url)) {
            Some(url) => Err(format!(
                "redis: a sentinel URL ({}) must be the only Redis URL; list several sentinels inside it: \
                 redis+sentinel://host:port,host:port/<master name>",
                redact_url(url)
            )),
            None => Ok(()),
        },
    }
}

/// A parsed sentinel URL.
#[derive(Clone)]
pub(crate) struct SentinelUrl {
    /// The sentinels, in the order they are asked.
    sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the master under.
    master: String,
    /// The data nodes' database number.
    db: i64,
    username: Option<String>,
    password: Option<String>,
    sentinel_username: Option<String>,
    sentinel_password: Option<String>,
}

impl SentinelUrl {
    /// Parses `url`; errors name `redis` and never carry a password.
    pub(crate) fn parse(url: &str) -> Result<SentinelUrl, String> {
        let shown = redact_url(url);
        let bad = |why: &str| {
            format!(
                "redis: bad sentinel URL {shown}: {why} (expected \
                 redis+sentinel://[:password@]host:port[,host:port…]/<master name>)"
            )
        };
        if url.chars().any(char::is_control) {
            return Err(bad("it contains a control character"));
        }
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        match scheme.to_ascii_lowercase().as_str() {
            "redis+sentinel" => {}
            "rediss+sentinel" => {
                return Err(format!(
                "redis: {shown}: rediss+sentinel:// (TLS) is not supported by this build (its redis client \
                     has no TLS); reach the sentinels and servers over a private network or a TLS tunnel and \
                     use redis+sentinel://"
            ))
            }
            _ => return Err(bad("the scheme must be redis+sentinel")),
        }
        if rest.contains('#') {
            return Err(bad("a fragment (#) has no meaning here"));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        // The user-info ends at the last `@` (as `redact_url` reads it): a password may hold an unencoded
        // `@` or `/`, so a master name cannot hold an `@`.
        let host_start = rest.rfind('@').map_or(0, |at| at + 1);
        let path_start = host_start + rest[host_start..].find('/').unwrap_or(rest.len() - host_start);
        let (authority, path) = rest.split_at(path_start);
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                let user = decode(user).map_err(|_| bad("the user name is not valid percent-encoding"))?;
                let password = password
                    .map(decode)
                    .transpose()
                    .map_err(|_| bad("the password is not valid percent-encoding"))?;
                (
                    Some(user).filter(|u| !u.is_empty()),
                    password.filter(|p| !p.is_empty()),
                )
            }
        };
        if hosts.is_empty() {
            return Err(bad("no sentinel host"));
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            sentinels.push(parse_host(host).map_err(|why| bad(&why))?);
        }
        let mut segments = path.trim_start_matches('/').split('/');
        let master = segments.next().unwrap_or_default();
        if master.is_empty() {
            return Err(bad("no master name after the hosts"));
        }
        let master = decode(master).map_err(|_| bad("the master name is not valid percent-encoding"))?;
        if master.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("the master name holds a space or a control character"));
        }
        let db = match segments.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| bad("the database after the master name must be a number"))?,
        };
        if segments.next().is_some() {
            return Err(bad("too many path segments: only /<master name>[/<db>]"));
        }
        let mut parsed = SentinelUrl {
            sentinels,
            master,
            db,
            username,
            password,
            sentinel_username: None,
            sentinel_password: None,
        };
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(value).map_err(|_| bad("a query value is not valid percent-encoding"))?;
            match key {
                "sentinel_username" => parsed.sentinel_username = Some(value).filter(|v| !v.is_empty()),
                "sentinel_password" => parsed.sentinel_password = Some(value).filter(|v| !v.is_empty()),
                other => {
                    return Err(bad(&format!(
                        "unknown parameter {other:?} (known: sentinel_username, sentinel_password)"
                    )))
                }
            }
        }
        Ok(parsed)
    }
}

fn decode(raw: &str) -> Result<String, std::str::Utf8Error> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn parse_host(raw: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(bracketed) = raw.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("sentinel {raw:?}: an IPv6 address needs its closing ]"))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("sentinel {raw:?}: expected :port after ]")),
            },
        }
    } else {
        match raw.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (raw, None),
        }
    };
    if host.is_empty() {
        return Err(format!("sentinel {raw:?} has no host"));
    }
    if host.chars().any(|c| c.is_whitespace() || "/@?#%".contains(c)) {
        return Err(format!("sentinel host {host:?} is not a host name or address"));
    }
    let port = match port {
        None => DEFAULT_SENTINEL_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("sentinel {host:?}: port {port:?} is not 1 to 65535"))?,
    };
    Ok((host.to_string(), port))
}

/// A connection to the master the sentinels name, found again after it is dropped.
pub(crate) struct Sentinel {
    spec: SentinelUrl,
    /// The URL as given, to scrub its credentials out of driver errors.
    url: String,
    current: Mutex<Option<MultiplexedConnection>>,
    /// One discovery at a time: the calls that find no connection wait for the one discovering instead
    /// of each asking the sentinels.
    discovering: tokio::sync::Mutex<()>,
    timeouts: Timeouts,
}

impl Sentinel {
    /// Parses `url` and connects to the master (so a start with no master reachable fails clearly).
    pub(crate) async fn connect(url: &str, timeouts: Timeouts) -> Result<Sentinel, StoreError> {
        let spec = SentinelUrl::parse(url).map_err(StoreError::Unavailable)?;
        let sentinel = Sentinel {
            spec,
            url: url.to_string(),
            current: Mutex::new(None),
            discovering: tokio::sync::Mutex::new(()),
            timeouts,
        };
        sentinel.connection().await?;
        Ok(sentinel)
    }

    /// The current master connection, discovering the master first when there is none.
    pub(crate) async fn connection(&self) -> Result<MultiplexedConnection, StoreError> {
        if let Some(connection) = self.current.lock().clone() {
            return Ok(connection);
        }
        let _discovering = self.discovering.lock().await;
        if let Some(connection) = self.current.lock().clone() {
            return Ok(connection);
        }
        let connection = self.discover().await.map_err(|message| {
            StoreError::Unavailable(scrub_credentials(
                &format!("redis sentinel {}: {message}", redact_url(&self.url)),
                &self.url,
            ))
        })?;
        *self.current.lock() = Some(connection.clone());
        Ok(connection)
    }

    /// Drops the connection after an error that says the server is gone or no longer the master.
    pub(crate) fn forget_if_stale(&self, error: &RedisError) {
        if is_stale(error) {
            *self.current.lock() = None;
        }
    }

    fn config(&self) -> redis::AsyncConnectionConfig {
        redis::AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeouts.connect)
            .set_response_timeout(self.timeouts.response)
    }

    /// Asks each sentinel in turn; the first whose master answers `ROLE` as master wins. The error lists
    /// what each sentinel said.
    async fn discover(&self) -> Result<MultiplexedConnection, String> {
        let mut failures = Vec::new();
        let mut tried = Vec::new();
        for (host, port) in &self.spec.sentinels {
            let master = match self.ask(host, *port).await {
                Ok(Some(master)) => master,
                Ok(None) => {
                    failures.push(format!(
                        "{host}:{port} knows no master named {:?}",
                        self.spec.master
                    ));
                    continue;
                }
                Err(error) => {
                    failures.push(format!("{host}:{port}: {error}"));
                    continue;
                }
            };
            if tried.contains(&master) {
                continue;
            }
            tried.push(master.clone());
            match self.open_master(&master).await {
                Ok(connection) => return Ok(connection),
                Err(error) => failures.push(format!(
                    "{host}:{port} names {}:{} master: {error}",
                    master.0, master.1
                )),
            }
        }
        Err(format!("no master found ({})", failures.join("; ")))
    }

    /// `SENTINEL get-master-addr-by-name` on one sentinel: `None` when it does not monitor the name.
    async fn ask(&self, host: &str, port: u16) -> Result<Option<(String, u16)>, RedisError> {
        let info = ConnectionInfo {
            addr: ConnectionAddr::Tcp(host.to_string(), port),
            redis: RedisConnectionInfo {
                db: 0,
                username: self.spec.sentinel_username.clone(),
                password: self.spec.sentinel_password.clone(),
                protocol: ProtocolVersion::RESP2,
            },
        };
        let mut connection = redis::Client::open(info)?
            .get_multiplexed_async_connection_with_config(&self.config())
            .await?;
        let answer: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.spec.master)
            .query_async(&mut connection)
            .await?;
        Ok(answer)
    }

    /// Connects to `master` with the data nodes' credentials and checks it says it is the master.
    async fn open_master(&self, master: &(String, u16)) -> Result<MultiplexedConnection, String> {
        let info = ConnectionInfo {
            addr: ConnectionAddr::Tcp(master.0.clone(), master.1),
            redis: RedisConnectionInfo {
                db: self.spec.db,
                username: self.spec.username.clone(),
                password: self.spec.password.clone(),
                protocol: ProtocolVersion::RESP2,
            },
        };
        let open = async {
            let mut connection = redis::Client::open(info)?
                .get_multiplexed_async_connection_with_config(&self.config())
                .await?;
            let role: redis::Value = redis::cmd("ROLE").query_async(&mut connection).await?;
            Ok::<_, RedisError>((connection, role))
        };
        let (connection, role) = open.await.map_err(|error| match store_error(&error) {
            StoreError::Unavailable(message) | StoreError::Corrupt(message) => message,
            other => other.to_string(),
        })?;
        match role_name(&role).as_deref() {
            Some("master") => Ok(connection),
            Some(other) => Err(format!(
                "it answers ROLE {other}, not master (a failover in progress?)"
            )),
            None => Err(format!("unexpected ROLE reply {role:?}")),
        }
    }
}

/// The first element of a `ROLE` reply: `master`, `slave` or `sentinel`.
fn role_name(role: &redis::Value) -> Option<String> {
    match role {
        redis::Value::Array(items) => items
            .first()
            .and_then(|first| redis::from_redis_value::<String>(first).ok()),
        _ => None,
    }
}

/// Whether `error` means the connection no longer reaches a usable master: gone (I/O, dropped, timed
/// out), demoted (`READONLY`), or still loading its data (`LOADING`). A script's error may carry the
/// server's code only in its text, so the text is looked at too.
pub(crate) fn is_stale(error: &RedisError) -> bool {
    let text = error.to_string();
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_timeout()
        || error.is_unrecoverable_error()
        || matches!(
            error.kind(),
            redis::ErrorKind::ReadOnly | redis::ErrorKind::BusyLoadingError
        )
        || text.contains("READONLY")
        || text.contains("LOADING")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_parse_with_defaults_credentials_and_ipv6() {
        let url = SentinelUrl::parse(
            "redis+sentinel://app:p%40ss:w@10.0.0.1:26380,[::1],s3/mymaster/2?sentinel_password=x%26y",
        )
        .unwrap();
        assert_eq!(
            url.sentinels,
            vec![
                ("10.0.0.1".to_string(), 26380),
                ("::1".to_string(), 26379),
                ("s3".to_string(), 26379)
            ]
        );
        assert_eq!(url.master, "mymaster");
        assert_eq!(url.db, 2);
        assert_eq!(url.username.as_deref(), Some("app"));
        assert_eq!(url.password.as_deref(), Some("p@ss:w"));
        assert_eq!(url.sentinel_password.as_deref(), Some("x&y"));
        let plain = SentinelUrl::parse("REDIS+SENTINEL://h:1/m").unwrap();
        assert_eq!((plain.db, plain.password, plain.username), (0, None, None));
        // An unencoded `@` in the password: the user-info ends at the last `@`.
        let at = SentinelUrl::parse("redis+sentinel://:a@b@h:1/m").unwrap();
        assert_eq!(at.password.as_deref(), Some("a@b"));
    }

    #[test]
    fn bad_sentinel_urls_are_refused_naming_redis_and_never_the_password() {
        let cases = [
            ("redis+sentinel://:hunter22@/mymaster", "no sentinel host"),
            ("redis+sentinel://:hunter22@h:99999/mymaster", "port"),
            ("redis+sentinel://:hunter22@h:0/mymaster", "port"),
            ("redis+sentinel://:hunter22@h:x/mymaster", "port"),
            ("redis+sentinel://:hunter22@h:1", "no master name"),
            ("redis+sentinel://:hunter22@h:1/", "no master name"),
            ("redis+sentinel://:hunter22@h:1,/m", "no host"),
            ("redis+sentinel://:hunter22@h:1/m/x", "database"),
            ("redis+sentinel://:hunter22@h:1/m/0/x", "too many"),
            ("redis+sentinel://:hunter22@h:1/m?foo=1", "unknown parameter"),
            ("redis+sentinel://:hunter22@h:1/m\n", "control character"),
            ("redis+sentinel://:hunter22@h:1/my%20master", "space"),
            ("rediss+sentinel://:hunter22@h:1/m", "TLS"),
        ];
        for (url, why) in cases {
            let error = SentinelUrl::parse(url)
                .err()
                .unwrap_or_else(|| panic!("{url:?} parsed"));
            assert!(error.starts_with("redis"), "{error}");
            assert!(error.contains(why), "{url:?}: {error}");
            assert!(!error.contains("hunter22"), "{error}");
        }
    }

    #[test]
    fn the_redis_setting_is_checked_as_a_whole() {
        let ok = |urls: &[&str]| check_redis_urls(&urls.iter().map(|u| u.to_string()).collect::<Vec<_>>());
        assert!(ok(&["redis://h:1"]).is_ok());
        assert!(ok(&["redis://h:1", "redis://h:2"]).is_ok());
        assert!(ok(&["redis+sentinel://h:1,h:2/m"]).is_ok());
        let split = vec!["redis+sentinel://h:1".to_string(), "h:2/m".to_string()];
        assert_eq!(
            join_split_sentinel_url(split),
            vec!["redis+sentinel://h:1,h:2/m".to_string()]
        );
        let mixed = ok(&["redis://:hunter22@h:1", "redis+sentinel://:hunter22@h:2/m"]).unwrap_err();
        assert!(
            mixed.contains("only Redis URL") && !mixed.contains("hunter22"),
            "{mixed}"
        );
        let control = ok(&["redis://:hunter22@h:1/\u{7}"]).unwrap_err();
        assert!(
            control.contains("control character") && !control.contains("hunter22"),
            "{control}"
        );
    }
}
