//! `rankgate replay`: the hourly metric rows recomputed from the raw event log (SPEC 1.7), replacing the
//! stored ones.

use rankgate_core::ids::ProductId;
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;
use rankgate_core::ranker::RankerName;
use rankgate_store::ranking::recompute::BatchModel;

use super::config::RankingsConfig;
use super::verify::read_event_log;
use super::{open_source, Storage};

/// Recomputes every hourly metric row from the raw event log and replaces the stored rows.
pub fn replay_metrics(config: &RankingsConfig, storage: &Storage) -> anyhow::Result<usize> {
    let mut source = open_source(config, storage)?;
    let policy = source
        .load_policies(RankerName::Popular)?
        .map(|p| p.active)
        .unwrap_or_default();
    let events = read_event_log(source.as_mut())?;
    let model = BatchModel::from_accepted(events, config.zone.clone(), policy.weights);
    let rows: Vec<(Hour, ProductId, Metrics)> = model.hourly_rows();
    source.replace_metrics(&rows)?;
    Ok(rows.len())
}
