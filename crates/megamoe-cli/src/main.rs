//! `megamoe-cli`, the `megamoe` binary: `gen` writes a random problem directory, `run` computes `y.rank{r}` with
//! a backend (cpu, cpu-dataflow, cuda), `check` compares two outputs with the acceptance metric of DESIGN §1, `plan`
//! prints `moe_sched`'s per-rank plan of a preset and the size of its symmetric buffer, `bench` times the cuda backend.
//!
//! `--world process` (cuda `run`, `bench`) runs one process per rank: the command launches itself
//! once per rank with torchrun's variables set (`megamoe::cuda::spawn_rank_processes`), and a
//! process that finds them set (launched so, or by torchrun) is that rank.

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use megamoe::cuda::{ForwardPath, Placement};
use megamoe::{Config, Recipe};
use megamoe_dataflow::{self as dataflow, EngineOptions};
use megamoe_kernel::Routes;
use megamoe_kernel::gemm::{Route, parse_route};
use megamoe_problems::check::Comparison;
use megamoe_problems::files::{self, Output};
use megamoe_problems::generate::{self, GenOptions};
use megamoe_problems::reference::Forward;
use moe_sched::{Plan, PlanConfig};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use symm_mem::ProcessEnv;
use tracing::info;

#[derive(Parser)]
#[command(
    version,
    about = "MegaMoE: expert-parallel MoE forward pass problems, backends and checks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a random problem directory (config.json, weights.rank{r}, inputs.rank{r}).
    Gen(GenArgs),
    /// Compute y.rank{r}.safetensors for a problem directory.
    Run {
        dir: PathBuf,
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// cuda: the ranks as threads of this process, or one process per rank.
        #[arg(long, value_enum, default_value_t = WorldKind::Local)]
        world: WorldKind,
        /// cuda: consecutive ranks that share one GPU (the cross-rank protocol on fewer GPUs).
        #[arg(long, default_value_t = 1)]
        ranks_per_gpu: usize,
        /// cuda: the GEMMs' tensor-core routes. `bf16` is exact for both recipes; `fp8` (g128 only)
        /// is faster but accumulates with Hopper's FP8 tensor core (calc_diff ≈ 1–3e-5 on V4
        /// shapes); `bf16-fp8` (g128 only) keeps the L1 exact and runs the L2 through FP8.
        #[arg(long, default_value_t = Routes::EXACT)]
        mma: Routes,
        /// cpu-dataflow: GEMM worker threads per rank.
        #[arg(long, default_value_t = EngineOptions::default().workers_per_rank)]
        workers: usize,
        /// cpu-dataflow: dispatch threads per rank.
        #[arg(long, default_value_t = EngineOptions::default().dispatch_threads_per_rank)]
        dispatch_threads: usize,
    },
    /// Compare two outputs (y files, or directories of y.rank{r} files): calc_diff and max abs
    /// error; exits non-zero when calc_diff > tol or a NaN shows up.
    Check {
        a: PathBuf,
        b: PathBuf,
        #[arg(long, default_value_t = 1e-5)]
        tol: f64,
    },
    /// Print the per-rank plan of a preset: buffer size, block sizes, waves, bytes and FLOPs.
    Plan(PlanArgs),
    /// Time the CUDA pipeline on local GPUs: per recipe and T, device time, TFLOPS, HBM and NVLink
    /// GB/s of the plan's bytes, communication alone, each stage's share; on the fused path the
    /// engine's device forward too (host time per call, GPU time per forward).
    Bench(BenchArgs),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// One of: tiny, deepseek-v4-flash, deepseek-v4-pro, deepseek-v3.
    #[arg(long, default_value = "deepseek-v4-pro")]
    preset: String,
    /// Ranks = local GPUs.
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// Experts over all ranks (default: the preset's); `--experts 48 --ranks 1` is V4-Pro's
    /// per-rank shape at EP8.
    #[arg(long)]
    experts: Option<usize>,
    /// Tokens per rank, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,128,8192")]
    tokens: Vec<usize>,
    /// `recipe/route` pairs: g128/fp8 (fast), g128/bf16-fp8 (exact L1, FP8 L2), g128/bf16 and
    /// mx32/bf16 (exact).
    #[arg(long, value_delimiter = ',', default_value = "g128/fp8,mx32/bf16", value_parser = parse_route::<Routes>)]
    routes: Vec<(Recipe, Routes)>,
    /// The forward's paths, side by side at every point: `unfused` (a launch per stage) and
    /// `fused` (one persistent launch).
    #[arg(long, value_delimiter = ',', default_value = "unfused,fused")]
    path: Vec<ForwardPath>,
    /// Timed forwards per point, after one warm-up: as many again with a mark between every two
    /// stages (the shares and the communication time come from those); on the fused path as many
    /// device forwards (`CudaRank::forward_device`) back to back, each call's host time and their
    /// GPU time per forward.
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// 0: each timed forward with its host I/O (the GPU idles in between, at its burst clock);
    /// otherwise forwards back to back without host I/O for this long, then the timed ones (the
    /// GPU busy, at its power-capped sustained clock, as in serving).
    #[arg(long, default_value_t = 0)]
    warm_up_ms: u64,
    /// Launch every stage kernel only after the previous one has finished, instead of
    /// programmatically while it finishes (for comparison).
    #[arg(long)]
    unchained_launches: bool,
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// After timing, one more fused forward per point with the kernel's timeline on, written into
    /// this directory as `<recipe>-<route>-T<t>-rank<r>.json` (events, overlap) and `.svg` (the picture);
    /// the overlap is logged.
    #[arg(long)]
    timeline: Option<std::path::PathBuf>,
    /// The ranks as threads of this process, or one process per rank (rank 0 reports its times).
    #[arg(long, value_enum, default_value_t = WorldKind::Local)]
    world: WorldKind,
    /// Consecutive ranks that share one GPU (their times then share it too).
    #[arg(long, default_value_t = 1)]
    ranks_per_gpu: usize,
}

