//! The CUDA backend, one rank's handle ([`CudaRank`]) on either [`ForwardPath`]: the unfused
//! pipeline of `megamoe_kernel::unfused` (dispatch → L1 GEMM with SwiGLU + re-quantization as its
//! epilogue → L2 GEMM → combine, one launch each, the plan on the host) or the fused kernel of
//! `megamoe_kernel::fused` (one launch, the plan on the device); and the engine's device forward
//! ([`CudaRank::forward_device`]: [`DeviceIo`] addresses, the caller's stream, no host
//! synchronization; [`DeviceBatch`] holds a batch in device buffers; a rank missing from a device
//! meeting fails the forward into its error word, and [`CudaRank::recover`] lets the next one
//! run). Ranks run on R local GPUs,
//! one per GPU or several sharing one ([`Placement`]), in either world of `symm_mem`:
//!
//! - **local** ([`run_local`], [`forward`]): one process, one thread per rank over
//!   [`World::local`];
//! - **process** ([`run_process`], launched by [`spawn_rank_processes`] or torchrun): one process
//!   per rank over [`World::from_env`], each holding only its own rank's weights and inputs
//!   ([`forward_rank`]).
//!
//! The unfused path, host to host: each rank allocates the buffers peers write into (L1 pool, its scales and row metadata, the
//! combine buffer, the barrier's signals) as one symmetric buffer with [`World::alloc_symmetric`] and hands every rank's
//! base, as mapped in its process, to the pipeline; no address is exchanged. The ranks exchange
//! expert counts per forward with `all_gather` (the host plans the pools from them and refuses an
//! overflow) and meet once more on the host after compiling what the forward needs; with no GPU
//! synchronization every stage is then queued at once (each pair's pool row is found on the
//! device), and after each stage that writes into a
//! peer's memory (dispatch, combine send) the ranks meet on the device (`Pipeline::rank_barrier`,
//! which times out into an error that the forward returns). The GEMMs' tensor-core route ([`Mma`](megamoe_kernel::Mma)) is the
//! caller's choice: BF16 is exact for both recipes (accepted at calc_diff ≤ 1e-5, DESIGN §1;
//! bit-exact on the H200 so far); FP8 (g128 only) is faster but accumulates with Hopper's FP8
//! tensor core.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_rt::cudarc::driver::{CudaStream, sys};
use cuda_rt::timing::EventTrail;
use cuda_rt::{Gpu, Jit};
use fp_formats::bf16;
mod batch;
mod views;

pub use batch::{DeviceBatch, driver};
/// For programs whose [`Placement`] puts ranks on one GPU: each rank's stream needs a hardware work
/// queue of its own, which the start of `main` asks for.
pub use cuda_rt::green::ask_for_every_connection;
pub use megamoe_kernel::fused::{ActivationFormat, DeviceIo, IndexWidth};
use megamoe_kernel::protocol::PipelineShape;
use megamoe_kernel::unfused::{Pipeline, UnfusedError};
use megamoe_kernel::{Routes, transform_l1_weights, transform_weights};
use symm_mem::world::RankOutput;
use symm_mem::{ProcessEnv, SymmAllocation, World, WorldError, spawn_ranks};
pub use views::{ActivationsView, IdsView, InputViews, TokenCount};

use crate::problem::weight_shapes;
use crate::{Config, Problem, RankInputs, RankWeights};

/// How long [`spawn_rank_processes`] lets the rank processes run before it kills them (each
/// collective among them times out much earlier, after [`ProcessEnv::DEFAULT_TIMEOUT`]).
pub const PROCESS_DEADLINE: Duration = Duration::from_secs(3600);

/// Stage marks of one forward: around dispatch, the GEMM stages and combine send, combine reduce.
const FORWARD_MARKS: usize = 9;

/// The time since `clock`, which restarts.
fn lap(clock: &mut Instant) -> Duration {
    let d = clock.elapsed();
    *clock = Instant::now();
    d
}

/// Which kernels a forward runs: the unfused pipeline (a launch per stage, the plan on the host
/// from the counts every rank exchanges) or the fused kernel (one persistent launch per forward,
/// the plan on the device: `megamoe_kernel::fused`). Both give the same bits when they run the
/// same GEMM tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ForwardPath {
    #[default]
    Unfused,
    Fused,
}

impl std::fmt::Display for ForwardPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ForwardPath::Unfused => "unfused",
            ForwardPath::Fused => "fused",
        })
    }
}

impl std::str::FromStr for ForwardPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "unfused" => Ok(ForwardPath::Unfused),
            "fused" => Ok(ForwardPath::Fused),
            _ => Err(format!("unknown forward path `{s}` (unfused or fused)")),
        }
    }
}

/// Which local GPU each rank of a world drives: `ranks_per_gpu` consecutive ranks share one, on
/// GPUs 0, 1, …. Ranks that share a GPU run the same cross-rank protocol through device memory
/// instead of NVLink, so R ranks can be tested on fewer GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub ranks: usize,
    pub ranks_per_gpu: usize,
}

impl Placement {
    /// One GPU per rank, the serving layout.
    pub fn one_gpu_per_rank(ranks: usize) -> Self {
        Self {
            ranks,
            ranks_per_gpu: 1,
        }
    }

    /// Every rank on GPU 0.
    pub fn one_gpu(ranks: usize) -> Self {
        Self {
            ranks,
            ranks_per_gpu: ranks.max(1),
        }
    }

