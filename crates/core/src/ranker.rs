//! Rankers: named, versioned scoring policies (SPEC 1.3), and the one ranking order (SPEC 1.4).
//!
//! A ranker turns a product's metrics over a span (plus, for `popular` daily rankings, its carry) into a
//! score. Scores are evaluated in `f64`, in exactly the order the spec writes them, so every backend and the
//! batch recompute produce bit-identical scores from the same metrics.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::metrics::Metrics;

/// The three built-in rankers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankerName {
    /// `carry + views*w_view + likes*w_like + ln_1p(max(sales,0))*w_sales`.
    Popular,
    /// Net units sold.
    Units,
    /// Net sales in the currency's smallest unit.
    Revenue,
}

impl RankerName {
    /// Every ranker, in a fixed order (also the index order used by per-span arrays).
    pub const ALL: [RankerName; 3] = [RankerName::Popular, RankerName::Units, RankerName::Revenue];

    /// Parses the ranker's wire name.
    pub fn parse(name: &str) -> Result<RankerName, RankerError> {
        match name {
            "popular" => Ok(RankerName::Popular),
            "units" => Ok(RankerName::Units),
            "revenue" => Ok(RankerName::Revenue),
            other => Err(RankerError::UnknownRanker(other.chars().take(64).collect())),
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RankerName::Popular => "popular",
            RankerName::Units => "units",
            RankerName::Revenue => "revenue",
        }
    }

    /// Position in [`RankerName::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for RankerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors from parsing rankers and their weights.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RankerError {
    /// The ranker name is not one of the built-ins.
    #[error("unknown ranker `{0}`; use popular, units or revenue")]
    UnknownRanker(String),
    /// A weight is not a finite number, or out of range. The first field names it.
    #[error("{0}: {1}")]
    InvalidWeight(&'static str, String),
    /// Only `popular` has weights.
    #[error("ranker `{0}` has no weights; only popular can be changed")]
    NotConfigurable(RankerName),
}

/// The tunable part of the `popular` ranker.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PopularWeights {
    /// Weight of one view.
    pub view: f64,
    /// Weight of one net like.
    pub like: f64,
    /// Weight of `ln_1p(max(sales, 0))`.
    pub sales: f64,
    /// Share of day D's score carried into day D+1.
    pub carry_ratio: f64,
    /// How many of day D's top products carry into day D+1.
    pub carry_top_n: u32,
}

impl Default for PopularWeights {
    fn default() -> Self {
        PopularWeights {
            view: 0.1,
            like: 0.2,
            sales: 0.7,
            carry_ratio: 0.1,
            carry_top_n: 100,
        }
    }
}

/// The largest `carryTopN` accepted; carry is a seed, not a copy of the ranking.
pub const MAX_CARRY_TOP_N: u32 = 10_000;
/// The largest weight accepted. With metrics below 2^63 every term of the `popular` score then stays
/// below 10^25, so no score can overflow to infinity (and no `inf - inf` can make a NaN score).
pub const MAX_WEIGHT: f64 = 1_000_000.0;

impl PopularWeights {
    /// Checks that every weight is usable: weights between 0 and [`MAX_WEIGHT`] (a negative one would rank
    /// the least popular first; a huge one could overflow a score), a carry ratio in [0, 1], a bounded
    /// top N.
    pub fn validate(&self) -> Result<(), RankerError> {
        for (field, value) in [
            ("weights.view", self.view),
            ("weights.like", self.like),
            ("weights.sales", self.sales),
        ] {
            if !(value.is_finite() && (0.0..=MAX_WEIGHT).contains(&value)) {
                return Err(RankerError::InvalidWeight(
                    field,
                    format!("must be a number between 0 and {MAX_WEIGHT}, got {value}"),
                ));
            }
        }
        if !(self.carry_ratio.is_finite() && (0.0..=1.0).contains(&self.carry_ratio)) {
            return Err(RankerError::InvalidWeight(
                "carryRatio",
                "must be a number between 0 and 1".into(),
            ));
        }
        if self.carry_top_n > MAX_CARRY_TOP_N {
            return Err(RankerError::InvalidWeight(
                "carryTopN",
                format!("must be an integer between 0 and {MAX_CARRY_TOP_N}"),
            ));
        }
        Ok(())
    }
}

/// One version of a ranker's policy: what every score served under `version` was computed with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Monotonic per ranker, starting at 1.
    pub version: u32,
    /// Weights of `popular`; the other rankers have fixed formulas.
    pub weights: PopularWeights,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            version: 1,
            weights: PopularWeights::default(),
        }
    }
}

/// The `popular` score, evaluated exactly as SPEC 1.3 writes it: left to right, in f64.
pub fn popular_score(carry: f64, metrics: &Metrics, weights: &PopularWeights) -> f64 {
    carry
        + metrics.views as f64 * weights.view
        + metrics.likes as f64 * weights.like
        + f64::ln_1p(metrics.sales.max(0) as f64) * weights.sales
}