#[derive(clap::Args)]
struct PlanArgs {
    /// One of: tiny, deepseek-v4-flash, deepseek-v4-pro, deepseek-v3.
    #[arg(long)]
    preset: String,
    #[arg(long)]
    ranks: usize,
    /// Tokens per rank (also the buffer's T_max).
    #[arg(long)]
    tokens: usize,
    #[arg(long, default_value_t = Recipe::Mx32)]
    recipe: Recipe,
    /// The GEMMs' tensor-core routes, which set the L1 pool's format in the symmetric buffer.
    #[arg(long, default_value_t = Routes::EXACT)]
    mma: Routes,
    /// SMs per GPU (persistent workers).
    #[arg(long, default_value_t = moe_sched::heuristics::DEFAULT_NUM_SMS)]
    sms: u32,
}

#[derive(clap::Args)]
struct GenArgs {
    dir: PathBuf,
    /// One of: tiny, deepseek-v4-flash, deepseek-v4-pro, deepseek-v3.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Tokens per rank.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Probability that a top-k slot is masked (-1).
    #[arg(long, default_value_t = 0.0)]
    mask_fraction: f64,
    /// SwiGLU clamp: a number, or `none`; default: the preset's.
    #[arg(long, value_parser = parse_clamp)]
    clamp: Option<Clamp>,
    #[arg(long, default_value_t = Recipe::Mx32)]
    recipe: Recipe,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// The CPU reference of the numeric contract.
    Cpu,
    /// The fused kernel's dataflow on host threads: ranks over symmetric buffers, dispatch,
    /// wave-scheduled GEMM blocks, combine (bitwise equal to `cpu`).
    CpuDataflow,
    /// The unfused GPU pipeline (dispatch, L1, SwiGLU, L2, combine as separate launches) on one
    /// local GPU per rank.
    Cuda,
}

/// How the ranks of the cuda backend run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WorldKind {
    /// One process, a thread per rank (peer access between the GPUs).
    Local,
    /// One process per rank (memory shared between the processes): the command launches itself
    /// once per rank; under torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) it
    /// is that rank.
    Process,
}

/// `--clamp` value: `none` switches the clamp off.
#[derive(Clone, Copy)]
struct Clamp(Option<f32>);

fn parse_clamp(s: &str) -> Result<Clamp, String> {
    if s == "none" {
        return Ok(Clamp(None));
    }
    s.parse()
        .map(|c| Clamp(Some(c)))
        .map_err(|_| format!("`{s}` is neither a number nor `none`"))
}

