//! Hours, calendar periods in a time zone, sliding windows and their keys (SPEC 1.4).
//!
//! The source of truth buckets metrics by **UTC hour** ([`Hour`]). Everything a reader asks for is a set of
//! those hours:
//!
//! - a calendar period ([`PeriodKey`]: hourly, daily, ISO-weekly, monthly or yearly) is a *local* interval in the
//!   configured [`Zone`], mapped to the UTC hours it covers. Because the zone's offsets are whole hours
//!   (checked by [`Zone::parse`]), every local period boundary falls on a UTC hour boundary, so a period is
//!   exactly a contiguous range of hour buckets; DST days have 23 or 25 of them;
//! - a sliding window ([`Span::Window`]) is the `H` hour buckets that end with a given end hour.
//!
//! # How local periods map to hours
//!
//! A period starts at the instant its first local hour starts. A local hour that does not exist (a
//! spring-forward gap) starts at the end of the gap, so a period that begins in a gap begins at the
//! transition; a local hour that happens twice (a fall-back fold) starts at its **earlier** occurrence.
//! A period ends where the next one starts, so consecutive periods tile the timeline with no gap and no
//! overlap. An hourly period whose local hour is skipped is empty; one whose local hour repeats covers two
//! UTC hours.
//!
//! Calendar arithmetic (days, ISO weeks, months, years) is done here on plain integers, which keeps
//! [`PeriodKey::containing`] cheap and total; `jiff` is used only to look up the zone's UTC offsets.

use std::fmt;
use std::ops::Range;

use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::Timestamp;

const MILLIS_PER_HOUR: i64 = 3_600_000;
const SECONDS_PER_HOUR: i64 = 3_600;
const HOURS_PER_DAY: i64 = 24;
const HOURS_PER_WEEK: i64 = 168;

/// The first year a [`PeriodKey`] can name. Keys are written with four-digit years.
const MIN_YEAR: i64 = 1;
/// The last year a [`PeriodKey`] can name: one below 9999 so that the end of every period, even in a zone
/// far west of UTC, is still a representable timestamp.
const MAX_YEAR: i64 = 9998;

/// Offsets are checked from here on by [`Zone::parse`]. Several zones that use whole-hour offsets today had a
/// fractional one in the recent past (Asia/Singapore until 1982, America/Caracas 2007–2016,
/// Asia/Pyongyang 2015–2018); rejecting them would refuse real shops for data nobody retains, so older
/// history is approximated instead (see [`Zone`]).
const WHOLE_HOUR_CHECK_FROM_SECONDS: i64 = 1_546_300_800; // 2019-01-01T00:00:00Z
/// Offsets are checked up to here: far past any retention, and past the last explicit rule of tzdb.
const WHOLE_HOUR_CHECK_UNTIL_SECONDS: i64 = 4_102_444_800; // 2100-01-01T00:00:00Z

/// Why a period, window, key or zone could not be parsed. Each message starts with the name of the
/// parameter it is about (`period`, `window`, `at`, `timezone`) so it can be shown as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    /// `period=` is not one of the five kinds.
    #[error("period: must be one of hourly, daily, weekly, monthly, yearly")]
    UnknownPeriodKind,
    /// `window=` is not one of the four lengths.
    #[error("window: must be one of 1h, 1d, 7d, 30d")]
    UnknownWindow,
    /// A period key or end hour is malformed or names a date that does not exist.
    #[error("at: {0}")]
    InvalidKey(String),
    /// A valid key or end hour that lies outside what a read may ask for: older than `metric_retention` or
    /// more than one period ahead of the server clock ([`ReadableRange`]).
    #[error("at: {0}")]
    OutOfRange(String),
    /// An end hour names a local hour skipped by a spring-forward transition.
    #[error("at: no such local hour in {zone} (DST gap)")]
    DstGap {
        /// The zone's name.
        zone: String,
    },
    /// The time zone name is not in the IANA time zone database.
    #[error("timezone: {0:?} is not an IANA time zone name (e.g. UTC, Europe/Berlin, Asia/Tokyo)")]
    UnknownZone(String),
    /// The zone uses an offset that is not a whole number of hours, so its local days would not start on
    /// a UTC hour bucket boundary.
    #[error(
        "timezone: {zone} uses the UTC offset {offset} (from {since}); only zones whose offsets are whole \
         hours are supported"
    )]
    ZoneNotWholeHours {
        /// The zone's name.
        zone: String,
        /// The offending offset, e.g. `+05:30`.
        offset: String,
        /// When the zone uses it (RFC 3339).
        since: String,
    },
}

impl PeriodError {
    /// The parameter the error is about: `period`, `window`, `at` or `timezone`.
    #[must_use]
    pub fn parameter(&self) -> &'static str {
        match self {
            PeriodError::UnknownPeriodKind => "period",
            PeriodError::UnknownWindow => "window",
            PeriodError::InvalidKey(_) | PeriodError::OutOfRange(_) | PeriodError::DstGap { .. } => "at",
            PeriodError::UnknownZone(_) | PeriodError::ZoneNotWholeHours { .. } => "timezone",
        }
    }
}

