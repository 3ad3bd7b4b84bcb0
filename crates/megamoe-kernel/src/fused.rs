//! The fused MoE forward (`cuda/sm90_mega_moe.cuh`): one persistent launch per forward runs every
//! stage of a [`Pipeline`] — count, plan, route, dispatch, L1 with its SwiGLU epilogue, L2, combine — with the same
//! device functions and on the same buffers as the unfused launches, so the two are bitwise equal
//! when they run the same GEMM tiles (the one-CTA kernels' whole-token dispatch alone has device
//! functions of its own, bulk stores from shared memory that write the unfused dispatch's bytes). The plan is made on the device (no host round trip, no
//! counts exchange): a forward is one launch.
//!
//! [`FusedCore`] is one compiled specialization (the two layers' [`TilePlan`]s, the recipe's
//! group) with its persistent grid and the workspace its waits use; [`Pipeline::forward_fused`]
//! queues a forward of the inputs the pipeline uploaded, [`Pipeline::forward_fused_on`] one of an
//! engine's device buffers ([`DeviceIo`]) on the engine's stream, capturable in a CUDA graph.

use cuda_rt::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cuda_rt::{Arch, ArgIndex, Gpu, Jit, Kernel, KernelSpec, LaunchArgs, LaunchConfig};
use fp_formats::Recipe;

use crate::epilogue::{Epilogue, SwigluParams, spill_floats};
use crate::gemm::{
    CONSUMER_WARPS, GemmParams, MAX_SPLIT_PARTS, Mma, Routes, THREADS, TOKEN_TILES, TilePlan,
    persistent_grid,
};
use crate::protocol::POOL_ROW_ALIGN;
use crate::timeline::{EventKind, Timeline, TimelineBuffers};
use crate::transform::{Fold, TILE_ROWS};
use crate::unfused::{
    CombineReduceParams, CombineSendParams, CountParams, DispatchParams, Pipeline, PlanParams,
    RankBarrierParams, RouteParams, UnfusedError,
};

/// The fused kernel's entry point.
pub const MEGA_SOURCE: (&str, &str) =
    ("sm90_mega_moe.cu", include_str!("../cuda/sm90_mega_moe.cu"));
/// The fused kernel, read top to bottom by stage.
pub const MEGA_HEADER: (&str, &str) = (
    "sm90_mega_moe.cuh",
    include_str!("../cuda/sm90_mega_moe.cuh"),
);

/// `mm::mega::InputParams`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct InputParams {
    x_bf16: u64,
    topk_i64: u64,
    x: u64,
    x_sf: u64,
    topk_idx: u64,
    error: u64,
    hidden: i32,
    top_k: i32,
    num_experts: i32,
    pad_: i32,
}

/// `mm::mega::MegaParams`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct MegaParams {
    inputs: InputParams,
    count: CountParams,
    plan: PlanParams,
    route: RouteParams,
    dispatch: DispatchParams,
    swiglu: SwigluParams,
    combine_send: CombineSendParams,
    combine_reduce: CombineReduceParams,
    ranks: RankBarrierParams,
    l1: GemmParams,
    l2: GemmParams,
    grid_word: u64,
    stage_clock: u64,
    tokens_dev: u64,
    num_ranks: i32,
    tokens: i32,
    row_granules: i32,
    pad_: i32,
}

const _: () = assert!(size_of::<InputParams>() == 64);
const _: () = assert!(size_of::<MegaParams>() == 808);

/// One rank's forward on the device, for an engine (`#[repr(C)]`: the raw layer's argument, the
/// same for any binding): device addresses on the pipeline's GPU of `x` (`[T][H]`, as
/// `x_format` says), `x_sf` (UE8M0 `[T][H/G]`, with E4M3 `x`), `topk_idx` (`[T][k]` of
/// `topk_idx_width`, −1 masked), `topk_weights` (f32 `[T][k]`) and `y` (BF16 `[T][H]`, written).
/// `tokens` is T — or, with `tokens_dev` (a device i32, 0: none), the most T may be: the kernel
/// reads T from there when it starts, so one captured graph serves every T up to it (the buffers
/// then hold `tokens` tokens).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceIo {
    pub x: u64,
    pub x_sf: u64,
    pub topk_idx: u64,
    pub topk_weights: u64,
    pub y: u64,
    pub tokens: u64,
    pub tokens_dev: u64,
    pub x_format: ActivationFormat,
    pub topk_idx_width: IndexWidth,
}

const _: () = assert!(size_of::<DeviceIo>() == 64);

impl DeviceIo {
    /// Refuses, before anything is queued, an address the kernel would fault on: null, or not
    /// aligned for its widest access — 16-byte loads of `x` and of i32 `topk_idx` (four ids at a
    /// time), 8-byte loads of i64 ids, 4-byte ones of the weights and the device T, 16-byte stores
    /// of `y` (a tensor of its own, or a row slice of one, is aligned so). A forward of no tokens
    /// reads and writes none of them (an empty tensor's address may be null).
    pub fn check_addresses(&self) -> Result<(), UnfusedError> {
        if self.tokens == 0 && self.tokens_dev == 0 {
            return Ok(());
        }
        let ids_align = match self.topk_idx_width {
            IndexWidth::I32 => 16,
            IndexWidth::I64 => 8,
        };
        // (field, address, alignment, whether the kernel reads it)
        let fields = [
            ("x", self.x, 16, true),
            (
                "x_sf",
                self.x_sf,
                1,
                self.x_format == ActivationFormat::E4m3,
            ),
            ("topk_idx", self.topk_idx, ids_align, true),
            ("topk_weights", self.topk_weights, 4, true),
            ("y", self.y, 16, true),
            ("tokens_dev", self.tokens_dev, 4, self.tokens_dev != 0),
        ];
        match fields
            .into_iter()
            .find(|&(_, address, align, read)| read && (address == 0 || address % align != 0))
        {
            Some((field, address, align, _)) => Err(UnfusedError::DeviceAddress {
                field,
                address,
                align,
            }),
            None => Ok(()),
        }
    }
}