    /// The GPU ordinal of each rank.
    pub fn ordinals(&self) -> Vec<usize> {
        (0..self.ranks).map(|r| r / self.ranks_per_gpu).collect()
    }

    /// Refuses a placement this machine cannot run ([`CudaError::Placement`]).
    fn check(&self) -> Result<(), CudaError> {
        let found = Gpu::count()?;
        if self.ranks == 0
            || self.ranks_per_gpu == 0
            || found < self.ranks.div_ceil(self.ranks_per_gpu)
        {
            return Err(CudaError::Placement {
                placement: *self,
                found,
            });
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "{} rank(s) at {} per GPU need {} GPU(s), but {found} are present (more ranks per GPU run \
         on fewer GPUs)",
        placement.ranks,
        placement.ranks_per_gpu,
        placement.ranks.div_ceil(placement.ranks_per_gpu.max(1))
    )]
    Placement { placement: Placement, found: usize },
    #[error(transparent)]
    Cuda(#[from] cuda_rt::Error),
    #[error(transparent)]
    World(#[from] WorldError),
    #[error(transparent)]
    Unfused(#[from] UnfusedError),
    #[error(transparent)]
    Transform(#[from] megamoe_kernel::TransformError),
    #[error(transparent)]
    Problem(#[from] crate::ProblemError),
    #[error("rank {rank}: {source}")]
    Rank {
        rank: usize,
        #[source]
        source: Box<CudaError>,
    },
    /// Several ranks of a local world failed, each its own way (a rank waiting at a device
    /// meeting names the missing rank; that rank's own error says why it was missing).
    #[error(
        "{} ranks failed:\n{}",
        failures.len(),
        failures.iter().map(|e| format!("  {e}\n")).collect::<String>()
    )]
    Ranks { failures: Vec<CudaError> },
    #[error("rank {rank} refused its inputs (see its error); rank {me} stops too")]
    PeerFailed { rank: usize, me: usize },
    #[error("exchange: {0}")]
    Exchange(String),
    /// A [`DeviceBatch`] asked to take what it was not made for (more tokens, another format).
    #[error("device batch: {0}")]
    Batch(String),
    /// An engine's device tensor shorter than the forward needs ([`CudaRank::forward_views`]).
    #[error("{tensor} holds {len} elements; a forward of {tokens} tokens needs {needed}")]
    DeviceTensorLength {
        tensor: &'static str,
        len: usize,
        tokens: usize,
        needed: usize,
    },
    /// An engine's device tensor (or stream) on another GPU than the rank's.
    #[error("{tensor} is on GPU {gpu}, the rank on GPU {rank_gpu}")]
    DeviceTensorGpu {
        tensor: &'static str,
        gpu: usize,
        rank_gpu: usize,
    },
    #[error(
        "{} of {ranks} rank process(es) failed:\n{}",
        failed.len(),
        failed.iter().map(ToString::to_string).collect::<String>()
    )]
    RankProcesses {
        ranks: usize,
        /// Each failed rank's exit status and output, by rank.
        failed: Vec<RankOutput>,
    },
}

/// The times of one forward on one rank: the kernels' own (CUDA events, no synchronize between
/// the GEMM stages) and the host's (wall clock).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    /// Host: validation of the inputs and their upload, until the copies are done on every rank.
    pub upload: Duration,
    /// Host: counts exchange, pool plans (a capacity overflow is refused here), GEMM cores, the
    /// host meeting. No GPU synchronization: the stages follow on the stream.
    pub route: Duration,
    /// Host: queueing the stages' launches (and marks) after `route`; the GPU starts on the first
    /// while the host queues the rest.
    pub queue: Duration,
    /// GPU: from the route kernel's start to y (CUDA events), idle time included; with stage
    /// marks the sum of the kernel stages below.
    pub span: Duration,
    /// Whether the kernel stages below were timed ([`CudaRank::set_stage_marks`]); zero if not.
    pub stage_marks: bool,
    /// GPU: each pair's pool row (`uf_route`) and the dispatch kernel.
    pub dispatch: Duration,
    /// GPU: the L1 grouped GEMM with its SwiGLU epilogue (into the L2 pool).
    pub l1: Duration,
    pub l2: Duration,
    /// GPU: combine send + top-k reduction.
    pub combine: Duration,
    /// GPU: the two cross-rank barriers (after dispatch, after combine send), the wait for the
    /// slowest rank included.
    pub barriers: Duration,
    /// Wall clock from the start of `route` to y complete on the device: everything but the
    /// host's upload of the inputs and download of y.
    pub wall: Duration,
    /// Host: the download of y.
    pub download: Duration,
}

impl StageTimes {
    /// Wall clock of the whole forward, host I/O included.
    pub fn total(&self) -> Duration {
        self.upload + self.wall + self.download
    }

    /// The kernels alone.
    pub fn kernels(&self) -> Duration {
        self.kernel_stages().iter().map(|&(_, d)| d).sum()
    }

