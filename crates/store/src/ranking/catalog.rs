//! Catalogue entries: what a shop says about a product (SPEC 1.5) — its display fields, which decorate
//! ranking items, and whether it is **listed** at all.
//!
//! A delisted product (`"listed": false`) is left out of every ranking while its metrics keep counting;
//! relisting shows it again with everything it accumulated meanwhile. The flag is the one part of the
//! catalogue that changes rankings, so it is state of the whole fleet like policy versions: stored in the
//! source of truth, carried to every instance by the change feed ([`Changes`](super::source::Changes)),
//! and applied by the engine ([`RankingEngine::set_listed`](super::engine::RankingEngine::set_listed)),
//! the batch recompute and `rankgate verify` alike.
//!
//! # Merge rule
//! A catalogue write is a [`CatalogUpdate`], merged into the stored entry in the source of truth's
//! transaction ([`CatalogEntry::merged`]), like a JSON merge patch (RFC 7386) on a flat object: a field
//! given with a value replaces the stored one, a field given as `null` removes it, a field not given keeps
//! its stored value; `listed` given sets the flag, not given keeps it (a new product is listed). So
//! `{"listed": false}` alone hides a product without erasing its name, and two instances writing different
//! fields of one product at once both land.

use std::collections::HashMap;

use serde_json::{Map, Value};

use rankgate_core::ids::ProductId;

/// A product's stored catalogue entry.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogEntry {
    /// Display fields (name, brand, price, image, imageUrl, url), as the shop gave them; never `null`.
    pub fields: Map<String, Value>,
    /// `false` hides the product from every ranking.
    pub listed: bool,
}

impl Default for CatalogEntry {
    /// A product nobody described: no fields, listed.
    fn default() -> CatalogEntry {
        CatalogEntry {
            fields: Map::new(),
            listed: true,
        }
    }
}

/// One catalogue write: the fields and flag it gives (see the module docs for how it merges).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CatalogUpdate {
    /// Fields to set; a `null` value removes the field.
    pub fields: Map<String, Value>,
    /// The listing flag, when given.
    pub listed: Option<bool>,
}

impl CatalogEntry {
    /// This entry with `update` merged in (the module's merge rule).
    #[must_use]
    pub fn merged(mut self, update: &CatalogUpdate) -> CatalogEntry {
        for (field, value) in &update.fields {
            if value.is_null() {
                self.fields.remove(field);
            } else {
                self.fields.insert(field.clone(), value.clone());
            }
        }
        if let Some(listed) = update.listed {
            self.listed = listed;
        }
        self
    }

    /// The display fields as one JSON object (`{}` when there are none), as stored.
    #[must_use]
    pub fn fields_json(&self) -> String {
        Value::Object(self.fields.clone()).to_string()
    }

    /// Reads an entry back from its stored parts: the fields' JSON object and the flag.
    pub fn from_stored(fields_json: &str, listed: bool) -> Result<CatalogEntry, String> {
        match serde_json::from_str(fields_json) {
            Ok(Value::Object(fields)) => Ok(CatalogEntry { fields, listed }),
            Ok(other) => Err(format!("expected a JSON object, got {other}")),
            Err(error) => Err(error.to_string()),
        }
    }
}

/// Merges `updates` in order into the entries `stored` looks up (the stored entry of a product, or
/// `None` for one never written), and returns each product's resulting entry once, in the order products
/// first appear: what a source of truth writes back. A product named twice gets both updates, in order.
pub fn merge_updates<E>(
    updates: &[(ProductId, CatalogUpdate)],
    mut stored: impl FnMut(&ProductId) -> Result<Option<CatalogEntry>, E>,
) -> Result<Vec<(ProductId, CatalogEntry)>, E> {
    let mut merged: Vec<(ProductId, CatalogEntry)> = Vec::new();
    let mut position: HashMap<&ProductId, usize> = HashMap::new();
    for (product, update) in updates {
        match position.get(product) {
            Some(&index) => {
                let entry = std::mem::take(&mut merged[index].1);
                merged[index].1 = entry.merged(update);
            }
            None => {
                let entry = stored(product)?.unwrap_or_default().merged(update);
                position.insert(product, merged.len());
                merged.push((product.clone(), entry));
            }
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!("test literals are objects"),
        }
    }

    #[test]
    fn listed_alone_keeps_every_field_and_fields_alone_keep_the_flag() {
        let stored = CatalogEntry::default().merged(&CatalogUpdate {
            fields: object(json!({"name": "Kettle", "price": 1999})),
            listed: None,
        });
        assert!(stored.listed, "a new product is listed");
        let hidden = stored.clone().merged(&CatalogUpdate {
            fields: Map::new(),
            listed: Some(false),
        });
        assert_eq!(hidden.fields, stored.fields);
        assert!(!hidden.listed);
        let renamed = hidden.merged(&CatalogUpdate {
            fields: object(json!({"name": "Kettle 2", "price": null, "brand": "Acme"})),
            listed: None,
        });
        assert_eq!(
            Value::Object(renamed.fields.clone()),
            json!({"name": "Kettle 2", "brand": "Acme"})
        );
        assert!(
            !renamed.listed,
            "a write without listed keeps the product delisted"
        );
    }

    #[test]
    fn a_product_named_twice_gets_both_updates_in_order() {
        let product = ProductId::parse("p1").unwrap();
        let updates = [
            (
                product.clone(),
                CatalogUpdate {
                    fields: object(json!({"name": "A"})),
                    listed: Some(false),
                },
            ),
            (
                product.clone(),
                CatalogUpdate {
                    fields: object(json!({"brand": "B"})),
                    listed: None,
                },
            ),
        ];
        let mut lookups = 0;
        let merged = merge_updates(&updates, |_| {
            lookups += 1;
            Ok::<_, ()>(None)
        })
        .unwrap();
        assert_eq!(lookups, 1);
        assert_eq!(merged.len(), 1);
        assert_eq!(
            Value::Object(merged[0].1.fields.clone()),
            json!({"name": "A", "brand": "B"})
        );
        assert!(!merged[0].1.listed);
    }

    #[test]
    fn stored_parts_round_trip() {
        let entry = CatalogEntry {
            fields: object(json!({"name": "Lamp", "price": 5})),
            listed: false,
        };
        assert_eq!(CatalogEntry::from_stored(&entry.fields_json(), false), Ok(entry));
        assert!(CatalogEntry::from_stored("[1]", true).is_err());
        assert!(CatalogEntry::from_stored("{", true).is_err());
    }
}
