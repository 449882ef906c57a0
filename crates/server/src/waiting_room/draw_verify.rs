//! `rankgate queue verify-draw`: recomputes a scheduled opening's draw from its revealed seed and its
//! pre-queue member ids, and says whether the published commitment and order match (exit 0) or not
//! (exit 1). The algorithm is `rankgate_core::queue::draw`'s: commitment = SHA-256(seed), order = member
//! ids sorted by HMAC-SHA-256(seed, memberId) ascending by bytes.
//!
//! The inputs come either from files (`--seed`, `--commitment`, `--members FILE` with one id per line in
//! the published order) or from a running rankgate (`--url`, `--queue`, the admin key), whose admin draw
//! read (`GET /v1/admin/queues/{queue}/draw`) is paged through.

use std::path::Path;

use anyhow::Context as _;
use rankgate_core::queue::draw::{from_hex_32, verify_draw};
use rankgate_core::queue::DrawSeed;
use serde::Deserialize;

/// What a verification needs.
#[derive(Debug, Clone)]
pub struct PublishedDraw {
    /// The revealed seed.
    pub seed: DrawSeed,
    /// The commitment published before the draw.
    pub commitment: [u8; 32],
    /// The pre-queue member ids in the published order.
    pub members: Vec<String>,
}

/// Most members read from a server (the pre-queue is bounded by `max_pre_queue` there too).
const MAX_MEMBERS: usize = 10_000_000;

/// Parses a 32-byte hex argument, naming it.
pub fn hex_argument(name: &str, raw: &str) -> anyhow::Result<[u8; 32]> {
    from_hex_32(raw).with_context(|| format!("{name}: must be 64 hex digits (32 bytes)"))
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
                seed: DrawSeed(hex_argument("drawSeed", seed)?),
                commitment: hex_argument("drawCommitment", &page.draw_commitment)?,
                members,
            });
        }
    }
}

/// Checks the draw; prints the verdict. `Ok(true)` when it matches.
pub fn check_and_report(draw: &PublishedDraw) -> bool {
    match verify_draw(&draw.seed, &draw.commitment, &draw.members) {
        Ok(()) => {
            println!(
                "draw verified: SHA-256(seed) equals the commitment, and the {} members are in \
                 HMAC-SHA-256(seed, memberId) order",
                draw.members.len()
            );
            true
        }
        Err(mismatch) => {
            println!("draw does NOT verify: {mismatch}");
            false
        }
    }
}
