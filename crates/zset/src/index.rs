//! The hash index from member bytes to entry id, which makes `ZSCORE` O(1) and finds a member's score
//! before every tree descent.
//!
//! The table stores bare `u32` ids (4 bytes + 1 control byte per bucket) and hashes the member bytes in the
//! [`EntrySlab`] whenever it needs a hash, including when it grows. Storing the hash or the member in the
//! table would be faster to rehash but would cost 8+ bytes per member for an event that happens log n times.

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;

use crate::entries::EntrySlab;

#[derive(Debug, Clone, Default)]
pub(crate) struct MemberIndex {
    table: HashTable<u32>,
    /// Randomly seeded (foldhash), so members chosen by clients cannot be crafted to collide.
    hasher: DefaultHashBuilder,
}

impl MemberIndex {
    pub(crate) fn with_capacity(members: usize) -> Self {
        MemberIndex {
            table: HashTable::with_capacity(members),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// The id of `member`, if it is in the set.
    pub(crate) fn find(&self, member: &[u8], entries: &EntrySlab) -> Option<u32> {
        let hash = self.hasher.hash_one(member);
        self.table.find(hash, |&id| entries.member(id) == member).copied()
    }

    /// Adds the id of a member that is not in the index yet.
    pub(crate) fn insert_new(&mut self, id: u32, entries: &EntrySlab) {
        if self.table.len() == self.table.capacity() {
            self.clear_tombstones_if_sparse(entries);
        }
        let hasher = &self.hasher;
        let hash = hasher.hash_one(entries.member(id));
        debug_assert!(self
            .table
            .find(hash, |&other| entries.member(other) == entries.member(id))
            .is_none());
        self.table
            .insert_unique(hash, id, |&other| hasher.hash_one(entries.member(other)));
    }

    /// Rehashes into a table of the same size when tombstones, not members, have used up the room.
    ///
    /// hashbrown turns some removed slots into tombstones, which count against its spare room until the
    /// next rehash. When the room runs out it rehashes in place only if the table is at most half full, and
    /// otherwise doubles it. Under steady churn (a queue popping and adding members) a set whose index is
    /// between half and 7/8 full would double its index for nothing: ~10 more bytes per member at 1M
    /// members. Rebuilding at the same size clears the tombstones. Doing it only up to 3/4 full leaves at
    /// least a quarter of the table's capacity in removals between two rebuilds, so the O(n) rebuild is
    /// amortized O(1); above 3/4 the table is genuinely full and may double.
    fn clear_tombstones_if_sparse(&mut self, entries: &EntrySlab) {
        const MIN_BUCKETS_WORTH_REBUILDING: usize = 64;
        let buckets = self.table.num_buckets();
        if buckets < MIN_BUCKETS_WORTH_REBUILDING {
            return;
        }
        // hashbrown's usable capacity for a power-of-two bucket count of at least 16.
        let full_capacity = buckets / 8 * 7;
        if self.table.len() * 4 > full_capacity * 3 {
            return;
        }
        let hasher = &self.hasher;
        let mut rebuilt = HashTable::with_capacity(full_capacity);
        for &id in self.table.iter() {
            let hash = hasher.hash_one(entries.member(id));
            rebuilt.insert_unique(hash, id, |&other| hasher.hash_one(entries.member(other)));
        }
        debug_assert_eq!(rebuilt.num_buckets(), buckets);
        self.table = rebuilt;
    }

    /// Removes `member` and returns its id, if it was there.
    pub(crate) fn remove(&mut self, member: &[u8], entries: &EntrySlab) -> Option<u32> {
        let hash = self.hasher.hash_one(member);
        match self.table.find_entry(hash, |&id| entries.member(id) == member) {
            Ok(found) => Some(found.remove().0),
            Err(_) => None,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Heap bytes of the table (buckets and control bytes).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.table.allocation_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Churn at just under half load used to double the table once tombstones piled up (seen as a flaky
    /// memory test); now the table keeps its size.
    #[test]
    fn churn_does_not_grow_the_table() {
        let mut entries = EntrySlab::default();
        let mut index = MemberIndex::default();
        let mut live = std::collections::VecDeque::new();
        let add = |n: u64, entries: &mut EntrySlab, index: &mut MemberIndex| {
            let session = format!("session-{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let id = entries.allocate(session.as_bytes(), 1.0);
            index.insert_new(id, entries);
            id
        };
        for n in 0..2_000 {
            live.push_back(add(n, &mut entries, &mut index));
        }
        let buckets = index.table.num_buckets();
        for n in 2_000..200_000 {
            let oldest = live.pop_front().unwrap();
            let member = entries.member(oldest).to_vec();
            assert_eq!(index.remove(&member, &entries), Some(oldest));
            entries.release(oldest);
            live.push_back(add(n, &mut entries, &mut index));
        }
        assert_eq!(index.table.num_buckets(), buckets);
        assert_eq!(index.len(), 2_000);
        for &id in &live {
            assert_eq!(index.find(entries.member(id), &entries), Some(id));
        }
    }
}
