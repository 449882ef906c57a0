//! rankgate's own sorted set: Redis `ZADD`/`ZRANGE`/`ZRANK`/… semantics in process, with O(log n) rank and
//! score operations and about half of Redis's memory per member.
//!
//! The embedded backend serves rankings and the waiting room from a [`SortedSet`]; the Redis backend uses
//! real sorted sets. Both must answer the same, so this crate follows Redis exactly where it matters:
//!
//! - order is by score ascending, then by member bytes ascending; REV reads that order backwards, ties
//!   included (rankings that want "score descending, id ascending" store negated scores and read forwards);
//! - `ZADD` options, `ZINCRBY` from a missing member, index clamping, `LIMIT`, `ZUNIONSTORE` weights and the
//!   `inf * 0` and `+inf + -inf` conventions are Redis's;
//! - NaN is refused as a score and as a result, `±inf` are ordinary scores, and `-0.0` is stored as `0.0`.
//!
//! # Layout
//!
//! A set is three parts that refer to each member by a `u32` id, so each member's bytes are stored once:
//!
//! - `entries.rs`: the slab of 20-byte entries (score, length, and the member itself when it is at most 11
//!   bytes long, else its offset in one shared byte arena). Ids and byte spans of removed members are
//!   reused; the arena compacts itself when half of it is garbage.
//! - `index.rs`: a `hashbrown::HashTable<u32>` from member bytes to id, for `ZSCORE` and for finding the score
//!   a command needs before it walks the tree. It rehashes in place rather than doubling when removals'
//!   tombstones fill it.
//! - `tree.rs`: an order-statistic B+tree over `(score, id)` keys. Leaves hold up to 64 ids (scores are read
//!   from the slab, so no score is stored twice) and are linked for range scans; branches keep per-child
//!   element counts (rank ↔ position in O(log n)) and per-child
//!   minimum keys (the descent guide). Equal scores are ordered by reading member bytes from the slab.
//!
//! On top of those:
//!
//! - `set.rs`: [`SortedSet`] and the commands, which own the Redis rules (option conflicts, NaN, `-0.0`,
//!   negative indexes, `LIMIT`);
//! - `union.rs`: `ZUNIONSTORE` ([`SortedSet::union`]);
//! - `bound.rs`, `options.rs`, `error.rs`: [`ScoreBound`], [`AddOptions`] and [`Aggregate`], and [`ZsetError`];
//! - `growth.rs`: the big buffers grow by an eighth instead of doubling, which keeps slack under 12.5%.
//!
//! With 1,000,000 members named like `sku-0000001`, [`SortedSet::heap_bytes`] is about 37 bytes per member
//! (Redis: ~101); `cargo run --release -p rankgate-zset --example memory` measures it and the process RSS.
//!
//! # Example
//!
//! ```
//! use rankgate_zset::{AddOptions, ScoreBound, SortedSet};
//!
//! let mut sales = SortedSet::new();
//! sales.insert(b"sku-2", 5.0)?;
//! sales.insert(b"sku-1", 5.0)?;
//! sales.insert(b"sku-3", 9.0)?;
//! assert_eq!(sales.zincrby(b"sku-1", 1.5)?, 6.5);
//!
//! // Highest first, like ZREVRANGE 0 1 WITHSCORES.
//! let top: Vec<(&[u8], f64)> = sales.range_by_rank(0, 1, true);
//! assert_eq!(top, [(&b"sku-3"[..], 9.0), (&b"sku-1"[..], 6.5)]);
//! assert_eq!(sales.zrevrank(b"sku-2"), Some(2));
//!
//! // ZADD GT only ever raises a score.
//! let gt = AddOptions { gt: true, ..AddOptions::default() };
//! assert_eq!(sales.zadd(b"sku-3", 1.0, gt)?, 0);
//! assert_eq!(sales.zscore(b"sku-3"), Some(9.0));
//!
//! // ZCOUNT sales (5 +inf
//! let above_five = sales.zcount(ScoreBound::parse("(5")?, ScoreBound::parse("+inf")?);
//! assert_eq!(above_five, 2);
//! # Ok::<(), rankgate_zset::ZsetError>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod bound;
mod entries;
mod error;
mod growth;
mod index;
mod options;
mod set;
mod tree;
mod union;

#[cfg(test)]
mod tests;

pub use bound::ScoreBound;
pub use error::ZsetError;
pub use options::{AddOptions, Aggregate};
pub use set::SortedSet;
