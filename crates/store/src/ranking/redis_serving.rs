//! The Redis serving store: the hot rankings as Redis sorted sets, shared by every instance, on a
//! standalone Redis or a Redis Cluster.
//!
//! The in-process [`RankingEngine`](super::engine::RankingEngine) computes; this store holds what it
//! computed where every instance can read it. The hot spans are dealt into [`SPAN_GROUPS`] span groups
//! shared out among the live instances; each group is published by the holder of its lease, and every
//! instance reads every group. The source of truth stays PostgreSQL or SQLite: everything here can be rebuilt
//! from it, and is, whenever it is lost.
//!
//! # Key layout (`P` = the configured prefix, `<c>` = category or `all`, `<g>` = generation)
//! | key | type | holds |
//! |---|---|---|
//! | `P{rk:<c>}:<ranker>:<span>:v<g>` | zset | product → **negated** score: ascending order is score descending, then product id ascending (bytes), exactly the engine's order |
//! | `P{rk:<c>}:detail:<span>:v<g>` | hash | product → `views likes units sales carry` |
//! | `P{rk:<c>}:<ranker or detail>:<span>:v<g>:build` | zset / hash | a replace too big for one call, while it is built (renamed over the served key by its last call) |
//! | `P{rk:<c>}:totals:v<g>` | hash | span → listed products per ranker (`popular units revenue`); a span served in this generation has a field here |
//! | `P{rk}:active` | hash | the active-version pointer: `seq` (bumped per publication), `depth`, `rebuild` (the latest rebuild request's number), and per span group `g<i>` = `generation asOf popular rebuilt` |
//! | `P{rk}:lease:<i>` | string | span group `i`'s lease: owner id, with a TTL |
//! | `P{rk}:publishers` | zset | live publishers: owner id → expiry (ms of Redis time) |
//! | `P{rk}:deal` | hash | the current deal: `live` (the publishers it was made for), `at`, `total`, and `g<i>` → owner |
//! | `P{rk}:group-cost` | hash | `g<i>` → what publishing the group cost so far: µs of its publishers' engine time plus its member writes (what the deal weighs) |
//! | `P{rk}:demand` | zset | `<span>|<c>` → last read (ms): the hot spans in demand |
//! | `P{rk}:generation` | counter | the last generation handed out |
//!
//! `<span>` is `hourly:2026071713`, `daily:20260717`, `weekly:2026W29`, `monthly:202607`, `yearly:2026` (local keys), or
//! `1h|1d|7d|30d:<end hour>` for a window (end hour = UTC hours since the epoch). Every key of one
//! category shares the hash tag `{rk:<c>}`, so a Lua script writes a category's spans in one slot; the
//! pointer, the leases, the deal and the counter share `{rk}`.
//!
//! # Bounded script calls
//! Redis runs one script at a time, and the same Redis may serve the waiting room, so no publish call
//! carries more than [`ServingOptions::max_writes_per_call`] member writes (default 1,000): small spans
//! share a call, a big one (a rebuild of a 1M-product span) takes as many calls as it needs, in order.
//! A big replace is built in `:build` keys and renamed over the served keys by its last call, which also
//! writes the span's totals, so readers (and the rebuild's totals check) see the old span or the whole
//! new one. A big change set is applied in place a few products at a time, each product whole.
//!
//! # Span groups
//! [`span_group`] puts each (category, span) in one of [`SPAN_GROUPS`] groups. `serving_groups.lua`
//! registers a publisher, deals the groups among the live ones by measured cost (heaviest first to the
//! least loaded) whenever the live set changes, and holds the caller's leases; a group leased to a former
//! holder is taken only once that holder gives it up or its lease runs out.
//!
//! # Versions
//! A publisher writes all its groups into one generation of its own. A rebuild (groups gained, new policy
//! version, `rankgate rebuild`, loss of data) writes every hot span of its groups under a fresh generation
//! beside the served one, checks the totals it wrote, then points its groups' entries at it in one script
//! (fenced by every one of their leases, so a publisher that lost one cannot switch). The old generation's
//! keys get a short TTL (the grace period) so reads that started on them finish.
//!
//! # Lifetimes
//! Every span key expires at its span's end plus the grace period; the pointer and the leases expire
//! when no publisher renews them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redis::Script;

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, WindowLen, Zone};
use rankgate_core::ranker::RankerName;

use super::engine::RankedItem;
use super::publication::SpanPublication;
use crate::queue::StoreError;
pub use crate::redis_connection::Timeouts;
use crate::redis_connection::{escape, Connection, Reply};

/// What went wrong talking to the Redis serving store. Every message says what failed and what to do
/// next; none carries a credential (connection errors are scrubbed where they are made, see
/// [`crate::redact`]).
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    /// Redis could not be reached, timed out, or refused the command.
    #[error(
        "redis serving store unreachable ({0}); hot rankings are answered from each instance's engine, \
         marked stale, until it answers again: check that Redis is running and that --redis points at it"
    )]
    Unreachable(String),
    /// Redis holds serving data this version cannot read.
    #[error(
        "redis serving data is not what this version reads ({0}); run `rankgate rebuild` to republish the \
         rankings from the source of truth"
    )]
    Corrupt(String),
    /// The configured key prefix has a brace, which would move the keys' hash tag.
    #[error(
        "redis_prefix {prefix:?} must not contain '{{' or '}}' (they would move the keys' hash tag): \
         choose a prefix without braces"
    )]
    PrefixHasBraces {
        /// The prefix as configured.
        prefix: String,
    },
}