    /// (name, time) of every kernel stage, in order.
    pub fn kernel_stages(&self) -> [(&'static str, Duration); 5] {
        [
            ("dispatch", self.dispatch),
            ("L1", self.l1),
            ("L2", self.l2),
            ("combine", self.combine),
            ("barriers", self.barriers),
        ]
    }

    /// (name, time) of every part, in order.
    pub fn stages(&self) -> [(&'static str, Duration); 8] {
        let [dispatch, l1, l2, combine, barriers] = self.kernel_stages();
        [
            ("upload", self.upload),
            ("route", self.route),
            dispatch,
            l1,
            l2,
            combine,
            barriers,
            ("download", self.download),
        ]
    }
}

/// `upload 0.012, route 0.034, …, download 0.005 ms`.
impl std::fmt::Display for StageTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .stages()
            .iter()
            .map(|(name, d)| format!("{name} {:.3}", d.as_secs_f64() * 1e3))
            .collect();
        write!(f, "{} ms", parts.join(", "))
    }
}

/// The pipeline's shape for `config` with `max_tokens` tokens per rank, GEMMs through `routes`.
pub fn pipeline_shape(
    config: &Config,
    max_tokens: usize,
    routes: impl Into<Routes>,
) -> Result<PipelineShape, CudaError> {
    PipelineShape::new(
        config.recipe,
        routes,
        config.hidden,
        config.intermediate,
        config.num_experts,
        config.top_k,
        config.num_ranks,
        max_tokens,
        config.clamp,
    )
    .map_err(|e| UnfusedError::from(e).into())
}

/// One rank's canonical MXFP4 expert weights already in device memory of the rank's GPU (an
/// engine's loaded tensors; `#[repr(C)]`, device addresses): laid out as [`RankWeights`] lays
/// them out on the host — `w1` `[E/R][2I][H/2]` packed E2M1 (gate rows, then up), `w1_sf`
/// `[E/R][2I][H/32]` UE8M0, `w2` `[E/R][H][I/2]`, `w2_sf` `[E/R][H][I/32]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceRankWeights {
    pub w1: u64,
    pub w1_sf: u64,
    pub w2: u64,
    pub w2_sf: u64,
}

/// One rank of the CUDA backend: its world, its JIT, its symmetric buffer and its pipeline
/// (weights loaded). Every forward ends at a barrier after which no peer touches this rank's
/// symmetric buffer, so a rank may be dropped once its forwards have returned; dropping waits for
/// its GPU's queued work, then releases the pipeline before the buffer.
pub struct CudaRank {
    /// Held, not borrowed: an engine keeps the handle (and the world with it) in its own state.
    world: Arc<World>,
    jit: Jit,
    /// Declared before `symm`: dropped first, since it addresses it.
    pipe: Pipeline,
    /// The pipeline's L1 pool, scales, row metadata, combine buffer and barrier signals
    /// ([`PipelineShape::peer_layout`]), every rank's mapped in this process.
    symm: SymmAllocation,
    config: Config,
    /// Stage marks of one forward.
    marks: EventTrail,
    /// Whether forwards record a mark between every two stages ([`CudaRank::set_stage_marks`]).
    stage_marks: bool,
    /// The expert counts of the inputs on the device ([`CudaRank::rerun`]).
    uploaded: Option<Vec<u32>>,
    /// Which kernels forwards run ([`CudaRank::set_path`]).
    path: ForwardPath,
    /// The fused forward's tokens per tile, when the caller fixes it ([`CudaRank::set_fused_tile`]).
    fused_tile: Option<usize>,
}

impl CudaRank {
    /// Collective: transforms and uploads this rank's `weights` for the GEMMs' `routes` (an
    /// [`megamoe_kernel::Mma`] for both, or [`Routes`]), and allocates
    /// the symmetric buffer and the pools for `max_tokens` tokens per rank (every rank passes the
    /// same). Kernels compile through a [`Jit`] with the default cache.
    pub fn new(
        world: Arc<World>,
        config: &Config,
        max_tokens: usize,
        routes: impl Into<Routes>,
        weights: &RankWeights,
    ) -> Result<Self, CudaError> {
        Self::with_shape(
            world,
            config,
            pipeline_shape(config, max_tokens, routes)?,
            weights,
            Jit::new()?,
        )
    }

    /// Collective: [`CudaRank::new`] from weights already on this rank's GPU: read once into host
    /// memory (the transform into the GEMMs' layout runs on the host, as for host weights), then
    /// as `new`. The engine's tensors are not kept.
    ///
    /// # Safety
    /// `weights`' addresses are device memory of this rank's GPU holding the canonical tensors of
    /// `config`'s per-rank shape ([`DeviceRankWeights`]), not written by other work meanwhile.
    pub unsafe fn from_device_weights(
        world: Arc<World>,
        config: &Config,
        max_tokens: usize,
        routes: impl Into<Routes>,
        weights: &DeviceRankWeights,
    ) -> Result<Self, CudaError> {
        let gpu = world.local_gpu();
        let [w1, w1_sf, w2, w2_sf] = weight_shapes(config).map(|(_, shape)| shape.iter().product());
        let read = |ptr: u64, bytes: usize| -> Result<Vec<u8>, CudaError> {
            let mut host = vec![0u8; bytes];
            // SAFETY: the caller's contract: `bytes` bytes of the tensor at `ptr` on this GPU.
            unsafe { gpu.read_raw(ptr, &mut host) }?;
            Ok(host)
        };
        let host = RankWeights {
            w1: read(weights.w1, w1)?,
            w1_sf: read(weights.w1_sf, w1_sf)?,
            w2: read(weights.w2, w2)?,
            w2_sf: read(weights.w2_sf, w2_sf)?,
        };
        Self::new(world, config, max_tokens, routes, &host)
    }

