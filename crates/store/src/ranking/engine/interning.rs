//! Products and categories as dense `u32` indexes: every other part keys its maps by them, so a hot map
//! hashes a `u32` rather than a string, and a product id is stored once.
//!
//! [`ProductTable`] also holds what the engine knows per product besides its id: the categories it was
//! seen in (and the inverse, each category's products), its hourly cells by hour (`trending` re-scores
//! from them) and whether the catalogue delisted it. Indexes are never reused or removed: a product seen
//! once keeps its index for the engine's life, which is what lets spans, builds and carry days refer to
//! it by index alone.

use std::collections::BTreeMap;

use hashbrown::{HashMap, HashSet};

use rankgate_core::ids::{Category, CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;

use super::RankingEngine;

/// Dense index of a product in the engine's tables.
pub(super) type ProductIdx = u32;
/// Dense index of a category; 0 is `all`.
pub(super) type CatIdx = u32;
/// The index of `all`, which every product belongs to.
pub(super) const ALL: CatIdx = 0;

/// Every product the engine has seen, by [`ProductIdx`].
#[derive(Debug, Default, Clone)]
pub(super) struct ProductTable {
    /// Index → id: sorted-set members and answers need the id itself.
    pub(super) ids: Vec<ProductId>,
    /// Id → index, the one lookup by string, done once per delta or per product asked about.
    pub(super) index: HashMap<Box<str>, ProductIdx>,
    /// Categories (never `ALL`) each product belongs to: the union of every category seen.
    pub(super) categories: Vec<Vec<CatIdx>>,
    /// The inverse: products of each category, so small categories are summed product by product.
    pub(super) members: HashMap<CatIdx, Vec<ProductIdx>>,
    /// Each product's hourly cells by hour, ascending (a copy of its cells in
    /// [`RankingEngine::hours`]): `trending` re-scores a product from all its hours in a span without
    /// scanning the span's other products or looking each hour up.
    pub(super) cells: Vec<BTreeMap<Hour, Metrics>>,
    /// Products the catalogue delisted: in no ranking, whatever their metrics.
    pub(super) delisted: HashSet<ProductIdx>,
}

impl ProductTable {
    /// `product`'s index, giving it the next one (with no categories and no cells) when it is new.
    pub(super) fn intern(&mut self, product: &ProductId) -> ProductIdx {
        if let Some(&idx) = self.index.get(product.as_str()) {
            return idx;
        }
        let idx = ProductIdx::try_from(self.ids.len()).expect("fewer than 2^32 products");
        self.ids.push(product.clone());
        self.index.insert(product.as_str().into(), idx);
        self.categories.push(Vec::new());
        self.cells.push(BTreeMap::new());
        idx
    }

    /// Whether `product` counts in `category`'s rankings (every product counts in `all`).
    pub(super) fn in_category(&self, product: ProductIdx, category: CatIdx) -> bool {
        category == ALL || self.categories[product as usize].contains(&category)
    }

    /// Whether `product` may appear in rankings (the catalogue has not delisted it).
    pub(super) fn is_shown(&self, product: ProductIdx) -> bool {
        !self.delisted.contains(&product)
    }
}

/// Every category the engine has seen, by [`CatIdx`]; [`ALL`] is there from the start.
#[derive(Debug, Default, Clone)]
pub(super) struct CategoryTable {
    /// Index → name; `None` at [`ALL`], which is no category of its own.
    pub(super) names: Vec<Option<Category>>,
    /// Name → index. `all` is not in it: [`CategoryTable::lookup`] maps it to [`ALL`].
    pub(super) index: HashMap<Box<str>, CatIdx>,
}

impl CategoryTable {
    /// A table holding only [`ALL`].
    pub(super) fn new() -> CategoryTable {
        CategoryTable {
            names: vec![None],
            index: HashMap::new(),
        }
    }

    /// `category`'s index, giving it the next one when it is new.
    pub(super) fn intern(&mut self, category: &Category) -> CatIdx {
        if let Some(&idx) = self.index.get(category.as_str()) {
            return idx;
        }
        let idx = CatIdx::try_from(self.names.len()).expect("fewer than 2^32 categories");
        self.names.push(Some(category.clone()));
        self.index.insert(category.as_str().into(), idx);
        idx
    }

    /// The index a read asks for, `None` for a category never seen (whose rankings are empty).
    pub(super) fn lookup(&self, category: &CategoryOrAll) -> Option<CatIdx> {
        match category {
            CategoryOrAll::All => Some(ALL),
            CategoryOrAll::Category(category) => self.index.get(category.as_str()).copied(),
        }
    }
}

impl RankingEngine {
    /// Number of products ever seen.
    pub fn product_count(&self) -> usize {
        self.products.ids.len()
    }

    /// Whether `product` is already known to belong to `category`.
    pub fn has_membership(&self, product: &ProductId, category: &Category) -> bool {
        let (Some(&p), Some(&c)) = (
            self.products.index.get(product.as_str()),
            self.categories.index.get(category.as_str()),
        ) else {
            return false;
        };
        self.products.categories[p as usize].contains(&c)
    }
}
