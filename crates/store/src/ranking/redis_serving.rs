//! The Redis serving store: the hot rankings as Redis sorted sets, shared by every instance, on a
//! standalone Redis or a Redis Cluster.
//!
//! The in-process [`RankingEngine`](super::engine::RankingEngine) computes; this store holds what it
//! computed where every instance can read it. One instance at a time (the holder of a lease) publishes,
//! every instance reads. The source of truth stays PostgreSQL or SQLite: everything here can be rebuilt
//! from it, and is, whenever it is lost.
//!
//! # Key layout (`P` = the configured prefix, `<c>` = category or `all`, `<g>` = generation)
//! | key | type | holds |
//! |---|---|---|
//! | `P{rk:<c>}:<ranker>:<span>:v<g>` | zset | product → **negated** score: ascending order is score descending, then product id ascending (bytes), exactly the engine's order |
//! | `P{rk:<c>}:detail:<span>:v<g>` | hash | product → `views likes units sales carry` |
//! | `P{rk:<c>}:totals:v<g>` | hash | span → listed products per ranker (`popular units revenue`); a span served in this generation has a field here |
//! | `P{rk}:active` | hash | the active-version pointer: `generation`, `seq` (bumped per publication), `asOf`, `popular` (policy version), `depth`, and `rebuild` while a rebuild is requested |
//! | `P{rk}:lease` | string | the publisher lease: owner id, with a TTL |
//! | `P{rk}:generation` | counter | the last generation handed out |
//!
//! `<span>` is `hourly:2026071713`, `daily:20260717`, `weekly:2026W29`, `monthly:202607` (local keys), or
//! `1h|1d|7d|30d:<end hour>` for a window (end hour = UTC hours since the epoch). Every key of one
//! category shares the hash tag `{rk:<c>}`, so one Lua script per category and batch writes all of that
//! category's spans in one slot; the pointer, lease and counter share `{rk}`.
//!
//! # Versions
//! A rebuild (start, new policy version, `rankgate rebuild`, loss of data) writes every hot span under a
//! fresh generation beside the served one, checks the totals it wrote, then moves the pointer in one
//! `HSET` (fenced by the lease, so a publisher that lost its lease cannot switch). The old generation's
//! keys get a short TTL (the grace period) so reads that started on them finish.
//!
//! # Lifetimes
//! Every span key expires at its span's end plus the grace period; the pointer and lease expire when no
//! publisher renews them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redis::Script;

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen, Zone};
use rankgate_core::ranker::RankerName;

use super::engine::{RankedItem, RankingEngine, SpanPublication};
use crate::queue::StoreError;
pub use crate::redis_connection::Timeouts;
use crate::redis_connection::{escape, Connection, Reply};

/// Options of the serving store.
#[derive(Debug, Clone)]
pub struct ServingOptions {
    /// Prefix of every key (shared with the waiting room's keys; the hash tags differ).
    pub prefix: String,
    /// Connect and response timeouts.
    pub timeouts: Timeouts,
    /// How long keys outlive their span, and how long a replaced generation stays readable (ms).
    pub grace_millis: i64,
}

impl Default for ServingOptions {
    fn default() -> Self {
        ServingOptions {
            prefix: "rankgate:".into(),
            timeouts: Timeouts::default(),
            grace_millis: 3_600_000,
        }
    }
}

/// The active-version pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Active {
    /// Generation of the served keys.
    pub generation: u64,
    /// Bumped by every publication: equal sequence numbers (in one generation) mean equal data.
    pub seq: u64,
    /// Time of the latest ingest the served data includes.
    pub as_of_millis: Option<i64>,
    /// The `popular` policy version the served scores come from.
    pub popular_version: u32,
    /// Top-N-only depth, or `None` when every member is served.
    pub depth: Option<usize>,
    /// An operator asked for a rebuild (`rankgate rebuild`); the publisher clears it when it switches.
    pub rebuild_requested: bool,
}

