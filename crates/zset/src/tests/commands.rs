//! One or more tests per command, for the edge cases Redis defines. Expected values were checked against
//! Redis 7 where noted.

use crate::tree::NodeLayout;
use crate::{AddOptions, Aggregate, ScoreBound, SortedSet, ZsetError};

const NEG_INF: ScoreBound = ScoreBound::Inclusive(f64::NEG_INFINITY);
const POS_INF: ScoreBound = ScoreBound::Inclusive(f64::INFINITY);

fn set_of(members: &[(&str, f64)]) -> SortedSet {
    let mut set = SortedSet::new();
    for &(member, score) in members {
        set.insert(member.as_bytes(), score).unwrap();
    }
    set.check_invariants();
    set
}

fn names(pairs: &[(&[u8], f64)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(member, _)| String::from_utf8_lossy(member).into_owned())
        .collect()
}

fn owned_names(pairs: &[(Vec<u8>, f64)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(member, _)| String::from_utf8_lossy(member).into_owned())
        .collect()
}

fn all(set: &SortedSet) -> Vec<String> {
    names(&set.iter().collect::<Vec<_>>())
}

fn opts(flags: &str) -> AddOptions {
    AddOptions {
        nx: flags.contains("nx"),
        xx: flags.contains("xx"),
        gt: flags.contains("gt"),
        lt: flags.contains("lt"),
        ch: flags.contains("ch"),
    }
}

// ----- ZADD ------------------------------------------------------------------------------------------------

#[test]
fn zadd_counts_new_members_and_updates_existing_ones_silently() {
    let mut set = SortedSet::new();
    assert_eq!(set.zadd(b"a", 1.0, opts("")), Ok(1));
    assert_eq!(set.zadd(b"a", 2.0, opts("")), Ok(0));
    assert_eq!(set.zscore(b"a"), Some(2.0));
    assert_eq!(set.insert(b"b", 0.5), Ok(true));
    assert_eq!(set.insert(b"b", 3.0), Ok(false));
    assert_eq!(all(&set), ["a", "b"]);
    set.check_invariants();
}

#[test]
fn zadd_ch_counts_changed_scores_but_not_same_score() {
    let mut set = set_of(&[("a", 1.0)]);
    assert_eq!(set.zadd(b"a", 1.0, opts("ch")), Ok(0));
    assert_eq!(set.zadd(b"a", 2.0, opts("ch")), Ok(1));
    assert_eq!(set.zadd(b"new", 2.0, opts("ch")), Ok(1));
}

#[test]
fn zadd_nx_only_adds_and_xx_only_updates() {
    let mut set = set_of(&[("a", 1.0)]);
    assert_eq!(set.zadd(b"a", 5.0, opts("nx ch")), Ok(0));
    assert_eq!(set.zscore(b"a"), Some(1.0));
    assert_eq!(set.zadd(b"b", 5.0, opts("nx")), Ok(1));
    assert_eq!(set.zadd(b"c", 5.0, opts("xx")), Ok(0));
    assert_eq!(set.zscore(b"c"), None);
    assert_eq!(set.zadd(b"a", 7.0, opts("xx ch")), Ok(1));
    assert_eq!(set.zscore(b"a"), Some(7.0));
}

#[test]
fn zadd_gt_and_lt_only_move_one_way_but_still_add_new_members() {
    // Redis 7: ZADD k GT CH 0 x 5 y 3 new  (x=1, y=2)  -> 2
    let mut set = set_of(&[("x", 1.0), ("y", 2.0)]);
    let added_or_changed: usize = [("x", 0.0), ("y", 5.0), ("new", 3.0)]
        .iter()
        .map(|&(member, score)| set.zadd(member.as_bytes(), score, opts("gt ch")).unwrap())
        .sum();
    assert_eq!(added_or_changed, 2);
    assert_eq!(set.zscore(b"x"), Some(1.0));
    assert_eq!(set.zscore(b"y"), Some(5.0));
    assert_eq!(set.zscore(b"new"), Some(3.0));

    assert_eq!(set.zadd(b"y", 5.0, opts("gt ch")), Ok(0), "equal is not greater");
    assert_eq!(set.zadd(b"y", 9.0, opts("lt ch")), Ok(0));
    assert_eq!(set.zadd(b"y", -1.0, opts("lt ch")), Ok(1));
    assert_eq!(set.zadd(b"fresh", 4.0, opts("lt")), Ok(1));
    assert_eq!(
        set.zadd(b"z", 1.0, opts("xx gt")),
        Ok(0),
        "xx still refuses new members"
    );
    set.check_invariants();
}

