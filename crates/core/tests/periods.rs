//! Calendar periods, windows and zones (SPEC 1.4): keys, ISO weeks, DST days, and the property that
//! periods tile the UTC hour timeline.

use proptest::prelude::*;
use rankgate_core::period::{
    format_hour_key, parse_end_hour, Hour, PeriodError, PeriodKey, PeriodKind, Span, WindowLen, Zone,
};

fn hour_at(rfc3339: &str) -> Hour {
    let timestamp: jiff::Timestamp = rfc3339.parse().unwrap();
    Hour::from_millis(timestamp.as_millisecond())
}

fn key(kind: PeriodKind, text: &str) -> PeriodKey {
    PeriodKey::parse(kind, text).unwrap()
}

fn zone(name: &str) -> Zone {
    Zone::parse(name).unwrap()
}

fn hour_count(period: &PeriodKey, zone: &Zone) -> i64 {
    let hours = period.hours(zone);
    hours.end.0 - hours.start.0
}

#[test]
fn hour_buckets_floor_epoch_milliseconds() {
    assert_eq!(Hour::from_millis(0), Hour(0));
    assert_eq!(Hour::from_millis(3_599_999), Hour(0));
    assert_eq!(Hour::from_millis(3_600_000), Hour(1));
    assert_eq!(Hour::from_millis(-1), Hour(-1));
    assert_eq!(Hour::from_millis(-3_600_000), Hour(-1));
    assert_eq!(Hour::from_millis(-3_600_001), Hour(-2));
    assert_eq!(Hour(5).start_millis(), 18_000_000);
    assert_eq!(
        hour_at("2026-07-17T13:59:59.999Z"),
        hour_at("2026-07-17T13:00:00Z")
    );
}

#[test]
fn period_kinds_and_window_lengths_parse_their_wire_names() {
    for kind in PeriodKind::ALL {
        assert_eq!(PeriodKind::parse(kind.as_str()), Ok(kind));
    }
    assert_eq!(PeriodKind::parse("yearly"), Ok(PeriodKind::Yearly));
    assert_eq!(PeriodKind::parse("annual"), Err(PeriodError::UnknownPeriodKind));
    assert_eq!(PeriodKind::parse("Daily"), Err(PeriodError::UnknownPeriodKind));
    for len in WindowLen::ALL {
        assert_eq!(WindowLen::parse(len.as_str()), Ok(len));
    }
    assert_eq!(WindowLen::parse("2h"), Err(PeriodError::UnknownWindow));
    let hours: Vec<i64> = WindowLen::ALL.iter().map(|len| len.hours()).collect();
    assert_eq!(hours, [1, 24, 168, 720]);
}

#[test]
fn keys_round_trip_through_display() {
    for (kind, text) in [
        (PeriodKind::Hourly, "2026071713"),
        (PeriodKind::Hourly, "2026010100"),
        (PeriodKind::Daily, "20260717"),
        (PeriodKind::Daily, "20240229"),
        (PeriodKind::Weekly, "2026W29"),
        (PeriodKind::Weekly, "2026W01"),
        (PeriodKind::Monthly, "202607"),
        (PeriodKind::Yearly, "2026"),
        (PeriodKind::Yearly, "0001"),
        (PeriodKind::Yearly, "9998"),
    ] {
        let parsed = key(kind, text);
        assert_eq!(parsed.to_string(), text);
        assert_eq!(parsed.kind(), kind);
    }
}

#[test]
fn malformed_or_impossible_keys_are_rejected_naming_at() {
    for (kind, text) in [
        (PeriodKind::Daily, "2026-07-17"),
        (PeriodKind::Daily, "2026071"),
        (PeriodKind::Daily, "202607170"),
        (PeriodKind::Daily, "20260230"),
        (PeriodKind::Daily, "20250229"),
        (PeriodKind::Daily, "20261301"),
        (PeriodKind::Daily, "20260700"),
        (PeriodKind::Daily, "00000101"),
        (PeriodKind::Daily, "+2026071"),
        (PeriodKind::Hourly, "2026071724"),
        (PeriodKind::Hourly, "20260717"),
        (PeriodKind::Weekly, "2026w29"),
        (PeriodKind::Weekly, "2026W00"),
        (PeriodKind::Weekly, "2026W54"),
        (PeriodKind::Weekly, "2026-29"),
        (PeriodKind::Monthly, "202600"),
        (PeriodKind::Monthly, "202613"),
        (PeriodKind::Monthly, "２０２６07"),
        (PeriodKind::Yearly, "202"),
        (PeriodKind::Yearly, "20260"),
        (PeriodKind::Yearly, "0000"),
        (PeriodKind::Yearly, "9999"),
        (PeriodKind::Yearly, "+202"),
        (PeriodKind::Yearly, "２０２"),
    ] {
        let error = PeriodKey::parse(kind, text).unwrap_err();
        assert!(error.to_string().starts_with("at: "), "{kind} {text}: {error}");
    }
}

