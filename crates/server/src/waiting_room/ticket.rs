//! Member tickets (SPEC 2.2, "Member identity"; issue 29): the credential an entry answer hands a member,
//! which every later call for that member must show (`X-Queue-Ticket`), so that knowing or guessing a
//! member id (shops use their user ids, often sequential) buys nothing.
//!
//! A ticket is opaque to clients: `1` (the layout's version), then the 128-bit tag in hex (32
//! characters), then the member id in hex: at most 1 + 32 + 256 = 289 characters (SPEC: at most 512). The
//! tag is SipHash-2-4 with a 128-bit output over the version, the queue and the member (each
//! length-prefixed), keyed with 128 bits derived from the token secret (HMAC-SHA-256 of the secret with
//! [`TICKET_KEY_LABEL`]), so every instance sharing the secret checks every other's tickets and the token
//! key itself never signs one. The queue is not written in the ticket: it comes from the request, so a
//! ticket of another queue does not verify.
//!
//! Chosen for the check's cost, which every poll pays (issue 29: at most a tenth of a poll's
//! instructions). SipHash rather than HMAC-SHA-256: HMAC-SHA-256 in software costs about 4,600
//! instructions per check, more than a third of a whole embedded poll; SipHash is a keyed pseudo-random
//! function made for short inputs, and forging a ticket means guessing a 128-bit tag under a 128-bit key.
//! Hex rather than base64: the `base64` crate's setup costs more than the conversion itself on inputs this
//! short (about 350 instructions for a 22-character tag). The check allocates nothing for member ids up
//! to 32 bytes: it encodes the expected tag and the request's member and compares in hex, decoding the
//! ticket's member only to tell another member's genuine ticket (403) from a forged one (401).

use rankgate_core::ids::MemberId;
use rankgate_core::queue::QueueName;
use rankgate_store::queue::token::{hmac_sha256, TokenSecret};
use siphasher::sip128::{Hasher128 as _, SipHasher24};
use subtle::ConstantTimeEq as _;

/// What the ticket key is derived for.
pub const TICKET_KEY_LABEL: &[u8] = b"rankgate member ticket v1";
/// The layout version this code writes and reads.
const VERSION: u8 = b'1';
/// The tag's length in characters (16 bytes in hex).
const TAG_CHARS: usize = 32;
/// The longest member id in characters.
const MAX_MEMBER_CHARS: usize = MemberId::MAX_BYTES * 2;
/// The longest ticket as sent.
pub const MAX_TICKET_CHARS: usize = 1 + TAG_CHARS + MAX_MEMBER_CHARS;
/// Inputs of the tag up to this long are hashed in one `write` from a stack copy.
const SHORT_SIGNED_BYTES: usize = 64;
/// Member ids up to this long are compared by encoding them (longer ones by decoding the ticket's).
const SHORT_MEMBER_BYTES: usize = 32;

// SPEC 2.2: a ticket is at most 512 bytes.
const _: () = assert!(MAX_TICKET_CHARS <= 512);

/// Signs and checks tickets. Cheap to copy.
#[derive(Clone, Copy)]
pub struct TicketKey {
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketKey(hidden)")
    }
}

/// Why a ticket does not prove the member a request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketRefusal {
    /// Not a ticket this deployment signed: malformed, tampered with, or signed under another secret.
    Invalid,
    /// A genuine ticket, of another member or another queue.
    OtherMember,
}

impl TicketKey {
    /// The key derived from the token secret.
    #[must_use]
    pub fn derived_from(secret: &TokenSecret) -> TicketKey {
        let key = hmac_sha256(&secret.to_bytes(), TICKET_KEY_LABEL);
        let (k0, rest) = key.split_at(8);
        TicketKey {
            k0: u64::from_le_bytes(k0.try_into().expect("8 bytes")),
            k1: u64::from_le_bytes(rest[..8].try_into().expect("8 bytes")),
        }
    }

