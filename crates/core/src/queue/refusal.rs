//! Why an entry was refused before it made a member (SPEC 2.2, "Entry challenges" and "Per-address
//! budgets"): the `reason` label of `rankgate_queue_entries_refused_total`, the keys of the admin view's
//! `refused` counts and of the sale report's per-minute refusals.

use serde::Serialize;

/// Why an entry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RefusalReason {
    /// No valid proof-of-work solution (428).
    Challenge,
    /// The client address spent its `entries_per_address_per_minute` (429).
    Address,
    /// No CAPTCHA token, or the provider refused it.
    Captcha,
}

impl RefusalReason {
    /// Every reason, in the order reports list them.
    pub const ALL: [RefusalReason; 3] = [
        RefusalReason::Challenge,
        RefusalReason::Address,
        RefusalReason::Captcha,
    ];

    /// The label and JSON key.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Challenge => "challenge",
            RefusalReason::Address => "address",
            RefusalReason::Captcha => "captcha",
        }
    }

    /// The reason a label names.
    #[must_use]
    pub fn parse(raw: &str) -> Option<RefusalReason> {
        RefusalReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_match_json() {
        for reason in RefusalReason::ALL {
            assert_eq!(RefusalReason::parse(reason.as_str()), Some(reason));
            assert_eq!(
                serde_json::to_string(&reason).unwrap(),
                format!("\"{}\"", reason.as_str())
            );
        }
        assert_eq!(RefusalReason::parse("bot"), None);
    }
}