#[test]
fn iso_weeks_across_year_boundaries() {
    // 2020 has 53 ISO weeks, 2021 does not.
    let week_53_of_2020 = key(PeriodKind::Weekly, "2020W53");
    assert!(PeriodKey::parse(PeriodKind::Weekly, "2021W53").is_err());
    assert!(PeriodKey::parse(PeriodKind::Weekly, "2026W53").is_ok());
    assert!(PeriodKey::parse(PeriodKind::Weekly, "2027W53").is_err());
    let utc = Zone::utc();
    assert_eq!(
        week_53_of_2020.hours(&utc),
        hour_at("2020-12-28T00:00:00Z")..hour_at("2021-01-04T00:00:00Z")
    );
    assert_eq!(week_53_of_2020.next(&utc), key(PeriodKind::Weekly, "2021W01"));
    assert_eq!(key(PeriodKind::Weekly, "2021W01").prev(&utc), week_53_of_2020);
    assert_eq!(
        key(PeriodKind::Weekly, "2021W52").next(&utc),
        key(PeriodKind::Weekly, "2022W01")
    );

    // 2026-01-01 is a Thursday: week 01 of 2026 runs Monday 2025-12-29 to Sunday 2026-01-04.
    let new_year_2026 = hour_at("2026-01-01T12:00:00Z");
    assert_eq!(
        PeriodKey::containing(PeriodKind::Weekly, new_year_2026, &utc),
        key(PeriodKind::Weekly, "2026W01")
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Weekly, hour_at("2025-12-29T00:00:00Z"), &utc),
        key(PeriodKind::Weekly, "2026W01")
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Weekly, hour_at("2025-12-28T23:00:00Z"), &utc),
        key(PeriodKind::Weekly, "2025W52")
    );
    // 2027-01-01 is a Friday, so it still belongs to week 53 of 2026.
    assert_eq!(
        PeriodKey::containing(PeriodKind::Weekly, hour_at("2027-01-01T00:00:00Z"), &utc),
        key(PeriodKind::Weekly, "2026W53")
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Weekly, hour_at("2027-01-04T00:00:00Z"), &utc),
        key(PeriodKind::Weekly, "2027W01")
    );
    assert_eq!(
        key(PeriodKind::Weekly, "2026W29").hours(&utc).start,
        hour_at("2026-07-13T00:00:00Z")
    );
}

#[test]
fn weeks_are_local_mondays() {
    let tokyo = zone("Asia/Tokyo");
    // Monday 2026-07-13 00:00 in Tokyo is Sunday 15:00 UTC.
    let week = key(PeriodKind::Weekly, "2026W29");
    assert_eq!(
        week.hours(&tokyo),
        hour_at("2026-07-12T15:00:00Z")..hour_at("2026-07-19T15:00:00Z")
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Weekly, hour_at("2026-07-12T15:00:00Z"), &tokyo),
        week
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Weekly, hour_at("2026-07-12T14:00:00Z"), &tokyo),
        key(PeriodKind::Weekly, "2026W28")
    );
}