    /// The tag of `member` in `queue`, in hex.
    fn tag(&self, queue: &[u8], member: &[u8]) -> [u8; TAG_CHARS] {
        // Length-prefixed, so no queue/member split of the same bytes shares a tag (both lengths fit a
        // byte: QueueName and MemberId bound them). The hash reads a byte stream, so one `write` of a
        // short copy (the common case: each `write` costs a call into the hasher's buffering) and four of
        // the parts give the same tag.
        let mut hasher = SipHasher24::new_with_keys(self.k0, self.k1);
        let len = 3 + queue.len() + member.len();
        let mut short = [0u8; SHORT_SIGNED_BYTES];
        if len <= SHORT_SIGNED_BYTES {
            short[0] = VERSION;
            short[1] = queue.len() as u8;
            short[2..2 + queue.len()].copy_from_slice(queue);
            short[2 + queue.len()] = member.len() as u8;
            short[3 + queue.len()..len].copy_from_slice(member);
            std::hash::Hasher::write(&mut hasher, &short[..len]);
        } else {
            std::hash::Hasher::write(&mut hasher, &[VERSION, queue.len() as u8]);
            std::hash::Hasher::write(&mut hasher, queue);
            std::hash::Hasher::write(&mut hasher, &[member.len() as u8]);
            std::hash::Hasher::write(&mut hasher, member);
        }
        let mut hex_tag = [0u8; TAG_CHARS];
        hex::encode_to_slice(hasher.finish128().as_bytes(), &mut hex_tag).expect("32 digits for 16 bytes");
        hex_tag
    }

    /// The ticket of `member` in `queue`.
    #[must_use]
    pub fn issue(&self, queue: &QueueName, member: &MemberId) -> String {
        let tag = self.tag(queue.as_str().as_bytes(), member.as_str().as_bytes());
        let mut ticket = String::with_capacity(1 + TAG_CHARS + 2 * member.as_str().len());
        ticket.push(char::from(VERSION));
        ticket.push_str(std::str::from_utf8(&tag).expect("hex digits"));
        ticket.push_str(&hex::encode(member.as_str()));
        ticket
    }

    /// Whether `ticket` (as sent) proves `member` of `queue`. Compares in hex (lower case, as issued):
    /// encoding the expected tag and the request's short member id costs less than decoding the
    /// ticket's.
    pub fn check(&self, ticket: &[u8], queue: &str, member: &str) -> Result<(), TicketRefusal> {
        if ticket.len() <= 1 + TAG_CHARS
            || ticket.len() > MAX_TICKET_CHARS
            || ticket[0] != VERSION
            || member.len() > MemberId::MAX_BYTES
            || queue.len() > QueueName::MAX_BYTES
        {
            return Err(TicketRefusal::Invalid);
        }
        let (presented, member_text) = ticket[1..].split_at(TAG_CHARS);
        let names_this_member = member_text.len() == 2 * member.len() && {
            let mut encoded = [0u8; 2 * SHORT_MEMBER_BYTES];
            match encoded.get_mut(..member_text.len()) {
                Some(encoded) => {
                    hex::encode_to_slice(member, encoded).expect("twice the length");
                    member_text == encoded
                }
                None => hex::decode(member_text).is_ok_and(|named| named == member.as_bytes()),
            }
        };
        if names_this_member {
            return if self.genuine(presented, queue.as_bytes(), member.as_bytes()) {
                Ok(())
            } else {
                Err(TicketRefusal::Invalid)
            };
        }
        // Another member's genuine ticket is told apart from a forged one.
        let mut decoded = [0u8; MemberId::MAX_BYTES];
        let named = decoded
            .get_mut(..member_text.len() / 2)
            .ok_or(TicketRefusal::Invalid)?;
        hex::decode_to_slice(member_text, named).map_err(|_| TicketRefusal::Invalid)?;
        if self.genuine(presented, queue.as_bytes(), named) {
            Err(TicketRefusal::OtherMember)
        } else {
            Err(TicketRefusal::Invalid)
        }
    }

