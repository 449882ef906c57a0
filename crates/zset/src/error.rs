//! The one error type of the crate.
//!
//! Messages are lowercase and close to what Redis replies, so a server can pass them through.

use std::fmt;

/// Why a sorted-set command was refused. A refused command never changes the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZsetError {
    /// A score, bound or increment result is NaN, or a bound is not a float at all.
    NotANumber,
    /// `ZADD` options that Redis refuses together (NX with XX, or GT/LT with NX, or GT with LT).
    /// The text is the reason, e.g. `"xx and nx options at the same time are not compatible"`.
    IncompatibleOptions(&'static str),
}

impl fmt::Display for ZsetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZsetError::NotANumber => f.write_str("score is not a valid float (nan or unparsable)"),
            ZsetError::IncompatibleOptions(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for ZsetError {}
