//! Grouped-GEMM benchmark on the V4-Pro per-rank shape (48 experts, H 7168, I 3072, top-6, one GPU):
//! for each route (recipe / tensor-core route) and token count, L1 (n = 2I, K = H) and L2 (n = H, K = I) over the pool that a
//! uniform random top-6 routing of T tokens makes, timed with CUDA events: every variant of a T runs
//! for `--warm-up-ms` (300 ms: the GPU reaches its power cap, and the sustained clock), then the
//! variants are sampled in turn, median of 25 samples of 4 launches each (`--warm-up-ms 0` gives
//! the faster first-after-idle numbers; docs/perf.md v20 has both). A launch of milliseconds
//! (T = 8192) reaches the power cap within the samples either way; `--idle-ms 100` makes every
//! sample one launch after 100 ms of idle GPU: the clock a burst meets (the pipeline's forwards,
//! apart by their host I/O, meet it too).
//! Inputs are not rotated: every launch streams all of the layer's weights (1.1 / 0.6 GB, twenty
//! times the L2) from HBM anyway, and the activation pool, L2-resident at small T, is so in the
//! pipeline too (dispatch and SwiGLU write it just before the GEMM reads it).
//! Prints time, TFLOPS, the bytes that must move and the floor they set at the HBM rate measured
//! in the same run (a 2 GiB device copy), the ratio of time to floor, and the GPU's mean SM clock
//! and board power over each T's samples (NVML, `cuda_rt::Telemetry`; `-` without it).
//!
//! `--trace` then runs every variant once more with a timeline of its CTAs and prints where each
//! launch's time goes: the spread of the CTAs' starts, their ends and the k128 blocks each loaded,
//! and every CTA's line (`cta <launch> <cta> <sm> <start> <end> <blocks>`, µs) for a closer look.
//!
//! `cargo bench -p megamoe-kernel --bench gemm -- [--tokens 8,128,...] [--routes g128/fp8,mx32/bf16] [--tiles auto|16,..] [--ctas 1|2] [--cluster 1,2] [--split-parts 1,2,4] [--narrow-tiles on,off] [--dynamic on,off] [--register-tables on,off] [--warm-up-ms 300] [--idle-ms 0] [--hidden 7168 --inter 3072] [--trace]`

use std::time::{Duration, Instant};

use cuda_rt::timing::GpuTimer;
use cuda_rt::{Gpu, Jit, Reading, Sampling, Telemetry};
use fp_formats::Recipe;
use megamoe_kernel::gemm::{TOKEN_TILES, parse_route};
use megamoe_kernel::problem::{ActPool, ExpertWeights};
use megamoe_kernel::timeline::{Timeline, TimelineBuffers};
use megamoe_kernel::{
    DeviceBytes, DeviceWeights, GemmCore, Mma, Pool, Routes, TilePlan, transform_weights,
};
use rand::{Rng, SeedableRng};

const EXPERTS: usize = 48;
const TOP_K: usize = 6;
const REPS: usize = 25;
/// Launches per timed sample: the host's per-launch work (argument checks, TMA encoding) then
/// overlaps the previous launch instead of showing up as GPU idle time.
const LAUNCHES_PER_SAMPLE: usize = 4;
/// Room for every tile of a CTA in the `--trace` launch (T = 8192 draws ≈ 80 a CTA).
const TRACE_EVENTS_PER_CTA: usize = 1024;