#[test]
fn daily_periods_in_london_have_23_and_25_hours_across_dst() {
    let london = zone("Europe/London");
    // Clocks go forward at 01:00 GMT on 2026-03-29 and back at 01:00 GMT on 2026-10-25.
    let spring = key(PeriodKind::Daily, "20260329");
    assert_eq!(
        spring.hours(&london),
        hour_at("2026-03-29T00:00:00Z")..hour_at("2026-03-29T23:00:00Z")
    );
    assert_eq!(hour_count(&spring, &london), 23);
    let autumn = key(PeriodKind::Daily, "20261025");
    assert_eq!(
        autumn.hours(&london),
        hour_at("2026-10-24T23:00:00Z")..hour_at("2026-10-26T00:00:00Z")
    );
    assert_eq!(hour_count(&autumn, &london), 25);
    assert_eq!(hour_count(&key(PeriodKind::Daily, "20260717"), &london), 24);
    // Summer days start at 23:00 UTC the day before.
    assert_eq!(
        PeriodKey::containing(PeriodKind::Daily, hour_at("2026-07-16T23:00:00Z"), &london),
        key(PeriodKind::Daily, "20260717")
    );
}

#[test]
fn daily_periods_in_new_york_have_23_and_25_hours_across_dst() {
    let new_york = zone("America/New_York");
    let spring = key(PeriodKind::Daily, "20260308");
    assert_eq!(
        spring.hours(&new_york),
        hour_at("2026-03-08T05:00:00Z")..hour_at("2026-03-09T04:00:00Z")
    );
    assert_eq!(hour_count(&spring, &new_york), 23);
    let autumn = key(PeriodKind::Daily, "20261101");
    assert_eq!(
        autumn.hours(&new_york),
        hour_at("2026-11-01T04:00:00Z")..hour_at("2026-11-02T05:00:00Z")
    );
    assert_eq!(hour_count(&autumn, &new_york), 25);
    // March 2026 loses an hour, November gains one.
    assert_eq!(
        hour_count(&key(PeriodKind::Monthly, "202603"), &new_york),
        31 * 24 - 1
    );
    assert_eq!(
        hour_count(&key(PeriodKind::Monthly, "202611"), &new_york),
        30 * 24 + 1
    );
}

#[test]
fn containing_and_hours_round_trip_over_dst_days() {
    for zone_name in [
        "UTC",
        "Europe/London",
        "America/New_York",
        "Asia/Tokyo",
        "Australia/Sydney",
    ] {
        let zone = zone(zone_name);
        for kind in PeriodKind::ALL {
            for text_day in [
                "2026-03-08T12:00:00Z",
                "2026-03-29T12:00:00Z",
                "2026-10-25T12:00:00Z",
                "2026-04-05T12:00:00Z",
            ] {
                let period = PeriodKey::containing(kind, hour_at(text_day), &zone);
                let hours = period.hours(&zone);
                for hour in hours.start.0..hours.end.0 {
                    assert_eq!(
                        PeriodKey::containing(kind, Hour(hour), &zone),
                        period,
                        "{zone_name} {kind} {hour}"
                    );
                }
                assert_eq!(
                    PeriodKey::containing(kind, hours.start.plus(-1), &zone),
                    period.prev(&zone)
                );
                assert_eq!(PeriodKey::containing(kind, hours.end, &zone), period.next(&zone));
            }
        }
    }
}

#[test]
fn next_and_prev_cross_day_month_and_year_boundaries() {
    let utc = Zone::utc();
    assert_eq!(
        key(PeriodKind::Hourly, "2026123123").next(&utc),
        key(PeriodKind::Hourly, "2027010100")
    );
    assert_eq!(
        key(PeriodKind::Hourly, "2027010100").prev(&utc),
        key(PeriodKind::Hourly, "2026123123")
    );
    assert_eq!(
        key(PeriodKind::Daily, "20240228").next(&utc),
        key(PeriodKind::Daily, "20240229")
    );
    assert_eq!(
        key(PeriodKind::Daily, "20250228").next(&utc),
        key(PeriodKind::Daily, "20250301")
    );
    assert_eq!(
        key(PeriodKind::Daily, "20260101").prev(&utc),
        key(PeriodKind::Daily, "20251231")
    );
    assert_eq!(
        key(PeriodKind::Monthly, "202612").next(&utc),
        key(PeriodKind::Monthly, "202701")
    );
    assert_eq!(
        key(PeriodKind::Monthly, "202601").prev(&utc),
        key(PeriodKind::Monthly, "202512")
    );
    assert_eq!(
        key(PeriodKind::Weekly, "2026W53").next(&utc),
        key(PeriodKind::Weekly, "2027W01")
    );
    // Keys of one kind order chronologically.
    assert!(key(PeriodKind::Daily, "20251231") < key(PeriodKind::Daily, "20260101"));
    assert!(key(PeriodKind::Weekly, "2020W53") < key(PeriodKind::Weekly, "2021W01"));
}

