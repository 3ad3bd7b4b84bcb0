//! The unfused MoE pipeline on one GPU of an expert-parallel world: dispatch → L1 GEMM (its
//! epilogue SwiGLU + re-quantization into the L2 pool, [`crate::epilogue`]) → L2 GEMM → combine,
//! each its own launch (`cuda/sm90_unfused.cuh` for the glue, the grouped GEMM of [`crate::gemm`]
//! for L1/L2). After each stage that writes into peers
//! ([`Pipeline::dispatch`], [`Pipeline::combine_send`]) the ranks meet on the device
//! ([`Pipeline::rank_barrier`]: `barriers`' cross-rank barrier, which times out into an error
//! word, as do the GEMMs' split-tail hand-overs; [`Pipeline::check_errors`]), so a forward is one
//! stream of launches the host only enqueues.
//!
//! The buffers peers write into are the regions of one symmetric buffer per rank, laid out by the
//! buffer protocol ([`crate::protocol`]: [`PeerLayout`], from [`PipelineShape::peer_layout`]),
//! which the caller allocates on every rank (e.g. `symm_mem::World::alloc_symmetric`: plain device
//! memory with peer access for ranks that are threads of one process, VMM memory imported from the
//! other ranks for ranks that are processes) and hands to [`Pipeline::new`] as every rank's base
//! address mapped in this process. At large T the L1 pool's rows from peers arrive staged, as the
//! peers send them, and [`Pipeline::l1`] first moves them into the pool. Every rank's
//! [`PeerAddresses`] follow from its base and the fixed offsets, so no address is exchanged. This
//! module knows no world: the caller exchanges the expert counts (e.g. through
//! `symm_mem::World::all_gather`: R × E numbers, no GPU synchronization), or the device does
//! ([`Pipeline::count_routes`], [`Pipeline::plan_on_device`]). Every row of a rank's pool plan
//! gets its [`RowMeta`](crate::protocol::RowMeta) rewritten by every forward — the dispatches write the pairs' rows,
//! `uf_route` the padding after each expert — so the metadata needs no reset between forwards.
//! The destination row of every (token, slot) pair is the device's work (`uf_route`, O(T·k));
//! [`routes`](crate::protocol::routes) is its host twin.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::time::Duration;

use barriers::BarrierError;
use cuda_rt::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PinnedHostSlice};
use cuda_rt::{Arch, Gpu, Jit, Kernel, KernelSpec, LaunchConfig};
use fp_formats::Recipe;
use symm_mem::SymmBuffer;

use crate::epilogue::{Epilogue, SILU_MISFITS_WORD, SILU_TABLE_WORDS, SwigluOut};
use crate::gemm::{
    DeviceBytes, DeviceWeights, GemmCore, GemmError, Mma, Pool, TOKEN_TILES, TilePlan,
};
use crate::protocol::{
    POOL_ROW_ALIGN, PeerAddresses, PeerLayout, PeerRegion, PipelineShape, PoolPlan, ProtocolError,
    expert_counts,
};
use crate::transform::Fold;
use crate::transform::{GemmWeights, RowOrder};

/// A compiled GEMM core of a pipeline: route, token tile, fold, epilogue.
pub(crate) type CoreKey = (Mma, usize, Fold, Epilogue);

/// Threads per CTA of every glue kernel (`mm::unfused::kThreads`).
const THREADS: u32 = 128;
/// Entries the SiLU table is built from: every BF16 gate, then the clamp
/// (`mm::unfused::kSiluClampEntry` + 1).
const SILU_TABLE_ENTRIES: u32 = (1 << 16) + 1;

/// The glue kernels' source.
pub const UNFUSED_SOURCE: (&str, &str) =
    ("sm90_unfused.cu", include_str!("../cuda/sm90_unfused.cu"));
/// The glue kernels' header.
pub const UNFUSED_HEADER: (&str, &str) =
    ("sm90_unfused.cuh", include_str!("../cuda/sm90_unfused.cuh"));

#[derive(Debug, thiserror::Error)]
pub enum UnfusedError {
    #[error(transparent)]
    Cuda(#[from] cuda_rt::Error),
    #[error(transparent)]
    Gemm(#[from] GemmError),
    #[error(transparent)]
    Transform(#[from] crate::TransformError),
    #[error(transparent)]
    Barrier(#[from] BarrierError),
    #[error(transparent)]
    Symm(#[from] symm_mem::SymmError),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("rank {rank} has {tokens} tokens, the pipeline was built for at most {max} per rank")]
    Tokens {
        rank: usize,
        tokens: usize,
        max: usize,
    },
    /// The device plan of every rank refuses a forward in which one rank's routes hold an
    /// invalid expert id (that rank reports [`ProtocolError::Expert`]).
    #[error(
        "rank {rank} refused its routes (an expert id out of range): the forward is refused on every rank"
    )]
    PeerRoutes { rank: usize },
    /// An activation scale the device read is NaN (UE8M0 255); the forward's y is not to be read.
    #[error("x_sf of token {token}, group {group}: UE8M0 byte 255 is NaN")]
    NanScale { token: usize, group: usize },
    /// A fused forward's T read from the device was outside 0..max (`DeviceIo::tokens_dev`).
    #[error("the device's T is {tokens}, the forward was queued for at most {max}")]
    DeviceTokens { tokens: i64, max: usize },
    /// An engine's device address the fused kernel cannot use as it is ([`crate::fused::DeviceIo`]).
    #[error(
        "DeviceIo::{field} = {address:#x} is null or not aligned to {align} bytes, as the kernel's \
         accesses need"
    )]
    DeviceAddress {
        field: &'static str,
        address: u64,
        align: u64,
    },
    #[error("{what}: {detail}")]
    Shape { what: &'static str, detail: String },
    /// The fast SiLU of this GPU (its `ex2.approx`, `rcp.approx`) is further from the exact one
    /// than the SiLU table's 4-bit corrections reach (`mm::unfused::silu_fix_entry`).
    #[error(
        "the SwiGLU's fast SiLU misses the exact one on {misfits} BF16 gates by more than its \
         table corrects on this GPU"
    )]
    SiluTable { misfits: u32 },
}

/// The device plan's error words (`mm::unfused::kPlanError*`, first error wins) as the typed
/// error its host twin ([`expert_counts`], [`PoolPlan::new`]) returns.
pub(crate) fn plan_error(words: &[u64], shape: PipelineShape) -> Result<(), UnfusedError> {
    let (first, value) = (words[0], words[1]);
    match first >> 60 {
        0 => Ok(()),
        PLAN_ERROR_EXPERT => Err(ProtocolError::Expert {
            token: (first & 0xffff_ffff) as usize,
            slot: ((first >> 32) & 0xffff) as usize,
            value: value as i64,
            experts: shape.num_experts,
        }
        .into()),
        PLAN_ERROR_CAPACITY => Err(ProtocolError::Capacity {
            rank: (first & 0xffff_ffff) as usize,
            rows: value as usize,
            capacity: shape.pool_rows,
        }
        .into()),
        PLAN_ERROR_PEER_ROUTES => Err(UnfusedError::PeerRoutes {
            rank: (first & 0xffff_ffff) as usize,
        }),
        PLAN_ERROR_TOKENS => Err(UnfusedError::DeviceTokens {
            tokens: value as i64,
            max: shape.max_tokens,
        }),
        PLAN_ERROR_SCALE => Err(UnfusedError::NanScale {
            token: (first & 0xffff_ffff) as usize,
            group: value as usize,
        }),
        kind => Err(UnfusedError::Shape {
            what: "device plan error word",
            detail: format!("unknown kind {kind} in {first:#x}"),
        }),
    }
}