#[test]
fn zadd_refuses_option_conflicts_before_looking_at_the_score() {
    let mut set = SortedSet::new();
    for flags in ["nx xx", "gt lt", "nx gt", "nx lt", "nx xx gt"] {
        let refused = set.zadd(b"m", f64::NAN, opts(flags));
        assert!(
            matches!(refused, Err(ZsetError::IncompatibleOptions(_))),
            "{flags}: {refused:?}"
        );
    }
    assert_eq!(
        set.zadd(b"m", 1.0, opts("nx xx")).unwrap_err().to_string(),
        "xx and nx options at the same time are not compatible"
    );
    assert_eq!(
        set.zadd(b"m", 1.0, opts("gt lt")).unwrap_err().to_string(),
        "gt, lt, and/or nx options at the same time are not compatible"
    );
    assert_eq!(
        set.zadd(b"m", 1.0, opts("xx gt ch")),
        Ok(0),
        "xx with gt is allowed"
    );
    assert!(set.is_empty());
}

#[test]
fn nan_scores_are_refused_and_change_nothing() {
    let mut set = set_of(&[("a", 1.0)]);
    assert_eq!(set.zadd(b"a", f64::NAN, opts("")), Err(ZsetError::NotANumber));
    assert_eq!(set.insert(b"b", f64::NAN), Err(ZsetError::NotANumber));
    assert_eq!(set.zincrby(b"a", f64::NAN), Err(ZsetError::NotANumber));
    assert_eq!(set.zincrby(b"c", f64::NAN), Err(ZsetError::NotANumber));
    assert_eq!(set.len(), 1);
    assert_eq!(set.zscore(b"a"), Some(1.0));
    set.check_invariants();
}

#[test]
fn infinite_scores_are_ordinary_scores() {
    let set = set_of(&[
        ("top", f64::INFINITY),
        ("bottom", f64::NEG_INFINITY),
        ("mid", 0.0),
        ("top2", f64::INFINITY),
    ]);
    assert_eq!(all(&set), ["bottom", "mid", "top", "top2"]);
    assert_eq!(set.zcount(POS_INF, POS_INF), 2);
    assert_eq!(set.zcount(ScoreBound::Exclusive(f64::NEG_INFINITY), POS_INF), 3);
}

#[test]
fn negative_zero_is_the_same_score_as_zero() {
    let mut set = SortedSet::new();
    set.insert(b"b", -0.0).unwrap();
    set.insert(b"a", 0.0).unwrap();
    let stored = set.zscore(b"b").unwrap();
    assert_eq!(stored.to_bits(), 0.0f64.to_bits(), "-0.0 is stored as 0.0");
    assert_eq!(all(&set), ["a", "b"], "a tie, so member order decides");
    assert_eq!(set.zadd(b"a", -0.0, opts("ch")), Ok(0), "not a change");
    assert_eq!(
        set.zcount(ScoreBound::Inclusive(-0.0), ScoreBound::Inclusive(-0.0)),
        2
    );
    assert_eq!(set.zcount(ScoreBound::Exclusive(-0.0), POS_INF), 0);
    assert_eq!(set.zincrby(b"c", -0.0).unwrap().to_bits(), 0.0f64.to_bits());
    assert_eq!(set.zincrby(b"a", -0.0).unwrap().to_bits(), 0.0f64.to_bits());
    // Rankings negate scores: -(0.0) must land with the zeros.
    set.insert(b"d", -(0.0f64)).unwrap();
    assert_eq!(set.zrank(b"d"), Some(3));
    set.check_invariants();
}

// ----- ZINCRBY ---------------------------------------------------------------------------------------------

