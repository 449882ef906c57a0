//! The coalescing counts against the seed lesson's own numbers for its flash sale (section 6.6).

use rankgate_bench::coalesce::{self, KeyScope};
use rankgate_workload::{flash_sale, FlashSaleConfig};

#[test]
fn flash_sale_coalescing_matches_the_seed() {
    let events = flash_sale(&FlashSaleConfig::default());
    assert_eq!(events.len(), 100_000);
    let counts = coalesce::compare(&events, &[1_000, 10_000], KeyScope::Categories);
    let writes: Vec<u64> = counts.iter().map(|c| c.zset_writes).collect();
    assert_eq!(writes, [100_000, 2_000, 200]);
    assert_eq!(counts[2].reduction, 500.0);
    let with_all = coalesce::compare(&events, &[1_000], KeyScope::CategoriesAndAll);
    assert_eq!(with_all[1].zset_writes, 4_000);
}
