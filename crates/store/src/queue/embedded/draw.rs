//! The embedded store's steps of a scheduled opening's draw (protocol: `crate::queue::draw`).
//!
//! Each step is one hold of the queue's lock plus one persisted unit, like every other embedded
//! operation. The draw's order is computed outside the lock by the shared driver, and written back in
//! chunks, so a million-member pre-queue never holds the lock (and every entry and poll behind it) for
//! more than a chunk's worth of sorted-set updates.

use async_trait::async_trait;
use rankgate_core::queue::draw::entrants_commitment;
use rankgate_core::queue::{DrawPhase, DrawSeed, QueueName};
use rankgate_zset::ScoreBound;

use super::persist::{committed, MemberRow, Write};
use super::waiting::QueueState;
use super::{Creation, EmbeddedStore};
use crate::queue::draw::{
    BeaconRoundOutcome, BeginDraw, DrawPass, DrawRecord, DrawStage, DrawStep, DrawStore, FinishDraw,
    ScheduleOutcome, SealEntrants, SupplyBeacon,
};
use crate::queue::StoreError;

impl QueueState {
    /// Step 2 of the draw, the close, once `opensAt` has come: B = the next sequence, K0 = members
    /// waiting (all below B), and the next sequence moves to L = B + K0, so whoever enters from now on
    /// queues behind every position the draw can write and is not an entrant. Run by the first entry at or
    /// after `opensAt` (so the close is exact, not a tick late) or else by the first drawer. No drawer holds
    /// it yet. An empty pre-queue is done at once, committed to the empty set. The caller persists the
    /// queue row and the draw record.
    pub(crate) fn close_pre_queue_if_due(&mut self, now_ms: i64) -> bool {
        let waiting = self.waiting.len() as u64;
        let next_seq = self.next_seq;
        let Some(record) = self.draw.as_mut() else {
            return false;
        };
        if record.phase != DrawPhase::Scheduled || now_ms < record.opens_at_ms {
            return false;
        }
        record.boundary = next_seq;
        record.pre_queue_size = waiting;
        record.late_from = next_seq + waiting;
        record.owner.clear();
        record.lease_until_ms = 0;
        record.drawn = 0;
        if waiting == 0 {
            record.entrants_commitment = Some(entrants_commitment::<&str>(&[]));
            record.entrant_count = 0;
            record.phase = DrawPhase::Done;
        } else {
            record.phase = DrawPhase::Closing;
        }
        self.next_seq = next_seq + waiting;
        true
    }
}

