//! The order-statistic B+tree that keeps a set's elements in Redis order.
//!
//! Elements are [`Key`]s: a score and an entry id. Leaves hold only the ids, sorted, and read each score
//! from the [`EntrySlab`] (which has it anyway, for `ZSCORE`): a second copy of every score in the leaves
//! was 8 bytes per member, a fifth of the memory budget. Leaves are linked both ways so ranges stream
//! without going back up the tree. Each branch keeps, for every child:
//!
//! - the number of elements below it, which turns rank → position and position → rank into one
//!   root-to-leaf walk (the order statistic);
//! - the smallest key below it, which guides the descent for a given key or score.
//!
//! Mutations recurse from the root and fix each child on the way back up: counts and minimums are refreshed,
//! a child that overflowed first lends elements to a sibling with room and only splits when neither has any,
//! and a child that underflowed borrows from or merges with a sibling. Lending before splitting keeps
//! random-insert leaves about 85% full instead of the textbook 69%, which is a good part of the memory
//! budget.
//!
//! The tree never stores member bytes. Equal scores are ordered by member bytes, which it reads from the
//! [`EntrySlab`] handed to every operation that compares keys. Removal finds a key by score and id alone.

use std::cmp::Ordering;
use std::mem::size_of;

use crate::entries::EntrySlab;
use crate::growth::push_gently;

/// "No node", for leaf links and the root of an empty tree.
const NIL: u32 = u32::MAX;

/// Array length of every node: the largest capacity plus one, because an insert may leave a node one
/// element over capacity until its parent deals with it on the way back up.
const SLOTS: usize = 65;

/// Node capacities. Production uses [`NodeLayout::DEFAULT`]; tests use tiny nodes so a few dozen
/// members already build a tree four or five levels deep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeLayout {
    leaf_capacity: usize,
    branch_capacity: usize,
}

impl NodeLayout {
    /// 64 elements per leaf (256 bytes of ids) and 64 children per branch.
    pub(crate) const DEFAULT: NodeLayout = NodeLayout {
        leaf_capacity: SLOTS - 1,
        branch_capacity: SLOTS - 1,
    };

    /// Smaller nodes, for tests. At least 4 so that every non-root node has two elements or children.
    #[cfg(test)]
    pub(crate) fn small(leaf_capacity: usize, branch_capacity: usize) -> NodeLayout {
        assert!((4..SLOTS).contains(&leaf_capacity) && (4..SLOTS).contains(&branch_capacity));
        NodeLayout {
            leaf_capacity,
            branch_capacity,
        }
    }

    fn capacity(self, height: u32) -> usize {
        if height == 0 {
            self.leaf_capacity
        } else {
            self.branch_capacity
        }
    }

    /// Fewest elements or children a non-root node may have.
    fn min_len(self, height: u32) -> usize {
        self.capacity(height) / 2
    }
}

/// One element of the tree: a score and the id of the entry holding the member.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Key {
    pub(crate) score: f64,
    pub(crate) id: u32,
}

impl Key {
    /// Stands in a branch slot for the moment between inserting a child and refreshing the slot.
    const PLACEHOLDER: Key = Key { score: 0.0, id: 0 };

    /// Redis order: score, then member bytes. Scores are never NaN or -0.0, so `total_cmp` is the
    /// numeric order.
    pub(crate) fn cmp_in(self, other: Key, entries: &EntrySlab) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| {
            if self.id == other.id {
                Ordering::Equal
            } else {
                entries.member(self.id).cmp(entries.member(other.id))
            }
        })
    }
}

#[derive(Debug, Clone)]
struct Leaf {
    /// Entry ids in key order; scores are in the slab.
    ids: [u32; SLOTS],
    len: u32,
    /// Neighbouring leaves in order, for iteration in both directions.
    prev: u32,
    next: u32,
}

impl Leaf {
    const EMPTY: Leaf = Leaf {
        ids: [0; SLOTS],
        len: 0,
        prev: NIL,
        next: NIL,
    };

    fn len(&self) -> usize {
        self.len as usize
    }

    fn id(&self, pos: usize) -> u32 {
        debug_assert!(pos < self.len());
        self.ids[pos]
    }

    fn key(&self, pos: usize, entries: &EntrySlab) -> Key {
        let id = self.id(pos);
        Key {
            score: entries.score(id),
            id,
        }
    }

    fn insert_at(&mut self, pos: usize, key: Key) {
        let len = self.len();
        column_insert(&mut self.ids, len, pos, key.id);
        self.len += 1;
    }

    fn remove_at(&mut self, pos: usize) {
        let len = self.len();
        column_remove(&mut self.ids, len, pos);
        self.len -= 1;
    }