/// How [`DeviceIo::x`] holds the activations.
#[repr(u32)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ActivationFormat {
    /// E4M3 `[T][H]` with its UE8M0 scales in [`DeviceIo::x_sf`], quantized by the engine.
    #[default]
    E4m3 = 0,
    /// BF16 `[T][H]`, quantized by the kernel (its first stage, over the grid) exactly as
    /// `fp_formats::quant::quantize_act_row` quantizes on the host, into the pipeline's own input
    /// buffers; `x_sf` is not read.
    Bf16 = 1,
}

/// The width of [`DeviceIo::topk_idx`]'s expert ids.
#[repr(u32)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IndexWidth {
    #[default]
    I32 = 0,
    /// i64 (PyTorch's index type), narrowed by the kernel's first stage into the pipeline's own
    /// buffer; an id outside −1..E is refused with its full value.
    I64 = 1,
}

/// Stamps of a fused forward's stage clock (`mm::mega::kStamps`): the start, and the end of each
/// stage for the whole grid ([`FusedStageTimes`]).
const STAMPS: usize = 8;

/// A fused forward's stages, from the kernel's own clock (`%globaltimer` at the grid barrier after
/// each stage, ns): count and plan, route and dispatch (each with its meeting of the ranks), L1
/// with its SwiGLU epilogue, L2, combine (send, meeting, reduce).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FusedStageTimes {
    pub plan_ns: u64,
    pub dispatch_ns: u64,
    pub l1_ns: u64,
    pub l2_ns: u64,
    pub combine_ns: u64,
}

/// The two layers' GEMM plans of a forward of `recipe` with `tokens_per_tile` tokens per tile, for
/// weights folded as `folds` (w1, w2): the L1 with its SwiGLU epilogue into the L2's pool.
pub fn layer_plans(
    recipe: Recipe,
    routes: Routes,
    tokens_per_tile: usize,
    folds: [Fold; 2],
) -> Result<[TilePlan; 2], UnfusedError> {
    Ok([
        TilePlan::new(routes.l1, tokens_per_tile)?
            .with_fold(folds[0])
            .with_epilogue(Epilogue::Swiglu {
                recipe,
                pool: routes.l2,
            }),
        TilePlan::new(routes.l2, tokens_per_tile)?.with_fold(folds[1]),
    ])
}

/// The fused kernel's specialization for `recipe`'s activation group and the layers' plans. Both
/// layers must run on one shape of grid (the same CTAs per SM).
pub fn fused_spec(recipe: Recipe, [l1, l2]: [TilePlan; 2]) -> Result<KernelSpec, UnfusedError> {
    if l1.ctas_per_sm != l2.ctas_per_sm {
        return Err(UnfusedError::Shape {
            what: "fused kernel",
            detail: format!(
                "the L1 GEMM ({}) and the L2 GEMM ({}) run different CTAs per SM",
                l1.tag(),
                l2.tag()
            ),
        });
    }
    let spec = KernelSpec::new(
        format!(
            "megamoe-kernel/sm90_mega_moe/{recipe}/{}+{}",
            l1.tag(),
            l2.tag()
        ),
        MEGA_SOURCE,
    );
    let spec = l2
        .defined(l1.defined(spec, "MM_L1_"), "MM_L2_")
        .define("MM_G", recipe.group())
        .define("MM_SMEM_BYTES", l1.smem_bytes().max(l2.smem_bytes()))
        .arches(&[Arch::Sm90a]);
    // Known to fall short of registers: the BF16 L1's 32-token tile with two CTAs per SM spills 4 B
    // (mx32; a value stored and reloaded once per tile; perf.md v80/v82, v105), and mx32's 96-token
    // twin tiles (both layers BF16) 12 B stored, 64 B reloaded — one value, at the roles' entries
    // and in the epilogues' paths, none between the main loops' wgmmas (perf.md v108). They may
    // spill, never serialize their wgmmas (`cargo xtask kernels` fails any kernel on that).
    let known_shortfall = l1.mma == Mma::Bf16
        && ((l1.ctas_per_sm == 2 && l1.tokens_per_tile == 32)
            || (l2.mma == Mma::Bf16 && l1.twin_tiles() && l1.tokens_per_tile == 96));
    let spec = crate::with_gemm_headers(spec.header(MEGA_HEADER));
    Ok(if known_shortfall {
        spec
    } else {
        spec.no_spill()
    })
}

/// The fused specializations `cargo xtask kernels` checks: each route pair a pipeline runs, at
/// every tile a forward can pick, weights with the default fold.
pub fn kernels() -> Vec<KernelSpec> {
    let tiles = TOKEN_TILES;
    [
        (Recipe::G128, Routes::both(Mma::Fp8)),
        (Recipe::G128, Routes::EXACT_L1),
        (Recipe::Mx32, Routes::EXACT),
    ]
    .into_iter()
    .flat_map(|(recipe, routes)| {
        tiles.into_iter().map(move |bn| {
            let fold = |mma| TilePlan::new(mma, bn).expect("listed tile").fold;
            let plans = layer_plans(recipe, routes, bn, [fold(routes.l1), fold(routes.l2)])
                .expect("listed tile");
            fused_spec(recipe, plans).expect("one grid shape")
        })
    })
    .collect()
}

