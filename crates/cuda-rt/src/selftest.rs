//! The kernels cuda-rt tests itself with on a GPU (`tests/gpu.rs`); `cargo xtask kernels` compiles them
//! with everything else.

use crate::{CUDA_HEADER, Header, KernelSpec};

pub const SOURCE: Header = ("selftest.cu", include_str!("../cuda/selftest.cu"));

/// The `tma_load_2d` tile: f32 rows × columns.
pub const TMA_BOX: [u32; 2] = [16, 32];

/// One spec: the whole file, every entry function must stay spill-free.
pub fn kernels() -> Vec<KernelSpec> {
    vec![
        KernelSpec::new("cuda-rt/selftest", SOURCE)
            .header(CUDA_HEADER)
            .define("TMA_BOX_ROWS", TMA_BOX[0])
            .define("TMA_BOX_COLS", TMA_BOX[1])
            .no_spill(),
    ]
}
