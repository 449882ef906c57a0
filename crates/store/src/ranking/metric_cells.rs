//! How the SQLite source of truth keeps hourly metrics: packed cells, appended per batch and compacted
//! per hour (the encoding and the sums behind `metric_deltas` and `metrics_packed`, see [`super::sqlite`]).
//!
//! Why: a row per (hour, product) made every event of a spread-out workload one B-tree upsert (with
//! 20,000 products a 2,000-event batch touches ~1,900 rows, ~5,000 instructions each: a third of an
//! ingested event's cost, `bench/results/ingest-callgrind.md`). Now a batch appends its coalesced deltas
//! as **one** blob, and once the blobs hold enough cells they are folded, hour by hour, into one blob per
//! hour. Each cell is written about twice (once in its batch's blob, once per compaction that touches its
//! hour) and costs a few dozen instructions to encode, instead of a B-tree descent and insert.
//!
//! A **cell** is (hour, product, metrics). A blob is a sequence of cells, each: the hour as a zigzag
//! LEB128 varint difference from the previous cell's hour (the first from hour 0), the product's byte
//! length as a LEB128 varint and its UTF-8 bytes, then views, likes, units and sales as zigzag varints.
//! An hour blob holds one cell per product, sorted by product; a batch blob the batch's coalesced deltas
//! in the order they came. Sums are checked: an overflow is corruption, never a wrap (SPEC 1.2).

use std::collections::{BTreeMap, HashMap};

use rankgate_core::ids::ProductId;
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Hour;

/// Appends one cell to `out`; `previous_hour` is the hour of the cell before it in the same blob (0 for
/// the first) and becomes this one's.
pub fn push_cell(out: &mut Vec<u8>, previous_hour: &mut i64, hour: Hour, product: &str, metrics: &Metrics) {
    push_signed(out, hour.0.wrapping_sub(*previous_hour));
    *previous_hour = hour.0;
    push_unsigned(out, product.len() as u64);
    out.extend_from_slice(product.as_bytes());
    for value in [metrics.views, metrics.likes, metrics.units, metrics.sales] {
        push_signed(out, value);
    }
}

/// Calls `visit` with every cell of `blob`, in order. Errors name the byte where the blob stops making
/// sense (a cut-off varint, a product running past the end, a product that is not UTF-8).
pub fn visit_cells(
    blob: &[u8],
    mut visit: impl FnMut(Hour, &str, Metrics) -> Result<(), String>,
) -> Result<usize, String> {
    let mut reader = Reader { blob, at: 0 };
    let (mut hour, mut cells) = (0i64, 0usize);
    while reader.at < blob.len() {
        hour = hour.wrapping_add(reader.signed()?);
        let length = usize::try_from(reader.unsigned()?).map_err(|_| reader.error("a product length"))?;
        let start = reader.at;
        let end = start
            .checked_add(length)
            .filter(|&end| end <= blob.len())
            .ok_or_else(|| reader.error("a product that runs past the end"))?;
        let product = std::str::from_utf8(&blob[start..end])
            .map_err(|_| reader.error("a product that is not UTF-8"))?;
        reader.at = end;
        let metrics = Metrics {
            views: reader.signed()?,
            likes: reader.signed()?,
            units: reader.signed()?,
            sales: reader.signed()?,
        };
        visit(Hour(hour), product, metrics)?;
        cells += 1;
    }
    Ok(cells)
}

fn push_unsigned(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn push_signed(out: &mut Vec<u8>, value: i64) {
    push_unsigned(out, ((value << 1) ^ (value >> 63)) as u64);
}

struct Reader<'a> {
    blob: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn error(&self, what: &str) -> String {
        format!(
            "{what} at byte {} of a {}-byte metrics blob",
            self.at,
            self.blob.len()
        )
    }

    fn unsigned(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .blob
                .get(self.at)
                .ok_or_else(|| self.error("a cut-off number"))?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.error("a number longer than 64 bits"))
    }

    fn signed(&mut self) -> Result<i64, String> {
        let raw = self.unsigned()?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }
}

