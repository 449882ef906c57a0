//! The slab of entries: every member's bytes and score, addressed by a `u32` id.
//!
//! The tree and the hash index both refer to members by id, so each member's bytes are stored exactly
//! once. An entry is 20 bytes: the score, a length tag, and 11 bytes that hold a member of up to 11 bytes
//! inline (product ids like `sku-0000001`) or else the offset and length of its bytes in one shared arena. Inline
//! members cost no arena bytes and, more importantly, no extra cache miss when the index or a tie in the
//! tree compares them. Longer members live back to back in the arena, which avoids a heap allocation (and
//! its malloc header) per member.
//!
//! Removal leaves holes in the arena. Ids are reused last-in first-out, and a reused id takes over its old
//! byte span when the new member fits, so long members of one length (session ids, order ids) never grow
//! the arena in a steady add/remove workload. Mixed lengths leave garbage, and when garbage passes half
//! the arena it is compacted. Compaction only rewrites offsets here: ids do not move, so the tree and the
//! index are untouched.

use std::mem::size_of;

use crate::growth::{push_gently, reserve_gently};

/// Compacting a tiny arena saves nothing worth the copy. Tests compact early so the small sets of the
/// property tests go through compaction too.
const MIN_GARBAGE_TO_COMPACT: usize = if cfg!(test) { 64 } else { 4096 };

/// Members up to this long are stored in the entry itself.
const INLINE_LEN: usize = 11;

/// The `tag` of an entry whose member lives in the arena.
const IN_ARENA: u8 = u8::MAX;

/// One member: 20 bytes, alignment 1, so a slab of them has no padding.
///
/// Fields are byte arrays rather than `f64`/`u32` because an `f64` field would align the struct to 8 and
/// pad it to 24 bytes; the 4 bytes saved are a tenth of the set's memory at 1M members.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The member's score (native-endian `f64` bits); NaN marks a vacant entry, which no live score can be.
    score: [u8; 8],
    /// The member's length when it is stored inline (`0..=INLINE_LEN`), else [`IN_ARENA`].
    tag: u8,
    /// The member itself when inline; otherwise its arena offset and length (`u32` each, little-endian).
    /// A vacant entry keeps them, so the next member can reuse the span.
    data: [u8; INLINE_LEN],
}

impl Entry {
    fn inline(member: &[u8], score: f64) -> Entry {
        debug_assert!(member.len() <= INLINE_LEN);
        let mut data = [0; INLINE_LEN];
        data[..member.len()].copy_from_slice(member);
        Entry {
            score: score.to_ne_bytes(),
            tag: member.len() as u8,
            data,
        }
    }

    fn arena_member(score: f64, offset: u32, len: u32) -> Entry {
        let mut data = [0; INLINE_LEN];
        data[..4].copy_from_slice(&offset.to_le_bytes());
        data[4..8].copy_from_slice(&len.to_le_bytes());
        Entry {
            score: score.to_ne_bytes(),
            tag: IN_ARENA,
            data,
        }
    }

    fn score(&self) -> f64 {
        f64::from_ne_bytes(self.score)
    }

    fn set_score(&mut self, score: f64) {
        self.score = score.to_ne_bytes();
    }

    fn is_vacant(&self) -> bool {
        self.score().is_nan()
    }

    fn is_inline(&self) -> bool {
        self.tag != IN_ARENA
    }

    /// Length of the member.
    fn len(&self) -> usize {
        if self.is_inline() {
            self.tag as usize
        } else {
            let [_, _, _, _, a, b, c, d, ..] = self.data;
            u32::from_le_bytes([a, b, c, d]) as usize
        }
    }

    /// Where an arena member starts; meaningless for an inline one.
    fn offset(&self) -> usize {
        let [a, b, c, d, ..] = self.data;
        u32::from_le_bytes([a, b, c, d]) as usize
    }

    /// Bytes this entry owns in the arena.
    fn arena_len(&self) -> usize {
        if self.is_inline() {
            0
        } else {
            self.len()
        }
    }
}

/// Member bytes and scores by id.
#[derive(Debug, Clone, Default)]
pub(crate) struct EntrySlab {
    /// Indexed by id.
    entries: Vec<Entry>,
    /// Bytes of members longer than `INLINE_LEN`, back to back, plus garbage from removed ones.
    bytes: Vec<u8>,
    /// Ids of vacant entries; the last one is reused first while its span is still warm in cache.
    vacant: Vec<u32>,
    /// Bytes of `bytes` that no live entry owns.
    garbage: usize,
}

impl EntrySlab {
    /// A slab with room for `members` entries and `member_bytes` arena bytes (members too long to be
    /// stored inline; see [`EntrySlab::arena_bytes_for`]) without reallocating.
    pub(crate) fn with_capacity(members: usize, member_bytes: usize) -> Self {
        EntrySlab {
            entries: Vec::with_capacity(members),
            bytes: Vec::with_capacity(member_bytes),
            vacant: Vec::new(),
            garbage: 0,
        }
    }

    /// Arena bytes `member` would need.
    pub(crate) fn arena_bytes_for(member: &[u8]) -> usize {
        if member.len() <= INLINE_LEN {
            0
        } else {
            member.len()
        }
    }

    /// The bytes of a live member.
    pub(crate) fn member(&self, id: u32) -> &[u8] {
        let entry = &self.entries[id as usize];
        debug_assert!(!entry.is_vacant(), "entry {id} is vacant");
        if entry.is_inline() {
            &entry.data[..entry.tag as usize]
        } else {
            let start = entry.offset();
            &self.bytes[start..start + entry.len()]
        }
    }

