//! The sale report's arithmetic (SPEC 2.5): the buckets that waits and wait estimates are counted in, and
//! the percentiles read back from them.
//!
//! A report keeps, per minute, how many members waited how long, not each member's wait: counts add up
//! across instances and flushes (a sum of histograms is the histogram of the union), while exact samples
//! would grow with the sale. The buckets are fine where a shop reads them and coarser where nobody needs
//! the second: **1 s up to 10 minutes, 10 s up to an hour, 1 min up to a day**, and one bucket for
//! everything longer. A percentile is read as the lower edge of the bucket holding the nearest-rank
//! sample, so it is exact to the second below 10 minutes and never above the true value.

use std::collections::BTreeMap;

/// Waits below this many seconds have a bucket per second.
const FINE_UNTIL_SECONDS: u64 = 600;
/// Waits below this many seconds have a bucket per 10 s.
const MEDIUM_UNTIL_SECONDS: u64 = 3_600;
/// Waits below this many seconds have a bucket per minute; longer ones share the last bucket.
const COARSE_UNTIL_SECONDS: u64 = 86_400;

/// Buckets of the first two ranges, where the minute buckets begin.
const MEDIUM_FIRST_BUCKET: u64 = FINE_UNTIL_SECONDS;
const COARSE_FIRST_BUCKET: u64 = MEDIUM_FIRST_BUCKET + (MEDIUM_UNTIL_SECONDS - FINE_UNTIL_SECONDS) / 10;

/// The last bucket: a day or more.
pub const LAST_WAIT_BUCKET: u16 =
    (COARSE_FIRST_BUCKET + (COARSE_UNTIL_SECONDS - MEDIUM_UNTIL_SECONDS) / 60) as u16;

/// The bucket of a wait (or an estimate) of `seconds`.
#[must_use]
pub fn wait_bucket(seconds: u64) -> u16 {
    let bucket = if seconds < FINE_UNTIL_SECONDS {
        seconds
    } else if seconds < MEDIUM_UNTIL_SECONDS {
        MEDIUM_FIRST_BUCKET + (seconds - FINE_UNTIL_SECONDS) / 10
    } else if seconds < COARSE_UNTIL_SECONDS {
        COARSE_FIRST_BUCKET + (seconds - MEDIUM_UNTIL_SECONDS) / 60
    } else {
        u64::from(LAST_WAIT_BUCKET)
    };
    bucket as u16
}

/// The shortest wait (seconds) that falls in `bucket`.
#[must_use]
pub fn bucket_floor_seconds(bucket: u16) -> u64 {
    let bucket = u64::from(bucket.min(LAST_WAIT_BUCKET));
    if bucket < MEDIUM_FIRST_BUCKET {
        bucket
    } else if bucket < COARSE_FIRST_BUCKET {
        FINE_UNTIL_SECONDS + (bucket - MEDIUM_FIRST_BUCKET) * 10
    } else {
        MEDIUM_UNTIL_SECONDS + (bucket - COARSE_FIRST_BUCKET) * 60
    }
}

/// The nearest-rank `fraction` percentile (0 < fraction ≤ 1) of a histogram of bucket → count, as its
/// bucket's lower edge in seconds; `None` for an empty histogram.
#[must_use]
pub fn percentile_seconds(histogram: &BTreeMap<u16, u64>, fraction: f64) -> Option<u64> {
    let total: u64 = histogram.values().sum();
    if total == 0 {
        return None;
    }
    // Nearest rank: the smallest sample with at least `fraction` of all samples at or below it.
    let rank = ((fraction * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (bucket, count) in histogram {
        seen += count;
        if seen >= rank {
            return Some(bucket_floor_seconds(*bucket));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_ranges_meet_where_the_doc_says() {
        assert_eq!(wait_bucket(0), 0);
        assert_eq!(wait_bucket(599), 599);
        assert_eq!(wait_bucket(600), 600);
        assert_eq!(wait_bucket(609), 600);
        assert_eq!(wait_bucket(610), 601);
        assert_eq!(bucket_floor_seconds(wait_bucket(3_599)), 3_590);
        assert_eq!(bucket_floor_seconds(wait_bucket(3_600)), 3_600);
        assert_eq!(bucket_floor_seconds(wait_bucket(86_399)), 86_340);
        assert_eq!(wait_bucket(86_400), LAST_WAIT_BUCKET);
        assert_eq!(wait_bucket(u64::MAX), LAST_WAIT_BUCKET);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let histogram: BTreeMap<u16, u64> = [(wait_bucket(1), 5), (wait_bucket(7), 4), (wait_bucket(30), 1)]
            .into_iter()
            .collect();
        assert_eq!(percentile_seconds(&histogram, 0.5), Some(1));
        assert_eq!(percentile_seconds(&histogram, 0.6), Some(7));
        assert_eq!(percentile_seconds(&histogram, 0.9), Some(7));
        assert_eq!(percentile_seconds(&histogram, 0.91), Some(30));
        assert_eq!(percentile_seconds(&BTreeMap::new(), 0.5), None);
    }

    proptest! {
        /// A bucket's floor is at most the wait, and within the bucket's width of it (below a day).
        #[test]
        fn a_bucket_floor_is_at_most_the_wait(seconds in 0u64..200_000) {
            let floor = bucket_floor_seconds(wait_bucket(seconds));
            prop_assert!(floor <= seconds);
            if seconds < COARSE_UNTIL_SECONDS {
                let width = if seconds < FINE_UNTIL_SECONDS { 1 } else if seconds < MEDIUM_UNTIL_SECONDS { 10 } else { 60 };
                prop_assert!(seconds - floor < width);
            }
        }

        /// Percentiles of the histogram equal the bucket floors of the exact nearest-rank percentiles.
        #[test]
        fn histogram_percentiles_match_the_samples(samples in proptest::collection::vec(0u64..5_000, 1..200)) {
            let mut histogram = BTreeMap::new();
            for s in &samples {
                *histogram.entry(wait_bucket(*s)).or_insert(0u64) += 1;
            }
            let mut sorted = samples.clone();
            sorted.sort_unstable();
            for fraction in [0.5, 0.9] {
                let rank = ((fraction * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
                let exact = sorted[rank - 1];
                prop_assert_eq!(percentile_seconds(&histogram, fraction), Some(bucket_floor_seconds(wait_bucket(exact))));
            }
        }
    }
}
