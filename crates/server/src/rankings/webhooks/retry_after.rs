//! A receiver's `Retry-After` (on a 429 or 503), read as the delay it asks for before the next attempt.
//!
//! The value is the receiver's, so it is hostile until proven otherwise: only the two forms HTTP defines
//! are read (`delay-seconds`, all digits; or an HTTP-date), anything else is ignored and the retry keeps
//! its plain backoff. A number too large for any clock is read as "as long as possible", which the job
//! store caps at the webhook's `retry_max_millis` (`rankgate_core::job::retry_delay_ms`): a receiver can
//! slow its own retries down to the cap, never park them beyond it.

use std::time::UNIX_EPOCH;

/// Longest value read; a longer one is not a date, and a longer number is capped all the same.
const MAX_VALUE_BYTES: usize = 64;

/// The delay in milliseconds `value` asks for, from `now_millis`; `None` for a value to ignore
/// (malformed, negative, or a date already past).
pub fn requested_delay_millis(value: &[u8], now_millis: i64) -> Option<u64> {
    let value = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // Digits too many for u64 are still "a long time": saturate, and let the cap decide.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(seconds.saturating_mul(1_000));
    }
    if value.len() > MAX_VALUE_BYTES {
        return None;
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let date_millis = i64::try_from(date.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
    let delay = date_millis.checked_sub(now_millis)?;
    (delay > 0).then_some(delay as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fri, 04 Dec 2026 22:00:00 GMT.
    const NOW: i64 = 1_796_421_600_000;

    #[test]
    fn seconds_and_dates_are_read_and_anything_else_is_ignored() {
        assert_eq!(requested_delay_millis(b"120", NOW), Some(120_000));
        assert_eq!(requested_delay_millis(b" 0 ", NOW), Some(0));
        assert_eq!(
            requested_delay_millis(b"Fri, 04 Dec 2026 22:00:30 GMT", NOW),
            Some(30_000)
        );
        // The obsolete forms HTTP still asks recipients to accept.
        assert_eq!(
            requested_delay_millis(b"Friday, 04-Dec-26 22:01:00 GMT", NOW),
            Some(60_000)
        );
        assert_eq!(
            requested_delay_millis(b"Fri Dec  4 22:00:05 2026", NOW),
            Some(5_000)
        );
        assert_eq!(
            requested_delay_millis(b"Fri, 04 Dec 2026 21:59:00 GMT", NOW),
            None,
            "a date past"
        );
        for garbage in [
            &b"-5"[..],
            b"1.5",
            b"",
            b"soon",
            b"5s",
            b"0x10",
            b"+5",
            b"\xff\xfe",
            b"Fri, 04 Dec 2026 25:00:00 GMT",
        ] {
            assert_eq!(
                requested_delay_millis(garbage, NOW),
                None,
                "{:?}",
                String::from_utf8_lossy(garbage)
            );
        }
    }

    #[test]
    fn huge_numbers_saturate_for_the_cap_to_clamp() {
        assert_eq!(
            requested_delay_millis(b"99999999999999999999999999999999", NOW),
            Some(u64::MAX)
        );
        assert_eq!(
            requested_delay_millis(b"18446744073709552", NOW),
            Some(u64::MAX),
            "seconds that overflow once in milliseconds"
        );
        let policy = rankgate_core::job::RetryPolicy {
            base_delay_ms: 100,
            max_delay_ms: 1_500,
            max_attempts: 3,
        };
        let floor = requested_delay_millis(b"86400", NOW).unwrap();
        assert_eq!(
            rankgate_core::job::retry_delay_ms(&policy, 1, 0.0, floor),
            1_500,
            "a day asked, the cap given"
        );
    }
}
