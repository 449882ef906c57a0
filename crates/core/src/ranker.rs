//! Rankers: named, versioned scoring policies (SPEC 1.3), and the one ranking order (SPEC 1.4).
//!
//! A ranker turns a product's metrics over a span (plus, for `popular` daily rankings, its carry) into a
//! score. Scores are evaluated in `f64`, in exactly the order the spec writes them, so every backend and the
//! batch recompute produce bit-identical scores from the same metrics.
//!
//! Three rankers score a product's metrics **summed** over the span. `trending` instead decays each
//! hour's metrics by its age relative to the span's end hour E ([`Decayed`]), so its score is not a
//! function of the span totals: it needs the product's hourly cells, summed in ascending hour order
//! (floating-point addition is not associative, so any other order could differ in the last bit).

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::metrics::Metrics;
use crate::period::Hour;

/// The four built-in rankers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankerName {
    /// `carry + views*w_view + likes*w_like + ln_1p(max(sales,0))*w_sales`.
    Popular,
    /// Net units sold.
    Units,
    /// Net sales in the currency's smallest unit.
    Revenue,
    /// `V*w_view + L*w_like + ln_1p(max(S,0))*w_sales` over hourly metrics decayed by age ([`Decayed`]).
    Trending,
}

impl RankerName {
    /// Every ranker, in a fixed order (also the index order used by per-span arrays).
    pub const ALL: [RankerName; 4] = [
        RankerName::Popular,
        RankerName::Units,
        RankerName::Revenue,
        RankerName::Trending,
    ];

    /// The rankers with versioned, re-weightable policies (`PUT /v1/admin/rankers/{name}`).
    pub const CONFIGURABLE: [RankerName; 2] = [RankerName::Popular, RankerName::Trending];

    /// Parses the ranker's wire name.
    pub fn parse(name: &str) -> Result<RankerName, RankerError> {
        match name {
            "popular" => Ok(RankerName::Popular),
            "units" => Ok(RankerName::Units),
            "revenue" => Ok(RankerName::Revenue),
            "trending" => Ok(RankerName::Trending),
            other => Err(RankerError::UnknownRanker(other.chars().take(64).collect())),
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RankerName::Popular => "popular",
            RankerName::Units => "units",
            RankerName::Revenue => "revenue",
            RankerName::Trending => "trending",
        }
    }

    /// Whether the ranker has versioned weights ([`RankerName::CONFIGURABLE`]).
    pub fn is_configurable(self) -> bool {
        RankerName::CONFIGURABLE.contains(&self)
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
    #[error("unknown ranker `{0}`; use popular, units, revenue or trending")]
    UnknownRanker(String),
    /// A weight is not a finite number, or out of range. The first field names it.
    #[error("{0}: {1}")]
    InvalidWeight(&'static str, String),
    /// Only `popular` and `trending` have weights.
    #[error("ranker `{0}` has no weights; only popular and trending can be changed")]
    NotConfigurable(RankerName),
}

/// The tunable part of a configurable ranker ([`RankerName::CONFIGURABLE`]). `popular` uses the three
/// weights and the carry fields; `trending` uses the three weights and the half-life, and has no carry
/// (its policies keep `carry_ratio` and `carry_top_n` at 0, see [`PopularWeights::trending_default`]).
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
    /// `trending` only: the age, in hours, at which an hour's metrics count half. Versions stored before
    /// `trending` existed have no such field; they read as the default.
    #[serde(default = "default_half_life_hours")]
    pub half_life_hours: f64,
}

fn default_half_life_hours() -> f64 {
    DEFAULT_HALF_LIFE_HOURS
}

impl Default for PopularWeights {
    fn default() -> Self {
        PopularWeights {
            view: 0.1,
            like: 0.2,
            sales: 0.7,
            carry_ratio: 0.1,
            carry_top_n: 100,
            half_life_hours: DEFAULT_HALF_LIFE_HOURS,
        }
    }
}

/// The largest `carryTopN` accepted; carry is a seed, not a copy of the ranking.
pub const MAX_CARRY_TOP_N: u32 = 10_000;
/// The largest weight accepted. With metrics below 2^63 every term of the `popular` score then stays
/// below 10^25, so no score can overflow to infinity (and no `inf - inf` can make a NaN score).
pub const MAX_WEIGHT: f64 = 1_000_000.0;
/// `trending`'s default half-life (SPEC 1.3).
pub const DEFAULT_HALF_LIFE_HOURS: f64 = 24.0;
/// The shortest half-life accepted. Metrics are hourly, so a shorter one would decay by more than half
/// between two buckets; and an hour ahead of E (an event stamped slightly in the future while the period
/// runs) is weighted `2^(1/half_life)`, which a tiny half-life would overflow to infinity (and
/// `infinity × 0` weight would make a NaN score).
pub const MIN_HALF_LIFE_HOURS: f64 = 1.0;
/// The longest half-life accepted: ten years, far past `metric_retention`; longer is the same ranking.
pub const MAX_HALF_LIFE_HOURS: f64 = 87_600.0;

impl PopularWeights {
    /// `trending`'s first version: `popular`'s default weights, no carry, a 24-hour half-life.
    pub fn trending_default() -> PopularWeights {
        PopularWeights {
            carry_ratio: 0.0,
            carry_top_n: 0,
            ..PopularWeights::default()
        }
    }

