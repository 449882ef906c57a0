//! Property test: random command sequences against a naive model.
//!
//! The model is a `BTreeMap<member, score>` that sorts on demand and answers every command by filtering the
//! sorted list, written from the Redis documentation rather than from the engine's code. After every
//! command the engine's answer, its full contents and its structural invariants are checked.
//!
//! Members come from a small alphabet so adds hit existing members and removes hit present ones, with
//! awkward bytes (empty, NUL, 0xFF, prefixes) and lengths on both sides of the 11-byte inline limit. Scores come from a small pool so ties are common, plus
//! `±inf`, `-0.0` and NaN. One test uses tiny nodes (4–7 wide) so a few dozen members make a deep tree;
//! the other uses the production layout with a larger alphabet. Each case starts with a run of inserts so
//! sets are big enough to matter.

use std::collections::BTreeMap;

use proptest::collection::vec;
use proptest::prelude::*;

use crate::tree::NodeLayout;
use crate::{AddOptions, Aggregate, ScoreBound, SortedSet, ZsetError};

type Pairs = Vec<(Vec<u8>, u64)>;

/// Awkward bytes first, then a mix of members stored inline (≤ 11 bytes) and in the arena, with lengths
/// on both sides of that boundary.
fn member_name(index: usize) -> Vec<u8> {
    const SPECIAL: [&[u8]; 8] = [b"", b"\x00", b"\xff", b"a", b"ab", b"a\x00", b"B", b"\xff\x00"];
    if let Some(special) = SPECIAL.get(index) {
        return special.to_vec();
    }
    match index % 3 {
        0 => format!("m{index}").into_bytes(),
        1 => format!("long-member-{index:04}").into_bytes(),
        _ => format!("{}{index}", "x".repeat(index % 17)).into_bytes(),
    }
}

fn normalize(score: f64) -> f64 {
    if score == 0.0 {
        0.0
    } else {
        score
    }
}

fn error_kind(error: ZsetError) -> &'static str {
    match error {
        ZsetError::NotANumber => "nan",
        ZsetError::IncompatibleOptions(_) => "options",
    }
}

fn in_range(score: f64, min: ScoreBound, max: ScoreBound) -> bool {
    let above_min = match min {
        ScoreBound::Inclusive(bound) => score >= bound,
        ScoreBound::Exclusive(bound) => score > bound,
    };
    let below_max = match max {
        ScoreBound::Inclusive(bound) => score <= bound,
        ScoreBound::Exclusive(bound) => score < bound,
    };
    above_min && below_max
}

/// Positions `start..=stop` in Redis terms, as a filter over 0..len (which makes clamping implicit).
fn selects_position(position: usize, start: i64, stop: i64, len: usize) -> bool {
    let len = len as i64;
    let start = if start < 0 { start + len } else { start };
    let stop = if stop < 0 { stop + len } else { stop };
    let position = position as i64;
    start <= position && position <= stop
}

/// Scores compared by bits, so a stray `-0.0` is caught.
fn with_bits<M: AsRef<[u8]>>(pairs: impl IntoIterator<Item = (M, f64)>) -> Pairs {
    pairs
        .into_iter()
        .map(|(member, score)| (member.as_ref().to_vec(), score.to_bits()))
        .collect()
}

#[derive(Debug, Clone, Default)]
struct Model {
    scores: BTreeMap<Vec<u8>, f64>,
}

