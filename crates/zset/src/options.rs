//! Options of `ZADD` and `ZUNIONSTORE`.

use crate::ZsetError;

/// The flags of `ZADD`. `Default` is a plain `ZADD`: add new members, update existing ones.
#[derive(Debug, Clone, Copy, Default)]
pub struct AddOptions {
    /// Only add new members; never update an existing one.
    pub nx: bool,
    /// Only update existing members; never add a new one.
    pub xx: bool,
    /// Only update an existing member when the new score is greater. New members are still added.
    pub gt: bool,
    /// Only update an existing member when the new score is less. New members are still added.
    pub lt: bool,
    /// Count changed members as well as added ones in the return value.
    pub ch: bool,
}

impl AddOptions {
    /// Refuses the combinations Redis refuses, with Redis's reasons, before any score is looked at.
    pub(crate) fn check_compatible(&self) -> Result<(), ZsetError> {
        if self.nx && self.xx {
            return Err(ZsetError::IncompatibleOptions(
                "xx and nx options at the same time are not compatible",
            ));
        }
        if (self.gt && self.lt) || (self.nx && (self.gt || self.lt)) {
            return Err(ZsetError::IncompatibleOptions(
                "gt, lt, and/or nx options at the same time are not compatible",
            ));
        }
        Ok(())
    }
}

/// How `ZUNIONSTORE` combines the weighted scores of a member found in several sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// Add them up. `+inf + -inf` gives 0, as in Redis.
    Sum,
    /// Keep the smallest.
    Min,
    /// Keep the largest.
    Max,
}

impl Aggregate {
    /// Folds `value` into `accumulated` exactly as Redis's `zunionInterAggregate` does.
    pub(crate) fn fold(self, accumulated: &mut f64, value: f64) {
        match self {
            Aggregate::Sum => {
                *accumulated += value;
                // Redis's convention: the NaN of +inf + -inf becomes 0.
                if accumulated.is_nan() {
                    *accumulated = 0.0;
                }
            }
            Aggregate::Min => {
                if value < *accumulated {
                    *accumulated = value;
                }
            }
            Aggregate::Max => {
                if value > *accumulated {
                    *accumulated = value;
                }
            }
        }
    }
}