/// The shared Redis connection reports the queue store's error type; here it means the serving store.
impl From<StoreError> for ServingError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(message) => ServingError::Unreachable(message),
            StoreError::Corrupt(message) => ServingError::Corrupt(message),
            // Only the queue's own scripts answer this; a serving call never does.
            other @ StoreError::TooManyQueues { .. } => ServingError::Corrupt(other.to_string()),
        }
    }
}

/// Options of the serving store.
#[derive(Debug, Clone)]
pub struct ServingOptions {
    /// Prefix of every key (shared with the waiting room's keys; the hash tags differ).
    pub prefix: String,
    /// Connect and response timeouts.
    pub timeouts: Timeouts,
    /// How long keys outlive their span, and how long a replaced generation stays readable (ms).
    pub grace_millis: i64,
    /// Most member writes (sorted-set plus detail entries) one publish script call carries, so no single
    /// call keeps a Redis that also serves the waiting room busy for long. At least 4 (one product's
    /// entries in every ranker and its detail).
    pub max_writes_per_call: usize,
}

impl Default for ServingOptions {
    fn default() -> Self {
        ServingOptions {
            prefix: "rankgate:".into(),
            timeouts: Timeouts::default(),
            grace_millis: 3_600_000,
            max_writes_per_call: DEFAULT_MAX_WRITES_PER_CALL,
        }
    }
}

/// What the active-version pointer says of one span group: where reads of its spans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Active {
    /// Generation of the group's served keys.
    pub generation: u64,
    /// The pointer's sequence number, bumped by every publication of any group: equal numbers mean
    /// equal data.
    pub seq: u64,
    /// Time of the latest ingest the group's served data includes.
    pub as_of_millis: Option<i64>,
    /// The `popular` policy version the served scores come from.
    pub popular_version: u32,
    /// Top-N-only depth, or `None` when every member is served.
    pub depth: Option<usize>,
    /// An operator asked for a rebuild (`rankgate rebuild`) that this group has not answered yet.
    pub rebuild_requested: bool,
}

/// The active-version pointer: one entry per span group (module docs: span groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// Bumped by every publication of any group.
    pub seq: u64,
    /// Top-N-only depth, or `None` when every member is served.
    pub depth: Option<usize>,
    /// The latest rebuild request (`rankgate rebuild`), 0 when none was made.
    pub rebuild: u64,
    /// Per group (index = group), what it serves; `None` for a group not published yet.
    pub groups: Vec<Option<GroupPointer>>,
}

impl Pointer {
    /// Where reads of `group` go, `None` while nothing of it is published.
    #[must_use]
    pub fn active(&self, group: usize) -> Option<Active> {
        let entry = self.groups.get(group)?.as_ref()?;
        Some(Active {
            generation: entry.generation,
            seq: self.seq,
            as_of_millis: entry.as_of_millis,
            popular_version: entry.popular_version,
            depth: self.depth,
            rebuild_requested: self.rebuild > entry.rebuilt,
        })
    }
}

/// One span group's entry in the pointer: `generation asOf popular rebuilt` (`-` for no asOf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupPointer {
    /// Generation of the group's served keys.
    pub generation: u64,
    /// Time of the latest ingest its served data includes.
    pub as_of_millis: Option<i64>,
    /// The `popular` policy version its scores come from.
    pub popular_version: u32,
    /// The latest rebuild request it was rebuilt after.
    pub rebuilt: u64,
}

impl GroupPointer {
    fn parse(raw: &str) -> Result<GroupPointer, ServingError> {
        let corrupt = || {
            ServingError::Corrupt(format!(
                "serving group pointer {raw:?} is not 'generation asOf popular rebuilt'"
            ))
        };
        let mut parts = raw.split(' ');
        let mut next = || parts.next().ok_or_else(corrupt);
        let generation = parse_number(next()?, "generation")?;
        let as_of = next()?;
        let as_of_millis = (as_of != "-").then(|| parse_number(as_of, "asOf")).transpose()?;
        let popular_version = parse_number(next()?, "policy version")?;
        let rebuilt = parse_number(next()?, "rebuild request")?;
        Ok(GroupPointer {
            generation,
            as_of_millis,
            popular_version,
            rebuilt,
        })
    }
}

