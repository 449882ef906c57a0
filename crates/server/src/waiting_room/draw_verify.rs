//! `rankgate queue verify-draw`: recomputes a scheduled opening's draw and says whether what was published
//! holds (exit 0) or not (exit 1, naming the first mismatch). The algorithm is
//! `rankgate_core::queue::draw`'s; the checks, in order:
//!
//! 1. `SHA-256(seed) == drawCommitment` (the seed was fixed before anybody entered);
//! 2. the published list names each member once, and its `SHA-256(memberId)` digests, sorted and hashed,
//!    give the published `entrantsCommitment` (nobody was added or dropped after the close);
//! 3. the beacon: the published round and value are the ones the caller expects (`--beacon-round`,
//!    `--beacon`, fetched independently from the beacon's own network), and a queue that named a round
//!    published a value;
//! 4. the list is in `HMAC-SHA-256(drawKey, memberId)` order, `drawKey = HMAC-SHA-256(seed,
//!    entrantsCommitment ‖ beacon)`.
//!
//! The inputs come either from files (`--seed`, `--commitment`, `--entrants-commitment`, `--beacon`,
//! `--members FILE` with one id per line in the published order) or from a running rankgate (`--url`,
//! `--queue`, the admin key), whose admin draw read (`GET /v1/admin/queues/{queue}/draw`) is paged through.
//! A draw finished before entrant commitments existed (`entrantsCommitment` null) is checked by the rule
//! it was drawn with, `HMAC-SHA-256(seed, memberId)`.

use std::path::Path;

use anyhow::Context as _;
use rankgate_core::queue::draw::{from_hex_32, parse_beacon_value, verify_draw, RevealedDraw};
use rankgate_core::queue::DrawSeed;
use serde::Deserialize;

/// What a verification needs: the draw as published, and its beacon round if it named one.
#[derive(Debug, Clone)]
pub struct PublishedDraw {
    /// Seed, commitments, beacon and the order.
    pub draw: RevealedDraw,
    /// `drawBeaconRound` as published.
    pub beacon_round: Option<u64>,
}

/// What the caller knows independently of the server, to hold the published draw to.
#[derive(Debug, Clone, Default)]
pub struct Expectations {
    /// `--beacon`: the beacon round's value as the beacon network publishes it.
    pub beacon: Option<Vec<u8>>,
    /// `--beacon-round`: the round the caller expects the draw to have used.
    pub beacon_round: Option<u64>,
}

/// Most members read from a server (the pre-queue is bounded by `max_pre_queue` there too).
const MAX_MEMBERS: usize = 10_000_000;

/// Parses a 32-byte hex argument, naming it.
pub fn hex_argument(name: &str, raw: &str) -> anyhow::Result<[u8; 32]> {
    from_hex_32(raw).with_context(|| format!("{name}: must be 64 hex digits (32 bytes)"))
}

/// Parses a beacon value argument (`""` is an empty beacon), naming it.
pub fn beacon_argument(name: &str, raw: &str) -> anyhow::Result<Vec<u8>> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    parse_beacon_value(raw)
        .map_err(|_| anyhow::anyhow!("{name}: must be hex, whole bytes, at most 1024 digits"))
}

