//! How often a member should poll (SPEC 2.2): 1 s when rank < 100, 3 s when rank < 1,000, else 5 s, plus up
//! to 20% random jitter so a crowd admitted together does not poll in lockstep.
//!
//! The jitter source is a value in `[0, 1)` passed in by the caller, which keeps this function pure.

/// The base interval for a rank, in whole seconds. Members not waiting (no rank) poll at the fastest tier.
#[must_use]
pub fn polling_tier_seconds(rank: Option<u64>) -> u64 {
    match rank {
        Some(rank) if rank >= 1_000 => 5,
        Some(rank) if rank >= 100 => 3,
        _ => 1,
    }
}

/// The interval to report: the tier plus `jitter_unit × 20%`, rounded to milliseconds.
/// `jitter_unit` outside `[0, 1)` is clamped, so a bad source can never shorten the interval.
#[must_use]
pub fn polling_interval_seconds(rank: Option<u64>, jitter_unit: f64) -> f64 {
    let unit = if jitter_unit.is_finite() {
        jitter_unit.clamp(0.0, 0.999_999)
    } else {
        0.0
    };
    let base = polling_tier_seconds(rank) as f64;
    let with_jitter = base * (1.0 + 0.2 * unit);
    (with_jitter * 1000.0).floor() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_follow_the_spec() {
        assert_eq!(polling_tier_seconds(Some(0)), 1);
        assert_eq!(polling_tier_seconds(Some(99)), 1);
        assert_eq!(polling_tier_seconds(Some(100)), 3);
        assert_eq!(polling_tier_seconds(Some(999)), 3);
        assert_eq!(polling_tier_seconds(Some(1000)), 5);
        assert_eq!(polling_tier_seconds(None), 1);
    }

    #[test]
    fn jitter_adds_at_most_twenty_percent() {
        assert_eq!(polling_interval_seconds(Some(5), 0.0), 1.0);
        assert_eq!(polling_interval_seconds(Some(500), 0.5), 3.3);
        assert!(polling_interval_seconds(Some(5000), 0.999_999) < 6.0);
        assert_eq!(polling_interval_seconds(Some(5), -1.0), 1.0);
        assert_eq!(polling_interval_seconds(Some(5), f64::NAN), 1.0);
    }
}
