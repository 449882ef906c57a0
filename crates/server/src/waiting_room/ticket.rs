//! Member tickets (SPEC 2.2, "Member identity" and "Places that survive the store"; issue 29): the
//! credential an entry answer hands a member, which every later call for that member must show
//! (`X-Queue-Ticket`), so that knowing or guessing a member id (shops use their user ids, often
//! sequential) buys nothing; and the member's claim to its place should the store lose the queue.
//!
//! A ticket is opaque to clients: the layout's version (`3` when the member id is written as it is, for
//! ids of unreserved URL characters only; `2` when it is written in hex), the 96-bit tag in hex (24
//! characters), the queue's epoch and the member's place (each a length code and its hex digits without
//! leading zeros, see [`push_number`]), then the member id: at most 1 + 24 + 34 + 256 = 315 characters
//! (SPEC: at most 512), typically 45 to 60. Every byte of it is read and hashed on every poll, so it is
//! kept short. The tag is
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
/// The layout version of a ticket whose member id is written in hex.
const VERSION_HEX: u8 = b'2';
/// The layout version of a ticket whose member id is written as it is: ids of unreserved URL characters
/// only (`A-Z a-z 0-9 - . _ ~`: user ids, rankgate's `v-…`), the common case. Half the length of hex, so
/// a poll's head is shorter, and checking it is a plain comparison.
const VERSION_RAW: u8 = b'3';
/// The tag's length in characters: 96 bits (12 bytes) in hex.
const TAG_CHARS: usize = 24;
/// Where the place text (after the tag) starts.
const PLACE_AT: usize = 1 + TAG_CHARS;
/// The longest place text: a length digit and up to 16 hex digits, for the epoch and for the place.
const MAX_PLACE_CHARS: usize = 2 * (1 + 16);
/// The longest member id in characters.
const MAX_MEMBER_CHARS: usize = MemberId::MAX_BYTES * 2;
/// The longest ticket as sent.
pub const MAX_TICKET_CHARS: usize = PLACE_AT + MAX_PLACE_CHARS + MAX_MEMBER_CHARS;
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
    fn tag(&self, version: u8, queue: &[u8], place: &[u8], member: &[u8]) -> [u8; TAG_CHARS] {
        // Length-prefixed, so no queue/member split of the same bytes shares a tag (both lengths fit a
        // byte: QueueName and MemberId bound them; the place digits have a fixed length). The hash reads a
        // byte stream, so one `write` of a short copy (the common case: each `write` costs a call into the
        // hasher's buffering) and one per part give the same tag.
        let mut hasher = SipHasher24::new_with_keys(self.k0, self.k1);
        let len = 3 + queue.len() + place.len() + member.len();
        let mut short = [0u8; SHORT_SIGNED_BYTES];
        if len <= SHORT_SIGNED_BYTES {
            short[0] = version;
            short[1] = queue.len() as u8;
            let mut at = 2;
            for part in [queue, place, &[member.len() as u8][..], member] {
                short[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            std::hash::Hasher::write(&mut hasher, &short[..len]);
        } else {
            std::hash::Hasher::write(&mut hasher, &[version, queue.len() as u8]);
            std::hash::Hasher::write(&mut hasher, queue);
            std::hash::Hasher::write(&mut hasher, place);
            std::hash::Hasher::write(&mut hasher, &[member.len() as u8]);
            std::hash::Hasher::write(&mut hasher, member);
        }
        // SipHash-2-4-128 cut to 96 bits: as strong as any forgery needs through an HTTP endpoint (2^96
        // guesses), eight characters fewer in every poll's head.
        let tag = hasher.finish128();
        let mut hex_tag = [0u8; TAG_CHARS];
        hex_tag[..16].copy_from_slice(&hex_of_u64(tag.h1));
        hex_tag[16..].copy_from_slice(&hex_of_u64(tag.h2)[..8]);
        hex_tag
    }

    /// The ticket of `member` in `queue`, naming its `placement` (`None`: no place to come back to).
    #[must_use]
    pub fn issue(&self, queue: &QueueName, member: &MemberId, placement: Option<Placement>) -> String {
        let (epoch, place) = placement.map_or((NO_PLACE_EPOCH, 0), |p| (p.epoch, p.place));
        let mut place_text = [0u8; MAX_PLACE_CHARS];
        let mut at = push_number(&mut place_text, 0, epoch, b'0');
        at = if place >= 0 {
            push_number(&mut place_text, at, place as u64, b'g')
        } else {
            push_number(&mut place_text, at, (place as u64).wrapping_neg(), b'G')
        };
        let place_digits = &place_text[..at];
        let member = member.as_str();
        let version = if is_unreserved(member.as_bytes()) {
            VERSION_RAW
        } else {
            VERSION_HEX
        };
        let tag = self.tag(
            version,
            queue.as_str().as_bytes(),
            place_digits,
            member.as_bytes(),
        );
        let mut ticket = String::with_capacity(PLACE_AT + place_digits.len() + 2 * member.len());
        ticket.push(char::from(version));
        ticket.push_str(std::str::from_utf8(&tag).expect("hex digits"));
        ticket.push_str(std::str::from_utf8(place_digits).expect("hex digits"));
        if version == VERSION_RAW {
            ticket.push_str(member);
        } else {
            ticket.push_str(&hex::encode(member));
        }
        ticket
    }

    /// The place a ticket names, once [`TicketKey::check`] accepted it; `None` when its entry answered
    /// no place.
    #[must_use]
    pub fn placement(ticket: &[u8]) -> Option<Placement> {
        let end = place_end(ticket)?;
        let text = &ticket[PLACE_AT..end];
        let epoch_end = 2 + usize::from(length_code(text[0], b'0')?);
        let epoch = read_hex(&text[1..epoch_end])?;
        let place = read_hex(&text[epoch_end + 1..])?;
        let place = match text[epoch_end] {
            b'g'..=b'v' => i64::try_from(place).ok()?,
            _ => (place.wrapping_neg()) as i64,
        };
        (epoch != NO_PLACE_EPOCH).then_some(Placement { epoch, place })
    }

    /// Whether `ticket` (as sent) proves `member` of `queue`. Compares in hex (lower case, as issued):
    /// encoding the expected tag and the request's short member id costs less than decoding the
    /// ticket's.
    pub fn check(&self, ticket: &[u8], queue: &str, member: &str) -> Result<(), TicketRefusal> {
        if ticket.len() > MAX_TICKET_CHARS
            || member.len() > MemberId::MAX_BYTES
            || queue.len() > QueueName::MAX_BYTES
        {
            return Err(TicketRefusal::Invalid);
        }
        let Some(member_at) = place_end(ticket) else {
            return Err(TicketRefusal::Invalid);
        };
        let version = ticket[0];
        let presented = &ticket[1..PLACE_AT];
        let (place, member_text) = (&ticket[PLACE_AT..member_at], &ticket[member_at..]);
        if member_text.is_empty() {
            return Err(TicketRefusal::Invalid);
        }
        let names_this_member = match version {
            VERSION_RAW => member_text == member.as_bytes(),
            VERSION_HEX => {
                member_text.len() == 2 * member.len() && {
                    let mut encoded = [0u8; 2 * SHORT_MEMBER_BYTES];
                    match encoded.get_mut(..member_text.len()) {
                        Some(encoded) => {
                            hex::encode_to_slice(member, encoded).expect("twice the length");
                            member_text == encoded
                        }
                        None => hex::decode(member_text).is_ok_and(|named| named == member.as_bytes()),
                    }
                }
            }
            _ => return Err(TicketRefusal::Invalid),
        };
        if names_this_member {
            return if self.genuine(version, presented, queue.as_bytes(), place, member.as_bytes()) {
                Ok(())
            } else {
                Err(TicketRefusal::Invalid)
            };
        }
        // Another member's genuine ticket is told apart from a forged one.
        let mut decoded = [0u8; MemberId::MAX_BYTES];
        let named: &[u8] = if version == VERSION_RAW {
            member_text
        } else {
            let named = decoded
                .get_mut(..member_text.len() / 2)
                .ok_or(TicketRefusal::Invalid)?;
            hex::decode_to_slice(member_text, named).map_err(|_| TicketRefusal::Invalid)?;
            named
        };
        if named.len() <= MemberId::MAX_BYTES
            && self.genuine(version, presented, queue.as_bytes(), place, named)
        {
            Err(TicketRefusal::OtherMember)
        } else {
            Err(TicketRefusal::Invalid)
        }
    }

    /// Whether `presented` is the tag of `member` in `queue`, compared in constant time.
    fn genuine(&self, version: u8, presented: &[u8], queue: &[u8], place: &[u8], member: &[u8]) -> bool {
        let expected = self.tag(version, queue, place, member);
        let word = |digits: &[u8], i: usize| {
            u64::from_le_bytes(digits[8 * i..8 * i + 8].try_into().expect("8 bytes"))
        };
        let equal = (0..TAG_CHARS / 8)
            .map(|i| word(&expected, i).ct_eq(&word(presented, i)))
            .fold(subtle::Choice::from(1), |all, one| all & one);
        bool::from(equal)
    }
}

/// Writes `value` in hex without leading zeros (at least one digit) after a length code, `base` plus
/// the digit count less one, at `at` in `out`; returns where the text ends. The codes tell the reader
/// where the number ends: `0`–`f` for the epoch, `g`–`v` for a place at or above zero, `G`–`V` for a
/// place below zero (its magnitude follows).
fn push_number(out: &mut [u8; MAX_PLACE_CHARS], at: usize, value: u64, base: u8) -> usize {
    let digits = hex_of_u64(value);
    let skip = (value.leading_zeros() / 4).min(15) as usize;
    let count = 16 - skip;
    out[at] = if base == b'0' {
        b"0123456789abcdef"[count - 1]
    } else {
        base + (count as u8 - 1)
    };
    out[at + 1..at + 1 + count].copy_from_slice(&digits[skip..]);
    at + 1 + count
}

/// The digit count less one that a length code written with `base` names.
fn length_code(code: u8, base: u8) -> Option<u8> {
    let count = if base == b'0' {
        (code as char).to_digit(16)? as u8
    } else {
        code.checked_sub(base).filter(|n| *n < 16)?
    };
    Some(count)
}

/// Where `ticket`'s place text ends (its member starts), if the length codes are well formed.
fn place_end(ticket: &[u8]) -> Option<usize> {
    let epoch_code = *ticket.get(PLACE_AT)?;
    let place_code_at = PLACE_AT + 2 + usize::from(length_code(epoch_code, b'0')?);
    let place_code = *ticket.get(place_code_at)?;
    let place_digits = match place_code {
        b'g'..=b'v' => place_code - b'g',
        b'G'..=b'V' => place_code - b'G',
        _ => return None,
    };
    let end = place_code_at + 2 + usize::from(place_digits);
    (end <= ticket.len()).then_some(end)
}

/// The value of 1 to 16 lower-case hex digits.
fn read_hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |value, digit| {
        let nibble = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => return None,
        };
        Some(value << 4 | u64::from(nibble))
    })
}