/// Reads `--members FILE`: one member id per line, blank lines ignored.
pub fn read_members_file(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .map(|line| line.trim_end_matches('\r'))
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DrawPageBody {
    draw_phase: String,
    draw_commitment: String,
    draw_seed: Option<String>,
    #[serde(default)]
    draw_beacon_round: Option<u64>,
    #[serde(default)]
    entrants_commitment: Option<String>,
    #[serde(default)]
    beacon: Option<String>,
    drawn_count: u64,
    #[serde(default)]
    members: Option<Vec<String>>,
}

/// Reads a finished draw from a running rankgate's admin API, page by page.
pub async fn fetch_published_draw(
    url: &str,
    queue: &str,
    key: Option<&str>,
) -> anyhow::Result<PublishedDraw> {
    // Bounded: a server that stops answering fails the check instead of hanging it.
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let base = url.trim_end_matches('/');
    let mut members: Vec<String> = Vec::new();
    loop {
        let mut request = client.get(format!(
            "{base}/v1/admin/queues/{queue}/draw?offset={}&limit=10000",
            members.len()
        ));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("GET {base}/v1/admin/queues/{queue}/draw"))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            anyhow::bail!("GET /v1/admin/queues/{queue}/draw answered {status}: {body}");
        }
        let page: DrawPageBody = response.json().await.context("reading the draw page")?;
        if page.draw_phase != "done" {
            anyhow::bail!(
                "queue {queue}'s draw is {}, not done: nothing to verify yet",
                page.draw_phase
            );
        }
        let seed = page
            .draw_seed
            .as_deref()
            .context("drawSeed missing from a done draw")?;
        let page_members = page
            .members
            .context("members missing: the admin draw read must be used (is the key right?)")?;
        let empty = page_members.is_empty();
        members.extend(page_members);
        if members.len() as u64 >= page.drawn_count || empty || members.len() >= MAX_MEMBERS {
            return Ok(PublishedDraw {
                draw: RevealedDraw {
                    seed: DrawSeed(hex_argument("drawSeed", seed)?),
                    commitment: hex_argument("drawCommitment", &page.draw_commitment)?,
                    entrants_commitment: page
                        .entrants_commitment
                        .as_deref()
                        .map(|raw| hex_argument("entrantsCommitment", raw))
                        .transpose()?,
                    beacon: beacon_argument("beacon", page.beacon.as_deref().unwrap_or(""))?,
                    order: members,
                },
                beacon_round: page.draw_beacon_round,
            });
        }
    }
}

/// Why the beacon of a published draw is not the one expected.
fn beacon_mismatch(published: &PublishedDraw, expected: &Expectations) -> Option<String> {
    let draw = &published.draw;
    if let Some(round) = expected.beacon_round {
        if published.beacon_round != Some(round) {
            return Some(format!(
                "the draw names beacon round {}, not the expected {round}",
                published
                    .beacon_round
                    .map_or_else(|| "none".to_string(), |r| r.to_string())
            ));
        }
    }
    if published.beacon_round.is_some() && draw.beacon.is_empty() {
        return Some("the draw names a beacon round but published no beacon value".into());
    }
    if let Some(beacon) = &expected.beacon {
        if &draw.beacon != beacon {
            return Some(format!(
                "the published beacon {:?} is not the expected {:?}",
                hex::encode(&draw.beacon),
                hex::encode(beacon)
            ));
        }
    }
    None
}

/// Checks the draw; prints the verdict. `Ok(true)` when everything matches.
pub fn check_and_report(published: &PublishedDraw, expected: &Expectations) -> bool {
    if let Some(why) = beacon_mismatch(published, expected) {
        println!("draw does NOT verify: {why}");
        return false;
    }
    let draw = &published.draw;
    match verify_draw(draw) {
        Ok(()) => {
            match draw.entrants_commitment {
                Some(_) => println!(
                    "draw verified: SHA-256(seed) equals drawCommitment, the {} entrants hash to \
                     entrantsCommitment, and they are in HMAC-SHA-256(drawKey, memberId) order with drawKey \
                     = HMAC-SHA-256(seed, entrantsCommitment ‖ beacon){}",
                    draw.order.len(),
                    match published.beacon_round {
                        Some(round) => format!(" (beacon round {round}: {})", hex::encode(&draw.beacon)),
                        None => " (no beacon)".into(),
                    }
                ),
                None => println!(
                    "draw verified (a draw from before entrant commitments): SHA-256(seed) equals the \
                     commitment, and the {} members are in HMAC-SHA-256(seed, memberId) order",
                    draw.order.len()
                ),
            }
            true
        }
        Err(mismatch) => {
            println!("draw does NOT verify: {mismatch}");
            false
        }
    }
}
