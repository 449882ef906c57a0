//! [`QueueName`]: the parsed name of a waiting-room queue.
//!
//! Queue names appear in URL paths and in Redis keys inside a hash tag (`{rg:q:<queue>}`), so they are limited
//! to characters that need no escaping in either place and can never contain a brace.

use std::fmt;

/// Why a raw string is not a valid queue name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueNameError {
    /// Empty or longer than [`QueueName::MAX_BYTES`].
    #[error("must be 1 to 64 bytes")]
    Length,
    /// Contains something other than ASCII letters, digits, `-`, `_`, `.` or `:`.
    #[error("may only contain ASCII letters, digits, '-', '_', '.' and ':'")]
    Character,
}

/// A queue's name: 1–64 bytes of ASCII letters, digits, `-`, `_`, `.` and `:`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueName(Box<str>);

impl QueueName {
    /// The longest queue name, in bytes.
    pub const MAX_BYTES: usize = 64;

    /// Parses a queue name.
    pub fn parse(raw: &str) -> Result<QueueName, QueueNameError> {
        if raw.is_empty() || raw.len() > Self::MAX_BYTES {
            return Err(QueueNameError::Length);
        }
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':');
        if !raw.bytes().all(allowed) {
            return Err(QueueNameError::Character);
        }
        Ok(QueueName(raw.into()))
    }

    /// The name as parsed.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QueueName({:?})", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_short_and_key_safe() {
        assert_eq!(
            QueueName::parse("sale-2026.summer:1").unwrap().as_str(),
            "sale-2026.summer:1"
        );
        assert_eq!(QueueName::parse(""), Err(QueueNameError::Length));
        assert_eq!(QueueName::parse(&"q".repeat(65)), Err(QueueNameError::Length));
        assert_eq!(QueueName::parse("a{b}"), Err(QueueNameError::Character));
        assert_eq!(QueueName::parse("a/b"), Err(QueueNameError::Character));
    }
}