/// Benchmark arguments; lists are comma-separated.
#[derive(clap::Parser)]
struct Args {
    #[arg(long, value_delimiter = ',', default_value = "8,128,512,2048,8192")]
    tokens: Vec<usize>,
    /// `recipe/route` pairs: g128/fp8, g128/bf16, mx32/bf16.
    #[arg(long, value_delimiter = ',', default_value = "g128/fp8,mx32/bf16", value_parser = parse_route::<Mma>)]
    routes: Vec<(Recipe, Mma)>,
    /// Tokens per tile: `auto` (the plan's choice) or a list.
    #[arg(long, default_value = "auto")]
    tiles: String,
    /// CTAs per SM for every tile (default: the plan's choice).
    #[arg(long)]
    ctas: Option<usize>,
    /// CTAs per cluster on the BF16 route, a list to compare (default: the plan's; the FP8 route
    /// has no clusters).
    #[arg(long, value_delimiter = ',')]
    cluster: Vec<usize>,
    /// Hidden size H (L1's K, L2's n); V4-Pro's by default. Other shapes tell per-tile from
    /// per-launch costs (e.g. `--hidden 3072 --inter 7168` swaps the layers' K).
    #[arg(long, default_value_t = 7168)]
    hidden: usize,
    /// Expert intermediate size I (L1's n = 2I, L2's K).
    #[arg(long, default_value_t = 3072)]
    inter: usize,
    /// Milliseconds of running the variants before sampling them.
    #[arg(long, default_value_t = 300)]
    warm_up_ms: u64,
    /// Milliseconds of idle GPU before every sample, each then one launch (0: samples of 4
    /// launches back to back).
    #[arg(long, default_value_t = 0)]
    idle_ms: u64,
    /// Split tail: parts of K the two-CTA tiles' last items are drawn in (1: none), a list.
    #[arg(long, value_delimiter = ',')]
    split_parts: Vec<usize>,
    /// Narrow tiles (two-CTA tiles on fewer tokens when their rows fit), a list to compare.
    #[arg(long, value_delimiter = ',', value_parser = parse_on_off)]
    narrow_tiles: Vec<bool>,
    /// The dynamic tile schedule (CTAs draw tiles from a counter), a list to compare.
    #[arg(long, value_delimiter = ',', value_parser = parse_on_off)]
    dynamic: Vec<bool>,
    /// FP8 decode tables in registers (where the weights allow) or in shared memory, a list.
    #[arg(long, value_delimiter = ',', value_parser = parse_on_off)]
    register_tables: Vec<bool>,
    /// After timing, one launch of each variant with a timeline of its CTAs (starts, ends, blocks).
    #[arg(long)]
    trace: bool,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The variants a list option asks for: every plan once with each listed value (`set`), or the
/// plans as they are when the list is empty (the plan's default).
fn vary<T: Copy>(
    plans: Vec<TilePlan>,
    values: &[T],
    set: fn(TilePlan, T) -> TilePlan,
) -> Vec<TilePlan> {
    if values.is_empty() {
        return plans;
    }
    plans
        .into_iter()
        .flat_map(|plan| values.iter().map(move |&v| set(plan, v)))
        .collect()
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("`{s}`: on or off")),
    }
}

/// Rows per expert of a uniform random top-k routing (distinct experts per token).
fn route(tokens: usize, seed: u64) -> Vec<usize> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut rows = vec![0; EXPERTS];
    for _ in 0..tokens {
        let mut picked = [usize::MAX; TOP_K];
        for j in 0..TOP_K {
            let e = loop {
                let e = rng.random_range(0..EXPERTS);
                if !picked.contains(&e) {
                    break e;
                }
            };
            picked[j] = e;
            rows[e] += 1;
        }
    }
    rows
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds per call of each of `fs` (medians), sampled in turn: A B C A B C ... after
/// `warm_up` of running them all, so that every variant meets the GPU in the same state. (Timed
/// one after the other, a second variant of the same kernel ran up to 10 % slower than the first,
/// 2026-11-30.) With `idle` every sample is one call after that long with the GPU idle. With
/// `telemetry`, also the GPU's SM clock and power over the samples.
fn time_interleaved(
    gpu: &Gpu,
    warm_up: Duration,
    idle: Duration,
    telemetry: Option<&Telemetry>,
    fs: &mut [&mut dyn FnMut()],
) -> (Vec<f32>, Option<Reading>) {
    let launches = if idle.is_zero() {
        LAUNCHES_PER_SAMPLE
    } else {
        1
    };
    let timer = GpuTimer::new(gpu).unwrap();
    let start = Instant::now();
    for f in fs.iter_mut() {
        (0..3).for_each(|_| f()); // module load and first-launch work
    }
    while start.elapsed() < warm_up {
        for f in fs.iter_mut() {
            (0..LAUNCHES_PER_SAMPLE).for_each(|_| f());
        }
        gpu.synchronize().unwrap();
    }
    let mut samples = vec![Vec::with_capacity(REPS); fs.len()];
    let sampling = telemetry.map(|t| t.start(gpu));
    for _ in 0..REPS {
        for (f, samples) in fs.iter_mut().zip(&mut samples) {
            if !idle.is_zero() {
                gpu.synchronize().unwrap();
                std::thread::sleep(idle);
            }
            timer.start(gpu.stream()).unwrap();
            (0..launches).for_each(|_| f());
            timer.stop(gpu.stream()).unwrap();
            samples.push(timer.elapsed_ms().unwrap() / launches as f32);
        }
    }
    let reading = sampling.and_then(Sampling::finish);
    (samples.into_iter().map(median).collect(), reading)
}