/// A client-chosen value as quoted in an error: at most `max_chars` characters, escaped, so a hostile
/// value is never echoed whole (shared by the period and read-parameter parsers).
pub(crate) fn quoted_for_message(raw: &str, max_chars: usize) -> String {
    let mut chars = raw.chars();
    let head: String = chars.by_ref().take(max_chars).collect();
    if chars.next().is_some() {
        format!("{head:?}…")
    } else {
        format!("{head:?}")
    }
}

/// A key as quoted in an error: at most 16 characters, escaped.
fn shown_key(key: &str) -> String {
    quoted_for_message(key, 16)
}

// ---------------------------------------------------------------------------------------------------------
// Hour
// ---------------------------------------------------------------------------------------------------------

/// A UTC hour bucket: whole hours since the Unix epoch. Hour `0` is 1970-01-01T00:00Z–01:00Z.
///
/// The source of truth keys metric rows by `Hour`; every period and window is a range of them.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hour(pub i64);

impl Hour {
    /// The hour containing `millis` (epoch milliseconds). Floors, so it is right for times before 1970 too.
    #[must_use]
    pub fn from_millis(millis: i64) -> Hour {
        Hour(millis.div_euclid(MILLIS_PER_HOUR))
    }

    /// The epoch milliseconds at which this hour starts (saturating for absurd hours).
    #[must_use]
    pub fn start_millis(self) -> i64 {
        self.0.saturating_mul(MILLIS_PER_HOUR)
    }

    /// The hour `hours` later (earlier if negative), saturating at the ends of `i64`.
    #[must_use]
    pub fn plus(self, hours: i64) -> Hour {
        Hour(self.0.saturating_add(hours))
    }

