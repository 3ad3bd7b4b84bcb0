//! `megamoe-bench`, the pipeline benchmark of `megamoe bench`: the CUDA forward ([`megamoe::cuda`])
//! on each path asked for — the unfused pipeline and the fused kernel, on one pipeline, point by
//! point — timed on R local GPUs for a preset
//! (ranks as threads of one process, [`run`], or one process per rank, [`run_rank`]), per route
//! (recipe / tensor-core route) and tokens per rank, next to the bytes and FLOPs it must move and do
//! (`moe_sched::Plan`, uniform routing): device-side wall time (everything but the host's upload of
//! the inputs and download of y), the kernels' own time (CUDA events), TFLOPS = 2·pairs·H·3I / t
//! over both, HBM GB/s of the plan's bytes, each stage's share, the GPU's SM clock and board
//! power over the timed forwards ([`Telemetry`]), and on several ranks the
//! communication kernels alone (dispatch + combine) with the NVLink GB/s of the plan's pulled and
//! written-back bytes. On the fused path, also the engine's device forward
//! ([`CudaRank::forward_device`]: inputs already on the device, no host synchronization) at each
//! point: the host's time per call, from call to return, with the stream busy, and the GPU's time
//! per forward of the same calls back to back (CUDA events around them).
//!
//! Weights are random MXFP4 codes (`ExpertWeights::random_codes`: realistic bytes without the cost
//! of quantizing V4-Pro), inputs come from the generator, routing is uniform with no masking; each
//! rank's are a function of its rank alone, so a rank process makes only its own.
//!
//! With [`BenchOptions::timeline`], each fused point runs once more with the kernel's timeline on
//! and writes it as JSON (events and [`Overlap`](megamoe_kernel::timeline::Overlap)) and as an SVG
//! picture ([`timeline_svg`]), and logs the overlap.

pub mod timeline_svg;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_rt::{GpuTimer, Reading, Sampling, Telemetry};

use megamoe_kernel::Routes;
use megamoe_kernel::problem::ExpertWeights;
use megamoe_kernel::timeline::EventKind;
use moe_sched::{Plan, PlanConfig};
use serde::Serialize;
use symm_mem::World;

use megamoe::cuda::{
    CudaError, CudaRank, DeviceBatch, ForwardPath, Placement, StageTimes, agree_max, run_local,
};
use megamoe::{Config, RankInputs, RankWeights, Recipe};
use megamoe_problems::generate::{self, GenOptions};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub config: Config,
    /// Which GPU each rank drives (local world: the threads; process world: the launch).
    pub placement: Placement,
    pub tokens: Vec<usize>,
    /// (recipe, the GEMMs' tensor-core routes) pairs.
    pub routes: Vec<(Recipe, Routes)>,
    /// The forward's paths, each timed at every point on the same pipeline.
    pub paths: Vec<ForwardPath>,
    /// Timed forwards per point (after one warm-up); on the fused path as many device forwards.
    pub reps: usize,
    /// 0: every timed forward with its host I/O, which leaves the GPU idle in between (it meets
    /// each forward at its burst clock). Otherwise forwards back to back without host I/O
    /// ([`CudaRank::rerun`]) for this long, then the timed ones the same way: the GPU busy, as in
    /// serving, at its power-capped sustained clock.
    pub warm_up_ms: u64,
    /// Stage kernels launched programmatically after each other (the pipeline's default).
    pub chained_launches: bool,
    /// Where each fused point's timeline goes (`<recipe>-<route>-T<t>-rank<r>.json` and `.svg`);
    /// none: no timelines.
    pub timeline: Option<PathBuf>,
}

/// Events each CTA's run of a bench timeline holds (T = 8192 on V4-Pro: ≈ 160 tiles a CTA).
const TIMELINE_EVENTS_PER_CTA: usize = 2048;

