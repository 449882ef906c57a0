//! Period keys (`PeriodKey::parse`, SPEC 1.4) and window end hours (`parse_end_hour`).
//!
//! The first input byte picks the kind and the zone; the rest is the key. Properties: nothing panics; an
//! accepted key prints as the same text and parses back to the same key; its hours are ordered, and a
//! non-empty period is the period `containing` its first hour; `next` and `prev` stay of the same kind and
//! order around it; an accepted window end hour formats back to a key that parses to the same hour.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rankgate_core::period::{format_hour_key, parse_end_hour, PeriodKey, PeriodKind, Zone};

/// UTC, a fixed offset, and two zones with DST (one of them skipped a whole day in 2011).
fn zones() -> &'static [Zone] {
    static ZONES: OnceLock<Vec<Zone>> = OnceLock::new();
    ZONES.get_or_init(|| {
        ["UTC", "Etc/GMT-9", "Europe/Berlin", "Pacific/Apia"]
            .into_iter()
            .map(|name| Zone::parse(name).expect("a known whole-hour zone"))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, key)) = data.split_first() else {
        return;
    };
    let Ok(key) = std::str::from_utf8(key) else {
        return;
    };
    let kinds = PeriodKind::ALL;
    let kind = kinds[usize::from(selector) % kinds.len()];
    let zone = &zones()[usize::from(selector) / kinds.len() % zones().len()];

    if let Ok(hour) = parse_end_hour(key, zone) {
        let formatted = format_hour_key(hour, zone);
        assert_eq!(
            parse_end_hour(&formatted, zone).ok(),
            Some(hour),
            "end hour {key:?} → {formatted:?}"
        );
    }

    let Ok(period) = PeriodKey::parse(kind, key) else {
        return;
    };
    assert_eq!(period.kind(), kind);
    let printed = period.to_string();
    assert_eq!(printed, key, "a parsed key prints as other text");
    assert_eq!(PeriodKey::parse(kind, &printed), Ok(period));

    let hours = period.hours(zone);
    assert!(hours.start <= hours.end, "{key}: hours run backwards in {zone}");
    if hours.start < hours.end {
        assert_eq!(
            PeriodKey::containing(kind, hours.start, zone),
            period,
            "{key} in {zone}"
        );
        let last = hours.end.plus(-1);
        assert_eq!(PeriodKey::containing(kind, last, zone), period, "{key} in {zone}");
    }
    let (next, prev) = (period.next(zone), period.prev(zone));
    assert_eq!((next.kind(), prev.kind()), (kind, kind));
    assert!(
        next >= period && prev <= period,
        "{key}: next {next}, prev {prev} in {zone}"
    );
    assert_eq!(PeriodKey::parse(kind, &next.to_string()), Ok(next));
    assert_eq!(PeriodKey::parse(kind, &prev.to_string()), Ok(prev));
});
