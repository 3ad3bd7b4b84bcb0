//! `barriers`: the synchronisation of the fused MegaMoE kernel, as a device header with its host
//! side. A grid barrier on one 64-bit phase/count word (reusable without reset), a cross-rank
//! barrier through symmetric memory (epoch signals, one slot per rank, release/acquire at system
//! scope) that gives up after a timeout and records the missing rank in an error word instead of
//! hanging, and the grid-wide combination of the two. DESIGN §2–3.
//!
//! | item | owns |
//! |---|---|
//! | [`CUDA_HEADER`] | `cuda/barriers.cuh`: `grid_barrier`, `rank_barrier`, `grid_rank_barrier` (include it with [`CUDA_HEADERS`]) |
//! | [`BarrierWords`] | where the grid word, the signals and the error word sit in a symmetric buffer |
//! | [`error`] | the error word's bit layout (cross-rank barrier and in-kernel wait timeouts), [`BarrierError`], [`LocalWait`] and [`check_error_word`] |
//! | [`kernels`], [`testkit`] | `cuda/barriers_test.cu`: the kernels of the GPU tests and the benchmark, and their launchers |
//!
//! GPU tests: `tests/gpu.rs` (ignored without a GPU; the 2-GPU ones print `SKIP:` on one GPU).
//! Benchmark: `benches/barriers.rs`.

pub mod error;
pub mod testkit;

use std::time::Duration;

use cuda_rt::{Header, KernelSpec};
use symm_mem::MAX_RANKS;

pub use error::{BarrierError, LocalWait, check_error_word};

/// The device header (`#include "barriers.cuh"`); it includes `symm_buffer.cuh`.
pub const CUDA_HEADER: Header = ("barriers.cuh", include_str!("../cuda/barriers.cuh"));

/// Every header a kernel including `barriers.cuh` needs.
pub const CUDA_HEADERS: [Header; 2] = [symm_mem::CUDA_HEADER, CUDA_HEADER];

/// The test and benchmark kernels.
pub const TEST_SOURCE: Header = ("barriers_test.cu", include_str!("../cuda/barriers_test.cu"));

/// A cross-rank barrier's timeout that no healthy run reaches, yet fails a lost rank quickly.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The registry entry (`cargo xtask kernels`): all of `barriers_test.cu`, spill-free.
pub fn kernels() -> Vec<KernelSpec> {
    vec![
        KernelSpec::new("barriers/test", TEST_SOURCE)
            .no_spill()
            .headers(CUDA_HEADERS),
    ]
}

/// Byte offsets of the barrier words in a symmetric buffer, the same on every rank. The words start
/// zeroed and are never reset while the ranks stay in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarrierWords {
    /// The u64 phase/count word of the grid barrier.
    pub grid: u64,
    /// `[num_ranks]` u64 epochs; slot s is written by rank s only.
    pub signals: u64,
    /// The u64 error word.
    pub error: u64,
}

impl BarrierWords {
    /// The words in the [`Self::LEADING_BYTES`] bytes from `offset` of the buffer (a multiple of
    /// 128 the caller sets aside for them), each kind on its own 128-byte lines.
    pub const fn at(offset: u64) -> Self {
        Self {
            grid: offset,
            error: offset + 128,
            signals: offset + 256,
        }
    }

    /// The words at the start of a buffer of their own (tests, benchmarks); anything else may
    /// start at [`Self::LEADING_BYTES`].
    pub const LEADING: Self = Self::at(0);
    pub const LEADING_BYTES: u64 = 1024;
}

const _: () = assert!(
    BarrierWords::LEADING.signals + 8 * MAX_RANKS as u64 <= BarrierWords::LEADING_BYTES,
    "the leading words must hold a signal for every rank"
);