#[test]
fn years_are_local_calendar_years() {
    let utc = Zone::utc();
    let year_2026 = key(PeriodKind::Yearly, "2026");
    assert_eq!(
        year_2026.hours(&utc),
        hour_at("2026-01-01T00:00:00Z")..hour_at("2027-01-01T00:00:00Z")
    );
    assert_eq!(hour_count(&year_2026, &utc), 365 * 24);
    assert_eq!(hour_count(&key(PeriodKind::Yearly, "2024"), &utc), 366 * 24);
    assert_eq!(year_2026.next(&utc), key(PeriodKind::Yearly, "2027"));
    assert_eq!(year_2026.prev(&utc), key(PeriodKind::Yearly, "2025"));
    assert_eq!(
        key(PeriodKind::Yearly, "9998").next(&utc),
        key(PeriodKind::Yearly, "9998")
    );
    assert_eq!(
        key(PeriodKind::Yearly, "0001").prev(&utc),
        key(PeriodKind::Yearly, "0001")
    );
    assert!(key(PeriodKind::Yearly, "2025") < year_2026);

    // Tokyo's new year starts nine hours before UTC's; New York's five hours after (in winter, EST).
    let tokyo = zone("Asia/Tokyo");
    assert_eq!(
        year_2026.hours(&tokyo),
        hour_at("2025-12-31T15:00:00Z")..hour_at("2026-12-31T15:00:00Z")
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Yearly, hour_at("2025-12-31T15:00:00Z"), &tokyo),
        year_2026
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Yearly, hour_at("2025-12-31T14:00:00Z"), &tokyo),
        key(PeriodKind::Yearly, "2025")
    );
    let new_york = zone("America/New_York");
    assert_eq!(
        year_2026.hours(&new_york),
        hour_at("2026-01-01T05:00:00Z")..hour_at("2027-01-01T05:00:00Z")
    );
    // Both DST changes fall inside the year, so it still has 365 × 24 hours.
    assert_eq!(hour_count(&year_2026, &new_york), 365 * 24);
}

#[test]
fn hourly_periods_in_a_gap_are_empty_and_in_a_fold_span_two_hours() {
    let berlin = zone("Europe/Berlin");
    // 2026-03-29: 02:00 CET jumps to 03:00 CEST, so local hour 02 does not exist.
    let skipped = key(PeriodKind::Hourly, "2026032902");
    assert_eq!(hour_count(&skipped, &berlin), 0);
    assert_eq!(
        key(PeriodKind::Hourly, "2026032901").hours(&berlin),
        hour_at("2026-03-29T00:00:00Z")..hour_at("2026-03-29T01:00:00Z")
    );
    assert_eq!(
        key(PeriodKind::Hourly, "2026032903").hours(&berlin),
        hour_at("2026-03-29T01:00:00Z")..hour_at("2026-03-29T02:00:00Z")
    );
    // 2026-10-25: 03:00 CEST goes back to 02:00 CET, so local hour 02 happens twice.
    assert_eq!(
        key(PeriodKind::Hourly, "2026032901").next(&berlin),
        key(PeriodKind::Hourly, "2026032903")
    );
    assert_eq!(
        key(PeriodKind::Hourly, "2026032903").prev(&berlin),
        key(PeriodKind::Hourly, "2026032901")
    );
    let repeated = key(PeriodKind::Hourly, "2026102502");
    assert_eq!(
        repeated.hours(&berlin),
        hour_at("2026-10-25T00:00:00Z")..hour_at("2026-10-25T02:00:00Z")
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Hourly, hour_at("2026-10-25T01:00:00Z"), &berlin),
        repeated
    );
}