/// Result of [`RedisServing::publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Applied: this many member writes in this many script calls.
    Applied {
        /// Sorted-set and detail entries written or removed.
        writes: u64,
        /// Script calls (round trips).
        calls: u64,
    },
    /// A change-only span was missing: the data was lost. Nothing of that category was written.
    Lost,
}

/// Result of moving the pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamped {
    /// Done; the pointer's new sequence number.
    Done(u64),
    /// This publisher no longer holds the lease.
    NotLeader,
    /// The pointer is gone or points at another generation.
    Lost,
}

/// A page read from Redis.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedPage {
    /// Listed products in the whole ranking.
    pub total: usize,
    /// The page, in ranking order.
    pub items: Vec<RankedItem>,
}

/// A product's place read from Redis.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedRank {
    /// Listed products in the whole ranking.
    pub total: usize,
    /// 1-based rank, `None` when Redis does not hold the product.
    pub rank: Option<usize>,
    /// Score when held.
    pub score: Option<f64>,
    /// Metrics (zero when not held).
    pub metrics: Metrics,
    /// Popular carry (zero elsewhere).
    pub carry: f64,
}

struct Scripts {
    publish: Script,
    top: Script,
    rank: Script,
    lease: Script,
    stamp: Script,
}

/// Largest number of arguments sent in one publish call: big spans are never split, but many spans are
/// spread over several calls so no single script blocks Redis for long.
const MAX_ARGS_PER_CALL: usize = 200_000;

/// The serving store. Cheap to share behind an `Arc`.
pub struct RedisServing {
    connection: Connection,
    options: ServingOptions,
    scripts: Scripts,
    cluster: bool,
    calls: AtomicU64,
    writes: AtomicU64,
}

impl std::fmt::Debug for RedisServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServing")
            .field("prefix", &self.options.prefix)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

/// The key part naming a span (see the module docs).
#[must_use]
pub fn span_field(span: &Span) -> String {
    match span {
        Span::Period(key) => format!("{}:{key}", key.kind().as_str()),
        Span::Window { len, end } => format!("{}:{}", len.as_str(), end.0),
    }
}

/// The hot spans at `now_hour`, the ones Redis serves: the current hour, day, ISO week and month, and the
/// four windows ending at `now_hour`.
#[must_use]
pub fn hot_spans(now_hour: Hour, zone: &Zone) -> Vec<Span> {
    PeriodKind::ALL
        .iter()
        .map(|kind| Span::Period(PeriodKey::containing(*kind, now_hour, zone)))
        .chain(WindowLen::ALL.iter().map(|len| Span::Window {
            len: *len,
            end: now_hour,
        }))
        .collect()
}

/// Whether `span` is one of [`hot_spans`] at `now_hour`.
#[must_use]
pub fn is_hot(span: &Span, now_hour: Hour, zone: &Zone) -> bool {
    match span {
        Span::Period(key) => *key == PeriodKey::containing(key.kind(), now_hour, zone),
        Span::Window { end, .. } => *end == now_hour,
    }
}

/// What a publication round covers: every hot span of `all` and of every category `engine` knows.
#[must_use]
pub fn hot_requests(engine: &RankingEngine, now_hour: Hour, zone: &Zone) -> Vec<(CategoryOrAll, Span)> {
    let spans = hot_spans(now_hour, zone);
    engine
        .categories()
        .into_iter()
        .flat_map(|category| spans.iter().map(move |span| (category.clone(), *span)))
        .collect()
}

fn ranker_slot(ranker: RankerName) -> usize {
    RankerName::ALL
        .iter()
        .position(|r| *r == ranker)
        .expect("every ranker is in ALL")
}

fn detail_value(metrics: &Metrics, carry: f64) -> String {
    format!(
        "{} {} {} {} {carry}",
        metrics.views, metrics.likes, metrics.units, metrics.sales
    )
}