    /// The UTC seconds at which this hour starts, clamped into what `jiff` can represent.
    fn start_timestamp(self) -> Timestamp {
        let seconds = self
            .0
            .saturating_mul(SECONDS_PER_HOUR)
            .clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
        Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

// ---------------------------------------------------------------------------------------------------------
// Zone
// ---------------------------------------------------------------------------------------------------------

/// The time zone calendar periods are computed in (SPEC 1.4): UTC, or an IANA zone whose offsets are whole
/// hours.
///
/// Offsets are checked from 2019 to 2100. Before 2019 a few accepted zones used fractional offsets (e.g.
/// Asia/Singapore, +07:30 until 1982); in those stretches a local period boundary that falls inside a UTC
/// hour is rounded down to that hour's start, so the periods still tile the hours exactly.
#[derive(Clone)]
pub struct Zone {
    tz: TimeZone,
    /// The IANA name, as the database spells it; shown in errors and used for equality.
    name: Box<str>,
    /// `Some` for zones that never change offset (UTC, `Etc/GMT-9`): every conversion is then plain
    /// integer arithmetic, with no table lookup.
    fixed_offset_seconds: Option<i64>,
}

impl Zone {
    /// Coordinated Universal Time, the default zone.
    #[must_use]
    pub fn utc() -> Zone {
        Zone {
            tz: TimeZone::UTC,
            name: "UTC".into(),
            fixed_offset_seconds: Some(0),
        }
    }

    /// Looks up an IANA zone (e.g. `Europe/Berlin`) and checks that all its UTC offsets from 2019 to 2100
    /// are whole hours. `Asia/Kolkata` (+05:30) is rejected.
    pub fn parse(iana_name: &str) -> Result<Zone, PeriodError> {
        let tz = TimeZone::get(iana_name).map_err(|_| PeriodError::UnknownZone(iana_name.to_owned()))?;
        let name: Box<str> = tz.iana_name().unwrap_or(iana_name).into();

        let check_from =
            Timestamp::from_second(WHOLE_HOUR_CHECK_FROM_SECONDS).unwrap_or(Timestamp::UNIX_EPOCH);
        let check_until = Timestamp::from_second(WHOLE_HOUR_CHECK_UNTIL_SECONDS).unwrap_or(Timestamp::MAX);
        let offsets_in_force = std::iter::once((check_from, tz.to_offset(check_from))).chain(
            tz.following(check_from)
                .take_while(|transition| transition.timestamp() < check_until)
                .map(|transition| (transition.timestamp(), transition.offset())),
        );
        for (since, offset) in offsets_in_force {
            if i64::from(offset.seconds()) % SECONDS_PER_HOUR != 0 {
                return Err(PeriodError::ZoneNotWholeHours {
                    zone: name.to_string(),
                    offset: offset.to_string(),
                    since: since.to_string(),
                });
            }
        }

        let has_no_transitions =
            tz.following(Timestamp::MIN).next().is_none() && tz.preceding(Timestamp::MAX).next().is_none();
        let fixed_offset_seconds =
            has_no_transitions.then(|| i64::from(tz.to_offset(Timestamp::UNIX_EPOCH).seconds()));
        Ok(Zone {
            tz,
            name,
            fixed_offset_seconds,
        })
    }

    /// The zone's IANA name, e.g. `Europe/Berlin`.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The instant UTC hour `hour` starts, as RFC 3339 in this zone with the offset in force then, e.g.
    /// `2026-07-17T00:00:00+09:00` (`+00:00` in UTC): what a read shows as its span's bounds
    /// (`periodStart` / `periodEnd`), so a client sees local midnight as local midnight.
    #[must_use]
    pub fn format_hour_start(&self, hour: Hour) -> String {
        hour.start_timestamp()
            .to_zoned(self.tz.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
    }

    /// The local hour (hours since 1970-01-01T00:00 local civil time) in which UTC hour `hour` starts.
    fn local_hour_of(&self, hour: Hour) -> i64 {
        let offset_seconds = match self.fixed_offset_seconds {
            Some(offset) => offset,
            None => i64::from(self.tz.to_offset(hour.start_timestamp()).seconds()),
        };
        hour.0
            .saturating_mul(SECONDS_PER_HOUR)
            .saturating_add(offset_seconds)
            .div_euclid(SECONDS_PER_HOUR)
    }

    /// The UTC hour at which local hour `local_hour` starts: in a gap, the end of the gap; in a fold, the
    /// earlier occurrence. `local_hour` must lie in the supported years.
    fn start_of_local_hour(&self, local_hour: i64) -> Hour {
        match self.resolve_local_hour(local_hour) {
            Ok(hour) => hour,
            Err(GapStart(hour)) => hour,
        }
    }

    /// Like [`Zone::start_of_local_hour`] but reports a local hour inside a gap.
    fn resolve_local_hour(&self, local_hour: i64) -> Result<Hour, GapStart> {
        let local_seconds = local_hour.saturating_mul(SECONDS_PER_HOUR);
        let utc_hour_with =
            |offset_seconds: i64| Hour((local_seconds - offset_seconds).div_euclid(SECONDS_PER_HOUR));
        if let Some(offset) = self.fixed_offset_seconds {
            return Ok(utc_hour_with(offset));
        }
        let Some(datetime) = civil_datetime_of_local_hour(local_hour) else {
            // Outside jiff's civil range: keys never get here, but stay total.
            return Ok(utc_hour_with(i64::from(
                self.tz.to_offset(Hour(local_hour).start_timestamp()).seconds(),
            )));
        };
        match self.tz.to_ambiguous_timestamp(datetime).offset() {
            AmbiguousOffset::Unambiguous { offset } => Ok(utc_hour_with(i64::from(offset.seconds()))),
            // The earlier occurrence of a repeated hour is the one still using the offset from before.
            AmbiguousOffset::Fold { before, .. } => Ok(utc_hour_with(i64::from(before.seconds()))),
            // Read with the offset from before the gap, a skipped local time lands at or after the
            // transition (exactly on it only for the gap's first hour); the gap starts at the
            // transition itself, so a local hour deep inside a day-long gap (2011-12-30 03:00 in
            // Pacific/Apia) resolves there too, and a period lying wholly in the gap is empty.
            AmbiguousOffset::Gap { before, .. } => {
                let after_gap = utc_hour_with(i64::from(before.seconds()));
                // The transition is searched from the exact instant, not its hour: with a historical
                // half-hour offset (Pacific/Apia was UTC-11:30 until 1950) the hour starts before the
                // transition, and the one found would be the zone's previous one, decades earlier.
                let exact = local_seconds - i64::from(before.seconds());
                let from = jiff::Timestamp::from_second(exact.saturating_add(1))
                    .unwrap_or(after_gap.start_timestamp());
                let transition = self.tz.preceding(from).next().map_or(after_gap, |t| {
                    Hour(t.timestamp().as_second().div_euclid(SECONDS_PER_HOUR))
                });
                Err(GapStart(transition.min(after_gap)))
            }
        }
    }
}

/// A local hour that falls in a spring-forward gap; carries the UTC hour at which the gap ends.
struct GapStart(Hour);

fn civil_datetime_of_local_hour(local_hour: i64) -> Option<jiff::civil::DateTime> {
    let (year, month, day) = civil_from_days(local_hour.div_euclid(HOURS_PER_DAY));
    let hour = local_hour.rem_euclid(HOURS_PER_DAY);
    jiff::civil::DateTime::new(
        i16::try_from(year).ok()?,
        i8::try_from(month).ok()?,
        i8::try_from(day).ok()?,
        i8::try_from(hour).ok()?,
        0,
        0,
        0,
    )
    .ok()
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({:?})", &*self.name)
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Two zones are equal when they have the same IANA name.
impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

impl Default for Zone {
    fn default() -> Zone {
        Zone::utc()
    }
}

// ---------------------------------------------------------------------------------------------------------
// Civil calendar arithmetic on days since 1970-01-01 (proleptic Gregorian), after Howard Hinnant's
// `days_from_civil` / `civil_from_days`.
// ---------------------------------------------------------------------------------------------------------

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Monday = 0 … Sunday = 6. 1970-01-01 was a Thursday.
fn weekday_from_monday(days: i64) -> i64 {
    (days + 3).rem_euclid(7)
}

/// The Monday that starts week 01 of ISO week-year `iso_year`: the Monday of the week holding 4 January.
fn iso_year_start(iso_year: i64) -> i64 {
    let january_4 = days_from_civil(iso_year, 1, 4);
    january_4 - weekday_from_monday(january_4)
}

/// 52 or 53.
fn iso_weeks_in_year(iso_year: i64) -> i64 {
    (iso_year_start(iso_year + 1) - iso_year_start(iso_year)) / 7
}

/// The ISO (week-year, week) of a day: the week-year is the year of that week's Thursday.
fn iso_week_of(days: i64) -> (i64, i64) {
    let thursday = days - weekday_from_monday(days) + 3;
    let (iso_year, _, _) = civil_from_days(thursday);
    (iso_year, (days - iso_year_start(iso_year)) / 7 + 1)
}

// ---------------------------------------------------------------------------------------------------------
// Period kinds and keys
// ---------------------------------------------------------------------------------------------------------

/// The five calendar period kinds (SPEC 1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeriodKind {
    /// One local hour, key `YYYYMMDDHH`.
    Hourly,
    /// One local day, key `YYYYMMDD`.
    Daily,
    /// One ISO week (Monday to Sunday, local), key `YYYY'W'ww`.
    Weekly,
    /// One local calendar month, key `YYYYMM`.
    Monthly,
    /// One local calendar year, key `YYYY`.
    Yearly,
}

impl PeriodKind {
    /// Every kind, shortest first.
    pub const ALL: [PeriodKind; 5] = [
        PeriodKind::Hourly,
        PeriodKind::Daily,
        PeriodKind::Weekly,
        PeriodKind::Monthly,
        PeriodKind::Yearly,
    ];

    /// Parses `hourly`, `daily`, `weekly`, `monthly` or `yearly`.
    pub fn parse(s: &str) -> Result<PeriodKind, PeriodError> {
        match s {
            "hourly" => Ok(PeriodKind::Hourly),
            "daily" => Ok(PeriodKind::Daily),
            "weekly" => Ok(PeriodKind::Weekly),
            "monthly" => Ok(PeriodKind::Monthly),
            "yearly" => Ok(PeriodKind::Yearly),
            _ => Err(PeriodError::UnknownPeriodKind),
        }
    }

    /// `hourly`, `daily`, `weekly`, `monthly` or `yearly`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            PeriodKind::Hourly => "hourly",
            PeriodKind::Daily => "daily",
            PeriodKind::Weekly => "weekly",
            PeriodKind::Monthly => "monthly",
            PeriodKind::Yearly => "yearly",
        }
    }

    /// The key layout, for error messages.
    fn key_format(self) -> &'static str {
        match self {
            PeriodKind::Hourly => "YYYYMMDDHH",
            PeriodKind::Daily => "YYYYMMDD",
            PeriodKind::Weekly => "YYYYWww (ISO week, e.g. 2026W29)",
            PeriodKind::Monthly => "YYYYMM",
            PeriodKind::Yearly => "YYYY",
        }
    }
}

