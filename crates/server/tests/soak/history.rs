//! The soak's history and its invariant checker.
//!
//! Clients record every operation they ran (op, member, instance, start/end time, outcome); the test's
//! upstream records every order it committed; a monitor records the store's own admission counts. The
//! checker then judges the history alone: it never asks the service, so it can be fed a hand-made history
//! with a known violation (the unit tests below), and a checker that cannot fail is caught.
//!
//! Times: client times are epoch microseconds of the test machine's real-time clock; store times (token and
//! claim expiries) are epoch milliseconds of Redis `TIME`. Both read the same machine's clock, so an
//! operation the store ran lies between its client start and end. Every rule below leans on that in the
//! direction that can only excuse, never accuse: an unanswered request (hang-up, timeout, 503) may or may
//! not have been applied, so it excuses whatever it could explain.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

/// A member's status as a position body reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    NotEntered,
    Waiting,
    Ready,
    Claimed,
}

/// What one position body (entry or poll answer) said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub status: Status,
    pub token: Option<String>,
    /// `tokenExpiresAt` in store milliseconds.
    pub token_expires_ms: Option<i64>,
    /// `lastOutcome: CONSUMED`.
    pub consumed: bool,
}

/// An operation a client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Enter,
    Poll,
    Claim {
        token: String,
    },
    Consume {
        claim_id: String,
    },
    Release {
        claim_id: String,
    },
    Leave,
    /// An order through the `[[gate]]` proxy.
    Order {
        token: String,
    },
}

/// How it ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 200 with a position body.
    Position(Observed),
    /// Claim 200.
    Claimed { claim_id: String, expires_ms: i64 },
    /// Any other HTTP answer (204, an order's 201, 401, 409, 503…). Only 2xx means "applied" for sure.
    Status(u16),
    /// No answer: the client hung up on purpose, timed out, or the connection failed. May have been applied.
    Unknown(String),
}

/// One client operation.
#[derive(Debug, Clone)]
pub struct Record {
    pub op: Op,
    pub member: String,
    pub instance: usize,
    pub start_us: i64,
    pub end_us: i64,
    pub outcome: Outcome,
}

/// A fault the test injected, for the report.
#[derive(Debug, Clone)]
pub struct Fault {
    pub what: String,
    pub from_us: i64,
    pub to_us: i64,
}

/// Everything recorded during one soak.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub records: Vec<Record>,
    /// Orders the upstream committed: (member, time).
    pub orders: Vec<(String, i64)>,
    /// The store's own count of admissions per second of its clock (merged snapshots).
    pub admitted_by_second: BTreeMap<i64, u64>,
    /// `admittedLastMinute` from the admin view: (time, value).
    pub admin_views: Vec<(i64, u64)>,
    pub faults: Vec<Fault>,
}

/// A member seen READY for the first time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub member: String,
    pub token: String,
    /// When the store admitted it (store ms): the token's expiry minus its lifetime.
    pub admitted_ms: i64,
    /// When the client first saw it READY (µs).
    pub seen_us: i64,
}

impl History {
    /// The admission events: each member's first READY observation, in order of admission.
    pub fn admissions(&self, token_ttl_ms: i64) -> Vec<Admission> {
        let mut first: BTreeMap<&str, &Record> = BTreeMap::new();
        for record in &self.records {
            if let Outcome::Position(Observed {
                status: Status::Ready,
                token: Some(_),
                token_expires_ms: Some(_),
                ..
            }) = &record.outcome
            {
                let slot = first.entry(&record.member).or_insert(record);
                if record.end_us < slot.end_us {
                    *slot = record;
                }
            }
        }
        let mut events: Vec<Admission> = first
            .into_values()
            .filter_map(|r| match &r.outcome {
                Outcome::Position(Observed {
                    token: Some(token),
                    token_expires_ms: Some(expires),
                    ..
                }) => Some(Admission {
                    member: r.member.clone(),
                    token: token.clone(),
                    admitted_ms: expires - token_ttl_ms,
                    seen_us: r.end_us,
                }),
                _ => None,
            })
            .collect();
        events.sort_by_key(|a| (a.admitted_ms, a.seen_us));
        events
    }
}

/// The queue settings the checker judges against.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub admit_per_second: f64,
    pub tick_ms: i64,
    pub token_ttl_ms: i64,
}

impl Budget {
    /// Micro-members earned per millisecond.
    fn rate_micro_per_ms(&self) -> i64 {
        (self.admit_per_second * 1000.0).round() as i64
    }

    /// One tick's admissions in micro-members (the bucket's capacity), at least one member.
    fn tick_micro(&self) -> i64 {
        (self.tick_ms * self.rate_micro_per_ms()).max(1_000_000)
    }