    /// First position whose key is not less than `key`: a binary search, one slab read per step.
    fn lower_bound(&self, key: Key, entries: &EntrySlab) -> usize {
        self.ids[..self.len()].partition_point(|&id| {
            let here = Key {
                score: entries.score(id),
                id,
            };
            here.cmp_in(key, entries) == Ordering::Less
        })
    }

    /// How many elements have a score below `score` (or at most `score` if `include_equal`).
    fn count_scores_below(&self, score: f64, include_equal: bool, entries: &EntrySlab) -> usize {
        let ids = &self.ids[..self.len()];
        if include_equal {
            ids.partition_point(|&id| entries.score(id) <= score)
        } else {
            ids.partition_point(|&id| entries.score(id) < score)
        }
    }

    /// Position of a key known to be in this leaf, found by its id alone: ids are unique, and a scan of
    /// at most 256 bytes needs no member comparisons.
    fn position_of(&self, key: Key) -> Option<usize> {
        self.ids[..self.len()].iter().position(|&id| id == key.id)
    }
}

#[derive(Debug, Clone)]
struct Branch {
    /// Smallest key under each child, split like leaves into scores and ids. Slot 0 holds this branch's
    /// own minimum, which lets the parent refresh its slot in O(1).
    min_scores: [f64; SLOTS],
    min_ids: [u32; SLOTS],
    /// Child node ids: leaves when this branch is at height 1, branches above.
    children: [u32; SLOTS],
    /// Elements under each child. `u32` is enough: ids are `u32`, so a set holds < 2^32 elements.
    counts: [u32; SLOTS],
    len: u32,
}

impl Branch {
    const EMPTY: Branch = Branch {
        min_scores: [0.0; SLOTS],
        min_ids: [0; SLOTS],
        children: [NIL; SLOTS],
        counts: [0; SLOTS],
        len: 0,
    };

    fn len(&self) -> usize {
        self.len as usize
    }

    fn min(&self, slot: usize) -> Key {
        Key {
            score: self.min_scores[slot],
            id: self.min_ids[slot],
        }
    }

    fn set_min(&mut self, slot: usize, key: Key) {
        self.min_scores[slot] = key.score;
        self.min_ids[slot] = key.id;
    }

    /// Elements under the children before `slot`.
    fn count_before(&self, slot: usize) -> usize {
        self.counts[..slot].iter().map(|&count| count as usize).sum()
    }

    fn total(&self) -> u32 {
        self.counts[..self.len()].iter().sum()
    }

    fn insert_child(&mut self, slot: usize, child: u32, count: u32, min: Key) {
        let len = self.len();
        column_insert(&mut self.min_scores, len, slot, min.score);
        column_insert(&mut self.min_ids, len, slot, min.id);
        column_insert(&mut self.children, len, slot, child);
        column_insert(&mut self.counts, len, slot, count);
        self.len += 1;
    }

    fn remove_child(&mut self, slot: usize) {
        let len = self.len();
        column_remove(&mut self.min_scores, len, slot);
        column_remove(&mut self.min_ids, len, slot);
        column_remove(&mut self.children, len, slot);
        column_remove(&mut self.counts, len, slot);
        self.len -= 1;
    }

    /// The child that holds, or would hold, `key`: the last one whose minimum is ≤ `key`, else the first.
    fn slot_for_key(&self, key: Key, entries: &EntrySlab) -> usize {
        // Slot 0 is the fallback, so only the minimums of slots 1.. are searched.
        let mins = &self.min_scores[1..self.len()];
        let (below, up_to_equal) = count_below_and_equal(mins, key.score);
        if below == up_to_equal {
            return below;
        }
        let member = entries.member(key.id);
        let tie_ids = &self.min_ids[1 + below..1 + up_to_equal];
        below + tie_ids.partition_point(|&id| id == key.id || entries.member(id) <= member)
    }

    /// The child where elements with score `< score` (or `<= score` if `include_equal`) end: every child
    /// before it is entirely below, every child after it entirely above.
    fn slot_for_score(&self, score: f64, include_equal: bool) -> usize {
        count_scores_below(&self.min_scores[1..self.len()], score, include_equal)
    }
}

/// Keys in order, addressed by rank.
#[derive(Debug, Clone)]
pub(crate) struct OrderTree {
    /// Leaf and branch slabs: nodes refer to each other by index, which needs no unsafe code and no
    /// reference counting, and a `u32` link is half a pointer.
    leaves: Vec<Leaf>,
    branches: Vec<Branch>,
    /// Released nodes, reused before the slabs grow.
    free_leaves: Vec<u32>,
    free_branches: Vec<u32>,
    /// `NIL` when the tree is empty, so an empty set owns no node.
    root: u32,
    /// Levels of branches above the leaves; 0 means the root is a leaf.
    height: u32,
    len: usize,
    /// Ends of the leaf chain, for O(1) min/max.
    first_leaf: u32,
    last_leaf: u32,
    layout: NodeLayout,
}

