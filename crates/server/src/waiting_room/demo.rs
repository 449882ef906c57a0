//! The flash-sale scene of `rankgate demo` (issue 4). Filled in below.

/// What the flash-sale demo measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlashSaleReport {
    /// Members queued.
    pub members: usize,
}

/// Runs the flash-sale scene.
pub async fn run_flash_sale_demo(
    _data_dir: &std::path::Path,
    members: usize,
    _out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<FlashSaleReport> {
    Ok(FlashSaleReport { members })
}