/// One compiled fused specialization on one GPU: its persistent grid (every CTA resident at once:
/// its stages meet at grid barriers) and the workspace of its waits, zero between launches.
pub struct FusedCore {
    pub plans: [TilePlan; 2],
    kernel: Kernel,
    grid: u32,
    cluster: usize,
    smem_bytes: usize,
    /// The GEMM layers' split-tail hand-overs (as [`crate::GemmCore`]'s), sized for the grid.
    partials: CudaSlice<f32>,
    partial_ready: CudaSlice<u32>,
    /// The GEMM layers' dynamic schedules: next item, CTAs done drawing; the L1's, then the L2's
    /// (the layers run at once: a CTA draws L2 tiles while others still draw L1's).
    tickets: CudaSlice<u32>,
    /// Per 16 pool rows, the L1 tiles that have stored them (`SwigluParams::row_arrivals`): an
    /// L2 tile loads its rows once all have; zero between launches.
    row_arrivals: CudaSlice<u32>,
    /// The L1's SwiGLU epilogue's pairs: a slot per CTA (as [`crate::GemmCore`]'s); empty without.
    spill: CudaSlice<f32>,
    /// The error word the GEMM layers' in-kernel waits record into (never reset).
    error: CudaSlice<u64>,
    /// The grid barrier's word.
    grid_word: CudaSlice<u64>,
    /// The stage clock's stamps of the last forward that asked for them.
    stage_clock: CudaSlice<u64>,
}

impl FusedCore {
    /// `pool_rows`: the rows of the pools the launches run on (their row counts' extent).
    pub fn new(
        gpu: &Gpu,
        jit: &Jit,
        recipe: Recipe,
        plans: [TilePlan; 2],
        pool_rows: usize,
    ) -> Result<Self, UnfusedError> {
        let spec = fused_spec(recipe, plans)?;
        let compiled = jit.compile(&spec, Arch::Sm90a)?;
        tracing::debug!(spec = %spec.name, outcome = ?compiled.outcome, ms = compiled.elapsed.as_secs_f64() * 1e3, "fused kernel ready");
        let kernel = gpu.load_module(&compiled.cubin)?.kernel("mm_mega_moe")?;
        let [l1, l2] = plans;
        let cluster = l1.cluster.max(l2.cluster);
        let smem_bytes = l1.smem_bytes().max(l2.smem_bytes());
        let grid = persistent_grid(
            gpu,
            &kernel,
            &spec.name,
            [l1.ctas_per_sm, cluster, smem_bytes],
            true,
        )?;
        let split_tile = plans
            .iter()
            .filter(|p| p.splits_tail())
            .map(|p| TILE_ROWS * p.tokens_per_tile)
            .max()
            .unwrap_or(0);
        let hand_overs = if split_tile > 0 {
            grid as usize * (MAX_SPLIT_PARTS - 1)
        } else {
            0
        };
        Ok(Self {
            plans,
            kernel,
            grid,
            cluster,
            smem_bytes,
            partials: gpu.alloc_zeros(hand_overs * split_tile)?,
            partial_ready: gpu.alloc_zeros(hand_overs * CONSUMER_WARPS)?,
            tickets: gpu.alloc_zeros(4)?,
            row_arrivals: gpu.alloc_zeros(pool_rows.div_ceil(POOL_ROW_ALIGN))?,
            spill: gpu.alloc_zeros(if l1.epilogue.pairs() {
                grid as usize * spill_floats(l1.unit_tokens())
            } else {
                0
            })?,
            error: gpu.alloc_zeros(1)?,
            grid_word: gpu.alloc_zeros(1)?,
            stage_clock: gpu.alloc_zeros(STAMPS)?,
        })
    }

    /// CTAs of every launch.
    pub fn grid(&self) -> u32 {
        self.grid
    }

    /// After the stream is synchronized: the stages of the last forward queued with its clock on.
    pub fn stage_times(&self, gpu: &Gpu) -> Result<FusedStageTimes, UnfusedError> {
        let t = gpu.download(&self.stage_clock)?;
        let d = |a: usize, b: usize| t[b].saturating_sub(t[a]);
        Ok(FusedStageTimes {
            plan_ns: d(0, 2),
            dispatch_ns: d(2, 3),
            l1_ns: d(3, 4),
            l2_ns: d(4, 5),
            combine_ns: d(5, 7),
        })
    }

    /// After the stream is synchronized: whether a GEMM layer's in-kernel wait gave up.
    pub fn check_error(&self, gpu: &Gpu) -> Result<(), UnfusedError> {
        barriers::check_error_word(gpu.download(&self.error)?[0])?;
        Ok(())
    }
}

impl Pipeline {
    /// The GEMM tile a fused forward of `tokens` tokens of this rank picks without the other
    /// ranks' counts: the tile for experts of `R ×` the rows per expert this rank routes — over
    /// the experts it hits, from its own `counts` per global expert when the host has them (at
    /// R = 1 the unfused forward's choice exactly), else uniform routing's `T · k / E` (the
    /// engine's device forward, where only T is known).
    pub fn fused_tile(&self, tokens: usize, counts: Option<&[u32]>) -> usize {
        let s = &self.shape;
        let per_expert = match counts {
            Some(c) => {
                let hit = c.iter().filter(|&&n| n > 0).count().max(1);
                let rows: u64 = c.iter().map(|&n| u64::from(n)).sum();
                rows as f64 / hit as f64 * s.num_ranks as f64
            }
            None => ((s.num_ranks * tokens * s.top_k) as f64 / s.num_experts as f64).max(1.0),
        };
        TilePlan::tokens_per_tile_for(per_expert, s.routes)
    }

