//! [`SortedSet`]: the Redis commands, on top of the entry slab, the member index and the tree.
//!
//! Every command follows the same path: the index turns a member into an id, the slab gives its score, and
//! the `(score, id)` key is what the tree orders. This module owns the Redis rules (option conflicts, NaN,
//! `-0.0`, index clamping, `LIMIT`) so the layers below only ever see valid, normalized input.

use std::fmt;

use crate::entries::EntrySlab;
use crate::index::MemberIndex;
use crate::tree::{Key, NodeLayout, OrderTree};
use crate::{AddOptions, ScoreBound, ZsetError};

/// Below this many slab slots a set is never rebuilt to shrink: the copy would save almost nothing.
const MIN_SLOTS_TO_SHRINK: usize = 32;

/// A sorted set of byte-string members with `f64` scores, with Redis semantics.
///
/// Order is by score ascending, then by member bytes ascending; "rev" variants read that order backwards.
/// Scores are never NaN, and `-0.0` is stored as `0.0`.
///
/// # Complexity
///
/// `zadd`, `zincrby`, `zrem`, `zrank`, `zrevrank`, `zcount` and finding where a range starts are
/// O(log n); `zscore` is O(1); a range of k elements is O(log n + k). Removing more than half the set at once
/// (`remove_range_*`) rebuilds the rest in O(n), and so does a removal that leaves the set at under a quarter
/// of its peak size, which gives the memory back.
///
/// # Limits
///
/// A set holds fewer than 2³² − 1 members, and at most 4 GiB of bytes in members longer than 11 bytes
/// (shorter ones are stored inline). Ids and offsets are `u32`, which is part of what keeps a member at
/// about 37 bytes. Going past either limit panics, as `Vec` does on capacity overflow.
#[derive(Clone, Default)]
pub struct SortedSet {
    /// Member bytes and scores by id: the only copy of each member.
    entries: EntrySlab,
    /// Member → id, so a command finds a member's score before it touches the tree.
    index: MemberIndex,
    /// `(score, id)` keys in Redis order with subtree counts, for ranks and ranges.
    tree: OrderTree,
}

/// Turns `-0.0` into `0.0`, so both are the same score (rankings negate scores, and `-(0.0)` is `-0.0`).
fn normalize_score(score: f64) -> f64 {
    if score == 0.0 {
        0.0
    } else {
        score
    }
}

/// Converts Redis `start`/`stop` indexes (inclusive, negative counting from the end) into a half-open
/// range of ascending ranks, or `None` when it selects nothing. Same steps as Redis's `zrangeGenericCommand`.
fn resolve_rank_range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = i64::try_from(len).expect("len fits in i64");
    let start = if start < 0 { start + len } else { start }.max(0);
    let stop = if stop < 0 { stop + len } else { stop };
    if start > stop || start >= len {
        return None;
    }
    let stop = stop.min(len - 1);
    Some((start as usize, stop as usize + 1))
}

impl SortedSet {
    /// An empty set. It allocates nothing until the first member arrives.
    pub fn new() -> Self {
        SortedSet::default()
    }

    /// An empty set with room for `members` members in the slab, the index and the tree.
    pub fn with_capacity(members: usize) -> Self {
        let mut tree = OrderTree::default();
        tree.reserve(members);
        SortedSet {
            entries: EntrySlab::with_capacity(members, 0),
            index: MemberIndex::with_capacity(members),
            tree,
        }
    }