impl Default for OrderTree {
    fn default() -> Self {
        OrderTree::new(NodeLayout::DEFAULT)
    }
}

impl OrderTree {
    pub(crate) fn new(layout: NodeLayout) -> Self {
        OrderTree {
            leaves: Vec::new(),
            branches: Vec::new(),
            free_leaves: Vec::new(),
            free_branches: Vec::new(),
            root: NIL,
            height: 0,
            len: 0,
            first_leaf: NIL,
            last_leaf: NIL,
            layout,
        }
    }

    pub(crate) fn layout(&self) -> NodeLayout {
        self.layout
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reserves leaves for about `members` elements, assuming leaves are three quarters full.
    pub(crate) fn reserve(&mut self, members: usize) {
        let leaves = members.div_ceil(self.layout.leaf_capacity * 3 / 4);
        self.leaves
            .reserve_exact(leaves.saturating_sub(self.leaves.len()));
    }

    /// Heap bytes of the node slabs and free lists, from capacities.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.leaves.capacity() * size_of::<Leaf>()
            + self.branches.capacity() * size_of::<Branch>()
            + (self.free_leaves.capacity() + self.free_branches.capacity()) * size_of::<u32>()
    }

    // ----- queries ---------------------------------------------------------------------------------------

    /// 0-based ascending rank of a key that is in the tree.
    pub(crate) fn rank_of(&self, key: Key, entries: &EntrySlab) -> usize {
        let mut node = self.root;
        let mut rank = 0;
        for _ in 0..self.height {
            let branch = &self.branches[node as usize];
            let slot = branch.slot_for_key(key, entries);
            rank += branch.count_before(slot);
            node = branch.children[slot];
        }
        let pos = self.leaves[node as usize].position_of(key);
        rank + pos.expect("rank_of: the key must be in the tree")
    }

    /// Number of elements with a score below `score`, counting equal scores too if `include_equal`.
    pub(crate) fn count_scores_below(&self, score: f64, include_equal: bool, entries: &EntrySlab) -> usize {
        if self.root == NIL {
            return 0;
        }
        let mut node = self.root;
        let mut count = 0;
        for _ in 0..self.height {
            let branch = &self.branches[node as usize];
            let slot = branch.slot_for_score(score, include_equal);
            count += branch.count_before(slot);
            node = branch.children[slot];
        }
        let leaf = &self.leaves[node as usize];
        count + leaf.count_scores_below(score, include_equal, entries)
    }

    /// The id of the smallest key.
    pub(crate) fn first(&self) -> Option<u32> {
        (self.root != NIL).then(|| self.leaves[self.first_leaf as usize].id(0))
    }

    /// The id of the largest key.
    pub(crate) fn last(&self) -> Option<u32> {
        (self.root != NIL).then(|| {
            let leaf = &self.leaves[self.last_leaf as usize];
            leaf.id(leaf.len() - 1)
        })
    }

    /// Leaf and position of the element at `rank`, which must be < `len`.
    fn locate(&self, rank: usize) -> (u32, usize) {
        debug_assert!(rank < self.len);
        let mut node = self.root;
        let mut rank = rank;
        for _ in 0..self.height {
            let branch = &self.branches[node as usize];
            let mut slot = 0;
            while rank >= branch.counts[slot] as usize {
                rank -= branch.counts[slot] as usize;
                slot += 1;
            }
            node = branch.children[slot];
        }
        (node, rank)
    }