    /// Compiles, once, the fused kernel for `tokens_per_tile`, and builds, once, what its launches
    /// on this pipeline's buffers pass that no forward changes (`FusedLaunch`).
    pub fn prepare_fused(
        &mut self,
        gpu: &Gpu,
        jit: &Jit,
        tokens_per_tile: usize,
    ) -> Result<(), UnfusedError> {
        if self.fused_kernel(tokens_per_tile).is_none() {
            let plans = layer_plans(
                self.shape.recipe,
                self.shape.routes,
                tokens_per_tile,
                [self.w1.fold, self.w2.fold],
            )?;
            let mut core =
                FusedCore::new(gpu, jit, self.shape.recipe, plans, self.shape.pool_rows)?;
            let launch = self.fused_launch(gpu.stream(), &mut core)?;
            self.fused.push(PreparedFused { core, launch });
        }
        Ok(())
    }

    /// The prepared fused kernel of `tokens_per_tile`, if any: a scan of at most
    /// [`TOKEN_TILES`]`.len()` entries, cheaper per forward than hashing the tile.
    pub(crate) fn fused_kernel(&self, tokens_per_tile: usize) -> Option<&PreparedFused> {
        self.fused
            .iter()
            .find(|f| f.tokens_per_tile() == tokens_per_tile)
    }

    /// After the stream is synchronized: the stages of the last fused forward, when it ran with its
    /// stage clock on.
    pub fn fused_stage_times(&self, gpu: &Gpu) -> Result<Option<FusedStageTimes>, UnfusedError> {
        self.launched_fused
            .and_then(|tile| self.fused_kernel(tile))
            .map(|f| f.core.stage_times(gpu))
            .transpose()
    }

    /// The CTAs of the fused kernel for `tokens_per_tile`, once compiled.
    pub fn fused_grid(&self, tokens_per_tile: usize) -> Option<u32> {
        self.fused_kernel(tokens_per_tile).map(|f| f.core.grid())
    }

    /// Whether fused forwards record a timeline (`Some(events per CTA)`, allocated here, once) or
    /// not (`None`, the default: the kernel's records are branches not taken);
    /// [`Pipeline::fused_timeline`] reads the last one.
    pub fn record_timeline(
        &mut self,
        gpu: &Gpu,
        events_per_cta: Option<usize>,
    ) -> Result<(), UnfusedError> {
        self.timeline = match events_per_cta {
            // Room for any grid: at most two CTAs per SM.
            Some(n) => Some(TimelineBuffers::new(
                gpu,
                2 * gpu.info().sm_count as usize,
                n,
            )?),
            None => None,
        };
        Ok(())
    }

    /// The timeline of the last fused forward, once its stream is done, if one was recorded: its
    /// GEMMs' tiles, and its stages as the grid's (from its stage clock, which a recording forward
    /// keeps: between the grid's meetings, whose waits they include).
    pub fn fused_timeline(&self, gpu: &Gpu) -> Result<Option<Timeline>, UnfusedError> {
        let (Some(timeline), Some(fused)) = (
            &self.timeline,
            self.launched_fused.and_then(|tile| self.fused_kernel(tile)),
        ) else {
            return Ok(None);
        };
        let clock = gpu.download(&fused.core.stage_clock)?;
        // The stamps: start, counts met, plan, dispatch met, L1, L2, combine met, end.
        let mut stages = vec![
            (EventKind::Count, clock[0], clock[1]),
            (EventKind::Plan, clock[1], clock[2]),
            (EventKind::Dispatch, clock[2], clock[3]),
            (EventKind::CombineReduce, clock[6], clock[7]),
        ];
        if self.shape.num_ranks > 1 {
            stages.push((EventKind::CombineSend, clock[5], clock[6]));
        }
        Ok(Some(timeline.read(gpu, &stages)?))
    }

    /// Compiles the fused kernel of every token tile, so that no fused forward compiles. Returns
    /// how many the pipeline holds.
    pub fn warm_up_fused(&mut self, gpu: &Gpu, jit: &Jit) -> Result<usize, UnfusedError> {
        let largest = TilePlan::covering_tile(self.shape.pool_rows as f64);
        for bn in TOKEN_TILES.into_iter().filter(|&bn| bn <= largest) {
            self.prepare_fused(gpu, jit, bn)?;
        }
        Ok(self.fused.len())
    }

    /// Collective, queued on the stream: the whole forward of the inputs [`Pipeline::set_inputs`]
    /// uploaded, as one launch with GEMM tiles of `tokens_per_tile` tokens, every rank's launch
    /// meeting the others' on the device; `stage_clock`: the kernel stamps the end of each stage
    /// ([`Pipeline::fused_stage_times`]; off, it costs nothing). `y` ([`Pipeline::download_y`]) once the stream is done;
    /// [`Pipeline::check_errors`] then says whether the device refused the routes or the plan
    /// (every rank refuses alike) or a rank did not arrive.
    pub fn forward_fused(
        &mut self,
        gpu: &Gpu,
        jit: &Jit,
        tokens_per_tile: usize,
        stage_clock: bool,
    ) -> Result<(), UnfusedError> {
        let tokens = self.tokens.expect("set_inputs before forward_fused");
        self.prepare_fused(gpu, jit, tokens_per_tile)?;
        let stream = gpu.stream();
        let io = DeviceIo {
            x: self.inputs.x.device_ptr(stream).0,
            x_sf: self.inputs.x_sf.device_ptr(stream).0,
            topk_idx: self.inputs.topk_idx.device_ptr(stream).0,
            topk_weights: self.inputs.topk_w.device_ptr(stream).0,
            y: self.y.device_ptr(stream).0,
            tokens: tokens as u64,
            ..DeviceIo::default()
        };
        // SAFETY: the pipeline's own input buffers hold `tokens` tokens (set_inputs) and y
        // max_tokens >= tokens rows; all on this GPU.
        // A timeline takes its stages from the stage clock.
        let stage_clock = stage_clock || self.timeline.is_some();
        unsafe { self.queue_fused(gpu, stream, &io, tokens_per_tile, stage_clock) }
    }