fn main() -> anyhow::Result<()> {
    // Ranks that share a GPU (`--ranks-per-gpu`) each need a hardware queue of their own.
    // SAFETY: the first statement of main: no other thread runs yet.
    unsafe { megamoe::cuda::ask_for_every_connection() };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Gen(args) => generate_problem(args),
        Command::Run {
            dir,
            backend,
            world,
            ranks_per_gpu,
            mma,
            workers,
            dispatch_threads,
        } => match (backend, world) {
            (Backend::Cuda, world) => run_cuda(&dir, world, ranks_per_gpu, mma),
            (_, WorldKind::Process) => {
                bail!("--world process is for the cuda backend (--backend cuda)")
            }
            (Backend::Cpu, WorldKind::Local) => run_cpu(&dir),
            (Backend::CpuDataflow, WorldKind::Local) => run_dataflow(
                &dir,
                EngineOptions {
                    workers_per_rank: workers,
                    dispatch_threads_per_rank: dispatch_threads,
                    ..EngineOptions::default()
                },
            ),
        },
        Command::Check { a, b, tol } => check(&a, &b, tol),
        Command::Plan(args) => plan(&args),
        Command::Bench(args) => bench(&args),
    }
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{msg:>12} [{elapsed_precise}] {wide_bar} {pos}/{len} ({eta})",
    )
    .expect("valid template");
    ProgressBar::new(len)
        .with_style(style)
        .with_message(what.to_owned())
}

