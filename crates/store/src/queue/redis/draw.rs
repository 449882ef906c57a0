//! The Redis store's steps of a scheduled opening's draw (protocol: `crate::queue::draw`): one script per
//! writing step (`draw_schedule.lua`, `draw_round.lua`, `draw_begin.lua`, `draw_entrants.lua`,
//! `draw_seal.lua`, `draw_beacon.lua`, `draw_write.lua`, `draw_finish.lua`) over the queue's keys plus its
//! drawn and entrant lists, all in the queue's slot; reads are single commands. The entrants commitment
//! and the HMAC order are computed in Rust by the shared driver, with the same core functions as the
//! embedded store: Redis Lua has neither SHA-256 nor HMAC, and hashing or sorting a million members inside
//! one script would stall Redis for everyone.

use async_trait::async_trait;
use rankgate_core::queue::draw::from_hex_32;
use rankgate_core::queue::{DrawPhase, DrawSeed, QueueName};
use redis::{Script, ScriptInvocation};

use super::{RedisStore, Reply};
use crate::queue::draw::{
    BeaconRoundOutcome, BeginDraw, DrawPass, DrawRecord, DrawStage, DrawStep, DrawStore, FinishDraw,
    ScheduleOutcome, SealEntrants, SupplyBeacon, DRAW_LEASE_MS,
};
use crate::queue::StoreError;

/// The meta fields of a draw, in the order [`RedisStore::draw_record_redis`] reads them.
const DRAW_FIELDS: [&str; 13] = [
    "dphase", "dopens", "dseed", "dk0", "ddrawn", "dB", "dL", "downer", "dlease", "dround", "dentc", "dentn",
    "dbeacon",
];

impl RedisStore {
    /// The queue's drawn list.
    pub(super) fn drawn_key(&self, queue: &QueueName) -> String {
        format!("{}{{rg:q:{}}}:drawn", self.options.prefix, queue.as_str())
    }

    /// The queue's entrant list (from the close to the end of the draw).
    pub(super) fn entrants_key(&self, queue: &QueueName) -> String {
        format!("{}{{rg:q:{}}}:entrants", self.options.prefix, queue.as_str())
    }