fn time_ms(gpu: &Gpu, mut f: impl FnMut()) -> f32 {
    time_interleaved(gpu, Duration::ZERO, Duration::ZERO, None, &mut [&mut f]).0[0]
}

/// HBM bandwidth of a 2 GiB device-to-device copy (bytes read + written).
fn hbm_rate(gpu: &Gpu) -> f64 {
    let bytes = 2usize << 30;
    let src = gpu.alloc_zeros::<u8>(bytes).unwrap();
    let mut dst = gpu.alloc_zeros::<u8>(bytes).unwrap();
    let ms = time_ms(gpu, || gpu.stream().memcpy_dtod(&src, &mut dst).unwrap());
    2.0 * bytes as f64 / (ms as f64 * 1e-3)
}

/// `bn/ctas/cluster[/sk][/n]`.
fn variant_name(plan: &TilePlan) -> String {
    format!(
        "{}/{}/{}{}{}{}{}",
        plan.tokens_per_tile,
        plan.ctas_per_sm,
        plan.cluster,
        if plan.dynamic { "/dyn" } else { "" },
        if plan.splits_tail() {
            format!("/sk{}", plan.split_parts)
        } else {
            String::new()
        },
        if plan.narrows_tiles() { "/n" } else { "" },
        if plan.tables_in_registers() {
            "/rt"
        } else {
            ""
        }
    )
}

/// A launch's CTAs, from its timeline: per CTA its first tile's start, its last tile's end (µs after
/// the first start) and its k128 blocks, with its SM.
struct CtaSpan {
    cta: u32,
    sm: u32,
    start_us: f64,
    end_us: f64,
    blocks: u64,
}

fn cta_spans(timeline: &Timeline) -> Vec<CtaSpan> {
    let mut spans: Vec<CtaSpan> = Vec::new();
    for e in &timeline.events {
        let (Some(cta), Some(sm)) = (e.cta, e.sm) else {
            continue;
        };
        let (start, end) = (e.start_ns as f64 * 1e-3, e.end_ns as f64 * 1e-3);
        let blocks = e.tile.map_or(0, |t| u64::from(t.k_blocks));
        match spans.iter_mut().find(|s| s.cta == cta) {
            Some(s) => {
                s.start_us = s.start_us.min(start);
                s.end_us = s.end_us.max(end);
                s.blocks += blocks;
            }
            None => spans.push(CtaSpan {
                cta,
                sm,
                start_us: start,
                end_us: end,
                blocks,
            }),
        }
    }
    spans.sort_by_key(|s| s.cta);
    spans
}

/// The spread of the CTAs' starts, their ends at percentiles, and the k128 blocks per CTA.
fn summary(spans: &[CtaSpan]) -> String {
    let mut starts: Vec<f64> = spans.iter().map(|c| c.start_us).collect();
    let mut ends: Vec<f64> = spans.iter().map(|c| c.end_us).collect();
    let mut blocks: Vec<u64> = spans.iter().map(|c| c.blocks).collect();
    starts.sort_by(f64::total_cmp);
    ends.sort_by(f64::total_cmp);
    blocks.sort();
    let at = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    // Whether the last CTAs to end are the ones with the most work: the blocks of the 5 % that
    // end last against all.
    let cut = at(&ends, 0.95);
    let late: Vec<&CtaSpan> = spans.iter().filter(|c| c.end_us >= cut).collect();
    let late_blocks = late.iter().map(|c| c.blocks).sum::<u64>() as f64 / late.len() as f64;
    format!(
        "starts within {:.1} us (p50 {:.1}); ends min {:.1} p10 {:.1} p50 {:.1} p90 {:.1} max {:.1} us; \
         blocks per CTA min {} p50 {} max {} (last 5 % to end: {:.1})",
        at(&starts, 1.0),
        at(&starts, 0.5),
        at(&ends, 0.0),
        at(&ends, 0.1),
        at(&ends, 0.5),
        at(&ends, 0.9),
        at(&ends, 1.0),
        blocks[0],
        blocks[blocks.len() / 2],
        blocks[blocks.len() - 1],
        late_blocks
    )
}