impl Model {
    fn sorted(&self) -> Vec<(Vec<u8>, f64)> {
        let mut sorted: Vec<(Vec<u8>, f64)> = self.scores.iter().map(|(m, &s)| (m.clone(), s)).collect();
        sorted.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap().then_with(|| a.0.cmp(&b.0)));
        sorted
    }

    fn zadd(&mut self, member: &[u8], score: f64, o: AddOptions) -> Result<usize, &'static str> {
        if (o.nx && o.xx) || (o.gt && o.lt) || (o.nx && (o.gt || o.lt)) {
            return Err("options");
        }
        if score.is_nan() {
            return Err("nan");
        }
        let score = normalize(score);
        match self.scores.get(member).copied() {
            None if o.xx => Ok(0),
            None => {
                self.scores.insert(member.to_vec(), score);
                Ok(1)
            }
            Some(_) if o.nx => Ok(0),
            Some(current) => {
                let allowed = (!o.gt || score > current) && (!o.lt || score < current);
                if allowed && score != current {
                    self.scores.insert(member.to_vec(), score);
                    Ok(usize::from(o.ch))
                } else {
                    Ok(0)
                }
            }
        }
    }

    fn zincrby(&mut self, member: &[u8], delta: f64) -> Result<f64, &'static str> {
        let score = self.scores.get(member).copied().unwrap_or(0.0) + delta;
        if score.is_nan() {
            return Err("nan");
        }
        let score = normalize(score);
        self.scores.insert(member.to_vec(), score);
        Ok(score)
    }

    fn rank(&self, member: &[u8]) -> Option<usize> {
        self.sorted().iter().position(|(m, _)| m == member)
    }

    fn range_by_rank(&self, start: i64, stop: i64, rev: bool) -> Vec<(Vec<u8>, f64)> {
        let mut sorted = self.sorted();
        if rev {
            sorted.reverse();
        }
        let len = sorted.len();
        sorted
            .into_iter()
            .enumerate()
            .filter(|&(position, _)| selects_position(position, start, stop, len))
            .map(|(_, pair)| pair)
            .collect()
    }

    fn range_by_score(
        &self,
        min: ScoreBound,
        max: ScoreBound,
        rev: bool,
        limit: Option<(usize, i64)>,
    ) -> Vec<(Vec<u8>, f64)> {
        let mut matching: Vec<_> = self
            .sorted()
            .into_iter()
            .filter(|&(_, score)| in_range(score, min, max))
            .collect();
        if rev {
            matching.reverse();
        }
        let (offset, count) = limit.unwrap_or((0, -1));
        let count = if count < 0 { usize::MAX } else { count as usize };
        matching.into_iter().skip(offset).take(count).collect()
    }

    fn remove_all(&mut self, doomed: &[(Vec<u8>, f64)]) -> usize {
        for (member, _) in doomed {
            self.scores.remove(member);
        }
        doomed.len()
    }

    fn union(sources: &[(&Model, f64)], aggregate: Aggregate) -> Model {
        let mut by_size = sources.to_vec();
        by_size.sort_by_key(|(model, _)| model.scores.len());
        let mut union = BTreeMap::<Vec<u8>, f64>::new();
        for (model, weight) in by_size {
            for (member, score) in model.sorted() {
                let weighted = score * weight;
                let weighted = if weighted.is_nan() { 0.0 } else { weighted };
                let Some(accumulated) = union.get_mut(&member) else {
                    union.insert(member, weighted);
                    continue;
                };
                *accumulated = match aggregate {
                    Aggregate::Sum if (*accumulated + weighted).is_nan() => 0.0,
                    Aggregate::Sum => *accumulated + weighted,
                    Aggregate::Min => accumulated.min(weighted),
                    Aggregate::Max => accumulated.max(weighted),
                };
            }
        }
        Model {
            scores: union.into_iter().map(|(m, s)| (m, normalize(s))).collect(),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Zadd {
        member: usize,
        score: f64,
        opts: AddOptions,
    },
    Insert {
        member: usize,
        score: f64,
    },
    Zincrby {
        member: usize,
        delta: f64,
    },
    Zrem {
        member: usize,
    },
    Zscore {
        member: usize,
    },
    Zrank {
        member: usize,
    },
    Zrevrank {
        member: usize,
    },
    Zcount {
        min: ScoreBound,
        max: ScoreBound,
    },
    RangeByRank {
        start: i64,
        stop: i64,
        rev: bool,
    },
    RangeByScore {
        min: ScoreBound,
        max: ScoreBound,
        rev: bool,
        limit: Option<(usize, i64)>,
    },
    IterFromRank {
        rank: usize,
        take: usize,
    },
    PopMin {
        count: usize,
    },
    PopMax {
        count: usize,
    },
    RemoveRangeByScore {
        min: ScoreBound,
        max: ScoreBound,
    },
    RemoveRangeByRank {
        start: i64,
        stop: i64,
    },
    UnionStore {
        other: Vec<(usize, f64)>,
        weights: [f64; 3],
        self_twice: bool,
        aggregate: Aggregate,
    },
    Clone,
}

fn score() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => (-3i32..=3).prop_map(f64::from),
        2 => (-3i32..=3).prop_map(|x| f64::from(x) + 0.5),
        2 => -1e6f64..1e6,
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(-0.0),
        1 => Just(f64::NAN),
    ]
}

fn bound() -> impl Strategy<Value = ScoreBound> {
    (score(), any::<bool>()).prop_map(|(value, exclusive)| {
        // A NaN bound is legal to construct but rare; keep it rarer than in scores.
        let value = if value.is_nan() && exclusive { 1.0 } else { value };
        if exclusive {
            ScoreBound::Exclusive(value)
        } else {
            ScoreBound::Inclusive(value)
        }
    })
}

fn index() -> impl Strategy<Value = i64> {
    prop_oneof![8 => -70i64..70, 1 => Just(i64::MIN), 1 => Just(i64::MAX)]
}

fn add_options() -> impl Strategy<Value = AddOptions> {
    // Conflicting combinations should be a minority but present.
    (0u8..8, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(mode, gt, lt, ch)| AddOptions {
        nx: mode == 1 || mode == 7,
        xx: mode == 2 || mode == 7,
        gt: gt && mode % 2 == 0,
        lt: lt && mode % 3 == 0,
        ch,
    })
}