    fn draw_call<'a>(&self, script: &'a Script, queue: &QueueName) -> ScriptInvocation<'a> {
        let mut call = self.queue_call(script, queue);
        call.key(self.drawn_key(queue));
        call.key(self.entrants_key(queue));
        call
    }

    pub(super) async fn schedule_opening_redis(
        &self,
        queue: &QueueName,
        opens_at_ms: Option<i64>,
        fresh_seed: DrawSeed,
    ) -> Result<ScheduleOutcome, StoreError> {
        // Listed first (an admin may create queues beyond max_queues, as a settings PUT may).
        self.register(queue).await?;
        let mut call = self.draw_call(&self.scripts.draw_schedule, queue);
        call.arg(opens_at_ms.map_or_else(String::new, |ms| ms.to_string()))
            .arg(hex::encode(fresh_seed.0));
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            0 => match self.draw_record_redis(queue).await? {
                Some(record) => {
                    // Scheduling makes the queue admin-configured: kept with its settings, then the opening.
                    if let Some((settings, epoch, managed)) = self.meta_settings(queue).await? {
                        self.observe_kept(queue, &settings, Some(epoch), Some(managed));
                    }
                    self.kept_settings()
                        .observe_opening(queue, Some(record.opens_at_ms));
                    self.kept_settings()
                        .observe_beacon_round(queue, record.beacon_round);
                    ScheduleOutcome::Scheduled(record)
                }
                None => {
                    return Err(StoreError::Unavailable(
                        "the queue was deleted during this update; try again".into(),
                    ))
                }
            },
            1 => {
                self.kept_settings().observe_opening(queue, None);
                self.kept_settings().observe_beacon_round(queue, None);
                ScheduleOutcome::Cleared
            }
            2 => ScheduleOutcome::DrawRunning,
            _ => ScheduleOutcome::NothingToClear,
        })
    }

    pub(super) async fn draw_record_redis(
        &self,
        queue: &QueueName,
    ) -> Result<Option<DrawRecord>, StoreError> {
        let meta = &self.queue_keys(queue)[0];
        let mut command = redis::cmd("HMGET");
        command.arg(meta);
        for field in DRAW_FIELDS {
            command.arg(field);
        }
        let values: Vec<Option<String>> = self.connection.query(&command).await?;
        let corrupt = |field: &str| StoreError::Corrupt(format!("draw field {field} is unreadable"));
        let get = |i: usize| values.get(i).cloned().flatten();
        let Some(phase) = get(0) else {
            return Ok(None);
        };
        let number = |i: usize| -> Result<i64, StoreError> {
            get(i).map_or(Ok(0), |raw| raw.parse().map_err(|_| corrupt(DRAW_FIELDS[i])))
        };
        Ok(Some(DrawRecord {
            phase: DrawPhase::from_code(&phase).ok_or_else(|| corrupt("dphase"))?,
            opens_at_ms: number(1)?,
            seed: DrawSeed(
                get(2)
                    .and_then(|raw| from_hex_32(&raw))
                    .ok_or_else(|| corrupt("dseed"))?,
            ),
            pre_queue_size: number(3)?.max(0) as u64,
            drawn: number(4)?.max(0) as u64,
            boundary: number(5)?.max(0) as u64,
            late_from: number(6)?.max(0) as u64,
            owner: get(7).unwrap_or_default(),
            lease_until_ms: number(8)?,
            beacon_round: get(9)
                .map(|raw| raw.parse().map_err(|_| corrupt("dround")))
                .transpose()?,
            entrants_commitment: get(10)
                .map(|raw| from_hex_32(&raw).ok_or_else(|| corrupt("dentc")))
                .transpose()?,
            entrant_count: number(11)?.max(0) as u64,
            beacon: get(12)
                .map(|raw| hex::decode(raw).map_err(|_| corrupt("dbeacon")))
                .transpose()?,
        }))
    }

    pub(super) async fn begin_draw_redis(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
    ) -> Result<BeginDraw, StoreError> {
        let mut call = self.draw_call(&self.scripts.draw_begin, queue);
        call.arg(owner).arg(lease_ms);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            0 => BeginDraw::NotScheduled,
            1 => BeginDraw::NotDue,
            2 => BeginDraw::HeldElsewhere,
            3 => {
                let seed = from_hex_32(&reply.string()?)
                    .ok_or_else(|| StoreError::Corrupt("draw seed is unreadable".into()))?;
                let boundary = reply
                    .string()?
                    .parse()
                    .map_err(|_| StoreError::Corrupt("dB".into()))?;
                let late_from = reply
                    .string()?
                    .parse()
                    .map_err(|_| StoreError::Corrupt("dL".into()))?;
                let stage = reply.string()?;
                let entrants = reply.string()?;
                let beacon = reply.string()?;
                let stage = if stage == "O" {
                    DrawStage::WriteOrder {
                        entrants_commitment: from_hex_32(&entrants)
                            .ok_or_else(|| StoreError::Corrupt("dentc".into()))?,
                        beacon: hex::decode(beacon).map_err(|_| StoreError::Corrupt("dbeacon".into()))?,
                    }
                } else {
                    DrawStage::RecordEntrants
                };
                BeginDraw::Begun(DrawPass {
                    seed: DrawSeed(seed),
                    boundary,
                    late_from,
                    stage,
                })
            }
            5 => BeginDraw::AwaitingBeacon,
            _ => BeginDraw::Done,
        })
    }

    pub(super) async fn set_beacon_round_redis(
        &self,
        queue: &QueueName,
        round: Option<u64>,
    ) -> Result<BeaconRoundOutcome, StoreError> {
        let mut call = self.draw_call(&self.scripts.draw_round, queue);
        call.arg(round.map_or_else(String::new, |r| r.to_string()));
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            1 => match self.draw_record_redis(queue).await? {
                Some(record) => {
                    // Kept with the opening, so a store loss before the close schedules it again with it.
                    self.kept_settings()
                        .observe_beacon_round(queue, record.beacon_round);
                    BeaconRoundOutcome::Set(record)
                }
                None => BeaconRoundOutcome::NoOpening,
            },
            2 => BeaconRoundOutcome::Closed,
            _ => BeaconRoundOutcome::NoOpening,
        })
    }

    pub(super) async fn write_entrants_chunk_redis(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
        first_index: u64,
        members: &[String],
    ) -> Result<DrawStep, StoreError> {
        let mut call = self.draw_call(&self.scripts.draw_entrants, queue);
        call.arg(owner).arg(lease_ms).arg(first_index);
        for member in members {
            call.arg(member.as_str());
        }
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(if reply.int()? == 1 {
            DrawStep::Written
        } else {
            DrawStep::LostLease
        })
    }

    pub(super) async fn seal_entrants_redis(
        &self,
        queue: &QueueName,
        owner: &str,
        commitment: [u8; 32],
    ) -> Result<SealEntrants, StoreError> {
        let mut call = self.draw_call(&self.scripts.draw_seal, queue);
        call.arg(owner).arg(DRAW_LEASE_MS).arg(hex::encode(commitment));
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            1 => SealEntrants::AwaitingBeacon,
            2 => SealEntrants::ReadyToDraw,
            _ => SealEntrants::LostLease,
        })
    }

    pub(super) async fn supply_beacon_redis(
        &self,
        queue: &QueueName,
        round: u64,
        value: &[u8],
    ) -> Result<SupplyBeacon, StoreError> {
        let mut call = self.draw_call(&self.scripts.draw_beacon, queue);
        call.arg(round).arg(hex::encode(value));
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            1 => SupplyBeacon::Accepted,
            2 => SupplyBeacon::AlreadyAccepted,
            3 => SupplyBeacon::DifferentValueAccepted,
            4 => SupplyBeacon::WrongRound {
                expected: reply.string()?.parse().ok(),
            },
            _ => SupplyBeacon::NotAwaiting,
        })
    }

    async fn list_range(&self, key: String, offset: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let stop = offset.saturating_add(limit as u64 - 1);
        self.connection
            .query(redis::cmd("LRANGE").arg(key).arg(offset).arg(stop))
            .await
    }

    pub(super) async fn pre_queue_page_redis(
        &self,
        queue: &QueueName,
        from_score: u64,
        below: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let waiting = &self.queue_keys(queue)[1];
        let flat: Vec<String> = self
            .connection
            .query(
                redis::cmd("ZRANGE")
                    .arg(waiting)
                    .arg(from_score)
                    .arg(format!("({below}"))
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit)
                    .arg("WITHSCORES"),
            )
            .await?;
        flat.chunks(2)
            .map(|pair| match pair {
                [member, score] => score
                    .parse::<f64>()
                    .map(|s| (member.clone(), s as u64))
                    .map_err(|_| StoreError::Corrupt(format!("waiting score {score:?}"))),
                _ => Err(StoreError::Corrupt("odd ZRANGE WITHSCORES reply".into())),
            })
            .collect()
    }

    pub(super) async fn write_draw_chunk_redis(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
        first_index: u64,
        members: &[String],
    ) -> Result<DrawStep, StoreError> {
        let mut call = self.draw_call(&self.scripts.draw_write, queue);
        call.arg(owner).arg(lease_ms).arg(first_index);
        for member in members {
            call.arg(member.as_str());
        }
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(if reply.int()? == 1 {
            DrawStep::Written
        } else {
            DrawStep::LostLease
        })
    }

    pub(super) async fn finish_draw_redis(
        &self,
        queue: &QueueName,
        owner: &str,
    ) -> Result<FinishDraw, StoreError> {
        let mut call = self.draw_call(&self.scripts.draw_finish, queue);
        call.arg(owner);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(match reply.int()? {
            1 => FinishDraw::Done {
                drawn: reply.int()?.max(0) as u64,
            },
            2 => FinishDraw::Incomplete,
            _ => FinishDraw::LostLease,
        })
    }

    pub(super) async fn drawn_members_redis(
        &self,
        queue: &QueueName,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.list_range(self.drawn_key(queue), offset, limit).await
    }
}

