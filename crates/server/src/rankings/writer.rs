//! The single writer thread of the rankings source of truth, with group commit.
//!
//! Every ingest (HTTP, `rankgate ingest`, the demo) and every admin write goes through one OS thread that
//! owns the [`Ingestor`]. Concurrent ingest requests that arrive while a commit is running are merged
//! into the next transaction, so under load a transaction carries many requests and the per-commit cost
//! (fsync of the WAL, statement setup) is shared. Blocking SQLite work never runs on the async runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use anyhow::anyhow;
use tokio::sync::oneshot;

use rankgate_core::event::Event;
use rankgate_store::ranking::ingest::{EventOutcome, Ingestor};
use rankgate_store::ranking::source::SourceError;

use crate::readiness::SourceHealth;

/// Largest number of events merged into one transaction.
const GROUP_COMMIT_EVENTS: usize = 20_000;

type AdminTask = Box<dyn FnOnce(&mut Ingestor) + Send>;

enum Command {
    Ingest {
        events: Vec<Event>,
        now_millis: i64,
        reply: oneshot::Sender<anyhow::Result<Vec<EventOutcome>>>,
    },
    Run(AdminTask),
}

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct WriterHandle {
    sender: mpsc::Sender<Command>,
    /// Events committed as [`EventOutcome::Accepted`] since the start (the dashboard's events/s; kept
    /// here, not read from the metrics recorder, so it holds whatever `/metrics` does).
    accepted: Arc<AtomicU64>,
}

impl WriterHandle {
    /// Starts the writer thread, which owns `ingestor` until every handle is dropped and records every
    /// commit's outcome in `health` (readiness).
    pub fn spawn(ingestor: Ingestor, health: Arc<SourceHealth>) -> (WriterHandle, JoinHandle<()>) {
        let (sender, receiver) = mpsc::channel();
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&accepted);
        let thread = std::thread::Builder::new()
            .name("rankings-writer".into())
            .spawn(move || run_writer(ingestor, receiver, &counted, &health))
            .expect("spawning the writer thread");
        (WriterHandle { sender, accepted }, thread)
    }

    /// Events this writer committed as accepted since the process started (every ingest path: HTTP,
    /// streams, Kafka, files; not the rows a follower applies from a shared source of truth).
    pub fn accepted_events(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Ingests events; resolves once every accepted event is durable.
    pub async fn ingest(&self, events: Vec<Event>, now_millis: i64) -> anyhow::Result<Vec<EventOutcome>> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Command::Ingest {
                events,
                now_millis,
                reply,
            })
            .map_err(|_| anyhow!("the rankings writer has stopped"))?;
        answer
            .await
            .map_err(|_| anyhow!("the rankings writer stopped before answering"))?
    }

    /// Blocking variant of [`WriterHandle::ingest`] for command-line tools.
    pub fn ingest_blocking(&self, events: Vec<Event>, now_millis: i64) -> anyhow::Result<Vec<EventOutcome>> {
        self.submit(events, now_millis)?.wait()
    }

    /// Queues an ingest and returns at once, so a tool can parse the next batch while this one commits.
    pub fn submit(&self, events: Vec<Event>, now_millis: i64) -> anyhow::Result<PendingOutcomes> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Command::Ingest {
                events,
                now_millis,
                reply,
            })
            .map_err(|_| anyhow!("the rankings writer has stopped"))?;
        Ok(PendingOutcomes(answer))
    }

    /// Runs `task` on the writer thread, in order with ingests, and returns its result.
    pub async fn run<T: Send + 'static>(
        &self,
        task: impl FnOnce(&mut Ingestor) -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        let (reply, answer) = oneshot::channel();
        let task: AdminTask = Box::new(move |ingestor| {
            let _ = reply.send(task(ingestor));
        });
        self.sender
            .send(Command::Run(task))
            .map_err(|_| anyhow!("the rankings writer has stopped"))?;
        answer
            .await
            .map_err(|_| anyhow!("the rankings writer stopped before answering"))
    }
}

/// Outcomes of a submitted ingest, available once its batch is durable.
pub struct PendingOutcomes(oneshot::Receiver<anyhow::Result<Vec<EventOutcome>>>);

impl PendingOutcomes {
    /// Blocks until the batch is durable (or failed).
    pub fn wait(self) -> anyhow::Result<Vec<EventOutcome>> {
        self.0
            .blocking_recv()
            .map_err(|_| anyhow!("the rankings writer stopped before answering"))?
    }
}

struct PendingIngest {
    len: usize,
    reply: oneshot::Sender<anyhow::Result<Vec<EventOutcome>>>,
}

fn run_writer(
    mut ingestor: Ingestor,
    receiver: mpsc::Receiver<Command>,
    accepted: &AtomicU64,
    health: &SourceHealth,
) {
    let mut next = receiver.recv().ok();
    while let Some(command) = next.take() {
        match command {
            Command::Run(task) => task(&mut ingestor),
            Command::Ingest {
                events,
                now_millis,
                reply,
            } => {
                let mut all = events;
                let mut pending = vec![PendingIngest {
                    len: all.len(),
                    reply,
                }];
                let mut latest_now = now_millis;
                // Group commit: take whatever ingests queued up behind this one.
                while all.len() < GROUP_COMMIT_EVENTS {
                    match receiver.try_recv() {
                        Ok(Command::Ingest {
                            events,
                            now_millis,
                            reply,
                        }) => {
                            pending.push(PendingIngest {
                                len: events.len(),
                                reply,
                            });
                            all.extend(events);
                            latest_now = latest_now.max(now_millis);
                        }
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let started = std::time::Instant::now();
                let result = ingestor.ingest(&all, latest_now);
                metrics::histogram!("rankgate_ingest_commit_seconds").record(started.elapsed().as_secs_f64());
                match &result {
                    Ok(_) => health.record_commit(Ok(())),
                    Err(error) if is_store_failure(error) => {
                        health.record_commit(Err(error as &dyn std::fmt::Display))
                    }
                    Err(_) => {}
                }
                match result {
                    Ok(outcomes) => {
                        let committed = outcomes
                            .iter()
                            .filter(|outcome| matches!(outcome, EventOutcome::Accepted))
                            .count();
                        accepted.fetch_add(committed as u64, Ordering::Relaxed);
                        let mut outcomes = outcomes.into_iter();
                        for request in pending {
                            let _ = request
                                .reply
                                .send(Ok(outcomes.by_ref().take(request.len).collect()));
                        }
                    }
                    Err(error) => {
                        tracing::error!(error = %error, "ingest commit failed; nothing in the batch was acknowledged");
                        for request in pending {
                            let _ = request
                                .reply
                                .send(Err(anyhow!("the source of truth refused the batch: {error}")));
                        }
                    }
                }
            }
        }
        if next.is_none() {
            next = receiver.recv().ok();
        }
    }
}

/// Whether a failed commit says the store cannot take writes (unreachable, disk full, I/O), rather than
/// that the batch was wrong: only those turn readiness down.
fn is_store_failure(error: &SourceError) -> bool {
    matches!(
        error,
        SourceError::Sqlite(_) | SourceError::Postgres(_) | SourceError::Io(_) | SourceError::Corrupt(_)
    )
}
