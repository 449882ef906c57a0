//! The query string of a ranking read (SPEC 1.5), parsed in one place into a [`ReadRequest`].
//!
//! `GET /v1/categories/{category}/top`, `GET /v1/products/{productId}/rank` and `…/ranks` call
//! [`parse_read_query`] on their raw query string, and so does the fuzz target; `POST /v1/rankings/sort`
//! parses its body's `ranker`, `period`, `window` and `at` with the same [`parse_ranker`] and
//! [`parse_span`]. [`percentile`] is how every read shows a rank as a share of the total. Every rule of what a read may
//! ask for lives here, so the handlers never see a raw parameter:
//!
//! - each parameter is given at most once: a repeated one is refused rather than resolved silently;
//! - a parameter the endpoint does not know is refused, so a typo such as `perod=hourly` never answers the
//!   default daily ranking as if it had been understood;
//! - numbers are plain ASCII digits (`+5`, ` 5`, `5.0`, `0x5` are refused), checked against their bounds
//!   without overflowing;
//! - `at` is bounded by the server clock ([`ReadableRange`]): a read costs work proportional to retained
//!   data, never to a date the client picked.
//!
//! Every error message starts with the name of the parameter it is about, exactly once.

use std::borrow::Cow;

use crate::ids::CategoryOrAll;
use crate::period::{
    parse_end_hour, Hour, PeriodError, PeriodKey, PeriodKind, ReadableRange, Span, WindowLen, Zone,
};
use crate::ranker::RankerName;

/// Largest `limit`.
pub const MAX_LIMIT: usize = 1000;
/// `limit` when none is given.
pub const DEFAULT_LIMIT: usize = 20;
/// Largest `offset + limit`: deep pages are rare and cost a walk down the ranking; cap them.
pub const MAX_DEPTH: usize = 10_000;

/// Which read the query string belongs to: they accept different parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadEndpoint {
    /// `GET /v1/categories/{category}/top`: `ranker`, `period`, `window`, `at`, `limit`, `offset`.
    Top,
    /// `GET /v1/products/{productId}/rank`: `ranker`, `period`, `window`, `at`, `category`.
    Rank,
    /// `GET /v1/products/{productId}/ranks`: `ranker`, `period`, `window`, `at` (every category of the
    /// product is answered, so `category` is not read).
    Ranks,
}

impl ReadEndpoint {
    fn accepts(self, parameter: Parameter) -> bool {
        match parameter {
            Parameter::Ranker | Parameter::Period | Parameter::Window | Parameter::At => true,
            Parameter::Limit | Parameter::Offset => self == ReadEndpoint::Top,
            Parameter::Category => self == ReadEndpoint::Rank,
        }
    }
}

/// What the server clock and configuration say about a read; passed in, so parsing stays pure.
#[derive(Debug, Clone, Copy)]
pub struct ReadContext<'a> {
    /// The zone calendar periods are computed in.
    pub zone: &'a Zone,
    /// The server clock (epoch milliseconds): the default `at`, and the bounds of any `at`.
    pub now_millis: i64,
    /// How long metric rows are kept: an `at` older than this is refused.
    pub metric_retention_millis: i64,
}

/// A parsed ranking read: everything the query string named, defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRequest {
    /// `ranker`, default `popular`.
    pub ranker: RankerName,
    /// `period` + `at`, or `window` + `at`; default the current daily period.
    pub span: Span,
    /// `category` of a rank read (default `all`); `None` for a top read, whose category is in the path.
    pub category: Option<CategoryOrAll>,
    /// `limit` of a top read (default 20); 0 for a rank read.
    pub limit: usize,
    /// `offset` of a top read (default 0).
    pub offset: usize,
}

/// Why a read's query string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadParamError {
    /// `period`, `window` or `at` is malformed or out of range; the message names which.
    #[error(transparent)]
    Span(#[from] PeriodError),
    /// Any other parameter problem.
    #[error("{parameter}: {message}")]
    Invalid {
        /// The parameter, as the client spelled it (shown safely).
        parameter: String,
        /// What is wrong, and what to do instead.
        message: String,
    },
}

impl ReadParamError {
    fn invalid(parameter: &str, message: impl Into<String>) -> ReadParamError {
        ReadParamError::Invalid {
            parameter: parameter.to_owned(),
            message: message.into(),
        }
    }