/// `mm::unfused::kPlanErrorExpert`, `kPlanErrorCapacity` and `kPlanErrorPeerRoutes`.
const PLAN_ERROR_EXPERT: u64 = 1;
const PLAN_ERROR_CAPACITY: u64 = 2;
const PLAN_ERROR_PEER_ROUTES: u64 = 3;
/// `mm::unfused::kPlanErrorScale`.
const PLAN_ERROR_SCALE: u64 = 5;
/// `mm::mega::kPlanErrorTokens`.
const PLAN_ERROR_TOKENS: u64 = 4;

/// `mm::unfused::DispatchParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct DispatchParams {
    pub(crate) x: u64,
    pub(crate) x_sf: u64,
    pub(crate) route: u64,
    pub(crate) topk_idx: u64,
    pub(crate) topk_w: u64,
    pub(crate) peers: u64,
    pub(crate) tokens: i32,
    pub(crate) top_k: i32,
    pub(crate) hidden: i32,
    pub(crate) experts_per_rank: i32,
    pub(crate) staged_row_bytes: i32,
    pub(crate) sf_stride: i32,
    pub(crate) rank: i32,
    pub(crate) staged: i32,
    pub(crate) error: u64,
}

/// `mm::unfused::RouteParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RouteParams {
    pub(crate) topk_idx: u64,
    pub(crate) first_row: u64,
    pub(crate) route: u64,
    pub(crate) expert_offset: u64,
    pub(crate) expert_rows: u64,
    pub(crate) meta: u64,
    pub(crate) pairs: i32,
    pub(crate) experts_per_rank: i32,
    pub(crate) rank: i32,
    pub(crate) pad: i32,
}

/// Threads per CTA of `uf_route` (`mm::unfused::kRouteThreads`).
const ROUTE_THREADS: u32 = 512;

/// `mm::unfused::UnstageParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct UnstageParams {
    staged: u64,
    sf: u64,
    pool: u64,
    meta: u64,
    rows: i32,
    hidden: i32,
    staged_row_bytes: i32,
    sf_stride: i32,
    rank: i32,
    pad: i32,
}

/// `mm::unfused::CombineSendParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct CombineSendParams {
    pub(crate) l2_out: u64,
    pub(crate) meta: u64,
    pub(crate) peers: u64,
    pub(crate) rows: i32,
    pub(crate) hidden: i32,
    pub(crate) max_tokens: i32,
    pub(crate) rank: i32,
}

/// `mm::unfused::CombineReduceParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct CombineReduceParams {
    pub(crate) combine: u64,
    pub(crate) topk_idx: u64,
    pub(crate) y: u64,
    pub(crate) l2_out: u64,
    pub(crate) route: u64,
    pub(crate) tokens: i32,
    pub(crate) top_k: i32,
    pub(crate) hidden: i32,
    pub(crate) max_tokens: i32,
    pub(crate) experts_per_rank: i32,
    pub(crate) rank: i32,
}

/// `mm::unfused::CountParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct CountParams {
    pub(crate) topk_idx: u64,
    pub(crate) peers: u64,
    pub(crate) error: u64,
    pub(crate) pairs: i32,
    pub(crate) top_k: i32,
    pub(crate) num_experts: i32,
    pub(crate) num_ranks: i32,
    pub(crate) rank: i32,
    pub(crate) pad: i32,
}

/// Threads of `uf_count`'s and `uf_plan`'s one CTA (`mm::unfused::kPlanThreads`).
pub(crate) const PLAN_THREADS: u32 = 1024;

/// `mm::unfused::PlanParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct PlanParams {
    pub(crate) counts: u64,
    pub(crate) first_row: u64,
    pub(crate) expert_offset: u64,
    pub(crate) expert_rows: u64,
    pub(crate) error: u64,
    pub(crate) num_ranks: i32,
    pub(crate) num_experts: i32,
    pub(crate) rank: i32,
    pub(crate) capacity: i32,
    pub(crate) row_align: i32,
    pub(crate) pad: i32,
}

/// `mm::unfused::RankBarrierParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RankBarrierParams {
    pub(crate) view: u64,
    pub(crate) signals: u64,
    pub(crate) error_word: u64,
    pub(crate) timeout_ns: u64,
}

const _: () = {
    assert!(size_of::<RankBarrierParams>() == 32);
    assert!(size_of::<DispatchParams>() == 88);
    assert!(size_of::<CountParams>() == 48);
    assert!(size_of::<PlanParams>() == 64);
    assert!(size_of::<RouteParams>() == 64);
    assert!(size_of::<UnstageParams>() == 56);
    assert!(size_of::<CombineSendParams>() == 40);
    assert!(size_of::<CombineReduceParams>() == 64);
};

/// The glue kernels' specialization for `recipe`'s activation group and the L1 pool's format
/// (the `l1` route's).
pub fn glue_spec(recipe: Recipe, l1: Mma) -> KernelSpec {
    KernelSpec::new(
        format!("megamoe-kernel/sm90_unfused/{recipe}/{l1}"),
        UNFUSED_SOURCE,
    )
    .header(fp_formats::CUDA_HEADER)
    .header(UNFUSED_HEADER)
    .header(crate::pool_order::CUDA_HEADER)
    .headers(barriers::CUDA_HEADERS)
    .header(cuda_rt::CUDA_HEADER)
    .define("UF_G", recipe.group())
    .define("UF_L1_FP8_POOL", u8::from(l1 == Mma::Fp8))
    .no_spill()
}

/// Every glue specialization, for `cargo xtask kernels`.
pub fn kernels() -> Vec<KernelSpec> {
    [
        (Recipe::G128, Mma::Fp8),
        (Recipe::G128, Mma::Bf16),
        (Recipe::Mx32, Mma::Bf16),
    ]
    .map(|(recipe, l1)| glue_spec(recipe, l1))
    .to_vec()
}

/// The glue kernels of one (recipe, routes), loaded on one GPU.
pub struct GlueKernels {
    pub recipe: Recipe,
    silu_table: Kernel,
    route: Kernel,
    dispatch: Kernel,
    unstage: Kernel,
    combine_send: Kernel,
    combine_reduce: Kernel,
    rank_barrier: Kernel,
    count: Kernel,
    plan: Kernel,
}

impl GlueKernels {
    pub fn new(gpu: &Gpu, jit: &Jit, recipe: Recipe, l1: Mma) -> Result<Self, UnfusedError> {
        let arch = gpu.info().arch().unwrap_or(Arch::Sm90a);
        let compiled = jit.compile(&glue_spec(recipe, l1), arch)?;
        let module = gpu.load_module(&compiled.cubin)?;
        Ok(Self {
            recipe,
            silu_table: module.kernel("uf_silu_table")?,
            route: module.kernel("uf_route")?,
            dispatch: module.kernel("uf_dispatch")?,
            unstage: module.kernel("uf_unstage")?,
            combine_send: module.kernel("uf_combine_send")?,
            combine_reduce: module.kernel("uf_combine_reduce")?,
            rank_barrier: module.kernel("uf_rank_barrier")?,
            count: module.kernel("uf_count")?,
            plan: module.kernel("uf_plan")?,
        })
    }
}