    /// An empty set whose tree uses `layout`; tests use small nodes to get deep trees.
    pub(crate) fn with_layout(layout: NodeLayout) -> Self {
        SortedSet {
            tree: OrderTree::new(layout),
            ..SortedSet::default()
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// Whether the set has no members.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `ZADD` of one member with options. Returns how many members were added, or with `ch` added plus
    /// changed, so 0 or 1.
    ///
    /// As in Redis: NX with XX, GT with LT, and GT or LT with NX are refused before the score is looked at;
    /// a NaN score is refused; GT and LT never stop a new member from being added; setting the score a
    /// member already has is not a change.
    pub fn zadd(&mut self, member: &[u8], score: f64, opts: AddOptions) -> Result<usize, ZsetError> {
        opts.check_compatible()?;
        if score.is_nan() {
            return Err(ZsetError::NotANumber);
        }
        let score = normalize_score(score);
        let Some(id) = self.index.find(member, &self.entries) else {
            if opts.xx {
                return Ok(0);
            }
            self.add_new(member, score);
            return Ok(1);
        };
        if opts.nx {
            return Ok(0);
        }
        let current = self.entries.score(id);
        let refused_by_gt_or_lt = (opts.gt && score <= current) || (opts.lt && score >= current);
        if refused_by_gt_or_lt || score == current {
            return Ok(0);
        }
        self.move_to_score(id, score);
        Ok(usize::from(opts.ch))
    }

    /// Plain `ZADD` of one member: adds it or updates its score. Returns whether it was new.
    pub fn insert(&mut self, member: &[u8], score: f64) -> Result<bool, ZsetError> {
        Ok(self.zadd(member, score, AddOptions::default())? == 1)
    }

    /// `ZINCRBY`: adds `delta` to the member's score (a missing member starts at 0) and returns the new score.
    ///
    /// A NaN `delta`, or a NaN result such as `+inf + -inf`, is refused and leaves the set unchanged.
    pub fn zincrby(&mut self, member: &[u8], delta: f64) -> Result<f64, ZsetError> {
        if delta.is_nan() {
            return Err(ZsetError::NotANumber);
        }
        let Some(id) = self.index.find(member, &self.entries) else {
            let score = normalize_score(delta);
            self.add_new(member, score);
            return Ok(score);
        };
        let current = self.entries.score(id);
        let score = current + delta;
        if score.is_nan() {
            return Err(ZsetError::NotANumber);
        }
        let score = normalize_score(score);
        if score != current {
            self.move_to_score(id, score);
        }
        Ok(score)
    }

    /// `ZREM` of one member. Returns whether it was there.
    pub fn zrem(&mut self, member: &[u8]) -> bool {
        let Some(id) = self.index.find(member, &self.entries) else {
            return false;
        };
        self.remove_key(self.key_of(id));
        self.after_removals();
        true
    }

    /// `ZSCORE`: the member's score.
    pub fn zscore(&self, member: &[u8]) -> Option<f64> {
        let id = self.index.find(member, &self.entries)?;
        Some(self.entries.score(id))
    }

    /// `ZCARD`: the number of members, same as [`SortedSet::len`].
    pub fn zcard(&self) -> usize {
        self.len()
    }

    /// `ZCOUNT`: how many members have a score within `min..max` (bounds as given). O(log n).
    pub fn zcount(&self, min: ScoreBound, max: ScoreBound) -> usize {
        let (start, end) = self.rank_span_for_scores(min, max);
        end - start
    }

    /// `ZRANK`: the member's 0-based position in ascending order.
    pub fn zrank(&self, member: &[u8]) -> Option<usize> {
        let id = self.index.find(member, &self.entries)?;
        Some(self.tree.rank_of(self.key_of(id), &self.entries))
    }

    /// `ZREVRANK`: the member's 0-based position in descending order.
    pub fn zrevrank(&self, member: &[u8]) -> Option<usize> {
        self.zrank(member).map(|rank| self.len() - 1 - rank)
    }

    /// `ZRANGE start stop [REV]`: members by position, both ends inclusive.
    ///
    /// Redis index rules: negative indexes count from the end (-1 is the last), indexes past either end are
    /// clamped, and `start > stop` selects nothing. With `rev`, positions count from the highest member.
    pub fn range_by_rank(&self, start: i64, stop: i64, rev: bool) -> Vec<(&[u8], f64)> {
        let Some((start, end)) = resolve_rank_range(start, stop, self.len()) else {
            return Vec::new();
        };
        let count = end - start;
        if rev {
            // Reversed position p is ascending rank len - 1 - p.
            let highest = self.len() - 1 - start;
            self.tree
                .descending_from(highest)
                .take(count)
                .map(|id| self.pair(id))
                .collect()
        } else {
            self.iter_from_rank(start).take(count).collect()
        }
    }

    /// `ZRANGE min max BYSCORE [REV] [LIMIT offset count]`: members with a score within the bounds.
    ///
    /// `min` and `max` are the numeric bounds whatever the direction (Redis swaps them on the command line
    /// with REV; this API does not). With `rev` the result runs from the highest score down. `limit` skips
    /// `offset` members of the result and keeps at most `count`; a negative `count` keeps all.
    pub fn range_by_score(
        &self,
        min: ScoreBound,
        max: ScoreBound,
        rev: bool,
        limit: Option<(usize, i64)>,
    ) -> Vec<(&[u8], f64)> {
        let (start, end) = self.rank_span_for_scores(min, max);
        let (offset, count) = limit.unwrap_or((0, -1));
        let available = (end - start).saturating_sub(offset);
        let count = usize::try_from(count).map_or(available, |count| count.min(available));
        if count == 0 {
            return Vec::new();
        }
        if rev {
            self.tree
                .descending_from(end - 1 - offset)
                .take(count)
                .map(|id| self.pair(id))
                .collect()
        } else {
            self.iter_from_rank(start + offset).take(count).collect()
        }
    }

    /// Members in ascending order from position `rank` on, lazily; empty when `rank >= len`. For paging
    /// through a large set without collecting it.
    pub fn iter_from_rank(&self, rank: usize) -> impl Iterator<Item = (&[u8], f64)> + '_ {
        self.tree.ascending_from(rank).map(move |id| self.pair(id))
    }

    /// All members in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], f64)> + '_ {
        self.iter_from_rank(0)
    }