    /// Most admissions allowed within `span_ms`: the rate over the span, the bucket's one tick of burst,
    /// and one more tick of slack for the tick boundaries.
    fn allowed_micro(&self, span_ms: i64) -> i64 {
        self.rate_micro_per_ms() * span_ms + 2 * self.tick_micro()
    }
}

/// The kinds of violation the checker knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A member showed two distinct tokens in one entry, or one token showed for two members.
    AdmittedTwice,
    /// A member was READY again after its consume answered 204.
    ReadyAfterConsume,
    /// Two consumes answered 204 with different claims, a claim was granted after a consume, or more
    /// than one order committed for one token.
    ConsumedTwice,
    /// A token was granted twice with neither a release nor the claim's expiry between.
    ClaimedTwice,
    /// An acknowledged member ended NOT_ENTERED with no leave, no expiry and no consume to explain it.
    Lost,
    /// More admissions in some span than the budget allows.
    RateOverBudget,
    /// A member entered strictly after another was admitted first (or while the other still waited).
    FifoViolated,
}

/// One violation, with the history it rests on.
#[derive(Debug, Clone)]
pub struct Violation {
    pub kind: Kind,
    pub detail: String,
}

/// What the checker found and counted.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub counts: BTreeMap<&'static str, usize>,
}

impl Report {
    pub fn kinds(&self) -> BTreeSet<Kind> {
        self.violations.iter().map(|v| v.kind).collect()
    }

    fn add(&mut self, name: &'static str, n: usize) {
        *self.counts.entry(name).or_default() += n;
    }

    fn violation(&mut self, kind: Kind, detail: String) {
        self.violations.push(Violation { kind, detail });
    }

    /// A readable summary: the counts, then the violations.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for (name, n) in &self.counts {
            let _ = writeln!(out, "  {name}: {n}");
        }
        out + &self.violations_summary()
    }

    /// Each violation (the first few of each kind).
    pub fn violations_summary(&self) -> String {
        let mut out = String::new();
        let mut shown: BTreeMap<Kind, usize> = BTreeMap::new();
        for violation in &self.violations {
            let seen = shown.entry(violation.kind).or_default();
            *seen += 1;
            if *seen <= 5 {
                let _ = writeln!(out, "  VIOLATION {:?}: {}", violation.kind, violation.detail);
            }
        }
        for (kind, n) in shown.iter().filter(|(_, n)| **n > 5) {
            let _ = writeln!(out, "  … {} more {kind:?}", n - 5);
        }
        out
    }
}

/// The invariants the checker runs, for the report.
pub const INVARIANTS: [&str; 7] = [
    "nobody is admitted twice (one distinct token per member's entry; no token for two members)",
    "a consumed member is never READY again",
    "no token is consumed twice (one consume 204 claim per token; no claim after a consume; at most one order per token)",
    "no token is claimed twice without a release or the claim's expiry between",
    "nobody who entered is lost (each acknowledged member ends WAITING, READY, CLAIMED, consumed, left or expired)",
    "the admission rate never exceeds the budget (+1 tick), from observed admissions, the store's per-second counts and admittedLastMinute",
    "admission follows entry order (A acknowledged before B was sent ⇒ A admitted no later than B)",
];

fn us_of_ms(ms: i64) -> i64 {
    ms * 1000
}

/// Per member, what the checker needs, gathered from the records.
#[derive(Default)]
struct MemberFacts<'a> {
    records: Vec<&'a Record>,
    /// Start of the first entry attempt (any outcome).
    first_enter_start: Option<i64>,
    /// End of the first acknowledged entry.
    first_ack_end: Option<i64>,
    /// First READY observation: (token, expiry ms, observation end).
    first_ready: Option<(String, i64, i64)>,
}

/// Runs every invariant over `history`.
pub fn check(history: &History, budget: &Budget) -> Report {
    let mut report = Report::default();
    report.add("records", history.records.len());
    report.add("orders committed upstream", history.orders.len());
    report.add("faults injected", history.faults.len());

    let mut members: BTreeMap<&str, MemberFacts> = BTreeMap::new();
    for record in &history.records {
        members.entry(&record.member).or_default().records.push(record);
    }
    for facts in members.values_mut() {
        facts.records.sort_by_key(|r| (r.start_us, r.end_us));
        for r in &facts.records {
            if r.op == Op::Enter {
                facts.first_enter_start.get_or_insert(r.start_us);
                if matches!(r.outcome, Outcome::Position(_)) {
                    let end = facts.first_ack_end.get_or_insert(r.end_us);
                    *end = (*end).min(r.end_us);
                }
            }
        }
        // The first READY by the time it was answered.
        let mut readies: Vec<(&Record, &Observed)> = facts
            .records
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::Position(o) if o.status == Status::Ready => Some((*r, o)),
                _ => None,
            })
            .collect();
        readies.sort_by_key(|(r, _)| r.end_us);
        if let Some((r, o)) = readies.first() {
            if let (Some(token), Some(expires)) = (&o.token, o.token_expires_ms) {
                facts.first_ready = Some((token.clone(), expires, r.end_us));
            }
        }
    }
    report.add("members", members.len());
    report.add(
        "members with an acknowledged entry",
        members.values().filter(|f| f.first_ack_end.is_some()).count(),
    );
    report.add(
        "admission events observed (first READY)",
        members.values().filter(|f| f.first_ready.is_some()).count(),
    );

    check_admitted_once(&members, &mut report);
    check_consumption(&members, history, &mut report);
    check_claims(&members, &mut report);
    check_lost(&members, budget, &mut report);
    check_rate(&members, history, budget, &mut report);
    check_fifo(&members, budget, &mut report);
    report
}