struct Layer {
    name: &'static str,
    weights: DeviceWeights,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let Args {
        tokens,
        routes,
        tiles,
        ctas,
        cluster,
        split_parts,
        narrow_tiles,
        dynamic,
        register_tables,
        warm_up_ms,
        idle_ms,
        hidden,
        inter,
        trace,
        ..
    } = clap::Parser::parse();
    let warm_up = Duration::from_millis(warm_up_ms);
    let idle = Duration::from_millis(idle_ms);
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("the grouped-GEMM benchmark needs a CUDA GPU: {e}");
            std::process::exit(2);
        }
    };
    let jit = Jit::new().unwrap();
    let hbm = hbm_rate(&gpu);
    let telemetry = Telemetry::open();
    println!(
        "# {} ({} SMs), HBM copy {:.0} GB/s; per rank: {EXPERTS} experts, H {hidden}, I {inter}, top-{TOP_K}; {}",
        gpu.info().name,
        gpu.info().sm_count,
        hbm / 1e9,
        if idle.is_zero() {
            format!("{warm_up_ms} ms warm-up, samples of {LAUNCHES_PER_SAMPLE} launches")
        } else {
            format!("every sample one launch after {idle_ms} ms idle")
        }
    );
    println!(
        "{:<9} {:>5} {:>13} {:>6} | {:>9} {:>7} | {:>9} {:>7} | {:>9} {:>7} {:>9} {:>6} | {:>6} {:>5}",
        "route",
        "T",
        "bn/c/cl",
        "hit",
        "L1 us",
        "L1 TF",
        "L2 us",
        "L2 TF",
        "L1+L2 us",
        "TF",
        "floor us",
        "ratio",
        "SM MHz",
        "W"
    );
    for (recipe, mma) in routes {
        let layers: Vec<Layer> = [("L1", 2 * inter, hidden), ("L2", hidden, inter)]
            .into_iter()
            .map(|(name, n, k)| {
                let w = ExpertWeights::random_codes(EXPERTS, n, k, n as u64);
                let t = transform_weights(mma, &w.w, &w.w_sf, EXPERTS, n, k).unwrap();
                Layer {
                    name,
                    weights: DeviceWeights::upload(&gpu, &t).unwrap(),
                }
            })
            .collect();
        for &t in &tokens {
            let rows = route(t, t as u64);
            let hit = rows.iter().filter(|&&r| r > 0).count();
            let pairs: usize = rows.iter().sum();
            let bns: Vec<usize> = if tiles == "auto" {
                vec![TilePlan::tokens_per_tile_for(
                    pairs as f64 / hit as f64,
                    Routes::both(mma),
                )]
            } else {
                tiles.split(',').map(|s| s.parse().unwrap()).collect()
            };
            // One pool per layer (K differs), shared by every tile size.
            let mut pools: Vec<_> = layers
                .iter()
                .map(|layer| {
                    let pool = ActPool::random(recipe, &rows, layer.weights.k, 99);
                    let sf_stride = pool.sf_stride(*TOKEN_TILES.last().unwrap());
                    let (act, act_sf) = pool.device_image(mma, sf_stride);
                    let act = gpu.upload(&act).unwrap();
                    let act_sf = act_sf.map(|sf| gpu.upload(&sf).unwrap());
                    let (offsets, counts) = (
                        gpu.upload(&pool.expert_offset).unwrap(),
                        gpu.upload(&pool.expert_rows).unwrap(),
                    );
                    let out = gpu.alloc_zeros::<u16>(pool.rows * layer.weights.n).unwrap();
                    (pool, sf_stride, act, act_sf, offsets, counts, out)
                })
                .collect();
            // One core serves both layers: their weights fold alike here.
            assert_eq!(
                layers[0].weights.fold, layers[1].weights.fold,
                "L1 and L2 fold alike"
            );
            let mut plans: Vec<TilePlan> = bns
                .into_iter()
                .filter(|bn| TOKEN_TILES.contains(bn))
                .map(|bn| {
                    let plan = TilePlan::new(mma, bn).unwrap();
                    // First: the CTAs per SM choose the cluster.
                    let plan = ctas.map_or(plan, |ctas| plan.with_ctas_per_sm(ctas));
                    plan.with_fold(layers[0].weights.fold)
                })
                .collect();
            if mma == Mma::Bf16 {
                plans = vary(plans, &cluster, TilePlan::with_cluster);
            }
            plans = vary(plans, &split_parts, TilePlan::with_split_parts);
            plans = vary(plans, &narrow_tiles, TilePlan::with_narrow_tiles);
            plans = vary(plans, &dynamic, TilePlan::with_dynamic);
            plans = vary(plans, &register_tables, TilePlan::with_register_tables);
            let mut cores: Vec<GemmCore> = plans
                .into_iter()
                .map(|plan| GemmCore::new(&gpu, &jit, plan).unwrap())
                .collect();
            // times[layer][variant], every variant of a layer sampled in turn.
            let mut times = Vec::new();
            let mut readings: Vec<Reading> = Vec::new();
            let mut bytes_total = 0usize;
            for (layer, (pool, sf_stride, act, act_sf, offsets, counts, out)) in
                layers.iter().zip(pools.iter_mut())
            {
                let k = layer.weights.k;
                let device_pool = Pool {
                    act: DeviceBytes::of(&gpu, act),
                    act_sf: act_sf.as_ref().map(|sf| DeviceBytes::of(&gpu, sf)),
                    sf_stride: *sf_stride,
                    rows: pool.rows,
                    expert_offset: &pool.expert_offset,
                    expert_rows: &pool.expert_rows,
                    expert_offset_dev: offsets.slice(..),
                    expert_rows_dev: counts.slice(..),
                };
                // Every variant writes the same output: they run one after another on one stream.
                let out = std::cell::RefCell::new(out);
                let mut runs: Vec<_> = cores
                    .iter_mut()
                    .map(|core| {
                        let (weights, pool, gpu, out) = (&layer.weights, &device_pool, &gpu, &out);
                        move || core.run(gpu, weights, pool, &mut out.borrow_mut()).unwrap()
                    })
                    .collect();
                let mut fs: Vec<&mut dyn FnMut()> =
                    runs.iter_mut().map(|f| f as &mut dyn FnMut()).collect();
                let (layer_times, reading) =
                    time_interleaved(&gpu, warm_up, idle, telemetry.as_ref(), &mut fs);
                times.push(layer_times);
                readings.extend(reading);
                drop(runs);
                for core in &cores {
                    core.check_error(&gpu).unwrap();
                }
                if trace {
                    // Right after the timing: the GPU in the same (sustained) state.
                    for core in cores.iter_mut() {
                        let mut timeline =
                            TimelineBuffers::new(&gpu, core.grid() as usize, TRACE_EVENTS_PER_CTA)
                                .unwrap();
                        core.run_recorded(
                            &gpu,
                            &layer.weights,
                            &device_pool,
                            &mut out.borrow_mut(),
                            &mut timeline,
                        )
                        .unwrap();
                        let spans = cta_spans(&timeline.read(&gpu, &[]).unwrap());
                        let launch = format!(
                            "{recipe}/{mma}/T{t}/{}/{}",
                            layer.name,
                            variant_name(&core.plan)
                        );
                        println!("trace {launch}: {}", summary(&spans));
                        for c in &spans {
                            println!(
                                "cta {launch} {} {} {:.1} {:.1} {}",
                                c.cta, c.sm, c.start_us, c.end_us, c.blocks
                            );
                        }
                    }
                }
                bytes_total += hit * layer.weights.bytes_per_expert()
                    + pairs * (k * mma.act_elem() + layer.weights.n * 2);
                tracing::debug!(layer = layer.name, ms = ?times.last().unwrap(), "timed");
            }
            // The clock and power over both layers' samples (every variant's).
            let (mhz, watts) =
                Reading::mean(&readings).map_or(("-".to_owned(), "-".to_owned()), |r| {
                    (
                        format!("{:.0}", r.sm_clock_mhz),
                        format!("{:.0}", r.power_w),
                    )
                });
            for (v, core) in cores.iter().enumerate() {
                let flops = |n: usize, k: usize| 2.0 * pairs as f64 * n as f64 * k as f64;
                let (f1, f2) = (flops(2 * inter, hidden), flops(hidden, inter));
                let (t1, t2) = (times[0][v] as f64 * 1e-3, times[1][v] as f64 * 1e-3);
                let floor = bytes_total as f64 / hbm;
                println!(
                    "{:<9} {:>5} {:>13} {:>6} | {:>9.1} {:>7.1} | {:>9.1} {:>7.1} | {:>9.1} {:>7.1} {:>9.1} {:>6.2} | {:>6} {:>5}",
                    format!("{recipe}/{mma}"),
                    t,
                    variant_name(&core.plan),
                    hit,
                    t1 * 1e6,
                    f1 / t1 / 1e12,
                    t2 * 1e6,
                    f2 / t2 / 1e12,
                    (t1 + t2) * 1e6,
                    (f1 + f2) / (t1 + t2) / 1e12,
                    floor * 1e6,
                    (t1 + t2) / floor,
                    mhz,
                    watts
                );
            }
        }
    }
}