/// Parses a detail value; empty (not held) is zero metrics and no carry.
fn parse_detail(raw: &str) -> Result<(Metrics, f64), StoreError> {
    if raw.is_empty() {
        return Ok((Metrics::default(), 0.0));
    }
    let corrupt = || {
        StoreError::Corrupt(format!(
            "serving detail {raw:?} is not 'views likes units sales carry'"
        ))
    };
    let mut parts = raw.split(' ');
    let mut next = || parts.next().ok_or_else(corrupt);
    let metrics = Metrics {
        views: next()?.parse().map_err(|_| corrupt())?,
        likes: next()?.parse().map_err(|_| corrupt())?,
        units: next()?.parse().map_err(|_| corrupt())?,
        sales: next()?.parse().map_err(|_| corrupt())?,
    };
    let carry = next()?.parse().map_err(|_| corrupt())?;
    Ok((metrics, carry))
}

fn parse_number<T: std::str::FromStr>(raw: &str, what: &str) -> Result<T, StoreError> {
    raw.parse()
        .map_err(|_| StoreError::Corrupt(format!("serving {what} {raw:?} is not a number")))
}

impl RedisServing {
    /// Connects: one URL is a standalone server (or a cluster's seed, if it says it runs in cluster mode),
    /// several URLs are the nodes of a cluster.
    pub async fn connect(urls: &[String], options: ServingOptions) -> Result<Arc<RedisServing>, StoreError> {
        if options.prefix.contains(['{', '}']) {
            return Err(StoreError::Unavailable(format!(
                "redis key prefix {:?} must not contain braces (they would move the hash tag)",
                options.prefix
            )));
        }
        let (connection, cluster) = Connection::open(urls, options.timeouts).await?;
        let script = |body: &str| Script::new(body);
        Ok(Arc::new(RedisServing {
            connection,
            options,
            scripts: Scripts {
                publish: script(include_str!("lua/serving_publish.lua")),
                top: script(include_str!("lua/serving_top.lua")),
                rank: script(include_str!("lua/serving_rank.lua")),
                lease: script(include_str!("lua/serving_lease.lua")),
                stamp: script(include_str!("lua/serving_stamp.lua")),
            },
            cluster,
            calls: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        }))
    }