    /// The parameter the error is about.
    #[must_use]
    pub fn parameter(&self) -> &str {
        match self {
            ReadParamError::Span(error) => error.parameter(),
            ReadParamError::Invalid { parameter, .. } => parameter,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parameter {
    Ranker,
    Period,
    Window,
    At,
    Limit,
    Offset,
    Category,
}

impl Parameter {
    const ALL: [Parameter; 7] = [
        Parameter::Ranker,
        Parameter::Period,
        Parameter::Window,
        Parameter::At,
        Parameter::Limit,
        Parameter::Offset,
        Parameter::Category,
    ];

    fn name(self) -> &'static str {
        match self {
            Parameter::Ranker => "ranker",
            Parameter::Period => "period",
            Parameter::Window => "window",
            Parameter::At => "at",
            Parameter::Limit => "limit",
            Parameter::Offset => "offset",
            Parameter::Category => "category",
        }
    }

    fn from_name(name: &str) -> Option<Parameter> {
        Parameter::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// A client-chosen name or value, fit to be quoted in a message: short, and with control characters
/// escaped.
fn shown(raw: &str) -> String {
    crate::period::quoted_for_message(raw, 32)
}

/// An integer in `range`, written as plain ASCII digits. Refuses signs, spaces and anything `u64` would
/// overflow on, naming the parameter.
fn parse_digits(parameter: Parameter, raw: &str, range: (usize, usize)) -> Result<usize, ReadParamError> {
    /// Longer than this cannot be in range (and would not fit a `u64`).
    const MAX_DIGITS: usize = 19;
    let value = (!raw.is_empty() && raw.len() <= MAX_DIGITS && raw.bytes().all(|b| b.is_ascii_digit()))
        .then(|| raw.parse::<u64>().ok())
        .flatten()
        .and_then(|value| usize::try_from(value).ok())
        .filter(|value| (range.0..=range.1).contains(value));
    value.ok_or_else(|| {
        ReadParamError::invalid(
            parameter.name(),
            format!(
                "must be an integer between {} and {} (digits only), got {}",
                range.0,
                range.1,
                shown(raw)
            ),
        )
    })
}

/// Parses the raw (still percent-encoded) query string of a ranking read, without the leading `?`.
///
/// Defaults: ranker `popular`, the daily period containing `context.now_millis`, limit 20, offset 0,
/// category `all`. The span is checked against [`ReadableRange`]: an `at` older than `metric_retention` or
/// more than one period ahead of the clock (a window's end hour more than one hour ahead) is refused,
/// naming `at`.
pub fn parse_read_query(
    endpoint: ReadEndpoint,
    query: &str,
    context: &ReadContext<'_>,
) -> Result<ReadRequest, ReadParamError> {
    let mut given: [Option<Cow<'_, str>>; Parameter::ALL.len()] = Default::default();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        // A parameter this endpoint does not read is ignored, as HTTP APIs usually do: a CDN's or a
        // browser's cache-buster (`_=1733…`) or a newer client's extra must not turn a read into a 400.
        let Some(parameter) = Parameter::from_name(&name).filter(|p| endpoint.accepts(*p)) else {
            continue;
        };
        let slot = &mut given[parameter as usize];
        if slot.is_some() {
            return Err(ReadParamError::invalid(
                parameter.name(),
                "given more than once; give each parameter once",
            ));
        }
        *slot = Some(value);
    }
    let get = |parameter: Parameter| given[parameter as usize].as_deref();

    let ranker = parse_ranker(get(Parameter::Ranker))?;
    let span = parse_span(
        get(Parameter::Period),
        get(Parameter::Window),
        get(Parameter::At),
        context,
    )?;
    let (limit, offset) = match endpoint {
        ReadEndpoint::Rank | ReadEndpoint::Ranks => (0, 0),
        ReadEndpoint::Top => {
            let limit = get(Parameter::Limit).map_or(Ok(DEFAULT_LIMIT), |raw| {
                parse_digits(Parameter::Limit, raw, (1, MAX_LIMIT))
            })?;
            let offset = get(Parameter::Offset)
                .map_or(Ok(0), |raw| parse_digits(Parameter::Offset, raw, (0, MAX_DEPTH)))?;
            if offset + limit > MAX_DEPTH {
                return Err(ReadParamError::invalid(
                    "offset",
                    format!("offset + limit may not exceed {MAX_DEPTH}"),
                ));
            }
            (limit, offset)
        }
    };
    let category = match endpoint {
        ReadEndpoint::Top | ReadEndpoint::Ranks => None,
        ReadEndpoint::Rank => Some(match get(Parameter::Category) {
            None => CategoryOrAll::All,
            Some(raw) => {
                CategoryOrAll::parse(raw).map_err(|e| ReadParamError::invalid("category", e.to_string()))?
            }
        }),
    };
    Ok(ReadRequest {
        ranker,
        span,
        category,
        limit,
        offset,
    })
}

/// `ranker` (default `popular`), as every read names it: the query parameter, or the field of
/// `POST /v1/rankings/sort`.
pub fn parse_ranker(raw: Option<&str>) -> Result<RankerName, ReadParamError> {
    match raw {
        None => Ok(RankerName::Popular),
        Some(raw) => RankerName::parse(raw).map_err(|_| {
            ReadParamError::invalid(
                "ranker",
                format!("must be popular, units, revenue or trending, got {}", shown(raw)),
            )
        }),
    }
}

/// The span named by `period` or `window` and `at` (defaults as for [`parse_read_query`]), bounded by
/// [`ReadableRange`]: the query parameters, or the fields of `POST /v1/rankings/sort`.
pub fn parse_span(
    period: Option<&str>,
    window: Option<&str>,
    at: Option<&str>,
    context: &ReadContext<'_>,
) -> Result<Span, ReadParamError> {
    let zone = context.zone;
    let readable = ReadableRange::new(context.now_millis, context.metric_retention_millis);
    let now: Hour = readable.now();
    let span = match (period, window) {
        (Some(_), Some(_)) => {
            return Err(ReadParamError::invalid(
                "window",
                "give either period or window, not both",
            ))
        }
        (_, Some(window)) => {
            let len = WindowLen::parse(window)?;
            let end = match at {
                Some(at) => parse_end_hour(at, zone)?,
                None => now,
            };
            Span::Window { len, end }
        }
        (period, None) => {
            let kind = period.map_or(Ok(PeriodKind::Daily), PeriodKind::parse)?;
            let key = match at {
                Some(at) => PeriodKey::parse(kind, at)?,
                None => PeriodKey::containing(kind, now, zone),
            };
            Span::Period(key)
        }
    };
    readable.check(&span, zone)?;
    Ok(span)
}

/// A ranked product's `percentile`: the share of the `total` listed products ranked at or above it (its
/// rank), in percent, **rounded up** to two decimals. Rounding up keeps rank 1 of any ranking above 0 and
/// the last rank at exactly 100, and never shows a product in a better percentile than it is in.
/// Computed in integers, so it is exact; `None` when unranked (or `total` is 0).
#[must_use]
pub fn percentile(rank: Option<usize>, total: usize) -> Option<f64> {
    let rank = rank.filter(|rank| *rank >= 1 && total > 0)? as u128;
    let hundredths = (rank * 10_000).div_ceil(total as u128);
    Some(hundredths as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MILLIS: i64 = 86_400_000;
    /// 2026-07-17T13:05Z.
    const NOW_MILLIS: i64 = 1_784_293_500_000;

    fn parse(endpoint: ReadEndpoint, query: &str) -> Result<ReadRequest, ReadParamError> {
        let zone = Zone::utc();
        let context = ReadContext {
            zone: &zone,
            now_millis: NOW_MILLIS,
            metric_retention_millis: 400 * DAY_MILLIS,
        };
        parse_read_query(endpoint, query, &context)
    }

    #[test]
    fn defaults_are_popular_today_twenty_from_the_top() {
        let request = parse(ReadEndpoint::Top, "").unwrap();
        assert_eq!(request.ranker, RankerName::Popular);
        assert_eq!(
            request.span,
            Span::Period(PeriodKey::parse(PeriodKind::Daily, "20260717").unwrap())
        );
        assert_eq!((request.limit, request.offset, request.category), (20, 0, None));
        let rank = parse(ReadEndpoint::Rank, "category=toys&window=7d&ranker=units").unwrap();
        assert_eq!(
            parse(ReadEndpoint::Top, "ranker=trending").unwrap().ranker,
            RankerName::Trending
        );
        assert_eq!(rank.category, Some(CategoryOrAll::parse("toys").unwrap()));
        assert_eq!(rank.ranker, RankerName::Units);
    }

    #[test]
    fn plus_sign_in_limit_is_refused_and_only_ascii_digits_count() {
        for query in [
            "limit=%2B5",
            "limit=+5",
            "limit=%205",
            "limit=5%20",
            "limit=-5",
            "limit=5.0",
            "limit=0x5",
            "limit=",
            "limit=99999999999999999999999999",
            "limit=%EF%BC%95",
        ] {
            let error = parse(ReadEndpoint::Top, query).unwrap_err();
            assert_eq!(error.parameter(), "limit", "{query}");
            assert!(error.to_string().starts_with("limit: "), "{query}: {error}");
        }
        assert_eq!(parse(ReadEndpoint::Top, "limit=007").unwrap().limit, 7);
        assert_eq!(
            parse(ReadEndpoint::Top, "offset=18446744073709551616")
                .unwrap_err()
                .parameter(),
            "offset"
        );
    }

    #[test]
    fn period_errors_name_the_parameter_once() {
        for (query, parameter) in [
            ("period=daily&at=2026W29", "at"),
            ("period=yearly", "period"),
            ("window=2d", "window"),
            ("window=1d&at=20260717", "at"),
            ("period=daily&at=99981231", "at"),
        ] {
            let error = parse(ReadEndpoint::Top, query).unwrap_err();
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("{parameter}: ")),
                "{query}: {message}"
            );
            assert!(
                !message.starts_with(&format!("{parameter}: {parameter}:")),
                "{query}: {message}"
            );
            assert_eq!(error.parameter(), parameter);
        }
    }

    #[test]
    fn repeated_parameters_are_refused_naming_the_parameter() {
        for (query, parameter) in [
            ("limit=5&limit=6", "limit"),
            ("at=20260717&at=20260716", "at"),
            ("ranker=units&ranker=units", "ranker"),
        ] {
            let error = parse(ReadEndpoint::Top, query).unwrap_err();
            assert_eq!(error.parameter(), parameter, "{query}");
            assert!(error.to_string().contains("more than once"), "{error}");
        }
    }

    #[test]
    fn unknown_parameters_are_ignored_so_cache_busters_still_read() {
        let plain = parse(ReadEndpoint::Top, "period=hourly&limit=5").unwrap();
        for query in [
            "period=hourly&limit=5&_=1733000000000",
            "period=hourly&limit=5&a%0Ab=1",
            "_=1&_=2&period=hourly&limit=5",
        ] {
            assert_eq!(parse(ReadEndpoint::Top, query).unwrap(), plain, "{query}");
        }
        // A parameter of the other endpoint is not read here either.
        assert!(parse(ReadEndpoint::Rank, "limit=abc&category=toys").is_ok());
    }

    #[test]
    fn percentile_is_the_share_at_or_above_rounded_up_to_hundredths() {
        assert_eq!(
            percentile(Some(1), 778),
            Some(0.13),
            "100/778 = 0.1285… rounds up"
        );
        assert_eq!(percentile(Some(778), 778), Some(100.0));
        assert_eq!(percentile(Some(1), 1), Some(100.0));
        assert_eq!(percentile(Some(1), 4), Some(25.0));
        assert_eq!(percentile(Some(2), 3), Some(66.67));
        assert_eq!(
            percentile(Some(1), 1_000_000),
            Some(0.01),
            "never 0 for a ranked product"
        );
        assert_eq!(percentile(None, 10), None);
        assert_eq!(percentile(Some(1), 0), None);
    }

    #[test]
    fn ranks_reads_the_span_and_ranker_but_not_category_or_paging() {
        let ranks = parse(ReadEndpoint::Ranks, "window=7d&ranker=units&category=x&limit=abc").unwrap();
        assert_eq!(ranks.ranker, RankerName::Units);
        assert_eq!((ranks.category, ranks.limit, ranks.offset), (None, 0, 0));
        assert_eq!(
            parse(ReadEndpoint::Ranks, "period=hourly&at=x")
                .unwrap_err()
                .parameter(),
            "at"
        );
    }

    #[test]
    fn long_values_are_not_echoed_whole() {
        let long = "9".repeat(5_000);
        let error = parse(ReadEndpoint::Top, &format!("at={long}"))
            .unwrap_err()
            .to_string();
        assert!(error.len() < 200, "{error}");
        let error = parse(ReadEndpoint::Top, &format!("limit={long}"))
            .unwrap_err()
            .to_string();
        assert!(error.len() < 200, "{error}");
    }
}
