//! The processes a soak runs and abuses: its own `redis-server` (so it can be paused with SIGSTOP) and
//! `rankgate serve` instances (so one can be SIGKILLed and restarted).
//!
//! Each runs under a small `sh` watchdog that prints the child's pid and then reads our stdin pipe: when
//! that pipe closes, however the test process ends (a panic, a kill), the watchdog resumes and kills the
//! child, so no stopped Redis or orphaned server outlives the test.

use std::io::{BufRead as _, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child under a watchdog.
struct Watched {
    sh: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    lines: mpsc::Receiver<String>,
}

impl Watched {
    /// Runs `program args…` under the watchdog; its stderr goes to `log` (appended).
    fn spawn(program: &Path, args: &[String], log: &Path) -> Watched {
        let script = "\"$0\" \"$@\" & pid=$!; echo \"pid $pid\"; cat >/dev/null; \
                      kill -CONT $pid 2>/dev/null; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null";
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let mut sh = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", program.display()));
        let stdin = sh.stdin.take();
        let stdout = sh.stdout.take().expect("watchdog stdout");
        let (send, lines) = mpsc::channel();
        // Drains the child's stdout for its whole life, so it can never block on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the watchdog prints the pid");
        let pid = first
            .strip_prefix("pid ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("watchdog said {first:?}"));
        Watched {
            sh,
            stdin,
            pid,
            lines,
        }
    }

    fn signal(&self, signal: &str) {
        // The shell's `kill` builtin: no procps needed.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("kill -{signal} {}", self.pid))
            .status()
            .expect("sh runs");
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    /// Stops the child (resumed first, then SIGKILL) and waits for the watchdog.
    fn stop(&mut self) {
        drop(self.stdin.take());
        let _ = self.sh.wait();
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .port()
}

/// A `redis-server` owned by one test: no persistence, its own port.
pub struct OwnRedis {
    process: Watched,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl OwnRedis {
    pub fn start() -> OwnRedis {
        let dir = tempfile::tempdir().expect("redis dir");
        // A port picked by the OS can be taken again before redis binds it: try a few.
        for _ in 0..5 {
            let port = free_port();
            let args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &dir.path().display().to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let process = Watched::spawn(Path::new("redis-server"), &args, &dir.path().join("redis.log"));
            let url = format!("redis://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                let pong = redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
                if pong.is_ok() {
                    return OwnRedis {
                        process,
                        url,
                        _dir: dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            drop(process);
        }
        panic!("redis-server never answered PING (is it installed?)");
    }

    /// SIGSTOP: Redis stops answering, connections stay open.
    pub fn pause(&self) {
        self.process.signal("STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.process.signal("CONT");
    }
}

/// One `rankgate serve` process with its own data dir, restartable on the same dir.
pub struct Instance {
    process: Option<Watched>,
    pub address: String,
    data_dir: PathBuf,
    config: PathBuf,
    redis_url: String,
    log: PathBuf,
}

impl Instance {
    pub fn start(root: &Path, index: usize, config: &Path, redis_url: &str) -> Instance {
        let data_dir = root.join(format!("instance-{index}"));
        let mut instance = Instance {
            process: None,
            address: String::new(),
            log: root.join(format!("instance-{index}.log")),
            data_dir,
            config: config.to_path_buf(),
            redis_url: redis_url.to_string(),
        };
        instance.launch();
        instance
    }

    /// Starts the process on port 0 and waits for its "listening" line.
    fn launch(&mut self) {
        let args: Vec<String> = vec![
            "serve".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--config".into(),
            self.config.display().to_string(),
            "--redis".into(),
            self.redis_url.clone(),
        ];
        let process = Watched::spawn(Path::new(env!("CARGO_BIN_EXE_rankgate")), &args, &self.log);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match process.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(address) = line.strip_prefix("rankgate listening on ") {
                        self.address = address.trim().to_string();
                        break;
                    }
                }
                Err(_) => panic!(
                    "rankgate serve never said it was listening; its log:\n{}",
                    self.log_tail()
                ),
            }
        }
        self.process = Some(process);
    }

    /// SIGKILL, like a crash: no shutdown, no flush.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal("KILL");
            process.stop();
        }
    }

    /// Starts again on the same data dir (a new port).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// The last notable lines of this instance's log, for failure messages: errors and warnings, minus
    /// the "failing closed" line every request logs while Redis is paused.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                (l.contains("ERROR") || l.contains("WARN") || l.contains("panicked"))
                    && !l.contains("failing closed")
            })
            .collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}
