//! Scale: ranks stay right with hundreds of thousands of members, and memory stays within budget.

use std::collections::HashMap;

use crate::{ScoreBound, SortedSet};

/// The memory budget per member, against Redis's ~101 bytes.
const MAX_HEAP_BYTES_PER_MEMBER: f64 = 40.0;

/// Tiny deterministic generator, so failures reproduce and no `rand` dependency is needed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

fn sku(number: u64) -> Vec<u8> {
    format!("sku-{number:07}").into_bytes()
}

fn heap_bytes_per_member(members: u64) -> f64 {
    let mut random = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut set = SortedSet::new();
    for number in 1..=members {
        let score = (random.next() >> 11) as f64 / (1u64 << 53) as f64 * 1e6;
        set.insert(&sku(number), score).unwrap();
    }
    assert_eq!(set.len() as u64, members);
    set.heap_bytes() as f64 / members as f64
}

#[test]
fn hundred_thousand_skus_fit_the_memory_budget() {
    let per_member = heap_bytes_per_member(100_000);
    assert!(
        per_member <= MAX_HEAP_BYTES_PER_MEMBER,
        "{per_member:.1} B/member"
    );
}

/// The headline number; run with `cargo test -p rankgate-zset --release -- --ignored`.
#[test]
#[ignore = "builds 1M members; slow in debug builds"]
fn million_skus_fit_the_memory_budget() {
    let per_member = heap_bytes_per_member(1_000_000);
    println!("1M members: {per_member:.1} heap bytes/member");
    assert!(
        per_member <= MAX_HEAP_BYTES_PER_MEMBER,
        "{per_member:.1} B/member"
    );
}

/// 200k members under random inserts, score changes and removals; at checkpoints, ranks, reverse ranks,
/// rank ranges and counts of sampled members and bounds agree with a sorted copy of a hash-map model.
#[test]
fn two_hundred_thousand_members_keep_exact_ranks() {
    let mut random = XorShift(0x2545_F491_4F6C_DD1D);
    let mut set = SortedSet::new();
    let mut model: HashMap<Vec<u8>, f64> = HashMap::new();
    let random_score = |random: &mut XorShift| -> f64 {
        // Integer scores collide a lot, so member order among ties gets exercised at scale.
        if random.below(2) == 0 {
            random.below(1_000) as f64
        } else {
            random.below(1 << 40) as f64 / 1024.0 - 5e8
        }
    };

    for round in 0..4u64 {
        for _ in 0..60_000 {
            let member = sku(random.below(250_000));
            match random.below(10) {
                0..=5 => {
                    let score = random_score(&mut random);
                    set.insert(&member, score).unwrap();
                    model.insert(member, score);
                }
                6 | 7 => {
                    let delta = random.below(100) as f64;
                    let score = set.zincrby(&member, delta).unwrap();
                    let expected = model.entry(member).or_insert(0.0);
                    *expected += delta;
                    assert_eq!(score, *expected);
                }
                _ => assert_eq!(set.zrem(&member), model.remove(&member).is_some()),
            }
        }
        assert_eq!(set.len(), model.len(), "round {round}");

        let mut sorted: Vec<(&Vec<u8>, f64)> = model.iter().map(|(m, &s)| (m, s)).collect();
        sorted.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        for _ in 0..2_000 {
            let rank = random.below(sorted.len() as u64) as usize;
            let (member, score) = sorted[rank];
            assert_eq!(set.zrank(member), Some(rank));
            assert_eq!(set.zrevrank(member), Some(sorted.len() - 1 - rank));
            assert_eq!(set.zscore(member), Some(score));
        }
        for _ in 0..200 {
            let start = random.below(sorted.len() as u64) as usize;
            let page = set.range_by_rank(start as i64, start as i64 + 9, false);
            let expected: Vec<(&[u8], f64)> = sorted[start..(start + 10).min(sorted.len())]
                .iter()
                .map(|(m, s)| (m.as_slice(), *s))
                .collect();
            assert_eq!(page, expected);

            let (low, high) = (random_score(&mut random), random_score(&mut random));
            let (low, high) = (low.min(high), low.max(high));
            let expected = sorted.iter().filter(|(_, s)| low < *s && *s <= high).count();
            let got = set.zcount(ScoreBound::Exclusive(low), ScoreBound::Inclusive(high));
            assert_eq!(got, expected);
        }
    }
    set.check_invariants();
}