    /// Whether this store talks to a Redis Cluster.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// (script calls, member writes) made by publications so far.
    #[must_use]
    pub fn publish_counters(&self) -> (u64, u64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
        )
    }

    fn global_key(&self, name: &str) -> String {
        format!("{}{{rk}}:{name}", self.options.prefix)
    }

    fn category_base(&self, category: &CategoryOrAll) -> String {
        format!("{}{{rk:{}}}", self.options.prefix, escape(category.as_str()))
    }

    fn totals_key(&self, category: &CategoryOrAll, generation: u64) -> String {
        format!("{}:totals:v{generation}", self.category_base(category))
    }

    /// The four keys of a span: popular, units and revenue zsets, then the detail hash.
    fn span_keys(&self, category: &CategoryOrAll, span: &Span, generation: u64) -> [String; 4] {
        let base = self.category_base(category);
        let field = span_field(span);
        let [p, u, r] =
            RankerName::ALL.map(|ranker| format!("{base}:{}:{field}:v{generation}", ranker.as_str()));
        [p, u, r, format!("{base}:detail:{field}:v{generation}")]
    }

    /// Takes or renews the publisher lease for `owner`. True while `owner` holds it.
    pub async fn hold_lease(&self, owner: &str, ttl_millis: u64) -> Result<bool, StoreError> {
        let lease = self.global_key("lease");
        let held: i64 = self
            .connection
            .invoke(self.scripts.lease.key(&lease).arg(owner).arg(ttl_millis))
            .await?;
        Ok(held == 1)
    }

    /// Gives the lease up if `owner` holds it (clean shutdown), so another instance takes over at once.
    pub async fn release_lease(&self, owner: &str) -> Result<(), StoreError> {
        // Expiring it now is enough; a renewal by `owner` afterwards is harmless.
        if self.hold_lease(owner, 1).await? {
            tracing::debug!("publisher lease released");
        }
        Ok(())
    }

    /// Hands out a fresh generation number.
    pub async fn new_generation(&self) -> Result<u64, StoreError> {
        let key = self.global_key("generation");
        let generation: u64 = self.connection.query(redis::cmd("INCR").arg(&key)).await?;
        // Kept far longer than any span, so numbers are not reused while their keys may live.
        let _: i64 = self
            .connection
            .query(redis::cmd("EXPIRE").arg(&key).arg(400 * 86_400))
            .await?;
        Ok(generation)
    }

    /// The active-version pointer, `None` when there is none (nothing published yet, or lost).
    pub async fn active(&self) -> Result<Option<Active>, StoreError> {
        let fields: HashMap<String, String> = self
            .connection
            .query(redis::cmd("HGETALL").arg(self.global_key("active")))
            .await?;
        let (Some(generation), Some(seq)) = (fields.get("generation"), fields.get("seq")) else {
            return Ok(None);
        };
        let optional = |name: &str| fields.get(name).filter(|v| !v.is_empty());
        Ok(Some(Active {
            generation: parse_number(generation, "generation")?,
            seq: parse_number(seq, "seq")?,
            as_of_millis: optional("asOf").map(|v| parse_number(v, "asOf")).transpose()?,
            popular_version: optional("popular")
                .map(|v| parse_number(v, "policy version"))
                .transpose()?
                .unwrap_or(1),
            depth: optional("depth").map(|v| parse_number(v, "depth")).transpose()?,
            rebuild_requested: optional("rebuild").is_some(),
        }))
    }

    /// Asks the publisher (whichever instance holds the lease) to rebuild into a fresh generation.
    pub async fn request_rebuild(&self) -> Result<(), StoreError> {
        let _: i64 = self
            .connection
            .query(
                redis::cmd("HSET")
                    .arg(self.global_key("active"))
                    .arg("rebuild")
                    .arg(1),
            )
            .await?;
        Ok(())
    }

    /// Moves the pointer to `active.generation` (`switch`), or records newer data in the current one.
    pub async fn stamp(&self, owner: &str, active: &Active, switch: bool) -> Result<Stamped, StoreError> {
        let ttl_millis = 2 * self.options.grace_millis.max(60_000);
        let seq: i64 = self
            .connection
            .invoke(
                self.scripts
                    .stamp
                    .key(self.global_key("active"))
                    .key(self.global_key("lease"))
                    .arg(owner)
                    .arg(active.generation)
                    .arg(active.as_of_millis.map(|m| m.to_string()).unwrap_or_default())
                    .arg(active.popular_version)
                    .arg(active.depth.map(|d| d.to_string()).unwrap_or_default())
                    .arg(ttl_millis)
                    .arg(if switch { "switch" } else { "stamp" }),
            )
            .await?;
        Ok(match seq {
            -1 => Stamped::NotLeader,
            -2 => Stamped::Lost,
            seq => Stamped::Done(seq as u64),
        })
    }

    /// Writes `publications` into `generation`: one script call per category (more only for very large
    /// batches), each atomic in its slot. `now_millis` is the application clock, from which each key's TTL
    /// (span end + grace) is computed.
    pub async fn publish(
        &self,
        generation: u64,
        publications: &[SpanPublication],
        zone: &Zone,
        now_millis: i64,
    ) -> Result<Published, StoreError> {
        let mut by_category: HashMap<&CategoryOrAll, Vec<&SpanPublication>> = HashMap::new();
        for publication in publications {
            by_category
                .entry(&publication.category)
                .or_default()
                .push(publication);
        }
        let mut calls = Vec::new();
        for (category, spans) in &by_category {
            let mut start = 0;
            while start < spans.len() {
                let mut end = start;
                let mut args = 0;
                while end < spans.len()
                    && (end == start || args + 2 * spans[end].writes() < MAX_ARGS_PER_CALL)
                {
                    args += 2 * spans[end].writes() + 10;
                    end += 1;
                }
                calls.push(self.publish_call(generation, category, &spans[start..end], zone, now_millis));
                start = end;
            }
        }
        let count = calls.len() as u64;
        let results = futures_util::future::join_all(calls).await;
        let mut writes = 0;
        let mut lost = false;
        for result in results {
            match result? {
                Some(n) => writes += n,
                None => lost = true,
            }
        }
        self.calls.fetch_add(count, Ordering::Relaxed);
        self.writes.fetch_add(writes, Ordering::Relaxed);
        Ok(if lost {
            Published::Lost
        } else {
            Published::Applied { writes, calls: count }
        })
    }

    /// One script call; `None` when the script found the data lost.
    async fn publish_call(
        &self,
        generation: u64,
        category: &CategoryOrAll,
        spans: &[&SpanPublication],
        zone: &Zone,
        now_millis: i64,
    ) -> Result<Option<u64>, StoreError> {
        let mut invocation = self.scripts.publish.prepare_invoke();
        invocation.key(self.totals_key(category, generation));
        invocation.arg(spans.len());
        for publication in spans {
            for key in self.span_keys(category, &publication.span, generation) {
                invocation.key(key);
            }
            let end_millis = publication.span.end_hour_exclusive(zone).start_millis();
            let ttl = (end_millis - now_millis).max(0) + self.options.grace_millis.max(1);
            invocation
                .arg(span_field(&publication.span))
                .arg(match (publication.replace, publication.existing) {
                    (false, _) => "0",
                    (true, false) => "1",
                    (true, true) => "2",
                })
                .arg(ttl);
            for total in publication.totals {
                invocation.arg(total);
            }
            for ranking in &publication.rankings {
                invocation.arg(ranking.len());
            }
            invocation.arg(publication.details.len());
            for ranking in &publication.rankings {
                for (product, key) in ranking {
                    invocation
                        .arg(product.as_str())
                        .arg(key.map(|k| k.to_string()).unwrap_or_default());
                }
            }
            for (product, detail) in &publication.details {
                invocation.arg(product.as_str()).arg(
                    detail
                        .map(|(metrics, carry)| detail_value(&metrics, carry))
                        .unwrap_or_default(),
                );
            }
        }
        let reply: redis::Value = self.connection.invoke(&invocation).await?;
        match reply {
            redis::Value::Int(writes) => Ok(Some(writes as u64)),
            _ => Ok(None),
        }
    }

    /// Listed products per ranker of every span of `category` served in `generation` (for checking a
    /// rebuild before switching to it).
    pub async fn totals(
        &self,
        category: &CategoryOrAll,
        generation: u64,
    ) -> Result<HashMap<String, [usize; 3]>, StoreError> {
        let raw: HashMap<String, String> = self
            .connection
            .query(redis::cmd("HGETALL").arg(self.totals_key(category, generation)))
            .await?;
        raw.into_iter()
            .map(|(field, value)| {
                let mut parts = value.split(' ').map(|n| parse_number::<usize>(n, "total"));
                let mut next = || {
                    parts
                        .next()
                        .unwrap_or_else(|| Err(StoreError::Corrupt(format!("totals {value:?}"))))
                };
                Ok((field.clone(), [next()?, next()?, next()?]))
            })
            .collect()
    }

    /// Lets every key of `generation` in `categories` expire after the grace period (a replaced version).
    pub async fn retire(&self, generation: u64, categories: &[CategoryOrAll]) -> Result<(), StoreError> {
        let grace = self.options.grace_millis.max(1);
        for category in categories {
            let totals = self.totals_key(category, generation);
            let fields: Vec<String> = self.connection.query(redis::cmd("HKEYS").arg(&totals)).await?;
            let base = self.category_base(category);
            let mut pipeline = redis::pipe();
            for field in &fields {
                for name in RankerName::ALL
                    .map(RankerName::as_str)
                    .into_iter()
                    .chain(["detail"])
                {
                    pipeline
                        .cmd("PEXPIRE")
                        .arg(format!("{base}:{name}:{field}:v{generation}"))
                        .arg(grace)
                        .ignore();
                }
            }
            pipeline.cmd("PEXPIRE").arg(&totals).arg(grace).ignore();
            let () = self.connection.pipeline(&pipeline).await?;
        }
        Ok(())
    }

    /// A read script's call on one served ranking: KEYS zset, detail hash, totals hash; ARGV[1] the span.
    fn read_call<'a>(
        &self,
        script: &'a Script,
        generation: u64,
        ranker: RankerName,
        category: &CategoryOrAll,
        span: &Span,
    ) -> redis::ScriptInvocation<'a> {
        let keys = self.span_keys(category, span, generation);
        let mut call = script.prepare_invoke();
        call.key(&keys[ranker_slot(ranker)])
            .key(&keys[3])
            .key(self.totals_key(category, generation))
            .arg(span_field(span));
        call
    }

    /// A page of a served ranking, or `None` when `generation` does not serve this span.
    pub async fn top(
        &self,
        generation: u64,
        ranker: RankerName,
        category: &CategoryOrAll,
        span: &Span,
        offset: usize,
        limit: usize,
    ) -> Result<Option<ServedPage>, StoreError> {
        let last = offset.saturating_add(limit).saturating_sub(1);
        let mut call = self.read_call(&self.scripts.top, generation, ranker, category, span);
        call.arg(offset).arg(last).arg(ranker_slot(ranker) + 1);
        let reply: redis::Value = self.connection.invoke(&call).await?;
        if matches!(reply, redis::Value::Nil) {
            return Ok(None);
        }
        let mut reply = Reply::new(reply)?;
        let total: usize = parse_number(&reply.string()?, "total")?;
        let mut entries = reply.array()?;
        let mut details = reply.array()?;
        let mut items = Vec::new();
        while !entries.is_empty() {
            let member = entries.string()?;
            let key: f64 = parse_number(&entries.string()?, "score")?;
            let (metrics, carry) = parse_detail(&details.string()?)?;
            items.push(RankedItem {
                rank: offset + items.len() + 1,
                product: ProductId::parse(&member)
                    .map_err(|e| StoreError::Corrupt(format!("served member {member:?}: {e}")))?,
                score: -key + 0.0,
                metrics,
                carry: if ranker == RankerName::Popular { carry } else { 0.0 },
            });
        }
        Ok(Some(ServedPage { total, items }))
    }

    /// A product's place in a served ranking, or `None` when `generation` does not serve this span.
    pub async fn rank(
        &self,
        generation: u64,
        ranker: RankerName,
        category: &CategoryOrAll,
        span: &Span,
        product: &ProductId,
    ) -> Result<Option<ServedRank>, StoreError> {
        let mut call = self.read_call(&self.scripts.rank, generation, ranker, category, span);
        call.arg(product.as_str()).arg(ranker_slot(ranker) + 1);
        let reply: redis::Value = self.connection.invoke(&call).await?;
        if matches!(reply, redis::Value::Nil) {
            return Ok(None);
        }
        let mut reply = Reply::new(reply)?;
        let total: usize = parse_number(&reply.string()?, "total")?;
        let rank = reply.int()?;
        let key = reply.opt_f64()?;
        let (metrics, carry) = parse_detail(&reply.string()?)?;
        Ok(Some(ServedRank {
            total,
            rank: usize::try_from(rank).ok().map(|r| r + 1),
            score: key.map(|k| -k + 0.0),
            metrics,
            carry: if ranker == RankerName::Popular { carry } else { 0.0 },
        }))
    }

    /// Deletes every serving key under this prefix on a standalone server (tests, and the "Redis was
    /// flushed" drill). Answers an error on a cluster.
    pub async fn purge(&self) -> Result<u64, StoreError> {
        self.connection
            .purge_matching(&format!("{}{{rk*", self.options.prefix))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_spans_are_the_current_periods_and_the_windows_ending_now() {
        let zone = Zone::utc();
        let now = Hour(500_000);
        let spans = hot_spans(now, &zone);
        assert_eq!(spans.len(), 8);
        assert!(spans.iter().all(|span| is_hot(span, now, &zone)));
        let earlier_window = Span::Window {
            len: WindowLen::D7,
            end: now.plus(-1),
        };
        assert!(!is_hot(&earlier_window, now, &zone));
        let yesterday = PeriodKey::containing(PeriodKind::Daily, now.plus(-24), &zone);
        assert!(!is_hot(&Span::Period(yesterday), now, &zone));
    }
}
