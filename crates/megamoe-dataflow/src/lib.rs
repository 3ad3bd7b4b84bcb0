//! `megamoe-dataflow`: the CPU dataflow engine (`megamoe run --backend cpu-dataflow`): the fused kernel's dataflow
//! on host threads, so the buffer protocol the GPU kernel follows is exercised, and its
//! bookkeeping tested, on any machine. R ranks, each with D dispatch threads (the dispatch
//! warps) and W GEMM workers (the persistent CTAs), run over one host-memory symmetric buffer
//! per rank laid out by `symm_mem::SymmLayout`, with `moe_sched`'s heuristics, interleave, pool
//! offsets and wave scheduler:
//!
//! 1. dispatch: count routes per expert, reserve slots on the rank's `send_counts`, write
//!    `token·k + j` into the owner's `src_token_topk`; the rank's leader writes its counts into
//!    every owner's `recv_counts`; global barrier;
//! 2. pull (dispatch threads): tokens, scales and top-k weights from the source ranks into the
//!    owner's L1 pool in "peel the minimum remaining" order, a `TokenSrc` per row, the block's
//!    arrival counter bumped per row;
//! 3. GEMM workers walk the wave schedule: an L1 block (expert, m-block, n-block) waits for its
//!    rows, computes gate and up of its channels, runs the SwiGLU epilogue, re-quantizes into
//!    the L2 pool and sets its bit of the block's arrival mask; an L2 block waits for the full
//!    mask and writes BF16 results into the SOURCE rank's combine slot `[j][t]`; global barrier;
//! 4. combine: per token, valid slots in increasing j, f32 sum, BF16.
//!
//! All per-row math is [`megamoe_problems::reference`]'s (same GEMM sums, epilogue, rounding, combine), so
//! results are bitwise equal to [`reference::forward`](megamoe_problems::reference::forward). Routings that do not fit the
//! buffer are refused before any thread starts; every wait is bounded by a timeout that fails
//! the run with an error instead of hanging.
//!
//! A choice the GPU kernel may make differently: an L1 n-block covers BLOCK_N/2 channels of h
//! (the gate and up rows of the same channels, as DeepGEMM interleaves its weights), and
//! [`l1_block_n`] = max(128, 2G) so that its epilogue owns whole re-quantization groups.

mod rank;
mod world;

use fp_formats::{Recipe, bf16};
use megamoe::config::{Config, ConfigError};
use megamoe::problem::{ProblemError, RankInputs, RankWeights};
use moe_sched::heuristics::{
    BLOCK_M_CANDIDATES, DEFAULT_BLOCK_N, WaveInputs, choose_block_m, choose_experts_per_wave,
    expected_tokens_per_expert,
};
use moe_sched::{PoolLayout, RoutingStats, SchedError, ScheduleShape, WaveSchedule};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use symm_mem::{BlockMs, ByteSize, Region, SymmError, SymmLayout, SymmParams};
use tracing::info;
use world::{RankThread, World};

/// Width of an L2 n-block (output columns of H).
pub const L2_BLOCK_N: u32 = DEFAULT_BLOCK_N;