/// One forward of `point` on the fused path with the timeline on, written into `dir` (which the
/// caller made; a file that cannot be written is logged as an error, the times stand).
fn record_timeline(
    rank: &mut CudaRank,
    me: usize,
    config: &Config,
    routes: Routes,
    point: &RankInputs,
    dir: &std::path::Path,
) -> Result<(), CudaError> {
    rank.set_path(ForwardPath::Fused);
    rank.record_timeline(Some(TIMELINE_EVENTS_PER_CTA))?;
    rank.forward(point)?;
    let timeline = rank.fused_timeline()?;
    rank.record_timeline(None)?;
    let Some(timeline) = timeline else {
        return Ok(());
    };
    let overlap = timeline.overlap();
    let recipe = config.recipe;
    let name = format!(
        "{recipe}-{}-T{}-rank{me}",
        routes.to_string().replace('/', "-"),
        point.tokens
    );
    let (l1_mhz, l2_mhz) = (
        timeline.sm_mhz(EventKind::L1Tile),
        timeline.sm_mhz(EventKind::L2Tile),
    );
    let json = serde_json::json!({
        "overlap": overlap, "sm_mhz": {"l1_tile": l1_mhz, "l2_tile": l2_mhz},
        "dropped": timeline.dropped, "events": timeline.events
    });
    let title = format!(
        "{recipe}/{routes} T = {} rank {me}: fused forward",
        point.tokens
    );
    let written = std::fs::write(dir.join(format!("{name}.json")), json.to_string())
        .map_err(|e| e.to_string())
        .and_then(|()| {
            timeline_svg::write_svg(&timeline, &title, &dir.join(format!("{name}.svg")))
        });
    match written {
        Ok(()) => tracing::info!(
            timeline = %dir.join(&name).display(),
            %overlap,
            l1_mhz_p10_p50 = ?(l1_mhz.p10, l1_mhz.p50),
            l2_mhz_p10_p50 = ?(l2_mhz.p10, l2_mhz.p50),
            "fused timeline"
        ),
        Err(e) => {
            tracing::error!(timeline = %dir.join(&name).display(), error = %e, "fused timeline not written")
        }
    }
    Ok(())
}

/// One measured point; times are medians over the reps, in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    pub recipe: Recipe,
    #[serde(serialize_with = "serialize_display")]
    pub routes: Routes,
    #[serde(serialize_with = "serialize_display")]
    pub path: ForwardPath,
    pub ranks: usize,
    pub tokens_per_rank: usize,
    /// Routed (token, slot) pairs of rank 0.
    pub pairs: usize,
    /// Wall clock from routing to y on the device (host exchanges and barriers included).
    pub device_us: f64,
    /// The GPU's span from the first kernel to y (CUDA events), without stage marks.
    pub kernels_us: f64,
    /// The same span with a mark between every two stages (what the marks cost).
    pub marked_us: f64,
    /// Host: the route step (counts exchange, plans, GEMM cores), before anything is queued.
    pub route_us: f64,
    /// Host: queueing the stages.
    pub queue_us: f64,
    pub with_host_io_us: f64,
    /// The engine's device forward (fused path, T > 0): the host's time per
    /// [`CudaRank::forward_device`] call, from call to return, with earlier forwards still on the
    /// stream (median).
    pub device_call_us: Option<f64>,
    /// The GPU's time per device forward, over the same calls back to back (CUDA events around
    /// them).
    pub device_forward_us: Option<f64>,
    /// Over the device wall time.
    pub tflops: f64,
    /// Over the kernels' time.
    pub kernel_tflops: f64,
    /// The plan's HBM bytes over the kernels' time.
    pub hbm_gbps: f64,
    /// The dispatch and combine kernels alone; with one rank this is local traffic only.
    pub communication_us: f64,
    /// The plan's NVLink bytes (pull + write-back) over `communication_us`; 0 on one rank.
    pub nvlink_gbps: f64,
    /// (kernel stage, share of the kernels' time in %); none for the fused path (one launch).
    pub stage_shares: Vec<(String, f64)>,
    /// The kernels' time over the unfused path's at the same point, when both were timed.
    pub over_unfused: Option<f64>,
    /// Rank 0's GPU over the point's timed host-path forwards (NVML, [`Telemetry`]): mean SM clock
    /// and board power; none without NVML.
    pub sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
}