/// A product's score under `ranker`. `carry` only matters to `popular` (and is 0 outside daily periods).
pub fn score(ranker: RankerName, metrics: &Metrics, carry: f64, weights: &PopularWeights) -> f64 {
    match ranker {
        RankerName::Popular => popular_score(carry, metrics, weights),
        RankerName::Units => metrics.units as f64,
        RankerName::Revenue => metrics.sales as f64,
    }
}

/// Whether a product is listed in a ranking: at least one of the ranker's inputs is non-zero (SPEC 1.4).
pub fn is_listed(ranker: RankerName, metrics: &Metrics, carry: f64) -> bool {
    match ranker {
        RankerName::Popular => metrics.views != 0 || metrics.likes != 0 || metrics.sales != 0 || carry != 0.0,
        RankerName::Units => metrics.units != 0,
        RankerName::Revenue => metrics.sales != 0,
    }
}

/// The ranking order: score descending, then product id ascending by bytes. Identical on every backend.
pub fn ranking_order(a_score: f64, a_product: &[u8], b_score: f64, b_product: &[u8]) -> Ordering {
    b_score.total_cmp(&a_score).then_with(|| a_product.cmp(b_product))
}

/// The sorted-set score that makes an ascending sorted set (Redis order: score, then member bytes) yield
/// the ranking order: the negated score, with -0.0 folded into 0.0 so zero scores tie by product id.
pub fn ascending_key(score: f64) -> f64 {
    let negated = -score;
    if negated == 0.0 {
        0.0
    } else {
        negated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(views: i64, likes: i64, units: i64, sales: i64) -> Metrics {
        Metrics {
            views,
            likes,
            units,
            sales,
        }
    }

    #[test]
    fn popular_formula_is_evaluated_left_to_right() {
        let w = PopularWeights::default();
        let metrics = m(120, 31, 44, 881_000);
        let expected = ((12.1 + 120.0 * 0.1) + 31.0 * 0.2) + (881_000f64).ln_1p() * 0.7;
        assert_eq!(popular_score(12.1, &metrics, &w).to_bits(), expected.to_bits());
    }

    #[test]
    fn negative_sales_contribute_nothing_but_still_list_the_product() {
        let w = PopularWeights::default();
        let refunds_only = m(0, 0, -2, -5000);
        assert_eq!(popular_score(0.0, &refunds_only, &w), 0.0);
        assert!(is_listed(RankerName::Popular, &refunds_only, 0.0));
        assert!(is_listed(RankerName::Units, &refunds_only, 0.0));
        assert!(!is_listed(RankerName::Units, &m(3, 0, 0, 0), 0.0));
        assert!(is_listed(RankerName::Popular, &Metrics::default(), 0.5));
    }

    #[test]
    fn ties_break_by_product_bytes_ascending() {
        assert_eq!(ranking_order(5.0, b"p1", 5.0, b"p2"), Ordering::Less);
        assert_eq!(ranking_order(6.0, b"p2", 5.0, b"p1"), Ordering::Less);
        assert_eq!(
            ranking_order(5.0, b"p10", 5.0, b"p9"),
            Ordering::Less,
            "bytes, not numbers"
        );
    }

    #[test]
    fn ascending_key_folds_negative_zero() {
        assert_eq!(ascending_key(0.0).to_bits(), 0.0f64.to_bits());
        assert_eq!(ascending_key(2.5), -2.5);
    }

    #[test]
    fn weights_are_validated_and_name_the_field() {
        let bad = PopularWeights {
            view: f64::NAN,
            ..PopularWeights::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("weights.view"));
        let bad = PopularWeights {
            carry_ratio: 1.5,
            ..PopularWeights::default()
        };
        assert!(bad.validate().unwrap_err().to_string().starts_with("carryRatio"));
        assert!(PopularWeights::default().validate().is_ok());
    }

    #[test]
    fn negative_infinite_or_huge_weights_are_refused_so_no_score_can_be_nan() {
        for (view, like, sales) in [
            (-0.1, 0.2, 0.7),
            (0.1, f64::INFINITY, 0.7),
            (0.1, 0.2, f64::NEG_INFINITY),
            (1e300, 0.2, 0.7),
            (0.1, 2e6, 0.7),
        ] {
            let weights = PopularWeights {
                view,
                like,
                sales,
                ..PopularWeights::default()
            };
            let error = weights.validate().unwrap_err().to_string();
            assert!(error.starts_with("weights."), "{error}");
        }
        // At the bounds, the largest metrics still give a finite score.
        let weights = PopularWeights {
            view: MAX_WEIGHT,
            like: MAX_WEIGHT,
            sales: MAX_WEIGHT,
            carry_ratio: 1.0,
            ..PopularWeights::default()
        };
        assert!(weights.validate().is_ok());
        let metrics = m(i64::MAX, i64::MAX, i64::MAX, i64::MAX);
        assert!(popular_score(0.0, &metrics, &weights).is_finite());
        assert!(popular_score(0.0, &m(i64::MAX, i64::MIN, 0, 0), &weights).is_finite());
    }
}