    /// Whether `presented` is the tag of `member` in `queue`, compared in constant time.
    fn genuine(&self, presented: &[u8], queue: &[u8], member: &[u8]) -> bool {
        let expected = self.tag(queue, member);
        let word = |digits: &[u8], i: usize| {
            u64::from_le_bytes(digits[8 * i..8 * i + 8].try_into().expect("8 bytes"))
        };
        let equal = (0..TAG_CHARS / 8)
            .map(|i| word(&expected, i).ct_eq(&word(presented, i)))
            .fold(subtle::Choice::from(1), |all, one| all & one);
        bool::from(equal)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn key(byte: u8) -> TicketKey {
        TicketKey::derived_from(&TokenSecret::from_bytes([byte; 32]))
    }

    fn check(key: TicketKey, ticket: &str, queue: &str, member: &str) -> Result<(), TicketRefusal> {
        key.check(ticket.as_bytes(), queue, member)
    }

    #[test]
    fn a_ticket_proves_its_member_of_its_queue_only() {
        let (queue, member) = (QueueName::parse("sale").unwrap(), MemberId::parse("m-1").unwrap());
        let ticket = key(1).issue(&queue, &member);
        assert!(ticket.len() <= 512);
        assert_eq!(check(key(1), &ticket, "sale", "m-1"), Ok(()));
        assert_eq!(
            check(key(1), &ticket, "sale", "m-2"),
            Err(TicketRefusal::OtherMember)
        );
        assert_eq!(
            check(key(1), &ticket, "other", "m-1"),
            Err(TicketRefusal::Invalid),
            "another queue's"
        );
        assert_eq!(
            check(key(2), &ticket, "sale", "m-1"),
            Err(TicketRefusal::Invalid),
            "foreign"
        );
        let too_long = "A".repeat(MAX_TICKET_CHARS + 1);
        for junk in [
            "",
            "x",
            "1",
            "!!!!",
            &too_long,
            &ticket[..ticket.len() - 1],
            &ticket[1..],
        ] {
            assert_eq!(
                check(key(1), junk, "sale", "m-1"),
                Err(TicketRefusal::Invalid),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn the_longest_ids_fit_the_bound() {
        let queue = QueueName::parse(&"q".repeat(QueueName::MAX_BYTES)).unwrap();
        let member = MemberId::parse(&"m".repeat(MemberId::MAX_BYTES)).unwrap();
        let ticket = key(1).issue(&queue, &member);
        assert_eq!(ticket.len(), MAX_TICKET_CHARS);
        assert_eq!(check(key(1), &ticket, queue.as_str(), member.as_str()), Ok(()));
    }

    proptest! {
        /// Any change to any character of a ticket makes it prove nobody: invalid (a change that spells
        /// another member's id does not carry that member's tag).
        #[test]
        fn a_tampered_ticket_proves_nobody(
            member in "\\PC{1,40}", at in any::<prop::sample::Index>(), replacement in "[0-9g-zG-Z!]",
        ) {
            let Ok(member_id) = MemberId::parse(&member) else { return Ok(()) };
            let queue = QueueName::parse("sale").unwrap();
            let ticket = key(3).issue(&queue, &member_id);
            let mut chars: Vec<char> = ticket.chars().collect();
            let i = at.index(chars.len());
            let replacement = replacement.chars().next().unwrap();
            prop_assume!(chars[i] != replacement);
            chars[i] = replacement;
            let tampered: String = chars.into_iter().collect();
            prop_assert_eq!(check(key(3), &tampered, "sale", &member), Err(TicketRefusal::Invalid));
        }

        /// Whatever the member id, its ticket proves it, and only it.
        #[test]
        fn every_member_s_ticket_proves_it(member in "\\PC{1,40}", other in "[a-z]{1,8}") {
            let (Ok(member_id), Ok(_)) = (MemberId::parse(&member), MemberId::parse(&other)) else {
                return Ok(());
            };
            let queue = QueueName::parse("sale").unwrap();
            let ticket = key(4).issue(&queue, &member_id);
            prop_assert!(ticket.len() <= MAX_TICKET_CHARS);
            prop_assert_eq!(check(key(4), &ticket, "sale", &member), Ok(()));
            if other != member {
                prop_assert_eq!(check(key(4), &ticket, "sale", &other), Err(TicketRefusal::OtherMember));
            }
        }
    }
}