    /// Ids in ascending key order, starting at `rank`.
    pub(crate) fn ascending_from(&self, rank: usize) -> Ascending<'_> {
        if rank >= self.len {
            return Ascending {
                tree: self,
                leaf: NIL,
                pos: 0,
                remaining: 0,
            };
        }
        let (leaf, pos) = self.locate(rank);
        Ascending {
            tree: self,
            leaf,
            pos,
            remaining: self.len - rank,
        }
    }

    /// Ids in descending key order, starting at ascending `rank` (which must be < `len`) down to rank 0.
    pub(crate) fn descending_from(&self, rank: usize) -> Descending<'_> {
        let (leaf, pos) = self.locate(rank);
        Descending {
            tree: self,
            leaf,
            pos,
            remaining: rank + 1,
        }
    }

    // ----- mutations -------------------------------------------------------------------------------------

    /// Inserts a key that is not in the tree.
    pub(crate) fn insert(&mut self, key: Key, entries: &EntrySlab) {
        if self.root == NIL {
            let leaf = self.allocate_leaf();
            self.leaves[leaf as usize].insert_at(0, key);
            self.root = leaf;
            self.height = 0;
            self.first_leaf = leaf;
            self.last_leaf = leaf;
            self.len = 1;
            return;
        }
        self.insert_below(self.root, self.height, key, entries);
        self.len += 1;
        if self.node_len(self.root, self.height) > self.layout.capacity(self.height) {
            self.grow_root(entries);
        }
    }

    fn insert_below(&mut self, node: u32, height: u32, key: Key, entries: &EntrySlab) {
        if height == 0 {
            let leaf = &mut self.leaves[node as usize];
            let pos = leaf.lower_bound(key, entries);
            debug_assert!(
                pos == leaf.len() || leaf.ids[pos] != key.id,
                "key is already in the tree"
            );
            leaf.insert_at(pos, key);
            return;
        }
        let branch = &self.branches[node as usize];
        let slot = branch.slot_for_key(key, entries);
        let child = branch.children[slot];
        self.insert_below(child, height - 1, key, entries);

        let child_min = self.subtree_min(child, height - 1, entries);
        let branch = &mut self.branches[node as usize];
        branch.counts[slot] += 1;
        branch.set_min(slot, child_min);
        if self.node_len(child, height - 1) > self.layout.capacity(height - 1) {
            self.relieve_overflow(node, slot, height - 1, entries);
        }
    }

    /// Removes a key that is in the tree.
    pub(crate) fn remove(&mut self, key: Key, entries: &EntrySlab) {
        debug_assert!(self.root != NIL, "remove from an empty tree");
        self.remove_below(self.root, self.height, key, entries);
        self.len -= 1;
        while self.height > 0 && self.branches[self.root as usize].len() == 1 {
            let old_root = self.root;
            self.root = self.branches[old_root as usize].children[0];
            self.release_node(old_root, self.height);
            self.height -= 1;
        }
        if self.len == 0 {
            // Drop every node so an emptied set holds no memory.
            *self = OrderTree::new(self.layout);
        }
    }

    fn remove_below(&mut self, node: u32, height: u32, key: Key, entries: &EntrySlab) {
        if height == 0 {
            let leaf = &mut self.leaves[node as usize];
            let pos = leaf
                .position_of(key)
                .expect("remove: the key must be in the tree");
            leaf.remove_at(pos);
            return;
        }
        let branch = &self.branches[node as usize];
        let slot = branch.slot_for_key(key, entries);
        let child = branch.children[slot];
        self.remove_below(child, height - 1, key, entries);

        self.branches[node as usize].counts[slot] -= 1;
        if self.node_len(child, height - 1) < self.layout.min_len(height - 1) {
            self.relieve_underflow(node, slot, height - 1, entries);
        } else {
            let child_min = self.subtree_min(child, height - 1, entries);
            self.branches[node as usize].set_min(slot, child_min);
        }
    }

    /// Builds a tree from keys already in ascending order, nodes about 7/8 full: dense, but with room so
    /// the first inserts after a rebuild or a union do not split every leaf.
    pub(crate) fn from_sorted_keys(keys: &[Key], layout: NodeLayout, entries: &EntrySlab) -> Self {
        let mut tree = OrderTree::new(layout);
        if keys.is_empty() {
            return tree;
        }
        let leaf_count = planned_node_count(keys.len(), layout.leaf_capacity);
        tree.leaves.reserve_exact(leaf_count);
        let mut level = Vec::with_capacity(leaf_count);
        let mut rest = keys;
        for index in 0..leaf_count {
            let (chunk, tail) = rest.split_at(even_share(keys.len(), leaf_count, index));
            rest = tail;
            let leaf_id = tree.allocate_leaf();
            let leaf = &mut tree.leaves[leaf_id as usize];
            for (pos, key) in chunk.iter().enumerate() {
                leaf.ids[pos] = key.id;
            }
            leaf.len = chunk.len() as u32;
            match level.last() {
                Some(&previous) => tree.link_leaf_after(previous, leaf_id),
                None => {
                    tree.first_leaf = leaf_id;
                    tree.last_leaf = leaf_id;
                }
            }
            level.push(leaf_id);
        }

        let mut height = 0;
        while level.len() > 1 {
            let branch_count = planned_node_count(level.len(), layout.branch_capacity);
            tree.branches.reserve_exact(branch_count);
            let mut upper = Vec::with_capacity(branch_count);
            let mut rest = &level[..];
            for index in 0..branch_count {
                let (chunk, tail) = rest.split_at(even_share(level.len(), branch_count, index));
                rest = tail;
                let branch_id = tree.allocate_branch();
                for (slot, &child) in chunk.iter().enumerate() {
                    tree.branches[branch_id as usize].insert_child(slot, child, 0, Key::PLACEHOLDER);
                    tree.refresh_slot(branch_id, slot, height, entries);
                }
                upper.push(branch_id);
            }
            level = upper;
            height += 1;
        }
        tree.root = level[0];
        tree.height = height;
        tree.len = keys.len();
        tree
    }

    // ----- node bookkeeping ------------------------------------------------------------------------------

    fn node_len(&self, node: u32, height: u32) -> usize {
        if height == 0 {
            self.leaves[node as usize].len()
        } else {
            self.branches[node as usize].len()
        }
    }

    fn subtree_min(&self, node: u32, height: u32, entries: &EntrySlab) -> Key {
        if height == 0 {
            self.leaves[node as usize].key(0, entries)
        } else {
            self.branches[node as usize].min(0)
        }
    }

    /// Recomputes a parent's count and minimum for the child in `slot`, after elements moved.
    fn refresh_slot(&mut self, parent: u32, slot: usize, child_height: u32, entries: &EntrySlab) {
        let child = self.branches[parent as usize].children[slot];
        let count = if child_height == 0 {
            self.leaves[child as usize].len
        } else {
            self.branches[child as usize].total()
        };
        let min = self.subtree_min(child, child_height, entries);
        let branch = &mut self.branches[parent as usize];
        branch.counts[slot] = count;
        branch.set_min(slot, min);
    }

    /// Deals with the child in `slot` holding one element or child more than its capacity.
    fn relieve_overflow(&mut self, parent: u32, slot: usize, child_height: u32, entries: &EntrySlab) {
        let capacity = self.layout.capacity(child_height);
        let branch = &self.branches[parent as usize];
        let child = branch.children[slot];
        let left = (slot > 0).then(|| branch.children[slot - 1]);
        let right = (slot + 1 < branch.len()).then(|| branch.children[slot + 1]);
        let child_len = self.node_len(child, child_height);
        debug_assert_eq!(child_len, capacity + 1);

        // Lend to a neighbour with room before splitting: splits leave two half-empty nodes.
        if let Some(left) = left {
            let left_len = self.node_len(left, child_height);
            if left_len < capacity {
                self.shift_left(left, child, (child_len - left_len).div_ceil(2), child_height);
                self.refresh_slot(parent, slot - 1, child_height, entries);
                self.refresh_slot(parent, slot, child_height, entries);
                return;
            }
        }
        if let Some(right) = right {
            let right_len = self.node_len(right, child_height);
            if right_len < capacity {
                self.shift_right(child, right, (child_len - right_len).div_ceil(2), child_height);
                self.refresh_slot(parent, slot, child_height, entries);
                self.refresh_slot(parent, slot + 1, child_height, entries);
                return;
            }
        }
        self.split_child(parent, slot, child_height, entries);
    }

    /// Moves the upper half of the child in `slot` into a new node right after it. The parent may end up
    /// one child over capacity; its own parent handles that.
    fn split_child(&mut self, parent: u32, slot: usize, child_height: u32, entries: &EntrySlab) {
        let child = self.branches[parent as usize].children[slot];
        let moved = self.node_len(child, child_height) / 2;
        let sibling = if child_height == 0 {
            self.allocate_leaf()
        } else {
            self.allocate_branch()
        };
        self.shift_right(child, sibling, moved, child_height);
        if child_height == 0 {
            self.link_leaf_after(child, sibling);
        }
        self.branches[parent as usize].insert_child(slot + 1, sibling, 0, Key::PLACEHOLDER);
        self.refresh_slot(parent, slot, child_height, entries);
        self.refresh_slot(parent, slot + 1, child_height, entries);
    }

    /// Puts a new branch above a root that went over capacity, then splits the old root under it.
    fn grow_root(&mut self, entries: &EntrySlab) {
        let old_root = self.root;
        let root = self.allocate_branch();
        self.branches[root as usize].insert_child(0, old_root, 0, Key::PLACEHOLDER);
        self.refresh_slot(root, 0, self.height, entries);
        self.root = root;
        self.split_child(root, 0, self.height, entries);
        self.height += 1;
    }

    /// Deals with the child in `slot` being one below the minimum: borrow from a neighbour that can spare,
    /// else merge with one (both at the minimum, so the merge fits).
    fn relieve_underflow(&mut self, parent: u32, slot: usize, child_height: u32, entries: &EntrySlab) {
        let min_len = self.layout.min_len(child_height);
        let branch = &self.branches[parent as usize];
        debug_assert!(branch.len() >= 2, "a non-root branch has at least two children");
        let child = branch.children[slot];
        let left = (slot > 0).then(|| branch.children[slot - 1]);
        let right = (slot + 1 < branch.len()).then(|| branch.children[slot + 1]);
        let child_len = self.node_len(child, child_height);

        // Borrow half the difference rather than one element, so a run of removals at one end (ZPOPMIN)
        // does not borrow on every call.
        if let Some(left) = left {
            let left_len = self.node_len(left, child_height);
            if left_len > min_len {
                self.shift_right(left, child, (left_len - child_len) / 2, child_height);
                self.refresh_slot(parent, slot - 1, child_height, entries);
                self.refresh_slot(parent, slot, child_height, entries);
                return;
            }
        }
        if let Some(right) = right {
            let right_len = self.node_len(right, child_height);
            if right_len > min_len {
                self.shift_left(child, right, (right_len - child_len) / 2, child_height);
                self.refresh_slot(parent, slot, child_height, entries);
                self.refresh_slot(parent, slot + 1, child_height, entries);
                return;
            }
        }
        let left_slot = if left.is_some() { slot - 1 } else { slot };
        self.merge_children(parent, left_slot, child_height, entries);
    }

    /// Moves everything from the child at `left_slot + 1` into the child at `left_slot`.
    fn merge_children(&mut self, parent: u32, left_slot: usize, child_height: u32, entries: &EntrySlab) {
        let branch = &self.branches[parent as usize];
        let left = branch.children[left_slot];
        let right = branch.children[left_slot + 1];
        let right_len = self.node_len(right, child_height);
        debug_assert!(self.node_len(left, child_height) + right_len <= self.layout.capacity(child_height));
        self.shift_left(left, right, right_len, child_height);
        if child_height == 0 {
            self.unlink_leaf(right);
        }
        self.release_node(right, child_height);
        self.branches[parent as usize].remove_child(left_slot + 1);
        self.refresh_slot(parent, left_slot, child_height, entries);
    }

    /// Moves the first `count` elements (or children) of `right` to the end of its left neighbour `left`.
    fn shift_left(&mut self, left: u32, right: u32, count: usize, height: u32) {
        if height == 0 {
            let (left, right) = two_mut(&mut self.leaves, left, right);
            let (left_len, right_len) = (left.len(), right.len());
            column_shift_left(&mut left.ids, left_len, &mut right.ids, right_len, count);
            left.len += count as u32;
            right.len -= count as u32;
        } else {
            let (left, right) = two_mut(&mut self.branches, left, right);
            let (left_len, right_len) = (left.len(), right.len());
            column_shift_left(
                &mut left.min_scores,
                left_len,
                &mut right.min_scores,
                right_len,
                count,
            );
            column_shift_left(&mut left.min_ids, left_len, &mut right.min_ids, right_len, count);
            column_shift_left(
                &mut left.children,
                left_len,
                &mut right.children,
                right_len,
                count,
            );
            column_shift_left(&mut left.counts, left_len, &mut right.counts, right_len, count);
            left.len += count as u32;
            right.len -= count as u32;
        }
    }

    /// Moves the last `count` elements (or children) of `left` to the front of its right neighbour `right`.
    fn shift_right(&mut self, left: u32, right: u32, count: usize, height: u32) {
        if height == 0 {
            let (left, right) = two_mut(&mut self.leaves, left, right);
            let (left_len, right_len) = (left.len(), right.len());
            column_shift_right(&mut left.ids, left_len, &mut right.ids, right_len, count);
            left.len -= count as u32;
            right.len += count as u32;
        } else {
            let (left, right) = two_mut(&mut self.branches, left, right);
            let (left_len, right_len) = (left.len(), right.len());
            column_shift_right(
                &mut left.min_scores,
                left_len,
                &mut right.min_scores,
                right_len,
                count,
            );
            column_shift_right(&mut left.min_ids, left_len, &mut right.min_ids, right_len, count);
            column_shift_right(
                &mut left.children,
                left_len,
                &mut right.children,
                right_len,
                count,
            );
            column_shift_right(&mut left.counts, left_len, &mut right.counts, right_len, count);
            left.len -= count as u32;
            right.len += count as u32;
        }
    }

    fn allocate_leaf(&mut self) -> u32 {
        if let Some(leaf) = self.free_leaves.pop() {
            self.leaves[leaf as usize] = Leaf::EMPTY;
            return leaf;
        }
        push_gently(&mut self.leaves, Leaf::EMPTY);
        (self.leaves.len() - 1) as u32
    }

    fn allocate_branch(&mut self) -> u32 {
        if let Some(branch) = self.free_branches.pop() {
            self.branches[branch as usize] = Branch::EMPTY;
            return branch;
        }
        push_gently(&mut self.branches, Branch::EMPTY);
        (self.branches.len() - 1) as u32
    }

    fn release_node(&mut self, node: u32, height: u32) {
        if height == 0 {
            self.free_leaves.push(node);
        } else {
            self.free_branches.push(node);
        }
    }

    fn link_leaf_after(&mut self, leaf: u32, fresh: u32) {
        let next = self.leaves[leaf as usize].next;
        self.leaves[fresh as usize].prev = leaf;
        self.leaves[fresh as usize].next = next;
        self.leaves[leaf as usize].next = fresh;
        if next == NIL {
            self.last_leaf = fresh;
        } else {
            self.leaves[next as usize].prev = fresh;
        }
    }

    fn unlink_leaf(&mut self, leaf: u32) {
        let Leaf { prev, next, .. } = self.leaves[leaf as usize];
        if prev == NIL {
            self.first_leaf = next;
        } else {
            self.leaves[prev as usize].next = next;
        }
        if next == NIL {
            self.last_leaf = prev;
        } else {
            self.leaves[next as usize].prev = prev;
        }
    }

    // ----- checks ----------------------------------------------------------------------------------------

    /// Checks every structural invariant and returns the keys in order.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self, entries: &EntrySlab) -> Vec<Key> {
        let mut keys = Vec::with_capacity(self.len);
        if self.root == NIL {
            assert_eq!(self.len, 0);
            assert_eq!((self.first_leaf, self.last_leaf), (NIL, NIL));
            assert!(
                self.leaves.is_empty() && self.branches.is_empty(),
                "empty tree holds nodes"
            );
            return keys;
        }
        let mut leaf_order = Vec::new();
        let mut branch_total = 0;
        let (count, min) = self.check_node(
            self.root,
            self.height,
            true,
            entries,
            &mut keys,
            &mut leaf_order,
            &mut branch_total,
        );
        assert_eq!(count as usize, self.len, "root count");
        assert_eq!(keys.len(), self.len, "tree len");
        assert_eq!(min, keys[0]);
        for pair in keys.windows(2) {
            assert_eq!(
                pair[0].cmp_in(pair[1], entries),
                Ordering::Less,
                "keys out of order"
            );
        }

        let mut chain = Vec::new();
        let (mut leaf, mut prev) = (self.first_leaf, NIL);
        while leaf != NIL {
            assert_eq!(self.leaves[leaf as usize].prev, prev, "leaf back link");
            chain.push(leaf);
            assert!(chain.len() <= self.leaves.len(), "leaf chain loops");
            prev = leaf;
            leaf = self.leaves[leaf as usize].next;
        }
        assert_eq!(prev, self.last_leaf, "last leaf");
        assert_eq!(chain, leaf_order, "leaf chain order");

        assert_eq!(
            leaf_order.len() + self.free_leaves.len(),
            self.leaves.len(),
            "leaf slab"
        );
        assert_eq!(
            branch_total + self.free_branches.len(),
            self.branches.len(),
            "branch slab"
        );
        for free in &self.free_leaves {
            assert!(!leaf_order.contains(free), "free leaf {free} is in use");
        }
        keys
    }

    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    fn check_node(
        &self,
        node: u32,
        height: u32,
        is_root: bool,
        entries: &EntrySlab,
        keys: &mut Vec<Key>,
        leaf_order: &mut Vec<u32>,
        branch_total: &mut usize,
    ) -> (u32, Key) {
        let len = self.node_len(node, height);
        assert!(len <= self.layout.capacity(height), "node over capacity");
        if is_root {
            assert!(len >= if height == 0 { 1 } else { 2 }, "root too small");
        } else {
            assert!(len >= self.layout.min_len(height), "node under minimum");
        }
        if height == 0 {
            let leaf = &self.leaves[node as usize];
            for pos in 0..len {
                keys.push(leaf.key(pos, entries));
            }
            leaf_order.push(node);
            return (len as u32, leaf.key(0, entries));
        }
        *branch_total += 1;
        let branch = &self.branches[node as usize];
        let mut total = 0;
        for slot in 0..len {
            let (count, min) = self.check_node(
                branch.children[slot],
                height - 1,
                false,
                entries,
                keys,
                leaf_order,
                branch_total,
            );
            assert_eq!(branch.counts[slot], count, "branch count");
            assert_eq!(branch.min(slot), min, "branch minimum");
            total += count;
        }
        (total, branch.min(0))
    }
}

