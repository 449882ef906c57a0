//! The position body of SPEC 2.2 (what a poll, an entry and a member stream answer), written by hand
//! for the hottest answer; the claim's answer; and the poll limit's headers.

use rankgate_core::queue::MemberStatus;
use serde::Serialize;

use crate::http::json_writer::JsonWriter;

/// The position body of SPEC 2.2.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    /// `NOT_ENTERED`, `WAITING`, `READY` or `CLAIMED`.
    pub status: MemberStatus,
    /// 0-based rank while WAITING, else `null`.
    pub rank: Option<u64>,
    /// Members waiting in the queue.
    pub current_total_waiting_count: u64,
    /// Seconds until admission at the measured rate, while WAITING (`null` if paused).
    pub estimated_wait_seconds: Option<u64>,
    /// The wait admitted within nine times in ten (from the measured spread of admissions), while
    /// WAITING (`null` if paused); never below `estimatedWaitSeconds`.
    pub estimated_wait_seconds_p90: Option<u64>,
    /// When to poll next: 1/3/5 s by rank plus up to 20% jitter.
    pub polling_interval_seconds: f64,
    /// The entry token, only while READY.
    pub entry_token: Option<String>,
    /// When the token expires (RFC 3339), only while READY.
    pub token_expires_at: Option<String>,
    /// `CONSUMED` while a consumed member is remembered; omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_outcome: Option<&'static str>,
    /// `true` while the member waits in a scheduled opening's pre-queue (rank `null` until the draw);
    /// omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pre_queue: Option<bool>,
    /// The opening's time (RFC 3339) while in the pre-queue; omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<String>,
    /// The member the entry speaks for (rankgate's `v-…` when the entry named none): entry answers only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member_id: Option<String>,
    /// The member's credential for every later call (`X-Queue-Ticket`): entry answers only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
}

