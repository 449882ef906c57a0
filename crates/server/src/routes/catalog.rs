//! Catalogue enrichment: `PUT /v1/products/{productId}` (SPEC 1.5).
//!
//! The catalogue only decorates rankings; unknown products still rank.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{Map, Value};

use rankgate_core::ids::ProductId;

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};

/// Fields a catalogue entry may carry; others are refused so typos are caught.
const FIELDS: [&str; 6] = ["name", "brand", "price", "image", "imageUrl", "url"];

/// Validates one catalogue entry and keeps only its known fields.
pub fn parse_entry(body: &Value) -> ApiResult<Value> {
    let Value::Object(object) = body else {
        return Err(ApiError::bad_field(
            "body",
            "must be a JSON object with name, brand, price and image",
        ));
    };
    let mut entry = Map::new();
    for (key, value) in object {
        if !FIELDS.contains(&key.as_str()) {
            return Err(ApiError::bad_field(
                key,
                format!("unknown field; use {}", FIELDS.join(", ")),
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
        entry.insert(key.clone(), value.clone());
    }
    Ok(Value::Object(entry))
}

/// `PUT /v1/products/{productId}`
pub async fn put_product(
    State(state): State<AppState>,
    Path(product): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let product = ProductId::parse(&product).map_err(|e| ApiError::bad_field("productId", e))?;
    // Parsed here rather than by axum's `Json` extractor, whose rejections are plain text (and 422 for a
    // wrong type) where every error must be a JSON 400 naming what is wrong.
    let body: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_field(
            "body",
            format!("not valid JSON ({e}); send an object with name, brand, price and image"),
        )
    })?;
    let entry = parse_entry(&body)?;
    state
        .rankings
        .put_catalog(vec![(product.clone(), entry.clone())])
        .await?;
    let mut answer = entry;
    answer["productId"] = Value::String(product.as_str().to_string());
    Ok(Json(answer))
}