/// Sums of cells by hour and product: the deltas of many batch blobs on their way into hour blobs, or
/// into a load's rows. Cells below a floor (metric retention) are dropped as they come.
#[derive(Debug, Default)]
pub struct CellSums {
    by_hour: BTreeMap<Hour, HashMap<ProductId, Metrics>>,
    floor: Option<Hour>,
}

impl CellSums {
    /// Sums that ignore every cell of an hour before `floor`.
    pub fn above(floor: Option<Hour>) -> CellSums {
        CellSums {
            by_hour: BTreeMap::new(),
            floor,
        }
    }

    /// Adds every cell of `blob`.
    pub fn add_blob(&mut self, blob: &[u8]) -> Result<(), String> {
        visit_cells(blob, |hour, product, metrics| self.add(hour, product, &metrics))?;
        Ok(())
    }

    /// Adds one cell (checked: an overflow is an error).
    pub fn add(&mut self, hour: Hour, product: &str, metrics: &Metrics) -> Result<(), String> {
        if self.floor.is_some_and(|floor| hour < floor) {
            return Ok(());
        }
        let products = self.by_hour.entry(hour).or_default();
        let sum = match products.get_mut(product) {
            Some(sum) => sum,
            None => {
                let product = ProductId::parse(product).map_err(|e| format!("a stored product: {e}"))?;
                products.entry(product).or_default()
            }
        };
        *sum = sum
            .checked_add(metrics)
            .ok_or_else(|| format!("the metrics of {product} at hour {} overflow 64 bits", hour.0))?;
        Ok(())
    }

    /// The hours with at least one cell, ascending.
    #[cfg(test)]
    fn hours(&self) -> Vec<Hour> {
        self.by_hour.keys().copied().collect()
    }

    /// Removes and returns every hour before `hour` (every hour for `None`), ascending.
    pub fn take_before(&mut self, hour: Option<Hour>) -> Vec<(Hour, HashMap<ProductId, Metrics>)> {
        let rest = match hour {
            Some(hour) => self.by_hour.split_off(&hour),
            None => BTreeMap::new(),
        };
        std::mem::replace(&mut self.by_hour, rest).into_iter().collect()
    }

    /// Removes and returns one hour's sums.
    pub fn take_hour(&mut self, hour: Hour) -> HashMap<ProductId, Metrics> {
        self.by_hour.remove(&hour).unwrap_or_default()
    }
}

/// The cells of hour blob `stored` (of `hour`; empty for none) with `deltas` folded in, then the deltas
/// of products it lacks: one sum per product, in no particular order.
pub fn folded_hour(
    hour: Hour,
    stored: &[u8],
    mut deltas: HashMap<ProductId, Metrics>,
) -> Result<Vec<(ProductId, Metrics)>, String> {
    let mut cells: Vec<(ProductId, Metrics)> = Vec::with_capacity(deltas.len());
    visit_cells(stored, |stored_hour, product, metrics| {
        if stored_hour != hour {
            return Err(format!(
                "an hour blob of hour {} holds a cell of hour {}",
                hour.0, stored_hour.0
            ));
        }
        let product = ProductId::parse(product).map_err(|e| format!("a stored product: {e}"))?;
        let metrics = match deltas.remove(&product) {
            Some(delta) => metrics
                .checked_add(&delta)
                .ok_or_else(|| format!("the metrics of {product} at hour {} overflow 64 bits", hour.0))?,
            None => metrics,
        };
        cells.push((product, metrics));
        Ok(())
    })?;
    cells.extend(deltas);
    Ok(cells)
}