    /// `ZPOPMIN count`: removes and returns up to `count` members with the lowest scores, lowest first.
    pub fn pop_min(&mut self, count: usize) -> Vec<(Vec<u8>, f64)> {
        self.pop_with(count, OrderTree::first)
    }

    /// `ZPOPMAX count`: removes and returns up to `count` members with the highest scores, highest first.
    pub fn pop_max(&mut self, count: usize) -> Vec<(Vec<u8>, f64)> {
        self.pop_with(count, OrderTree::last)
    }

    fn pop_with(&mut self, count: usize, end: fn(&OrderTree) -> Option<u32>) -> Vec<(Vec<u8>, f64)> {
        let mut popped = Vec::with_capacity(count.min(self.len()));
        while popped.len() < count {
            let Some(id) = end(&self.tree) else { break };
            let key = self.key_of(id);
            popped.push((self.entries.member(key.id).to_vec(), key.score));
            self.remove_key(key);
        }
        self.after_removals();
        popped
    }

    /// `ZREMRANGEBYSCORE`: removes the members with a score within the bounds; returns how many.
    pub fn remove_range_by_score(&mut self, min: ScoreBound, max: ScoreBound) -> usize {
        let (start, end) = self.rank_span_for_scores(min, max);
        self.remove_rank_span(start, end)
    }

    /// `ZREMRANGEBYRANK`: removes the members at positions `start..=stop` (Redis index rules, as in
    /// [`SortedSet::range_by_rank`]); returns how many.
    pub fn remove_range_by_rank(&mut self, start: i64, stop: i64) -> usize {
        match resolve_rank_range(start, stop, self.len()) {
            Some((start, end)) => self.remove_rank_span(start, end),
            None => 0,
        }
    }

    /// Heap bytes this set holds, computed from capacities (not from the allocator, so the number is
    /// deterministic). Malloc headers are not included; they are a few bytes per buffer, and buffers are
    /// per set, not per member.
    pub fn heap_bytes(&self) -> usize {
        self.entries.heap_bytes() + self.index.heap_bytes() + self.tree.heap_bytes()
    }

    // ----- internals -------------------------------------------------------------------------------------

    fn key_of(&self, id: u32) -> Key {
        Key {
            score: self.entries.score(id),
            id,
        }
    }

    fn pair(&self, id: u32) -> (&[u8], f64) {
        (self.entries.member(id), self.entries.score(id))
    }

    fn add_new(&mut self, member: &[u8], score: f64) {
        let id = self.entries.allocate(member, score);
        self.index.insert_new(id, &self.entries);
        self.tree.insert(Key { score, id }, &self.entries);
    }

    fn move_to_score(&mut self, id: u32, score: f64) {
        self.tree.remove(self.key_of(id), &self.entries);
        self.entries.set_score(id, score);
        self.tree.insert(Key { score, id }, &self.entries);
    }

    /// Removes one member everywhere. The slab goes last: the tree and the index read the member's bytes.
    fn remove_key(&mut self, key: Key) {
        self.tree.remove(key, &self.entries);
        let removed = self.index.remove(self.entries.member(key.id), &self.entries);
        debug_assert_eq!(removed, Some(key.id));
        self.entries.release(key.id);
    }