fn aggregate() -> impl Strategy<Value = Aggregate> {
    prop_oneof![Just(Aggregate::Sum), Just(Aggregate::Min), Just(Aggregate::Max)]
}

fn weight() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => Just(1.0),
        1 => Just(-1.0),
        1 => Just(0.0),
        1 => Just(2.5),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
    ]
}

/// `alphabet` members; `removal_weight` tunes how often the removing commands run, which decides how
/// large sets get.
fn op(alphabet: usize, removal_weight: u32) -> impl Strategy<Value = Op> {
    let member = 0..alphabet;
    prop_oneof![
        8 => (member.clone(), score(), add_options())
            .prop_map(|(member, score, opts)| Op::Zadd { member, score, opts }),
        4 => (member.clone(), score()).prop_map(|(member, score)| Op::Insert { member, score }),
        4 => (member.clone(), score()).prop_map(|(member, delta)| Op::Zincrby { member, delta }),
        2 * removal_weight => member.clone().prop_map(|member| Op::Zrem { member }),
        1 => member.clone().prop_map(|member| Op::Zscore { member }),
        2 => member.clone().prop_map(|member| Op::Zrank { member }),
        1 => member.clone().prop_map(|member| Op::Zrevrank { member }),
        2 => (bound(), bound()).prop_map(|(min, max)| Op::Zcount { min, max }),
        2 => (index(), index(), any::<bool>())
            .prop_map(|(start, stop, rev)| Op::RangeByRank { start, stop, rev }),
        2 => (bound(), bound(), any::<bool>(), proptest::option::of((0usize..10, -2i64..10)))
            .prop_map(|(min, max, rev, limit)| Op::RangeByScore { min, max, rev, limit }),
        1 => (0usize..80, 0usize..10).prop_map(|(rank, take)| Op::IterFromRank { rank, take }),
        removal_weight => (0usize..6).prop_map(|count| Op::PopMin { count }),
        removal_weight => (0usize..6).prop_map(|count| Op::PopMax { count }),
        removal_weight => (bound(), bound()).prop_map(|(min, max)| Op::RemoveRangeByScore { min, max }),
        removal_weight => (index(), index())
            .prop_map(|(start, stop)| Op::RemoveRangeByRank { start, stop }),
        1 => (
            vec((member.clone(), score().prop_filter("no NaN", |s| !s.is_nan())), 0..20),
            [weight(), weight(), weight()],
            any::<bool>(),
            aggregate()
        )
            .prop_map(|(other, weights, self_twice, aggregate)| Op::UnionStore {
                other,
                weights,
                self_twice,
                aggregate
            }),
        1 => Just(Op::Clone),
    ]
}