/// L1 BLOCK_N (accumulator rows of 2I per block) for a recipe: moe-sched's rule, whole
/// re-quantization groups per L1 block.
pub const fn l1_block_n(recipe: Recipe) -> u32 {
    moe_sched::heuristics::l1_block_n(DEFAULT_BLOCK_N, recipe.group() as u32)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineOptions {
    /// GEMM worker threads per rank (the persistent CTAs of one GPU).
    pub workers_per_rank: usize,
    /// Dispatch threads per rank (the dispatch warps).
    pub dispatch_threads_per_rank: usize,
    /// BLOCK_M; `None` takes `moe_sched`'s heuristic (or the nearest size the layout serves).
    pub block_m: Option<u32>,
    /// How long any wait (a barrier, an arrival counter) may last before the run fails.
    pub timeout: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            workers_per_rank: 2,
            dispatch_threads_per_rank: 1,
            block_m: None,
            timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EngineError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Problem(#[from] ProblemError),
    #[error("symmetric buffer: {0}")]
    Layout(#[from] SymmError),
    #[error("the buffer layout has {field} = {layout}, the config {config}")]
    LayoutMismatch {
        field: &'static str,
        layout: u64,
        config: u64,
    },
    #[error(
        "L1 BLOCK_N = {block_n}: an L1 block covers BLOCK_N/2 channels of h, which must be whole groups of G = {group}"
    )]
    L1BlockN { block_n: u32, group: usize },
    #[error("{what} per rank must be at least 1")]
    NoThreads { what: &'static str },
    #[error(
        "rank {rank} brings {tokens} tokens, but the buffer holds at most T_max = {max_tokens} per rank"
    )]
    TooManyTokens {
        rank: usize,
        tokens: usize,
        max_tokens: usize,
    },
    #[error("routing: {0}")]
    Routing(SchedError),
    #[error("rank {rank}: the routing does not fit the buffer: {source}")]
    Capacity { rank: usize, source: SchedError },
    #[error("could not allocate the {} symmetric buffer of rank {rank}", ByteSize(*bytes))]
    OutOfMemory { rank: usize, bytes: u64 },
    #[error("could not start thread {thread} of rank {rank}: {message}")]
    Spawn {
        rank: usize,
        thread: usize,
        message: String,
    },
    #[error(
        "rank {rank}: L1 output h = {value} of local expert {expert} (token {token} of rank {source_rank}, slot {slot}) is not finite: it has no UE8M0 scale"
    )]
    NonFiniteL1 {
        rank: usize,
        expert: usize,
        source_rank: usize,
        token: usize,
        slot: usize,
        value: f32,
    },
    #[error("rank {rank}, thread {thread}: gave up after {timeout:?} waiting for {what}")]
    Timeout {
        rank: usize,
        thread: usize,
        what: String,
        timeout: Duration,
    },
}

/// The result of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct DataflowRun {
    /// `[T, H]` BF16 per rank.
    pub y: Vec<Vec<bf16>>,
    /// The block sizes and wave size the run used.
    pub schedule: ScheduleShape,
}

/// The engine for one config and one buffer layout; runs any routing that fits the buffer. Its
/// symmetric buffers live from call to call, as the kernel's do: each call copies its inputs in,
/// and leaves the counters reset and the barrier words settled for the next.
#[derive(Debug)]
pub struct DataflowEngine {
    config: Config,
    layout: SymmLayout,
    options: EngineOptions,
    buffers: KeptBuffers,
}

/// The buffers between calls: none before the first call and after a failed one (the next call
/// allocates zeroed ones).
#[derive(Default)]
struct KeptBuffers(Mutex<Option<Vec<world::HostBuffer>>>);

impl std::fmt::Debug for KeptBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, Vec::len);
        write!(f, "KeptBuffers({kept} ranks)")
    }
}

