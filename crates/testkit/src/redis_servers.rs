//! Redis for tests: the shared standalone server at [`standalone_url`], where a test writes only under a
//! [`unique_prefix`] that its [`KeyCleanup`] deletes; and private servers this test binary starts on
//! spare ports ([`LocalRedis`], the 3-node [`cluster`], a Sentinel-monitored master and replica
//! [`SentinelRedis`]), which a test may stop, fill, break or fail over at will.
//!
//! Statics are never dropped, so each private `redis-server` runs under a small `sh` watchdog that reads
//! our stdin pipe and kills the server (and deletes its directory) when that pipe closes, which happens
//! however the test process ends.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The shared standalone Redis: `RANKGATE_TEST_REDIS` (scripts/test.sh sets it when it starts a private
/// server), else the machine's at 127.0.0.1:6379.
pub fn standalone_url() -> String {
    std::env::var("RANKGATE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

static NEXT_PREFIX: AtomicUsize = AtomicUsize::new(0);

/// A key prefix no other test (of this process or another) uses: `rgtest:<pid>:<n>:`.
pub fn unique_prefix() -> String {
    format!(
        "rgtest:{}:{}:",
        std::process::id(),
        NEXT_PREFIX.fetch_add(1, Ordering::SeqCst)
    )
}

/// Deletes every key under a prefix on every node when dropped, so when the test ends, passed or failed.
pub struct KeyCleanup {
    /// Every node that may hold keys under `prefix` (one URL for a standalone server).
    pub nodes: Vec<String>,
    /// The test's own prefix.
    pub prefix: String,
}

impl KeyCleanup {
    /// Cleanup of `prefix` on the shared standalone server.
    pub fn standalone(prefix: impl Into<String>) -> KeyCleanup {
        KeyCleanup {
            nodes: vec![standalone_url()],
            prefix: prefix.into(),
        }
    }
}

impl Drop for KeyCleanup {
    fn drop(&mut self) {
        for node in &self.nodes {
            let node = master_of_sentinel_url(node).unwrap_or_else(|| node.clone());
            let Ok(mut connection) = redis::Client::open(node.as_str()).and_then(|c| c.get_connection())
            else {
                continue;
            };
            let mut cursor: u64 = 0;
            while let Ok((next, keys)) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}*", self.prefix))
                .arg("COUNT")
                .arg(1000)
                .query::<(u64, Vec<String>)>(&mut connection)
            {
                for key in keys {
                    // One key per command: in a cluster a multi-key DEL must stay within one slot.
                    let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&key).query(&mut connection);
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }
}

/// `redis://[user-info@]host:port` of the master a `redis+sentinel://[user-info@]h:p,…/<name>` URL's first
/// answering sentinel names; `None` for any other URL (or when no sentinel answers).
fn master_of_sentinel_url(url: &str) -> Option<String> {
    let rest = url.strip_prefix("redis+sentinel://")?;
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (format!("{userinfo}@"), rest),
        None => (String::new(), rest),
    };
    let (hosts, name) = rest.split_once('/')?;
    let name = name.split('/').next()?;
    hosts.split(',').find_map(|host| {
        let mut connection = redis::Client::open(format!("redis://{host}"))
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        let (ip, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .query(&mut connection)
            .ok()?;
        Some(format!("redis://{userinfo}{ip}:{port}"))
    })
}

/// `redis-server` processes started by this test binary.
pub struct LocalRedis {
    /// Our end of each watchdog's stdin; closing it stops that server.
    watchdogs: Vec<(Child, std::process::ChildStdin)>,
    /// `redis://127.0.0.1:<port>` of each server, in start order.
    pub urls: Vec<String>,
}

impl LocalRedis {
    /// Starts `count` servers on spare ports, in cluster mode or not, and waits until each answers PING.
    pub fn start(count: usize, cluster: bool) -> LocalRedis {
        let ports = spare_ports(count);
        let mut watchdogs = Vec::new();
        for port in &ports {
            let dir = std::env::temp_dir().join(format!("rankgate-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("redis dir");
            watchdogs.push(spawn_watched_server(*port, &dir, cluster));
        }
        let urls: Vec<String> = ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect();
        for url in &urls {
            wait_until(Duration::from_secs(20), url, || {
                let mut connection = redis::Client::open(url.as_str()).ok()?.get_connection().ok()?;
                redis::cmd("PING").query::<String>(&mut connection).ok()
            });
        }
        LocalRedis { watchdogs, urls }
    }

    /// Stops every server and waits for them to exit.
    pub fn stop(self) {
        for (mut child, stdin) in self.watchdogs {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// One `redis-server` of a test's own that can be stopped and started again empty on the same port: what
/// a Redis restarted without persistence, or failed over to an empty replica, looks like to its clients
/// (issue 29, places that survive the store). Stopped when dropped.
pub struct RestartableRedis {
    /// Its port, the same across restarts.
    pub port: u16,
    watchdog: Option<(Child, std::process::ChildStdin)>,
    restarts: u32,
}

impl RestartableRedis {
    /// Starts it on a spare port and waits until it answers PING.
    pub fn start() -> RestartableRedis {
        let mut redis = RestartableRedis {
            port: spare_ports(1)[0],
            watchdog: None,
            restarts: 0,
        };
        redis.up();
        redis
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts it (empty) and waits until it answers PING.
    pub fn up(&mut self) {
        let dir = std::env::temp_dir().join(format!(
            "rankgate-restartable-{}-{}-{}",
            std::process::id(),
            self.port,
            self.restarts
        ));
        std::fs::create_dir_all(&dir).expect("redis dir");
        self.watchdog = Some(spawn_watched_server(self.port, &dir, false));
        let url = self.url();
        wait_until(Duration::from_secs(20), "the restartable redis", || {
            let mut connection = redis::Client::open(url.as_str()).ok()?.get_connection().ok()?;
            redis::cmd("PING").query::<String>(&mut connection).ok()
        });
    }

    /// Stops it and waits until it has exited: everything it held is gone.
    pub fn down(&mut self) {
        if let Some((mut child, stdin)) = self.watchdog.take() {
            drop(stdin);
            let _ = child.wait();
        }
        self.restarts += 1;
    }
}

impl Drop for RestartableRedis {
    fn drop(&mut self) {
        self.down();
    }
}

/// Starts one `redis-server` on `port` (no persistence, files in `dir`) under a watchdog `sh`; dropping
/// the returned stdin stops the server and deletes `dir`.
pub fn spawn_watched_server(
    port: u16,
    dir: &std::path::Path,
    cluster: bool,
) -> (Child, std::process::ChildStdin) {
    let dir = dir.display().to_string();
    let cluster_args = if cluster {
        format!("--cluster-enabled yes --cluster-config-file '{dir}/nodes-{port}.conf' --cluster-node-timeout 5000")
    } else {
        String::new()
    };
    spawn_watched(
        &format!(
            "redis-server --port {port} --bind 127.0.0.1 {cluster_args} --save '' --appendonly no --daemonize no \
             --dir '{dir}'"
        ),
        &dir,
    )
}

/// Runs the shell command `server` (a `redis-server` in the foreground) under a watchdog `sh`; dropping
/// the returned stdin stops it and deletes `dir`.
fn spawn_watched(server: &str, dir: &str) -> (Child, std::process::ChildStdin) {
    let script =
        format!("{server} >/dev/null 2>&1 & pid=$!; cat >/dev/null; kill $pid; wait $pid; rm -rf '{dir}'");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning sh for redis-server");
    let stdin = child.stdin.take().expect("watchdog stdin");
    (child, stdin)
}

/// Spare ports whose cluster bus port (+10000) is free too. One allocator for the whole binary, moving
/// only forwards, so two servers started by concurrent tests can never be given the same port; the start
/// depends on the pid so concurrent test binaries (other engineers, CI shards) rarely meet either.
pub fn spare_ports(count: usize) -> Vec<u16> {
    static NEXT_PORT: std::sync::Mutex<u16> = std::sync::Mutex::new(0);
    let mut next = NEXT_PORT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if *next == 0 {
        *next = 30_000 + (std::process::id() % 250) as u16 * 40;
    }
    let mut ports = Vec::new();
    while ports.len() < count {
        let port = *next;
        *next += 1;
        assert!(port < 55_000, "no spare ports for redis");
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            ports.push(port);
        }
    }
    ports
}

/// Calls `probe` every 50 ms until it returns a value; panics naming `what` after `limit`.
pub fn wait_until<T>(limit: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The Sentinel topology ([`SentinelRedis`], with a password) shared by the sentinel tests of this binary
/// that do not fail it over, started by the first caller.
pub fn sentinel() -> &'static SentinelRedis {
    static SENTINEL: OnceLock<SentinelRedis> = OnceLock::new();
    SENTINEL.get_or_init(|| SentinelRedis::start(Some("sentinel-suite-pw")))
}

/// The 3-node cluster shared by every cluster test of this binary, started by the first caller.
pub fn cluster() -> &'static LocalRedis {
    static CLUSTER: OnceLock<LocalRedis> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let nodes = LocalRedis::start(3, true);
        let addresses: Vec<String> = nodes
            .urls
            .iter()
            .map(|u| u.trim_start_matches("redis://").to_string())
            .collect();
        // `redis-cli --cluster create` waits forever for nodes that never join: give it a deadline.
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("running redis-cli --cluster create");
        let status = wait_until(Duration::from_secs(60), "redis-cli --cluster create", || {
            create.try_wait().expect("redis-cli status")
        });
        assert!(status.success(), "redis-cli --cluster create failed: {status}");
        for url in &nodes.urls {
            wait_until(Duration::from_secs(30), "cluster_state:ok", || {
                let mut connection = redis::Client::open(url.as_str()).ok()?.get_connection().ok()?;
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut connection).ok()?;
                info.contains("cluster_state:ok").then_some(())
            });
        }
        nodes
    })
}

/// A master, one replica (`replicaof`) and three `redis-server --sentinel` processes monitoring them as
/// `mymaster` (quorum 2, down after 1 s, failover timeout 3 s), on spare ports: what a shop runs for Redis
/// HA, small. Everything stops when this is dropped (or the test process ends).
pub struct SentinelRedis {
    /// The master name the sentinels monitor.
    pub master_name: String,
    /// The data nodes' password (`requirepass`, `masterauth`, `sentinel auth-pass`), if any.
    pub password: Option<String>,
    /// Ports of the two data nodes: the first started as master, the second as its replica.
    pub data_ports: Vec<u16>,
    /// Ports of the three sentinels.
    pub sentinel_ports: Vec<u16>,
    watchdogs: Vec<(Child, std::process::ChildStdin)>,
}

impl SentinelRedis {
    /// Starts the five servers and waits until every sentinel knows the replica and the other two
    /// sentinels (before that a failover could not be agreed), and the replica is in sync.
    pub fn start(password: Option<&str>) -> SentinelRedis {
        let ports = spare_ports(5);
        let (data_ports, sentinel_ports) = (ports[..2].to_vec(), ports[2..].to_vec());
        let master_name = "mymaster".to_string();
        let auth = password
            .map(|p| format!("--requirepass '{p}' --masterauth '{p}'"))
            .unwrap_or_default();
        let mut watchdogs = Vec::new();
        for (i, port) in data_ports.iter().enumerate() {
            let dir =
                std::env::temp_dir().join(format!("rankgate-sentinel-data-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("redis dir");
            let dir = dir.display().to_string();
            let replica = if i == 0 {
                String::new()
            } else {
                format!("--replicaof 127.0.0.1 {}", data_ports[0])
            };
            // `replica-announce-ip` keeps every address 127.0.0.1, which the tests can reach.
            watchdogs.push(spawn_watched(
                &format!(
                    "redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
                     --dir '{dir}' --replica-announce-ip 127.0.0.1 {auth} {replica}"
                ),
                &dir,
            ));
        }
        for port in &sentinel_ports {
            let dir = std::env::temp_dir().join(format!("rankgate-sentinel-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("sentinel dir");
            // A sentinel rewrites its config file (it records what it learns), so each has its own.
            let config = dir.join("sentinel.conf");
            let auth_pass = password
                .map(|p| format!("sentinel auth-pass {master_name} {p}\n"))
                .unwrap_or_default();
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\nsentinel announce-ip 127.0.0.1\n\
                     sentinel monitor {master_name} 127.0.0.1 {master} 2\n{auth_pass}\
                     sentinel down-after-milliseconds {master_name} 1000\n\
                     sentinel failover-timeout {master_name} 3000\n\
                     sentinel parallel-syncs {master_name} 1\n",
                    dir = dir.display(),
                    master = data_ports[0],
                ),
            )
            .expect("sentinel config");
            let dir = dir.display().to_string();
            watchdogs.push(spawn_watched(
                &format!("redis-server '{}' --sentinel", config.display()),
                &dir,
            ));
        }
        let sentinel = SentinelRedis {
            master_name,
            password: password.map(str::to_string),
            data_ports,
            sentinel_ports,
            watchdogs,
        };
        for port in sentinel.sentinel_ports.clone() {
            wait_until(
                Duration::from_secs(60),
                "sentinels that know each other and the replica",
                || {
                    let fields = sentinel.sentinel_master_fields(port)?;
                    let field = |name: &str| {
                        fields
                            .iter()
                            .position(|f| f == name)
                            .and_then(|i| fields.get(i + 1))
                    };
                    (field("num-slaves").map(String::as_str) == Some("1")
                        && field("num-other-sentinels").map(String::as_str) == Some("2"))
                    .then_some(())
                },
            );
        }
        let master = sentinel.data_url(sentinel.data_ports[0]);
        wait_until(Duration::from_secs(30), "the replica in sync", || {
            let mut connection = redis::Client::open(master.as_str()).ok()?.get_connection().ok()?;
            let synced: i64 = redis::cmd("WAIT").arg(1).arg(1000).query(&mut connection).ok()?;
            (synced >= 1).then_some(())
        });
        sentinel
    }

    /// `redis+sentinel://[:password@]127.0.0.1:<s1>,…/mymaster`: what `--redis` is given.
    pub fn url(&self) -> String {
        let auth = self
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        let hosts: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{auth}{}/{}", hosts.join(","), self.master_name)
    }

    /// `redis://[:password@]127.0.0.1:<port>` of one data node (for key cleanup and direct checks).
    pub fn data_url(&self, port: u16) -> String {
        let auth = self
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        format!("redis://{auth}127.0.0.1:{port}")
    }

    /// Both data nodes' URLs.
    pub fn data_urls(&self) -> Vec<String> {
        self.data_ports.iter().map(|port| self.data_url(*port)).collect()
    }

    /// The master's port as the first sentinel that answers names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinel_ports.iter().find_map(|port| {
            let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .ok()?
                .get_connection_with_timeout(Duration::from_secs(2))
                .ok()?;
            let (_, master): (String, u16) = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name)
                .query(&mut connection)
                .ok()?;
            Some(master)
        })
    }

    /// Waits until the master has every write it acknowledged on its replica (`WAIT 1`), so a failover
    /// that follows loses nothing a test counted on.
    pub fn wait_replicated(&self) {
        let master = self.data_url(self.master_port().expect("a master"));
        wait_until(Duration::from_secs(30), "the replica to catch up", || {
            let mut connection = redis::Client::open(master.as_str()).ok()?.get_connection().ok()?;
            let synced: i64 = redis::cmd("WAIT").arg(1).arg(1000).query(&mut connection).ok()?;
            (synced >= 1).then_some(())
        });
    }

    /// Kills the master's process with SIGKILL (no goodbye to anyone) and answers its port.
    pub fn kill_master(&self) -> u16 {
        let port = self.master_port().expect("a master");
        let mut connection = redis::Client::open(self.data_url(port))
            .and_then(|c| c.get_connection())
            .expect("connecting to the master");
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut connection)
            .expect("INFO");
        let pid = info
            .lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .expect("process_id in INFO")
            .trim()
            .to_string();
        let status = Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -KILL {pid}: {status}");
        port
    }

    /// Waits (up to `limit`) until the sentinels name a master other than `old` that answers `ROLE` as
    /// master, and answers its port.
    pub fn wait_for_new_master(&self, old: u16, limit: Duration) -> u16 {
        wait_until(limit, "the sentinels to promote the replica", || {
            let port = self.master_port().filter(|port| *port != old)?;
            let mut connection = redis::Client::open(self.data_url(port))
                .ok()?
                .get_connection()
                .ok()?;
            let role: redis::Value = redis::cmd("ROLE").query(&mut connection).ok()?;
            let redis::Value::Array(items) = role else {
                return None;
            };
            let first: String = redis::from_redis_value(items.first()?).ok()?;
            (first == "master").then_some(port)
        })
    }

    /// `SENTINEL master <name>` of one sentinel, as its flat list of field names and values.
    fn sentinel_master_fields(&self, port: u16) -> Option<Vec<String>> {
        let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        redis::cmd("SENTINEL")
            .arg("master")
            .arg(&self.master_name)
            .query(&mut connection)
            .ok()
    }
}

impl Drop for SentinelRedis {
    fn drop(&mut self) {
        for (mut child, stdin) in self.watchdogs.drain(..) {
            drop(stdin);
            let _ = child.wait();
        }
    }
}