impl EmbeddedStore {
    pub(super) async fn schedule_opening_embedded(
        &self,
        queue: &QueueName,
        opens_at_ms: Option<i64>,
        fresh_seed: DrawSeed,
    ) -> Result<ScheduleOutcome, StoreError> {
        let state = self.existing_or_create(queue, Creation::ByAdmin)?;
        let (outcome, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Err(StoreError::Unavailable(
                    "the queue was deleted during this update; try again".into(),
                ));
            }
            q.observe_now(self.clock.now_millis());
            let phase = q.draw.as_ref().map(|d| d.phase);
            // From the close to the end of the draw the opening is fixed: the entrants are (being)
            // committed to.
            if phase.is_some_and(|p| p != DrawPhase::Scheduled && p != DrawPhase::Done) {
                return Ok(ScheduleOutcome::DrawRunning);
            }
            q.managed = true;
            let mut writes = vec![q.queue_write()];
            let outcome = match opens_at_ms {
                None if phase.is_none() => ScheduleOutcome::NothingToClear,
                None => {
                    q.draw = None;
                    q.drawn.clear();
                    q.entrants.clear();
                    ScheduleOutcome::Cleared
                }
                Some(opens_at_ms) => {
                    let record = match q.draw.take() {
                        // Moving a scheduled opening keeps its seed: the commitment stays true.
                        Some(existing) if existing.phase == DrawPhase::Scheduled => DrawRecord {
                            opens_at_ms,
                            ..existing
                        },
                        _ => {
                            q.drawn.clear();
                            q.entrants.clear();
                            writes.push(Write::ClearDrawnMembers {
                                queue: queue.as_str().to_string(),
                            });
                            writes.push(Write::ClearDrawEntrants {
                                queue: queue.as_str().to_string(),
                            });
                            DrawRecord::scheduled(opens_at_ms, fresh_seed)
                        }
                    };
                    q.draw = Some(record.clone());
                    ScheduleOutcome::Scheduled(record)
                }
            };
            writes.push(q.draw_write());
            (outcome, self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(outcome)
    }

    pub(super) async fn begin_draw_embedded(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
    ) -> Result<BeginDraw, StoreError> {
        let Some(state) = self.existing(queue) else {
            return Ok(BeginDraw::NotScheduled);
        };
        let (outcome, pending) = 'step: {
            let mut q = state.lock();
            if q.deleted {
                return Ok(BeginDraw::NotScheduled);
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            // Closed here unless an entry at or after opensAt closed it already.
            let closed_now = q.close_pre_queue_if_due(now_ms);
            let Some(record) = q.draw.as_mut() else {
                return Ok(BeginDraw::NotScheduled);
            };
            match record.phase {
                DrawPhase::Done if closed_now => {
                    // An empty pre-queue, done at its close: persist that.
                    let writes = vec![q.queue_write(), q.draw_write()];
                    break 'step (BeginDraw::Done, self.writer.submit(writes));
                }
                DrawPhase::Done => return Ok(BeginDraw::Done),
                DrawPhase::AwaitingBeacon => return Ok(BeginDraw::AwaitingBeacon),
                DrawPhase::Closing | DrawPhase::Drawing
                    if record.owner != owner && record.lease_until_ms > now_ms =>
                {
                    return Ok(BeginDraw::HeldElsewhere)
                }
                DrawPhase::Scheduled => return Ok(BeginDraw::NotDue),
                // A draw that began before entrant commitments existed is closed again.
                DrawPhase::Drawing if record.entrants_commitment.is_none() => {
                    record.phase = DrawPhase::Closing;
                }
                DrawPhase::Closing | DrawPhase::Drawing => {}
            }
            let phase = record.phase;
            record.owner = owner.to_string();
            record.lease_until_ms = now_ms + lease_ms;
            record.drawn = 0;
            let stage = match (record.entrants_commitment, record.beacon_bytes()) {
                (Some(entrants_commitment), Some(beacon)) if phase == DrawPhase::Drawing => {
                    DrawStage::WriteOrder {
                        entrants_commitment,
                        beacon: beacon.to_vec(),
                    }
                }
                _ => DrawStage::RecordEntrants,
            };
            let pass = DrawPass {
                seed: record.seed,
                boundary: record.boundary,
                late_from: record.late_from,
                stage,
            };
            q.next_seq = q.next_seq.max(pass.late_from);
            // A new pass rewrites its list whole (module doc of `crate::queue::draw`).
            q.drawn.clear();
            let queue_name = queue.as_str().to_string();
            let mut writes = vec![
                q.queue_write(),
                Write::ClearDrawnMembers {
                    queue: queue_name.clone(),
                },
            ];
            if phase != DrawPhase::Drawing {
                q.entrants.clear();
                writes.push(Write::ClearDrawEntrants { queue: queue_name });
            }
            writes.push(q.draw_write());
            (BeginDraw::Begun(pass), self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(outcome)
    }

    pub(super) async fn set_beacon_round_embedded(
        &self,
        queue: &QueueName,
        round: Option<u64>,
    ) -> Result<BeaconRoundOutcome, StoreError> {
        let Some(state) = self.existing(queue) else {
            return Ok(BeaconRoundOutcome::NoOpening);
        };
        let (record, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(BeaconRoundOutcome::NoOpening);
            }
            q.observe_now(self.clock.now_millis());
            let Some(record) = q.draw.as_mut() else {
                return Ok(BeaconRoundOutcome::NoOpening);
            };
            if record.phase != DrawPhase::Scheduled {
                return Ok(BeaconRoundOutcome::Closed);
            }
            record.beacon_round = round;
            let record = record.clone();
            (record, self.writer.submit(vec![q.draw_write()]))
        };
        committed(pending).await?;
        Ok(BeaconRoundOutcome::Set(record))
    }

    pub(super) async fn write_entrants_chunk_embedded(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
        first_index: u64,
        members: &[String],
    ) -> Result<DrawStep, StoreError> {
        let Some(state) = self.existing(queue) else {
            return Ok(DrawStep::LostLease);
        };
        let pending = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(DrawStep::LostLease);
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let Some(record) = q.draw.as_ref() else {
                return Ok(DrawStep::LostLease);
            };
            if record.phase != DrawPhase::Closing || record.owner != owner {
                return Ok(DrawStep::LostLease);
            }
            let listed = q.entrants.len() as u64;
            if listed == first_index + members.len() as u64 {
                return Ok(DrawStep::Written);
            }
            if listed != first_index {
                return Ok(DrawStep::LostLease);
            }
            q.entrants
                .extend(members.iter().map(|m| m.clone().into_boxed_str()));
            if let Some(record) = q.draw.as_mut() {
                record.lease_until_ms = now_ms + lease_ms;
            }
            let writes = vec![
                Write::DrawEntrants {
                    queue: queue.as_str().to_string(),
                    first_index: first_index as i64,
                    members: members.to_vec(),
                },
                q.draw_write(),
            ];
            self.writer.submit(writes)
        };
        committed(pending).await?;
        Ok(DrawStep::Written)
    }

    pub(super) async fn seal_entrants_embedded(
        &self,
        queue: &QueueName,
        owner: &str,
        commitment: [u8; 32],
    ) -> Result<SealEntrants, StoreError> {
        let Some(state) = self.existing(queue) else {
            return Ok(SealEntrants::LostLease);
        };
        let (outcome, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(SealEntrants::LostLease);
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let entrant_count = q.entrants.len() as u64;
            let Some(record) = q.draw.as_mut() else {
                return Ok(SealEntrants::LostLease);
            };
            if record.phase != DrawPhase::Closing || record.owner != owner {
                return Ok(SealEntrants::LostLease);
            }
            record.entrants_commitment = Some(commitment);
            record.entrant_count = entrant_count;
            let outcome = if record.beacon_round.is_some() {
                // Nobody holds a lease while the beacon is awaited: whoever ticks after it draws.
                record.phase = DrawPhase::AwaitingBeacon;
                record.owner.clear();
                record.lease_until_ms = 0;
                SealEntrants::AwaitingBeacon
            } else {
                record.phase = DrawPhase::Drawing;
                record.lease_until_ms = now_ms + crate::queue::draw::DRAW_LEASE_MS;
                SealEntrants::ReadyToDraw
            };
            (outcome, self.writer.submit(vec![q.draw_write()]))
        };
        committed(pending).await?;
        Ok(outcome)
    }

    pub(super) async fn supply_beacon_embedded(
        &self,
        queue: &QueueName,
        round: u64,
        value: &[u8],
    ) -> Result<SupplyBeacon, StoreError> {
        let Some(state) = self.existing(queue) else {
            return Ok(SupplyBeacon::NotAwaiting);
        };
        let pending = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(SupplyBeacon::NotAwaiting);
            }
            q.observe_now(self.clock.now_millis());
            let Some(record) = q.draw.as_mut() else {
                return Ok(SupplyBeacon::NotAwaiting);
            };
            if record.beacon_round != Some(round) {
                return Ok(SupplyBeacon::WrongRound {
                    expected: record.beacon_round,
                });
            }
            if let Some(accepted) = &record.beacon {
                return Ok(if accepted.as_slice() == value {
                    SupplyBeacon::AlreadyAccepted
                } else {
                    SupplyBeacon::DifferentValueAccepted
                });
            }
            if record.phase != DrawPhase::AwaitingBeacon {
                return Ok(SupplyBeacon::NotAwaiting);
            }
            record.beacon = Some(value.to_vec());
            record.phase = DrawPhase::Drawing;
            self.writer.submit(vec![q.draw_write()])
        };
        committed(pending).await?;
        Ok(SupplyBeacon::Accepted)
    }

    pub(super) fn pre_queue_page_embedded(
        &self,
        queue: &QueueName,
        from_score: u64,
        below: u64,
        limit: usize,
    ) -> Vec<(String, u64)> {
        let Some(state) = self.existing(queue) else {
            return Vec::new();
        };
        let q = state.lock();
        q.waiting
            .range_by_score(
                ScoreBound::Inclusive(from_score as f64),
                ScoreBound::Exclusive(below as f64),
                false,
                Some((0, limit as i64)),
            )
            .into_iter()
            .filter_map(|(member, score)| {
                std::str::from_utf8(member)
                    .ok()
                    .map(|m| (m.to_string(), score as u64))
            })
            .collect()
    }

    pub(super) async fn write_draw_chunk_embedded(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
        first_index: u64,
        members: &[String],
    ) -> Result<DrawStep, StoreError> {
        let Some(state) = self.existing(queue) else {
            return Ok(DrawStep::LostLease);
        };
        let (step, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(DrawStep::LostLease);
            }
            let now_ms = q.observe_now(self.clock.now_millis());
            let Some(record) = q.draw.as_ref() else {
                return Ok(DrawStep::LostLease);
            };
            if record.phase != DrawPhase::Drawing || record.owner != owner {
                return Ok(DrawStep::LostLease);
            }
            let (boundary, late_from, opens_at_ms) = (record.boundary, record.late_from, record.opens_at_ms);
            let listed = q.drawn.len() as u64;
            if listed == first_index + members.len() as u64 {
                // A retried call whose first try was applied.
                return Ok(DrawStep::Written);
            }
            if listed != first_index {
                return Ok(DrawStep::LostLease);
            }
            let queue_name = queue.as_str().to_string();
            let mut writes = Vec::with_capacity(members.len() + 2);
            for (offset, member) in members.iter().enumerate() {
                let still_pre_queue = q
                    .waiting
                    .zscore(member.as_bytes())
                    .is_some_and(|score| score < late_from as f64);
                if !still_pre_queue {
                    continue;
                }
                let seq = boundary + first_index + offset as u64;
                let _ = q.waiting.zadd(
                    member.as_bytes(),
                    seq as f64,
                    rankgate_zset::AddOptions::default(),
                );
                // The pre-queue's wait starts at the opening; that is the arrival time a restart reads.
                writes.push(Write::Member {
                    queue: queue_name.clone(),
                    member: member.clone(),
                    row: MemberRow {
                        kind: 0,
                        seq: seq as i64,
                        at_ms: opens_at_ms,
                        ..MemberRow::default()
                    },
                });
            }
            q.drawn.extend(members.iter().map(|m| m.clone().into_boxed_str()));
            let drawn = q.drawn.len() as u64;
            if let Some(record) = q.draw.as_mut() {
                record.lease_until_ms = now_ms + lease_ms;
                record.drawn = drawn;
            }
            writes.push(Write::DrawnMembers {
                queue: queue_name,
                first_index: first_index as i64,
                members: members.to_vec(),
            });
            writes.push(q.draw_write());
            (DrawStep::Written, self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(step)
    }

    pub(super) async fn finish_draw_embedded(
        &self,
        queue: &QueueName,
        owner: &str,
    ) -> Result<FinishDraw, StoreError> {
        let Some(state) = self.existing(queue) else {
            return Ok(FinishDraw::LostLease);
        };
        let (outcome, pending) = {
            let mut q = state.lock();
            if q.deleted {
                return Ok(FinishDraw::LostLease);
            }
            q.observe_now(self.clock.now_millis());
            let Some(record) = q.draw.as_ref() else {
                return Ok(FinishDraw::LostLease);
            };
            if record.phase != DrawPhase::Drawing || record.owner != owner {
                return Ok(FinishDraw::LostLease);
            }
            let unplaced = q.waiting.zcount(
                ScoreBound::Inclusive(f64::NEG_INFINITY),
                ScoreBound::Exclusive(record.boundary as f64),
            );
            if unplaced > 0 {
                return Ok(FinishDraw::Incomplete);
            }
            let drawn = q.drawn.len() as u64;
            if let Some(record) = q.draw.as_mut() {
                record.phase = DrawPhase::Done;
                record.drawn = drawn;
                record.owner.clear();
                record.lease_until_ms = 0;
            }
            // The drawn list now holds every entrant, in drawn order: the entrant list has done its job.
            q.entrants = Vec::new();
            let writes = vec![
                q.draw_write(),
                Write::ClearDrawEntrants {
                    queue: queue.as_str().to_string(),
                },
            ];
            (FinishDraw::Done { drawn }, self.writer.submit(writes))
        };
        committed(pending).await?;
        Ok(outcome)
    }
}