/// One rank's inputs on the device, sized for `max_tokens` and reused by every forward.
pub(crate) struct Inputs {
    pub(crate) x: CudaSlice<u8>,
    pub(crate) x_sf: CudaSlice<u8>,
    pub(crate) topk_idx: CudaSlice<i32>,
    pub(crate) topk_w: CudaSlice<f32>,
}

/// Resident glue CTAs per SM the split aims for (128 threads each: 16 fill an SM).
const GLUE_CTAS_PER_SM: usize = 16;

/// Rows from peers are staged (`PipelineShape::staged_row_bytes`) when the owners get at least
/// this many of them on average ([`Pipeline::set_plans`]).
const STAGED_MIN_PEER_ROWS: usize = 1024;

/// Whether this forward's rows from peers go through `l1_staged`: staging pays once what it saves
/// (FP8: ≈ 9 ns a row of single-byte NVLink stores, perf.md v33; BF16: half of a 2H-byte row's
/// NVLink time) outweighs the extra launch (≈ 8 µs: +1.5 % at T = 128 on 2×H200, v34). From every
/// owner's plan, so every rank decides alike.
fn stages_rows(plans: &[PoolPlan]) -> bool {
    let peer_rows: usize = plans.iter().map(|p| p.peer_rows).sum();
    peer_rows >= STAGED_MIN_PEER_ROWS * plans.len()
}

/// A glue kernel's grid: a CTA per row (pair, pool row or token) along x, each row's `channels`
/// split over y (`per_thread` channels per thread and pass) when there are too few rows to put
/// [`GLUE_CTAS_PER_SM`] CTAs on every SM: small T is latency-bound, large T keeps one CTA a row.
fn glue_grid(gpu: &Gpu, rows: usize, channels: usize, per_thread: usize) -> LaunchConfig {
    glue_grid_for(gpu.info().sm_count as usize, rows, channels, per_thread)
}

fn glue_grid_for(sms: usize, rows: usize, channels: usize, per_thread: usize) -> LaunchConfig {
    let target = sms * GLUE_CTAS_PER_SM;
    let chunks = channels.div_ceil(per_thread * THREADS as usize);
    let split = target.div_ceil(rows.max(1)).clamp(1, chunks);
    LaunchConfig::new([rows as u32, split as u32, 1], [THREADS, 1, 1])
}

/// `len.max(1)` elements poisoned with `0xff` bytes.
fn poisoned<T: cuda_rt::cudarc::driver::DeviceRepr + cuda_rt::cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    len: usize,
) -> Result<CudaSlice<T>, cuda_rt::Error> {
    let mut s = gpu.alloc_zeros::<T>(len.max(1))?;
    gpu.memset(&mut s, 0xff)?;
    Ok(s)
}

/// Programmatic launches between a forward's stage kernels ([`Pipeline::set_chained_launches`]).
struct LaunchChain {
    enabled: bool,
    /// The last operation queued is a stage kernel that the next one may chain after (not a copy,
    /// not a cross-rank barrier).
    after_stage: bool,
}

impl LaunchChain {
    /// Whether the next stage kernel launches programmatically: it directly follows another one.
    fn next_is_chained(&mut self) -> bool {
        let after_stage = std::mem::replace(&mut self.after_stage, true);
        self.enabled && after_stage
    }

    /// `config` for the next stage kernel.
    fn next(&mut self, config: LaunchConfig) -> LaunchConfig {
        config.programmatic(self.next_is_chained())
    }

    /// Something that is no stage kernel was queued (a copy, a cross-rank barrier): the next
    /// kernel waits for it the ordinary way.
    fn interrupt(&mut self) {
        self.after_stage = false;
    }
}

/// One rank's unfused pipeline: its transformed weights, its local buffers (L1/L2 outputs, the L2
/// pool, y), its view of every rank's symmetric buffer (its own L1 pool, metadata and combine
/// buffer live in its own), and a method per stage. Every stage is queued on the GPU's stream;
/// [`Pipeline::stage_sync`] waits for it. The caller runs, on every rank in this order:
/// [`Pipeline::set_inputs`] (+ the counts exchange and [`Pipeline::set_plans`]), *a host meeting*
/// (no rank compiles while a peer waits on the device), [`Pipeline::dispatch`], *barrier*,
/// [`Pipeline::l1`] (with SwiGLU), [`Pipeline::l2`], [`Pipeline::combine_send`],
/// *barrier*, [`Pipeline::combine_reduce`], [`Pipeline::download_y`] (*barrier* =
/// [`Pipeline::rank_barrier`], on the device). After the last barrier no peer touches this rank's
/// symmetric buffer until its next dispatch.
pub struct Pipeline {
    pub shape: PipelineShape,
    pub rank: usize,
    pub(crate) glue: GlueKernels,
    /// GEMM cores by (route, tokens per tile, fold), compiled on first use.
    pub(crate) cores: HashMap<CoreKey, GemmCore>,
    /// Fused forwards' kernels, one per token tile, prepared on first use ([`crate::fused`];
    /// [`Pipeline::fused_kernel`] finds one).
    pub(crate) fused: Vec<crate::fused::PreparedFused>,
    /// The token tile of the fused kernel this forward launched, if it ran fused.
    pub(crate) launched_fused: Option<usize>,
    /// Where fused forwards record their timeline, when asked ([`Pipeline::record_timeline`]).
    pub(crate) timeline: Option<crate::timeline::TimelineBuffers>,
    pub(crate) w1: DeviceWeights,
    pub(crate) w2: DeviceWeights,
    /// Where the L1 pool, its scales, the RowMeta `[pool_rows]` and the combine buffer lie in
    /// every rank's symmetric buffer.
    pub(crate) layout: PeerLayout,
    /// This rank's own symmetric buffer.
    pub(crate) base: u64,
    /// The [`PeerTable`] ([`PeerLayout::peer_table`]), as bytes.
    pub(crate) peers: CudaSlice<u8>,
    /// This rank's `symm_mem::SymmBuffer` view of every rank's buffer, for the cross-rank barrier.
    pub(crate) barrier_view: CudaSlice<u8>,
    /// The error words a forward's kernels leave, read in one copy by [`Pipeline::check_errors`]:
    /// `[0]` the barrier's (this rank's own, 0 while the ranks are in step), `[1..3]` the device
    /// plan's (`uf_count`, `uf_plan`: 0 while the routes are valid and fit).
    pub(crate) error_words: CudaSlice<u64>,
    /// The GEMM cores this forward launched (keys of `cores`): only their error words can be set.
    pub(crate) launched: Vec<CoreKey>,
    pub(crate) barrier_timeout: Duration,
    /// This forward's rows from peers go through `l1_staged` (set_plans).
    pub(crate) staged_rows: bool,
    /// Which stage kernels launch programmatically ([`Pipeline::set_chained_launches`]).
    chain: LaunchChain,
    /// The SiLU table (`uf_silu_table`), for the L1's SwiGLU epilogue.
    pub(crate) silu: CudaSlice<u32>,
    pub(crate) l2_act: CudaSlice<u8>,
    pub(crate) l2_sf: CudaSlice<u8>,
    pub(crate) l2_out: CudaSlice<u16>,
    pub(crate) y: CudaSlice<u16>,
    pub(crate) inputs: Inputs,
    /// This forward's T ([`Pipeline::set_inputs`]).
    pub(crate) tokens: Option<usize>,
    pub(crate) plan: Option<PoolPlan>,
    /// `[max_tokens·k]`: each (token, slot) pair's row in its owner's pool, −1 when masked
    /// (`uf_route`).
    pub(crate) route: CudaSlice<i32>,
    /// This forward's plan on the device, one copy from `plan_host` (pinned): `[E]` this rank's
    /// first row among each global expert's rows in its owner's pool, then this rank's expert
    /// table, `[E/R]` offsets and `[E/R]` rows ([`Pipeline::plan_tables`]).
    pub(crate) plan_dev: CudaSlice<i32>,
    pub(crate) plan_host: PinnedHostSlice<i32>,
}

