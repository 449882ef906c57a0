//! The four metrics an event changes, per (UTC hour, product): the source of truth's unit of account.
//!
//! Metrics say what happened; weights are policy and never live here (SPEC 1.2).

use serde::{Deserialize, Serialize};

/// Net counts for one product over some set of hours.
///
/// All fields are signed: likes are net of unlikes and refunds subtract, so any of them can go negative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Metrics {
    /// `product_viewed` events.
    pub views: i64,
    /// `product_liked` minus `product_unliked`.
    pub likes: i64,
    /// Units paid minus units refunded.
    pub units: i64,
    /// price × quantity paid minus refunded, in the currency's smallest unit.
    pub sales: i64,
}

impl Metrics {
    /// Adds `other`, or returns `None` if any field would overflow. Sums never wrap (SPEC 1.2).
    #[must_use]
    pub fn checked_add(&self, other: &Metrics) -> Option<Metrics> {
        Some(Metrics {
            views: self.views.checked_add(other.views)?,
            likes: self.likes.checked_add(other.likes)?,
            units: self.units.checked_add(other.units)?,
            sales: self.sales.checked_add(other.sales)?,
        })
    }

    /// Subtracts `other`, or returns `None` on overflow.
    #[must_use]
    pub fn checked_sub(&self, other: &Metrics) -> Option<Metrics> {
        Some(Metrics {
            views: self.views.checked_sub(other.views)?,
            likes: self.likes.checked_sub(other.likes)?,
            units: self.units.checked_sub(other.units)?,
            sales: self.sales.checked_sub(other.sales)?,
        })
    }

    /// True when every metric is zero, i.e. the row carries no information.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        *self == Metrics::default()
    }
}
