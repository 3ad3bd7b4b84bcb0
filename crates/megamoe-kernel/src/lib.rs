//! `megamoe-kernel` owns the MegaMoE CUDA kernels and everything that is specific to them: the
//! buffer protocol they share with the CPU dataflow engine ([`protocol`]: the symmetric buffer's
//! regions and peer table, the pool plan, a pool row's source, the capacity every rank agrees on),
//! the weight transforms from the canonical MXFP4 layout into each kernel's layout, the activation
//! pools' channel order ([`pool_order`]) that every pool writer follows, the JIT
//! specializations (`KernelSpec`s) and their launches: the Hopper grouped GEMM
//! (`cuda/sm90_moe_gemm.cuh`, [`gemm`], [`transform`]), one core per tensor-core route ([`gemm::Mma`])
//! and epilogue ([`epilogue`]: BF16 out, or the L1's SwiGLU into the L2 pool) and the engine of the
//! unfused and fused pipelines, the unfused pipeline's glue kernels ([`unfused`]) and the fused
//! forward, one persistent launch of the same device functions ([`fused`]); on request, every GEMM
//! tile's time as an event ([`timeline`]).

pub mod epilogue;
pub mod fused;
pub mod gemm;
pub mod pool_order;
pub mod problem;
pub mod protocol;
pub mod timeline;
pub mod transform;
pub mod unfused;

pub use epilogue::{Epilogue, SwigluOut};
pub use fused::FusedCore;
pub use gemm::{DeviceBytes, DeviceWeights, GemmCore, GemmError, Mma, Pool, Routes, TilePlan};
pub use protocol::{PeerLayout, PipelineShape, PoolPlan, ProtocolError, RowMeta};
pub use transform::{
    Fold, GemmWeights, RowOrder, TransformError, transform_l1_weights, transform_weights,
};
pub use unfused::{Pipeline, UnfusedError};

/// Every kernel specialization of this crate (the grouped GEMM's, the unfused pipeline's glue, the
/// fused forward's) and the ring wait's test kernel, for `cargo xtask kernels`.
pub fn kernels() -> Vec<cuda_rt::KernelSpec> {
    let mut specs = gemm::kernels();
    specs.extend(unfused::kernels());
    specs.extend(fused::kernels());
    specs.push(gemm::ring_wait_test_spec());
    specs
}

/// Device sources of this crate, for the JIT's in-memory include tree.
pub const CUDA_HEADERS: [(&str, &str); 6] = [
    ("sm90_ptx.cuh", include_str!("../cuda/sm90_ptx.cuh")),
    pool_order::CUDA_HEADER,
    (
        "sm90_moe_gemm.cuh",
        include_str!("../cuda/sm90_moe_gemm.cuh"),
    ),
    unfused::UNFUSED_HEADER,
    ("sm90_swiglu.cuh", include_str!("../cuda/sm90_swiglu.cuh")),
    ("timeline.cuh", include_str!("../cuda/timeline.cuh")),
];
/// `spec` with every header the grouped GEMM's sources include: this crate's, the barriers',
/// cuda-rt's and fp-formats'.
fn with_gemm_headers(spec: cuda_rt::KernelSpec) -> cuda_rt::KernelSpec {
    spec.headers(CUDA_HEADERS)
        .headers(barriers::CUDA_HEADERS)
        .header(cuda_rt::CUDA_HEADER)
        .header(fp_formats::CUDA_HEADER)
}
/// The grouped GEMM's entry point, specialized with `-DMM_BN` and `-DMM_FP8`.
pub const GEMM_SOURCE: (&str, &str) =
    ("sm90_moe_gemm.cu", include_str!("../cuda/sm90_moe_gemm.cu"));