fn ready_tokens<'a>(facts: &'a MemberFacts) -> impl Iterator<Item = (&'a Record, &'a str)> {
    facts.records.iter().filter_map(|r| match &r.outcome {
        Outcome::Position(Observed {
            status: Status::Ready,
            token: Some(token),
            ..
        }) => Some((*r, token.as_str())),
        _ => None,
    })
}

fn check_admitted_once(members: &BTreeMap<&str, MemberFacts>, report: &mut Report) {
    let mut owners: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for (member, facts) in members {
        let tokens: BTreeSet<&str> = ready_tokens(facts).map(|(_, t)| t).collect();
        if tokens.len() > 1 {
            report.violation(
                Kind::AdmittedTwice,
                format!("{member} showed {} distinct tokens in one entry", tokens.len()),
            );
        }
        for token in tokens {
            owners.entry(token).or_default().insert(member);
        }
    }
    for (token, holders) in owners {
        if holders.len() > 1 {
            report.violation(
                Kind::AdmittedTwice,
                format!(
                    "token {}… shown to members {holders:?}",
                    &token[..token.len().min(8)]
                ),
            );
        }
    }
}

/// End of the first 2xx consume (by the service, or an order the gate answered 2xx, which it does only
/// after consuming).
fn first_consumed_end<'a>(facts: &MemberFacts<'a>) -> Option<(i64, &'a Record)> {
    facts
        .records
        .iter()
        .filter(|r| {
            matches!(
                (&r.op, &r.outcome),
                (Op::Consume { .. } | Op::Order { .. }, Outcome::Status(200..=299))
            )
        })
        .map(|r| (r.end_us, *r))
        .min_by_key(|(end, _)| *end)
}

fn check_consumption(members: &BTreeMap<&str, MemberFacts>, history: &History, report: &mut Report) {
    let mut orders: HashMap<&str, Vec<i64>> = HashMap::new();
    for (member, at) in &history.orders {
        orders.entry(member).or_default().push(*at);
    }
    let mut consumed_members = 0;
    for (member, facts) in members {
        let consumed_claims: BTreeSet<&str> = facts
            .records
            .iter()
            .filter_map(|r| match (&r.op, &r.outcome) {
                (Op::Consume { claim_id }, Outcome::Status(200..=299)) => Some(claim_id.as_str()),
                _ => None,
            })
            .collect();
        if consumed_claims.len() > 1 {
            report.violation(
                Kind::ConsumedTwice,
                format!(
                    "{member}: consume answered 204 for {} different claims of one token",
                    consumed_claims.len()
                ),
            );
        }
        let committed = orders.get(member).map_or(0, Vec::len);
        if committed > 1 || (committed == 1 && !consumed_claims.is_empty()) {
            report.violation(
                Kind::ConsumedTwice,
                format!(
                    "{member}: one token bought {} orders ({committed} committed upstream through the gate, \
                     {} consumed through the service); gate requests: {}",
                    committed + consumed_claims.len(),
                    consumed_claims.len(),
                    describe(facts.records.iter().filter(|r| matches!(r.op, Op::Order { .. })))
                ),
            );
        }
        let Some((consumed_at, consume)) = first_consumed_end(facts) else {
            continue;
        };
        consumed_members += 1;
        for r in &facts.records {
            if r.start_us <= consumed_at {
                continue;
            }
            match (&r.op, &r.outcome) {
                (_, Outcome::Position(o)) if o.status == Status::Ready => report.violation(
                    Kind::ReadyAfterConsume,
                    format!(
                        "{member} READY at {} (instance {}) after its {:?} answered {:?} at {consumed_at}",
                        r.start_us, r.instance, consume.op, consume.outcome
                    ),
                ),
                (Op::Claim { .. }, Outcome::Claimed { .. }) => report.violation(
                    Kind::ConsumedTwice,
                    format!(
                        "{member}: claim granted at {} (instance {}) after the token was consumed at {consumed_at}",
                        r.end_us, r.instance
                    ),
                ),
                _ => {}
            }
        }
    }
    report.add("members consumed (client saw 2xx)", consumed_members);
}