#[test]
fn zincrby_starts_missing_members_at_zero_and_returns_the_new_score() {
    let mut set = SortedSet::new();
    assert_eq!(set.zincrby(b"a", 2.5), Ok(2.5));
    assert_eq!(set.zincrby(b"a", -1.0), Ok(1.5));
    assert_eq!(set.zincrby(b"b", f64::INFINITY), Ok(f64::INFINITY));
    assert_eq!(set.zincrby(b"b", 1.0), Ok(f64::INFINITY));
    assert_eq!(all(&set), ["a", "b"]);
    set.check_invariants();
}

#[test]
fn zincrby_refuses_a_nan_result_and_leaves_the_member_alone() {
    // Redis 7: ZINCRBY k -inf m (m = inf) -> ERR resulting score is not a number (NaN)
    let mut set = set_of(&[("m", f64::INFINITY), ("n", 1.0)]);
    assert_eq!(set.zincrby(b"m", f64::NEG_INFINITY), Err(ZsetError::NotANumber));
    assert_eq!(set.zscore(b"m"), Some(f64::INFINITY));
    assert_eq!(all(&set), ["n", "m"]);
    set.check_invariants();
}

#[test]
fn zincrby_moves_the_member_in_rank() {
    let mut set = set_of(&[("a", 1.0), ("b", 2.0), ("c", 3.0)]);
    set.zincrby(b"a", 10.0).unwrap();
    assert_eq!(all(&set), ["b", "c", "a"]);
    assert_eq!(set.zrevrank(b"a"), Some(0));
}

// ----- ZREM, ZSCORE, ZCARD ---------------------------------------------------------------------------------

#[test]
fn zrem_removes_only_present_members() {
    let mut set = set_of(&[("a", 1.0), ("b", 2.0)]);
    assert!(set.zrem(b"a"));
    assert!(!set.zrem(b"a"));
    assert!(!set.zrem(b"missing"));
    assert_eq!(set.zscore(b"a"), None);
    assert_eq!(set.zrank(b"b"), Some(0));
    assert_eq!(set.zcard(), 1);
    assert!(set.zrem(b"b"));
    assert!(set.is_empty());
    assert_eq!(set.heap_bytes(), 0, "an emptied set gives its memory back");
    set.check_invariants();
}

#[test]
fn empty_set_answers_every_query() {
    let set = SortedSet::new();
    assert_eq!((set.len(), set.zcard(), set.is_empty()), (0, 0, true));
    assert_eq!(set.zscore(b"a"), None);
    assert_eq!(set.zrank(b"a"), None);
    assert_eq!(set.zrevrank(b"a"), None);
    assert_eq!(set.zcount(NEG_INF, POS_INF), 0);
    assert!(set.range_by_rank(0, -1, false).is_empty());
    assert!(set.range_by_rank(0, -1, true).is_empty());
    assert!(set.range_by_score(NEG_INF, POS_INF, true, None).is_empty());
    assert_eq!(set.iter_from_rank(0).count(), 0);
    assert_eq!(set.heap_bytes(), 0, "new() allocates nothing");
    let mut set = set;
    assert!(set.pop_min(3).is_empty());
    assert!(set.pop_max(3).is_empty());
    assert_eq!(set.remove_range_by_rank(0, -1), 0);
    assert_eq!(set.remove_range_by_score(NEG_INF, POS_INF), 0);
    set.check_invariants();
}

#[test]
fn members_are_arbitrary_bytes() {
    let mut set = SortedSet::new();
    for member in [&b""[..], b"\x00", b"\xff\xfe", b"a\x00b"] {
        set.insert(member, 1.0).unwrap();
    }
    let members: Vec<&[u8]> = set.iter().map(|(member, _)| member).collect();
    assert_eq!(members, [&b""[..], b"\x00", b"a\x00b", b"\xff\xfe"]);
    assert_eq!(set.zscore(b""), Some(1.0));
    set.check_invariants();
}

// ----- ordering --------------------------------------------------------------------------------------------

