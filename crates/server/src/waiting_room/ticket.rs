//! Member tickets (SPEC 2.2, "Member identity" and "Places that survive the store"; issue 29): the
//! credential an entry answer hands a member, which every later call for that member must show
//! (`X-Queue-Ticket`), so that knowing or guessing a member id (shops use their user ids, often
//! sequential) buys nothing; and the member's claim to its place should the store lose the queue.
//!
//! A ticket is opaque to clients: `2` (the layout's version), the 128-bit tag in hex (32 characters), the
//! queue's epoch (16 hex digits), the member's place (16 hex digits: an `i64` as two's complement), then
//! the member id in hex: at most 1 + 32 + 32 + 256 = 321 characters (SPEC: at most 512). The tag is
//! SipHash-2-4 with a 128-bit output over the version, the queue (length-prefixed), the epoch and place
//! digits as written, and the member (length-prefixed), keyed with 128 bits derived from the token secret
//! (HMAC-SHA-256 of the secret with [`TICKET_KEY_LABEL`]), so every instance sharing the secret checks
//! every other's tickets and the token key itself never signs one. The queue is not written in the
//! ticket: it comes from the request, so a ticket of another queue does not verify. Changing any digit
//! of the epoch or the place breaks the tag like any other change: a member cannot move its own place.
//!
//! Chosen for the check's cost, which every poll pays (issue 29: at most a tenth of a poll's
//! instructions). SipHash rather than HMAC-SHA-256: HMAC-SHA-256 in software costs about 4,600
//! instructions per check, more than a third of a whole embedded poll; SipHash is a keyed pseudo-random
//! function made for short inputs, and forging a ticket means guessing a 128-bit tag under a 128-bit key.
//! Hex rather than base64: the `base64` crate's setup costs more than the conversion itself on inputs this
//! short (about 350 instructions for a 22-character tag). The check signs the epoch and place digits as
//! they are written, so it decodes neither; it allocates nothing for member ids up to 32 bytes: it
//! encodes the request's member and compares in hex, decoding the ticket's member only to tell another
//! member's genuine ticket (403) from a forged one (401).

use rankgate_core::ids::MemberId;
use rankgate_core::queue::QueueName;
use rankgate_store::queue::token::{hmac_sha256, TokenSecret};
use rankgate_store::queue::Placement;
use siphasher::sip128::{Hasher128 as _, SipHasher24};
use subtle::ConstantTimeEq as _;