impl fmt::Display for PeriodKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One calendar period in local time, e.g. daily `20260717` or weekly `2026W29`.
///
/// The key is zone-free: it names local calendar fields, and [`PeriodKey::hours`] maps it to UTC hours in
/// a given [`Zone`]. Keys of one kind order chronologically. Years run from 0001 to 9998; [`PeriodKey::next`]
/// and [`PeriodKey::prev`] stop at those ends.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeriodKey {
    kind: PeriodKind,
    /// Calendar year; the ISO week-year for weekly keys.
    year: i16,
    /// Month (hourly, daily, monthly) or ISO week (weekly); 0 for yearly.
    month_or_week: u8,
    /// Day of month (hourly, daily); 0 otherwise.
    day: u8,
    /// Hour of day (hourly); 0 otherwise.
    hour: u8,
}

impl PeriodKey {
    /// Parses a key of the given kind: `YYYYMMDDHH`, `YYYYMMDD`, `YYYY'W'ww` (ISO week-year and week
    /// 01–53; week 53 only in years that have it), `YYYYMM` or `YYYY`. Rejects dates that do not exist.
    pub fn parse(kind: PeriodKind, key: &str) -> Result<PeriodKey, PeriodError> {
        // Quoted in messages: short and escaped, whatever the client sent.
        let shown = shown_key(key);
        let malformed = || {
            PeriodError::InvalidKey(format!(
                "must be {} for {kind} periods, got {shown}",
                kind.key_format()
            ))
        };
        let bytes = key.as_bytes();
        let digits = |range: Range<usize>| -> Result<i64, PeriodError> {
            let part = bytes.get(range).ok_or_else(malformed)?;
            if !part.iter().all(u8::is_ascii_digit) {
                return Err(malformed());
            }
            Ok(part
                .iter()
                .fold(0, |value, digit| value * 10 + i64::from(digit - b'0')))
        };
        let expected_len = match kind {
            PeriodKind::Hourly => 10,
            PeriodKind::Daily => 8,
            PeriodKind::Weekly => 7,
            PeriodKind::Monthly => 6,
            PeriodKind::Yearly => 4,
        };
        if bytes.len() != expected_len {
            return Err(malformed());
        }
        let year = digits(0..4)?;
        if !(MIN_YEAR..=MAX_YEAR).contains(&year) {
            return Err(PeriodError::InvalidKey(format!(
                "year must be between 0001 and 9998, got {shown}"
            )));
        }
        let check_month = |month: i64| {
            if (1..=12).contains(&month) {
                Ok(month)
            } else {
                Err(PeriodError::InvalidKey(format!(
                    "month must be 01 to 12, got {shown}"
                )))
            }
        };
        let check_day = |month: i64, day: i64| {
            if (1..=days_in_month(year, month)).contains(&day) {
                Ok(day)
            } else {
                Err(PeriodError::InvalidKey(format!("no such date: {shown}")))
            }
        };
        let (month_or_week, day, hour) = match kind {
            PeriodKind::Yearly => (0, 0, 0),
            PeriodKind::Monthly => (check_month(digits(4..6)?)?, 0, 0),
            PeriodKind::Daily => {
                let month = check_month(digits(4..6)?)?;
                (month, check_day(month, digits(6..8)?)?, 0)
            }
            PeriodKind::Hourly => {
                let month = check_month(digits(4..6)?)?;
                let day = check_day(month, digits(6..8)?)?;
                let hour = digits(8..10)?;
                if hour > 23 {
                    return Err(PeriodError::InvalidKey(format!(
                        "hour must be 00 to 23, got {shown}"
                    )));
                }
                (month, day, hour)
            }
            PeriodKind::Weekly => {
                if bytes[4] != b'W' {
                    return Err(malformed());
                }
                let week = digits(5..7)?;
                let weeks = iso_weeks_in_year(year);
                if !(1..=weeks).contains(&week) {
                    return Err(PeriodError::InvalidKey(format!(
                        "ISO week-year {year:04} has weeks 01 to {weeks}, got {shown}"
                    )));
                }
                (week, 0, 0)
            }
        };
        Ok(PeriodKey::from_fields(kind, year, month_or_week, day, hour))
    }

