//! A hand-driven JSON writer for the hottest response bodies (the rank read, issue 10), byte for byte what
//! `serde_json::to_vec` writes for the same typed struct.
//!
//! Deriving `Serialize` costs a warm rank read about 4,500 instructions (a third of its handler), most of
//! it in serde's per-field dispatch and in escaping every key. Here keys are written as literals and
//! values through serde_json's own [`Formatter`] (numbers: the same `itoa` / `zmij` code serde_json
//! uses; non-finite floats as `null`, as serde_json does), so the bytes cannot drift from the derived
//! form. A string is copied as it is when nothing in it needs escaping (the identifiers and timestamps a
//! rank answer holds) and otherwise handed to serde_json, so escapes are serde_json's too.
//!
//! A body written this way keeps its `Serialize` struct as the definition, and a test compares the two
//! (see `rankings::reader`), so a field added to the struct and forgotten here fails that test.

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter as _};

/// The bytes serde_json escapes in a string: `"`, `\` and the control characters below 0x20, nothing
/// else. A table: one load per byte instead of three comparisons.
static NEEDS_ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = true;
        byte += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// Appends JSON to a byte buffer. Callers write the structure (`{`, keys, `,`) themselves; this writes
/// the values.
pub struct JsonWriter {
    out: Vec<u8>,
}

impl JsonWriter {
    /// A writer into a buffer of `capacity` bytes (about the body's size, so it is not regrown).
    pub fn with_capacity(capacity: usize) -> JsonWriter {
        JsonWriter {
            out: Vec::with_capacity(capacity),
        }
    }

    /// Appends `raw` as it is: a literal key and its punctuation, such as `,"total":`.
    pub fn raw(&mut self, raw: &str) {
        self.out.extend_from_slice(raw.as_bytes());
    }

    /// A JSON string, escaped exactly as serde_json escapes it.
    pub fn str(&mut self, value: &str) {
        if !value.bytes().any(|b| NEEDS_ESCAPE[usize::from(b)]) {
            self.out.push(b'"');
            self.out.extend_from_slice(value.as_bytes());
            self.out.push(b'"');
        } else {
            self.value(value);
        }
    }

    /// A string, or `null`.
    pub fn opt_str(&mut self, value: Option<&str>) {
        match value {
            Some(value) => self.str(value),
            None => self.raw("null"),
        }
    }

    /// A float as serde_json writes it: shortest round-trip digits, `null` when not finite.
    pub fn f64(&mut self, value: f64) {
        if value.is_finite() {
            // Writing into a Vec cannot fail.
            let _ = CompactFormatter.write_f64(&mut self.out, value);
        } else {
            self.raw("null");
        }
    }

    /// A float, or `null`.
    pub fn opt_f64(&mut self, value: Option<f64>) {
        match value {
            Some(value) => self.f64(value),
            None => self.raw("null"),
        }
    }

    /// An unsigned integer.
    pub fn u64(&mut self, value: u64) {
        let _ = CompactFormatter.write_u64(&mut self.out, value);
    }

    /// An unsigned integer, or `null`.
    pub fn opt_u64(&mut self, value: Option<u64>) {
        match value {
            Some(value) => self.u64(value),
            None => self.raw("null"),
        }
    }

    /// A signed integer.
    pub fn i64(&mut self, value: i64) {
        let _ = CompactFormatter.write_i64(&mut self.out, value);
    }

    /// `true` or `false`.
    pub fn bool(&mut self, value: bool) {
        self.raw(if value { "true" } else { "false" });
    }

    /// Any other value, through serde_json (a catalogue entry, an escaped string).
    pub fn value(&mut self, value: &(impl Serialize + ?Sized)) {
        serde_json::to_writer(&mut self.out, value).expect("response values serialize");
    }

    /// The bytes written.
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(write: impl FnOnce(&mut JsonWriter)) -> String {
        let mut writer = JsonWriter::with_capacity(0);
        write(&mut writer);
        String::from_utf8(writer.into_bytes().to_vec()).expect("UTF-8")
    }

    #[test]
    fn values_are_what_serde_json_writes() {
        for value in [
            0.0,
            -0.0,
            1.0,
            0.1,
            1e21,
            1e-7,
            504.098_543_822_473_35,
            f64::MAX,
            f64::MIN_POSITIVE,
        ] {
            assert_eq!(written(|w| w.f64(value)), serde_json::to_string(&value).unwrap());
        }
        for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(
                written(|w| w.f64(value)),
                "null",
                "serde_json writes non-finite floats as null"
            );
        }
        for value in [
            "",
            "p1",
            "a\"b",
            "back\\slash",
            "tab\there",
            "\u{1}",
            "\u{7f}",
            "é ☃ 🎉",
            "</script>",
        ] {
            assert_eq!(
                written(|w| w.str(value)),
                serde_json::to_string(value).unwrap(),
                "{value:?}"
            );
        }
        for value in [0, 1, u64::MAX] {
            assert_eq!(written(|w| w.u64(value)), serde_json::to_string(&value).unwrap());
        }
        for value in [i64::MIN, -1, 0, i64::MAX] {
            assert_eq!(written(|w| w.i64(value)), serde_json::to_string(&value).unwrap());
        }
    }
}