#[async_trait]
impl DrawStore for EmbeddedStore {
    async fn schedule_opening(
        &self,
        queue: &QueueName,
        opens_at_ms: Option<i64>,
        fresh_seed: DrawSeed,
    ) -> Result<ScheduleOutcome, StoreError> {
        self.check()?;
        self.schedule_opening_embedded(queue, opens_at_ms, fresh_seed)
            .await
    }

    async fn set_beacon_round(
        &self,
        queue: &QueueName,
        round: Option<u64>,
    ) -> Result<BeaconRoundOutcome, StoreError> {
        self.check()?;
        self.set_beacon_round_embedded(queue, round).await
    }

    async fn write_entrants_chunk(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
        first_index: u64,
        members: &[String],
    ) -> Result<DrawStep, StoreError> {
        self.check()?;
        self.write_entrants_chunk_embedded(queue, owner, lease_ms, first_index, members)
            .await
    }

    async fn seal_entrants(
        &self,
        queue: &QueueName,
        owner: &str,
        commitment: [u8; 32],
    ) -> Result<SealEntrants, StoreError> {
        self.check()?;
        self.seal_entrants_embedded(queue, owner, commitment).await
    }

    async fn supply_beacon(
        &self,
        queue: &QueueName,
        round: u64,
        value: &[u8],
    ) -> Result<SupplyBeacon, StoreError> {
        self.check()?;
        self.supply_beacon_embedded(queue, round, value).await
    }