/// How many nodes a bulk load puts `items` into: about 7/8 full, never under the minimum or over capacity.
fn planned_node_count(items: usize, capacity: usize) -> usize {
    if items <= capacity {
        return 1;
    }
    let min_len = capacity / 2;
    let target_len = capacity * 7 / 8;
    items
        .div_ceil(target_len)
        .min(items / min_len)
        .max(items.div_ceil(capacity))
}

/// Size of node `index` when `items` are spread evenly over `nodes`.
fn even_share(items: usize, nodes: usize, index: usize) -> usize {
    items / nodes + usize::from(index < items % nodes)
}

/// Ascending ids; see [`OrderTree::ascending_from`].
pub(crate) struct Ascending<'t> {
    tree: &'t OrderTree,
    leaf: u32,
    pos: usize,
    remaining: usize,
}

impl Iterator for Ascending<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.remaining == 0 {
            return None;
        }
        let leaf = &self.tree.leaves[self.leaf as usize];
        let id = leaf.id(self.pos);
        self.remaining -= 1;
        self.pos += 1;
        if self.pos == leaf.len() {
            self.leaf = leaf.next;
            self.pos = 0;
        }
        Some(id)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Ascending<'_> {}

/// Descending ids; see [`OrderTree::descending_from`].
pub(crate) struct Descending<'t> {
    tree: &'t OrderTree,
    leaf: u32,
    pos: usize,
    remaining: usize,
}