/// One hour's blob with `deltas` folded in ([`folded_hour`]), a cell per product sorted by product.
/// Returns the blob and its cell count.
pub fn merge_hour(
    hour: Hour,
    stored: &[u8],
    deltas: HashMap<ProductId, Metrics>,
) -> Result<(Vec<u8>, usize), String> {
    let mut cells = folded_hour(hour, stored, deltas)?;
    cells.sort_unstable_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    let mut blob = Vec::with_capacity(cells.len() * 24);
    let mut previous = 0;
    for (product, metrics) in &cells {
        push_cell(&mut blob, &mut previous, hour, product.as_str(), metrics);
    }
    Ok((blob, cells.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cells_of(blob: &[u8]) -> Vec<(i64, String, Metrics)> {
        let mut out = Vec::new();
        visit_cells(blob, |hour, product, metrics| {
            out.push((hour.0, product.to_string(), metrics));
            Ok(())
        })
        .unwrap();
        out
    }

    proptest! {
        #[test]
        fn cells_round_trip(cells in proptest::collection::vec(
            (any::<i64>(), "[a-z0-9-]{1,12}", any::<i64>(), any::<i64>(), any::<i64>(), any::<i64>()), 0..40)
        ) {
            let mut blob = Vec::new();
            let mut previous = 0;
            for (hour, product, views, likes, units, sales) in &cells {
                push_cell(&mut blob, &mut previous, Hour(*hour), product,
                    &Metrics { views: *views, likes: *likes, units: *units, sales: *sales });
            }
            let read = cells_of(&blob);
            prop_assert_eq!(read.len(), cells.len());
            for ((hour, product, m), (h, p, v, l, u, s)) in read.iter().zip(&cells) {
                prop_assert_eq!((hour, product.as_str()), (h, p.as_str()));
                prop_assert_eq!((m.views, m.likes, m.units, m.sales), (*v, *l, *u, *s));
            }
        }

        #[test]
        fn a_cut_blob_is_an_error_never_a_panic(cut in 0usize..64) {
            let mut blob = Vec::new();
            let mut previous = 0;
            let m = Metrics { views: 300, likes: -2, units: 1 << 40, sales: i64::MIN };
            push_cell(&mut blob, &mut previous, Hour(495_000), "sku-0001", &m);
            let first = blob.len();
            push_cell(&mut blob, &mut previous, Hour(494_990), "sku-0002", &m);
            let cut = cut.min(blob.len());
            let whole_cells = [0, first, blob.len()];
            let result = visit_cells(&blob[..cut], |_, _, _| Ok(()));
            prop_assert_eq!(result.is_ok(), whole_cells.contains(&cut));
        }
    }

    #[test]
    fn merging_folds_deltas_into_the_stored_hour_sorted_by_product() {
        let hour = Hour(490_000);
        let one = |views| Metrics {
            views,
            ..Metrics::default()
        };
        let mut sums = CellSums::above(Some(Hour(480_000)));
        sums.add(hour, "b", &one(2)).unwrap();
        sums.add(hour, "a", &one(1)).unwrap();
        sums.add(hour, "b", &one(5)).unwrap();
        sums.add(Hour(479_999), "old", &one(9)).unwrap();
        assert_eq!(sums.hours(), [hour]);
        let (stored, count) = merge_hour(hour, &[], sums.take_hour(hour)).unwrap();
        assert_eq!(count, 2);
        let mut more = HashMap::new();
        more.insert(ProductId::parse("c").unwrap(), one(3));
        more.insert(ProductId::parse("a").unwrap(), one(10));
        let (merged, count) = merge_hour(hour, &stored, more).unwrap();
        assert_eq!(count, 3);
        let read: Vec<(String, i64)> = cells_of(&merged)
            .into_iter()
            .map(|(_, p, m)| (p, m.views))
            .collect();
        assert_eq!(
            read,
            [("a".to_string(), 11), ("b".to_string(), 7), ("c".to_string(), 3)]
        );
        assert!(
            merge_hour(Hour(1), &stored, HashMap::new()).is_err(),
            "a blob of another hour"
        );
    }

    #[test]
    fn an_overflowing_sum_is_an_error() {
        let mut sums = CellSums::default();
        let max = Metrics {
            sales: i64::MAX,
            ..Metrics::default()
        };
        sums.add(Hour(1), "p", &max).unwrap();
        assert!(sums.add(Hour(1), "p", &max).is_err());
    }
}