    /// [`CudaRank::new`] with an explicit shape (e.g. smaller pools than the worst case) and the
    /// caller's [`Jit`] (its toolkit and cache, or none: `Jit::without_cache`).
    pub fn with_shape(
        world: Arc<World>,
        config: &Config,
        shape: PipelineShape,
        weights: &RankWeights,
        jit: Jit,
    ) -> Result<Self, CudaError> {
        if world.num_ranks() != config.num_ranks {
            return Err(CudaError::Exchange(format!(
                "the world has {} ranks, the problem {}",
                world.num_ranks(),
                config.num_ranks
            )));
        }
        weights.validate(config)?;
        let (h, i, el) = (
            config.hidden,
            config.intermediate,
            config.experts_per_rank(),
        );
        let routes = shape.routes;
        let w1 = transform_l1_weights(routes.l1, &weights.w1, &weights.w1_sf, el, i, h)?;
        let w2 = transform_weights(routes.l2, &weights.w2, &weights.w2_sf, el, h, i)?;
        let gpu = world.local_gpu();
        let symm = world.alloc_symmetric(shape.peer_layout().bytes)?;
        // SAFETY: `symm.bases()` are every rank's live buffer of `peer_layout().bytes` bytes, mapped
        // in this process for this GPU (peer access or VMM import: World::alloc_symmetric); `symm`
        // outlives `pipe` (field order, and Drop waits for the GPU first); only the ranks'
        // pipelines write into them, between the barriers of `forward`.
        let pipe =
            unsafe { Pipeline::new(gpu, &jit, shape, world.rank(), &w1, &w2, symm.bases()) }?;
        gpu.synchronize()?;
        // Every rank's buffer is filled and its barrier signals are 0 before any rank returns: a
        // device forward has no host meeting of its own, and a rank that queued one while a peer
        // still built its pipeline would read the peer's poisoned signals as arrivals and have
        // its dispatch rows overwritten by the peer's fill.
        world.barrier()?;
        let marks = EventTrail::new(gpu, FORWARD_MARKS)?;
        Ok(Self {
            world,
            jit,
            pipe,
            symm,
            config: *config,
            marks,
            stage_marks: true,
            uploaded: None,
            path: ForwardPath::Unfused,
            fused_tile: None,
        })
    }

    /// Whether each stage kernel may launch while the one before it still runs (the default; see
    /// [`megamoe_kernel::unfused::Pipeline::set_chained_launches`]).
    pub fn set_chained_launches(&mut self, on: bool) {
        self.pipe.set_chained_launches(on);
    }

    /// Whether forwards time every stage (the default) or only the whole chain ([`StageTimes::span`]):
    /// each mark is an event recorded between two launches, which costs the forward ≈ 1–1.5 µs of
    /// GPU time (perf.md v67).
    pub fn set_stage_marks(&mut self, on: bool) {
        self.stage_marks = on;
    }

    /// How long a device meeting of the ranks waits for a missing rank before the forward gives
    /// up into its error word (every rank of the world sets the same; default
    /// `barriers::DEFAULT_TIMEOUT`).
    pub fn set_barrier_timeout(&mut self, timeout: Duration) {
        self.pipe.set_barrier_timeout(timeout);
    }

    /// Collective, after a forward failed with a rank missing (`BarrierError::RankTimeout`): the
    /// ranks' device meetings start afresh, so the next forward works. Every rank calls it once
    /// its own stream is done; the ranks meet on the host before and after each resets its
    /// barrier words.
    pub fn recover(&mut self) -> Result<(), CudaError> {
        let gpu = self.world.local_gpu();
        gpu.synchronize()?;
        self.world.barrier()?;
        self.pipe.reset_barriers(gpu)?;
        self.world.barrier()?;
        Ok(())
    }

    /// Which kernels the next forwards run (every rank of the world sets the same).
    pub fn set_path(&mut self, path: ForwardPath) {
        self.path = path;
    }

    /// The fused forward's tokens per tile: `None` (the default) picks it from this rank's own
    /// counts (`Pipeline::fused_tile`); a tile fixes it, e.g. the unfused forward's
    /// choice, which makes the two bitwise equal.
    pub fn set_fused_tile(&mut self, tokens_per_tile: Option<usize>) {
        self.fused_tile = tokens_per_tile;
    }

    pub fn gpu(&self) -> &Gpu {
        self.world.local_gpu()
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipe
    }

    /// Whether fused forwards record a timeline (`Some(events per CTA)`; buffers allocated here,
    /// once) or not (`None`, the default; off, the kernel's records are branches not taken).
    pub fn record_timeline(&mut self, events_per_cta: Option<usize>) -> Result<(), CudaError> {
        Ok(self
            .pipe
            .record_timeline(self.world.local_gpu(), events_per_cta)?)
    }

    /// The last fused forward's timeline, if it recorded one (after the forward returned).
    pub fn fused_timeline(&self) -> Result<Option<megamoe_kernel::timeline::Timeline>, CudaError> {
        Ok(self.pipe.fused_timeline(self.world.local_gpu())?)
    }

    /// The symmetric buffer the pipeline's peer-written regions live in.
    pub fn symmetric_buffer(&self) -> &SymmAllocation {
        &self.symm
    }

    /// Poisons y, the combine buffer and the GEMM outputs (tests).
    /// Compiles every GEMM specialization a forward of any T ≤ `max_tokens` can pick, so that no
    /// forward compiles (a rank compiling mid-forward holds its peers at the barriers). Returns how
    /// many GEMM cores the rank holds.
    pub fn warm_up(&mut self) -> Result<usize, CudaError> {
        Ok(self.pipe.warm_up(self.world.local_gpu(), &self.jit)?)
    }

