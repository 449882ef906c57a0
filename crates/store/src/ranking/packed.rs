//! How one packed raw-log row holds the ids and bodies of many events: the encoding behind the SQLite
//! `event_log` table (one row per (batch, hour), see [`super::sqlite`]).
//!
//! Rows are marked with a [`RowFormat`] in their `format` column:
//! - [`RowFormat::LengthPrefixed`] (written today): each entry is its byte length as an unsigned LEB128
//!   varint, then its bytes. Nothing an id or a body holds can move an entry boundary, and a 20-byte id
//!   costs one length byte.
//! - [`RowFormat::NewlineJoined`] (rows written before, `format` 0): entries joined by `\n`. That was
//!   sound for bodies (canonical JSON escapes every control character) but not for ids, which could hold
//!   a newline before SPEC 1.1 refused control characters: `"a\nb"` read back as two ids, `"x\n"` as an
//!   empty one. Such a row is still read exactly: its ids are the `\n`-split pieces when there are as
//!   many pieces as bodies (no id held a newline), and are otherwise read from the bodies' `id` fields.
//!
//! An id read from an old row that today's rules refuse (a control character) is skipped by the
//! callers: no event can carry it any more, so it needs no dedupe.

use std::borrow::Cow;

/// The `format` column of a packed row.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RowFormat {
    /// `format` 0: entries joined by `\n` (rows written before the length-prefixed format).
    NewlineJoined,
    /// `format` 1: each entry is a LEB128 varint byte length, then the bytes.
    LengthPrefixed,
}

impl RowFormat {
    /// Reads a stored `format` value.
    pub fn from_column(value: i64) -> Result<RowFormat, String> {
        match value {
            0 => Ok(RowFormat::NewlineJoined),
            1 => Ok(RowFormat::LengthPrefixed),
            other => Err(format!("unknown packed row format {other}")),
        }
    }

    /// The stored `format` value.
    #[must_use]
    pub fn column(self) -> i64 {
        match self {
            RowFormat::NewlineJoined => 0,
            RowFormat::LengthPrefixed => 1,
        }
    }
}

/// Appends one [`RowFormat::LengthPrefixed`] entry to `packed`.
pub fn push_entry(packed: &mut Vec<u8>, entry: &[u8]) {
    let mut length = entry.len() as u64;
    loop {
        let low = (length & 0x7f) as u8;
        length >>= 7;
        if length == 0 {
            packed.push(low);
            break;
        }
        packed.push(low | 0x80);
    }
    packed.extend_from_slice(entry);
}

/// The entries of a [`RowFormat::LengthPrefixed`] value, in order.
pub fn length_prefixed_entries(packed: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut entries = Vec::new();
    let mut at = 0;
    while at < packed.len() {
        let mut length: u64 = 0;
        let mut shift = 0;
        loop {
            let byte = *packed
                .get(at)
                .ok_or_else(|| format!("a length is cut off at byte {at}"))?;
            at += 1;
            if shift > 56 {
                return Err(format!("a length longer than 64 bits ends at byte {at}"));
            }
            length |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
        let end = usize::try_from(length)
            .ok()
            .and_then(|length| at.checked_add(length))
            .filter(|&end| end <= packed.len())
            .ok_or_else(|| format!("an entry of {length} bytes at byte {at} runs past the end"))?;
        entries.push(&packed[at..end]);
        at = end;
    }
    Ok(entries)
}

/// The bodies of a packed row, in commit order.
pub fn bodies(format: RowFormat, packed: &[u8]) -> Result<Vec<&[u8]>, String> {
    match format {
        RowFormat::LengthPrefixed => length_prefixed_entries(packed),
        // Canonical JSON bodies never hold a raw newline, so this split is exact.
        RowFormat::NewlineJoined => Ok(packed.split(|&byte| byte == b'\n').collect()),
    }
}

/// The ids of a packed row, in commit order. A [`RowFormat::NewlineJoined`] row needs its `bodies` too,
/// in case one of its ids held a newline (see the module doc); a length-prefixed row ignores them.
pub fn ids<'a>(format: RowFormat, ids: &'a [u8], bodies: Option<&[u8]>) -> Result<Vec<Cow<'a, str>>, String> {
    let text = |bytes: &'a [u8]| {
        std::str::from_utf8(bytes)
            .map(Cow::Borrowed)
            .map_err(|error| format!("an id is not UTF-8: {error}"))
    };
    match format {
        RowFormat::LengthPrefixed => length_prefixed_entries(ids)?.into_iter().map(text).collect(),
        RowFormat::NewlineJoined => {
            let pieces: Vec<&[u8]> = ids.split(|&byte| byte == b'\n').collect();
            let bodies = bodies.ok_or("an old newline-joined row was read without its bodies")?;
            let bodies: Vec<&[u8]> = bodies.split(|&byte| byte == b'\n').collect();
            if pieces.len() == bodies.len() {
                return pieces.into_iter().map(text).collect();
            }
            // Some id held a newline, so the pieces do not line up: every body names its own id.
            #[derive(serde::Deserialize)]
            struct IdOnly {
                id: String,
            }
            bodies
                .into_iter()
                .map(|body| {
                    serde_json::from_slice::<IdOnly>(body)
                        .map(|parsed| Cow::Owned(parsed.id))
                        .map_err(|error| format!("a stored body has no readable id: {error}"))
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefixed_entries_round_trip_whatever_they_hold() {
        let entries: Vec<Vec<u8>> = vec![
            b"a\nb".to_vec(),
            Vec::new(),
            b"x\n".to_vec(),
            vec![0xff; 127],
            vec![b'z'; 128],
            vec![7; 70_000],
        ];
        let mut packed = Vec::new();
        for entry in &entries {
            push_entry(&mut packed, entry);
        }
        let read = length_prefixed_entries(&packed).unwrap();
        assert_eq!(read, entries.iter().map(Vec::as_slice).collect::<Vec<_>>());
        // 127 bytes take one length byte, 128 take two.
        let mut one = Vec::new();
        push_entry(&mut one, &[0; 127]);
        assert_eq!(one.len(), 128);
        let mut two = Vec::new();
        push_entry(&mut two, &[0; 128]);
        assert_eq!(two.len(), 130);
    }

    #[test]
    fn a_cut_or_overlong_length_prefixed_value_is_an_error() {
        assert!(length_prefixed_entries(&[5, b'a']).is_err());
        assert!(length_prefixed_entries(&[0x80]).is_err());
        assert!(length_prefixed_entries(&[0xff; 12]).is_err());
    }

    #[test]
    fn newline_joined_ids_are_split_or_read_from_the_bodies() {
        let bodies = br#"{"id":"a"}
{"id":"b"}"#;
        let read = ids(RowFormat::NewlineJoined, b"a\nb", Some(bodies)).unwrap();
        assert_eq!(read, ["a", "b"]);
        // An id that held a newline: "a\nb" and "c" make three pieces for two bodies.
        let hostile = br#"{"id":"a\nb"}
{"id":"c"}"#;
        let read = ids(RowFormat::NewlineJoined, b"a\nb\nc", Some(hostile)).unwrap();
        assert_eq!(read, ["a\nb", "c"]);
        assert_eq!(
            ids(RowFormat::NewlineJoined, b"x\n", Some(br#"{"id":"x\n"}"#)).unwrap(),
            ["x\n"]
        );
    }
}