    /// The score of a live member.
    pub(crate) fn score(&self, id: u32) -> f64 {
        let score = self.entries[id as usize].score();
        debug_assert!(!score.is_nan(), "entry {id} is vacant");
        score
    }

    /// Changes the score of a live member. The caller moves it in the tree.
    pub(crate) fn set_score(&mut self, id: u32, score: f64) {
        debug_assert!(!score.is_nan());
        self.entries[id as usize].set_score(score);
    }

    /// Stores a new member and returns its id.
    ///
    /// # Panics
    ///
    /// When the arena would pass 4 GiB of member bytes or the slab 2³² − 1 entries, the limits of the
    /// `u32` offsets and ids that keep entries small.
    pub(crate) fn allocate(&mut self, member: &[u8], score: f64) -> u32 {
        debug_assert!(!score.is_nan());
        let len = u32::try_from(member.len()).expect("a member is at most 4 GiB");
        let reused = self.vacant.pop();
        let entry = if member.len() <= INLINE_LEN {
            Entry::inline(member, score)
        } else {
            let old_span = reused
                .map(|id| self.entries[id as usize])
                .filter(|old| !old.is_inline() && old.len() >= member.len());
            let offset = match old_span {
                // Same-length names (session ids, order ids) land in the span the last removal left.
                Some(old) => {
                    let start = old.offset();
                    self.bytes[start..start + member.len()].copy_from_slice(member);
                    self.garbage -= member.len();
                    start as u32
                }
                None => self.append_bytes(member),
            };
            Entry::arena_member(score, offset, len)
        };
        if let Some(id) = reused {
            self.entries[id as usize] = entry;
            return id;
        }
        let id = u32::try_from(self.entries.len())
            .ok()
            .filter(|&id| id != u32::MAX)
            .expect("a sorted set holds fewer than 2^32 - 1 members");
        push_gently(&mut self.entries, entry);
        id
    }

    fn append_bytes(&mut self, member: &[u8]) -> u32 {
        let offset = u32::try_from(self.bytes.len())
            .ok()
            .filter(|offset| offset.checked_add(member.len() as u32).is_some())
            .expect("a sorted set holds at most 4 GiB of member bytes");
        reserve_gently(&mut self.bytes, member.len());
        self.bytes.extend_from_slice(member);
        offset
    }

    /// Forgets a member. Its id and byte span become reusable.
    pub(crate) fn release(&mut self, id: u32) {
        let entry = &mut self.entries[id as usize];
        debug_assert!(!entry.is_vacant(), "entry {id} released twice");
        entry.set_score(f64::NAN);
        self.garbage += entry.arena_len();
        self.vacant.push(id);
        if self.garbage >= MIN_GARBAGE_TO_COMPACT && self.garbage > self.bytes.len() / 2 {
            self.compact_bytes();
        }
    }

    /// Copies live members' bytes into a fresh, tight arena. Ids stay the same.
    fn compact_bytes(&mut self) {
        let live_bytes = self.bytes.len() - self.garbage;
        let mut compacted = Vec::with_capacity(live_bytes + live_bytes / 8);
        for entry in &mut self.entries {
            if entry.is_inline() {
                continue;
            }
            if entry.is_vacant() {
                // The vacant span goes away; a reused id appends its member.
                *entry = Entry::arena_member(f64::NAN, 0, 0);
                continue;
            }
            let start = entry.offset();
            let offset = compacted.len() as u32;
            let len = entry.len();
            compacted.extend_from_slice(&self.bytes[start..start + len]);
            *entry = Entry::arena_member(entry.score(), offset, len as u32);
        }
        debug_assert_eq!(compacted.len(), live_bytes);
        self.bytes = compacted;
        self.garbage = 0;
    }

    /// Number of ids in use or vacant: the size of the slab, which only a rebuild shrinks.
    pub(crate) fn slot_count(&self) -> usize {
        self.entries.len()
    }

    /// Heap bytes reserved by the slab, from capacities.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Entry>()
            + self.bytes.capacity()
            + self.vacant.capacity() * size_of::<u32>()
    }

    /// Checks the slab's bookkeeping against `live_ids`, the ids the tree holds.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self, live_ids: &[u32]) {
        let mut is_live = vec![false; self.entries.len()];
        for &id in live_ids {
            assert!(!is_live[id as usize], "id {id} appears twice");
            is_live[id as usize] = true;
            assert!(
                !self.entries[id as usize].is_vacant(),
                "live id {id} is marked vacant"
            );
        }
        let mut is_vacant = vec![false; self.entries.len()];
        for &id in &self.vacant {
            assert!(!is_vacant[id as usize], "vacant id {id} listed twice");
            is_vacant[id as usize] = true;
            assert!(
                self.entries[id as usize].is_vacant(),
                "vacant id {id} has a score"
            );
        }
        for (id, entry) in self.entries.iter().enumerate() {
            assert!(is_live[id] != is_vacant[id], "id {id} is neither live nor vacant");
            assert!(entry.is_inline() || entry.offset() + entry.arena_len() <= self.bytes.len());
        }
        let live_bytes: usize = live_ids
            .iter()
            .map(|&id| self.entries[id as usize].arena_len())
            .sum();
        assert_eq!(live_bytes + self.garbage, self.bytes.len(), "garbage accounting");
    }
}