/// Saturates, so out-of-range sizes reach `SymmParams::validate` and are refused there.
fn to_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl DataflowEngine {
    /// An engine whose buffer holds `max_tokens_per_rank` tokens per rank, laid out for every
    /// BLOCK_M candidate of the heuristic (and `options.block_m`).
    pub fn new(
        config: &Config,
        max_tokens_per_rank: usize,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        let mut block_ms = BLOCK_M_CANDIDATES.to_vec();
        block_ms.extend(options.block_m);
        let layout = SymmLayout::new(SymmParams {
            num_ranks: to_u32(config.num_ranks),
            max_tokens_per_rank: to_u32(max_tokens_per_rank.max(1)),
            hidden: to_u32(config.hidden),
            intermediate: to_u32(config.intermediate),
            num_experts: to_u32(config.num_experts),
            num_topk: to_u32(config.top_k),
            act_scale_group: to_u32(config.act_group()),
            block_ms: BlockMs::new(&block_ms)?,
            l1_block_n: l1_block_n(config.recipe),
        })?;
        Self::with_layout(config, layout, options)
    }

    /// An engine on a given buffer layout, which must describe `config`.
    pub fn with_layout(
        config: &Config,
        layout: SymmLayout,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        let p = &layout.params;
        for (field, layout, config) in [
            ("num_ranks", p.num_ranks, config.num_ranks),
            ("hidden", p.hidden, config.hidden),
            ("intermediate", p.intermediate, config.intermediate),
            ("num_experts", p.num_experts, config.num_experts),
            ("num_topk", p.num_topk, config.top_k),
            ("act_scale_group", p.act_scale_group, config.act_group()),
        ] {
            if layout as usize != config {
                return Err(EngineError::LayoutMismatch {
                    field,
                    layout: layout.into(),
                    config: config as u64,
                });
            }
        }
        if !(p.l1_block_n as usize / 2).is_multiple_of(config.act_group()) {
            return Err(EngineError::L1BlockN {
                block_n: p.l1_block_n,
                group: config.act_group(),
            });
        }
        for (what, n) in [
            ("GEMM workers", options.workers_per_rank),
            ("dispatch threads", options.dispatch_threads_per_rank),
        ] {
            if n == 0 {
                return Err(EngineError::NoThreads { what });
            }
        }
        Ok(DataflowEngine {
            config: *config,
            layout,
            options,
            buffers: KeptBuffers::default(),
        })
    }

    pub fn layout(&self) -> &SymmLayout {
        &self.layout
    }

    /// BLOCK_M, the n-blocks and experts per wave for a call whose largest rank brings
    /// `tokens` tokens: the kernel's specialization, chosen from the expected load only.
    fn schedule_shape(&self, tokens: usize) -> Result<ScheduleShape, EngineError> {
        let p = &self.layout.params;
        let expected =
            expected_tokens_per_expert(to_u32(tokens), p.num_ranks, p.num_topk, p.num_experts);
        let block_m = self.options.block_m.unwrap_or_else(|| {
            let want = choose_block_m(expected);
            p.block_ms
                .iter()
                .find(|&bm| bm >= want)
                .unwrap_or(p.block_ms.max())
        });
        self.layout.pool_capacity_for(block_m)?;
        let l1_n_blocks = p.l1_n_blocks();
        let shape = ScheduleShape {
            block_m,
            l1_n_blocks,
            l2_n_blocks: p.hidden / L2_BLOCK_N,
            num_experts_per_wave: choose_experts_per_wave(&WaveInputs {
                num_local_experts: p.num_local_experts(),
                expected_tokens_per_expert: expected,
                block_m,
                l1_n_blocks,
                intermediate: p.intermediate,
                num_sms: to_u32(self.options.workers_per_rank),
            }),
        };
        // Refuses a bad shape here rather than in every worker.
        WaveSchedule::new(shape, &vec![0; p.num_local_experts() as usize])
            .map_err(EngineError::Routing)?;
        Ok(shape)
    }

    /// Checks everything a run relies on, then runs it: `y` `[T, H]` BF16 per rank.
    pub fn forward(
        &self,
        weights: &[RankWeights],
        inputs: &[RankInputs],
    ) -> Result<DataflowRun, EngineError> {
        let (c, layout) = (&self.config, &self.layout);
        for (what, got) in [("weights", weights.len()), ("inputs", inputs.len())] {
            if got != c.num_ranks {
                return Err(ProblemError::RankCount {
                    what,
                    got,
                    expected: c.num_ranks,
                }
                .into());
            }
        }
        let max_tokens = layout.params.max_tokens_per_rank as usize;
        for (rank, (w, x)) in weights.iter().zip(inputs).enumerate() {
            let in_rank = |e: ProblemError| ProblemError::Rank {
                rank,
                source: Box::new(e),
            };
            w.validate(c).map_err(in_rank)?;
            x.validate(c).map_err(in_rank)?;
            if x.tokens > max_tokens {
                return Err(EngineError::TooManyTokens {
                    rank,
                    tokens: x.tokens,
                    max_tokens,
                });
            }
        }
        let topk_idx: Vec<&[i64]> = inputs.iter().map(|x| x.topk_idx.as_slice()).collect();
        let stats =
            RoutingStats::from_topk(layout.params.num_experts, layout.params.num_topk, &topk_idx)
                .map_err(EngineError::Routing)?;
        let tokens: Vec<usize> = inputs.iter().map(|x| x.tokens).collect();
        let shape = self.schedule_shape(tokens.iter().copied().max().unwrap_or(0))?;
        let expected_counts: Vec<Vec<u32>> = (0..layout.params.num_ranks)
            .map(|owner| stats.tokens_per_local_expert(owner))
            .collect();
        for (rank, counts) in expected_counts.iter().enumerate() {
            PoolLayout::new(layout, counts, shape.block_m)
                .map_err(|source| EngineError::Capacity { rank, source })?;
        }

        let o = &self.options;
        let threads = o.dispatch_threads_per_rank + o.workers_per_rank;
        info!(
            ranks = c.num_ranks,
            threads_per_rank = threads,
            block_m = shape.block_m,
            experts_per_wave = shape.num_experts_per_wave,
            buffer_per_rank = %ByteSize(layout.total_bytes),
            "cpu-dataflow run"
        );
        // One call at a time on the buffers; a failed call leaves them to be dropped.
        let mut kept = self
            .buffers
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let buffers = match kept.take() {
            Some(buffers) => buffers,
            None => world::zeroed_buffers(layout)?,
        };
        let world = World::reuse(layout, buffers, o.timeout, |rank, bytes| {
            copy_inputs(layout, &inputs[rank], bytes)
        })?;
        let job = rank::Job {
            config: c,
            weights,
            tokens: &tokens,
            expected_counts: &expected_counts,
            shape,
            dispatch_threads: o.dispatch_threads_per_rank,
            workers: o.workers_per_rank,
        };
        let mut y: Vec<Vec<bf16>> = tokens
            .iter()
            .map(|&t| vec![bf16::ZERO; t * c.hidden])
            .collect();
        std::thread::scope(|s| {
            for (rank, y) in y.iter_mut().enumerate() {
                let mut rest = y.as_mut_slice();
                for thread in 0..threads {
                    let mine = rank::share(tokens[rank], threads, thread);
                    let (y_part, tail) =
                        std::mem::take(&mut rest).split_at_mut(mine.len() * c.hidden);
                    rest = tail;
                    let (world, job) = (&world, &job);
                    let spawned = std::thread::Builder::new()
                        .name(format!("rank{rank}.{thread}"))
                        .spawn_scoped(s, move || {
                            let _guard = world::AbortOnPanic(world);
                            let mut me = RankThread::new(world, rank, thread, threads);
                            // A stopped thread's cause is recorded in the world.
                            let _ = rank::run(job, &mut me, y_part, mine.start);
                        });
                    if let Err(e) = spawned {
                        world.fail(EngineError::Spawn {
                            rank,
                            thread,
                            message: e.to_string(),
                        });
                        return;
                    }
                }
            }
        });
        match world.into_parts() {
            (_, Some(e)) => Err(e),
            (buffers, None) => {
                *kept = Some(buffers);
                Ok(DataflowRun { y, schedule: shape })
            }
        }
    }
}

/// The whole layer on a buffer sized for this call's largest rank: `y` `[T, H]` BF16 per rank.
pub fn forward(
    config: &Config,
    weights: &[RankWeights],
    inputs: &[RankInputs],
    options: EngineOptions,
) -> Result<DataflowRun, EngineError> {
    let max_tokens = inputs.iter().map(|x| x.tokens).max().unwrap_or(0);
    DataflowEngine::new(config, max_tokens, options)?.forward(weights, inputs)
}

/// The caller's copy-in: a rank's tokens, scales and routing into its buffer's input regions.
fn copy_inputs(layout: &SymmLayout, x: &RankInputs, bytes: &mut [u8]) {
    let mut put = |region: &Region, data: &[u8]| {
        bytes[region.offset as usize..][..data.len()].copy_from_slice(data);
    };
    put(&layout.x, &x.x);
    put(&layout.x_sf, &x.x_sf);
    put(&layout.topk_idx, bytemuck::cast_slice(&x.topk_idx));
    put(&layout.topk_weights, bytemuck::cast_slice(&x.topk_weights));
}
