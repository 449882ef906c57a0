//! The Redis store's steps of a scheduled opening's draw (protocol: `crate::queue::draw`): one script per
//! writing step (`draw_schedule.lua`, `draw_begin.lua`, `draw_write.lua`, `draw_finish.lua`) over the
//! queue's keys plus its drawn list, all in the queue's slot; reads are single commands. The HMAC order
//! itself is computed in Rust by the shared driver: Redis Lua has no HMAC, and a sort of a million members
//! inside one script would stall Redis for everyone.

use async_trait::async_trait;
use rankgate_core::queue::draw::from_hex_32;
use rankgate_core::queue::{DrawPhase, DrawSeed, QueueName};
use redis::{Script, ScriptInvocation};

use super::{RedisStore, Reply};
use crate::queue::draw::{BeginDraw, DrawPass, DrawRecord, DrawStep, DrawStore, FinishDraw, ScheduleOutcome};
use crate::queue::StoreError;

/// The meta fields of a draw, in the order [`RedisStore::draw_record_redis`] reads them.
const DRAW_FIELDS: [&str; 9] = [
    "dphase", "dopens", "dseed", "dk0", "ddrawn", "dB", "dL", "downer", "dlease",
];

impl RedisStore {
    /// The queue's drawn list.
    pub(super) fn drawn_key(&self, queue: &QueueName) -> String {
        format!("{}{{rg:q:{}}}:drawn", self.options.prefix, queue.as_str())
    }

    fn draw_call<'a>(&self, script: &'a Script, queue: &QueueName) -> ScriptInvocation<'a> {
        let mut call = self.queue_call(script, queue);
        call.key(self.drawn_key(queue));
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
                BeginDraw::Begun(DrawPass {
                    seed: DrawSeed(seed),
                    boundary,
                    late_from,
                })
            }
            _ => BeginDraw::Done,
        })
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
        if limit == 0 {
            return Ok(Vec::new());
        }
        let stop = offset.saturating_add(limit as u64 - 1);
        self.connection
            .query(
                redis::cmd("LRANGE")
                    .arg(self.drawn_key(queue))
                    .arg(offset)
                    .arg(stop),
            )
            .await
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