fn check_claims(members: &BTreeMap<&str, MemberFacts>, report: &mut Report) {
    let mut granted_total = 0;
    for (member, facts) in members {
        let mut granted: Vec<(&Record, &str, i64)> = facts
            .records
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::Claimed { claim_id, expires_ms } => Some((*r, claim_id.as_str(), *expires_ms)),
                _ => None,
            })
            .collect();
        granted.sort_by_key(|(r, _, _)| r.end_us);
        granted_total += granted.len();
        for pair in granted.windows(2) {
            let (first, first_id, first_expires) = pair[0];
            let (second, _, _) = pair[1];
            // The second claim ran at the store before its answer arrived. It is legal if the first claim
            // had expired by then, or a release of the first was at least sent before that answer.
            let expired = second.end_us + 2_000 >= us_of_ms(first_expires);
            let released = facts.records.iter().any(|r| {
                matches!(&r.op, Op::Release { claim_id } if claim_id == first_id)
                    && r.start_us < second.end_us
            });
            if !expired && !released {
                report.violation(
                    Kind::ClaimedTwice,
                    format!(
                        "{member}: claim granted at {} (instance {}) and again at {} (instance {}), \
                         the first expiring at {}000, with no release between",
                        first.end_us, first.instance, second.end_us, second.instance, first_expires
                    ),
                );
            }
        }
    }
    report.add("claims granted", granted_total);
}

fn describe<'a>(records: impl Iterator<Item = &'a &'a Record>) -> String {
    let parts: Vec<String> = records
        .map(|r| {
            format!(
                "[{:?} inst {} {}..{} → {:?}]",
                r.op, r.instance, r.start_us, r.end_us, r.outcome
            )
        })
        .collect();
    parts.join(" ")
}

fn check_lost(members: &BTreeMap<&str, MemberFacts>, budget: &Budget, report: &mut Report) {
    for (member, facts) in members {
        if facts.first_ack_end.is_none() {
            continue;
        }
        // The member's last known state: the position answered last.
        let positions: Vec<(&Record, &Observed)> = facts
            .records
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::Position(o) => Some((*r, o)),
                _ => None,
            })
            .collect();
        let Some(&(last, observed)) = positions.iter().max_by_key(|(r, _)| r.end_us) else {
            continue;
        };
        let name = match observed.status {
            Status::Waiting => "ended WAITING (drain bound)",
            Status::Ready => "ended READY",
            Status::Claimed => "ended CLAIMED",
            Status::NotEntered if observed.consumed => {
                let attempted = facts.records.iter().any(|r| {
                    matches!(r.op, Op::Consume { .. } | Op::Order { .. }) && r.start_us < last.end_us
                });
                if !attempted {
                    report.violation(
                        Kind::Lost,
                        format!("{member} reported CONSUMED though nobody consumed its token"),
                    );
                }
                "ended consumed"
            }
            Status::NotEntered => {
                let left = facts
                    .records
                    .iter()
                    .any(|r| r.op == Op::Leave && r.start_us < last.end_us);
                let expired = facts
                    .first_ready
                    .as_ref()
                    .is_some_and(|(_, expires, _)| last.end_us >= us_of_ms(*expires));
                if left {
                    "ended left"
                } else if expired {
                    "ended expired (token seen, then its TTL passed)"
                } else if facts.first_ready.is_none() {
                    // Never seen READY: it may have been admitted and expired between two polls, but only
                    // if some gap between its observations was at least the token's lifetime.
                    let last_waiting = positions
                        .iter()
                        .filter(|(_, o)| o.status == Status::Waiting)
                        .map(|(r, _)| r.start_us)
                        .max();
                    match last_waiting {
                        Some(waiting_start)
                            if last.end_us - waiting_start < us_of_ms(budget.token_ttl_ms) =>
                        {
                            report.violation(
                                Kind::Lost,
                                format!(
                                    "{member} WAITING at {waiting_start}, NOT_ENTERED at {} (instance {}), \
                                     less than a token lifetime later, never READY, never left; history: {}",
                                    last.end_us,
                                    last.instance,
                                    describe(facts.records.iter())
                                ),
                            );
                            "lost"
                        }
                        _ => "ended NOT_ENTERED, maybe admitted and expired between polls",
                    }
                } else {
                    report.violation(
                        Kind::Lost,
                        format!(
                            "{member} NOT_ENTERED at {} (instance {}) before its token expired, never left or \
                             consumed; history: {}",
                            last.end_us,
                            last.instance,
                            describe(facts.records.iter())
                        ),
                    );
                    "lost"
                }
            }
        };
        report.add(name, 1);
    }
}