    /// The period of `kind` that contains UTC hour `hour`, in local time in `zone`.
    ///
    /// Hours outside the supported years (0001–9998) get the first or last supported period.
    #[must_use]
    pub fn containing(kind: PeriodKind, hour: Hour, zone: &Zone) -> PeriodKey {
        let mut key = PeriodKey::of_local_hour(kind, zone.local_hour_of(hour));
        if zone.fixed_offset_seconds.is_some() {
            // A fixed whole-hour offset maps local hours one-to-one onto UTC hours: the candidate is exact.
            return key;
        }
        // Around transitions the local hour of an instant and the local period boundaries can disagree by
        // an hour; walking to the period whose hours hold `hour` keeps `containing` and `hours` consistent
        // by construction. Boundaries are monotonic, so each loop takes at most a step or two.
        while hour < key.hours(zone).start {
            let previous = key.preceding_key();
            if previous == key {
                break;
            }
            key = previous;
        }
        while hour >= key.hours(zone).end {
            let next = key.following_key();
            if next == key {
                break;
            }
            key = next;
        }
        key
    }

    /// The UTC hours this period covers in `zone`: start inclusive, end exclusive. A local day has 24 of
    /// them, or 23 / 25 across a DST change; an hourly period skipped by a gap has none.
    #[must_use]
    pub fn hours(&self, zone: &Zone) -> Range<Hour> {
        zone.start_of_local_hour(self.start_local_hour())..zone.start_of_local_hour(self.end_local_hour())
    }

    /// The next period that has at least one hour in `zone`: the successor of a local day is the next local
    /// day, except that a day (or hourly period) skipped entirely by a transition, such as 2011-12-30 in
    /// Pacific/Apia or 02:00 on a spring-forward day, is passed over. So `next` agrees with
    /// [`PeriodKey::containing`]: `key.next(zone) == containing(kind, key.hours(zone).end, zone)`.
    ///
    /// The last supported period is its own successor.
    #[must_use]
    pub fn next(&self, zone: &Zone) -> PeriodKey {
        let mut key = self.following_key();
        while key.is_empty_in(zone) {
            let following = key.following_key();
            if following == key {
                break;
            }
            key = following;
        }
        key
    }

    /// The previous period that has at least one hour in `zone` (see [`PeriodKey::next`]). The first
    /// supported period is its own predecessor.
    #[must_use]
    pub fn prev(&self, zone: &Zone) -> PeriodKey {
        let mut key = self.preceding_key();
        while key.is_empty_in(zone) {
            let preceding = key.preceding_key();
            if preceding == key {
                break;
            }
            key = preceding;
        }
        key
    }

    /// True when a transition skips this whole local period, so it covers no hour.
    fn is_empty_in(&self, zone: &Zone) -> bool {
        // A fixed whole-hour offset never skips local time.
        zone.fixed_offset_seconds.is_none() && self.hours(zone).is_empty()
    }

    /// The calendar successor, empty or not; the last supported key is its own successor.
    fn following_key(&self) -> PeriodKey {
        let next = PeriodKey::of_local_hour(self.kind, self.end_local_hour());
        if next > *self {
            next
        } else {
            *self
        }
    }

    /// The calendar predecessor, empty or not; the first supported key is its own predecessor.
    fn preceding_key(&self) -> PeriodKey {
        let previous = PeriodKey::of_local_hour(self.kind, self.start_local_hour() - 1);
        if previous < *self {
            previous
        } else {
            *self
        }
    }

    /// The kind of period.
    #[must_use]
    pub fn kind(&self) -> PeriodKind {
        self.kind
    }

    fn from_fields(kind: PeriodKind, year: i64, month_or_week: i64, day: i64, hour: i64) -> PeriodKey {
        debug_assert!((MIN_YEAR..=MAX_YEAR).contains(&year));
        // Every field was range-checked by the caller, so the narrowing casts cannot lose information.
        PeriodKey {
            kind,
            year: year as i16,
            month_or_week: month_or_week as u8,
            day: day as u8,
            hour: hour as u8,
        }
    }