    /// Compiles the fused kernel of every GEMM tile a forward of any T ≤ `max_tokens` can pick,
    /// so that no fused forward compiles (the device forward, [`Self::forward_device`], above
    /// all). Returns how many the rank holds.
    pub fn warm_up_fused(&mut self) -> Result<usize, CudaError> {
        Ok(self.pipe.warm_up_fused(self.world.local_gpu(), &self.jit)?)
    }

    /// Collective, queued on `stream` (the caller's, on this rank's GPU): the fused forward of
    /// inputs already on the device into the caller's `y` ([`DeviceIo`]), with no allocation, no
    /// host-device copy and no host synchronization, so an engine's stream runs on and a CUDA
    /// graph can capture it (with `io.tokens_dev`, one graph serves every T up to `io.tokens`).
    /// After `stream` is done, [`Self::check_device_forward`] says whether the device refused
    /// the inputs or a rank did not arrive.
    ///
    /// # Safety
    /// As `megamoe_kernel::unfused::Pipeline::forward_fused_on`: `io`'s addresses are device
    /// memory of this rank's GPU holding what [`DeviceIo`] says, live and unwritten by other work
    /// until the forward is done; every rank queues its forward.
    pub unsafe fn forward_device(
        &mut self,
        stream: &CudaStream,
        io: &DeviceIo,
    ) -> Result<(), CudaError> {
        let gpu = self.world.local_gpu();
        // SAFETY: the caller's contract.
        unsafe { self.pipe.forward_fused_on(gpu, &self.jit, stream, io) }?;
        Ok(())
    }

    /// [`Self::forward_device`] on a raw `CUstream` of this rank's GPU context, for an engine on
    /// another cudarc version or another binding (the `#[repr(C)]` raw layer: `DeviceIo` and a
    /// stream handle).
    ///
    /// # Safety
    /// As [`Self::forward_device`], and `stream` is a live stream of this rank's GPU context.
    pub unsafe fn forward_device_raw(
        &mut self,
        stream: sys::CUstream,
        io: &DeviceIo,
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's contract; the wrapper does not outlive the call and owns nothing.
        let stream = unsafe {
            self.world
                .local_gpu()
                .stream()
                .context()
                .wrap_borrowed_stream(stream)
        };
        // SAFETY: the caller's contract.
        unsafe { self.forward_device(&stream, io) }
    }

    /// After the stream of the last [`Self::forward_device`] is done: what the device refused
    /// (expert ids, a device T out of range, capacity) or a rank that did not arrive.
    pub fn check_device_forward(&self) -> Result<(), CudaError> {
        Ok(self.pipe.check_errors(self.world.local_gpu())?)
    }

    /// How many GEMM cores this rank has compiled ([`Self::warm_up`]).
    pub fn compiled_gemms(&self) -> usize {
        self.pipe.compiled_gemms()
    }

    /// Device allocations made so far through this rank's GPU handle, which allocates everything
    /// the rank holds (`cuda_rt::Gpu::device_allocations`): the symmetric buffer, the pipeline's
    /// buffers and weights, each compiled kernel's workspace — and an engine's own buffers when
    /// it allocates through [`Self::gpu`]. Forwards allocate none once the kernels they pick are
    /// compiled ([`Self::warm_up`], [`Self::warm_up_fused`]): the count stands still across them.
    pub fn device_allocations(&self) -> u64 {
        self.world.local_gpu().device_allocations()
    }

    /// Fills y and every buffer a forward writes before it reads it with 0xff bytes
    /// (`Pipeline::poison`; tests): the next forward must rewrite all it reads, so a stage reading
    /// rows the stage before it has not stored yet shows as NaN or a difference, not as the last
    /// forward's values.
    pub fn poison(&mut self) -> Result<(), CudaError> {
        let gpu = self.world.local_gpu();
        self.pipe.poison(gpu)?;
        gpu.synchronize()?;
        Ok(())
    }

    /// Collective: one forward of this rank's `inputs`; returns y (BF16 `[T][H]`) and the stage times.
    pub fn forward(&mut self, inputs: &RankInputs) -> Result<(Vec<bf16>, StageTimes), CudaError> {
        let gpu = self.world.local_gpu();
        let clock = Instant::now();
        // Stage 1a: counts; every rank learns whether all ranks accepted their inputs.
        let counts = inputs
            .validate(&self.config)
            .map_err(CudaError::from)
            .and_then(|()| {
                let counts = self.pipe.set_inputs(
                    gpu,
                    &inputs.x,
                    &inputs.x_sf,
                    &inputs.topk_idx,
                    &inputs.topk_weights,
                )?;
                // The upload is over when its copies are: the rest of the forward starts with the
                // inputs on the device, as an engine's would be.
                self.pipe.stage_sync(gpu)?;
                Ok(counts)
            });
        self.uploaded = counts.as_ref().ok().cloned();
        // Every rank's inputs on its device before the route step starts: its counts exchange
        // would otherwise wait for the slowest rank's upload and count it as the forward's.
        self.world.barrier()?;
        let upload = clock.elapsed();
        let mut times = self.run(counts)?;
        times.upload = upload;
        let clock = Instant::now();
        let y = self.y()?;
        times.download = clock.elapsed();
        Ok((y, times))
    }