    /// Collective, queued on `stream` (the caller's, of this pipeline's GPU): the fused forward of
    /// inputs already on the device into `io.y`, with no allocation, no host-device copy and no
    /// host synchronization — a memset of the plan's error words and one launch, which a CUDA graph
    /// can capture. The tile is `fused_tile(io.tokens, None)`; its kernel must be compiled
    /// ([`Pipeline::warm_up_fused`]), else this compiles it first. After `stream` is done,
    /// [`Pipeline::check_errors`] reports what the device refused (ids out of range, a device T
    /// above `io.tokens`, capacity) or a rank that did not arrive.
    ///
    /// # Safety
    /// `io`'s addresses are device memory of this GPU, as [`DeviceIo`] describes, live and not
    /// written by other work until the forward is done; every rank queues its forward.
    pub unsafe fn forward_fused_on(
        &mut self,
        gpu: &Gpu,
        jit: &Jit,
        stream: &CudaStream,
        io: &DeviceIo,
    ) -> Result<(), UnfusedError> {
        if io.tokens as usize > self.shape.max_tokens {
            return Err(UnfusedError::Tokens {
                rank: self.rank,
                tokens: io.tokens as usize,
                max: self.shape.max_tokens,
            });
        }
        io.check_addresses()?;
        let tile = self.fused_tile(io.tokens as usize, None);
        self.prepare_fused(gpu, jit, tile)?;
        self.tokens = Some(io.tokens as usize);
        self.launched.clear();
        // SAFETY: the caller's contract.
        unsafe { self.queue_fused(gpu, stream, io, tile, false) }
    }