impl Iterator for Descending<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.remaining == 0 {
            return None;
        }
        let leaf = &self.tree.leaves[self.leaf as usize];
        let id = leaf.id(self.pos);
        self.remaining -= 1;
        if self.pos > 0 {
            self.pos -= 1;
        } else if self.remaining > 0 {
            self.leaf = leaf.prev;
            self.pos = self.tree.leaves[self.leaf as usize].len() - 1;
        }
        Some(id)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Descending<'_> {}

// Searches inside a branch count instead of bisecting. A branch's minimum scores span up to nine cache lines
// and a binary search waits for each line before it knows the next; a count reads them all independently,
// so the misses overlap, and it compiles to a few vector compares. With 64-wide nodes that made ZRANK at 1M
// members about 30% faster. Leaves hold no scores, so a leaf search bisects (six slab reads for 64 ids).

/// How many of the sorted `scores` are below `score`, and how many are at most `score`.
fn count_below_and_equal(scores: &[f64], score: f64) -> (usize, usize) {
    let below = scores.iter().filter(|&&s| s < score).count();
    let equal = scores.iter().filter(|&&s| s == score).count();
    (below, below + equal)
}

/// How many of the sorted `scores` are below `score` (or at most `score` if `include_equal`).
fn count_scores_below(scores: &[f64], score: f64, include_equal: bool) -> usize {
    if include_equal {
        scores.iter().filter(|&&s| s <= score).count()
    } else {
        scores.iter().filter(|&&s| s < score).count()
    }
}