#[async_trait]
impl DrawStore for RedisStore {
    async fn schedule_opening(
        &self,
        queue: &QueueName,
        opens_at_ms: Option<i64>,
        fresh_seed: DrawSeed,
    ) -> Result<ScheduleOutcome, StoreError> {
        self.check()?;
        self.schedule_opening_redis(queue, opens_at_ms, fresh_seed).await
    }

    async fn set_beacon_round(
        &self,
        queue: &QueueName,
        round: Option<u64>,
    ) -> Result<BeaconRoundOutcome, StoreError> {
        self.check()?;
        self.set_beacon_round_redis(queue, round).await
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
        self.write_entrants_chunk_redis(queue, owner, lease_ms, first_index, members)
            .await
    }

    async fn seal_entrants(
        &self,
        queue: &QueueName,
        owner: &str,
        commitment: [u8; 32],
    ) -> Result<SealEntrants, StoreError> {
        self.check()?;
        self.seal_entrants_redis(queue, owner, commitment).await
    }

    async fn supply_beacon(
        &self,
        queue: &QueueName,
        round: u64,
        value: &[u8],
    ) -> Result<SupplyBeacon, StoreError> {
        self.check()?;
        self.supply_beacon_redis(queue, round, value).await
    }

    async fn entrants(
        &self,
        queue: &QueueName,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.check()?;
        self.list_range(self.entrants_key(queue), offset, limit).await
    }

    async fn draw_record(&self, queue: &QueueName) -> Result<Option<DrawRecord>, StoreError> {
        self.check()?;
        self.draw_record_redis(queue).await
    }

    async fn begin_draw(
        &self,
        queue: &QueueName,
        owner: &str,
        lease_ms: i64,
    ) -> Result<BeginDraw, StoreError> {
        self.check()?;
        self.begin_draw_redis(queue, owner, lease_ms).await
    }

    async fn pre_queue_page(
        &self,
        queue: &QueueName,
        from_score: u64,
        below: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        self.check()?;
        self.pre_queue_page_redis(queue, from_score, below, limit).await
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
        self.write_draw_chunk_redis(queue, owner, lease_ms, first_index, members)
            .await
    }

    async fn finish_draw(&self, queue: &QueueName, owner: &str) -> Result<FinishDraw, StoreError> {
        self.check()?;
        self.finish_draw_redis(queue, owner).await
    }

    async fn drawn_members(
        &self,
        queue: &QueueName,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.check()?;
        self.drawn_members_redis(queue, offset, limit).await
    }
}
