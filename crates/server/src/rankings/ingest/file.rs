//! `rankgate ingest FILE`: an NDJSON file (or stdin) through the same validation, idempotency and
//! writer as `POST /v1/events`, in batches, with a progress bar. One batch commits on the writer thread
//! while the next is parsed.

use std::io::{BufRead, BufReader, Read};
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use rankgate_core::event::{split_body, BodyFormat, Event, ParseLimits};

use crate::rankings::config::RankingsConfig;
use crate::rankings::writer::PendingOutcomes;
use crate::rankings::{IngestCounts, RankingService};

/// What `rankgate ingest` did.
#[derive(Debug, Default)]
pub struct IngestSummary {
    /// Lines read.
    pub lines: usize,
    /// Outcomes.
    pub counts: IngestCounts,
    /// Wall time.
    pub seconds: f64,
    /// The first few rejections, with line numbers.
    pub first_rejections: Vec<String>,
}

/// Streams an NDJSON file through the ingest pipeline in batches, validating like `POST /v1/events`.
pub fn ingest_file(
    service: &RankingService,
    file: &std::path::Path,
    batch_size: usize,
    config: &RankingsConfig,
    show_progress: bool,
) -> anyhow::Result<IngestSummary> {
    let (reader, total_bytes): (Box<dyn Read>, u64) = if file.as_os_str() == "-" {
        (Box::new(std::io::stdin()), 0)
    } else {
        let opened = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let size = opened.metadata().map(|m| m.len()).unwrap_or(0);
        (Box::new(opened), size)
    };
    let progress = if show_progress && total_bytes > 0 {
        let bar = ProgressBar::new(total_bytes);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({eta}) {msg}",
            )
            .expect("valid template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut reader = BufReader::with_capacity(1 << 20, progress.wrap_read(reader));
    let started = Instant::now();
    let mut summary = IngestSummary::default();
    let mut chunk = Vec::with_capacity(batch_size * 160);
    let mut chunk_lines = 0;
    let mut first_line_of_chunk = 1;
    let mut line = Vec::new();
    // One batch commits on the writer thread while the next one is parsed here.
    let mut in_flight: Option<PendingOutcomes> = None;
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line)?;
        if read > 0 {
            chunk.extend_from_slice(&line);
            if !line.ends_with(b"\n") {
                chunk.push(b'\n');
            }
            chunk_lines += 1;
        }
        if chunk_lines >= batch_size || (read == 0 && chunk_lines > 0) {
            let pending = submit_chunk(service, &chunk, first_line_of_chunk, config, &mut summary)?;
            if let Some(previous) = in_flight.replace(pending) {
                previous
                    .wait()?
                    .iter()
                    .for_each(|outcome| summary.counts.count(outcome));
            }
            summary.lines += chunk_lines;
            first_line_of_chunk += chunk_lines;
            progress.set_message(format!("{} accepted", summary.counts.accepted));
            chunk.clear();
            chunk_lines = 0;
        }
        if read == 0 {
            break;
        }
    }
    if let Some(last) = in_flight {
        last.wait()?
            .iter()
            .for_each(|outcome| summary.counts.count(outcome));
    }
    progress.finish_and_clear();
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

fn submit_chunk(
    service: &RankingService,
    chunk: &[u8],
    first_line: usize,
    config: &RankingsConfig,
    summary: &mut IngestSummary,
) -> anyhow::Result<PendingOutcomes> {
    let now = jiff::Timestamp::now().as_millisecond();
    let limits = ParseLimits {
        max_future_millis: config.max_future_millis,
        ..ParseLimits::at(now)
    };
    let items = split_body(chunk, BodyFormat::Ndjson).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut events: Vec<Event> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match item.to_event(&limits) {
            Ok(event) => events.push(event),
            Err(error) => {
                summary.counts.rejected += 1;
                if summary.first_rejections.len() < 10 {
                    summary
                        .first_rejections
                        .push(format!("event {}: {error}", first_line + index));
                }
            }
        }
    }
    service.writer().submit(events, now)
}
