//! The catalogue: `PUT /v1/products/{productId}` and `GET /v1/products/{productId}` (SPEC 1.5).
//!
//! Display fields only decorate rankings; unknown products still rank. `listed` is the one field that
//! changes rankings: `false` delists the product from every ranking on every instance while its metrics
//! keep counting, `true` lists it again. A PUT is merged into the stored entry
//! ([`rankgate_store::ranking::catalog`]): a field given replaces the stored one, `null` removes it, a field
//! not given (or `listed` not given) keeps its stored value, so `{"listed": false}` alone erases nothing.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;
use serde_json::{Map, Value};

use rankgate_core::ids::ProductId;
use rankgate_store::ranking::catalog::{CatalogEntry, CatalogUpdate};

use crate::http::error::{ApiError, ApiResult};
use crate::rankings::Rankings;

/// Display fields a catalogue entry may carry; others are refused so typos are caught.
const FIELDS: [&str; 6] = ["name", "brand", "price", "image", "imageUrl", "url"];
/// The listing flag's field.
const LISTED: &str = "listed";

/// A catalogue entry as the API shows it: the product id, the listing flag and the display fields.
#[derive(Debug, Serialize)]
pub struct CatalogEntryBody {
    /// The product.
    #[serde(rename = "productId")]
    pub product_id: String,
    /// `false` while the product is delisted.
    pub listed: bool,
    /// name, brand, price, image, imageUrl, url, as stored.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl CatalogEntryBody {
    fn of(product: &ProductId, entry: CatalogEntry) -> CatalogEntryBody {
        CatalogEntryBody {
            product_id: product.as_str().to_owned(),
            listed: entry.listed,
            fields: entry.fields,
        }
    }
}

/// Validates one catalogue write: known display fields (strings of at most 2048 bytes, `price` a
/// non-negative integer, `null` to remove a field) and `listed` (a JSON boolean).
pub fn parse_update(body: &Value) -> ApiResult<CatalogUpdate> {
    let Value::Object(object) = body else {
        return Err(ApiError::bad_field(
            "body",
            "must be a JSON object with name, brand, price, image, imageUrl, url and/or listed",
        ));
    };
    let mut update = CatalogUpdate::default();
    for (key, value) in object {
        if key == LISTED {
            let Value::Bool(listed) = value else {
                return Err(ApiError::bad_field(
                    LISTED,
                    "must be true or false (a JSON boolean)",
                ));
            };
            update.listed = Some(*listed);
            continue;
        }
        if !FIELDS.contains(&key.as_str()) {
            return Err(ApiError::bad_field(
                key,
                format!("unknown field; use {}, {LISTED}", FIELDS.join(", ")),
            ));
        }
        match (key.as_str(), value) {
            ("price", Value::Number(n)) if n.as_u64().is_some() => {}
            ("price", Value::Null) => {}
            ("price", _) => {
                return Err(ApiError::bad_field(
                    "price",
                    "must be a non-negative integer (smallest unit)",
                ))
            }
            (_, Value::String(s)) if s.len() <= 2048 => {}
            (_, Value::Null) => {}
            (field, _) => {
                return Err(ApiError::bad_field(
                    field,
                    "must be a string of at most 2048 bytes",
                ))
            }
        }
        update.fields.insert(key.clone(), value.clone());
    }
    Ok(update)
}

fn parse_product(raw: &str) -> ApiResult<ProductId> {
    ProductId::parse(raw).map_err(|e| ApiError::bad_field("productId", e))
}

/// `PUT /v1/products/{productId}`: merges the body into the stored entry and answers the entry as
/// stored.
pub async fn put_product(
    State(state): State<Rankings>,
    Path(product): Path<String>,
    body: Bytes,
) -> ApiResult<Json<CatalogEntryBody>> {
    let product = parse_product(&product)?;
    // Parsed here rather than by axum's `Json` extractor, whose rejections are plain text (and 422 for a
    // wrong type) where every error must be a JSON 400 naming what is wrong.
    let body: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_field(
            "body",
            format!("not valid JSON ({e}); send an object with name, brand, price, image or listed"),
        )
    })?;
    let update = parse_update(&body)?;
    let written = state.service.put_catalog(vec![(product.clone(), update)]).await?;
    let entry = written
        .into_iter()
        .find(|(p, _)| *p == product)
        .map(|(_, entry)| entry)
        .unwrap_or_default();
    Ok(Json(CatalogEntryBody::of(&product, entry)))
}

/// `GET /v1/products/{productId}`: the stored entry, listing flag included; a product never written is
/// listed with no fields (it still ranks).
pub async fn get_product(
    State(state): State<Rankings>,
    Path(product): Path<String>,
) -> ApiResult<Json<CatalogEntryBody>> {
    let product = parse_product(&product)?;
    let entry = state.service.catalog_record(&product).unwrap_or_default();
    Ok(Json(CatalogEntryBody::of(&product, entry)))
}
