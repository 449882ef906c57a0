//! How hard the embedded SQLite databases (`rankings.sqlite3`, `queue.sqlite3`) push a commit to disk.
//!
//! Both run in WAL mode. With `synchronous=NORMAL` a commit is written to the WAL but fsynced only at
//! checkpoints: it survives a process crash (SIGKILL), not a power loss or kernel panic, which may take
//! the last transactions with it. With `synchronous=FULL` every commit fsyncs the WAL before it returns,
//! so an acknowledged ingest batch, or a consumed entry token, survives a power loss too. The cost is
//! one fsync per commit, and rankgate commits groups (one per ingest batch, one per writer round of the
//! queue store), so it is paid per group, not per event; BENCHMARKS.md has the measured difference.

use std::fmt;
use std::str::FromStr;

/// The `synchronous` pragma of an embedded SQLite database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Fsync the WAL at every commit: an acknowledged write survives a power loss.
    #[default]
    Full,
    /// Fsync at checkpoints only: an acknowledged write survives a process crash, not a power loss.
    Normal,
}

impl Synchronous {
    /// The pragma value (`FULL` or `NORMAL`).
    #[must_use]
    pub fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }

    /// The value as written in the config (`full` or `normal`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Synchronous::Full => "full",
            Synchronous::Normal => "normal",
        }
    }

    /// Reads back what SQLite reports for `PRAGMA synchronous` (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA);
    /// `None` for a level rankgate never sets.
    #[must_use]
    pub fn from_pragma_level(level: i64) -> Option<Synchronous> {
        match level {
            1 => Some(Synchronous::Normal),
            2 => Some(Synchronous::Full),
            _ => None,
        }
    }

    /// Applies the pragma to `connection` and reads it back, so a value SQLite ignored is an error.
    pub(crate) fn apply(self, connection: &rusqlite::Connection) -> rusqlite::Result<Synchronous> {
        connection.pragma_update(None, "synchronous", self.pragma())?;
        let level: i64 = connection.pragma_query_value(None, "synchronous", |row| row.get(0))?;
        Synchronous::from_pragma_level(level).ok_or(rusqlite::Error::InvalidQuery)
    }
}

impl fmt::Display for Synchronous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `synchronous` value that is neither `full` nor `normal`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a synchronous mode: use \"full\" (survives power loss) or \"normal\" (survives a process crash)")]
pub struct InvalidSynchronous(pub String);

impl FromStr for Synchronous {
    type Err = InvalidSynchronous;

    fn from_str(raw: &str) -> Result<Synchronous, InvalidSynchronous> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(Synchronous::Full),
            "normal" => Ok(Synchronous::Normal),
            _ => Err(InvalidSynchronous(raw.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_modes_in_any_case_and_refuses_the_rest() {
        assert_eq!("full".parse(), Ok(Synchronous::Full));
        assert_eq!("NORMAL".parse(), Ok(Synchronous::Normal));
        for bad in ["off", "extra", "", "2", "fullish"] {
            let error = bad.parse::<Synchronous>().unwrap_err().to_string();
            assert!(
                error.contains("\"full\"") && error.contains("\"normal\""),
                "{error}"
            );
        }
    }
}
