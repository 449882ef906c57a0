//! Carry-over for `popular` daily rankings (SPEC 1.4).
//!
//! `carry(c, D+1, p) = carry_ratio × score(c, D, p)` for the top `carry_top_n` products of (c, D). Because
//! `score(c, D, p)` itself includes `carry(c, D, p)`, carry chains across days from the earliest retained
//! day, which has none. Carry is *derived*: it is always a function of day D's current metrics, never a
//! stored counter, so a late event for day D changes day D+1's carry and the chain after it.

use crate::metrics::Metrics;
use crate::ranker::{popular_score, ranking_order, PopularWeights};

/// Scores one day's candidates and returns the next day's carry, in ranking order.
///
/// `candidates` yields every product of (c, D) that has metrics on D or carry into D, with both values.
/// Products that are not listed (all inputs zero) have score 0 and are not candidates.
pub fn next_day_carry<P: AsRef<[u8]> + Clone>(
    candidates: impl IntoIterator<Item = (P, Metrics, f64)>,
    weights: &PopularWeights,
) -> Vec<(P, f64)> {
    let mut scored: Vec<(P, f64)> = candidates
        .into_iter()
        .filter(|(_, metrics, carry)| {
            let inputs = crate::ranker::ScoreInputs {
                metrics: *metrics,
                carry: *carry,
                ..Default::default()
            };
            crate::ranker::is_listed(crate::ranker::RankerName::Popular, &inputs)
        })
        .map(|(product, metrics, carry)| {
            let score = popular_score(carry, &metrics, weights);
            (product, score)
        })
        .collect();
    let top_n = weights.carry_top_n as usize;
    let by_rank = |a: &(P, f64), b: &(P, f64)| ranking_order(a.1, a.0.as_ref(), b.1, b.0.as_ref());
    if scored.len() > top_n {
        scored.select_nth_unstable_by(top_n, by_rank);
        scored.truncate(top_n);
    }
    scored.sort_unstable_by(by_rank);
    scored
        .into_iter()
        .map(|(product, score)| (product, weights.carry_ratio * score))
        .filter(|(_, carry)| *carry != 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_the_top_n_times_the_ratio() {
        let weights = PopularWeights {
            carry_top_n: 2,
            ..PopularWeights::default()
        };
        let views = |v| Metrics {
            views: v,
            ..Metrics::default()
        };
        let carry = next_day_carry(
            vec![
                ("a", views(10), 0.0),
                ("b", views(30), 0.0),
                ("c", views(20), 1.0),
                ("d", views(0), 0.0),
            ],
            &weights,
        );
        assert_eq!(
            carry,
            vec![("b", 0.1 * 3.0000000000000004), ("c", 0.1 * (1.0 + 20.0 * 0.1))]
        );
    }

    #[test]
    fn ties_at_the_cut_go_to_the_smaller_product_id() {
        let weights = PopularWeights {
            carry_top_n: 1,
            ..PopularWeights::default()
        };
        let views = Metrics {
            views: 5,
            ..Metrics::default()
        };
        let carry = next_day_carry(vec![("p9", views, 0.0), ("p10", views, 0.0)], &weights);
        assert_eq!(carry.len(), 1);
        assert_eq!(carry[0].0, "p10");
    }
}