impl Pipeline {
    /// Transformed weights `w1` (n = 2I, K = H) and `w2` (n = H, K = I) of this rank's experts, the
    /// local buffers of `shape`, and the peer table from `peer_bases` (every rank's symmetric buffer
    /// of [`PipelineShape::peer_layout`]`.bytes`, by rank, as mapped in this process). This rank's
    /// own symmetric buffer and every local buffer are poisoned with 0xff bytes.
    ///
    /// # Safety
    /// `peer_bases[r]` must be the base of rank r's symmetric buffer of at least
    /// `shape.peer_layout().bytes` bytes, mapped in this process so that `gpu` may read and write
    /// it (`peer_bases[rank]` is `gpu`'s own memory), live for as long as the pipeline, and written
    /// only by the pipelines of the same world, ordered by the barriers described on [`Pipeline`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new(
        gpu: &Gpu,
        jit: &Jit,
        shape: PipelineShape,
        rank: usize,
        w1: &GemmWeights,
        w2: &GemmWeights,
        peer_bases: &[u64],
    ) -> Result<Self, UnfusedError> {
        shape.validate()?;
        let el = shape.experts_per_rank();
        let (h, i) = (shape.hidden, shape.intermediate);
        let routes = shape.routes;
        // The L1's SwiGLU epilogue needs its gate and up rows interleaved (transform_l1_weights).
        for (name, w, mma, n, k, rows) in [
            ("w1", w1, routes.l1, 2 * i, h, RowOrder::GateUp),
            ("w2", w2, routes.l2, h, i, RowOrder::Canonical),
        ] {
            if w.mma != mma || w.num_experts != el || w.n != n || w.k != k || w.rows != rows {
                return Err(UnfusedError::Shape {
                    what: name,
                    detail: format!(
                        "transformed for {} with {} experts of {}×{}, rows {:?}; the pipeline needs {mma} \
                         with {el} of {n}×{k}, rows {rows:?}",
                        w.mma, w.num_experts, w.n, w.k, w.rows
                    ),
                });
            }
        }
        if rank >= shape.num_ranks {
            return Err(UnfusedError::Shape {
                what: "rank",
                detail: format!("{rank} is not below R = {}", shape.num_ranks),
            });
        }
        let layout = shape.peer_layout();
        let table = layout.peer_table(peer_bases, shape.num_ranks)?;
        let view = SymmBuffer::new(rank as u32, peer_bases)?;
        let rows = shape.pool_rows;
        let pairs = shape.max_tokens * shape.top_k;
        let glue = GlueKernels::new(gpu, jit, shape.recipe, routes.l1)?;
        let mut silu = gpu.alloc_zeros::<u32>(SILU_TABLE_WORDS)?;
        // SAFETY: one thread per BF16 gate and one for the clamp, into the zeroed table.
        unsafe {
            glue.silu_table
                .launch(
                    gpu.stream(),
                    LaunchConfig::linear(SILU_TABLE_ENTRIES.div_ceil(THREADS), THREADS),
                )
                .ptr_mut(&mut silu)
                .scalar(i32::from(shape.clamp.is_some()))
                .scalar(shape.clamp.unwrap_or(0.0))
                .launch()?
        };
        let misfits = gpu.download(&silu)?[SILU_MISFITS_WORD];
        if misfits != 0 {
            return Err(UnfusedError::SiluTable { misfits });
        }
        let pipeline = Self {
            shape,
            rank,
            glue,
            cores: HashMap::new(),
            fused: Vec::with_capacity(TOKEN_TILES.len()),
            launched_fused: None,
            timeline: None,
            w1: DeviceWeights::upload(gpu, w1)?,
            w2: DeviceWeights::upload(gpu, w2)?,
            layout,
            base: peer_bases[rank],
            peers: gpu.upload(bytemuck::bytes_of(&table))?,
            barrier_view: gpu.upload(bytemuck::bytes_of(&view))?,
            error_words: gpu.alloc_zeros(3)?,
            launched: Vec::with_capacity(2),
            barrier_timeout: barriers::DEFAULT_TIMEOUT,
            staged_rows: false,
            chain: LaunchChain {
                enabled: true,
                after_stage: false,
            },
            silu,
            l2_act: poisoned(gpu, rows * i * routes.l2.act_elem())?,
            l2_sf: poisoned(gpu, shape.sf_bytes(routes.l2, i))?,
            l2_out: poisoned(gpu, rows * h)?,
            y: poisoned(gpu, shape.max_tokens * h)?,
            inputs: Inputs {
                x: poisoned(gpu, shape.max_tokens * h)?,
                x_sf: poisoned(gpu, shape.max_tokens * h / shape.recipe.group())?,
                topk_idx: poisoned(gpu, pairs)?,
                topk_w: poisoned(gpu, pairs)?,
            },
            tokens: None,
            plan: None,
            route: poisoned(gpu, pairs)?,
            plan_dev: poisoned(gpu, shape.num_experts + 2 * el)?,
            plan_host: gpu.alloc_pinned(shape.num_experts + 2 * el)?,
        };
        // Last, so that nothing is queued on this buffer when an earlier step fails; no peer
        // writes into it before the first forward's host meeting. The barrier's signals start at 0.
        pipeline.fill_own(
            gpu,
            PeerRegion {
                offset: 0,
                bytes: layout.bytes,
            },
            0xff,
        )?;
        pipeline.fill_own(gpu, layout.signals, 0)?;
        Ok(pipeline)
    }

    /// After a cross-rank meeting timed out (the ranks' barrier epochs are out of step: every
    /// later meeting gives up at once): this rank's signals and error words back to 0, as a new
    /// pipeline's. Collective in effect: every rank resets once every rank's stream is done (no
    /// kernel of any rank still writes into this buffer), and none launches before all have.
    pub fn reset_barriers(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        self.fill_own(gpu, self.layout.signals, 0)?;
        gpu.memset(&mut self.error_words, 0)?;
        gpu.synchronize()?;
        Ok(())
    }

    /// The regions of this rank's own symmetric buffer.
    pub(crate) fn own(&self) -> PeerAddresses {
        self.layout.addresses(self.base)
    }

    /// Sets `region` of this rank's own symmetric buffer to `byte`, ordered on the stream. Only for
    /// regions no peer writes into before the next barrier.
    fn fill_own(&self, gpu: &Gpu, region: PeerRegion, byte: u8) -> Result<(), UnfusedError> {
        if region.bytes > 0 {
            // SAFETY: inside this rank's own buffer of layout.bytes bytes on `gpu`
            // (Pipeline::new's contract); the caller keeps peers out.
            unsafe { gpu.memset_raw(self.base + region.offset as u64, region.bytes, byte)? };
        }
        Ok(())
    }

    /// Poisons everything a forward writes before it reads it — y, the combine buffer, both pools
    /// (rows, scales, staged rows, RowMeta) and the L2's output — with 0xff bytes (NaN in E4M3,
    /// BF16 and FP32; −1 in the metadata): a test's next forward must rewrite every element it
    /// reads, so a stage that reads its input before the stage before it has stored it cannot
    /// pass on the previous forward's values.
    pub fn poison(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        gpu.memset(&mut self.y, 0xff)?;
        // Peers write into this rank's regions only between a forward's meeting before the
        // dispatch and its last barrier.
        let l = self.layout;
        for region in [l.l1_act, l.l1_sf, l.l1_staged, l.meta, l.combine] {
            self.fill_own(gpu, region, 0xff)?;
        }
        gpu.memset(&mut self.l2_act, 0xff)?;
        gpu.memset(&mut self.l2_sf, 0xff)?;
        gpu.memset(&mut self.l2_out, 0xff)?;
        Ok(())
    }

    /// Uploads this rank's tokens: `x` E4M3 `[T][H]`, `x_sf` `[T][H/G]`, `topk_idx` `[T][k]`,
    /// `topk_weights` `[T][k]`. Returns this rank's [`expert_counts`] for the exchange.
    pub fn set_inputs(
        &mut self,
        gpu: &Gpu,
        x: &[u8],
        x_sf: &[u8],
        topk_idx: &[i64],
        topk_weights: &[f32],
    ) -> Result<Vec<u32>, UnfusedError> {
        let s = &self.shape;
        let (h, k, g) = (s.hidden, s.top_k, s.recipe.group());
        let tokens = x.len() / h;
        if tokens > s.max_tokens {
            return Err(UnfusedError::Tokens {
                rank: self.rank,
                tokens,
                max: s.max_tokens,
            });
        }
        for (what, len, want) in [
            ("x", x.len(), tokens * h),
            ("x_sf", x_sf.len(), tokens * h / g),
            ("topk_idx", topk_idx.len(), tokens * k),
            ("topk_weights", topk_weights.len(), tokens * k),
        ] {
            if len != want {
                return Err(UnfusedError::Shape {
                    what,
                    detail: format!("{len} elements, {tokens} tokens need {want}"),
                });
            }
        }
        let counts = expert_counts(topk_idx, k, s.num_experts)?;
        let idx32: Vec<i32> = topk_idx.iter().map(|&e| e as i32).collect();
        let inputs = &mut self.inputs;
        gpu.upload_into(x, &mut inputs.x)?;
        gpu.upload_into(x_sf, &mut inputs.x_sf)?;
        gpu.upload_into(&idx32, &mut inputs.topk_idx)?;
        gpu.upload_into(topk_weights, &mut inputs.topk_w)?;
        self.tokens = Some(tokens);
        self.launched.clear();
        self.launched_fused = None;
        Ok(counts)
    }

    /// Every owner's plan from every source's counts (`counts[src]`): where this rank's pairs of
    /// each expert start (for `uf_route`, queued by [`Pipeline::dispatch`]) and its own expert
    /// table, uploaded on the stream. Every rank computes every plan, so a capacity error is seen
    /// by all ranks alike (none waits at a barrier for one that refused), before anything is queued.
    pub fn set_plans(&mut self, gpu: &Gpu, counts: &[Vec<u32>]) -> Result<(), UnfusedError> {
        let s = self.shape;
        let el = s.experts_per_rank();
        if counts.len() != s.num_ranks || counts.iter().any(|c| c.len() != s.num_experts) {
            return Err(UnfusedError::Shape {
                what: "expert counts",
                detail: format!(
                    "{} ranks of {:?} counts, need {} of {}",
                    counts.len(),
                    counts.iter().map(Vec::len).collect::<Vec<_>>(),
                    s.num_ranks,
                    s.num_experts
                ),
            });
        }
        let plans = (0..s.num_ranks)
            .map(|owner| PoolPlan::new(counts, owner, el, s.pool_rows))
            .collect::<Result<Vec<_>, _>>()?;
        let own = plans[self.rank].clone();
        let host = self
            .plan_host
            .as_mut_slice()
            .map_err(|source| cuda_rt::Error::Driver {
                call: "cuEventSynchronize",
                source,
            })?;
        let (first_row, table) = host.split_at_mut(s.num_experts);
        for (e, row) in first_row.iter_mut().enumerate() {
            *row = plans[e / el].source_base[self.rank][e % el];
        }
        table[..el].copy_from_slice(&own.expert_offset);
        table[el..].copy_from_slice(&own.expert_rows);
        gpu.upload_into(&self.plan_host, &mut self.plan_dev)?;
        // The dispatch's error words (a NaN scale) start this forward from zero.
        gpu.memset(&mut self.error_words.slice_mut(1..3), 0)?;
        self.chain.interrupt();
        self.staged_rows = stages_rows(&plans);
        self.plan = Some(own);
        Ok(())
    }

    /// Where `plan_dev`'s three tables lie: first rows `[E]`, this rank's expert offsets and rows
    /// `[E/R]` each.
    pub(crate) fn plan_tables(shape: &PipelineShape) -> [std::ops::Range<usize>; 3] {
        let (e, el) = (shape.num_experts, shape.experts_per_rank());
        [0..e, e..e + el, e + el..e + 2 * el]
    }

    /// This rank's pool plan (after [`Pipeline::set_plans`]).
    pub fn plan(&self) -> Option<&PoolPlan> {
        self.plan.as_ref()
    }

    /// Whether each stage kernel may launch while the one before it still runs (the default): it
    /// starts with `griddepcontrol`'s wait for its predecessor (cuda_rt.cuh), so only the launch
    /// and the CTAs' set-up overlap the previous stage, never its work. Not across a cross-rank
    /// barrier or the plan's copy.
    pub fn set_chained_launches(&mut self, on: bool) {
        self.chain.enabled = on;
    }

    /// Waits for this rank's queued stages.
    pub fn stage_sync(&self, gpu: &Gpu) -> Result<(), UnfusedError> {
        gpu.synchronize()?;
        Ok(())
    }

    /// How long [`Self::rank_barrier`] waits for a missing rank before it gives up
    /// ([`barriers::DEFAULT_TIMEOUT`] unless set).
    pub fn set_barrier_timeout(&mut self, timeout: Duration) {
        self.barrier_timeout = timeout;
    }

    /// Collective, queued on the stream: the stages every rank queued before it are done, and
    /// their writes into peers visible, before any stage queued after it runs (one CTA meets the
    /// other ranks through the `signals` region; with one rank there is nothing to wait for).
    /// A rank missing for the timeout sets the error word and lets the stream go on, so the
    /// forward's results are void: [`Self::check_errors`] says so once the stream is done.
    pub fn rank_barrier(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        if self.shape.num_ranks == 1 {
            return Ok(());
        }
        let stream = gpu.stream();
        let (view, _g0) = self.barrier_view.device_ptr(stream);
        let error_word = self.error_words.slice(0..1).device_ptr(stream).0;
        let params = RankBarrierParams {
            view,
            signals: self.own().signals,
            error_word,
            timeout_ns: self.barrier_timeout.as_nanos().min(u64::MAX as u128) as u64,
        };
        // SAFETY: the view holds every rank's live buffer (Pipeline::new's contract) and the
        // signals region of shape.num_ranks slots lies in each; the error word is ours.
        unsafe {
            self.glue
                .rank_barrier
                .launch(stream, LaunchConfig::linear(1, 32))
                .scalar(params)
                .launch()?
        };
        // The peers' writes this barrier waits for reach the next stage through its completion.
        self.chain.interrupt();
        Ok(())
    }

    /// After the stream is synchronized: the failure of a [`Self::rank_barrier`] of this pipeline,
    /// naming the rank that did not arrive, or of a GEMM launch's in-kernel wait
    /// ([`GemmCore::check_error`]). Either leaves the forward's results void and the pipeline out of
    /// step (the ranks: every later barrier fails at once; a GEMM core: its hand-over flags):
    /// rebuild the pipelines. One copy of this pipeline's error words, and one per GEMM core this
    /// forward launched.
    pub fn check_errors(&self, gpu: &Gpu) -> Result<(), UnfusedError> {
        let words = gpu.download(&self.error_words)?;
        barriers::check_error_word(words[0])?;
        plan_error(&words[1..3], self.shape)?;
        for key in &self.launched {
            self.cores[key].check_error(gpu)?;
        }
        if let Some(fused) = self.launched_fused.and_then(|tile| self.fused_kernel(tile)) {
            fused.core.check_error(gpu)?;
        }
        Ok(())
    }

    /// Queued on the stream: this rank's routes per global expert, counted from its inputs on the
    /// device (`uf_count`), published as its row of every rank's counts table (peer writes: a
    /// [`Self::rank_barrier`] after it makes them visible). An expert id outside −1..E sets the
    /// plan's error word ([`Self::check_errors`]: [`ProtocolError::Expert`]), which each count
    /// starts from zero: a refused forward leaves nothing a retry would read.
    pub fn count_routes(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        let s = self.shape;
        let tokens = self.tokens.expect("set_inputs before count_routes");
        gpu.memset(&mut self.error_words.slice_mut(1..3), 0)?;
        let stream = gpu.stream();
        let (topk_idx, _g0) = self.inputs.topk_idx.device_ptr(stream);
        let (peers, _g1) = self.peers.device_ptr(stream);
        let error = self.error_words.slice_mut(1..3).device_ptr_mut(stream).0;
        let params = CountParams {
            topk_idx,
            peers,
            error,
            pairs: (tokens * s.top_k) as i32,
            top_k: s.top_k as i32,
            num_experts: s.num_experts as i32,
            num_ranks: s.num_ranks as i32,
            rank: self.rank as i32,
            pad: 0,
        };
        self.chain.interrupt();
        // SAFETY: the peer table holds every rank's live buffer, whose counts region is
        // [num_ranks][num_experts] u32; this rank writes only its own row; `pairs` ids are read.
        unsafe {
            self.glue
                .count
                .launch(
                    stream,
                    LaunchConfig::linear(1, PLAN_THREADS)
                        .dynamic_smem((s.num_experts * size_of::<u32>()) as u32),
                )
                .scalar(params)
                .launch()?
        };
        Ok(())
    }

    /// Queued on the stream, after [`Self::count_routes`] on every rank and a rank barrier: every
    /// owner's plan from the counts table in this rank's buffer (`uf_plan`), into the plan tables
    /// `uf_route` reads — what [`Self::set_plans`] computes on the host and copies. A plan that
    /// needs more rows than the pools hold sets the error word ([`Self::check_errors`]:
    /// [`ProtocolError::Capacity`]).
    pub fn plan_on_device(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        let s = self.shape;
        let stream = gpu.stream();
        let [first_row, expert_offset, expert_rows] =
            Self::plan_tables(&s).map(|table| self.plan_dev.slice(table).device_ptr(stream).0);
        let counts = self.own().counts;
        let error = self.error_words.slice_mut(1..3).device_ptr_mut(stream).0;
        let params = PlanParams {
            counts,
            first_row,
            expert_offset,
            expert_rows,
            error,
            num_ranks: s.num_ranks as i32,
            num_experts: s.num_experts as i32,
            rank: self.rank as i32,
            capacity: s.pool_rows as i32,
            row_align: POOL_ROW_ALIGN as i32,
            pad: 0,
        };
        self.chain.interrupt();
        // SAFETY: the counts region of this rank's own buffer holds [num_ranks][num_experts] u32;
        // the plan tables are [E], [E/R] and [E/R] i32 of plan_dev.
        unsafe {
            self.glue
                .plan
                .launch(stream, LaunchConfig::linear(1, PLAN_THREADS))
                .scalar(params)
                .launch()?
        };
        Ok(())
    }

    /// The plan tables on the device — first rows `[E]`, this rank's expert offsets and rows
    /// `[E/R]` — as the last [`Self::set_plans`] or [`Self::plan_on_device`] left them (waits for
    /// the stream).
    pub fn plan_tables_on_device(&self, gpu: &Gpu) -> Result<[Vec<i32>; 3], UnfusedError> {
        let all = gpu.download(&self.plan_dev)?;
        Ok(Self::plan_tables(&self.shape).map(|table| all[table].to_vec()))
    }

    /// Stage 1: the destination row of each of this rank's (token, slot) pairs and the padding
    /// marks of its own pool (`uf_route`), then the pairs' rows into their owners' L1 pools (peer
    /// writes, `uf_dispatch`).
    pub fn dispatch(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        let s = self.shape;
        let tokens = self.tokens.expect("set_inputs before dispatch");
        assert!(self.plan.is_some(), "set_plans before dispatch");
        let pairs = tokens * s.top_k;
        let own_meta = self.own().meta;
        let inputs = &self.inputs;
        let stream = gpu.stream();
        let (topk_idx, _g4) = inputs.topk_idx.device_ptr(stream);
        let [first_row, expert_offset, expert_rows] =
            Self::plan_tables(&s).map(|table| self.plan_dev.slice(table).device_ptr(stream).0);
        let (route, _g3) = self.route.device_ptr_mut(stream);
        let params = RouteParams {
            topk_idx,
            first_row,
            route,
            expert_offset,
            expert_rows,
            meta: own_meta,
            pairs: pairs as i32,
            experts_per_rank: s.experts_per_rank() as i32,
            rank: self.rank as i32,
            pad: 0,
        };
        // SAFETY: topk_idx and route hold max_tokens·k >= pairs elements, first_row one per global
        // expert (the grid), the expert table one per local expert; the ids were checked against E
        // by set_inputs; padding rows lie below this rank's plan.rows <= pool_rows (its meta
        // region's rows), and peers write only the pairs' rows.
        // Launched with no pairs too: peers may send rows, and the padding must be marked.
        unsafe {
            self.glue
                .route
                .launch(
                    stream,
                    self.chain
                        .next(LaunchConfig::linear(s.num_experts as u32, ROUTE_THREADS)),
                )
                .scalar(params)
                .launch()?
        };
        if pairs == 0 {
            return Ok(());
        }
        let (peers, _g0) = self.peers.device_ptr(stream);
        let (x, _g1) = inputs.x.device_ptr(stream);
        let (x_sf, _g2) = inputs.x_sf.device_ptr(stream);
        let (topk_w, _g5) = inputs.topk_w.device_ptr(stream);
        let error = self.error_words.slice(1..3).device_ptr(stream).0;
        let params = DispatchParams {
            x,
            x_sf,
            route,
            topk_idx,
            topk_w,
            peers,
            error,
            tokens: tokens as i32,
            top_k: s.top_k as i32,
            hidden: s.hidden as i32,
            experts_per_rank: s.experts_per_rank() as i32,
            staged_row_bytes: s.staged_row_bytes() as i32,
            sf_stride: s.sf_stride() as i32,
            rank: self.rank as i32,
            staged: i32::from(self.staged_rows),
        };
        // uf_dispatch takes a token a CTA: its row is read (and, for BF16 pools, widened) once for
        // its k pairs.
        // SAFETY: uf_route's rows (from every owner's plan, as the host's `routes` would give them)
        // lie below the owner's plan.rows <= pool_rows (checked by PoolPlan::new), the peer table
        // holds every rank's live symmetric buffer of `shape.peer_layout()` (Pipeline::new's
        // contract).
        unsafe {
            self.glue
                .dispatch
                .launch(
                    stream,
                    self.chain.next(glue_grid(gpu, tokens, s.hidden, 16)),
                )
                .scalar(params)
                .launch()?
        };
        Ok(())
    }

    /// The route of the L1 (`second` false) or the L2 GEMM.
    fn layer_mma(&self, second: bool) -> Mma {
        if second {
            self.shape.routes.l2
        } else {
            self.shape.routes.l1
        }
    }

    /// Compiles, once, the L1 or L2 GEMM core for this forward's token tile and the layer's weights
    /// (w1 and w2 may fold differently, and take their own routes); returns its key in `cores`.
    fn core(&mut self, gpu: &Gpu, jit: &Jit, second: bool) -> Result<CoreKey, UnfusedError> {
        let bn = self.tokens_per_tile();
        self.core_of_tile(gpu, jit, second, bn)
    }

    /// [`Self::core`] for token tile `bn`.
    fn core_of_tile(
        &mut self,
        gpu: &Gpu,
        jit: &Jit,
        second: bool,
        bn: usize,
    ) -> Result<CoreKey, UnfusedError> {
        let mma = self.layer_mma(second);
        let (fold, epilogue) = if second {
            (self.w2.fold, Epilogue::Bf16Out)
        } else {
            (self.w1.fold, self.l1_epilogue())
        };
        let key = (mma, bn, fold, epilogue);
        if let Entry::Vacant(slot) = self.cores.entry(key) {
            let plan = TilePlan::new(mma, bn)?
                .with_fold(fold)
                .with_epilogue(epilogue);
            slot.insert(GemmCore::new(gpu, jit, plan)?);
        }
        Ok(key)
    }

    /// The L1's epilogue: SwiGLU into the L2 pool (of the recipe's group, the L2 route's format).
    fn l1_epilogue(&self) -> Epilogue {
        Epilogue::Swiglu {
            recipe: self.shape.recipe,
            pool: self.shape.routes.l2,
        }
    }

    /// The L1 SwiGLU epilogue's output: this rank's row metadata, the SiLU table and the L2 pool
    /// (`l2_act`, `l2_sf`: its addresses on `stream`).
    pub(crate) fn swiglu_out(&self, stream: &CudaStream, l2_act: u64, l2_sf: u64) -> SwigluOut {
        SwigluOut {
            meta: self.own().meta,
            silu: self.silu.device_ptr(stream).0,
            l2_act,
            l2_sf,
            intermediate: self.shape.intermediate,
            sf_stride: self.shape.sf_stride(),
            clamp: self.shape.clamp,
        }
    }

    /// Compiles (once) the GEMM cores this forward's plan needs. Called before the stages are
    /// queued, so that no rank compiles while a peer waits for it at a barrier.
    pub fn prepare_gemms(&mut self, gpu: &Gpu, jit: &Jit) -> Result<(), UnfusedError> {
        if self.plan.as_ref().is_some_and(|p| p.rows > 0) {
            self.core(gpu, jit, false)?;
            self.core(gpu, jit, true)?;
        }
        Ok(())
    }

    /// Compiles every GEMM core a forward of this pipeline can pick — each token tile up to the
    /// one for a pool full of one expert's rows, for both layers — so that no forward compiles
    /// (a first batch of a new size would otherwise stall every rank). Returns how many cores the
    /// pipeline holds.
    pub fn warm_up(&mut self, gpu: &Gpu, jit: &Jit) -> Result<usize, UnfusedError> {
        let largest = TilePlan::covering_tile(self.shape.pool_rows as f64);
        for bn in TOKEN_TILES.into_iter().filter(|&bn| bn <= largest) {
            self.core_of_tile(gpu, jit, false, bn)?;
            self.core_of_tile(gpu, jit, true, bn)?;
        }
        Ok(self.cores.len())
    }

    /// How many GEMM cores the pipeline has compiled so far ([`Self::warm_up`]).
    pub fn compiled_gemms(&self) -> usize {
        self.cores.len()
    }

    /// The token tile of the GEMMs for this forward's pool.
    pub fn tokens_per_tile(&self) -> usize {
        TilePlan::tokens_per_tile_for(
            self.plan
                .as_ref()
                .map_or(0.0, PoolPlan::avg_rows_of_hit_experts),
            self.shape.routes,
        )
    }

    fn gemm(&mut self, gpu: &Gpu, jit: &Jit, second: bool) -> Result<(), UnfusedError> {
        let plan = self.plan.as_ref().expect("set_plans before the GEMMs");
        if plan.rows == 0 {
            return Ok(());
        }
        let key = self.core(gpu, jit, second)?;
        if !self.launched.contains(&key) {
            self.launched.push(key);
        }
        let mma = key.0;
        let stream = gpu.stream();
        let swiglu = (!second).then(|| {
            let l2_act = self.l2_act.device_ptr_mut(stream).0;
            let l2_sf = self.l2_sf.device_ptr_mut(stream).0;
            self.swiglu_out(stream, l2_act, l2_sf)
        });
        let plan = self.plan.as_ref().expect("plan");
        let [_, offset_table, rows_table] = Self::plan_tables(&self.shape);
        let (act, sf, weights) = if second {
            (
                DeviceBytes::of(gpu, &self.l2_act),
                DeviceBytes::of(gpu, &self.l2_sf),
                &self.w2,
            )
        } else {
            let (own, layout) = (self.own(), self.layout);
            // SAFETY: this rank's L1 pool regions (Pipeline::new's contract); the dispatch that
            // wrote them is behind a barrier and nothing writes them until the next forward.
            unsafe {
                (
                    DeviceBytes::from_raw(own.l1_act, layout.l1_act.bytes),
                    DeviceBytes::from_raw(own.l1_sf, layout.l1_sf.bytes),
                    &self.w1,
                )
            }
        };
        let pool = Pool {
            act,
            act_sf: (mma == Mma::Fp8).then_some(sf),
            sf_stride: self.shape.sf_stride(),
            rows: plan.rows,
            expert_offset: &plan.expert_offset,
            expert_rows: &plan.expert_rows,
            expert_offset_dev: self.plan_dev.slice(offset_table),
            expert_rows_dev: self.plan_dev.slice(rows_table),
        };
        let core = self.cores.get_mut(&key).expect("compiled above");
        core.chain_after_kernel(self.chain.next_is_chained());
        match swiglu {
            // SAFETY: the L2 pool, its scales, this rank's RowMeta region and the SiLU table are
            // sized for pool_rows >= plan.rows rows of `shape` (Pipeline::new); only this
            // pipeline's stream uses them.
            Some(out) => unsafe { core.run_swiglu(gpu, weights, &pool, &out)? },
            None => core.run(gpu, weights, &pool, &mut self.l2_out)?,
        }
        Ok(())
    }

    /// Stage 2: the L1 GEMM with its SwiGLU epilogue: each row's `x_row · w1_eᵀ` through SwiGLU ×
    /// its top-k weight, re-quantized per G into the L2 pool. Rows from peers that arrived staged
    /// first go into the pool.
    pub fn l1(&mut self, gpu: &Gpu, jit: &Jit) -> Result<(), UnfusedError> {
        self.unstage_rows(gpu)?;
        self.gemm(gpu, jit, false)
    }

    /// Staged rows from peers, `l1_staged` (`[rows][staged_row_bytes]`, as their dispatch wrote
    /// them), into the pool: FP8, their scales into `l1_sf`; BF16, widened into `l1_act`. None
    /// from peers: no launch.
    fn unstage_rows(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        let s = self.shape;
        let plan = self.plan.as_ref().expect("set_plans before l1");
        if !self.staged_rows || plan.peer_rows == 0 {
            return Ok(());
        }
        let rows = plan.rows;
        let own = self.own();
        let params = UnstageParams {
            staged: own.l1_staged,
            sf: own.l1_sf,
            pool: own.l1_act,
            meta: own.meta,
            rows: rows as i32,
            hidden: s.hidden as i32,
            staged_row_bytes: s.staged_row_bytes() as i32,
            sf_stride: s.sf_stride() as i32,
            rank: self.rank as i32,
            pad: 0,
        };
        // FP8: a thread per row; BF16: a CTA per row, as the dispatch.
        let config = match s.routes.l1 {
            Mma::Fp8 => LaunchConfig::new(
                [rows.div_ceil(THREADS as usize) as u32, 1, 1],
                [THREADS, 1, 1],
            ),
            Mma::Bf16 => glue_grid(gpu, rows, s.hidden, 16),
        };
        // SAFETY: this rank's own regions (Pipeline::new's contract), sized for pool_rows >= rows
        // rows; the dispatch that wrote l1_staged is behind a barrier, and the L1 GEMM that reads
        // the pool follows on the same stream.
        unsafe {
            self.glue
                .unstage
                .launch(gpu.stream(), self.chain.next(config))
                .scalar(params)
                .launch()?
        };
        Ok(())
    }

    /// Stage 3: `l2_out[row] = bf16(h_row · w2_eᵀ)`, `[rows][H]`.
    pub fn l2(&mut self, gpu: &Gpu, jit: &Jit) -> Result<(), UnfusedError> {
        self.gemm(gpu, jit, true)
    }

    /// Stage 4a: the rows of other ranks' tokens into their combine buffers (peer writes); a
    /// rank's own tokens' rows stay in its L2 output for [`Pipeline::combine_reduce`]. Nothing on
    /// one rank.
    pub fn combine_send(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        let s = self.shape;
        let rows = self.plan.as_ref().expect("set_plans before combine").rows;
        // One rank: every slot stays in l2_out for combine_reduce.
        if rows == 0 || s.num_ranks == 1 {
            return Ok(());
        }
        let stream = gpu.stream();
        let (peers, _g0) = self.peers.device_ptr(stream);
        let (l2_out, _g1) = self.l2_out.device_ptr(stream);
        let params = CombineSendParams {
            l2_out,
            meta: self.own().meta,
            peers,
            rows: rows as i32,
            hidden: s.hidden as i32,
            max_tokens: s.max_tokens as i32,
            rank: self.rank as i32,
        };
        // SAFETY: every valid row's (rank, token, slot) came from a dispatch of a rank with at
        // most max_tokens tokens and top_k slots; combine buffers are [top_k][max_tokens][H].
        unsafe {
            self.glue
                .combine_send
                .launch(stream, self.chain.next(glue_grid(gpu, rows, s.hidden, 8)))
                .scalar(params)
                .launch()?
        };
        Ok(())
    }

    /// Stage 4b: `y[t] = bf16(Σ_j valid, in order, slot j's L2 row)` — from the combine buffer, or
    /// this rank's own L2 output for slots its experts computed; masked-only tokens → 0.
    pub fn combine_reduce(&mut self, gpu: &Gpu) -> Result<(), UnfusedError> {
        let s = self.shape;
        let tokens = self.tokens.expect("set_inputs before combine");
        if tokens == 0 {
            return Ok(());
        }
        let combine = self.own().combine;
        let stream = gpu.stream();
        let (topk_idx, _g2) = self.inputs.topk_idx.device_ptr(stream);
        let (y, _g3) = self.y.device_ptr_mut(stream);
        let (l2_out, _g4) = self.l2_out.device_ptr(stream);
        let (route, _g5) = self.route.device_ptr(stream);
        let params = CombineReduceParams {
            combine,
            topk_idx,
            y,
            l2_out,
            route,
            tokens: tokens as i32,
            top_k: s.top_k as i32,
            hidden: s.hidden as i32,
            max_tokens: s.max_tokens as i32,
            experts_per_rank: s.experts_per_rank() as i32,
            rank: self.rank as i32,
        };
        // SAFETY: tokens <= max_tokens; y and this rank's combine region are sized for max_tokens;
        // the routes of this rank's own slots are rows of its pool (< pool_rows), written by L2.
        unsafe {
            self.glue
                .combine_reduce
                .launch(stream, self.chain.next(glue_grid(gpu, tokens, s.hidden, 8)))
                .scalar(params)
                .launch()?
        };
        Ok(())
    }

    /// This forward's `y`, BF16 bits `[T][H]`.
    pub fn download_y(&self, gpu: &Gpu) -> Result<Vec<u16>, UnfusedError> {
        let tokens = self.tokens.unwrap_or(0);
        if tokens == 0 {
            return Ok(Vec::new());
        }
        // Only this forward's rows: the buffer holds max_tokens of them (117 MB for V4-Pro at 8192).
        Ok(gpu.download(&self.y.slice(0..tokens * self.shape.hidden))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_staged_when_many_come_from_peers() {
        // 2 ranks, 2 experts each; source r sends `n` pairs to each expert of the other rank.
        let plans = |n: u32| {
            let counts = vec![vec![5, 5, n, n], vec![n, n, 5, 5]];
            (0..2)
                .map(|owner| PoolPlan::new(&counts, owner, 2, 1 << 20).unwrap())
                .collect::<Vec<_>>()
        };
        let at = STAGED_MIN_PEER_ROWS as u32 / 2; // two experts per owner
        assert!(stages_rows(&plans(at)));
        assert!(!stages_rows(&plans(at - 1)));
        assert!(!stages_rows(&plans(0)[..1]), "one rank: no peers");
    }

    /// A forward's launches as the pipeline queues them: the route kernel after the plan's copy,
    /// the dispatch, a cross-rank barrier, the L1 GEMM, the L2 GEMM; only a kernel right after
    /// another stage kernel is programmatic, and none when the chain is off.
    #[test]
    fn only_a_stage_kernel_after_a_stage_kernel_is_chained() {
        for enabled in [true, false] {
            let mut chain = LaunchChain {
                enabled,
                after_stage: false,
            };
            let config = LaunchConfig::linear(1, 32);
            let route = chain.next(config).programmatic;
            let dispatch = chain.next(config).programmatic;
            chain.interrupt(); // rank_barrier
            let l1 = chain.next_is_chained();
            let l2 = chain.next_is_chained();
            assert_eq!([route, dispatch, l1, l2], [false, enabled, false, enabled]);
        }
    }

    #[test]
    fn glue_grids_split_rows_only_when_few() {
        // V4-Pro, 132 SMs: rows of I = 3072 (512 channels a CTA pass) and dispatch (H = 7168).
        assert_eq!(glue_grid_for(132, 768, 3072, 4).grid, [768, 3, 1]);
        assert_eq!(glue_grid_for(132, 48, 7168, 16).grid, [48, 4, 1]);
        assert_eq!(glue_grid_for(132, 49152, 3072, 4).grid, [49152, 1, 1]);
        assert_eq!(glue_grid_for(132, 0, 7168, 8).grid, [0, 7, 1]);
        assert_eq!(glue_grid_for(132, 5, 128, 8).grid, [5, 1, 1]);
    }
}