    /// What every launch of `core` on this pipeline passes that no forward changes: the parameter
    /// block with the forward's fields left zero, the tensor maps over this pipeline's pools and
    /// the grid. Addresses only (the pipeline's buffers never move: [`Pipeline::new`] allocates
    /// them once; cudarc's event tracking is off on a [`Gpu`]'s context, so taking them records
    /// nothing on `stream`).
    fn fused_launch(
        &mut self,
        stream: &CudaStream,
        core: &mut FusedCore,
    ) -> Result<FusedLaunch, UnfusedError> {
        let s = self.shape;
        let el = s.experts_per_rank();
        let own = self.own();
        let [first_row, expert_offset, expert_rows] =
            Self::plan_tables(&s).map(|table| self.plan_dev.slice(table).device_ptr(stream).0);
        let peers = self.peers.device_ptr(stream).0;
        let route = self.route.device_ptr_mut(stream).0;
        let plan_error = self.error_words.slice(1..3).device_ptr(stream).0;
        let l2_act = self.l2_act.device_ptr_mut(stream).0;
        let l2_sf = self.l2_sf.device_ptr_mut(stream).0;
        let l2_out = self.l2_out.device_ptr_mut(stream).0;
        let swiglu = self.swiglu_out(stream, l2_act, l2_sf);
        let [p1, p2] = core.plans;
        let partials = core.partials.device_ptr_mut(stream).0;
        let partial_ready = core.partial_ready.device_ptr_mut(stream).0;
        let tickets = core.tickets.device_ptr_mut(stream).0;
        let gemm_error = core.error.device_ptr_mut(stream).0;
        let spill = core.spill.device_ptr_mut(stream).0;
        let row_arrivals = core.row_arrivals.device_ptr_mut(stream).0;
        let row_granules = core.row_arrivals.len() as i32;
        // The L1's tiles per block of rows: the count at which an L2 tile's rows are whole.
        let l1_tiles_per_rows = (self.w1.n / TILE_ROWS) as i32;
        // The L2 waits on the L1's blocks' counts, so both layers' blocks must be the same: an
        // overhang only where both plans have it (g128/bf16-fp8's BF16 L1 has none).
        let overhang = if p1.overhang_rows() == p2.overhang_rows() {
            p1.overhang_rows() as i32
        } else {
            0
        };
        // `layer`: 0 for L1, 1 for L2 (its own tickets; it waits on the L1's row counts).
        let layer =
            |layer: usize, plan: TilePlan, w: &crate::DeviceWeights, act_sf: u64, out: u64| {
                GemmParams {
                    w_blocks: w.blocks.device_ptr(stream).0,
                    act_sf: if plan.mma == Mma::Fp8 { act_sf } else { 0 },
                    out,
                    expert_offset,
                    expert_rows,
                    num_experts: el as i32,
                    n_out: w.n as i32,
                    k: w.k as i32,
                    sf_stride: s.sf_stride() as i32,
                    partials,
                    partial_ready,
                    split_parts: if plan.splits_tail() {
                        plan.split_parts as i32
                    } else {
                        1
                    },
                    arrivals_needed: if layer == 1 { l1_tiles_per_rows } else { 0 },
                    tickets: if plan.dynamic {
                        tickets + (layer * 2 * size_of::<u32>()) as u64
                    } else {
                        0
                    },
                    timeline: 0,
                    error: gemm_error,
                    row_arrivals: if layer == 1 { row_arrivals } else { 0 },
                    overhang,
                    pad: 0,
                }
            };
        let params = MegaParams {
            inputs: InputParams {
                x_bf16: 0,
                topk_i64: 0,
                x: self.inputs.x.device_ptr_mut(stream).0,
                x_sf: self.inputs.x_sf.device_ptr_mut(stream).0,
                topk_idx: self.inputs.topk_idx.device_ptr_mut(stream).0,
                error: plan_error,
                hidden: s.hidden as i32,
                top_k: s.top_k as i32,
                num_experts: s.num_experts as i32,
                pad_: 0,
            },
            count: CountParams {
                topk_idx: 0,
                peers,
                error: plan_error,
                pairs: 0,
                top_k: s.top_k as i32,
                num_experts: s.num_experts as i32,
                num_ranks: s.num_ranks as i32,
                rank: self.rank as i32,
                pad: 0,
            },
            plan: PlanParams {
                counts: own.counts,
                first_row,
                expert_offset,
                expert_rows,
                error: plan_error,
                num_ranks: s.num_ranks as i32,
                num_experts: s.num_experts as i32,
                rank: self.rank as i32,
                capacity: s.pool_rows as i32,
                row_align: POOL_ROW_ALIGN as i32,
                pad: 0,
            },
            route: RouteParams {
                topk_idx: 0,
                first_row,
                route,
                expert_offset,
                expert_rows,
                meta: own.meta,
                pairs: 0,
                experts_per_rank: el as i32,
                rank: self.rank as i32,
                pad: 0,
            },
            dispatch: DispatchParams {
                x: 0,
                x_sf: 0,
                route,
                topk_idx: 0,
                topk_w: 0,
                peers,
                error: plan_error,
                tokens: 0,
                top_k: s.top_k as i32,
                hidden: s.hidden as i32,
                experts_per_rank: el as i32,
                staged_row_bytes: s.staged_row_bytes() as i32,
                sf_stride: s.sf_stride() as i32,
                rank: self.rank as i32,
                // Rows go straight into their owners' pools: the unstaging would be a stage more.
                staged: 0,
            },
            swiglu: swiglu.params(spill, row_arrivals),
            combine_send: CombineSendParams {
                l2_out,
                meta: own.meta,
                peers,
                rows: 0,
                hidden: s.hidden as i32,
                max_tokens: s.max_tokens as i32,
                rank: self.rank as i32,
            },
            combine_reduce: CombineReduceParams {
                combine: own.combine,
                topk_idx: 0,
                y: 0,
                l2_out,
                route,
                tokens: 0,
                top_k: s.top_k as i32,
                hidden: s.hidden as i32,
                max_tokens: s.max_tokens as i32,
                experts_per_rank: el as i32,
                rank: self.rank as i32,
            },
            ranks: RankBarrierParams {
                view: self.barrier_view.device_ptr(stream).0,
                signals: own.signals,
                error_word: self.error_words.slice(0..1).device_ptr(stream).0,
                timeout_ns: 0,
            },
            l1: layer(0, p1, &self.w1, own.l1_sf, 0),
            l2: layer(1, p2, &self.w2, l2_sf, l2_out),
            grid_word: core.grid_word.device_ptr_mut(stream).0,
            stage_clock: 0,
            tokens_dev: 0,
            num_ranks: s.num_ranks as i32,
            tokens: 0,
            row_granules,
            pad_: 0,
        };
        // The maps cover every row of the pools; a tile past its expert's rows reads rows whose
        // results are never stored.
        let rows = s.pool_rows;
        let sf_stride = s.sf_stride();
        let (l1_act_maps, _) = p1.tensor_maps(
            own.l1_act,
            Some((own.l1_sf, sf_stride)),
            rows,
            s.hidden,
            0,
            2 * s.intermediate,
        )?;
        let (l2_act_maps, l2_out_map) = p2.tensor_maps(
            l2_act,
            Some((l2_sf, sf_stride)),
            rows,
            s.intermediate,
            l2_out,
            s.hidden,
        )?;
        let mut config =
            LaunchConfig::linear(core.grid, THREADS).dynamic_smem(core.smem_bytes as u32);
        if core.cluster > 1 {
            config = config.cluster([core.cluster as u32, 1, 1]);
        }
        let mut args = LaunchArgs::new();
        let params_arg = args.push(&params);
        args.push(&l1_act_maps.to_bytes());
        args.push(&l2_act_maps.to_bytes());
        args.push_tensor_map(&l2_out_map);
        Ok(FusedLaunch {
            params,
            args,
            params_arg,
            config,
            stage_clock: core.stage_clock.device_ptr_mut(stream).0,
        })
    }