    /// The last forward's y (BF16 `[T][H]`), downloaded.
    pub fn y(&self) -> Result<Vec<bf16>, CudaError> {
        let y = self.pipe.download_y(self.world.local_gpu())?;
        Ok(y.into_iter().map(bf16::from_bits).collect())
    }

    /// Collective: the forward of the inputs the last successful [`CudaRank::forward`] uploaded,
    /// again, without host I/O (y stays on the device): forwards back to back keep the GPU busy,
    /// as serving does, where one forward with its host I/O leaves it idle in between.
    pub fn rerun(&mut self) -> Result<StageTimes, CudaError> {
        let counts = self
            .uploaded
            .clone()
            .ok_or_else(|| CudaError::Exchange("rerun before a successful forward".into()))?;
        self.run(Ok(counts))
    }

    /// Collective: the fused forward from this rank's expert counts (or its input error) to y on
    /// the device: one launch, the plan made in it. The ranks meet once on the host before it
    /// (whether every rank's inputs stand, after any compile), so that no launch waits on the
    /// device for a rank that refused its inputs or is still compiling.
    fn run_fused(&mut self, counts: Result<Vec<u32>, CudaError>) -> Result<StageTimes, CudaError> {
        let world = Arc::clone(&self.world);
        let gpu = world.local_gpu();
        let me = world.rank();
        let mut times = StageTimes::default();
        let mut clock = Instant::now();
        let tile = match &counts {
            Ok(c) => {
                let tile = self
                    .fused_tile
                    .unwrap_or_else(|| self.pipe.fused_tile(0, Some(c)));
                self.pipe
                    .prepare_fused(gpu, &self.jit, tile)
                    .map(|()| tile)
                    .map_err(CudaError::from)
            }
            Err(_) => Ok(0),
        };
        let ok = counts.is_ok() && tile.is_ok();
        let all = world.all_gather(&[u8::from(ok)])?;
        counts?;
        let tile = tile?;
        if let Some(rank) = all.iter().position(|b| b.first() != Some(&1)) {
            return Err(CudaError::PeerFailed { rank, me });
        }
        times.route = lap(&mut clock);
        let stream = gpu.stream().clone();
        self.marks.clear();
        let start = self.marks.mark(&stream)?;
        self.pipe
            .forward_fused(gpu, &self.jit, tile, self.stage_marks)?;
        let end = self.marks.mark(&stream)?;
        times.queue = lap(&mut clock);
        self.pipe.stage_sync(gpu)?;
        times.wall = times.route + times.queue + lap(&mut clock);
        self.pipe.check_errors(gpu)?;
        times.span = Duration::from_secs_f64(f64::from(self.marks.between_ms(start, end)?) * 1e-3);
        times.stage_marks = self.stage_marks;
        // One launch has no stage boundaries the host can mark: the kernel's own clock times them
        // (the meetings of the ranks inside the stages they end).
        if self.stage_marks
            && let Some(t) = self.pipe.fused_stage_times(gpu)?
        {
            times.dispatch = Duration::from_nanos(t.plan_ns + t.dispatch_ns);
            times.l1 = Duration::from_nanos(t.l1_ns);
            times.l2 = Duration::from_nanos(t.l2_ns);
            times.combine = Duration::from_nanos(t.combine_ns);
        }
        Ok(times)
    }

    /// Collective: from this rank's expert counts (or its input error) to y on the device.
    fn run(&mut self, counts: Result<Vec<u32>, CudaError>) -> Result<StageTimes, CudaError> {
        if self.path == ForwardPath::Fused {
            return self.run_fused(counts);
        }
        let world = Arc::clone(&self.world);
        let gpu = world.local_gpu();
        let me = world.rank();
        let mut times = StageTimes::default();
        let mut clock = Instant::now();
        let payload = match &counts {
            Ok(c) => [&[0u8][..], bytemuck::cast_slice(c)].concat(),
            Err(_) => vec![1u8],
        };
        let all = world.all_gather(&payload)?;
        let counts = counts?;
        let mut all_counts = Vec::with_capacity(all.len());
        for (r, b) in all.iter().enumerate() {
            if b.first() != Some(&0) {
                return Err(CudaError::PeerFailed { rank: r, me });
            }
            if b.len() != 1 + 4 * counts.len() {
                return Err(CudaError::Exchange(format!(
                    "rank {r} sent {} count bytes, expected {}",
                    b.len() - 1,
                    4 * counts.len()
                )));
            }
            all_counts.push(
                b[1..]
                    .chunks_exact(4)
                    .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
                    .collect::<Vec<u32>>(),
            );
        }
        // Identical on every rank: a capacity error stops all of them here, before anything is queued.
        self.pipe.set_plans(gpu, &all_counts)?;
        self.pipe.prepare_gemms(gpu, &self.jit)?;
        // The host meeting: no rank compiles while a peer already waits for it on the device.
        world.barrier()?;
        times.route = lap(&mut clock);

        // Every stage queued back to back, timed by events; the ranks meet on the device after
        // the stages that write into peers (dispatch, combine send).
        let stream = gpu.stream().clone();
        let marks = &mut self.marks;
        marks.clear();
        let timed = self.stage_marks;
        let mut mark = |always: bool| -> Result<Option<usize>, CudaError> {
            Ok(if always || timed {
                Some(marks.mark(&stream)?)
            } else {
                None
            })
        };
        let d0 = mark(true)?;
        self.pipe.dispatch(gpu)?;
        let d1 = mark(false)?;
        self.pipe.rank_barrier(gpu)?;
        let g0 = mark(false)?;
        self.pipe.l1(gpu, &self.jit)?;
        let g2 = mark(false)?;
        self.pipe.l2(gpu, &self.jit)?;
        let g3 = mark(false)?;
        self.pipe.combine_send(gpu)?;
        let g4 = mark(false)?;
        self.pipe.rank_barrier(gpu)?;
        let c0 = mark(false)?;
        self.pipe.combine_reduce(gpu)?;
        let c1 = mark(true)?;
        times.queue = lap(&mut clock);
        self.pipe.stage_sync(gpu)?;
        times.wall = times.route + times.queue + lap(&mut clock);
        self.pipe.check_errors(gpu)?;
        let marks = &self.marks;
        let ms = |a: Option<usize>, b: Option<usize>| -> Result<Duration, CudaError> {
            Ok(match (a, b) {
                (Some(a), Some(b)) => {
                    Duration::from_secs_f64(f64::from(marks.between_ms(a, b)?) * 1e-3)
                }
                _ => Duration::ZERO,
            })
        };
        times.span = ms(d0, c1)?;
        times.stage_marks = timed;
        times.dispatch = ms(d0, d1)?;
        times.l1 = ms(g0, g2)?;
        times.l2 = ms(g2, g3)?;
        times.combine = ms(g3, g4)? + ms(c0, c1)?;
        times.barriers = ms(d1, g0)? + ms(g4, c0)?;
        Ok(times)
    }
}