#[test]
fn end_hours_are_local_with_earlier_fold_and_gap_errors() {
    let utc = Zone::utc();
    assert_eq!(
        parse_end_hour("2026071713", &utc),
        Ok(hour_at("2026-07-17T13:00:00Z"))
    );
    let tokyo = zone("Asia/Tokyo");
    assert_eq!(
        parse_end_hour("2026071713", &tokyo),
        Ok(hour_at("2026-07-17T04:00:00Z"))
    );
    assert_eq!(
        format_hour_key(hour_at("2026-07-17T04:00:00Z"), &tokyo),
        "2026071713"
    );

    let berlin = zone("Europe/Berlin");
    let gap = parse_end_hour("2026032902", &berlin).unwrap_err();
    assert_eq!(
        gap.to_string(),
        "at: no such local hour in Europe/Berlin (DST gap)"
    );
    // The repeated 02:00 means its first occurrence, 00:00 UTC.
    assert_eq!(
        parse_end_hour("2026102502", &berlin),
        Ok(hour_at("2026-10-25T00:00:00Z"))
    );
    assert_eq!(
        format_hour_key(hour_at("2026-10-25T00:00:00Z"), &berlin),
        "2026102502"
    );
    assert_eq!(
        format_hour_key(hour_at("2026-10-25T01:00:00Z"), &berlin),
        "2026102502"
    );
    assert!(parse_end_hour("2026-07-17T13", &utc)
        .unwrap_err()
        .to_string()
        .starts_with("at: "));
}

#[test]
fn windows_are_the_hours_ending_with_the_end_hour() {
    let utc = Zone::utc();
    let end = hour_at("2026-07-17T13:00:00Z");
    let day = Span::Window {
        len: WindowLen::D1,
        end,
    };
    assert_eq!(
        day.hours(&utc),
        hour_at("2026-07-16T14:00:00Z")..hour_at("2026-07-17T14:00:00Z")
    );
    assert!(day.contains(end, &utc));
    assert!(day.contains(hour_at("2026-07-16T14:00:00Z"), &utc));
    assert!(!day.contains(hour_at("2026-07-16T13:00:00Z"), &utc));
    assert!(!day.contains(end.plus(1), &utc));
    assert_eq!(day.end_hour_exclusive(&utc), end.plus(1));
    let one_hour = Span::Window {
        len: WindowLen::H1,
        end,
    };
    assert_eq!(one_hour.hours(&utc), end..end.plus(1));
    let month = Span::Window {
        len: WindowLen::D30,
        end,
    };
    assert_eq!(month.hours(&utc).end.0 - month.hours(&utc).start.0, 720);
    // Windows count hours, not local days: a 1d window over a 23-hour day still holds 24 buckets.
    let london = zone("Europe/London");
    let over_dst = Span::Window {
        len: WindowLen::D1,
        end: hour_at("2026-03-29T23:00:00Z"),
    };
    assert_eq!(
        over_dst.hours(&london).end.0 - over_dst.hours(&london).start.0,
        24
    );

    let period = Span::Period(key(PeriodKind::Daily, "20260717"));
    assert_eq!(
        period.hours(&utc),
        hour_at("2026-07-17T00:00:00Z")..hour_at("2026-07-18T00:00:00Z")
    );
    assert!(period.contains(hour_at("2026-07-17T23:00:00Z"), &utc));
    assert!(!period.contains(hour_at("2026-07-18T00:00:00Z"), &utc));
}

#[test]
fn zones_must_use_whole_hour_offsets() {
    assert!(matches!(
        Zone::parse("Asia/Kolkata"),
        Err(PeriodError::ZoneNotWholeHours { .. })
    ));
    let message = Zone::parse("Asia/Kolkata").unwrap_err().to_string();
    assert!(
        message.starts_with("timezone: Asia/Kolkata uses the UTC offset +05:30"),
        "{message}"
    );
    assert!(Zone::parse("Asia/Kathmandu").is_err());
    assert!(Zone::parse("Australia/Lord_Howe").is_err()); // +10:30 / +11
    assert!(Zone::parse("America/St_Johns").is_err());
    assert!(matches!(
        Zone::parse("Mars/Olympus_Mons"),
        Err(PeriodError::UnknownZone(_))
    ));
    assert!(Zone::parse("").is_err());
    assert!(Zone::parse("+05:00").is_err());

    for name in [
        "UTC",
        "Europe/Berlin",
        "Asia/Tokyo",
        "America/New_York",
        "Etc/GMT-9",
        "Asia/Singapore",
    ] {
        let parsed = Zone::parse(name).unwrap();
        assert_eq!(parsed.name(), name);
    }
    assert_eq!(Zone::parse("UTC").unwrap(), Zone::utc());
}

