//! `ZUNIONSTORE`: [`SortedSet::union`].

use hashbrown::hash_map::{Entry, HashMap};

use crate::tree::NodeLayout;
use crate::{Aggregate, SortedSet};

impl SortedSet {
    /// `ZUNIONSTORE` semantics: a new set holding every member of every source, with the weighted scores
    /// of a member combined by `aggregate`.
    ///
    /// Each source's scores are multiplied by its weight (Redis's default weight is 1); a product that is NaN
    /// (`inf * 0`) counts as 0, and a SUM that hits `+inf + -inf` becomes 0, both as in Redis. Because that
    /// makes SUM depend on the order of folding, sources are folded like Redis does: smallest cardinality
    /// first (sources of equal size in the order given; Redis's `qsort` leaves that order unspecified).
    /// A NaN weight makes all of that source's products 0.
    pub fn union(sources: &[(&SortedSet, f64)], aggregate: Aggregate) -> SortedSet {
        SortedSet::union_with_layout(sources, aggregate, NodeLayout::DEFAULT)
    }

    pub(crate) fn union_with_layout(
        sources: &[(&SortedSet, f64)],
        aggregate: Aggregate,
        layout: NodeLayout,
    ) -> SortedSet {
        let mut by_size: Vec<(&SortedSet, f64)> = sources.to_vec();
        by_size.sort_by_key(|(set, _)| set.len());

        let largest = by_size.last().map_or(0, |(set, _)| set.len());
        let mut combined: HashMap<&[u8], f64> = HashMap::with_capacity(largest);
        for &(set, weight) in &by_size {
            for (member, score) in set.iter() {
                let weighted = score * weight;
                let weighted = if weighted.is_nan() { 0.0 } else { weighted };
                match combined.entry(member) {
                    Entry::Vacant(vacant) => {
                        vacant.insert(weighted);
                    }
                    Entry::Occupied(mut occupied) => aggregate.fold(occupied.get_mut(), weighted),
                }
            }
        }

        // A weight of -1 turns 0 into -0.0; the set stores that as 0.
        let mut members: Vec<(&[u8], f64)> = combined
            .into_iter()
            .map(|(member, score)| (member, if score == 0.0 { 0.0 } else { score }))
            .collect();
        members.sort_unstable_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        SortedSet::from_sorted_unique(&members, layout)
    }
}