// The handle owns what it uses (the world by `Arc`): an engine stores it in its own state and moves
// it to the thread that drives its GPU.
const _: fn() = || {
    fn owned<T: Send + 'static>() {}
    owned::<CudaRank>();
};

impl Drop for CudaRank {
    fn drop(&mut self) {
        // Unmapping a VMM buffer is not ordered on the stream: nothing of ours may still run.
        if let Err(e) = self.world.local_gpu().synchronize() {
            tracing::warn!(rank = self.world.rank(), error = %e, "GPU synchronize before releasing the pipeline failed");
        }
    }
}

/// Collective: the largest of every rank's `tokens` (the T_max every rank builds its pipeline for).
pub fn agree_max_tokens(world: &World, tokens: usize) -> Result<usize, CudaError> {
    Ok(agree_max(world, tokens as u64)? as usize)
}

/// Collective: the largest of every rank's `value`.
pub fn agree_max(world: &World, value: u64) -> Result<u64, CudaError> {
    let all = world.all_gather(&value.to_le_bytes())?;
    all.iter().enumerate().try_fold(0, |max, (r, b)| {
        let v = <[u8; 8]>::try_from(b.as_slice())
            .map_err(|_| CudaError::Exchange(format!("rank {r} sent {} bytes, not 8", b.len())))?;
        Ok(max.max(u64::from_le_bytes(v)))
    })
}

/// Collective: this rank's pipeline for `weights`, built for the largest T of any rank, and one
/// forward of `inputs`.
pub fn forward_rank(
    world: &Arc<World>,
    config: &Config,
    routes: impl Into<Routes>,
    weights: &RankWeights,
    inputs: &RankInputs,
) -> Result<(Vec<bf16>, StageTimes), CudaError> {
    let max_tokens = agree_max_tokens(world, inputs.tokens)?;
    CudaRank::new(Arc::clone(world), config, max_tokens, routes, weights)?.forward(inputs)
}

/// `f` on one rank's world, then (when it succeeded) a barrier, so that no rank releases its
/// buffers while a peer may still use them; errors name the rank.
fn on_rank<T>(
    world: &Arc<World>,
    f: impl FnOnce(&Arc<World>) -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    let rank = world.rank();
    let out = f(world).and_then(|out| {
        world.barrier()?;
        Ok(out)
    });
    out.map_err(|e| CudaError::Rank {
        rank,
        source: Box::new(e),
    })
}