/// Runs every (route, tokens) point on a local world (a thread per rank) and reports rank 0's
/// times; `progress` is called after each point.
pub fn run(
    opts: &BenchOptions,
    progress: impl FnMut(&BenchRow),
) -> Result<Vec<BenchRow>, CudaError> {
    let ranks = opts.config.num_ranks;
    let weights: Vec<RankWeights> = (0..ranks)
        .map(|r| random_weights(&opts.config, r))
        .collect();
    rows(opts, progress, |config, routes| {
        let mut inputs: Vec<Vec<RankInputs>> =
            (0..ranks).map(|r| point_inputs(opts, config, r)).collect();
        // Every rank times every point; rank 0's times are reported (ranks meet at barriers).
        let mut times = run_local(opts.placement, |world| {
            let me = world.rank();
            time_points(world, config, routes, opts, &weights[me], &inputs[me])
        })?;
        Ok((inputs.swap_remove(0), times.swap_remove(0)))
    })
}

/// [`run`] as this rank of a process world (every rank calls it with the same `opts`): this rank
/// makes its own weights and inputs and reports its own times.
pub fn run_rank(
    world: &Arc<World>,
    opts: &BenchOptions,
    progress: impl FnMut(&BenchRow),
) -> Result<Vec<BenchRow>, CudaError> {
    let me = world.rank();
    let weights = random_weights(&opts.config, me);
    rows(opts, progress, |config, routes| {
        let inputs = point_inputs(opts, config, me);
        let times = time_points(world, config, routes, opts, &weights, &inputs)?;
        Ok((inputs, times))
    })
}

