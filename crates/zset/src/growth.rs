//! How the crate's big vectors grow.
//!
//! `Vec` doubles its capacity, so right after a doubling half the buffer is unused: for a set that just
//! crossed a power of two, the slab of entries, the member bytes and the leaves would each carry up to 100%
//! slack. The memory target (≤ 40 bytes per member) does not survive that. Growing by an eighth keeps slack
//! under 12.5% while staying geometric, so pushes are still amortized O(1); large reallocations are mostly
//! `mremap`s, not copies.

/// Makes room for `additional` more items, growing by at least an eighth of the current capacity.
pub(crate) fn reserve_gently<T>(items: &mut Vec<T>, additional: usize) {
    let free = items.capacity() - items.len();
    if free >= additional {
        return;
    }
    let step = (items.capacity() / 8).max(4).max(additional);
    items.reserve_exact(step);
}

/// Pushes `item`, growing by an eighth when full.
pub(crate) fn push_gently<T>(items: &mut Vec<T>, item: T) {
    reserve_gently(items, 1);
    items.push(item);
}
