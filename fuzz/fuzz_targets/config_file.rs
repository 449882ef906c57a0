//! The config file (TOML → `Config`, through `Config::load` exactly as `rankgate serve --config` reads it).
//!
//! Properties: loading never panics (a bad file is an error naming the key); a loaded config keeps its
//! invariants: retention covers lateness, durations are not negative, limits are at least 1.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rankgate::config::{Config, Overrides};

fn config_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = Box::leak(Box::new(tempfile::tempdir().expect("a temp dir")));
        dir.path().join("rankgate.toml")
    })
}

fuzz_target!(|data: &[u8]| {
    let path = config_path();
    std::fs::write(path, data).expect("the temp dir is writable");
    let overrides = Overrides {
        config: Some(path.clone()),
        ..Overrides::default()
    };
    let Ok(config) = Config::load(&overrides) else {
        return;
    };
    assert!(
        config.rankings.event_retention_millis >= config.rankings.max_lateness_millis,
        "{config:?}"
    );
    assert!(
        config.rankings.max_lateness_millis >= 0,
        "negative lateness accepted: {}",
        config.rankings.max_lateness_millis
    );
    assert!(
        config.rankings.metric_retention_millis >= 0,
        "negative retention accepted"
    );
    assert!(
        config.rankings.max_future_millis >= 0,
        "negative max_future_seconds accepted"
    );
    assert!(config.rankings.serving_grace_millis >= 1000);
});