/// Whether every byte of `member` is an unreserved URL character (RFC 3986: `A-Z a-z 0-9 - . _ ~`),
/// so the ticket can carry the id as it is.
fn is_unreserved(member: &[u8]) -> bool {
    member
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// The 16 lower-case hex digits of `word`, most significant first, eight nibbles at a time in a
/// register: about a tenth of the `hex` crate's table walk on 16 bytes, and this runs on every poll.
fn hex_of_u64(word: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&hex_of_u32((word >> 32) as u32));
    out[8..].copy_from_slice(&hex_of_u32(word as u32));
    out
}

/// The 8 lower-case hex digits of `half`, most significant first.
fn hex_of_u32(half: u32) -> [u8; 8] {
    // One nibble per byte, the least significant nibble in the lowest byte.
    let mut x = u64::from(half);
    x = ((x & 0xFFFF_0000) << 16) | (x & 0x0000_FFFF);
    x = ((x & 0x0000_FF00_0000_FF00) << 8) | (x & 0x0000_00FF_0000_00FF);
    x = ((x & 0x00F0_00F0_00F0_00F0) << 4) | (x & 0x000F_000F_000F_000F);
    // Digits above 9 get the 39 that takes `'0' + d` to `'a' + d - 10`; no byte carries into the next.
    let letters = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    (x + 0x3030_3030_3030_3030 + letters * 39).to_be_bytes()
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
    fn register_hex_is_the_hex_crate_s() {
        for word in [
            0,
            1,
            0x0123_4567_89ab_cdef,
            u64::MAX,
            0xfedc_ba98_7654_3210,
            0x9a9a_0000_ffff_1010,
        ] {
            assert_eq!(
                hex_of_u64(word).as_slice(),
                hex::encode(word.to_be_bytes()).as_bytes()
            );
        }
    }

    #[test]
    fn ids_of_unreserved_characters_are_written_as_they_are() {
        let queue = QueueName::parse("sale").unwrap();
        let placement = Some(Placement { epoch: 3, place: 1 });
        let plain = key(1).issue(&queue, &MemberId::parse("v-0a1B_.~").unwrap(), placement);
        assert!(plain.starts_with('3') && plain.ends_with("v-0a1B_.~"), "{plain}");
        assert_eq!(check(key(1), &plain, "sale", "v-0a1B_.~"), Ok(()));
        assert_eq!(
            check(key(1), &plain, "sale", "v-0a1B_.x"),
            Err(TicketRefusal::OtherMember)
        );
        let spaced = key(1).issue(&queue, &MemberId::parse("a b").unwrap(), placement);
        assert!(spaced.starts_with('2') && spaced.ends_with("612062"), "{spaced}");
        assert_eq!(check(key(1), &spaced, "sale", "a b"), Ok(()));
        // The same id written the other way is not a ticket this key issued.
        let mut other_way = spaced.clone();
        other_way.replace_range(..1, "3");
        assert_eq!(
            check(key(1), &other_way, "sale", "a b"),
            Err(TicketRefusal::Invalid)
        );
    }

    #[test]
    fn the_longest_ids_fit_the_bound() {
        let queue = QueueName::parse(&"q".repeat(QueueName::MAX_BYTES)).unwrap();
        let member = MemberId::parse(&"é".repeat(MemberId::MAX_BYTES / 2)).unwrap();
        let ticket = key(1).issue(
            &queue,
            &member,
            Some(Placement {
                epoch: u64::MAX - 1,
                place: i64::MIN,
            }),
        );
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
