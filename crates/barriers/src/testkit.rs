//! Host side of `cuda/barriers_test.cu`, shared by the GPU tests and the benchmark: loading the
//! kernels and running them on one rank's buffer laid out as [`BarrierWords::LEADING`] followed by
//! the data the checked rounds exchange.

use std::time::Duration;

use cuda_rt::{Gpu, GpuTimer, Jit, LaunchConfig, Module, Result};
use symm_mem::SymmBuffer;

use crate::{BarrierError, BarrierWords, check_error_word, kernels};

/// Threads per block of every barrier kernel launched here.
pub const THREADS: u32 = 128;

/// `barriers_test.cu`, compiled for one GPU and loaded.
#[derive(Debug)]
pub struct TestKernels {
    module: Module,
}

/// What one rank's [`TestKernels::rank_barrier_rounds`] left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankRun {
    /// Words that differed from what their writer wrote, over all rounds.
    pub mismatches: u32,
    /// The first round with a mismatch (`u32::MAX`: none).
    pub first_bad_round: u32,
    /// Rounds whose barrier succeeded.
    pub completed: u32,
    pub error: Result<(), BarrierError>,
    /// This rank's signal slots afterwards, by rank.
    pub signals: Vec<u64>,
    /// Kernel time on the device.
    pub elapsed: Duration,
}

/// Bytes of a buffer for [`TestKernels::rank_barrier_rounds`] with `words` words per block.
pub fn buffer_bytes(num_ranks: usize, blocks: u32, words: u32) -> usize {
    BarrierWords::LEADING_BYTES as usize + 8 * num_ranks * blocks as usize * words as usize
}

/// `n` u64 words at device address `ptr`.
///
/// # Safety
/// `[ptr, ptr + 8n)` must be `gpu`'s (or a peer's mapped) live memory.
pub unsafe fn read_u64s(gpu: &Gpu, ptr: u64, n: usize) -> Result<Vec<u64>> {
    let mut bytes = vec![0u8; 8 * n];
    // SAFETY: the caller's contract.
    unsafe { gpu.read_raw(ptr, &mut bytes)? };
    Ok(bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect())
}

impl TestKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let arch = gpu.info().arch().ok_or(cuda_rt::Error::InvalidModule(
            "no compile target for this GPU's compute capability",
        ))?;
        let compiled = Jit::new()?.compile(&kernels()[0], arch)?;
        Ok(Self {
            module: gpu.load_module(&compiled.cubin)?,
        })
    }

    /// Runs `rounds` grid-wide cross-rank barriers as the rank `view` describes (its buffer laid out
    /// for [`buffer_bytes`]`(num_ranks, blocks, words)` on every rank), on a cooperative grid of
    /// `blocks` blocks; before each barrier every block writes `words` words into every rank, after
    /// it checks what every rank wrote (`words` = 0: the barrier alone). Waits for the kernel.
    pub fn rank_barrier_rounds(
        &self,
        gpu: &Gpu,
        view: &SymmBuffer,
        blocks: u32,
        words: u32,
        rounds: u32,
        timeout: Duration,
    ) -> Result<RankRun> {
        let kernel = self.module.kernel("rank_barrier_rounds")?;
        let at = BarrierWords::LEADING;
        let base = view.base;
        let d_view = gpu.upload(bytemuck::bytes_of(view))?;
        let mut result = gpu.upload(&[0u32, u32::MAX, 0])?;
        let timer = GpuTimer::new(gpu)?;
        timer.start(gpu.stream())?;
        // SAFETY: rank_barrier_rounds(view, grid word, signals, error word, data, words, rounds,
        // timeout, result[3]) over buffers of buffer_bytes(num_ranks, blocks, words) bytes.
        unsafe {
            kernel
                .launch(
                    gpu.stream(),
                    LaunchConfig::linear(blocks, THREADS).cooperative(),
                )
                .ptr(&d_view)
                .scalar(base + at.grid)
                .scalar(base + at.signals)
                .scalar(base + at.error)
                .scalar(base + BarrierWords::LEADING_BYTES)
                .scalar(words)
                .scalar(rounds)
                .scalar(timeout.as_nanos().min(u128::from(u64::MAX)) as u64)
                .ptr_mut(&mut result)
                .launch()?;
        }
        timer.stop(gpu.stream())?;
        let result = gpu.download(&result)?;
        // SAFETY: the barrier words of this rank's live buffer.
        let (error, signals) = unsafe {
            (
                read_u64s(gpu, base + at.error, 1)?[0],
                read_u64s(gpu, base + at.signals, view.num_ranks as usize)?,
            )
        };
        Ok(RankRun {
            mismatches: result[0],
            first_bad_round: result[1],
            completed: result[2],
            error: check_error_word(error),
            signals,
            elapsed: Duration::from_secs_f64(f64::from(timer.elapsed_ms()?) / 1e3),
        })
    }

    /// Device time of `rounds` bare grid barriers on a cooperative grid of `blocks` blocks.
    pub fn grid_barrier_loop(&self, gpu: &Gpu, blocks: u32, rounds: u32) -> Result<Duration> {
        let kernel = self.module.kernel("grid_barrier_loop")?;
        let mut word = gpu.alloc_zeros::<u64>(1)?;
        let timer = GpuTimer::new(gpu)?;
        timer.start(gpu.stream())?;
        // SAFETY: grid_barrier_loop(word, rounds).
        unsafe {
            kernel
                .launch(
                    gpu.stream(),
                    LaunchConfig::linear(blocks, THREADS).cooperative(),
                )
                .ptr_mut(&mut word)
                .scalar(rounds)
                .launch()?;
        }
        timer.stop(gpu.stream())?;
        Ok(Duration::from_secs_f64(
            f64::from(timer.elapsed_ms()?) / 1e3,
        ))
    }

    /// Queues `copy16`: `bytes` (a multiple of 16) from `src` to `dst` with 16-byte loads and stores
    /// by `blocks` × 512 threads of `gpu`.
    ///
    /// # Safety
    /// Both ranges must be live memory `gpu` can access (its own, or a peer's with access enabled),
    /// not in use by other work.
    pub unsafe fn copy16(
        &self,
        gpu: &Gpu,
        src: u64,
        dst: u64,
        bytes: u64,
        blocks: u32,
    ) -> Result<()> {
        let kernel = self.module.kernel("copy16")?;
        // SAFETY: copy16(src, dst, n) over n 16-byte words; the caller's contract for the ranges.
        unsafe {
            kernel
                .launch(gpu.stream(), LaunchConfig::linear(blocks, 512))
                .scalar(src)
                .scalar(dst)
                .scalar(bytes / 16)
                .launch()
        }
    }

    /// The loaded module, for kernels without a launcher here.
    pub fn module(&self) -> &Module {
        &self.module
    }
}