fn run(layout: NodeLayout, ops: &[Op]) {
    let mut set = SortedSet::with_layout(layout);
    let mut model = Model::default();
    for (step, op) in ops.iter().enumerate() {
        let context = format!("step {step}: {op:?}");
        match op.clone() {
            Op::Zadd { member, score, opts } => {
                let member = member_name(member);
                let got = set.zadd(&member, score, opts).map_err(error_kind);
                assert_eq!(got, model.zadd(&member, score, opts), "{context}");
            }
            Op::Insert { member, score } => {
                let member = member_name(member);
                let got = set.insert(&member, score).map_err(error_kind);
                let expected = model.zadd(&member, score, AddOptions::default()).map(|n| n == 1);
                assert_eq!(got, expected, "{context}");
            }
            Op::Zincrby { member, delta } => {
                let member = member_name(member);
                let got = set.zincrby(&member, delta).map_err(error_kind);
                let expected = model.zincrby(&member, delta);
                assert_eq!(got.map(f64::to_bits), expected.map(f64::to_bits), "{context}");
            }
            Op::Zrem { member } => {
                let member = member_name(member);
                assert_eq!(
                    set.zrem(&member),
                    model.scores.remove(&member).is_some(),
                    "{context}"
                );
            }
            Op::Zscore { member } => {
                let member = member_name(member);
                assert_eq!(
                    set.zscore(&member),
                    model.scores.get(&member).copied(),
                    "{context}"
                );
            }
            Op::Zrank { member } => {
                let member = member_name(member);
                assert_eq!(set.zrank(&member), model.rank(&member), "{context}");
            }
            Op::Zrevrank { member } => {
                let member = member_name(member);
                let expected = model.rank(&member).map(|rank| model.scores.len() - 1 - rank);
                assert_eq!(set.zrevrank(&member), expected, "{context}");
            }
            Op::Zcount { min, max } => {
                let expected = model.range_by_score(min, max, false, None).len();
                assert_eq!(set.zcount(min, max), expected, "{context}");
            }
            Op::RangeByRank { start, stop, rev } => {
                let got = with_bits(set.range_by_rank(start, stop, rev));
                let expected = with_bits(model.range_by_rank(start, stop, rev));
                assert_eq!(got, expected, "{context}");
            }
            Op::RangeByScore { min, max, rev, limit } => {
                let got = with_bits(set.range_by_score(min, max, rev, limit));
                let expected = with_bits(model.range_by_score(min, max, rev, limit));
                assert_eq!(got, expected, "{context}");
            }
            Op::IterFromRank { rank, take } => {
                let got = with_bits(set.iter_from_rank(rank).take(take));
                let expected = with_bits(model.sorted().into_iter().skip(rank).take(take));
                assert_eq!(got, expected, "{context}");
            }
            Op::PopMin { count } => {
                let expected: Vec<_> = model.sorted().into_iter().take(count).collect();
                model.remove_all(&expected);
                assert_eq!(with_bits(set.pop_min(count)), with_bits(expected), "{context}");
            }
            Op::PopMax { count } => {
                let expected: Vec<_> = model.sorted().into_iter().rev().take(count).collect();
                model.remove_all(&expected);
                assert_eq!(with_bits(set.pop_max(count)), with_bits(expected), "{context}");
            }
            Op::RemoveRangeByScore { min, max } => {
                let doomed = model.range_by_score(min, max, false, None);
                let expected = model.remove_all(&doomed);
                assert_eq!(set.remove_range_by_score(min, max), expected, "{context}");
            }
            Op::RemoveRangeByRank { start, stop } => {
                let doomed = model.range_by_rank(start, stop, false);
                let expected = model.remove_all(&doomed);
                assert_eq!(set.remove_range_by_rank(start, stop), expected, "{context}");
            }
            Op::UnionStore {
                other,
                weights,
                self_twice,
                aggregate,
            } => {
                let mut other_set = SortedSet::with_layout(layout);
                let mut other_model = Model::default();
                for (member, score) in other {
                    let member = member_name(member);
                    other_set.insert(&member, score).unwrap();
                    other_model.zadd(&member, score, AddOptions::default()).unwrap();
                }
                let mut sources = vec![(&set, weights[0]), (&other_set, weights[1])];
                let mut model_sources = vec![(&model, weights[0]), (&other_model, weights[1])];
                if self_twice {
                    sources.push((&set, weights[2]));
                    model_sources.push((&model, weights[2]));
                }
                let union = SortedSet::union_with_layout(&sources, aggregate, layout);
                let union_model = Model::union(&model_sources, aggregate);
                set = union;
                model = union_model;
            }
            Op::Clone => set = set.clone(),
        }

        set.check_invariants();
        let expected = with_bits(model.sorted());
        assert_eq!(with_bits(set.iter()), expected, "contents after {context}");
        assert_eq!(set.len(), model.scores.len(), "len after {context}");
        assert_eq!(set.zcard(), set.len());
        assert_eq!(set.is_empty(), model.scores.is_empty());
    }
}

/// A run of plain inserts, so every case starts from a set of a useful size before mixing commands.
fn inserts(alphabet: usize, count: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Op>> {
    vec(
        (0..alphabet, score()).prop_map(|(member, score)| Op::Insert { member, score }),
        count,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Tiny nodes: 64 members make trees 3–5 levels deep, so every split, lend, borrow and merge path
    /// (leaf and branch) runs many times per case.
    #[test]
    fn matches_model_with_tiny_nodes(
        leaf_capacity in 4usize..=7,
        branch_capacity in 4usize..=7,
        prefix in inserts(64, 0..80),
        ops in vec(op(64, 2), 1..300),
    ) {
        let ops: Vec<Op> = prefix.into_iter().chain(ops).collect();
        run(NodeLayout::small(leaf_capacity, branch_capacity), &ops);
    }
}

proptest! {
    // Each case is up to 900 commands over a few hundred members; fewer cases keep the suite quick.
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Production nodes: a larger alphabet and fewer removals so sets span several 64-key leaves.
    #[test]
    fn matches_model_with_default_nodes(
        prefix in inserts(600, 100..500),
        ops in vec(op(600, 1), 100..400),
    ) {
        let ops: Vec<Op> = prefix.into_iter().chain(ops).collect();
        run(NodeLayout::DEFAULT, &ops);
    }
}

proptest! {
    /// Any bound Rust prints parses back to itself, inclusive or with `(`.
    #[test]
    fn score_bounds_round_trip(value in any::<f64>().prop_filter("not NaN", |v| !v.is_nan())) {
        prop_assert_eq!(ScoreBound::parse(&value.to_string()), Ok(ScoreBound::Inclusive(value)));
        prop_assert_eq!(ScoreBound::parse(&format!("({value}")), Ok(ScoreBound::Exclusive(value)));
    }
}
