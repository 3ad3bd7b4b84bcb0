//! Helpers for GPU tests (the `#[ignore = "needs a CUDA GPU"]` ones) shared by every crate.

use crate::Gpu;

/// Environment variable: the number of GPUs a run promises (`cargo xtask test-multigpu` sets 2).
/// Under it, a test that needs more GPUs than the machine has fails instead of skipping.
pub const REQUIRE_GPUS_ENV: &str = "MEGAMOE_REQUIRE_GPUS";

/// Whether `needed` GPUs are present. If not, prints `SKIP: needs N GPUs, found M` (the line the
/// bundle's run.sh reports) and returns false — or panics when [`REQUIRE_GPUS_ENV`] promises at
/// least `needed`, so a multi-GPU run cannot pass by skipping. Panics without a driver or GPU.
pub fn gpus_or_skip(needed: usize) -> bool {
    let found = Gpu::count().unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    if found >= needed {
        return true;
    }
    let promised = std::env::var(REQUIRE_GPUS_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    if promised.is_some_and(|p| p >= needed) {
        panic!(
            "needs {needed} GPUs, found {found}, but {REQUIRE_GPUS_ENV} promises {}",
            promised.unwrap()
        );
    }
    eprintln!("SKIP: needs {needed} GPUs, found {found}");
    false
}