/// How many span groups the hot spans are dealt into: `all`'s nine hot spans one group each, and every
/// category's spans hashed over 27 more, so any number of publishers up to 36 gets a fair share of the
/// work (see [`span_group`]).
pub const SPAN_GROUPS: usize = 36;
/// How old a deal of the span groups may get before it is made again from the costs measured since
/// (a membership change makes one at once). Each new deal moves some groups, and whoever gains one
/// rebuilds its groups, so not often, and a new deal is kept only if it lightens the heaviest
/// publisher by a tenth.
const REDEAL_MILLIS: u64 = 10 * 60 * 1000;
/// Measured cost (about µs of publisher CPU, `SpanPublication::publisher_cost`) from which a deal
/// trusts the costs: the first deals of a fleet (before anything was published) split the groups
/// evenly by count, and one more deal follows once this much was measured. After that, one is tried each time the measured total doubles (early costs are a poor
/// guide: spans grow and categories arrive), kept like a periodic one only if it lightens the heaviest
/// publisher by a tenth.
const SETTLED_COST: u64 = 100_000;
/// The groups of `all`'s spans, one per hot span kind.
const ALL_GROUPS: usize = 9;

/// The span group of `category` over `span`, by the span's kind (the hour, day, …, 30-day window) and
/// the category, never by the date, so a span stays in its group as periods turn. `all` takes the first
/// nine groups, one per kind: every event moves it, so its spans are the heaviest and must not share a
/// publisher. A category is hashed with the kind (FNV-1a, fixed here, so every instance and version
/// agrees) over the other 27, so a big category's kinds spread over publishers too.
#[must_use]
pub fn span_group(category: &CategoryOrAll, span: &Span) -> usize {
    let kind = match span {
        Span::Period(key) => PeriodKind::ALL.iter().position(|k| *k == key.kind()).unwrap_or(0),
        Span::Window { len, .. } => {
            PeriodKind::ALL.len() + WindowLen::ALL.iter().position(|l| l == len).unwrap_or(0)
        }
    };
    match category {
        CategoryOrAll::All => kind % ALL_GROUPS,
        CategoryOrAll::Category(name) => {
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in name.as_str().bytes().chain([0xff, kind as u8]) {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
            ALL_GROUPS + (hash % (SPAN_GROUPS - ALL_GROUPS) as u64) as usize
        }
    }
}

impl Active {
    /// The policy version answers read at this pointer report for `ranker`: the published `popular`
    /// version, 1 for the rankers that have no versions, and `None` for `trending`, which Redis does
    /// not serve ([`PUBLISHED_RANKERS`]).
    #[must_use]
    pub fn policy_version(&self, ranker: RankerName) -> Option<u32> {
        match ranker {
            RankerName::Popular => Some(self.popular_version),
            RankerName::Units | RankerName::Revenue => Some(1),
            RankerName::Trending => None,
        }
    }
}

/// The rankers Redis serves, in the order of their slots in the span keys and scripts.
///
/// `trending` is not among them: a running period's `trending` scores all move when the hour turns (E is
/// the current hour), so publishing it would rewrite every running span whole once an hour, and each
/// instance's engine computes the same bits from the shared source of truth anyway. Its reads are
/// answered by the engine ([`ServedGeneration`] declines them).
pub const PUBLISHED_RANKERS: [RankerName; 3] = [RankerName::Popular, RankerName::Units, RankerName::Revenue];

impl Active {
    /// Whether answers of `ranker` can be read at this pointer.
    #[must_use]
    pub fn serves(&self, ranker: RankerName) -> bool {
        self.policy_version(ranker).is_some()
    }
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
    /// A change-only span was missing, or a span being built lost its staged part: the data was lost.
    /// That category's calls stopped at the one that saw it (which wrote nothing).
    Lost,
}

/// What [`RedisServing::stamp`] does to the active-version pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StampKind {
    /// Point at `active.generation`, a generation just built in full (and clear a rebuild request).
    SwitchGeneration,
    /// Say that the generation the pointer names got newer data (`asOf`, policy version, depth); only if
    /// it is still the one pointed at, else [`Stamped::Lost`].
    NewerDataInCurrent,
}

impl StampKind {
    /// The mode argument of `serving_stamp.lua`.
    fn script_mode(self) -> &'static str {
        match self {
            StampKind::SwitchGeneration => "switch",
            StampKind::NewerDataInCurrent => "stamp",
        }
    }
}

/// Result of moving the pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamped {
    /// Done; the pointer's new sequence number.
    Done(u64),
    /// This publisher no longer holds every lease of the groups it named.
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

/// Several products' places read from Redis, in the order asked.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedSort {
    /// Listed products in the whole ranking.
    pub total: usize,
    /// Per product asked: 1-based rank (`None` when Redis does not hold it), score, metrics.
    pub places: Vec<(Option<usize>, Option<f64>, Metrics)>,
}

struct Scripts {
    publish: Script,
    top: Script,
    rank: Script,
    sort: Script,
    groups: Script,
    stamp: Script,
}

/// Default of [`ServingOptions::max_writes_per_call`]: 1,000 member writes keep one call to about a
/// millisecond of Redis time.
pub const DEFAULT_MAX_WRITES_PER_CALL: usize = 1_000;

/// Where a piece sits in its span's publication (the script's `stage` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The whole span in this one piece.
    Whole,
    First,
    Middle,
    Last,
}

impl Stage {
    fn code(self) -> &'static str {
        match self {
            Stage::Whole => "w",
            Stage::First => "f",
            Stage::Middle => "m",
            Stage::Last => "l",
        }
    }
}

type RankingEntries = [(ProductId, Option<f64>)];
type DetailEntries = [(ProductId, Option<(Metrics, f64)>)];