    /// The period of `kind` holding local hour `local_hour`, clamped to the supported years.
    fn of_local_hour(kind: PeriodKind, local_hour: i64) -> PeriodKey {
        let days = local_hour.div_euclid(HOURS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        if year < MIN_YEAR {
            return PeriodKey::first(kind);
        }
        if kind == PeriodKind::Weekly {
            let (iso_year, week) = iso_week_of(days);
            return match iso_year {
                y if y < MIN_YEAR => PeriodKey::first(kind),
                y if y > MAX_YEAR => PeriodKey::last(kind),
                y => PeriodKey::from_fields(kind, y, week, 0, 0),
            };
        }
        if year > MAX_YEAR {
            return PeriodKey::last(kind);
        }
        match kind {
            PeriodKind::Hourly => {
                PeriodKey::from_fields(kind, year, month, day, local_hour.rem_euclid(HOURS_PER_DAY))
            }
            PeriodKind::Daily => PeriodKey::from_fields(kind, year, month, day, 0),
            PeriodKind::Weekly | PeriodKind::Monthly => PeriodKey::from_fields(kind, year, month, 0, 0),
            PeriodKind::Yearly => PeriodKey::from_fields(kind, year, 0, 0, 0),
        }
    }

    fn first(kind: PeriodKind) -> PeriodKey {
        match kind {
            PeriodKind::Hourly | PeriodKind::Daily => PeriodKey::from_fields(kind, MIN_YEAR, 1, 1, 0),
            PeriodKind::Weekly | PeriodKind::Monthly => PeriodKey::from_fields(kind, MIN_YEAR, 1, 0, 0),
            PeriodKind::Yearly => PeriodKey::from_fields(kind, MIN_YEAR, 0, 0, 0),
        }
    }

    fn last(kind: PeriodKind) -> PeriodKey {
        match kind {
            PeriodKind::Hourly => PeriodKey::from_fields(kind, MAX_YEAR, 12, 31, 23),
            PeriodKind::Daily => PeriodKey::from_fields(kind, MAX_YEAR, 12, 31, 0),
            PeriodKind::Weekly => PeriodKey::from_fields(kind, MAX_YEAR, iso_weeks_in_year(MAX_YEAR), 0, 0),
            PeriodKind::Monthly => PeriodKey::from_fields(kind, MAX_YEAR, 12, 0, 0),
            PeriodKind::Yearly => PeriodKey::from_fields(kind, MAX_YEAR, 0, 0, 0),
        }
    }

    /// Local hours since 1970-01-01T00 local at which this period starts.
    fn start_local_hour(&self) -> i64 {
        let year = i64::from(self.year);
        let month_or_week = i64::from(self.month_or_week);
        match self.kind {
            PeriodKind::Hourly => {
                days_from_civil(year, month_or_week, i64::from(self.day)) * HOURS_PER_DAY
                    + i64::from(self.hour)
            }
            PeriodKind::Daily => days_from_civil(year, month_or_week, i64::from(self.day)) * HOURS_PER_DAY,
            PeriodKind::Weekly => (iso_year_start(year) + (month_or_week - 1) * 7) * HOURS_PER_DAY,
            PeriodKind::Monthly => days_from_civil(year, month_or_week, 1) * HOURS_PER_DAY,
            PeriodKind::Yearly => days_from_civil(year, 1, 1) * HOURS_PER_DAY,
        }
    }

    /// Local hours since 1970-01-01T00 local at which the next period starts.
    fn end_local_hour(&self) -> i64 {
        let start = self.start_local_hour();
        match self.kind {
            PeriodKind::Hourly => start + 1,
            PeriodKind::Daily => start + HOURS_PER_DAY,
            PeriodKind::Weekly => start + HOURS_PER_WEEK,
            PeriodKind::Monthly => {
                start + days_in_month(i64::from(self.year), i64::from(self.month_or_week)) * HOURS_PER_DAY
            }
            PeriodKind::Yearly => days_from_civil(i64::from(self.year) + 1, 1, 1) * HOURS_PER_DAY,
        }
    }
}

/// The canonical key: `YYYYMMDDHH`, `YYYYMMDD`, `YYYY'W'ww`, `YYYYMM` or `YYYY`.
impl fmt::Display for PeriodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (year, month_or_week, day, hour) = (self.year, self.month_or_week, self.day, self.hour);
        match self.kind {
            PeriodKind::Hourly => write!(f, "{year:04}{month_or_week:02}{day:02}{hour:02}"),
            PeriodKind::Daily => write!(f, "{year:04}{month_or_week:02}{day:02}"),
            PeriodKind::Weekly => write!(f, "{year:04}W{month_or_week:02}"),
            PeriodKind::Monthly => write!(f, "{year:04}{month_or_week:02}"),
            PeriodKind::Yearly => write!(f, "{year:04}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Windows and spans
// ---------------------------------------------------------------------------------------------------------

/// The four sliding window lengths (SPEC 1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WindowLen {
    /// 1 hour.
    H1,
    /// 24 hours.
    D1,
    /// 168 hours.
    D7,
    /// 720 hours.
    D30,
}

impl WindowLen {
    /// Every length, shortest first.
    pub const ALL: [WindowLen; 4] = [WindowLen::H1, WindowLen::D1, WindowLen::D7, WindowLen::D30];

    /// Parses `1h`, `1d`, `7d` or `30d`.
    pub fn parse(s: &str) -> Result<WindowLen, PeriodError> {
        match s {
            "1h" => Ok(WindowLen::H1),
            "1d" => Ok(WindowLen::D1),
            "7d" => Ok(WindowLen::D7),
            "30d" => Ok(WindowLen::D30),
            _ => Err(PeriodError::UnknownWindow),
        }
    }

    /// `1h`, `1d`, `7d` or `30d`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            WindowLen::H1 => "1h",
            WindowLen::D1 => "1d",
            WindowLen::D7 => "7d",
            WindowLen::D30 => "30d",
        }
    }

