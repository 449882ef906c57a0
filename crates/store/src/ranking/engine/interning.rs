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

#[cfg(test)]
mod tests {
    use super::super::test_support::{category, engine, hour, in_category, product, views};
    use super::*;

    #[test]
    fn interning_a_product_again_gives_its_first_index_and_stores_it_once() {
        let mut table = ProductTable::default();
        let ids = ["p1", "p2", "p1", "p3", "p2", "p1"].map(product);
        let indexes: Vec<ProductIdx> = ids.iter().map(|p| table.intern(p)).collect();
        assert_eq!(indexes, [0, 1, 0, 2, 1, 0]);
        assert_eq!(table.ids, ["p1", "p2", "p3"].map(product));
        // The per-product columns grow with the ids, so every index has its row.
        assert_eq!(table.categories.len(), 3);
        assert_eq!(table.cells.len(), 3);
        for (idx, id) in table.ids.iter().enumerate() {
            assert_eq!(table.index[id.as_str()] as usize, idx);
        }
    }

    #[test]
    fn category_table_holds_all_at_zero_and_finds_only_categories_it_has_seen() {
        let mut table = CategoryTable::new();
        assert_eq!(table.lookup(&CategoryOrAll::All), Some(ALL));
        assert_eq!(table.lookup(&in_category("shoes")), None);
        let shoes = table.intern(&category("shoes"));
        let hats = table.intern(&category("hats"));
        assert_eq!((shoes, hats), (1, 2));
        assert_eq!(table.intern(&category("shoes")), shoes);
        assert_eq!(table.lookup(&in_category("shoes")), Some(shoes));
        assert_eq!(table.lookup(&in_category("hats")), Some(hats));
        assert_eq!(
            table.names,
            [None, Some(category("shoes")), Some(category("hats"))]
        );
    }

    #[test]
    fn memberships_are_kept_once_each_way_however_often_they_are_applied() {
        let mut engine = engine();
        let (p1, p2) = (product("p1"), product("p2"));
        let (shoes, hats) = (category("shoes"), category("hats"));
        let membership = [(p1.clone(), shoes.clone())];
        engine.apply(&[], &membership, None);
        engine.apply(&[(hour(0), p2.clone(), views(1))], &membership, None);
        assert!(engine.has_membership(&p1, &shoes));
        assert!(!engine.has_membership(&p1, &hats));
        assert!(!engine.has_membership(&p2, &shoes));
        assert_eq!(engine.product_count(), 2);

        let (p1, shoes) = (
            engine.products.index["p1"],
            engine.categories.lookup(&in_category("shoes")).unwrap(),
        );
        let p2 = engine.products.index["p2"];
        assert_eq!(engine.products.categories[p1 as usize], [shoes]);
        assert_eq!(engine.products.members[&shoes], [p1]);
        assert!(engine.products.in_category(p1, shoes) && engine.products.in_category(p1, ALL));
        assert!(!engine.products.in_category(p2, shoes) && engine.products.in_category(p2, ALL));
    }

    #[test]
    fn indexes_never_move_as_products_and_categories_come_and_retention_drops_hours() {
        let mut engine = engine();
        let first: Vec<ProductId> = (0..50).map(|i| product(&format!("p{i}"))).collect();
        let deltas: Vec<_> = first
            .iter()
            .enumerate()
            .map(|(i, p)| (hour(i as i64), p.clone(), views(1)))
            .collect();
        engine.apply(&deltas, &[(first[7].clone(), category("c"))], None);
        let before: Vec<ProductIdx> = first.iter().map(|p| engine.products.index[p.as_str()]).collect();
        engine.evict_before(hour(40));
        engine.apply(&[(hour(45), product("new"), views(1))], &[], None);
        let after: Vec<ProductIdx> = first.iter().map(|p| engine.products.index[p.as_str()]).collect();
        assert_eq!(before, after);
        assert_eq!(engine.product_count(), 51);
        assert!(engine.has_membership(&first[7], &category("c")));
    }
}