    /// The first version of `ranker`'s weights (those of a ranker never configured).
    pub fn initial_for(ranker: RankerName) -> PopularWeights {
        match ranker {
            RankerName::Trending => PopularWeights::trending_default(),
            RankerName::Popular | RankerName::Units | RankerName::Revenue => PopularWeights::default(),
        }
    }

    /// [`PopularWeights::validate`], plus what `ranker` requires: `trending` has no carry (both carry
    /// fields 0) and a half-life between [`MIN_HALF_LIFE_HOURS`] and [`MAX_HALF_LIFE_HOURS`] hours.
    pub fn validate_for(&self, ranker: RankerName) -> Result<(), RankerError> {
        if !ranker.is_configurable() {
            return Err(RankerError::NotConfigurable(ranker));
        }
        self.validate()?;
        if ranker == RankerName::Trending {
            if self.carry_ratio != 0.0 {
                return Err(RankerError::InvalidWeight(
                    "carryRatio",
                    "trending has no carry".into(),
                ));
            }
            if self.carry_top_n != 0 {
                return Err(RankerError::InvalidWeight(
                    "carryTopN",
                    "trending has no carry".into(),
                ));
            }
            let half_life = self.half_life_hours;
            if !(half_life.is_finite() && (MIN_HALF_LIFE_HOURS..=MAX_HALF_LIFE_HOURS).contains(&half_life)) {
                return Err(RankerError::InvalidWeight(
                    "halfLifeHours",
                    format!(
                        "must be a number of hours between {MIN_HALF_LIFE_HOURS} and {MAX_HALF_LIFE_HOURS}, got {half_life}"
                    ),
                ));
            }
        }
        Ok(())
    }

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
    /// Weights of `popular` or `trending`; `units` and `revenue` have fixed formulas.
    pub weights: PopularWeights,
}

impl Policy {
    /// Version 1 of `ranker`: its policy before anyone configured it.
    pub fn initial_for(ranker: RankerName) -> Policy {
        Policy {
            version: 1,
            weights: PopularWeights::initial_for(ranker),
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            version: 1,
            weights: PopularWeights::default(),
        }
    }
}

/// A product's hourly metrics over a span, each hour weighted by `d(h) = 2^(−(E − h) / half_life)`:
/// `trending`'s inputs (SPEC 1.3). E is the span's end hour ([`crate::period::Span::trending_end`]).
///
/// Build it with [`Decayed::add_hour`] over the span's hours in **ascending** order: that order is part
/// of the definition, so every backend and the batch recompute get the same bits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Decayed {
    /// V = Σ views(h)·d(h).
    pub views: f64,
    /// L = Σ likes(h)·d(h).
    pub likes: f64,
    /// S = Σ sales(h)·d(h).
    pub sales: f64,
}

/// `d(h) = 2^(−(E − h) / half_life)`: the weight of hour `hour`'s metrics in a span ending at `end`.
pub fn trending_decay(end: Hour, hour: Hour, half_life_hours: f64) -> f64 {
    f64::exp2(-((end.0 - hour.0) as f64) / half_life_hours)
}

impl Decayed {
    /// Adds hour `hour`'s metrics, decayed for a span ending at `end`. Call it hour by hour, ascending.
    pub fn add_hour(&mut self, end: Hour, hour: Hour, metrics: &Metrics, half_life_hours: f64) {
        self.add_decayed(metrics, trending_decay(end, hour, half_life_hours));
    }

    /// Adds one hour's metrics weighted by `decay`, that hour's [`trending_decay`] (computed once per
    /// hour when many products share it).
    pub fn add_decayed(&mut self, metrics: &Metrics, decay: f64) {
        self.views += metrics.views as f64 * decay;
        self.likes += metrics.likes as f64 * decay;
        self.sales += metrics.sales as f64 * decay;
    }