    /// The number of hour buckets: 1, 24, 168 or 720. Always exact hours, even across DST.
    #[must_use]
    pub fn hours(self) -> i64 {
        match self {
            WindowLen::H1 => 1,
            WindowLen::D1 => 24,
            WindowLen::D7 => 168,
            WindowLen::D30 => 720,
        }
    }
}

impl fmt::Display for WindowLen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The time part of a ranking's identity: a calendar period or a sliding window.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Span {
    /// A calendar period in the configured zone.
    Period(PeriodKey),
    /// The `len` hour buckets that end with `end`, inclusive.
    Window {
        /// How many hours.
        len: WindowLen,
        /// The last hour in the window.
        end: Hour,
    },
}

impl Span {
    /// The UTC hours covered, start inclusive, end exclusive. A window covers `end - len + 1 ..= end`.
    #[must_use]
    pub fn hours(&self, zone: &Zone) -> Range<Hour> {
        match *self {
            Span::Period(key) => key.hours(zone),
            Span::Window { len, end } => end.plus(1 - len.hours())..end.plus(1),
        }
    }

    /// True when `hour` is one of this span's hours.
    #[must_use]
    pub fn contains(&self, hour: Hour, zone: &Zone) -> bool {
        self.hours(zone).contains(&hour)
    }

    /// The first hour after the span.
    #[must_use]
    pub fn end_hour_exclusive(&self, zone: &Zone) -> Hour {
        self.hours(zone).end
    }

    /// `trending`'s end hour E (SPEC 1.3) when the current hour is `now`: a window's end hour (`at`); a
    /// period's last hour once it is over; the current hour while it runs. A period that has not begun
    /// yet (reads may ask one period ahead) uses its first hour, so E is always one of the span's hours.
    #[must_use]
    pub fn trending_end(&self, zone: &Zone, now: Hour) -> Hour {
        match *self {
            Span::Window { end, .. } => end,
            Span::Period(key) => {
                let hours = key.hours(zone);
                now.clamp(hours.start, Hour(hours.end.0 - 1))
            }
        }
    }
}

/// Parses a window's end hour `at=YYYYMMDDHH`, a **local** hour in `zone` (the same layout as hourly keys).
///
/// A local hour that occurs twice (fall-back) means its earlier occurrence. One skipped by a spring-forward
/// gap is an error.
pub fn parse_end_hour(key: &str, zone: &Zone) -> Result<Hour, PeriodError> {
    let period = PeriodKey::parse(PeriodKind::Hourly, key)?;
    zone.resolve_local_hour(period.start_local_hour())
        .map_err(|GapStart(_)| PeriodError::DstGap {
            zone: zone.name().to_owned(),
        })
}

/// The local `YYYYMMDDHH` of the hour in which UTC hour `hour` starts: the inverse of [`parse_end_hour`],
/// except that both occurrences of a repeated local hour format the same.
#[must_use]
pub fn format_hour_key(hour: Hour, zone: &Zone) -> String {
    PeriodKey::containing(PeriodKind::Hourly, hour, zone).to_string()
}

// ---------------------------------------------------------------------------------------------------------
// What a read may ask for
// ---------------------------------------------------------------------------------------------------------

/// The spans a read may name, relative to the server clock (SPEC 1.4): nothing older than
/// `metric_retention`, nothing more than one period ahead (a window's end hour at most one hour ahead).
///
/// The bound is what keeps a read's cost proportional to retained data rather than to a number the client
/// chose: a far-future daily key would otherwise walk the carry chain day by day up to year 9998, and every
/// distinct far-away key would be one more span to build and cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadableRange {
    /// The hour the server clock is in.
    now: Hour,
    /// The oldest retained hour: a period or window must reach it or later.
    oldest: Hour,
}

impl ReadableRange {
    /// The range for a server clock at `now_millis` keeping metrics for `metric_retention_millis`.
    #[must_use]
    pub fn new(now_millis: i64, metric_retention_millis: i64) -> ReadableRange {
        ReadableRange {
            now: Hour::from_millis(now_millis),
            oldest: Hour::from_millis(now_millis.saturating_sub(metric_retention_millis.max(0))),
        }
    }

    /// The hour the server clock is in.
    #[must_use]
    pub fn now(&self) -> Hour {
        self.now
    }