fn check_rate(
    members: &BTreeMap<&str, MemberFacts>,
    history: &History,
    budget: &Budget,
    report: &mut Report,
) {
    // 1. Observed admissions: the store stamps a token's expiry as admission time + TTL, in its own clock.
    let mut admitted: Vec<(i64, &str)> = members
        .iter()
        .filter_map(|(m, f)| {
            f.first_ready
                .as_ref()
                .map(|(_, e, _)| (e - budget.token_ttl_ms, *m))
        })
        .collect();
    admitted.sort_unstable();
    let mut windows = 0usize;
    let mut worst: Option<(usize, i64, i64)> = None;
    for i in 0..admitted.len() {
        for j in i..admitted.len() {
            windows += 1;
            let span = admitted[j].0 - admitted[i].0;
            let count = (j - i + 1) as i64;
            if count * 1_000_000 > budget.allowed_micro(span) {
                worst = match worst {
                    Some((c, _, _)) if c >= count as usize => worst,
                    _ => Some((count as usize, admitted[i].0, admitted[j].0)),
                };
            }
        }
    }
    if let Some((count, from, to)) = worst {
        report.violation(
            Kind::RateOverBudget,
            format!(
                "{count} members observed admitted between store times {from} and {to} ({} ms); the budget \
                 allows {:.1}",
                to - from,
                budget.allowed_micro(to - from) as f64 / 1e6
            ),
        );
    }
    report.add("rate windows checked (observed admissions)", windows);
    let mut peak = 0usize;
    let mut from = 0usize;
    for to in 0..admitted.len() {
        while admitted[to].0 - admitted[from].0 >= 1000 {
            from += 1;
        }
        peak = peak.max(to - from + 1);
    }
    report.add("peak observed admissions within 1 s", peak);

    // 2. The store's per-second counts: any run of k whole seconds holds at most rate × k + slack.
    let seconds: Vec<(i64, u64)> = history.admitted_by_second.iter().map(|(s, n)| (*s, *n)).collect();
    let mut runs = 0usize;
    for i in 0..seconds.len() {
        let mut sum = 0u64;
        for j in i..seconds.len() {
            sum += seconds[j].1;
            let k = seconds[j].0 - seconds[i].0 + 1;
            runs += 1;
            if sum as i64 * 1_000_000 > budget.allowed_micro(k * 1000) {
                report.violation(
                    Kind::RateOverBudget,
                    format!(
                        "the store counted {sum} admissions in the {k} s from second {}; the budget allows {:.1}",
                        seconds[i].0,
                        budget.allowed_micro(k * 1000) as f64 / 1e6
                    ),
                );
            }
        }
    }
    report.add("rate windows checked (store per-second counts)", runs);
    report.add(
        "peak store-counted admissions in one second",
        seconds.iter().map(|(_, n)| *n as usize).max().unwrap_or(0),
    );
    report.add(
        "store-counted admissions",
        seconds.iter().map(|(_, n)| *n as usize).sum(),
    );

    // 3. admittedLastMinute: buckets of the last 60 s, so at most 61 seconds of them.
    for (at, value) in &history.admin_views {
        if *value as i64 * 1_000_000 > budget.allowed_micro(61_000) {
            report.violation(
                Kind::RateOverBudget,
                format!("admittedLastMinute = {value} at {at}"),
            );
        }
    }
    report.add("admin views checked", history.admin_views.len());
}