/// What the ticket key is derived for.
pub const TICKET_KEY_LABEL: &[u8] = b"rankgate member ticket v1";
/// The layout version this code writes and reads.
const VERSION: u8 = b'2';
/// The tag's length in characters (16 bytes in hex).
const TAG_CHARS: usize = 32;
/// The epoch's and the place's digits (8 bytes each, in hex).
const PLACE_CHARS: usize = 32;
/// Where the signed text after the tag starts.
const PLACE_AT: usize = 1 + TAG_CHARS;
/// Where the member's digits start.
const MEMBER_AT: usize = PLACE_AT + PLACE_CHARS;
/// The longest member id in characters.
const MAX_MEMBER_CHARS: usize = MemberId::MAX_BYTES * 2;
/// The longest ticket as sent.
pub const MAX_TICKET_CHARS: usize = MEMBER_AT + MAX_MEMBER_CHARS;
/// Inputs of the tag up to this long are hashed in one `write` from a stack copy.
const SHORT_SIGNED_BYTES: usize = 112;
/// The epoch a ticket names when its entry answered no place (nothing to come back to).
const NO_PLACE_EPOCH: u64 = u64::MAX;
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

    /// The tag of `member` in `queue` at `place` (the epoch and place digits as written), in hex.
    fn tag(&self, queue: &[u8], place: &[u8], member: &[u8]) -> [u8; TAG_CHARS] {
        // Length-prefixed, so no queue/member split of the same bytes shares a tag (both lengths fit a
        // byte: QueueName and MemberId bound them; the place digits have a fixed length). The hash reads a
        // byte stream, so one `write` of a short copy (the common case: each `write` costs a call into the
        // hasher's buffering) and one per part give the same tag.
        let mut hasher = SipHasher24::new_with_keys(self.k0, self.k1);
        let len = 3 + queue.len() + place.len() + member.len();
        let mut short = [0u8; SHORT_SIGNED_BYTES];
        if len <= SHORT_SIGNED_BYTES {
            short[0] = VERSION;
            short[1] = queue.len() as u8;
            let mut at = 2;
            for part in [queue, place, &[member.len() as u8][..], member] {
                short[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            std::hash::Hasher::write(&mut hasher, &short[..len]);
        } else {
            std::hash::Hasher::write(&mut hasher, &[VERSION, queue.len() as u8]);
            std::hash::Hasher::write(&mut hasher, queue);
            std::hash::Hasher::write(&mut hasher, place);
            std::hash::Hasher::write(&mut hasher, &[member.len() as u8]);
            std::hash::Hasher::write(&mut hasher, member);
        }
        let mut hex_tag = [0u8; TAG_CHARS];
        hex::encode_to_slice(hasher.finish128().as_bytes(), &mut hex_tag).expect("32 digits for 16 bytes");
        hex_tag
    }

    /// The ticket of `member` in `queue`, naming its `placement` (`None`: no place to come back to).
    #[must_use]
    pub fn issue(&self, queue: &QueueName, member: &MemberId, placement: Option<Placement>) -> String {
        let (epoch, place) = placement.map_or((NO_PLACE_EPOCH, 0), |p| (p.epoch, p.place));
        let mut place_digits = [0u8; PLACE_CHARS];
        hex::encode_to_slice(epoch.to_be_bytes(), &mut place_digits[..16]).expect("16 digits");
        hex::encode_to_slice(place.to_be_bytes(), &mut place_digits[16..]).expect("16 digits");
        let tag = self.tag(queue.as_str().as_bytes(), &place_digits, member.as_str().as_bytes());
        let mut ticket = String::with_capacity(MEMBER_AT + 2 * member.as_str().len());
        ticket.push(char::from(VERSION));
        ticket.push_str(std::str::from_utf8(&tag).expect("hex digits"));
        ticket.push_str(std::str::from_utf8(&place_digits).expect("hex digits"));
        ticket.push_str(&hex::encode(member.as_str()));
        ticket
    }

    /// The place a ticket names, once [`TicketKey::check`] accepted it; `None` when its entry answered
    /// no place.
    #[must_use]
    pub fn placement(ticket: &[u8]) -> Option<Placement> {
        let digits = ticket.get(PLACE_AT..MEMBER_AT)?;
        let mut bytes = [0u8; 16];
        hex::decode_to_slice(digits, &mut bytes).ok()?;
        let epoch = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
        let place = i64::from_be_bytes(bytes[8..].try_into().expect("8 bytes"));
        (epoch != NO_PLACE_EPOCH).then_some(Placement { epoch, place })
    }

    /// Whether `ticket` (as sent) proves `member` of `queue`. Compares in hex (lower case, as issued):
    /// encoding the expected tag and the request's short member id costs less than decoding the
    /// ticket's.
    pub fn check(&self, ticket: &[u8], queue: &str, member: &str) -> Result<(), TicketRefusal> {
        if ticket.len() <= MEMBER_AT
            || ticket.len() > MAX_TICKET_CHARS
            || ticket[0] != VERSION
            || member.len() > MemberId::MAX_BYTES
            || queue.len() > QueueName::MAX_BYTES
        {
            return Err(TicketRefusal::Invalid);
        }
        let presented = &ticket[1..PLACE_AT];
        let (place, member_text) = ticket[PLACE_AT..].split_at(PLACE_CHARS);
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
            return if self.genuine(presented, queue.as_bytes(), place, member.as_bytes()) {
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
        if self.genuine(presented, queue.as_bytes(), place, named) {
            Err(TicketRefusal::OtherMember)
        } else {
            Err(TicketRefusal::Invalid)
        }
    }

    /// Whether `presented` is the tag of `member` in `queue`, compared in constant time.
    fn genuine(&self, presented: &[u8], queue: &[u8], place: &[u8], member: &[u8]) -> bool {
        let expected = self.tag(queue, place, member);
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
        let placement = Placement { epoch: 42, place: 7 };
        let ticket = key(1).issue(&queue, &member, Some(placement));
        assert!(ticket.len() <= 512);
        assert_eq!(TicketKey::placement(ticket.as_bytes()), Some(placement));
        let placeless = key(1).issue(&queue, &member, None);
        assert_eq!(TicketKey::placement(placeless.as_bytes()), None);
        assert_eq!(check(key(1), &placeless, "sale", "m-1"), Ok(()));
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
        let ticket = key(1).issue(&queue, &member, Some(Placement { epoch: u64::MAX - 1, place: i64::MIN }));
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
            let ticket = key(3).issue(&queue, &member_id, Some(Placement { epoch: 5, place: -3 }));
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
            let ticket = key(4).issue(&queue, &member_id, Some(Placement { epoch: 1, place: 99 }));
            prop_assert!(ticket.len() <= MAX_TICKET_CHARS);
            prop_assert_eq!(check(key(4), &ticket, "sale", &member), Ok(()));
            if other != member {
                prop_assert_eq!(check(key(4), &ticket, "sale", &other), Err(TicketRefusal::OtherMember));
            }
        }
    }
}