    /// V, L and S all zero: `trending` does not list the product.
    pub fn is_zero(&self) -> bool {
        self.views == 0.0 && self.likes == 0.0 && self.sales == 0.0
    }
}

/// The `trending` score, evaluated exactly as SPEC 1.3 writes it: left to right, in f64, no carry.
pub fn trending_score(decayed: &Decayed, weights: &PopularWeights) -> f64 {
    decayed.views * weights.view
        + decayed.likes * weights.like
        + f64::ln_1p(decayed.sales.max(0.0)) * weights.sales
}

/// Everything a product's score in one span can depend on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScoreInputs {
    /// Its metrics summed over the span (`popular`, `units`, `revenue`).
    pub metrics: Metrics,
    /// Its carry (`popular` daily rankings; 0 elsewhere).
    pub carry: f64,
    /// Its decayed metrics (`trending`).
    pub decayed: Decayed,
}

/// The `popular` score, evaluated exactly as SPEC 1.3 writes it: left to right, in f64.
pub fn popular_score(carry: f64, metrics: &Metrics, weights: &PopularWeights) -> f64 {
    carry
        + metrics.views as f64 * weights.view
        + metrics.likes as f64 * weights.like
        + f64::ln_1p(metrics.sales.max(0) as f64) * weights.sales
}

/// A product's score under `ranker`, with that ranker's `weights` (only `popular` and `trending` use
/// them). `carry` only matters to `popular` (and is 0 outside daily periods), `decayed` to `trending`.
pub fn score(ranker: RankerName, inputs: &ScoreInputs, weights: &PopularWeights) -> f64 {
    let metrics = &inputs.metrics;
    match ranker {
        RankerName::Popular => popular_score(inputs.carry, metrics, weights),
        RankerName::Units => metrics.units as f64,
        RankerName::Revenue => metrics.sales as f64,
        RankerName::Trending => trending_score(&inputs.decayed, weights),
    }
}