    /// Gives memory back after removals: an empty set drops everything; a set down to under a quarter of its
    /// slab is rebuilt tight. Either way this happens at most once per several removals, so it is amortized.
    fn after_removals(&mut self) {
        let slots = self.entries.slot_count();
        if self.is_empty() {
            if slots > 0 {
                *self = SortedSet::with_layout(self.tree.layout());
            }
        } else if slots >= MIN_SLOTS_TO_SHRINK && self.len() * 4 < slots {
            let layout = self.tree.layout();
            let members: Vec<(&[u8], f64)> = self.iter().collect();
            let rebuilt = SortedSet::from_sorted_unique(&members, layout);
            *self = rebuilt;
        }
    }

    /// Removes the members at ascending ranks `start..end`; returns how many.
    fn remove_rank_span(&mut self, start: usize, end: usize) -> usize {
        let count = end.saturating_sub(start);
        if count == 0 {
            return 0;
        }
        if count * 2 > self.len() {
            // Most of the set goes: copying the survivors is O(n) and leaves a tight set, where removing one
            // by one would cost O(log n) each and leave the slabs mostly empty.
            let layout = self.tree.layout();
            let survivors: Vec<(&[u8], f64)> =
                self.iter().take(start).chain(self.iter_from_rank(end)).collect();
            let rebuilt = SortedSet::from_sorted_unique(&survivors, layout);
            *self = rebuilt;
        } else {
            let doomed: Vec<Key> = self
                .tree
                .ascending_from(start)
                .take(count)
                .map(|id| self.key_of(id))
                .collect();
            for key in doomed {
                self.remove_key(key);
            }
            self.after_removals();
        }
        count
    }

    /// Ascending ranks `start..end` of the members with a score within the bounds (`start == end` when
    /// none). A NaN bound matches nothing.
    fn rank_span_for_scores(&self, min: ScoreBound, max: ScoreBound) -> (usize, usize) {
        if min.value().is_nan() || max.value().is_nan() {
            return (0, 0);
        }
        let start = match min {
            ScoreBound::Inclusive(score) => self.tree.count_scores_below(score, false, &self.entries),
            ScoreBound::Exclusive(score) => self.tree.count_scores_below(score, true, &self.entries),
        };
        let end = match max {
            ScoreBound::Inclusive(score) => self.tree.count_scores_below(score, true, &self.entries),
            ScoreBound::Exclusive(score) => self.tree.count_scores_below(score, false, &self.entries),
        };
        (start, end.max(start))
    }

    /// Builds a set from members already in Redis order, without duplicates and with normalized scores.
    /// O(n) apart from hashing: the tree is bulk-loaded.
    pub(crate) fn from_sorted_unique(members: &[(&[u8], f64)], layout: NodeLayout) -> SortedSet {
        let member_bytes = members
            .iter()
            .map(|(member, _)| EntrySlab::arena_bytes_for(member))
            .sum();
        let mut set = SortedSet {
            entries: EntrySlab::with_capacity(members.len(), member_bytes),
            index: MemberIndex::with_capacity(members.len()),
            tree: OrderTree::new(layout),
        };
        let mut keys = Vec::with_capacity(members.len());
        for &(member, score) in members {
            debug_assert!(!score.is_nan() && score.to_bits() != (-0.0f64).to_bits());
            let id = set.entries.allocate(member, score);
            set.index.insert_new(id, &set.entries);
            keys.push(Key { score, id });
        }
        debug_assert!(
            keys.windows(2)
                .all(|pair| pair[0].cmp_in(pair[1], &set.entries).is_lt()),
            "from_sorted_unique: members are not sorted and unique"
        );
        set.tree = OrderTree::from_sorted_keys(&keys, layout, &set.entries);
        set
    }

    /// Checks that the tree, the index and the slab agree, and every structural invariant of each.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let keys = self.tree.check_invariants(&self.entries);
        let ids: Vec<u32> = keys.iter().map(|key| key.id).collect();
        self.entries.check_invariants(&ids);
        assert_eq!(self.index.len(), keys.len(), "index size");
        for key in &keys {
            let member = self.entries.member(key.id);
            assert_eq!(
                self.index.find(member, &self.entries),
                Some(key.id),
                "index entry"
            );
            assert_ne!(key.score.to_bits(), (-0.0f64).to_bits(), "-0.0 stored");
        }
    }
}

impl fmt::Debug for SortedSet {
    /// Prints members (as byte strings) and scores in order, like a map.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(member, score)| (MemberBytes(member), score)))
            .finish()
    }
}

/// Debug form of a member: `b"sku-1"`, with non-ASCII bytes escaped.
struct MemberBytes<'a>(&'a [u8]);

impl fmt::Debug for MemberBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}