    /// Checks that `span` may be read: a period must still hold a retained hour and start no later than
    /// the period after the current one; a window's end hour must be retained and at most one hour ahead.
    pub fn check(&self, span: &Span, zone: &Zone) -> Result<(), PeriodError> {
        match *span {
            Span::Period(key) => {
                let kind = key.kind();
                let latest = PeriodKey::containing(kind, self.now, zone).next(zone);
                if key > latest {
                    return Err(PeriodError::OutOfRange(format!(
                        "{key} is more than one period ahead of the server clock; the latest {kind} period \
                         that can be read is {latest}"
                    )));
                }
                let earliest = PeriodKey::containing(kind, self.oldest, zone);
                if key < earliest {
                    return Err(PeriodError::OutOfRange(format!(
                        "{key} is older than metric_retention; the earliest {kind} period that can be read \
                         is {earliest}"
                    )));
                }
                Ok(())
            }
            Span::Window { end, .. } => {
                let latest = self.now.plus(1);
                if end > latest {
                    return Err(PeriodError::OutOfRange(format!(
                        "{} is more than one hour ahead of the server clock; the latest end hour that can \
                         be read is {}",
                        format_hour_key(end, zone),
                        format_hour_key(latest, zone)
                    )));
                }
                if end < self.oldest {
                    return Err(PeriodError::OutOfRange(format!(
                        "{} is older than metric_retention; the earliest end hour that can be read is {}",
                        format_hour_key(end, zone),
                        format_hour_key(self.oldest, zone)
                    )));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MILLIS: i64 = 24 * MILLIS_PER_HOUR;
    /// 2026-07-17T13:05Z.
    const NOW_MILLIS: i64 = 1_784_293_500_000;

    fn daily(key: &str) -> Span {
        Span::Period(PeriodKey::parse(PeriodKind::Daily, key).unwrap())
    }

    #[test]
    fn span_bounds_are_rfc3339_with_the_offset_in_force_at_each_end() {
        let tokyo = Zone::parse("Asia/Tokyo").unwrap();
        let day = PeriodKey::parse(PeriodKind::Daily, "20260717")
            .unwrap()
            .hours(&tokyo);
        assert_eq!(tokyo.format_hour_start(day.start), "2026-07-17T00:00:00+09:00");
        assert_eq!(tokyo.format_hour_start(day.end), "2026-07-18T00:00:00+09:00");
        let utc = Zone::utc();
        assert_eq!(utc.format_hour_start(Hour(0)), "1970-01-01T00:00:00+00:00");
        // The Berlin day of the spring-forward change starts at +01:00 and ends at +02:00 (23 hours).
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        let change = PeriodKey::parse(PeriodKind::Daily, "20260329")
            .unwrap()
            .hours(&berlin);
        assert_eq!(change.end.0 - change.start.0, 23);
        assert_eq!(
            berlin.format_hour_start(change.start),
            "2026-03-29T00:00:00+01:00"
        );
        assert_eq!(berlin.format_hour_start(change.end), "2026-03-30T00:00:00+02:00");
    }

    #[test]
    fn at_far_ahead_or_before_retention_is_out_of_range_naming_at() {
        let readable = ReadableRange::new(NOW_MILLIS, 400 * DAY_MILLIS);
        let utc = Zone::utc();
        for span in [
            daily("99981231"),
            daily("00010101"),
            daily("20260719"),
            daily("20250611"),
            Span::Period(PeriodKey::parse(PeriodKind::Hourly, "2026071715").unwrap()),
            Span::Period(PeriodKey::parse(PeriodKind::Monthly, "202609").unwrap()),
            Span::Window {
                len: WindowLen::D7,
                end: parse_end_hour("2026071715", &utc).unwrap(),
            },
            Span::Window {
                len: WindowLen::H1,
                end: parse_end_hour("9998123123", &utc).unwrap(),
            },
        ] {
            let error = readable.check(&span, &utc).unwrap_err();
            assert!(matches!(error, PeriodError::OutOfRange(_)), "{span:?}");
            assert!(error.to_string().starts_with("at: "), "{error}");
            assert!(!error.to_string().starts_with("at: at"), "{error}");
        }
    }

    #[test]
    fn the_current_and_next_periods_and_the_oldest_retained_one_are_readable() {
        let readable = ReadableRange::new(NOW_MILLIS, 400 * DAY_MILLIS);
        let utc = Zone::utc();
        for span in [
            daily("20260717"),
            daily("20260718"),
            daily("20250612"),
            Span::Period(PeriodKey::parse(PeriodKind::Hourly, "2026071714").unwrap()),
            Span::Period(PeriodKey::parse(PeriodKind::Weekly, "2026W30").unwrap()),
            Span::Period(PeriodKey::parse(PeriodKind::Monthly, "202608").unwrap()),
            Span::Period(PeriodKey::parse(PeriodKind::Monthly, "202506").unwrap()),
            Span::Window {
                len: WindowLen::D30,
                end: parse_end_hour("2026071714", &utc).unwrap(),
            },
        ] {
            assert_eq!(readable.check(&span, &utc), Ok(()), "{span:?}");
        }
    }

    #[test]
    fn civil_arithmetic_matches_jiff() {
        for days in (-700_000..2_900_000).step_by(997) {
            let (year, month, day) = civil_from_days(days);
            let date = jiff::civil::Date::new(year as i16, month as i8, day as i8).unwrap();
            let epoch = jiff::civil::date(1970, 1, 1);
            assert_eq!(i64::from(epoch.until(date).unwrap().get_days()), days);
            assert_eq!(days_from_civil(year, month, day), days);
            let iso = date.iso_week_date();
            assert_eq!(iso_week_of(days), (i64::from(iso.year()), i64::from(iso.week())));
            assert_eq!(
                weekday_from_monday(days),
                i64::from(date.weekday().to_monday_zero_offset())
            );
        }
    }
}