#[test]
fn a_skipped_calendar_day_is_an_empty_period() {
    // Samoa skipped 2011-12-30 when it moved across the date line.
    let apia = zone("Pacific/Apia");
    let skipped = key(PeriodKind::Daily, "20111230");
    assert_eq!(hour_count(&skipped, &apia), 0);
    let before = key(PeriodKind::Daily, "20111229");
    let after = key(PeriodKind::Daily, "20111231");
    assert_eq!(before.hours(&apia).end, after.hours(&apia).start);
    assert_eq!(
        PeriodKey::containing(PeriodKind::Daily, before.hours(&apia).end.plus(-1), &apia),
        before
    );
    assert_eq!(
        PeriodKey::containing(PeriodKind::Daily, after.hours(&apia).start, &apia),
        after
    );
    // next/prev pass over the empty day, so a carry chain goes from the 29th straight to the 31st.
    assert_eq!(before.next(&apia), after);
    assert_eq!(after.prev(&apia), before);
    // In UTC, where nothing is skipped, the 30th is an ordinary day.
    assert_eq!(before.next(&Zone::utc()), skipped);
}

#[test]
fn every_hour_of_a_skipped_day_is_an_empty_period() {
    // Found by the period_key fuzz target: 03:00 on Apia's skipped 2011-12-30 resolved to 03:00 on the
    // 31st, an hour that belongs to another key.
    let apia = zone("Pacific/Apia");
    for hour in 0..24 {
        let skipped = key(PeriodKind::Hourly, &format!("20111230{hour:02}"));
        assert_eq!(hour_count(&skipped, &apia), 0, "{skipped}");
        assert_eq!(skipped.next(&apia), key(PeriodKind::Hourly, "2011123100"));
        assert_eq!(skipped.prev(&apia), key(PeriodKind::Hourly, "2011122923"));
    }
    let first_after = key(PeriodKind::Hourly, "2011123100");
    assert_eq!(
        PeriodKey::containing(PeriodKind::Hourly, first_after.hours(&apia).start, &apia),
        first_after
    );
}

#[test]
fn a_period_ending_in_a_half_hour_gap_does_not_run_backwards() {
    // Found by the period_key fuzz target: Apia moved from UTC-11:30 to UTC-11:00 at the start of 1950,
    // so local 1950-01-01 00:00 lies in a half-hour gap, and the gap's start was looked up from the
    // floored hour, before the transition: it found the zone's 1911 transition, and 1949 ended before
    // it began.
    let apia = zone("Pacific/Apia");
    for (kind, text) in [
        (PeriodKind::Yearly, "1949"),
        (PeriodKind::Monthly, "194912"),
        (PeriodKind::Daily, "19491231"),
        (PeriodKind::Daily, "19500101"),
    ] {
        let period = key(kind, text);
        let hours = period.hours(&apia);
        assert!(hours.start <= hours.end, "{period}: {hours:?}");
        assert!(hour_count(&period, &apia) > 0, "{period}");
    }
    let (year, next) = (key(PeriodKind::Yearly, "1949"), key(PeriodKind::Yearly, "1950"));
    assert_eq!(year.hours(&apia).end, next.hours(&apia).start);
}

const PROPERTY_ZONES: [&str; 10] = [
    "UTC",
    "Europe/London",
    "Europe/Berlin",
    "America/New_York",
    "America/Sao_Paulo",
    "America/Havana",
    "America/Santiago",
    "Asia/Tokyo",
    "Australia/Sydney",
    "Pacific/Apia",
];

fn any_kind() -> impl Strategy<Value = PeriodKind> {
    prop::sample::select(PeriodKind::ALL.to_vec())
}

fn any_zone() -> impl Strategy<Value = Zone> {
    prop::sample::select(PROPERTY_ZONES.to_vec()).prop_map(zone)
}

/// 1970-01-01 to 2100-01-01, in hours.
fn any_hour() -> impl Strategy<Value = Hour> {
    (0_i64..1_138_800).prop_map(Hour)
}