fn check_fifo(members: &BTreeMap<&str, MemberFacts>, budget: &Budget, report: &mut Report) {
    struct Entry<'a> {
        member: &'a str,
        ack_end: i64,
        first_start: i64,
        /// Admission time (store ms): the token's expiry minus the TTL.
        admitted_ms: Option<i64>,
        /// Start of the latest poll that saw it WAITING.
        last_waiting_start: Option<i64>,
    }
    let entries: Vec<Entry> = members
        .iter()
        .filter_map(|(member, f)| {
            let ack_end = f.first_ack_end?;
            Some(Entry {
                member,
                ack_end,
                first_start: f.first_enter_start.unwrap_or(ack_end),
                admitted_ms: f.first_ready.as_ref().map(|(_, e, _)| e - budget.token_ttl_ms),
                last_waiting_start: f
                    .records
                    .iter()
                    .filter(|r| matches!(&r.outcome, Outcome::Position(o) if o.status == Status::Waiting))
                    .map(|r| r.start_us)
                    .max(),
            })
        })
        .collect();
    // A was acknowledged before B's first entry attempt was sent: A's arrival sequence is then lower, so A
    // must be admitted no later than B, and must not still be waiting once B is admitted. (B's *first*
    // attempt counts: an attempt that went unanswered, during a kill or a pause, may still have entered B.)
    let mut by_ack: Vec<&Entry> = entries.iter().collect();
    by_ack.sort_by_key(|e| e.ack_end);
    let mut by_start: Vec<&Entry> = entries.iter().collect();
    by_start.sort_by_key(|e| e.first_start);

    // Sweep B in order of first attempt, keeping the A acknowledged before it that was admitted latest.
    let mut latest_a: Option<(&Entry, i64)> = None;
    let mut a_index = 0;
    let mut pairs = 0usize;
    for b in &by_start {
        while a_index < by_ack.len() && by_ack[a_index].ack_end < b.first_start {
            let a = by_ack[a_index];
            if let Some(adm) = a.admitted_ms {
                if latest_a.is_none_or(|(_, best)| adm > best) {
                    latest_a = Some((a, adm));
                }
            }
            a_index += 1;
        }
        pairs += a_index;
        if let (Some(b_adm), Some((a, a_adm))) = (b.admitted_ms, latest_a) {
            if a_adm > b_adm {
                report.violation(
                    Kind::FifoViolated,
                    format!(
                        "{} (acknowledged at {}) admitted at store ms {a_adm}, after {} (first sent at {}) \
                         admitted at {b_adm}",
                        a.member, a.ack_end, b.member, b.first_start
                    ),
                );
            }
        }
    }

    // A seen WAITING by a poll sent after some B that entered after A had already been admitted.
    // Suffix minimum of B's admission over B sorted by first attempt.
    let mut suffix_min: Vec<Option<(i64, &str)>> = vec![None; by_start.len() + 1];
    for i in (0..by_start.len()).rev() {
        let here = by_start[i].admitted_ms.map(|a| (a, by_start[i].member));
        suffix_min[i] = match (here, suffix_min[i + 1]) {
            (Some(h), Some(s)) => Some(if h.0 <= s.0 { h } else { s }),
            (h, s) => h.or(s),
        };
    }
    for a in &entries {
        let Some(waiting_start) = a.last_waiting_start else {
            continue;
        };
        let first_later = by_start.partition_point(|b| b.first_start <= a.ack_end);
        if let Some((b_adm, b_member)) = suffix_min[first_later] {
            // One millisecond of margin for the store's ms against the client's µs.
            if waiting_start > us_of_ms(b_adm + 1) {
                report.violation(
                    Kind::FifoViolated,
                    format!(
                        "{} (acknowledged at {}) still WAITING at {waiting_start}, after {b_member}, who \
                         entered later, was admitted at store ms {b_adm}",
                        a.member, a.ack_end
                    ),
                );
            }
        }
    }
    report.add("FIFO pairs checked", pairs);
}