impl Position {
    /// The body, byte for byte what `serde_json::to_vec` writes for it (a test holds the two together),
    /// written by hand because the poll is the waiting room's hottest answer: the derived form cost a
    /// poll about 2,800 instructions, a fifth of all it costs (see [`crate::http::json_writer`]).
    pub fn to_json(&self) -> bytes::Bytes {
        let mut out = JsonWriter::with_capacity(256);
        out.raw(match self.status {
            MemberStatus::NotEntered => r#"{"status":"NOT_ENTERED","rank":"#,
            MemberStatus::Waiting => r#"{"status":"WAITING","rank":"#,
            MemberStatus::Ready => r#"{"status":"READY","rank":"#,
            MemberStatus::Claimed => r#"{"status":"CLAIMED","rank":"#,
        });
        out.opt_u64(self.rank);
        out.raw(r#","currentTotalWaitingCount":"#);
        out.u64(self.current_total_waiting_count);
        out.raw(r#","estimatedWaitSeconds":"#);
        out.opt_u64(self.estimated_wait_seconds);
        out.raw(r#","estimatedWaitSecondsP90":"#);
        out.opt_u64(self.estimated_wait_seconds_p90);
        out.raw(r#","pollingIntervalSeconds":"#);
        out.f64(self.polling_interval_seconds);
        out.raw(r#","entryToken":"#);
        out.opt_str(self.entry_token.as_deref());
        out.raw(r#","tokenExpiresAt":"#);
        out.opt_str(self.token_expires_at.as_deref());
        if let Some(outcome) = self.last_outcome {
            out.raw(r#","lastOutcome":"#);
            out.str(outcome);
        }
        if let Some(pre_queue) = self.pre_queue {
            out.raw(r#","preQueue":"#);
            out.bool(pre_queue);
        }
        if let Some(opens_at) = &self.opens_at {
            out.raw(r#","opensAt":"#);
            out.str(opens_at);
        }
        if let Some(member_id) = &self.member_id {
            out.raw(r#","memberId":"#);
            out.str(member_id);
        }
        if let Some(ticket) = &self.ticket {
            out.raw(r#","ticket":"#);
            out.str(ticket);
        }
        out.raw("}");
        out.into_bytes()
    }
}

/// A granted claim (SPEC 2.4).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimGranted {
    /// Present it to consume or release. Shown once; only its hash is stored.
    pub claim_id: String,
    /// When the claim is released automatically (RFC 3339).
    pub expires_at: String,
}

/// `{first}{a}{second}{b}`: a `RateLimit-Policy` or `RateLimit` value such as `"poll";q=3;w=3`.
pub(crate) fn rate_limit_value(first: &str, a: u64, second: &str, b: u64) -> String {
    let (mut a_digits, mut b_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (a, b) = (a_digits.format(a), b_digits.format(b));
    let mut value = String::with_capacity(first.len() + a.len() + second.len() + b.len());
    value.push_str(first);
    value.push_str(a);
    value.push_str(second);
    value.push_str(b);
    value
}

/// Headers describing the poll limit (IETF `RateLimit-Policy` / `RateLimit`, draft-ietf-httpapi-ratelimit-headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollLimitHeaders {
    /// `RateLimit-Policy` value.
    pub policy: String,
    /// `RateLimit` value.
    pub limit: String,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rankgate_core::ids::MemberId;
    use rankgate_core::queue::QueueName;

    use super::*;

    proptest! {
        #[test]
        fn the_poll_limit_strings_are_what_format_wrote(
            queue in "[a-z0-9_-]{1,16}", member in "[!-~]{1,32}", a in any::<u64>(), b in any::<u64>(),
        ) {
            let (Ok(queue_name), Ok(member_id)) = (QueueName::parse(&queue), MemberId::parse(&member)) else {
                return Ok(());
            };
            prop_assert_eq!(rankgate_store::queue::poll_limit_key(&queue_name, &member_id), format!("poll:{queue}:{member}"));
            prop_assert_eq!(rate_limit_value("\"poll\";q=", a, ";w=", b), format!("\"poll\";q={a};w={b}"));
        }
    }

    fn status() -> impl Strategy<Value = MemberStatus> {
        prop_oneof![
            Just(MemberStatus::NotEntered),
            Just(MemberStatus::Waiting),
            Just(MemberStatus::Ready),
            Just(MemberStatus::Claimed),
        ]
    }

    /// Strings as a position may hold them, and ones that need escaping.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("2026-12-01T23:40:00Z".to_owned()),
            "[a-zA-Z0-9_-]{0,40}",
            "\\PC{0,8}",
            Just("quote \" backslash \\ newline \n nul \u{0}".to_owned()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn the_hand_written_position_body_is_serde_jsons(
            status in status(),
            rank in proptest::option::of(any::<u64>()),
            waiting in any::<u64>(),
            estimate in proptest::option::of(any::<u64>()),
            p90 in proptest::option::of(any::<u64>()),
            interval in prop_oneof![0.8f64..7.0, any::<f64>()],
            token in proptest::option::of(text()),
            expires in proptest::option::of(text()),
            consumed in any::<bool>(),
            pre_queue in proptest::option::of(any::<bool>()),
            opens_at in proptest::option::of(text()),
            member_id in proptest::option::of(text()),
            ticket in proptest::option::of(text()),
        ) {
            let position = Position {
                status,
                rank,
                current_total_waiting_count: waiting,
                estimated_wait_seconds: estimate,
                estimated_wait_seconds_p90: p90,
                polling_interval_seconds: interval,
                entry_token: token,
                token_expires_at: expires,
                last_outcome: consumed.then_some("CONSUMED"),
                pre_queue,
                opens_at,
                member_id,
                ticket,
            };
            prop_assert_eq!(
                String::from_utf8(position.to_json().to_vec()).unwrap(),
                serde_json::to_string(&position).unwrap()
            );
        }
    }
}
