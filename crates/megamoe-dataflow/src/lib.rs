//! `megamoe-dataflow`: the CPU dataflow engine (`megamoe run --backend cpu-dataflow`): the
//! forward on host threads over the GPU backends' buffer protocol (`megamoe_kernel::protocol`),
//! so the protocol, and the dataflow the fused kernel is to adopt, run and are tested on any
//! machine. R ranks, each with D dispatch threads (the dispatch warps) and W GEMM workers (the
//! persistent CTAs), run over one host-memory symmetric buffer per rank laid out by the
//! protocol's `PeerLayout` (the GPU's regions at the GPU's offsets, the engine's own after
//! them), with `moe_sched`'s heuristics and wave scheduler:
//!
//! 1. count: each rank's leader publishes its routes per expert (`expert_counts`) as its row of
//!    every rank's counts table; the ranks meet;
//! 2. plan: every thread plans every owner's pools from the table (`PoolPlan`: the GPU's row
//!    order and padding; every rank refuses an overflow alike);
//! 3. dispatch threads push each pair of their tokens into its row of the owner's L1 pool
//!    (`routes`) — the exact route's pool: the E4M3 row times its scales as BF16, in the GEMM's
//!    channel order — with its `RowMeta`, and bump the owner's arrival counter of the row's L1
//!    block; meanwhile GEMM workers walk the wave schedule: an L1 block (expert, m-block,
//!    n-block) waits for its rows, computes gate and up of its channels, runs the SwiGLU
//!    epilogue with each row's top-k weight, re-quantizes into the L2 pool and sets its bit of the
//!    block's arrival mask; an L2 block waits for the full mask and writes BF16 results into the
//!    source rank's combine slot `[j][t]` its row's `RowMeta` names; global barrier;
//! 4. combine: per token, valid slots in increasing j, f32 sum, BF16.
//!
//! The arrival counters and masks are what the GPU pipeline does not have yet (it meets at a
//! cross-rank barrier after dispatch): regions of the engine's own past the protocol's, reached
//! through the same symmetric view. All per-row math is [`megamoe_problems::reference`]'s (same
//! GEMM sums, epilogue, rounding, combine), so results are bitwise equal to
//! [`reference::forward`](megamoe_problems::reference::forward). Plans that do not fit the
//! pools are refused with the protocol's capacity error before any thread starts; every wait is
//! bounded by a timeout that fails the run with an error instead of hanging.
//!
//! A choice the GPU kernel may make differently: an L1 n-block covers BLOCK_N/2 channels of h
//! (the gate and up rows of the same channels, as DeepGEMM interleaves its weights), and
//! [`l1_block_n`] = max(128, 2G) so that its epilogue owns whole re-quantization groups.

mod rank;
mod world;

use fp_formats::{Recipe, bf16};
use megamoe::config::{Config, ConfigError};
use megamoe::problem::{ProblemError, RankInputs, RankWeights};
use megamoe_kernel::Routes;
use megamoe_kernel::protocol::{PipelineShape, PoolPlan, ProtocolError, expert_counts};
use moe_sched::heuristics::{
    DEFAULT_BLOCK_N, WaveInputs, choose_block_m, choose_experts_per_wave,
    expected_tokens_per_expert,
};
use moe_sched::{SchedError, ScheduleShape, WaveSchedule};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tracing::info;
use world::{EngineLayout, RankThread, World};

/// Width of an L2 n-block (output columns of H).
pub const L2_BLOCK_N: u32 = DEFAULT_BLOCK_N;

/// L1 BLOCK_N (accumulator rows of 2I per block) for a recipe: moe-sched's rule, whole
/// re-quantization groups per L1 block.
pub const fn l1_block_n(recipe: Recipe) -> u32 {
    moe_sched::heuristics::l1_block_n(DEFAULT_BLOCK_N, recipe.group() as u32)
}

