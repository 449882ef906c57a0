//! Redis for tests: the shared standalone server at [`standalone_url`], where a test writes only under a
//! [`unique_prefix`] that its [`KeyCleanup`] deletes; and private servers this test binary starts on
//! spare ports ([`LocalRedis`], the 3-node [`cluster`]), which a test may stop, fill or break at will.
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
    let script = format!(
        "redis-server --port {port} --bind 127.0.0.1 {cluster_args} --save '' --appendonly no --daemonize no \
         --dir '{dir}' >/dev/null 2>&1 & pid=$!; cat >/dev/null; kill $pid; wait $pid; rm -rf '{dir}'"
    );
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