proptest! {
    #[test]
    fn the_containing_period_contains_the_hour(kind in any_kind(), zone in any_zone(), hour in any_hour()) {
        let period = PeriodKey::containing(kind, hour, &zone);
        prop_assert!(period.hours(&zone).contains(&hour), "{} {} {:?}", zone, period, period.hours(&zone));
        prop_assert_eq!(PeriodKey::parse(kind, &period.to_string()), Ok(period));
    }

    #[test]
    fn adjacent_periods_tile_the_timeline(kind in any_kind(), zone in any_zone(), hour in any_hour()) {
        let period = PeriodKey::containing(kind, hour, &zone);
        let next = period.next(&zone);
        let previous = period.prev(&zone);
        prop_assert!(previous < period && period < next);
        prop_assert_eq!(period.hours(&zone).end, next.hours(&zone).start);
        prop_assert_eq!(previous.hours(&zone).end, period.hours(&zone).start);
        prop_assert_eq!(next.prev(&zone), period);
        prop_assert_eq!(previous.next(&zone), period);
        // No gap, no overlap: the hours just outside belong to the neighbours.
        prop_assert_eq!(PeriodKey::containing(kind, period.hours(&zone).start.plus(-1), &zone), previous);
        prop_assert_eq!(PeriodKey::containing(kind, period.hours(&zone).end, &zone), next);
    }

    #[test]
    fn period_lengths_are_sane(kind in any_kind(), zone in any_zone(), hour in any_hour()) {
        let period = PeriodKey::containing(kind, hour, &zone);
        let hours = period.hours(&zone);
        let length = hours.end.0 - hours.start.0;
        let allowed = match kind {
            PeriodKind::Hourly => 1..=2,
            // Samoa's skipped day is excluded here: `containing` never returns it.
            PeriodKind::Daily => 22..=26,
            PeriodKind::Weekly => 142..=194,
            PeriodKind::Monthly => 27 * 24..=32 * 24,
            // 365 or 366 local days; a zone that changed its standard offset (or skipped a day, as Samoa
            // did in 2011) moves that by up to a day.
            PeriodKind::Yearly => 364 * 24..=367 * 24,
        };
        prop_assert!(allowed.contains(&length), "{} {} has {} hours", zone, period, length);
    }

    #[test]
    fn end_hour_keys_round_trip(zone in any_zone(), hour in any_hour()) {
        let text = format_hour_key(hour, &zone);
        let parsed = parse_end_hour(&text, &zone).unwrap();
        // The second occurrence of a repeated local hour formats like the first and parses to it.
        prop_assert!(parsed == hour || (parsed < hour && format_hour_key(parsed, &zone) == text));
        prop_assert_eq!(PeriodKey::containing(PeriodKind::Hourly, hour, &zone).to_string(), text);
    }

    #[test]
    fn windows_hold_exactly_their_length(len in prop::sample::select(WindowLen::ALL.to_vec()), hour in any_hour(), probe in -800_i64..800) {
        let utc = Zone::utc();
        let window = Span::Window { len, end: hour };
        let hours = window.hours(&utc);
        prop_assert_eq!(hours.end.0 - hours.start.0, len.hours());
        let probe = hour.plus(probe);
        prop_assert_eq!(window.contains(probe, &utc), probe <= hour && probe.0 > hour.0 - len.hours());
    }
}

/// Every accepted zone in the database, around every transition from 2019 to 2030: the hours next to a
/// transition are where local and UTC boundaries could disagree.
#[test]
fn every_accepted_zone_tiles_the_hours_around_its_transitions() {
    let from: jiff::Timestamp = "2019-01-01T00:00:00Z".parse().unwrap();
    let until: jiff::Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
    let mut zones_checked = 0;
    for name in jiff::tz::db().available() {
        let Ok(zone) = Zone::parse(name.as_str()) else {
            continue;
        };
        zones_checked += 1;
        let tz = jiff::tz::TimeZone::get(name.as_str()).unwrap();
        for transition in tz
            .following(from)
            .take_while(|transition| transition.timestamp() < until)
        {
            let at = Hour::from_millis(transition.timestamp().as_millisecond());
            for hour in (at.0 - 26..at.0 + 26).map(Hour) {
                for kind in PeriodKind::ALL {
                    let period = PeriodKey::containing(kind, hour, &zone);
                    let hours = period.hours(&zone);
                    assert!(hours.contains(&hour), "{name} {period} {hours:?} {hour:?}");
                    assert_eq!(
                        hours.end,
                        period.next(&zone).hours(&zone).start,
                        "{name} {period}"
                    );
                }
            }
        }
    }
    assert!(zones_checked > 300, "only {zones_checked} zones accepted");
}