    /// Queues a fused forward of `io` on `stream` with the prepared kernel of `tokens_per_tile`:
    /// the plan's error words zeroed, then one launch of the kernel's [`FusedLaunch`] with the
    /// forward's fields filled in.
    ///
    /// # Safety
    /// As [`Pipeline::forward_fused_on`].
    unsafe fn queue_fused(
        &mut self,
        gpu: &Gpu,
        stream: &CudaStream,
        io: &DeviceIo,
        tokens_per_tile: usize,
        stage_clock: bool,
    ) -> Result<(), UnfusedError> {
        let timelines = match &mut self.timeline {
            Some(t) => {
                t.clear(gpu, stream)?;
                [EventKind::L1Tile, EventKind::L2Tile].map(|kind| t.desc(stream, kind))
            }
            None => [0, 0],
        };
        let forward = ForwardFields {
            io: *io,
            top_k: self.shape.top_k,
            barrier_timeout: self.barrier_timeout,
            stage_clock,
            timelines,
        };
        let fused = self
            .fused
            .iter_mut()
            .find(|f| f.tokens_per_tile() == tokens_per_tile)
            .expect("prepared by the caller");
        let launch = &mut fused.launch;
        let params = launch.params(&forward);
        // SAFETY: words 1 and 2 of this pipeline's error words (the plan's), on its GPU.
        unsafe { gpu.memset_raw_on(stream, params.plan.error, 16, 0)? };
        launch.args.set(launch.params_arg, &params);
        // SAFETY: the arguments are the kernel's (`mm_mega_moe(MegaParams, three CUtensorMap)`);
        // every pointer is a buffer of this pipeline sized for `shape` (max_tokens pairs,
        // pool_rows rows: the device plan refuses a plan past them before any row is written) or
        // a region of every rank's live symmetric buffer (Pipeline::new's contract), or the
        // caller's (`io`, as forward_fused_on's contract says); the kernel's grid is resident at
        // once (persistent_grid), as its grid barriers need.
        unsafe {
            fused
                .core
                .kernel
                .launch_with(stream, launch.config, &launch.args)?
        };
        self.plan = None;
        self.launched_fused = Some(tokens_per_tile);
        Ok(())
    }
}

/// A pipeline's fused kernel of one token tile: the compiled core and its launch on the
/// pipeline's buffers.
pub(crate) struct PreparedFused {
    pub(crate) core: FusedCore,
    launch: FusedLaunch,
}

impl PreparedFused {
    fn tokens_per_tile(&self) -> usize {
        self.core.plans[0].tokens_per_tile
    }
}

/// What every launch of one fused kernel on one pipeline passes that no forward changes, built
/// once when the kernel is prepared ([`Pipeline::prepare_fused`]): a forward copies the parameter
/// block, writes its own fields ([`FusedLaunch::params`]) into the arguments and launches — no
/// tensor map to encode (the maps cover the pipeline's pools, sized for `pool_rows` whatever T
/// is), no parameter block to assemble, no allocation.
struct FusedLaunch {
    /// The parameter block with every field that depends on a forward zero ([`ForwardFields`]).
    params: MegaParams,
    /// The kernel's arguments: the last forward's parameter block, then the tensor maps of the L1
    /// pool, the L2 pool and the L2 output.
    args: LaunchArgs,
    /// Where the parameter block lies in `args`.
    params_arg: ArgIndex<MegaParams>,
    config: LaunchConfig,
    /// The kernel's stage clock, passed when a forward asks for it.
    stage_clock: u64,
}

/// What a fused forward's parameter block takes from the forward itself rather than from the
/// pipeline: the inputs and T ([`DeviceIo`]), the barrier's timeout of the moment
/// ([`Pipeline::set_barrier_timeout`]), whether the kernel stamps its stages, and the timeline's
/// descriptors (0: none).
#[derive(Clone, Copy, Debug)]
struct ForwardFields {
    io: DeviceIo,
    top_k: usize,
    barrier_timeout: std::time::Duration,
    stage_clock: bool,
    timelines: [u64; 2],
}

