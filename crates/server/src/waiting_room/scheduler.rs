//! Background workers: the admission scheduler, token/claim expiry, queue gauges and the janitor that
//! forgets idle auto-created queues. Admission visits only queues with somebody waiting, found with one
//! store call per round; expiry visits only queues whose earliest deadline passed (`super::deadlines`,
//! learned from the store's answers, with a full rescan once a minute as the safety net for what other
//! instances did); gauges are published for queues with somebody waiting and those that changed. So a
//! queue nobody waits in costs nothing per tick, READY and CLAIMED members included (issue 30).
//!
//! Every instance runs all of them. That is safe because each step is one atomic store operation and the
//! admission budget lives in the store (limitation 3): four schedulers ticking together admit what one
//! would. Deciding *when* a tick is due uses the room's [`Clock`](rankgate_store::clock::Clock).
//!
//! Each loop first steps one period after the start, not at once. Tests start the whole service with a
//! manual clock and `scheduler_poll_millis` / `adaptive_round_millis` longer than the test, then call
//! [`WaitingRoom::admit_due_queues`] and [`WaitingRoom::run_adaptive_control`] themselves: a loop that
//! stepped at once would race the test's first requests.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::service::WaitingRoom;

/// How often expired tokens and claims are swept between admission ticks.
const EXPIRY_SWEEP_EVERY: Duration = Duration::from_millis(250);
/// How often every queue is visited once to learn its next deadline (`super::deadlines`): the safety
/// net for deadlines another instance made (its admissions and claims), which this one was not told of.
/// O(queues) store calls, so once a minute; the first rescan runs at the first expiry sweep, so tokens
/// restored at startup are known at once.
const DEADLINE_RESCAN_EVERY: Duration = Duration::from_secs(60);
/// How often queue gauges are refreshed.
const GAUGES_EVERY: Duration = Duration::from_secs(1);
/// How often the janitor looks for idle auto-created queues to forget: O(queues) work, so once a minute
/// rather than every tick.
const JANITOR_EVERY: Duration = Duration::from_secs(60);
/// How often this instance brings the settings it keeps of every queue up to date (a store that can
/// lose queues only; see `rankgate_store::queue::kept_settings`): three store calls while no settings
/// changed, every queue read again only when some did (and every five minutes), so a few seconds apart. A
/// change another instance made reaches this copy within this time.
const KEEP_SETTINGS_EVERY: Duration = Duration::from_secs(5);
/// How often this instance adds its sale-report counts to the store (issue 28): one call per queue
/// that moved, whatever the traffic; a report read flushes first, so this only bounds staleness.
const SALE_REPORT_FLUSH_EVERY: Duration = Duration::from_secs(1);

impl WaitingRoom {
    /// Spawns the admission scheduler, the expiry sweeper and the gauge publisher; they stop when
    /// `shutdown` is cancelled.
    pub fn spawn_workers(self: &Arc<Self>, shutdown: CancellationToken) -> Vec<JoinHandle<()>> {
        let poll = Duration::from_millis(self.config.scheduler_poll_millis.max(1));
        let adaptive_round = self.config.adaptive_round_millis.map_or_else(
            || self.adaptive.round_every(),
            |ms| Duration::from_millis(ms.max(1)),
        );
        let streams_shutdown = self.member_streams.shutdown.clone();
        let shutdown_streams = shutdown.clone();
        vec![
            // Member streams end with the workers (they are not workers: they start with their clients).
            tokio::spawn(async move {
                shutdown_streams.cancelled().await;
                streams_shutdown.cancel();
            }),
            spawn_loop(
                "admission",
                Arc::clone(self),
                shutdown.clone(),
                poll,
                |room| async move { room.admit_due_queues().await.map(|_| ()) },
            ),
            {
                // Real time, not the store clock: the rescan bounds this instance's work, not a deadline.
                let last_rescan = Arc::new(parking_lot::Mutex::new(None::<std::time::Instant>));
                spawn_loop(
                    "expiry",
                    Arc::clone(self),
                    shutdown.clone(),
                    EXPIRY_SWEEP_EVERY,
                    move |room| {
                        let last_rescan = Arc::clone(&last_rescan);
                        async move {
                            let rescan_due = last_rescan
                                .lock()
                                .is_none_or(|at| at.elapsed() >= DEADLINE_RESCAN_EVERY);
                            if rescan_due {
                                room.rescan_deadlines().await?;
                                *last_rescan.lock() = Some(std::time::Instant::now());
                            }
                            room.expire_due_everywhere().await
                        }
                    },
                )
            },
            spawn_loop(
                "gauges",
                Arc::clone(self),
                shutdown.clone(),
                GAUGES_EVERY,
                |room| async move {
                    room.publish_queue_gauges().await?;
                    room.publish_upstream_gauges().await
                },
            ),
            spawn_loop(
                "adaptive",
                Arc::clone(self),
                shutdown.clone(),
                adaptive_round,
                |room| async move { room.run_adaptive_control().await.map(|_| ()) },
            ),
            spawn_loop(
                "kept settings",
                Arc::clone(self),
                shutdown.clone(),
                KEEP_SETTINGS_EVERY,
                |room| async move { room.keep_queue_settings().await },
            ),
            spawn_loop(
                "sale report",
                Arc::clone(self),
                shutdown.clone(),
                SALE_REPORT_FLUSH_EVERY,
                |room| async move { room.flush_sale_reports().await },
            ),
            spawn_loop(
                "janitor",
                Arc::clone(self),
                shutdown,
                JANITOR_EVERY,
                |room| async move {
                    room.forget_old_entry_estimates();
                    room.forget_idle_queues().await.map(|_| ())
                },
            ),
        ]
    }
}

fn spawn_loop<F, Fut>(
    name: &'static str,
    room: Arc<WaitingRoom>,
    shutdown: CancellationToken,
    every: Duration,
    step: F,
) -> JoinHandle<()>
where
    F: Fn(Arc<WaitingRoom>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    tokio::spawn(async move {
        // The first step one period after the start (see the module doc).
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        // After a stall, run once and carry on; a burst of catch-up ticks would only spend the same budget.
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = interval.tick() => {}
            }
            // A step is abandoned at shutdown rather than awaited: every store call in it is one atomic
            // step, so dropping it between calls loses nothing, and SIGTERM is honoured at once even in
            // the middle of a long admission tick (defect 5).
            let result = tokio::select! {
                () = shutdown.cancelled() => return,
                result = step(Arc::clone(&room)) => result,
            };
            match result {
                Ok(()) => {
                    if failing {
                        tracing::info!(worker = name, "waiting-room worker recovered");
                    }
                    failing = false;
                }
                Err(error) => {
                    // Log the first failure of a streak only: a store outage would otherwise flood the log.
                    if !failing {
                        tracing::warn!(
                            worker = name,
                            error = format!("{error:#}"),
                            "waiting-room worker step failed"
                        );
                    }
                    failing = true;
                }
            }
        }
    })
}