/// The checker fed hand-made histories: a clean one passes, and each kind of violation is found.
#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000_000_000; // µs
    const BUDGET: Budget = Budget {
        admit_per_second: 10.0,
        tick_ms: 500,
        token_ttl_ms: 10_000,
    };

    fn at(ms: i64) -> i64 {
        T0 + ms * 1000
    }

    fn store_ms(ms: i64) -> i64 {
        T0 / 1000 + ms
    }

    fn record(op: Op, member: &str, from_ms: i64, to_ms: i64, outcome: Outcome) -> Record {
        Record {
            op,
            member: member.into(),
            instance: 0,
            start_us: at(from_ms),
            end_us: at(to_ms),
            outcome,
        }
    }

    fn position(status: Status) -> Outcome {
        Outcome::Position(Observed {
            status,
            token: None,
            token_expires_ms: None,
            consumed: false,
        })
    }

    /// READY with `token`, admitted at `admitted_ms` (store time relative to T0).
    fn ready(token: &str, admitted_ms: i64) -> Outcome {
        Outcome::Position(Observed {
            status: Status::Ready,
            token: Some(token.into()),
            token_expires_ms: Some(store_ms(admitted_ms + BUDGET.token_ttl_ms)),
            consumed: false,
        })
    }

    fn consumed() -> Outcome {
        Outcome::Position(Observed {
            status: Status::NotEntered,
            token: None,
            token_expires_ms: None,
            consumed: true,
        })
    }

    fn claimed(id: &str, expires_ms: i64) -> Outcome {
        Outcome::Claimed {
            claim_id: id.into(),
            expires_ms: store_ms(expires_ms),
        }
    }

    /// A member's whole good life, shifted by `base` ms: enters, waits, is admitted, claims, consumes.
    fn good_member(member: &str, base: i64) -> Vec<Record> {
        let token = format!("tok-{member}");
        let claim = format!("claim-{member}");
        vec![
            record(Op::Enter, member, base, base + 5, position(Status::Waiting)),
            record(
                Op::Poll,
                member,
                base + 100,
                base + 105,
                position(Status::Waiting),
            ),
            record(
                Op::Poll,
                member,
                base + 1100,
                base + 1105,
                ready(&token, base + 1000),
            ),
            record(
                Op::Claim { token: token.clone() },
                member,
                base + 1200,
                base + 1205,
                claimed(&claim, base + 3200),
            ),
            record(
                Op::Consume {
                    claim_id: claim.clone(),
                },
                member,
                base + 1300,
                base + 1305,
                Outcome::Status(204),
            ),
            record(Op::Poll, member, base + 1400, base + 1405, consumed()),
        ]
    }

    /// Three members entered one after another, admitted in order, 200 ms apart.
    fn clean() -> History {
        let mut history = History::default();
        for (i, member) in ["a", "b", "c"].iter().enumerate() {
            history.records.extend(good_member(member, i as i64 * 200));
        }
        history.admitted_by_second.insert(store_ms(1000) / 1000, 3);
        history.admin_views.push((at(2000), 3));
        history
    }

    fn kinds(history: &History) -> BTreeSet<Kind> {
        let report = check(history, &BUDGET);
        eprintln!("{}", report.summary());
        report.kinds()
    }

    #[test]
    fn a_clean_history_passes_every_invariant() {
        let report = check(&clean(), &BUDGET);
        assert!(report.violations.is_empty(), "{}", report.summary());
        assert_eq!(report.counts["ended consumed"], 3);
        assert_eq!(report.counts["FIFO pairs checked"], 3);
        let admissions = clean().admissions(BUDGET.token_ttl_ms);
        let order: Vec<&str> = admissions.iter().map(|a| a.member.as_str()).collect();
        assert_eq!(order, ["a", "b", "c"]);
        assert_eq!(admissions[1].admitted_ms, store_ms(1200));
        assert_eq!(admissions[1].token, "tok-b");
    }

    #[test]
    fn the_checker_finds_a_member_admitted_twice() {
        let mut history = clean();
        history
            .records
            .push(record(Op::Poll, "a", 1150, 1155, ready("another-token", 1000)));
        assert_eq!(kinds(&history), BTreeSet::from([Kind::AdmittedTwice]));

        let mut history = clean();
        // b is shown a's token.
        history
            .records
            .push(record(Op::Poll, "b", 1250, 1255, ready("tok-a", 1000)));
        assert!(kinds(&history).contains(&Kind::AdmittedTwice));
    }

    #[test]
    fn the_checker_finds_a_consumed_member_ready_again() {
        let mut history = clean();
        history
            .records
            .push(record(Op::Poll, "a", 1500, 1505, ready("tok-a", 1000)));
        assert_eq!(kinds(&history), BTreeSet::from([Kind::ReadyAfterConsume]));
    }

    #[test]
    fn the_checker_finds_a_token_consumed_twice() {
        // Two consume 204s with different claims of one token.
        let mut history = clean();
        history.records.push(record(
            Op::Consume {
                claim_id: "other-claim".into(),
            },
            "a",
            1310,
            1315,
            Outcome::Status(204),
        ));
        assert!(kinds(&history).contains(&Kind::ConsumedTwice));

        // A claim granted after the consume.
        let mut history = clean();
        history.records.push(record(
            Op::Claim {
                token: "tok-a".into(),
            },
            "a",
            1320,
            1325,
            claimed("late-claim", 3320),
        ));
        assert!(kinds(&history).contains(&Kind::ConsumedTwice));

        // Two orders committed upstream for one member.
        let mut history = clean();
        history.orders.push(("c".into(), at(1300)));
        history.orders.push(("c".into(), at(4000)));
        assert_eq!(kinds(&history), BTreeSet::from([Kind::ConsumedTwice]));
    }

    #[test]
    fn the_checker_finds_a_token_claimed_twice_without_release_or_expiry() {
        let mut history = clean();
        // A second grant 100 ms after the first, long before the first claim's expiry (3200).
        history.records.push(record(
            Op::Claim {
                token: "tok-a".into(),
            },
            "a",
            1250,
            1255,
            claimed("second", 3250),
        ));
        assert!(kinds(&history).contains(&Kind::ClaimedTwice));

        // The same second grant is legal after a release of the first…
        history.records.push(record(
            Op::Release {
                claim_id: "claim-a".into(),
            },
            "a",
            1210,
            1215,
            Outcome::Status(204),
        ));
        assert!(!kinds(&history).contains(&Kind::ClaimedTwice));

        // …or after the first claim expired.
        let mut history = clean();
        history.records.push(record(
            Op::Claim {
                token: "tok-a".into(),
            },
            "a",
            3250,
            3255,
            claimed("second", 5250),
        ));
        assert!(!kinds(&history).contains(&Kind::ClaimedTwice));
    }

    #[test]
    fn the_checker_finds_a_lost_member() {
        let mut history = clean();
        history.records.extend([
            record(Op::Enter, "d", 700, 705, position(Status::Waiting)),
            record(Op::Poll, "d", 1700, 1705, position(Status::Waiting)),
            record(Op::Poll, "d", 2700, 2705, position(Status::NotEntered)),
        ]);
        assert_eq!(kinds(&history), BTreeSet::from([Kind::Lost]));

        // The same end is accounted for if d left…
        let mut left = history.clone();
        left.records.push(record(
            Op::Leave,
            "d",
            2000,
            2005,
            Outcome::Unknown("hung up".into()),
        ));
        assert!(kinds(&left).is_empty());

        // …or if it could have been admitted and expired unseen (a gap of a whole token lifetime).
        let mut gap = clean();
        gap.records.extend([
            record(Op::Enter, "d", 700, 705, position(Status::Waiting)),
            record(Op::Poll, "d", 13_000, 13_005, position(Status::NotEntered)),
        ]);
        assert!(kinds(&gap).is_empty());

        // A READY member that vanished before its token expired is lost too.
        let mut vanished = clean();
        vanished.records.extend([
            record(Op::Enter, "d", 700, 705, position(Status::Waiting)),
            record(Op::Poll, "d", 1700, 1705, ready("tok-d", 1650)),
            record(Op::Poll, "d", 2700, 2705, position(Status::NotEntered)),
        ]);
        assert_eq!(kinds(&vanished), BTreeSet::from([Kind::Lost]));

        // CONSUMED with no consume anywhere.
        let mut phantom = clean();
        phantom.records.extend([
            record(Op::Enter, "d", 700, 705, position(Status::Waiting)),
            record(Op::Poll, "d", 1700, 1705, consumed()),
        ]);
        assert_eq!(kinds(&phantom), BTreeSet::from([Kind::Lost]));
    }

    #[test]
    fn the_checker_finds_admissions_over_the_budget() {
        // 10/s with 500 ms ticks: a 100 ms span may hold 10×0.1 + 2×5 = 11 admissions; 12 is too many.
        let mut history = History::default();
        for i in 0..12 {
            let member = format!("m{i:02}");
            history
                .records
                .push(record(Op::Enter, &member, i, i + 1, position(Status::Waiting)));
            history.records.push(record(
                Op::Poll,
                &member,
                2000,
                2001,
                ready(&format!("t{i}"), 1000 + i * 8),
            ));
        }
        let report = check(&history, &BUDGET);
        assert_eq!(
            report.kinds(),
            BTreeSet::from([Kind::RateOverBudget]),
            "{}",
            report.summary()
        );

        // The store's per-second counts: 25 in one second is over 10 + 10.
        let mut history = clean();
        history.admitted_by_second.insert(store_ms(5000) / 1000, 25);
        assert_eq!(kinds(&history), BTreeSet::from([Kind::RateOverBudget]));

        // admittedLastMinute over 10 × 61 + 10.
        let mut history = clean();
        history.admin_views.push((at(60_000), 700));
        assert_eq!(kinds(&history), BTreeSet::from([Kind::RateOverBudget]));
    }

    #[test]
    fn the_checker_finds_admission_out_of_entry_order() {
        // c entered after a's entry was acknowledged, but was admitted before a.
        let mut history = History::default();
        history.records.extend([
            record(Op::Enter, "a", 0, 5, position(Status::Waiting)),
            record(Op::Poll, "a", 2000, 2005, ready("tok-a", 1500)),
            record(Op::Enter, "c", 100, 105, position(Status::Waiting)),
            record(Op::Poll, "c", 1200, 1205, ready("tok-c", 1000)),
        ]);
        assert_eq!(kinds(&history), BTreeSet::from([Kind::FifoViolated]));

        // a is still WAITING on a poll sent after c (entered later) was admitted.
        let mut history = History::default();
        history.records.extend([
            record(Op::Enter, "a", 0, 5, position(Status::Waiting)),
            record(Op::Poll, "a", 2000, 2005, position(Status::Waiting)),
        ]);
        history.records.extend(good_member("c", 100));
        assert_eq!(kinds(&history), BTreeSet::from([Kind::FifoViolated]));

        // Not a violation when c's first attempt was sent before a's entry was acknowledged: its
        // unanswered first attempt may have entered it first.
        history.records.push(record(
            Op::Enter,
            "c",
            2,
            3000,
            Outcome::Unknown("timed out".into()),
        ));
        assert!(kinds(&history).is_empty());
    }
}