impl FusedLaunch {
    /// The parameter block of one forward: the prepared one with `forward`'s fields written.
    fn params(&self, forward: &ForwardFields) -> MegaParams {
        let io = &forward.io;
        let tokens = io.tokens as usize;
        let pairs = (tokens * forward.top_k) as i32;
        let mut p = self.params;
        // Inputs in other formats: the kernel converts them into the pipeline's input buffers,
        // which the stages then read.
        let (x, x_sf) = match io.x_format {
            ActivationFormat::E4m3 => {
                p.inputs.x_bf16 = 0;
                (io.x, io.x_sf)
            }
            ActivationFormat::Bf16 => {
                p.inputs.x_bf16 = io.x;
                (p.inputs.x, p.inputs.x_sf)
            }
        };
        let topk_idx = match io.topk_idx_width {
            IndexWidth::I32 => {
                p.inputs.topk_i64 = 0;
                io.topk_idx
            }
            IndexWidth::I64 => {
                p.inputs.topk_i64 = io.topk_idx;
                p.inputs.topk_idx
            }
        };
        p.count.topk_idx = topk_idx;
        p.count.pairs = pairs;
        p.route.topk_idx = topk_idx;
        p.route.pairs = pairs;
        p.dispatch.x = x;
        p.dispatch.x_sf = x_sf;
        p.dispatch.topk_idx = topk_idx;
        p.dispatch.topk_w = io.topk_weights;
        p.dispatch.tokens = tokens as i32;
        p.combine_reduce.topk_idx = topk_idx;
        p.combine_reduce.y = io.y;
        p.combine_reduce.tokens = tokens as i32;
        p.ranks.timeout_ns = forward.barrier_timeout.as_nanos().min(u64::MAX as u128) as u64;
        p.l1.timeline = forward.timelines[0];
        p.l2.timeline = forward.timelines[1];
        p.stage_clock = if forward.stage_clock {
            self.stage_clock
        } else {
            0
        };
        p.tokens_dev = io.tokens_dev;
        p.tokens = tokens as i32;
        p
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A forward writes every field it owns — its inputs, T, pairs, the barrier's timeout, the
    /// stage clock, the timeline — and no other byte of the prepared parameter block; inputs in
    /// other formats go to stage 0, and the stages read the pipeline's buffers it writes.
    #[test]
    fn a_forward_writes_only_its_own_fields() {
        const PREPARED: u8 = 0xab;
        let prepared: MegaParams = bytemuck::cast([PREPARED; size_of::<MegaParams>()]);
        let mut args = LaunchArgs::new();
        let params_arg = args.push(&prepared);
        let launch = FusedLaunch {
            params: prepared,
            args,
            params_arg,
            config: LaunchConfig::linear(1, 1),
            stage_clock: 0x5000,
        };
        let io = DeviceIo {
            x: 0x1000,
            x_sf: 0x2000,
            topk_idx: 0x3000,
            topk_weights: 0x4000,
            y: 0x6000,
            tokens: 7,
            tokens_dev: 0x7000,
            ..DeviceIo::default()
        };
        let forward = ForwardFields {
            io,
            top_k: 6,
            barrier_timeout: Duration::from_secs(10),
            stage_clock: true,
            timelines: [0x8000, 0x9000],
        };
        let p = launch.params(&forward);
        assert_eq!((p.count.topk_idx, p.count.pairs), (0x3000, 42));
        assert_eq!((p.route.topk_idx, p.route.pairs), (0x3000, 42));
        let d = p.dispatch;
        assert_eq!(
            (d.x, d.x_sf, d.topk_idx, d.topk_w, d.tokens),
            (0x1000, 0x2000, 0x3000, 0x4000, 7)
        );
        let c = p.combine_reduce;
        assert_eq!((c.topk_idx, c.y, c.tokens), (0x3000, 0x6000, 7));
        assert_eq!(p.ranks.timeout_ns, 10_000_000_000);
        assert_eq!((p.l1.timeline, p.l2.timeline), (0x8000, 0x9000));
        assert_eq!((p.stage_clock, p.tokens_dev, p.tokens), (0x5000, 0x7000, 7));
        assert_eq!((p.inputs.x_bf16, p.inputs.topk_i64), (0, 0));
        // No value above holds a byte 0xab: every byte written differs from the prepared block.
        let written = bytemuck::bytes_of(&p)
            .iter()
            .filter(|&&b| b != PREPARED)
            .count();
        let owned = [
            8 + 8,     // inputs: x_bf16, topk_i64 (none)
            8 + 4,     // count: topk_idx, pairs
            8 + 4,     // route: topk_idx, pairs
            4 * 8 + 4, // dispatch: x, x_sf, topk_idx, topk_w, tokens
            8 + 8 + 4, // combine_reduce: topk_idx, y, tokens
            8,         // ranks: timeout_ns
            8 + 8,     // l1, l2: timeline
            8 + 8 + 4, // stage_clock, tokens_dev, tokens
        ];
        assert_eq!(written, owned.iter().sum::<usize>());
        let unclocked = launch.params(&ForwardFields {
            stage_clock: false,
            ..forward
        });
        assert_eq!(unclocked.stage_clock, 0);

        let converted = launch.params(&ForwardFields {
            io: DeviceIo {
                x_format: ActivationFormat::Bf16,
                topk_idx_width: IndexWidth::I64,
                ..io
            },
            ..forward
        });
        let i = converted.inputs;
        assert_eq!((i.x_bf16, i.topk_i64), (0x1000, 0x3000));
        let d = converted.dispatch;
        assert_eq!((d.x, d.x_sf, d.topk_idx), (i.x, i.x_sf, i.topk_idx));
        assert_eq!(
            [
                converted.count.topk_idx,
                converted.route.topk_idx,
                converted.combine_reduce.topk_idx
            ],
            [i.topk_idx; 3]
        );
    }

    /// Null or misaligned addresses are refused, naming the field and the alignment it needs;
    /// a forward of no tokens (and no device T) takes any.
    #[test]
    fn device_addresses_the_kernel_would_fault_on_are_refused() {
        let io = DeviceIo {
            x: 0x1000,
            x_sf: 0x2001,
            topk_idx: 0x3000,
            topk_weights: 0x4004,
            y: 0x6000,
            tokens: 7,
            ..DeviceIo::default()
        };
        assert!(io.check_addresses().is_ok());
        let refused = |io: DeviceIo| match io.check_addresses() {
            Err(UnfusedError::DeviceAddress { field, align, .. }) => (field, align),
            other => panic!("{io:?} gave {other:?}"),
        };
        assert_eq!(refused(DeviceIo { x: 0x1004, ..io }), ("x", 16));
        assert_eq!(refused(DeviceIo { y: 0, ..io }), ("y", 16));
        assert_eq!(
            refused(DeviceIo {
                topk_idx: 0x3008,
                ..io
            }),
            ("topk_idx", 16)
        );
        assert_eq!(
            refused(DeviceIo {
                topk_weights: 0x4002,
                ..io
            }),
            ("topk_weights", 4)
        );
        assert_eq!(refused(DeviceIo { x_sf: 0, ..io }), ("x_sf", 1));
        assert_eq!(
            refused(DeviceIo {
                tokens_dev: 0x5002,
                ..io
            }),
            ("tokens_dev", 4)
        );
        // i64 ids need 8 bytes; BF16 x reads no x_sf.
        let engine = DeviceIo {
            topk_idx_width: IndexWidth::I64,
            x_format: ActivationFormat::Bf16,
            x_sf: 0,
            ..io
        };
        assert!(
            DeviceIo {
                topk_idx: 0x3008,
                ..engine
            }
            .check_addresses()
            .is_ok()
        );
        assert_eq!(
            refused(DeviceIo {
                topk_idx: 0x3004,
                ..engine
            }),
            ("topk_idx", 8)
        );
        // No tokens: nothing is touched; a device T is read whatever the bound.
        let empty = DeviceIo {
            tokens: 0,
            ..DeviceIo::default()
        };
        assert!(empty.check_addresses().is_ok());
        assert_eq!(
            refused(DeviceIo {
                tokens_dev: 0x5000,
                ..empty
            }),
            ("x", 16)
        );
    }
}