    async fn entrants(
        &self,
        queue: &QueueName,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.check()?;
        Ok(self.existing(queue).map_or_else(Vec::new, |q| {
            let q = q.lock();
            q.entrants
                .iter()
                .skip(usize::try_from(offset).unwrap_or(usize::MAX))
                .take(limit)
                .map(|m| m.to_string())
                .collect()
        }))
    }

    async fn draw_record(&self, queue: &QueueName) -> Result<Option<DrawRecord>, StoreError> {
        self.check()?;
        Ok(self.existing(queue).and_then(|q| q.lock().draw.clone()))
    }

    async fn begin_draw(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
    ) -> Result<BeginDraw, StoreError> {
        self.check()?;
        self.begin_draw_embedded(queue, owner, lease_ms).await
    }

    async fn pre_queue_page(
        &self,
        queue: &QueueName,
        from_score: u64,
        below: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        self.check()?;
        Ok(self.pre_queue_page_embedded(queue, from_score, below, limit))
    }

    async fn write_draw_chunk(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
        first_index: u64,
        members: &[String],
    ) -> Result<DrawStep, StoreError> {
        self.check()?;
        self.write_draw_chunk_embedded(queue, owner, lease_ms, first_index, members)
            .await
    }

    async fn finish_draw(&self, queue: &QueueName, owner: &str) -> Result<FinishDraw, StoreError> {
        self.check()?;
        self.finish_draw_embedded(queue, owner).await
    }

    async fn drawn_members(
        &self,
        queue: &QueueName,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.check()?;
        Ok(self.existing(queue).map_or_else(Vec::new, |q| {
            let q = q.lock();
            q.drawn
                .iter()
                .skip(usize::try_from(offset).unwrap_or(usize::MAX))
                .take(limit)
                .map(|m| m.to_string())
                .collect()
        }))
    }
}