/// Runs `f` on every rank of a local world placed as `placement` says, one thread each; results
/// by rank. Refused with [`CudaError::Placement`] when fewer GPUs are present; when several ranks
/// fail, [`CudaError::Ranks`] keeps every rank's error.
pub fn run_local<T: Send>(
    placement: Placement,
    f: impl Fn(&Arc<World>) -> Result<T, CudaError> + Sync,
) -> Result<Vec<T>, CudaError> {
    placement.check()?;
    let worlds = World::local(&placement.ordinals())?;
    let results: Vec<Result<T, CudaError>> = std::thread::scope(|s| {
        let handles: Vec<_> = worlds
            .into_iter()
            .map(|world| {
                let f = &f;
                s.spawn(move || on_rank(&Arc::new(world), f))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank thread panicked"))
            .collect()
    });
    let mut failures = Vec::new();
    let mut outputs = Vec::with_capacity(results.len());
    for result in results {
        match result {
            Ok(out) => outputs.push(out),
            Err(e) => failures.push(e),
        }
    }
    match failures.len() {
        0 => Ok(outputs),
        1 => Err(failures.remove(0)),
        _ => Err(CudaError::Ranks { failures }),
    }
}

/// Runs `f` as this process's rank of a process world ([`World::from_env`]: torchrun's variables,
/// as [`spawn_rank_processes`] sets them); the multi-process counterpart of [`run_local`].
pub fn run_process<T>(f: impl FnOnce(&Arc<World>) -> Result<T, CudaError>) -> Result<T, CudaError> {
    let env = ProcessEnv::from_env()?;
    let world = World::from_process_env(&env).map_err(|e| match e {
        // This rank's GPU; the world's own errors name the rank already.
        WorldError::Cuda(_) => CudaError::Rank {
            rank: env.rank,
            source: Box::new(e.into()),
        },
        e => e.into(),
    })?;
    on_rank(&Arc::new(world), f)
}

/// Runs `program` with `args` once per rank of a process world placed as `placement` says
/// (`symm_mem::spawn_ranks`: torchrun's variables set, collectives timing out after
/// [`ProcessEnv::DEFAULT_TIMEOUT`], killed after [`PROCESS_DEADLINE`]) and waits for all of them;
/// each is expected to act as its rank ([`run_process`]). Returns every rank's output, or
/// [`CudaError::RankProcesses`] with the output of each rank that failed. Refused with
/// [`CudaError::Placement`] when fewer GPUs are present.
pub fn spawn_rank_processes(
    placement: Placement,
    program: &Path,
    args: &[OsString],
) -> Result<Vec<RankOutput>, CudaError> {
    placement.check()?;
    let ranks = placement.ranks;
    tracing::info!(ranks, program = %program.display(), "launching one process per rank");
    let outputs = spawn_ranks(
        ranks,
        placement.ranks_per_gpu,
        ProcessEnv::DEFAULT_TIMEOUT,
        PROCESS_DEADLINE,
        |_| {
            let mut cmd = Command::new(program);
            cmd.args(args);
            cmd
        },
    )?;
    let (done, failed): (Vec<_>, Vec<_>) = outputs.into_iter().partition(RankOutput::success);
    if failed.is_empty() {
        Ok(done)
    } else {
        Err(CudaError::RankProcesses { ranks, failed })
    }
}

/// The whole problem on `problem.config.num_ranks` local GPUs, GEMMs through `routes`: y of every
/// rank.
pub fn forward(problem: &Problem, routes: impl Into<Routes>) -> Result<Vec<Vec<bf16>>, CudaError> {
    let placement = Placement::one_gpu_per_rank(problem.config.num_ranks);
    Ok(forward_timed(problem, routes, placement)?
        .into_iter()
        .map(|(y, _)| y)
        .collect())
}

/// [`forward`] with each rank's stage times, the ranks placed on the GPUs as `placement` says.
pub fn forward_timed(
    problem: &Problem,
    routes: impl Into<Routes>,
    placement: Placement,
) -> Result<Vec<(Vec<bf16>, StageTimes)>, CudaError> {
    let routes = routes.into();
    problem.validate()?;
    let config = &problem.config;
    let max_tokens = problem.inputs.iter().map(|x| x.tokens).max().unwrap_or(0);
    run_local(placement, |world| {
        let r = world.rank();
        let mut rank = CudaRank::new(
            world.clone(),
            config,
            max_tokens,
            routes,
            &problem.weights[r],
        )?;
        rank.forward(&problem.inputs[r])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failed_local_rank_is_named() {
        let failures = vec![
            CudaError::Rank {
                rank: 0,
                source: Box::new(CudaError::Exchange("rank 2 missing at the meeting".into())),
            },
            CudaError::Rank {
                rank: 2,
                source: Box::new(CudaError::Exchange("its GEMM's wait gave up".into())),
            },
        ];
        let message = CudaError::Ranks { failures }.to_string();
        assert!(message.starts_with("2 ranks failed"), "{message}");
        for part in [
            "rank 0: exchange: rank 2 missing",
            "rank 2: exchange: its GEMM's wait",
        ] {
            assert!(message.contains(part), "{message}");
        }
    }

    #[test]
    fn failed_rank_processes_are_named_with_their_output() {
        use std::os::unix::process::ExitStatusExt;
        let err = CudaError::RankProcesses {
            ranks: 2,
            failed: vec![RankOutput {
                rank: 1,
                status: Some(std::process::ExitStatus::from_raw(1 << 8)),
                stdout: String::new(),
                stderr: "Error: rank 1: pool capacity\n".into(),
            }],
        };
        let message = err.to_string();
        assert!(
            message.starts_with("1 of 2 rank process(es) failed:\nrank 1: exit status: 1\n")
                && message.contains("    Error: rank 1: pool capacity"),
            "{message}"
        );
    }

    #[test]
    fn stage_times_add_up() {
        let t = StageTimes {
            upload: Duration::from_micros(7),
            route: Duration::from_micros(1),
            queue: Duration::from_micros(10),
            span: Duration::from_micros(29),
            stage_marks: true,
            dispatch: Duration::from_micros(2),
            l1: Duration::from_micros(7),
            l2: Duration::from_micros(5),
            combine: Duration::from_micros(6),
            barriers: Duration::from_micros(9),
            wall: Duration::from_micros(40),
            download: Duration::from_micros(8),
        };
        assert_eq!(t.kernels(), Duration::from_micros(29));
        assert_eq!(t.total(), Duration::from_micros(55));
        assert_eq!(t.stages()[3], ("L1", Duration::from_micros(7)));
        assert_eq!(
            t.to_string(),
            "upload 0.007, route 0.001, dispatch 0.002, L1 0.007, L2 0.005, \
             combine 0.006, barriers 0.009, download 0.008 ms"
        );
    }
}