/// A bounded part of one span's publication: contiguous slices of its four entry lists.
#[derive(Debug, Clone, Copy)]
struct Piece<'a> {
    publication: &'a SpanPublication,
    stage: Stage,
    rankings: [&'a RankingEntries; 3],
    details: &'a DetailEntries,
    /// Members the staging keys hold before this piece (per ranker, then detail): what the earlier
    /// pieces of a replace added, checked by the script so a loss between calls is seen.
    staged_before: [usize; 4],
}

impl Piece<'_> {
    fn writes(&self) -> usize {
        self.rankings.iter().map(|r| r.len()).sum::<usize>() + self.details.len()
    }
}

/// Splits `publication` into pieces of at most `chunk` member writes (one piece when it fits).
///
/// A replace is cut anywhere (it is built in staging keys and switched whole). A change set is cut
/// between products, so a product's entries in every ranker and its detail land in the same call and a
/// reader never sees its new score beside its old metrics; that needs the lists in product id order,
/// which is how the engine hands changes out (otherwise it is cut anywhere too).
fn pieces(publication: &SpanPublication, chunk: usize) -> Vec<Piece<'_>> {
    let chunk = chunk.max(4);
    let lists: [usize; 4] = [
        publication.rankings[0].len(),
        publication.rankings[1].len(),
        publication.rankings[2].len(),
        publication.details.len(),
    ];
    let whole = |stage| Piece {
        publication,
        stage,
        rankings: [0, 1, 2].map(|r| &publication.rankings[r][..]),
        details: &publication.details[..],
        staged_before: [0; 4],
    };
    if publication.writes() <= chunk {
        return vec![whole(Stage::Whole)];
    }
    let id_of = |list: usize, i: usize| -> &ProductId {
        if list < 3 {
            &publication.rankings[list][i].0
        } else {
            &publication.details[i].0
        }
    };
    let by_product =
        !publication.replace && (0..4).all(|l| (1..lists[l]).all(|i| id_of(l, i - 1) < id_of(l, i)));
    // Cut points: for each piece, the end index in each list.
    let mut ends: Vec<[usize; 4]> = Vec::new();
    let mut at = [0usize; 4];
    while at != lists {
        let mut budget = chunk;
        if by_product {
            loop {
                let next = (0..4)
                    .filter(|&l| at[l] < lists[l])
                    .map(|l| id_of(l, at[l]))
                    .min();
                let Some(next) = next.cloned() else { break };
                let holders: Vec<usize> = (0..4)
                    .filter(|&l| at[l] < lists[l] && *id_of(l, at[l]) == next)
                    .collect();
                if holders.len() > budget {
                    break;
                }
                budget -= holders.len();
                for l in holders {
                    at[l] += 1;
                }
            }
        } else {
            for l in 0..4 {
                let take = budget.min(lists[l] - at[l]);
                at[l] += take;
                budget -= take;
            }
        }
        ends.push(at);
    }
    let mut start = [0usize; 4];
    let mut staged = [0usize; 4];
    let count = ends.len();
    ends.into_iter()
        .enumerate()
        .map(|(n, end)| {
            let piece = Piece {
                publication,
                stage: match n {
                    0 => Stage::First,
                    n if n + 1 == count => Stage::Last,
                    _ => Stage::Middle,
                },
                rankings: [0, 1, 2].map(|r| &publication.rankings[r][start[r]..end[r]]),
                details: &publication.details[start[3]..end[3]],
                staged_before: staged,
            };
            for (staged, ranking) in staged.iter_mut().zip(piece.rankings) {
                *staged += ranking.iter().filter(|(_, key)| key.is_some()).count();
            }
            staged[3] += piece.details.iter().filter(|(_, d)| d.is_some()).count();
            start = end;
            piece
        })
        .collect()
}