#[test]
fn ties_are_ordered_by_member_bytes_and_rev_reverses_them() {
    let set = set_of(&[
        ("b", 1.0),
        ("ab", 1.0),
        ("a", 1.0),
        ("B", 1.0),
        ("c", 0.0),
        ("\u{e9}", 1.0),
    ]);
    // Byte order: uppercase before lowercase, a prefix before its extensions, UTF-8 (0xC3 ..) last.
    assert_eq!(all(&set), ["c", "B", "a", "ab", "b", "\u{e9}"]);
    assert_eq!(
        names(&set.range_by_rank(0, -1, true)),
        ["\u{e9}", "b", "ab", "a", "B", "c"]
    );
    assert_eq!(
        names(&set.range_by_score(ScoreBound::Inclusive(1.0), POS_INF, true, None)),
        ["\u{e9}", "b", "ab", "a", "B"]
    );
    assert_eq!(set.zrank(b"ab"), Some(3));
    assert_eq!(set.zrevrank(b"ab"), Some(2));
}

#[test]
fn many_equal_scores_spanning_many_nodes_keep_member_order() {
    let mut set = SortedSet::with_layout(NodeLayout::small(4, 4));
    // Insert in a scrambled order so ties are placed by member comparison, not arrival.
    for i in (0..500u32).map(|i| (i * 7919) % 500) {
        set.insert(format!("m{i:03}").as_bytes(), 42.0).unwrap();
    }
    set.check_invariants();
    for i in 0..500usize {
        assert_eq!(set.zrank(format!("m{i:03}").as_bytes()), Some(i));
    }
    for i in (0..500u32).step_by(3) {
        assert!(set.zrem(format!("m{i:03}").as_bytes()));
    }
    set.check_invariants();
    assert_eq!(set.zrank(b"m001"), Some(0));
}

// ----- ZCOUNT ----------------------------------------------------------------------------------------------

#[test]
fn zcount_honours_inclusive_exclusive_and_infinite_bounds() {
    let set = set_of(&[("a", 1.0), ("b", 2.0), ("c", 2.0), ("d", 3.0)]);
    let inc = ScoreBound::Inclusive;
    let exc = ScoreBound::Exclusive;
    assert_eq!(set.zcount(NEG_INF, POS_INF), 4);
    assert_eq!(set.zcount(inc(2.0), inc(2.0)), 2);
    assert_eq!(set.zcount(exc(2.0), inc(3.0)), 1);
    assert_eq!(set.zcount(inc(1.0), exc(2.0)), 1);
    assert_eq!(set.zcount(exc(2.0), exc(2.0)), 0);
    assert_eq!(set.zcount(inc(3.0), inc(1.0)), 0, "min above max");
    assert_eq!(set.zcount(inc(1.5), inc(2.5)), 2);
    assert_eq!(set.zcount(exc(f64::NEG_INFINITY), exc(f64::INFINITY)), 4);
    assert_eq!(
        set.zcount(inc(f64::NAN), POS_INF),
        0,
        "a NaN bound matches nothing"
    );
}

// ----- ZRANK / ZREVRANK ------------------------------------------------------------------------------------

#[test]
fn zrank_and_zrevrank_are_mirror_images() {
    let set = set_of(&[("a", 1.0), ("b", 2.0), ("c", 3.0)]);
    assert_eq!(set.zrank(b"a"), Some(0));
    assert_eq!(set.zrank(b"c"), Some(2));
    assert_eq!(set.zrevrank(b"a"), Some(2));
    assert_eq!(set.zrevrank(b"c"), Some(0));
    assert_eq!(set.zrank(b"zzz"), None);
    assert_eq!(set.zrevrank(b"zzz"), None);
}

// ----- ZRANGE by rank --------------------------------------------------------------------------------------

