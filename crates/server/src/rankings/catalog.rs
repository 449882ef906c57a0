//! The product catalogue (SPEC 1.5): display fields shown with ranking items, and the listing flags that
//! take a product out of every ranking. Stored durably through the writer, served from memory, and kept
//! current across instances by the change feed ([`super::workers`]). `rankgate catalog load FILE.csv`
//! reads a CSV into the same updates ([`read_catalog_csv`]).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use rankgate_core::ids::ProductId;
use rankgate_store::ranking::catalog::{CatalogEntry, CatalogUpdate};

use super::RankingService;

impl RankingService {
    /// Bumped on every catalogue change.
    pub fn catalog_generation(&self) -> u64 {
        self.catalog_generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The display fields of a product (the `product` object of ranking items), if it has any.
    pub fn catalog_entry(&self, product: &ProductId) -> Option<serde_json::Value> {
        self.catalog
            .read()
            .get(product)
            .filter(|entry| !entry.fields.is_empty())
            .map(|entry| serde_json::Value::Object(entry.fields.clone()))
    }

    /// A product's stored catalogue entry, display fields and listing flag, if it was ever written.
    pub fn catalog_record(&self, product: &ProductId) -> Option<CatalogEntry> {
        self.catalog.read().get(product).cloned()
    }

    /// Whether any catalogue entry exists (saves a lock per item when none does).
    pub fn has_catalog(&self) -> bool {
        !self.catalog.read().is_empty()
    }

    /// Merges catalogue updates into the stored entries durably, applies their listing flags to the
    /// engine (a delisted product leaves every ranking here at once; other instances follow through the
    /// change feed), then serves the entries. Returns them as stored.
    ///
    /// Runs as a task of its own: a caller dropped between the steps (an HTTP client hanging up) would
    /// otherwise leave entries stored but not served until the next restart.
    pub async fn put_catalog(
        self: &Arc<Self>,
        updates: Vec<(ProductId, CatalogUpdate)>,
    ) -> anyhow::Result<Vec<(ProductId, CatalogEntry)>> {
        let service = Arc::clone(self);
        tokio::spawn(async move {
            let written = service
                .writer
                .run(move |ingestor| ingestor.put_catalog(&updates))
                .await??;
            service.observe_catalog(&written);
            Ok(written)
        })
        .await?
    }

    /// Adopts catalogue entries as stored (written here, or read from the change feed: whole entries, so
    /// a repeat changes nothing). Their listing flags are the engine's business
    /// (`Ingestor::put_catalog`, `Ingestor::follow`).
    pub fn observe_catalog(&self, entries: &[(ProductId, CatalogEntry)]) {
        if entries.is_empty() {
            return;
        }
        self.catalog.write().extend(entries.iter().cloned());
        self.catalog_generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The catalogue updates of a CSV file: an `id` (or `product_id`) column, the display fields, and an
/// optional `listed` column; each row checked as `PUT /v1/products/{id}` checks a body.
pub fn read_catalog_csv(file: &Path) -> anyhow::Result<Vec<(ProductId, CatalogUpdate)>> {
    let mut reader = csv::Reader::from_path(file).with_context(|| format!("opening {}", file.display()))?;
    let headers = reader.headers()?.clone();
    let id_column = headers
        .iter()
        .position(|h| h == "id" || h == "product_id" || h == "productId")
        .context("the CSV needs an `id` (or `product_id`) column")?;
    let mut entries = Vec::new();
    for (line, record) in reader.records().enumerate() {
        let record = record.with_context(|| format!("reading CSV record {}", line + 2))?;
        let product = ProductId::parse(record.get(id_column).unwrap_or(""))
            .map_err(|e| anyhow::anyhow!("line {}: id: {e}", line + 2))?;
        let mut entry = serde_json::Map::new();
        for (i, header) in headers.iter().enumerate() {
            if i == id_column {
                continue;
            }
            let value = record.get(i).unwrap_or("");
            let value = match header {
                "price" if !value.is_empty() => serde_json::Value::from(
                    value
                        .parse::<u64>()
                        .map_err(|_| anyhow::anyhow!("line {}: price: must be an integer", line + 2))?,
                ),
                // An optional column: an empty cell leaves the flag as stored (a new product is listed).
                "listed" if value.is_empty() => continue,
                "listed" => match value.to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" => serde_json::Value::Bool(true),
                    "false" | "0" | "no" => serde_json::Value::Bool(false),
                    _ => anyhow::bail!(
                        "line {}: listed: must be true or false (or 1/0, yes/no), got {value:?}",
                        line + 2
                    ),
                },
                _ => serde_json::Value::from(value),
            };
            entry.insert(header.to_string(), value);
        }
        let entry = crate::rankings::routes::catalog::parse_update(&serde_json::Value::Object(entry))
            .map_err(|e| anyhow::anyhow!("line {}: {e}", line + 2))?;
        entries.push((product, entry));
    }
    Ok(entries)
}