/// Whether a product is listed in a ranking: at least one of the ranker's inputs is non-zero (SPEC 1.4).
pub fn is_listed(ranker: RankerName, inputs: &ScoreInputs) -> bool {
    let metrics = &inputs.metrics;
    match ranker {
        RankerName::Popular => {
            metrics.views != 0 || metrics.likes != 0 || metrics.sales != 0 || inputs.carry != 0.0
        }
        RankerName::Units => metrics.units != 0,
        RankerName::Revenue => metrics.sales != 0,
        RankerName::Trending => !inputs.decayed.is_zero(),
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
        let summed = |metrics: Metrics, carry: f64| ScoreInputs {
            metrics,
            carry,
            decayed: Decayed::default(),
        };
        assert!(is_listed(RankerName::Popular, &summed(refunds_only, 0.0)));
        assert!(is_listed(RankerName::Units, &summed(refunds_only, 0.0)));
        assert!(!is_listed(RankerName::Units, &summed(m(3, 0, 0, 0), 0.0)));
        assert!(is_listed(RankerName::Popular, &summed(Metrics::default(), 0.5)));
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

    #[test]
    fn trending_decay_halves_per_half_life_and_is_one_at_the_end_hour() {
        assert_eq!(trending_decay(Hour(100), Hour(100), 24.0), 1.0);
        assert_eq!(trending_decay(Hour(100), Hour(76), 24.0), 0.5);
        assert_eq!(trending_decay(Hour(100), Hour(52), 24.0), 0.25);
        assert_eq!(trending_decay(Hour(100), Hour(99), 1.0), 0.5);
        // An hour after E (a future-stamped event while the period runs) weighs more than one.
        assert_eq!(trending_decay(Hour(100), Hour(101), 1.0), 2.0);
        assert_eq!(
            trending_decay(Hour(10), Hour(4), 12.0).to_bits(),
            f64::exp2(-0.5).to_bits()
        );
    }

    #[test]
    fn trending_score_is_the_spec_formula_summed_in_ascending_hours() {
        // Hand-computed: E = hour 48, half-life 24 h, views 8 at hour 0 (d = 1/4) and 2 at hour 48
        // (d = 1), likes 4 at hour 24 (d = 1/2) and -1 at hour 48, sales 1000 at hour 0.
        let end = Hour(48);
        let mut decayed = Decayed::default();
        decayed.add_hour(end, Hour(0), &m(8, 0, 0, 1000), 24.0);
        decayed.add_hour(end, Hour(24), &m(0, 4, 0, 0), 24.0);
        decayed.add_hour(end, Hour(48), &m(2, -1, 0, 0), 24.0);
        assert_eq!(decayed.views, 4.0);
        assert_eq!(decayed.likes, 1.0);
        assert_eq!(decayed.sales, 250.0);
        let w = PopularWeights::trending_default();
        let expected = (4.0 * 0.1 + 1.0 * 0.2) + f64::ln_1p(250.0) * 0.7;
        assert_eq!(trending_score(&decayed, &w).to_bits(), expected.to_bits());
        let inputs = ScoreInputs {
            decayed,
            ..ScoreInputs::default()
        };
        assert_eq!(
            score(RankerName::Trending, &inputs, &w).to_bits(),
            expected.to_bits()
        );
        assert!(is_listed(RankerName::Trending, &inputs));
        // Negative decayed sales contribute nothing, and no carry ever counts.
        let refunds = ScoreInputs {
            carry: 5.0,
            decayed: Decayed {
                views: 0.0,
                likes: 0.0,
                sales: -30.0,
            },
            ..ScoreInputs::default()
        };
        assert_eq!(score(RankerName::Trending, &refunds, &w), 0.0);
        assert!(is_listed(RankerName::Trending, &refunds));
        let carry_only = ScoreInputs {
            carry: 5.0,
            ..ScoreInputs::default()
        };
        assert!(!is_listed(RankerName::Trending, &carry_only));
    }

    #[test]
    fn trending_sums_hours_in_ascending_order_which_is_not_any_order() {
        // Floating-point addition is not associative. With E = 2 and a 1-hour half-life, likes of 1,
        // 2^54 and -2^53 at hours 0, 1, 2 decay to 0.25, 2^53 and -2^53: summed oldest first the 0.25 is
        // absorbed by 2^53 (L = 0), newest first it survives (L = 0.25). Ascending is the definition.
        let end = Hour(2);
        let mut ascending = Decayed::default();
        ascending.add_hour(end, Hour(0), &m(0, 1, 0, 0), 1.0);
        ascending.add_hour(end, Hour(1), &m(0, 1 << 54, 0, 0), 1.0);
        ascending.add_hour(end, Hour(2), &m(0, -(1 << 53), 0, 0), 1.0);
        assert_eq!(ascending.likes, 0.0);
        let descending = -(2f64.powi(53)) + 2f64.powi(53) + 0.25;
        assert_eq!(descending, 0.25, "the order matters, so it must be fixed");
        // So the product is not listed: V, L and S are all zero when summed in the defined order.
        assert!(ascending.is_zero());
    }

    #[test]
    fn trending_weights_are_validated_and_name_the_field() {
        let w = PopularWeights::trending_default();
        assert!(w.validate_for(RankerName::Trending).is_ok());
        assert_eq!(w.half_life_hours, 24.0);
        assert_eq!((w.carry_ratio, w.carry_top_n), (0.0, 0));
        for (half_life, ok) in [
            (0.0, false),
            (-1.0, false),
            (0.5, false),
            (f64::NAN, false),
            (f64::INFINITY, false),
            (1e9, false),
            (1.0, true),
            (87_600.0, true),
        ] {
            let weights = PopularWeights {
                half_life_hours: half_life,
                ..w
            };
            let result = weights.validate_for(RankerName::Trending);
            assert_eq!(result.is_ok(), ok, "{half_life}");
            if let Err(error) = result {
                assert!(error.to_string().starts_with("halfLifeHours"), "{error}");
            }
        }
        let with_carry = PopularWeights {
            carry_ratio: 0.1,
            ..w
        };
        assert!(with_carry
            .validate_for(RankerName::Trending)
            .unwrap_err()
            .to_string()
            .starts_with("carryRatio"));
        assert_eq!(
            PopularWeights::default().validate_for(RankerName::Units),
            Err(RankerError::NotConfigurable(RankerName::Units))
        );
        // The popular ranker ignores the half-life.
        assert!(PopularWeights::default()
            .validate_for(RankerName::Popular)
            .is_ok());
    }

    #[test]
    fn weights_stored_before_trending_read_with_the_default_half_life() {
        let stored = r#"{"view":0.1,"like":0.2,"sales":0.7,"carryRatio":0.1,"carryTopN":100}"#;
        let weights: PopularWeights = serde_json::from_str(stored).unwrap();
        assert_eq!(weights, PopularWeights::default());
    }

    #[test]
    fn rankers_parse_and_index_in_order() {
        for (i, ranker) in RankerName::ALL.into_iter().enumerate() {
            assert_eq!(ranker.index(), i);
            assert_eq!(RankerName::parse(ranker.as_str()), Ok(ranker));
        }
        assert!(RankerName::Trending.is_configurable());
        assert!(!RankerName::Units.is_configurable());
    }
}