/// L1 n-blocks per (expert, m-block): 2I / [`l1_block_n`].
fn l1_n_blocks(config: &Config) -> u32 {
    to_u32(2 * config.intermediate) / l1_block_n(config.recipe)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineOptions {
    /// GEMM worker threads per rank (the persistent CTAs of one GPU).
    pub workers_per_rank: usize,
    /// Dispatch threads per rank (the dispatch warps).
    pub dispatch_threads_per_rank: usize,
    /// BLOCK_M; `None` takes `moe_sched`'s heuristic.
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
    /// The protocol's refusals: a shape it cannot lay out, a plan that overflows an owner's pools.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("the pipeline shape has {field} = {shape}, the engine needs {needs}")]
    ShapeMismatch {
        field: &'static str,
        shape: String,
        needs: String,
    },
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
    #[error("schedule: {0}")]
    Schedule(SchedError),
    #[error("could not allocate the {bytes}-byte symmetric buffer of rank {rank}")]
    OutOfMemory { rank: usize, bytes: usize },
    #[error(transparent)]
    Symm(#[from] symm_mem::SymmError),
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

/// The engine for one config and one pipeline shape; runs any routing whose plans fit the
/// shape's pools. Its symmetric buffers live from call to call, as the GPU's do: each call
/// leaves the arrival counters reset and the barrier words settled for the next.
#[derive(Debug)]
pub struct DataflowEngine {
    config: Config,
    shape: PipelineShape,
    layout: EngineLayout,
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

/// Saturates: the heuristics take 32-bit sizes.
fn to_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

impl DataflowEngine {
    /// An engine whose pools hold any routing of up to `max_tokens_per_rank` tokens per rank
    /// (the shape the GPU backends build for the config, on the exact route).
    pub fn new(
        config: &Config,
        max_tokens_per_rank: usize,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        let shape = PipelineShape::new(
            config.recipe,
            Routes::EXACT,
            config.hidden,
            config.intermediate,
            config.num_experts,
            config.top_k,
            config.num_ranks,
            max_tokens_per_rank,
            config.clamp,
        )?;
        Self::with_shape(config, shape, options)
    }

    /// An engine on a given pipeline shape (e.g. pools smaller than any routing needs), which
    /// must describe `config` on the exact route: the L1 pool holds BF16 rows.
    pub fn with_shape(
        config: &Config,
        shape: PipelineShape,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        shape.validate()?;
        let fields: [(&'static str, String, String); 8] = [
            (
                "recipe",
                shape.recipe.to_string(),
                config.recipe.to_string(),
            ),
            (
                "routes",
                shape.routes.to_string(),
                Routes::EXACT.to_string(),
            ),
            (
                "hidden",
                shape.hidden.to_string(),
                config.hidden.to_string(),
            ),
            (
                "intermediate",
                shape.intermediate.to_string(),
                config.intermediate.to_string(),
            ),
            (
                "num_experts",
                shape.num_experts.to_string(),
                config.num_experts.to_string(),
            ),
            ("top_k", shape.top_k.to_string(), config.top_k.to_string()),
            (
                "num_ranks",
                shape.num_ranks.to_string(),
                config.num_ranks.to_string(),
            ),
            (
                "clamp",
                format!("{:?}", shape.clamp),
                format!("{:?}", config.clamp),
            ),
        ];
        if let Some((field, shape, needs)) = fields.into_iter().find(|(_, s, n)| s != n) {
            return Err(EngineError::ShapeMismatch {
                field,
                shape,
                needs,
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
            shape,
            layout: EngineLayout::new(&shape, l1_n_blocks(config) as usize),
            options,
            buffers: KeptBuffers::default(),
        })
    }

    /// The protocol's shape the engine's buffers are laid out by.
    pub fn shape(&self) -> &PipelineShape {
        &self.shape
    }

    /// BLOCK_M, the n-blocks and experts per wave for a call whose largest rank brings
    /// `tokens` tokens: the kernel's specialization, chosen from the expected load only.
    fn schedule_shape(&self, tokens: usize) -> Result<ScheduleShape, EngineError> {
        let c = &self.config;
        let expected = expected_tokens_per_expert(
            to_u32(tokens),
            to_u32(c.num_ranks),
            to_u32(c.top_k),
            to_u32(c.num_experts),
        );
        let block_m = self
            .options
            .block_m
            .unwrap_or_else(|| choose_block_m(expected));
        let l1_n_blocks = l1_n_blocks(c);
        let shape = ScheduleShape {
            block_m,
            l1_n_blocks,
            l2_n_blocks: to_u32(c.hidden) / L2_BLOCK_N,
            num_experts_per_wave: choose_experts_per_wave(&WaveInputs {
                num_local_experts: to_u32(c.experts_per_rank()),
                expected_tokens_per_expert: expected,
                block_m,
                l1_n_blocks,
                intermediate: to_u32(c.intermediate),
                num_sms: to_u32(self.options.workers_per_rank),
            }),
        };
        // Refuses a bad shape here rather than in every worker.
        WaveSchedule::new(shape, &vec![0; c.experts_per_rank()]).map_err(EngineError::Schedule)?;
        Ok(shape)
    }

    /// Checks everything a run relies on — the inputs, and every owner's plan against its pools
    /// — then runs it: `y` `[T, H]` BF16 per rank.
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
        let max_tokens = self.shape.max_tokens;
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
        let counts = inputs
            .iter()
            .map(|x| expert_counts(&x.topk_idx, c.top_k, c.num_experts))
            .collect::<Result<Vec<_>, _>>()?;
        for owner in 0..c.num_ranks {
            PoolPlan::new(&counts, owner, c.experts_per_rank(), self.shape.pool_rows)?;
        }
        let tokens: Vec<usize> = inputs.iter().map(|x| x.tokens).collect();
        let schedule = self.schedule_shape(tokens.iter().copied().max().unwrap_or(0))?;

        let o = &self.options;
        let threads = o.dispatch_threads_per_rank + o.workers_per_rank;
        info!(
            ranks = c.num_ranks,
            threads_per_rank = threads,
            block_m = schedule.block_m,
            experts_per_wave = schedule.num_experts_per_wave,
            pool_rows = self.shape.pool_rows,
            buffer_bytes_per_rank = layout.bytes,
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
            None => world::zeroed_buffers(layout, c.num_ranks)?,
        };
        let world = World::new(layout, buffers, o.timeout)?;
        let job = rank::Job {
            config: c,
            shape: &self.shape,
            weights,
            inputs,
            counts: &counts,
            schedule,
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
                Ok(DataflowRun { y, schedule })
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