/// The serving store. Cheap to share behind an `Arc`.
pub struct RedisServing {
    connection: Connection,
    options: ServingOptions,
    scripts: Scripts,
    cluster: bool,
    calls: AtomicU64,
    writes: AtomicU64,
    largest_call: AtomicU64,
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

/// How a read hot span is named in the demand set: its span field and category, `|` between (the span
/// field never holds one).
#[must_use]
pub fn demand_member(category: &CategoryOrAll, span: &Span) -> String {
    format!("{}|{}", span_field(span), category.as_str())
}

/// The hot spans at `now_hour`, the ones Redis serves: the current hour, day, ISO week, month and year, and the
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

/// `ranker`'s slot in the span keys, `None` for a ranker Redis does not serve.
fn ranker_slot(ranker: RankerName) -> Option<usize> {
    PUBLISHED_RANKERS.iter().position(|r| *r == ranker)
}

fn detail_value(metrics: &Metrics, carry: f64) -> String {
    format!(
        "{} {} {} {} {carry}",
        metrics.views, metrics.likes, metrics.units, metrics.sales
    )
}

/// Parses a detail value; empty (not held) is zero metrics and no carry.
fn parse_detail(raw: &str) -> Result<(Metrics, f64), ServingError> {
    if raw.is_empty() {
        return Ok((Metrics::default(), 0.0));
    }
    let corrupt = || {
        ServingError::Corrupt(format!(
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

fn parse_number<T: std::str::FromStr>(raw: &str, what: &str) -> Result<T, ServingError> {
    raw.parse()
        .map_err(|_| ServingError::Corrupt(format!("serving {what} {raw:?} is not a number")))
}

impl RedisServing {
    /// Connects: one URL is a standalone server (or a cluster's seed, if it says it runs in cluster mode),
    /// several URLs are the nodes of a cluster.
    pub async fn connect(
        urls: &[String],
        options: ServingOptions,
    ) -> Result<Arc<RedisServing>, ServingError> {
        if options.prefix.contains(['{', '}']) {
            return Err(ServingError::PrefixHasBraces {
                prefix: options.prefix,
            });
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
                sort: script(include_str!("lua/serving_sort.lua")),
                groups: script(include_str!("lua/serving_groups.lua")),
                stamp: script(include_str!("lua/serving_stamp.lua")),
            },
            cluster,
            calls: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            largest_call: AtomicU64::new(0),
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

    /// The most member writes any single publish call carried so far (never above
    /// [`ServingOptions::max_writes_per_call`]).
    #[must_use]
    pub fn largest_call_writes(&self) -> u64 {
        self.largest_call.load(Ordering::Relaxed)
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
            PUBLISHED_RANKERS.map(|ranker| format!("{base}:{}:{field}:v{generation}", ranker.as_str()));
        [p, u, r, format!("{base}:detail:{field}:v{generation}")]
    }

    /// Where a replace too big for one call is built before its last call moves it over
    /// [`Self::span_keys`]: the same names with `:build` appended (same hash tag, same slot).
    fn staging_keys(&self, category: &CategoryOrAll, span: &Span, generation: u64) -> [String; 4] {
        self.span_keys(category, span, generation)
            .map(|key| format!("{key}:build"))
    }

    /// Registers `owner` as a live publisher for `ttl_millis` and holds its share of the span groups
    /// (module docs: span groups): renews the groups dealt to it, takes those free, gives up those dealt
    /// to another. Returns the groups it holds now, ascending.
    pub async fn hold_groups(&self, owner: &str, ttl_millis: u64) -> Result<Vec<usize>, ServingError> {
        self.deal_groups(owner, ttl_millis, "join").await
    }

    /// Gives every group `owner` holds up and leaves the publishers (clean shutdown), so the others
    /// take its groups over at their next tick.
    pub async fn leave_groups(&self, owner: &str) -> Result<(), ServingError> {
        self.deal_groups(owner, 1, "leave").await.map(drop)
    }

    async fn deal_groups(
        &self,
        owner: &str,
        ttl_millis: u64,
        mode: &str,
    ) -> Result<Vec<usize>, ServingError> {
        let mut invocation = self.scripts.groups.prepare_invoke();
        invocation
            .key(self.global_key("publishers"))
            .key(self.global_key("deal"))
            .key(self.global_key("group-cost"));
        for group in 0..SPAN_GROUPS {
            invocation.key(self.lease_key(group));
        }
        invocation
            .arg(owner)
            .arg(ttl_millis.max(1))
            .arg(mode)
            .arg(REDEAL_MILLIS)
            .arg(SETTLED_COST);
        let held: Vec<usize> = self.connection.invoke(&invocation).await?;
        Ok(held)
    }

    /// Adds what one publication round cost per span group ([`SpanPublication::publisher_cost`]: the
    /// engine's time on the span and its member writes) to the groups' measured costs, by which the next
    /// deal balances the publishers ([`Self::hold_groups`]). Only spans published before count: a span's
    /// first, whole publication (a new category, a span newly read) is a one-off, and early in a fleet's
    /// life it would outweigh the steady work the deal is meant to balance.
    pub async fn add_group_costs(&self, publications: &[SpanPublication]) -> Result<(), ServingError> {
        let mut costs = [0u64; SPAN_GROUPS];
        for publication in publications.iter().filter(|publication| publication.existing) {
            costs[span_group(&publication.category, &publication.span)] += publication.publisher_cost();
        }
        if costs.iter().all(|cost| *cost == 0) {
            return Ok(());
        }
        let key = self.global_key("group-cost");
        let mut pipeline = redis::pipe();
        for (group, cost) in costs.iter().enumerate().filter(|(_, cost)| **cost > 0) {
            pipeline
                .cmd("HINCRBY")
                .arg(&key)
                .arg(format!("g{group}"))
                .arg(*cost)
                .ignore();
        }
        pipeline
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(400_i64 * 86_400_000)
            .ignore();
        let () = self.connection.pipeline(&pipeline).await?;
        Ok(())
    }

    /// Publishers registered within their ttl (for `rankgate rebuild`: is any instance publishing?).
    pub async fn live_publishers(&self) -> Result<usize, ServingError> {
        let key = self.global_key("publishers");
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("TIME")
            .cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        let (time, members): ((String, String), Vec<(String, i64)>) =
            self.connection.pipeline(&pipeline).await?;
        let now = parse_number::<i64>(&time.0, "time")? * 1000 + parse_number::<i64>(&time.1, "time")? / 1000;
        Ok(members.iter().filter(|(_, expiry)| *expiry > now).count())
    }

    fn lease_key(&self, group: usize) -> String {
        self.global_key(&format!("lease:{group}"))
    }

    /// Hands out a fresh generation number.
    pub async fn new_generation(&self) -> Result<u64, ServingError> {
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
    pub async fn pointer(&self) -> Result<Option<Pointer>, ServingError> {
        let fields: HashMap<String, String> = self
            .connection
            .query(redis::cmd("HGETALL").arg(self.global_key("active")))
            .await?;
        let Some(seq) = fields.get("seq") else {
            return Ok(None);
        };
        let optional = |name: &str| fields.get(name).filter(|v| !v.is_empty());
        let mut groups = vec![None; SPAN_GROUPS];
        for (name, value) in &fields {
            let Some(group) = name.strip_prefix('g').and_then(|g| g.parse::<usize>().ok()) else {
                continue;
            };
            if let Some(slot) = groups.get_mut(group) {
                *slot = Some(GroupPointer::parse(value)?);
            }
        }
        Ok(Some(Pointer {
            seq: parse_number(seq, "seq")?,
            depth: optional("depth").map(|v| parse_number(v, "depth")).transpose()?,
            rebuild: optional("rebuild")
                .map(|v| parse_number(v, "rebuild request"))
                .transpose()?
                .unwrap_or(0),
            groups,
        }))
    }

    /// Asks the publishers to rebuild every group into a fresh generation; returns the request's number,
    /// which each group's pointer reports once it was rebuilt after it ([`GroupPointer::rebuilt`]).
    pub async fn request_rebuild(&self) -> Result<u64, ServingError> {
        let request: u64 = self
            .connection
            .query(
                redis::cmd("HINCRBY")
                    .arg(self.global_key("active"))
                    .arg("rebuild")
                    .arg(1),
            )
            .await?;
        Ok(request)
    }

    /// Points `groups` at `active.generation` (a generation just built in full for them, answering the
    /// rebuild request `rebuilt`), or records that their generation got newer data (`asOf`, policy
    /// version), as `kind` says; fenced by every one of their leases.
    pub async fn stamp(
        &self,
        owner: &str,
        groups: &[usize],
        active: &Active,
        rebuilt: u64,
        kind: StampKind,
    ) -> Result<Stamped, ServingError> {
        let ttl_millis = 2 * self.options.grace_millis.max(60_000);
        let mut invocation = self.scripts.stamp.prepare_invoke();
        invocation.key(self.global_key("active"));
        for group in groups {
            invocation.key(self.lease_key(*group));
        }
        invocation
            .arg(owner)
            .arg(active.generation)
            .arg(
                active
                    .as_of_millis
                    .map_or_else(|| "-".to_owned(), |m| m.to_string()),
            )
            .arg(active.popular_version)
            .arg(active.depth.map(|d| d.to_string()).unwrap_or_default())
            .arg(ttl_millis)
            .arg(kind.script_mode())
            .arg(rebuilt);
        for group in groups {
            invocation.arg(format!("g{group}"));
        }
        let seq: i64 = self.connection.invoke(&invocation).await?;
        Ok(match seq {
            -1 => Stamped::NotLeader,
            -2 => Stamped::Lost,
            seq => Stamped::Done(seq as u64),
        })
    }

    /// Writes `publications` into `generation`. Each script call carries at most
    /// [`ServingOptions::max_writes_per_call`] member writes and is atomic in its category's slot: small
    /// spans of a category share a call, a big span is split over several calls sent one after the other
    /// (a big replace is built beside the served span and switched by its last call). Categories are
    /// written concurrently. `now_millis` is the application clock, from which each key's TTL (span end +
    /// grace) is computed.
    pub async fn publish(
        &self,
        generation: u64,
        publications: &[SpanPublication],
        zone: &Zone,
        now_millis: i64,
    ) -> Result<Published, ServingError> {
        let chunk = self.options.max_writes_per_call.max(4);
        let mut by_category: Vec<(&CategoryOrAll, Vec<&SpanPublication>)> = Vec::new();
        for publication in publications {
            match by_category.iter_mut().find(|(c, _)| *c == &publication.category) {
                Some((_, spans)) => spans.push(publication),
                None => by_category.push((&publication.category, vec![publication])),
            }
        }
        let categories = by_category.into_iter().map(|(category, spans)| {
            // Pack consecutive pieces into calls of at most `chunk` writes (an empty piece counts one).
            let mut calls: Vec<Vec<Piece<'_>>> = vec![Vec::new()];
            let mut load = 0;
            for piece in spans.iter().flat_map(|publication| pieces(publication, chunk)) {
                let cost = piece.writes().max(1);
                // A later piece of a split span opens its own call: the script checks what the earlier
                // pieces staged before it writes anything, so they must have run already.
                let follows = matches!(piece.stage, Stage::Middle | Stage::Last);
                if (follows || load + cost > chunk) && !calls.last().is_some_and(Vec::is_empty) {
                    calls.push(Vec::new());
                    load = 0;
                }
                load += cost;
                calls.last_mut().expect("never empty").push(piece);
            }
            async move {
                // In order: a span's pieces build on each other. The first LOST ends the category.
                let mut writes = 0;
                let mut made = 0;
                for call in &calls {
                    made += 1;
                    match self
                        .publish_call(generation, category, call, zone, now_millis)
                        .await?
                    {
                        Some(n) => writes += n,
                        None => return Ok::<_, ServingError>((writes, made, true)),
                    }
                    let carried: usize = call.iter().map(Piece::writes).sum();
                    self.largest_call.fetch_max(carried as u64, Ordering::Relaxed);
                }
                Ok((writes, made, false))
            }
        });
        let results = futures_util::future::join_all(categories).await;
        let mut writes = 0;
        let mut count = 0;
        let mut lost = false;
        let mut failed = None;
        for result in results {
            match result {
                Ok((n, made, category_lost)) => {
                    writes += n;
                    count += made;
                    lost |= category_lost;
                }
                Err(error) => failed = Some(error),
            }
        }
        self.calls.fetch_add(count, Ordering::Relaxed);
        self.writes.fetch_add(writes, Ordering::Relaxed);
        if let Some(error) = failed {
            return Err(error);
        }
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
        pieces: &[Piece<'_>],
        zone: &Zone,
        now_millis: i64,
    ) -> Result<Option<u64>, ServingError> {
        let mut invocation = self.scripts.publish.prepare_invoke();
        invocation.key(self.totals_key(category, generation));
        invocation.arg(pieces.len());
        for piece in pieces {
            let publication = piece.publication;
            for key in self
                .span_keys(category, &publication.span, generation)
                .into_iter()
                .chain(self.staging_keys(category, &publication.span, generation))
            {
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
            for ranking in &piece.rankings {
                invocation.arg(ranking.len());
            }
            invocation.arg(piece.details.len());
            invocation.arg(piece.stage.code());
            for staged in piece.staged_before {
                invocation.arg(staged);
            }
            for ranking in &piece.rankings {
                for (product, key) in ranking.iter() {
                    invocation
                        .arg(product.as_str())
                        .arg(key.map(|k| k.to_string()).unwrap_or_default());
                }
            }
            for (product, detail) in piece.details {
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
    ) -> Result<HashMap<String, [usize; 3]>, ServingError> {
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
                        .unwrap_or_else(|| Err(ServingError::Corrupt(format!("totals {value:?}"))))
                };
                Ok((field.clone(), [next()?, next()?, next()?]))
            })
            .collect()
    }

    /// Lets every key of `generation` in `categories` expire after the grace period (a replaced version).
    pub async fn retire(&self, generation: u64, categories: &[CategoryOrAll]) -> Result<(), ServingError> {
        let grace = self.options.grace_millis.max(1);
        for category in categories {
            let totals = self.totals_key(category, generation);
            let fields: Vec<String> = self.connection.query(redis::cmd("HKEYS").arg(&totals)).await?;
            let base = self.category_base(category);
            let mut pipeline = redis::pipe();
            for field in &fields {
                for name in PUBLISHED_RANKERS
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

    /// Records that the hot spans named by `members` ([`demand_member`]) were read at `now_millis`, so
    /// the publisher keeps them published (module docs of the server's serving loop: demand). The set
    /// lives in the `{rk}` slot and expires `keep_millis` after its last write.
    pub async fn note_demand(
        &self,
        members: &[String],
        now_millis: i64,
        keep_millis: i64,
    ) -> Result<(), ServingError> {
        if members.is_empty() {
            return Ok(());
        }
        let key = self.global_key("demand");
        let mut add = redis::cmd("ZADD");
        add.arg(&key);
        for member in members {
            add.arg(now_millis).arg(member);
        }
        let mut pipeline = redis::pipe();
        pipeline
            .add_command(add)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(keep_millis.max(1))
            .ignore();
        let () = self.connection.pipeline(&pipeline).await?;
        Ok(())
    }

    /// The hot spans read at or after `since_millis` on any instance ([`demand_member`] strings); older
    /// entries are dropped on the way, so the set holds only what was read within the idle time.
    pub async fn demand_since(&self, since_millis: i64) -> Result<HashSet<String>, ServingError> {
        let key = self.global_key("demand");
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(format!("({since_millis}"))
            .ignore()
            .cmd("ZRANGEBYSCORE")
            .arg(&key)
            .arg(since_millis)
            .arg("+inf");
        let (members,): (Vec<String>,) = self.connection.pipeline(&pipeline).await?;
        Ok(members.into_iter().collect())
    }

    /// Takes `spans` out of `generation`: their totals field first (from then on reads decline them and
    /// the engine answers), then their keys. Per category, one pipeline in its slot.
    pub async fn unpublish(
        &self,
        generation: u64,
        spans: &[(CategoryOrAll, Span)],
    ) -> Result<(), ServingError> {
        let mut categories: Vec<&CategoryOrAll> = spans.iter().map(|(category, _)| category).collect();
        categories.sort_unstable();
        categories.dedup();
        for category in categories {
            let mut pipeline = redis::pipe();
            let of_category = spans.iter().filter(|(c, _)| c == category);
            for (_, span) in of_category.clone() {
                pipeline
                    .cmd("HDEL")
                    .arg(self.totals_key(category, generation))
                    .arg(span_field(span))
                    .ignore();
            }
            for (_, span) in of_category {
                pipeline
                    .cmd("DEL")
                    .arg(self.span_keys(category, span, generation).to_vec())
                    .ignore();
            }
            let () = self.connection.pipeline(&pipeline).await?;
        }
        Ok(())
    }

    /// A read script's call on one served ranking: KEYS zset, detail hash, totals hash; ARGV[1] the span.
    fn read_call<'a>(
        &self,
        script: &'a Script,
        generation: u64,
        slot: usize,
        category: &CategoryOrAll,
        span: &Span,
    ) -> redis::ScriptInvocation<'a> {
        let keys = self.span_keys(category, span, generation);
        let mut call = script.prepare_invoke();
        call.key(&keys[slot])
            .key(&keys[3])
            .key(self.totals_key(category, generation))
            .arg(span_field(span));
        call
    }

    /// A page of a served ranking, or `None` when `generation` does not serve this span (or Redis does
    /// not serve this ranker: [`PUBLISHED_RANKERS`]).
    pub async fn top(
        &self,
        generation: u64,
        ranker: RankerName,
        category: &CategoryOrAll,
        span: &Span,
        offset: usize,
        limit: usize,
    ) -> Result<Option<ServedPage>, ServingError> {
        let Some(slot) = ranker_slot(ranker) else {
            return Ok(None);
        };
        let last = offset.saturating_add(limit).saturating_sub(1);
        let mut call = self.read_call(&self.scripts.top, generation, slot, category, span);
        call.arg(offset).arg(last).arg(slot + 1);
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
                    .map_err(|e| ServingError::Corrupt(format!("served member {member:?}: {e}")))?,
                score: -key + 0.0,
                metrics,
                carry: if ranker == RankerName::Popular { carry } else { 0.0 },
            });
        }
        Ok(Some(ServedPage { total, items }))
    }

    /// A product's place in a served ranking, or `None` when `generation` does not serve this span (or
    /// Redis does not serve this ranker).
    pub async fn rank(
        &self,
        generation: u64,
        ranker: RankerName,
        category: &CategoryOrAll,
        span: &Span,
        product: &ProductId,
    ) -> Result<Option<ServedRank>, ServingError> {
        let Some(slot) = ranker_slot(ranker) else {
            return Ok(None);
        };
        let mut call = self.read_call(&self.scripts.rank, generation, slot, category, span);
        call.arg(product.as_str()).arg(slot + 1);
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

    /// The places of `products` (at least one) in a served ranking, in one script call (`ZMSCORE`, then
    /// `ZRANK` for the held ones, and one `HMGET` of their details), or `None` when `generation` does not
    /// serve this span. The keys share the category's hash tag, so this is one slot on a Cluster.
    pub async fn sort(
        &self,
        generation: u64,
        ranker: RankerName,
        category: &CategoryOrAll,
        span: &Span,
        products: &[ProductId],
    ) -> Result<Option<ServedSort>, ServingError> {
        let Some(slot) = ranker_slot(ranker) else {
            return Ok(None);
        };
        let mut call = self.read_call(&self.scripts.sort, generation, slot, category, span);
        call.arg(slot + 1);
        for product in products {
            call.arg(product.as_str());
        }
        let reply: redis::Value = self.connection.invoke(&call).await?;
        if matches!(reply, redis::Value::Nil) {
            return Ok(None);
        }
        let mut reply = Reply::new(reply)?;
        let total: usize = parse_number(&reply.string()?, "total")?;
        let (mut ranks, mut keys, mut details) = (reply.array()?, reply.array()?, reply.array()?);
        let mut places = Vec::with_capacity(products.len());
        for _ in products {
            let rank = usize::try_from(ranks.int()?).ok().map(|r| r + 1);
            let key = keys.opt_f64()?;
            let (metrics, _carry) = parse_detail(&details.string()?)?;
            places.push((rank, key.map(|k| -k + 0.0), metrics));
        }
        Ok(Some(ServedSort { total, places }))
    }

    /// Deletes every serving key under this prefix on a standalone server (tests, and the "Redis was
    /// flushed" drill). Answers an error on a cluster.
    pub async fn purge(&self) -> Result<u64, ServingError> {
        self.connection
            .purge_matching(&format!("{}{{rk*", self.options.prefix))
            .await
            .map_err(ServingError::from)
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
        assert_eq!(spans.len(), 9, "five period kinds and four windows");
        assert!(spans.iter().all(|span| is_hot(span, now, &zone)));
        let year = PeriodKey::containing(PeriodKind::Yearly, now, &zone);
        assert!(spans.contains(&Span::Period(year)));
        assert!(!is_hot(&Span::Period(year.prev(&zone)), now, &zone));
        let earlier_window = Span::Window {
            len: WindowLen::D7,
            end: now.plus(-1),
        };
        assert!(!is_hot(&earlier_window, now, &zone));
        let yesterday = PeriodKey::containing(PeriodKind::Daily, now.plus(-24), &zone);
        assert!(!is_hot(&Span::Period(yesterday), now, &zone));
    }
}