fn five() -> SortedSet {
    set_of(&[("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0), ("e", 5.0)])
}

#[test]
fn range_by_rank_follows_redis_index_rules() {
    let set = five();
    assert_eq!(names(&set.range_by_rank(0, -1, false)), ["a", "b", "c", "d", "e"]);
    assert_eq!(names(&set.range_by_rank(1, 2, false)), ["b", "c"]);
    assert_eq!(
        names(&set.range_by_rank(-2, -1, false)),
        ["d", "e"],
        "negative from the end"
    );
    assert_eq!(
        names(&set.range_by_rank(-100, 1, false)),
        ["a", "b"],
        "start clamps to 0"
    );
    assert_eq!(
        names(&set.range_by_rank(3, 100, false)),
        ["d", "e"],
        "stop clamps to the end"
    );
    assert!(set.range_by_rank(3, 1, false).is_empty(), "start > stop");
    assert!(set.range_by_rank(5, 10, false).is_empty(), "start past the end");
    assert!(set.range_by_rank(-1, -2, false).is_empty());
    assert!(
        set.range_by_rank(0, -6, false).is_empty(),
        "stop before the start"
    );
    assert_eq!(names(&set.range_by_rank(i64::MIN, i64::MAX, false)).len(), 5);
    assert_eq!(set.range_by_rank(2, 2, false), [(&b"c"[..], 3.0)]);
}

#[test]
fn range_by_rank_rev_counts_from_the_highest() {
    // Redis 7: ZRANGE k 0 0 REV -> the highest member
    let set = five();
    assert_eq!(names(&set.range_by_rank(0, 0, true)), ["e"]);
    assert_eq!(names(&set.range_by_rank(0, 2, true)), ["e", "d", "c"]);
    assert_eq!(names(&set.range_by_rank(-2, -1, true)), ["b", "a"]);
    assert_eq!(names(&set.range_by_rank(3, 100, true)), ["b", "a"]);
    assert!(set.range_by_rank(2, 1, true).is_empty());
}

// ----- ZRANGE by score -------------------------------------------------------------------------------------

#[test]
fn range_by_score_with_bounds_rev_and_limit() {
    let set = five();
    let inc = ScoreBound::Inclusive;
    let exc = ScoreBound::Exclusive;
    assert_eq!(
        names(&set.range_by_score(inc(2.0), inc(4.0), false, None)),
        ["b", "c", "d"]
    );
    assert_eq!(names(&set.range_by_score(exc(2.0), exc(4.0), false, None)), ["c"]);
    assert_eq!(
        names(&set.range_by_score(exc(1.0), inc(5.0), true, None)),
        ["e", "d", "c", "b"]
    );
    assert!(set.range_by_score(inc(4.0), inc(2.0), false, None).is_empty());
    assert!(set.range_by_score(exc(5.0), POS_INF, false, None).is_empty());

    assert_eq!(
        names(&set.range_by_score(NEG_INF, POS_INF, false, Some((1, 2)))),
        ["b", "c"]
    );
    assert_eq!(
        names(&set.range_by_score(NEG_INF, POS_INF, true, Some((1, 2)))),
        ["d", "c"]
    );
    assert_eq!(
        names(&set.range_by_score(NEG_INF, POS_INF, false, Some((3, -1)))),
        ["d", "e"],
        "negative count means all"
    );
    assert!(set
        .range_by_score(NEG_INF, POS_INF, false, Some((0, 0)))
        .is_empty());
    assert!(set
        .range_by_score(NEG_INF, POS_INF, false, Some((5, 10)))
        .is_empty());
    assert_eq!(
        names(&set.range_by_score(NEG_INF, POS_INF, false, Some((4, 10)))),
        ["e"]
    );
    assert_eq!(
        names(&set.range_by_score(inc(2.0), inc(4.0), true, Some((2, 5)))),
        ["b"]
    );
}

#[test]
fn range_by_score_returns_scores() {
    let set = set_of(&[("a", -1.5), ("b", f64::INFINITY)]);
    assert_eq!(
        set.range_by_score(NEG_INF, POS_INF, false, None),
        [(&b"a"[..], -1.5), (&b"b"[..], f64::INFINITY)]
    );
}

// ----- iteration -------------------------------------------------------------------------------------------

#[test]
fn iter_from_rank_pages_through_the_set() {
    let mut set = SortedSet::with_layout(NodeLayout::small(4, 4));
    for i in 0..100 {
        set.insert(format!("m{i:02}").as_bytes(), f64::from(i)).unwrap();
    }
    let page: Vec<_> = set.iter_from_rank(37).take(5).map(|(_, score)| score).collect();
    assert_eq!(page, [37.0, 38.0, 39.0, 40.0, 41.0]);
    assert_eq!(set.iter_from_rank(95).count(), 5);
    assert_eq!(set.iter_from_rank(100).count(), 0);
    assert_eq!(set.iter_from_rank(usize::MAX).count(), 0);
    assert_eq!(set.iter().count(), 100);
}

// ----- ZPOPMIN / ZPOPMAX -----------------------------------------------------------------------------------

#[test]
fn pop_min_and_pop_max_take_from_the_ends() {
    let mut set = five();
    assert_eq!(set.pop_min(2), [(b"a".to_vec(), 1.0), (b"b".to_vec(), 2.0)]);
    assert_eq!(owned_names(&set.pop_max(1)), ["e"]);
    assert!(set.pop_min(0).is_empty());
    assert_eq!(
        owned_names(&set.pop_max(10)),
        ["d", "c"],
        "count above ZCARD returns all"
    );
    assert!(set.is_empty());
    assert_eq!(set.heap_bytes(), 0);
    set.check_invariants();
}

// ----- ZREMRANGEBYSCORE / ZREMRANGEBYRANK ------------------------------------------------------------------

#[test]
fn remove_range_by_score_removes_what_range_by_score_returns() {
    let mut set = five();
    assert_eq!(
        set.remove_range_by_score(ScoreBound::Exclusive(1.0), ScoreBound::Inclusive(3.0)),
        2
    );
    assert_eq!(all(&set), ["a", "d", "e"]);
    assert_eq!(set.remove_range_by_score(ScoreBound::Inclusive(9.0), POS_INF), 0);
    assert_eq!(set.remove_range_by_score(NEG_INF, POS_INF), 3);
    assert!(set.is_empty());
    set.check_invariants();
}

#[test]
fn remove_range_by_rank_follows_redis_index_rules() {
    let mut set = five();
    assert_eq!(set.remove_range_by_rank(-2, -1), 2);
    assert_eq!(all(&set), ["a", "b", "c"]);
    assert_eq!(set.remove_range_by_rank(2, 1), 0);
    assert_eq!(set.remove_range_by_rank(5, 9), 0);
    assert_eq!(set.remove_range_by_rank(-100, 0), 1);
    assert_eq!(all(&set), ["b", "c"]);
    set.check_invariants();
}

#[test]
fn removing_most_of_a_large_set_rebuilds_it_small() {
    let mut set = SortedSet::new();
    for i in 0..20_000 {
        set.insert(format!("member-{i}").as_bytes(), f64::from(i % 97))
            .unwrap();
    }
    let before = set.heap_bytes();
    let expected: Vec<(Vec<u8>, f64)> = set
        .iter()
        .skip(19_000)
        .map(|(member, score)| (member.to_vec(), score))
        .collect();
    assert_eq!(set.remove_range_by_rank(0, 18_999), 19_000);
    set.check_invariants();
    let after: Vec<(Vec<u8>, f64)> = set.iter().map(|(m, s)| (m.to_vec(), s)).collect();
    assert_eq!(after, expected);
    assert!(
        set.heap_bytes() * 10 < before,
        "{} -> {}",
        before,
        set.heap_bytes()
    );
}

#[test]
fn shrinking_one_member_at_a_time_gives_memory_back() {
    let mut set = SortedSet::new();
    for i in 0..10_000 {
        set.insert(format!("member-{i}").as_bytes(), f64::from(i))
            .unwrap();
    }
    let full = set.heap_bytes();
    for i in 0..9_000 {
        assert!(set.zrem(format!("member-{i}").as_bytes()));
    }
    set.check_invariants();
    assert_eq!(set.len(), 1_000);
    assert!(set.heap_bytes() * 3 < full, "{} -> {}", full, set.heap_bytes());
    assert_eq!(set.zrank(b"member-9000"), Some(0));
}

#[test]
fn member_bytes_are_reused_and_compacted() {
    let mut set = SortedSet::new();
    // Uniform names too long to store inline reuse the spans of removed members, so churn never grows
    // the arena...
    for i in 0..2_000 {
        set.insert(format!("queue-member-{i:06}").as_bytes(), f64::from(i))
            .unwrap();
    }
    let steady = set.heap_bytes();
    for i in 2_000..20_000 {
        set.pop_min(1);
        set.insert(format!("queue-member-{i:06}").as_bytes(), f64::from(i))
            .unwrap();
    }
    // Node slabs may settle a little differently; the arena alone would have grown by 144 KB.
    assert!(
        set.heap_bytes() <= steady + steady / 10,
        "{steady} -> {}",
        set.heap_bytes()
    );
    set.check_invariants();
    // ...and mixed lengths leave garbage that compaction collects.
    for i in 0..5_000u32 {
        set.pop_min(1);
        let long = format!("long-member-name-{i:06}-{}", "x".repeat(i as usize % 50));
        set.insert(long.as_bytes(), f64::from(30_000 + i)).unwrap();
    }
    set.check_invariants();
    assert_eq!(set.len(), 2_000);
    assert_eq!(set.range_by_rank(-1, -1, false)[0].1, f64::from(34_999));
}

// ----- ZUNIONSTORE -----------------------------------------------------------------------------------------

#[test]
fn union_sums_weighted_scores() {
    let a = set_of(&[("x", 1.0), ("y", 2.0)]);
    let b = set_of(&[("y", 10.0), ("z", 3.0)]);
    let union = SortedSet::union(&[(&a, 1.0), (&b, 2.0)], Aggregate::Sum);
    union.check_invariants();
    assert_eq!(
        union.iter().collect::<Vec<_>>(),
        [(&b"x"[..], 1.0), (&b"z"[..], 6.0), (&b"y"[..], 22.0)]
    );
}

#[test]
fn union_min_and_max() {
    let a = set_of(&[("x", 1.0), ("y", 5.0)]);
    let b = set_of(&[("x", 3.0), ("y", 2.0)]);
    let min = SortedSet::union(&[(&a, 1.0), (&b, 1.0)], Aggregate::Min);
    assert_eq!((min.zscore(b"x"), min.zscore(b"y")), (Some(1.0), Some(2.0)));
    let max = SortedSet::union(&[(&a, 1.0), (&b, 1.0)], Aggregate::Max);
    assert_eq!((max.zscore(b"x"), max.zscore(b"y")), (Some(3.0), Some(5.0)));
}

#[test]
fn union_turns_inf_times_zero_and_inf_minus_inf_into_zero() {
    // Redis 7: ZUNIONSTORE d 2 a c AGGREGATE MIN WEIGHTS 0 1 with a = {m: inf}, c = {m: 5} -> m = 0
    let a = set_of(&[("m", f64::INFINITY)]);
    let c = set_of(&[("m", 5.0), ("c1", 1.0)]);
    let min = SortedSet::union(&[(&a, 0.0), (&c, 1.0)], Aggregate::Min);
    assert_eq!(min.zscore(b"m"), Some(0.0));
    // Redis 7: ZUNIONSTORE d 2 a a WEIGHTS 1 -1 -> m = 0
    let sum = SortedSet::union(&[(&a, 1.0), (&a, -1.0)], Aggregate::Sum);
    assert_eq!(sum.zscore(b"m"), Some(0.0));
    // A weight of -1 turns 0 into -0.0, which is stored as 0.
    let zero = set_of(&[("z", 0.0)]);
    let negated = SortedSet::union(&[(&zero, -1.0)], Aggregate::Sum);
    assert_eq!(negated.zscore(b"z").unwrap().to_bits(), 0.0f64.to_bits());
}

#[test]
fn union_folds_smallest_sources_first_like_redis() {
    // Redis 7, with a = {m: inf}, b = {m: -inf, b1: 1}, c = {m: 5, c1: 1, c2: 2}:
    // ZUNIONSTORE d 3 c a b -> m = 5, because Redis folds a, b, c (by size): inf + -inf = 0, then + 5.
    // Folding in the given order would give 5 + inf + -inf = 0.
    let a = set_of(&[("m", f64::INFINITY)]);
    let b = set_of(&[("m", f64::NEG_INFINITY), ("b1", 1.0)]);
    let c = set_of(&[("m", 5.0), ("c1", 1.0), ("c2", 2.0)]);
    let union = SortedSet::union(&[(&c, 1.0), (&a, 1.0), (&b, 1.0)], Aggregate::Sum);
    assert_eq!(union.zscore(b"m"), Some(5.0));
    assert_eq!(union.len(), 4);
    union.check_invariants();
}

#[test]
fn union_of_nothing_is_empty() {
    assert!(SortedSet::union(&[], Aggregate::Sum).is_empty());
    let empty = SortedSet::new();
    assert!(SortedSet::union(&[(&empty, 2.0)], Aggregate::Max).is_empty());
}

#[test]
fn union_result_is_a_normal_set_that_keeps_working() {
    let mut big = SortedSet::new();
    for i in 0..5_000 {
        big.insert(format!("m{i}").as_bytes(), f64::from(i % 13)).unwrap();
    }
    let mut union = SortedSet::union(&[(&big, 2.0)], Aggregate::Sum);
    union.check_invariants();
    for i in 0..2_000 {
        union.zincrby(format!("m{i}").as_bytes(), 1.0).unwrap();
        union.insert(format!("new{i}").as_bytes(), 3.0).unwrap();
    }
    union.check_invariants();
    assert_eq!(union.len(), 7_000);
}

// ----- ScoreBound::parse -----------------------------------------------------------------------------------

#[test]
fn score_bounds_parse_redis_syntax() {
    let inc = ScoreBound::Inclusive;
    let exc = ScoreBound::Exclusive;
    assert_eq!(ScoreBound::parse("1.5"), Ok(inc(1.5)));
    assert_eq!(ScoreBound::parse("(1.5"), Ok(exc(1.5)));
    assert_eq!(ScoreBound::parse("-inf"), Ok(inc(f64::NEG_INFINITY)));
    assert_eq!(ScoreBound::parse("+inf"), Ok(inc(f64::INFINITY)));
    assert_eq!(ScoreBound::parse("inf"), Ok(inc(f64::INFINITY)));
    assert_eq!(ScoreBound::parse("(-inf"), Ok(exc(f64::NEG_INFINITY)));
    assert_eq!(ScoreBound::parse("(+inf"), Ok(exc(f64::INFINITY)));
    assert_eq!(ScoreBound::parse("-3"), Ok(inc(-3.0)));
    assert_eq!(ScoreBound::parse("1e3"), Ok(inc(1000.0)));
    assert_eq!(ScoreBound::parse(".5"), Ok(inc(0.5)));
    assert_eq!(
        ScoreBound::parse("1e400"),
        Ok(inc(f64::INFINITY)),
        "overflow is inf, as in Redis"
    );
    for bad in [
        "", "(", "((1", "nan", "(nan", "abc", "1abc", " 1", "1 ", "0x10", "[1",
    ] {
        assert_eq!(ScoreBound::parse(bad), Err(ZsetError::NotANumber), "{bad:?}");
    }
}

// ----- plumbing --------------------------------------------------------------------------------------------

#[test]
fn clones_are_independent() {
    let mut original = five();
    let copy = original.clone();
    original.zrem(b"a");
    original.insert(b"f", 0.0).unwrap();
    assert_eq!(all(&copy), ["a", "b", "c", "d", "e"]);
    assert_eq!(all(&original), ["f", "b", "c", "d", "e"]);
    copy.check_invariants();
}

#[test]
fn debug_prints_members_and_scores_in_order() {
    let set = set_of(&[("b", 2.0), ("a\u{1}", 1.0)]);
    assert_eq!(format!("{set:?}"), r#"{b"a\x01": 1.0, b"b": 2.0}"#);
}

#[test]
fn with_capacity_behaves_like_new() {
    let mut set = SortedSet::with_capacity(1_000);
    assert!(set.heap_bytes() > 0);
    for i in 0..1_000 {
        set.insert(format!("m{i}").as_bytes(), f64::from(i)).unwrap();
    }
    assert_eq!(set.zrevrank(b"m0"), Some(999));
    set.check_invariants();
}

#[test]
fn errors_display_lowercase_reasons() {
    assert_eq!(
        ZsetError::NotANumber.to_string(),
        "score is not a valid float (nan or unparsable)"
    );
    let boxed: Box<dyn std::error::Error> = Box::new(ZsetError::NotANumber);
    assert!(boxed.source().is_none());
}