/// Two distinct elements of a slice, mutably.
fn two_mut<T>(items: &mut [T], a: u32, b: u32) -> (&mut T, &mut T) {
    let (a, b) = (a as usize, b as usize);
    debug_assert_ne!(a, b);
    if a < b {
        let (low, high) = items.split_at_mut(b);
        (&mut low[a], &mut high[0])
    } else {
        let (low, high) = items.split_at_mut(a);
        (&mut high[0], &mut low[b])
    }
}

// Nodes are parallel arrays ("columns"); these move one column, and node code calls them per column.

fn column_insert<T: Copy>(column: &mut [T; SLOTS], len: usize, pos: usize, value: T) {
    column.copy_within(pos..len, pos + 1);
    column[pos] = value;
}

fn column_remove<T: Copy>(column: &mut [T; SLOTS], len: usize, pos: usize) {
    column.copy_within(pos + 1..len, pos);
}

/// Moves the first `count` values of `right[..right_len]` to the end of `left[..left_len]`.
fn column_shift_left<T: Copy>(
    left: &mut [T; SLOTS],
    left_len: usize,
    right: &mut [T; SLOTS],
    right_len: usize,
    count: usize,
) {
    left[left_len..left_len + count].copy_from_slice(&right[..count]);
    right.copy_within(count..right_len, 0);
}

/// Moves the last `count` values of `left[..left_len]` to the front of `right[..right_len]`.
fn column_shift_right<T: Copy>(
    left: &mut [T; SLOTS],
    left_len: usize,
    right: &mut [T; SLOTS],
    right_len: usize,
    count: usize,
) {
    right.copy_within(0..right_len, count);
    right[..count].copy_from_slice(&left[left_len - count..left_len]);
}
