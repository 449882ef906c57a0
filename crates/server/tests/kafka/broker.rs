//! A Kafka-protocol broker for tests: tansu 0.6.0 (`scripts/install-tansu.sh`) on a spare port with
//! in-memory storage, one per test that asks, stopped however the test process ends.
//!
//! Like the Redis servers the other test binaries start, the broker runs under a small `sh` watchdog
//! that reads our stdin pipe and kills the broker when that pipe closes.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

/// One running broker.
pub struct Broker {
    /// `127.0.0.1:PORT`, what `--kafka` takes.
    pub address: String,
    watchdog: Option<(Child, std::process::ChildStdin)>,
}

impl Broker {
    /// Starts a broker on a spare port and waits until it accepts connections and answers metadata.
    pub fn start() -> Broker {
        let port = spare_port();
        let address = format!("127.0.0.1:{port}");
        let tansu = std::env::var("TANSU").unwrap_or_else(|_| "tansu".to_owned());
        let script = format!(
            "'{tansu}' broker --listener-url tcp://{address} --advertised-listener-url tcp://{address} \
             --storage-engine memory://tansu/ >/dev/null 2>&1 & pid=$!; cat >/dev/null; kill $pid; wait $pid"
        );
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning sh for tansu (scripts/install-tansu.sh installs it)");
        let stdin = child.stdin.take().expect("watchdog stdin");
        let broker = Broker {
            address,
            watchdog: Some((child, stdin)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&broker.address).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {} within 30 s; is it installed (scripts/install-tansu.sh)?",
                broker.address
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        broker
    }

    /// Client settings pointing at this broker.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.address);
        config
    }

    /// Creates a topic with `partitions` partitions (replication 1) and waits until it is created.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self.client_config().create().expect("admin client");
        let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let results = admin
            .create_topics(&[new_topic], &AdminOptions::new())
            .await
            .expect("create_topics");
        for result in results {
            if let Err((name, code)) = result {
                assert_eq!(
                    code,
                    rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists,
                    "creating topic {name}"
                );
            }
        }
    }

    /// Stops the broker (as a crash would: its in-memory log is gone).
    pub fn stop(&mut self) {
        if let Some((mut child, stdin)) = self.watchdog.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port nobody listens on right now, from a range of our own that moves forward per binary, so two
/// brokers started by concurrent tests never get the same one.
fn spare_port() -> u16 {
    static NEXT_PORT: std::sync::Mutex<u16> = std::sync::Mutex::new(0);
    let mut next = NEXT_PORT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if *next == 0 {
        *next = 40_000 + (std::process::id() % 500) as u16 * 20;
    }
    loop {
        let port = *next;
        *next += 1;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