/// Every route's rows from `time(config, routes)`: one rank's inputs and times, `[point]` and
/// `[point][path]`; the fused rows carry their ratio to the unfused row of their point.
#[allow(clippy::type_complexity)]
fn rows(
    opts: &BenchOptions,
    mut progress: impl FnMut(&BenchRow),
    mut time: impl FnMut(&Config, Routes) -> Result<(Vec<RankInputs>, Vec<Vec<PathTimes>>), CudaError>,
) -> Result<Vec<BenchRow>, CudaError> {
    let mut rows = Vec::new();
    for &(recipe, routes) in &opts.routes {
        let config = opts.config.with_recipe(recipe);
        let (inputs, times) = time(&config, routes)?;
        for (point, paths) in inputs.iter().zip(&times) {
            let point_rows: Vec<BenchRow> = opts
                .paths
                .iter()
                .zip(paths)
                .map(|(&path, times)| summarize(&config, routes, path, point, times))
                .collect();
            let unfused = point_rows
                .iter()
                .find(|r| r.path == ForwardPath::Unfused)
                .map(|r| r.kernels_us);
            for mut row in point_rows {
                row.over_unfused = unfused
                    .filter(|&u| u > 0.0 && row.path != ForwardPath::Unfused)
                    .map(|u| row.kernels_us / u);
                progress(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// Rank `rank`'s random MXFP4 weights.
fn random_weights(config: &Config, rank: usize) -> RankWeights {
    let (h, i, el) = (
        config.hidden,
        config.intermediate,
        config.experts_per_rank(),
    );
    let w1 = ExpertWeights::random_codes(el, 2 * i, h, 2 * rank as u64 + 1);
    let w2 = ExpertWeights::random_codes(el, h, i, 2 * rank as u64 + 2);
    RankWeights {
        w1: w1.w,
        w1_sf: w1.w_sf,
        w2: w2.w,
        w2_sf: w2.w_sf,
    }
}

/// Rank `rank`'s inputs of every point (`opts.tokens`).
fn point_inputs(opts: &BenchOptions, config: &Config, rank: usize) -> Vec<RankInputs> {
    opts.tokens
        .iter()
        .map(|&t| {
            let options = GenOptions {
                config: *config,
                tokens: t,
                seed: 7 + t as u64,
                mask_fraction: 0.0,
            };
            generate::rank_inputs(&options, rank)
        })
        .collect()
}

/// One path's times at one point.
#[derive(Clone, Debug)]
struct PathTimes {
    /// The host path's forwards (`CudaRank::forward` / `rerun`), `[rep]`.
    forwards: Vec<StageTimes>,
    /// The engine's device forwards; on the fused path at T > 0 only.
    device: Option<DeviceForwardTimes>,
    /// The GPU's clock and power over `forwards`.
    reading: Option<Reading>,
}

/// The engine's device forwards of one point ([`time_device_forwards`]).
#[derive(Clone, Debug)]
struct DeviceForwardTimes {
    /// The host's time of each call, from call to return.
    calls: Vec<Duration>,
    /// The GPU's time per forward, the calls' forwards back to back.
    per_forward: Duration,
}

/// Collective: `reps` device forwards of `point` ([`CudaRank::forward_device`], fused, its inputs
/// in device buffers) queued back to back on this rank's stream, each call timed on the host from
/// call to return, and the whole run on the GPU by events around it. An untimed forward queued
/// first keeps the stream busy from the first timed call on, as an engine's is; the ranks meet on
/// the host before, so that no rank's forwards wait on the device for a peer still timing the host
/// path.
fn time_device_forwards(
    world: &World,
    rank: &mut CudaRank,
    config: &Config,
    point: &RankInputs,
    reps: usize,
) -> Result<DeviceForwardTimes, CudaError> {
    let stream = rank.gpu().stream().clone();
    let timer = GpuTimer::new(rank.gpu())?;
    let mut batch = DeviceBatch::new(&stream, config, point.tokens)?;
    batch.upload(point)?;
    let io = batch.io(false);
    world.barrier()?;
    // SAFETY: `batch` holds `point` on this rank's GPU and outlives the forwards (the stream is
    // synchronized below); every rank queues as many forwards.
    unsafe { rank.forward_device(&stream, &io)? };
    timer.start(&stream)?;
    let mut calls = Vec::with_capacity(reps);
    for _ in 0..reps {
        let clock = Instant::now();
        // SAFETY: as above.
        unsafe { rank.forward_device(&stream, &io)? };
        calls.push(clock.elapsed());
    }
    timer.stop(&stream)?;
    rank.gpu().synchronize()?;
    rank.check_device_forward()?;
    let run = Duration::from_secs_f64(f64::from(timer.elapsed_ms()?) * 1e-3);
    Ok(DeviceForwardTimes {
        calls,
        per_forward: run / reps.max(1) as u32,
    })
}

/// Collective: this rank's pipeline for the largest point, then per point and path a warm-up
/// forward and `2 · opts.reps` timed ones, with and without stage marks in turn (with
/// `opts.warm_up_ms`, back to back after that long of them; every rank runs as many as the slowest
/// needs), and on the fused path `opts.reps` device forwards ([`time_device_forwards`]);
/// `[point][path]`.
fn time_points(
    world: &Arc<World>,
    config: &Config,
    routes: Routes,
    opts: &BenchOptions,
    weights: &RankWeights,
    inputs: &[RankInputs],
) -> Result<Vec<Vec<PathTimes>>, CudaError> {
    let max_tokens = opts.tokens.iter().copied().max().unwrap_or(0);
    let mut rank = CudaRank::new(world.clone(), config, max_tokens, routes, weights)?;
    rank.set_chained_launches(opts.chained_launches);
    let telemetry = Telemetry::open();
    if opts.paths.contains(&ForwardPath::Fused) {
        // The device forward picks its tile from T alone: every tile it can pick compiled first,
        // so that no rank compiles while its peers wait on the device.
        rank.warm_up_fused()?;
    }
    // Timed forwards alternate: with stage marks (the shares) and without (the wall and span:
    // each mark costs a forward ≈ 1–1.5 µs of GPU time).
    let mut time_point = |point: &RankInputs, path: ForwardPath| -> Result<PathTimes, CudaError> {
        // The rows print once a route's points are all timed; this line says which point runs
        // (one that never ends is named by the last of them).
        tracing::info!(recipe = %config.recipe, %routes, tokens = point.tokens, %path, "timing");
        rank.set_path(path);
        rank.set_stage_marks(true);
        rank.forward(point)?; // warm-up: JIT of the GEMM tiles, first touch
        let sampling = telemetry.as_ref().map(|t| t.start(rank.gpu()));
        let forwards = if opts.warm_up_ms == 0 {
            (0..2 * opts.reps)
                .map(|rep| {
                    rank.set_stage_marks(rep % 2 == 0);
                    Ok(rank.forward(point)?.1)
                })
                .collect::<Result<Vec<_>, CudaError>>()?
        } else {
            let one = rank.rerun()?.wall.as_secs_f64().max(1e-5);
            let busy = agree_max(world, (opts.warm_up_ms as f64 * 1e-3 / one).ceil() as u64)?;
            for _ in 0..busy {
                rank.rerun()?;
            }
            (0..2 * opts.reps)
                .map(|rep| {
                    rank.set_stage_marks(rep % 2 == 0);
                    rank.rerun()
                })
                .collect::<Result<Vec<_>, CudaError>>()?
        };
        let reading = sampling.and_then(Sampling::finish);
        // An engine's batch holds at least one token.
        let device = (path == ForwardPath::Fused && point.tokens > 0)
            .then(|| time_device_forwards(world, &mut rank, config, point, opts.reps))
            .transpose()?;
        Ok(PathTimes {
            forwards,
            device,
            reading,
        })
    };
    let times = inputs
        .iter()
        .map(|point| {
            opts.paths
                .iter()
                .map(|&path| time_point(point, path))
                .collect()
        })
        .collect();
    if let Some(dir) = &opts.timeline
        && opts.paths.contains(&ForwardPath::Fused)
    {
        for point in inputs {
            record_timeline(&mut rank, world.rank(), config, routes, point, dir)?;
        }
    }
    times
}

fn serialize_display<S: serde::Serializer>(
    v: &impl std::fmt::Display,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn summarize(
    config: &Config,
    routes: Routes,
    path: ForwardPath,
    inputs: &RankInputs,
    times: &PathTimes,
) -> BenchRow {
    let (marked, unmarked): (Vec<StageTimes>, Vec<StageTimes>) =
        times.forwards.iter().partition(|t| t.stage_marks);
    let median = |runs: &[StageTimes], f: &dyn Fn(&StageTimes) -> Duration| {
        let mut v: Vec<Duration> = runs.iter().map(f).collect();
        v.sort();
        v[v.len() / 2].as_secs_f64()
    };
    // The wall and the kernels' span from the forwards without stage marks, the stages from those
    // with them.
    let device = median(&unmarked, &|t| t.wall);
    let kernels = median(&unmarked, &|t| t.span);
    let with_io = median(&unmarked, &StageTimes::total);
    let route = median(&unmarked, &|t| t.route);
    let queue = median(&unmarked, &|t| t.queue);
    let marked_span = median(&marked, &|t| t.span);
    let communication = median(&marked, &|t| t.dispatch + t.combine);
    let pairs = inputs.topk_idx.iter().filter(|&&e| e >= 0).count();
    let flops = 2.0 * pairs as f64 * (config.hidden * 3 * config.intermediate) as f64;
    let plan = Plan::new(PlanConfig {
        act_scale_group: config.recipe.group() as u32,
        ..PlanConfig::new(
            config.hidden as u32,
            config.intermediate as u32,
            config.num_experts as u32,
            config.top_k as u32,
            config.num_ranks as u32,
            inputs.tokens.max(1) as u32,
        )
    })
    .ok();
    let hbm = plan.as_ref().map_or(0.0, |p| p.hbm.total());
    let nvlink = plan
        .as_ref()
        .filter(|_| config.num_ranks > 1)
        .map_or(0.0, |p| p.nvlink.pull + p.nvlink.write_back);
    // The kernels' shares of their own time (the chain from dispatch to the top-k reduction).
    let kernel_total: f64 = marked
        .iter()
        .map(|r| r.kernels().as_secs_f64())
        .sum::<f64>()
        .max(1e-12);
    let stage_shares = marked[0]
        .kernel_stages()
        .iter()
        .enumerate()
        .map(|(s, &(name, _))| {
            let sum: f64 = marked
                .iter()
                .map(|r| r.kernel_stages()[s].1.as_secs_f64())
                .sum();
            (name.to_owned(), 100.0 * sum / kernel_total)
        })
        .collect();
    BenchRow {
        recipe: config.recipe,
        routes,
        path,
        ranks: config.num_ranks,
        tokens_per_rank: inputs.tokens,
        pairs,
        device_us: device * 1e6,
        kernels_us: kernels * 1e6,
        marked_us: marked_span * 1e6,
        route_us: route * 1e6,
        queue_us: queue * 1e6,
        with_host_io_us: with_io * 1e6,
        device_call_us: times.device.as_ref().map(|d| {
            let mut calls = d.calls.clone();
            calls.sort();
            calls[calls.len() / 2].as_secs_f64() * 1e6
        }),
        device_forward_us: times
            .device
            .as_ref()
            .map(|d| d.per_forward.as_secs_f64() * 1e6),
        tflops: flops / device / 1e12,
        kernel_tflops: flops / kernels.max(1e-12) / 1e12,
        hbm_gbps: hbm / kernels.max(1e-12) / 1e9,
        communication_us: communication * 1e6,
        nvlink_gbps: if communication > 0.0 {
            nvlink / communication / 1e9
        } else {
            0.0
        },
        stage_shares,
        over_unfused: None,
        sm_clock_mhz: times.reading.map(|r| r.sm_clock_mhz),
        power_w: times.reading.map(|r| r.power_w),
    }
}

/// A time of the table that only some paths have, or `-`.
fn optional_us(us: Option<f64>) -> String {
    us.map_or("-".to_owned(), |us| format!("{us:.1}"))
}

impl BenchRow {
    /// The table header matching [`BenchRow`]'s `Display`.
    pub const HEADER: &str = "route         path       R      T  pairs | /unfused |  device us  TFLOPS | kernels us  TFLOPS  HBM GB/s | marked us | route us queue us |  comm us  NVLink GB/s | host-I/O us | dev call us dev fwd us | SM MHz power W | kernel shares";
}

impl std::fmt::Display for BenchRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shares: Vec<String> = self
            .stage_shares
            .iter()
            .map(|(s, p)| format!("{s} {p:.0}%"))
            .collect();
        write!(
            f,
            "{:<13} {:<7} {:>2} {:>6} {:>6} | {:>8} | {:>10.1} {:>7.1} | {:>10.1} {:>7.1} {:>9.0} | {:>9.1} | {:>8.1} {:>8.1} | {:>8.1} {:>12.1} | {:>11.1} | {:>11} {:>10} | {:>6} {:>7} | {}",
            format!("{}/{}", self.recipe, self.routes),
            self.path,
            self.ranks,
            self.tokens_per_rank,
            self.pairs,
            self.over_unfused
                .map_or("".to_owned(), |r| format!("{r:.3}")),
            self.device_us,
            self.tflops,
            self.kernels_us,
            self.kernel_tflops,
            self.hbm_gbps,
            self.marked_us,
            self.route_us,
            self.queue_us,
            self.communication_us,
            self.nvlink_gbps,
            self.with_host_io_us,
            optional_us(self.device_call_us),
            optional_us(self.device_forward_us),
            self.sm_clock_mhz
                .map_or("-".to_owned(), |mhz| format!("{mhz:.0}")),
            self.power_w.map_or("-".to_owned(), |w| format!("{w:.0}")),
            shares.join(", ")
        )
    }
}