fn generate_problem(args: GenArgs) -> anyhow::Result<()> {
    let preset = Config::preset(&args.preset)?;
    let clamp = args.clamp.map_or(preset.clamp, |c| c.0);
    let config = preset
        .with_ranks(args.ranks)
        .with_recipe(args.recipe)
        .with_clamp(clamp);
    config.validate()?;
    if !(0.0..=1.0).contains(&args.mask_fraction) {
        bail!("--mask-fraction {} is not in [0, 1]", args.mask_fraction);
    }
    let opts = GenOptions {
        config,
        tokens: args.tokens,
        seed: args.seed,
        mask_fraction: args.mask_fraction,
    };
    let start = Instant::now();
    files::write_config(&args.dir, &config)?;
    let progress = bar(
        generate::weight_rows(&config) * config.num_ranks as u64,
        "weight rows",
    );
    for rank in 0..config.num_ranks {
        let weights = generate::rank_weights(&opts, rank, |n| progress.inc(n));
        files::write_weights(&args.dir, &config, rank, &weights)?;
        files::write_inputs(
            &args.dir,
            &config,
            rank,
            &generate::rank_inputs(&opts, rank),
        )?;
        info!(rank, "wrote weights and inputs");
    }
    progress.finish_and_clear();
    println!(
        "{}: {} ×{} ranks, E={} (E_l={}), H={}, I={}, k={}, clamp={:?}, {}, T={} per rank, seed {}, in {:.2}s",
        args.dir.display(),
        args.preset,
        config.num_ranks,
        config.num_experts,
        config.experts_per_rank(),
        config.hidden,
        config.intermediate,
        config.top_k,
        config.clamp,
        config.recipe,
        args.tokens,
        args.seed,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn run_cpu(dir: &Path) -> anyhow::Result<()> {
    let start = Instant::now();
    let config = files::read_config(dir)?;
    files::check_rank_files(dir, &config)?;
    let inputs = (0..config.num_ranks)
        .map(|r| files::read_inputs(dir, &config, r))
        .collect::<Result<Vec<_>, _>>()?;
    let pairs = routed_pairs(&inputs);
    let fwd = Forward::new(&config, &inputs);
    let progress = bar(fwd.active_experts() as u64, "experts");
    let mut fwd = fwd.with_progress(|n| progress.inc(n));
    let mut compute = Duration::ZERO;
    for owner in 0..config.num_ranks {
        let weights = files::read_weights(dir, &config, owner)?;
        let t = Instant::now();
        fwd.run_owner(owner, &weights)
            .with_context(|| format!("owner rank {owner}"))?;
        compute += t.elapsed();
    }
    progress.finish_and_clear();
    let t = Instant::now();
    let outputs = fwd.finish();
    compute += t.elapsed();
    write_outputs(dir, &config, inputs.iter().map(|x| x.tokens), outputs)?;
    let flop = 2.0 * pairs as f64 * config.macs_per_pair() as f64;
    println!(
        "cpu: y per rank {} (BF16), {pairs} routed pairs, compute {:.3}s ({:.1} GFLOP/s), total {:.3}s",
        y_shapes(&config, &inputs),
        compute.as_secs_f64(),
        flop / compute.as_secs_f64().max(1e-9) / 1e9,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes every rank's `y`.
fn write_outputs(
    dir: &Path,
    config: &Config,
    tokens: impl Iterator<Item = usize>,
    outputs: Vec<Vec<fp_formats::bf16>>,
) -> anyhow::Result<()> {
    for ((rank, y), tokens) in outputs.into_iter().enumerate().zip(tokens) {
        let output = Output {
            tokens,
            hidden: config.hidden,
            y,
        };
        files::write_output(&files::output_path(dir, rank), &output)?;
        info!(rank, tokens = output.tokens, "wrote y");
    }
    Ok(())
}

/// Valid (token, slot) pairs of all ranks.
fn routed_pairs(inputs: &[megamoe::RankInputs]) -> usize {
    inputs
        .iter()
        .map(|x| x.topk_idx.iter().filter(|&&e| e >= 0).count())
        .sum()
}

/// `y` shapes per rank, for the summary line.
fn y_shapes(config: &Config, inputs: &[megamoe::RankInputs]) -> String {
    let shapes: Vec<String> = inputs
        .iter()
        .map(|x| format!("[{}, {}]", x.tokens, config.hidden))
        .collect();
    shapes.join(" ")
}

fn run_dataflow(dir: &Path, options: EngineOptions) -> anyhow::Result<()> {
    let start = Instant::now();
    let problem = files::read_problem(dir)?;
    let (config, inputs) = (&problem.config, &problem.inputs);
    let t = Instant::now();
    let run = dataflow::forward(config, &problem.weights, inputs, options)?;
    let compute = t.elapsed();
    let s = run.schedule;
    write_outputs(dir, config, inputs.iter().map(|x| x.tokens), run.y)?;
    let pairs = routed_pairs(inputs);
    let flop = 2.0 * pairs as f64 * config.macs_per_pair() as f64;
    println!(
        "cpu-dataflow: y per rank {} (BF16), {pairs} routed pairs, {} ranks x ({} dispatch + {} GEMM threads), \
         BLOCK_M {}, {} local expert(s) per wave, compute {:.3}s ({:.1} GFLOP/s), total {:.3}s",
        y_shapes(config, inputs),
        config.num_ranks,
        options.dispatch_threads_per_rank,
        options.workers_per_rank,
        s.block_m,
        s.num_experts_per_wave,
        compute.as_secs_f64(),
        flop / compute.as_secs_f64().max(1e-9) / 1e9,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn run_cuda(
    dir: &Path,
    world: WorldKind,
    ranks_per_gpu: usize,
    routes: Routes,
) -> anyhow::Result<()> {
    let start = Instant::now();
    // Refused before any GPU work, on any machine.
    let config = files::read_config(dir)?;
    let recipe = config.recipe;
    if !routes.supports(recipe) {
        bail!(
            "--mma {routes} cannot run the {recipe} recipe of {}: the FP8 route promotes once per 128 \
             channels (g128 only); use --mma bf16",
            dir.display()
        );
    }
    if world == WorldKind::Process {
        if ProcessEnv::present() {
            return run_dir_rank(dir, &config, routes);
        }
        files::check_rank_files(dir, &config)?;
        launch_ranks(placement(config.num_ranks, ranks_per_gpu))?;
        println!(
            "cuda: {} rank process(es), unfused pipeline, {routes} tensor-core route, total {:.3}s (JIT, weight transform and upload included)",
            config.num_ranks,
            start.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let problem = files::read_problem(dir)?;
    let (config, inputs) = (&problem.config, &problem.inputs);
    let t = Instant::now();
    let run =
        megamoe::cuda::forward_timed(&problem, routes, placement(config.num_ranks, ranks_per_gpu))?;
    let compute = t.elapsed();
    let pairs = routed_pairs(inputs);
    let stages: Vec<String> = run
        .iter()
        .enumerate()
        .map(|(r, (_, times))| format!("rank {r}: {times}"))
        .collect();
    write_outputs(
        dir,
        config,
        inputs.iter().map(|x| x.tokens),
        run.into_iter().map(|(y, _)| y).collect(),
    )?;
    println!(
        "cuda: y per rank {} (BF16), {pairs} routed pairs, {} GPU(s), unfused pipeline, {routes} tensor-core route, first forward {:.3}s (JIT, weight transform and upload included), total {:.3}s\n{}",
        y_shapes(config, inputs),
        config.num_ranks,
        compute.as_secs_f64(),
        start.elapsed().as_secs_f64(),
        stages.join("\n")
    );
    Ok(())
}

/// This process's rank of a `--world process` run of the problem directory `dir`: reads only its
/// rank's weights and inputs, runs the forward with the other ranks and writes `y.rank{r}`.
fn run_dir_rank(dir: &Path, config: &Config, routes: Routes) -> anyhow::Result<()> {
    let rank = ProcessEnv::from_env()?.rank;
    let read = || -> anyhow::Result<_> {
        Ok((
            files::read_weights(dir, config, rank)?,
            files::read_inputs(dir, config, rank)?,
        ))
    };
    let (weights, inputs) = read().with_context(|| format!("rank {rank}"))?;
    let (y, times) = megamoe::cuda::run_process(|world| {
        megamoe::cuda::forward_rank(world, config, routes, &weights, &inputs)
    })?;
    let output = Output {
        tokens: inputs.tokens,
        hidden: config.hidden,
        y,
    };
    files::write_output(&files::output_path(dir, rank), &output)
        .with_context(|| format!("rank {rank}"))?;
    info!(rank, tokens = inputs.tokens, "wrote y");
    println!("rank {rank}: T = {}: {times}", inputs.tokens);
    Ok(())
}

fn placement(ranks: usize, ranks_per_gpu: usize) -> Placement {
    Placement {
        ranks,
        ranks_per_gpu,
    }
}

/// `--world process` without torchrun's variables: runs this command once per rank (each finds
/// them set and is its rank), then prints their logs and output in rank order.
fn launch_ranks(placement: Placement) -> anyhow::Result<()> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let exe = std::env::current_exe().context("cannot find this executable to launch the ranks")?;
    for output in megamoe::cuda::spawn_rank_processes(placement, &exe, &args)? {
        eprint!("{}", output.stderr);
        print!("{}", output.stdout);
    }
    Ok(())
}

fn plan(args: &PlanArgs) -> anyhow::Result<()> {
    let config = Config::preset(&args.preset)?
        .with_ranks(args.ranks)
        .with_recipe(args.recipe);
    config.validate()?;
    let u32_of = |name: &str, v: usize| {
        u32::try_from(v).with_context(|| format!("{name} = {v} does not fit in 32 bits"))
    };
    let plan = Plan::new(PlanConfig {
        num_sms: args.sms,
        act_scale_group: u32_of("act_scale_block", config.act_group())?,
        ..PlanConfig::new(
            u32_of("hidden", config.hidden)?,
            u32_of("intermediate", config.intermediate)?,
            u32_of("num_experts", config.num_experts)?,
            u32_of("top_k", config.top_k)?,
            u32_of("ranks", config.num_ranks)?,
            u32_of("tokens", args.tokens)?,
        )
    })?;
    let shape = megamoe::cuda::pipeline_shape(&config, args.tokens, args.mma)?;
    println!("{}: {plan}", args.preset);
    println!(
        "  {:<20} {:.3} GiB ({} pool rows, {} tensor-core route)",
        "buffer per rank",
        shape.peer_layout().bytes as f64 / f64::from(1 << 30),
        shape.pool_rows,
        args.mma
    );
    Ok(())
}

/// Pairs of output files to compare: the same y.rank{r} in two directories, or two files.
fn output_pairs(a: &Path, b: &Path) -> anyhow::Result<Vec<(String, PathBuf, PathBuf)>> {
    match (a.is_dir(), b.is_dir()) {
        (true, true) => {
            let ranks = files::output_ranks(a)?;
            if ranks.is_empty() || ranks != files::output_ranks(b)? {
                bail!(
                    "{} and {} do not hold the same non-empty set of y.rank*.safetensors",
                    a.display(),
                    b.display()
                );
            }
            Ok(ranks
                .into_iter()
                .map(|r| {
                    (
                        format!("rank {r}"),
                        files::output_path(a, r),
                        files::output_path(b, r),
                    )
                })
                .collect())
        }
        (false, false) => Ok(vec![("y".to_owned(), a.to_owned(), b.to_owned())]),
        _ => bail!("compare two y files or two directories, not a file with a directory"),
    }
}

fn check(a: &Path, b: &Path, tol: f64) -> anyhow::Result<()> {
    let (mut all_a, mut all_b) = (Vec::new(), Vec::new());
    let mut pass = true;
    for (label, pa, pb) in output_pairs(a, b)? {
        let (ya, yb) = (files::read_output(&pa)?, files::read_output(&pb)?);
        if (ya.tokens, ya.hidden) != (yb.tokens, yb.hidden) {
            bail!(
                "{label}: shapes differ: [{}, {}] vs [{}, {}]",
                ya.tokens,
                ya.hidden,
                yb.tokens,
                yb.hidden
            );
        }
        let fa: Vec<f32> = ya.y.iter().map(|v| v.to_f32()).collect();
        let fb: Vec<f32> = yb.y.iter().map(|v| v.to_f32()).collect();
        let c = Comparison::of(&fa, &fb);
        pass &= c.passes(tol);
        println!(
            "{label}: [{}, {}] calc_diff {:.3e}, max abs error {:.3e}",
            ya.tokens, ya.hidden, c.calc_diff, c.max_abs_error
        );
        all_a.extend(fa);
        all_b.extend(fb);
    }
    let c = Comparison::of(&all_a, &all_b);
    pass &= c.passes(tol);
    println!(
        "all: {} values, calc_diff {:.3e}, max abs error {:.3e}: {} (tol {tol:e})",
        c.len,
        c.calc_diff,
        c.max_abs_error,
        if pass { "PASS" } else { "FAIL" }
    );
    if !pass {
        std::process::exit(1);
    }
    Ok(())
}

fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    let mut config = Config::preset(&args.preset)?.with_ranks(args.ranks);
    if let Some(experts) = args.experts {
        config.num_experts = experts;
    }
    config.validate()?;
    let placement = placement(config.num_ranks, args.ranks_per_gpu);
    if args.world == WorldKind::Process && !ProcessEnv::present() {
        return launch_ranks(placement);
    }
    let opts = megamoe_bench::BenchOptions {
        config,
        placement,
        tokens: args.tokens.clone(),
        routes: args.routes.clone(),
        paths: args.path.clone(),
        reps: args.reps.max(1),
        warm_up_ms: args.warm_up_ms,
        chained_launches: !args.unchained_launches,
        timeline: args.timeline.clone(),
    };
    if let Some(dir) = &args.timeline {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("the timeline directory {}", dir.display()))?;
    }
    let bar = ProgressBar::new((args.tokens.len() * args.routes.len() * args.path.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} points {msg}").expect("template"),
    );
    // A hidden bar (stderr is no terminal, e.g. a rank process) prints nothing.
    let say = |line: String| {
        if bar.is_hidden() {
            println!("{line}");
        } else {
            bar.println(line);
        }
    };
    let header = || {
        if !args.json {
            say(format!(
                "{} on {} rank(s), {} per GPU{}: H {}, I {}, E {} ({} per rank), top-{}; median of {}{}{}",
                args.preset,
                config.num_ranks,
                args.ranks_per_gpu,
                match args.world {
                    WorldKind::Local => "",
                    WorldKind::Process => ", a process each",
                },
                config.hidden,
                config.intermediate,
                config.num_experts,
                config.experts_per_rank(),
                config.top_k,
                opts.reps,
                if opts.warm_up_ms == 0 {
                    ", each forward with its host I/O (burst clock)".to_owned()
                } else {
                    format!(
                        ", back to back without host I/O after {} ms of them (sustained clock)",
                        opts.warm_up_ms
                    )
                },
                if opts.chained_launches {
                    ""
                } else {
                    "; stage kernels unchained"
                }
            ));
            say(megamoe_bench::BenchRow::HEADER.to_owned());
        }
    };
    let show = |row: &megamoe_bench::BenchRow| {
        if !args.json {
            say(row.to_string());
        }
        bar.inc(1);
    };
    let rows = match args.world {
        WorldKind::Local => {
            header();
            Some(megamoe_bench::run(&opts, show)?)
        }
        // Rank 0 prints the table; the other ranks log their own times.
        WorldKind::Process => megamoe::cuda::run_process(|world| {
            let me = world.rank();
            if me == 0 {
                header();
                return Ok(Some(megamoe_bench::run_rank(world, &opts, show)?));
            }
            megamoe_bench::run_rank(world, &opts, |row| info!(rank = me, %row, "bench"))?;
            Ok(None)
        })?,
    };
    bar.finish_and_clear();
    if let Some(rows) = rows
        && args.json
    {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    Ok(())
}
