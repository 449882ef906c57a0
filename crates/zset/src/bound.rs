//! Score bounds for `ZCOUNT`, `ZRANGE … BYSCORE` and `ZREMRANGEBYSCORE`.

use crate::ZsetError;

/// One end of a score interval, as Redis writes it: `1.5` is inclusive, `(1.5` is exclusive.
///
/// An unbounded end is `Inclusive(f64::NEG_INFINITY)` or `Inclusive(f64::INFINITY)`. A bound holding NaN
/// matches nothing; [`ScoreBound::parse`] never produces one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScoreBound {
    /// Scores equal to the value are inside the interval.
    Inclusive(f64),
    /// Scores equal to the value are outside the interval.
    Exclusive(f64),
}

impl ScoreBound {
    /// Parses Redis bound syntax: `"1.5"`, `"(1.5"`, `"-inf"`, `"+inf"`, `"inf"`, `"(-inf"`.
    ///
    /// Numbers use Rust's float grammar, which also takes `"1e3"`, `".5"`, `"infinity"` (any case), and
    /// rounds overflow such as `"1e400"` to infinity like Redis does. Redis reads bounds with C `strtod`;
    /// its quirks are refused here on purpose: an empty string or a bare `"("` (Redis reads 0), leading
    /// whitespace, and hex floats are [`ZsetError::NotANumber`], as is NaN.
    pub fn parse(text: &str) -> Result<ScoreBound, ZsetError> {
        let (number, exclusive) = match text.strip_prefix('(') {
            Some(rest) => (rest, true),
            None => (text, false),
        };
        let value: f64 = number.parse().map_err(|_| ZsetError::NotANumber)?;
        if value.is_nan() {
            return Err(ZsetError::NotANumber);
        }
        Ok(if exclusive {
            ScoreBound::Exclusive(value)
        } else {
            ScoreBound::Inclusive(value)
        })
    }

    /// The number of the bound, whichever kind it is.
    pub(crate) fn value(self) -> f64 {
        match self {
            ScoreBound::Inclusive(value) | ScoreBound::Exclusive(value) => value,
        }
    }
}
