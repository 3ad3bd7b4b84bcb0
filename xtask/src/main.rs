//! `cargo xtask <command>`: the workspace's automation, in Rust (matklad's cargo-xtask pattern).
//!
//! | command | does |
//! |---|---|
//! | `setup-cuda` | ensures a CUDA toolchain (`scripts/cuda-toolchain.sh`) and prints its environment |
//! | `kernels` | compiles every registered kernel for sm_90a and sm_100a, prints the ptxas resource table, fails on a compile error or a spill in a `no_spill` kernel |
//! | `test-gpu` | on a machine with a GPU: the bundle's GPU tests through its `run.sh`, one process a test, counted as passed, failed and skipped |
//! | `test-multigpu` | the same on a machine with ≥ 2 GPUs, where a test that needs more GPUs than present fails instead of skipping; the multi-process tests (symm-mem's worlds, the cuda backend's `--world process`) launch their test binary once per rank |
//! | `sanitize` | on a machine with a GPU: every kernel family on tiny shapes under compute-sanitizer's memcheck, racecheck, synccheck and initcheck (the bundle's `sanitize.sh`) |
//! | `gpu-bundle` | builds the GPU test binaries in release into `.gpu-bundle/` with `run.sh` and `sanitize.sh` for a GPU machine without Rust |
//! | `ci` | the CI entry point: `setup-cuda`, `cargo test --workspace`, `kernels` |
//! | `demo` | the main job: generate a problem, run it on the CPU backend, check it against `scripts/check_reference.py`; with a GPU per rank, also the CUDA backend checked against the CPU and the grouped-GEMM benchmark |

mod bundle;
mod kernels;
mod sanitize;
mod toolchain;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "megamoe-rs workspace automation")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Ensure a CUDA toolchain (installing the pinned wheels into .cuda/ when none exists) and print
    /// `export` lines for it.
    SetupCuda,
    /// Compile every registered kernel specialization and print registers, spills, stack and smem.
    Kernels(kernels::Args),
    /// Run the GPU tests (the `#[ignore = "needs a CUDA GPU"]` ones) here, each in its own
    /// process, and count them as passed, failed and skipped; needs a GPU.
    TestGpu {
        /// Only tests whose `<suite>::<test>` name contains this.
        filter: Option<String>,
    },
    /// Run the GPU tests on a machine with at least `--gpus` GPUs (default 2); no multi-GPU test
    /// may skip. On a GPU machine without Rust: `MEGAMOE_REQUIRE_GPUS=2 .gpu-bundle/run.sh`.
    TestMultigpu {
        #[arg(long, default_value_t = 2)]
        gpus: usize,
        /// Only tests whose `<suite>::<test>` name contains this.
        filter: Option<String>,
    },
    /// Run every kernel family on tiny shapes under compute-sanitizer (memcheck, racecheck,
    /// synccheck, initcheck); fails on any report. On a GPU machine without Rust:
    /// `.gpu-bundle/sanitize.sh`.
    Sanitize {
        /// Only these tools (a substring of memcheck, racecheck, synccheck, initcheck).
        #[arg(long)]
        tool: Option<String>,
        /// Only runs whose `<suite>::<test>` name contains this.
        filter: Option<String>,
    },
    /// Build the GPU test binaries (release) into .gpu-bundle/ with run.sh, for a GPU machine.
    GpuBundle,
    /// Toolchain, `cargo test --workspace`, then `kernels`: what CI runs.
    Ci,
    /// The main job: `megamoe gen` a problem (default: the tiny preset on 2 ranks), `megamoe run` it
    /// on the CPU backend and check it with the independent Python implementation of the contract;
    /// on a machine with a GPU per rank, also `megamoe run --backend cuda` checked against the CPU's
    /// y, and the grouped-GEMM benchmark.
    Demo {
        #[arg(long, default_value = "tiny")]
        preset: String,
        #[arg(long, default_value_t = 2)]
        ranks: usize,
        #[arg(long, default_value_t = 64)]
        tokens: usize,
        #[arg(long, default_value = "mx32")]
        recipe: String,
        /// Where the problem directory goes.
        #[arg(long, default_value = "target/demo")]
        dir: PathBuf,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let root = workspace_root();
    match Cli::parse().command {
        Cmd::SetupCuda => run(&mut Command::new(root.join(toolchain::SCRIPT))),
        Cmd::Kernels(args) => kernels::run(&args),
        Cmd::TestGpu { filter } => test_gpu(&root, filter.as_deref(), None),
        Cmd::TestMultigpu { gpus, filter } => test_gpu(&root, filter.as_deref(), Some(gpus)),
        Cmd::Sanitize { tool, filter } => {
            gpus_here()?;
            let env = toolchain::ensure(&root)?;
            let bundle = bundle::build(&root)?;
            run(Command::new(bundle.join("sanitize.sh"))
                .arg(tool.unwrap_or_default())
                .arg(filter.unwrap_or_default())
                .envs(env))
        }
        Cmd::GpuBundle => bundle::build(&root).map(drop),
        Cmd::Demo {
            preset,
            ranks,
            tokens,
            recipe,
            dir,
        } => demo(&root, &preset, ranks, tokens, &recipe, &dir),
        Cmd::Ci => {
            let env = toolchain::ensure(&root)?;
            run(cargo(&root).args(["test", "--workspace"]).envs(env))?;
            kernels::run(&kernels::Args::default())
        }
    }
}

fn demo(
    root: &Path,
    preset: &str,
    ranks: usize,
    tokens: usize,
    recipe: &str,
    dir: &Path,
) -> Result<()> {
    let dir = root.join(dir);
    let megamoe = |args: &[&str]| -> Result<()> {
        run(cargo(root)
            .args(["run", "--quiet", "--release", "-p", "megamoe-cli", "--"])
            .args(args))
    };
    let dir_str = dir.to_string_lossy().into_owned();
    megamoe(&[
        "gen",
        &dir_str,
        "--preset",
        preset,
        "--ranks",
        &ranks.to_string(),
        "--tokens",
        &tokens.to_string(),
        "--recipe",
        recipe,
        "--mask-fraction",
        "0.1",
    ])?;
    megamoe(&["run", &dir_str, "--backend", "cpu"])?;
    // An independent implementation of the contract (numpy + ml_dtypes) must agree.
    let python = python_env(root)?;
    run(Command::new(python)
        .arg(root.join("scripts/check_reference.py"))
        .arg(&dir)
        .args(["--tol", "1e-5"]))?;
    match cuda_rt::Gpu::list() {
        Ok(gpus) if gpus.len() >= ranks => {
            // The same problem on the GPUs (the unfused pipeline), checked against the CPU's y.
            let gpu_dir = dir.with_extension("cuda");
            if gpu_dir.exists() {
                std::fs::remove_dir_all(&gpu_dir)?;
            }
            std::fs::create_dir_all(&gpu_dir)?;
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                let name = path.file_name().context("file name")?.to_owned();
                if !name.to_string_lossy().starts_with("y.") {
                    std::fs::copy(&path, gpu_dir.join(name))?;
                }
            }
            let gpu_str = gpu_dir.to_string_lossy().into_owned();
            let env = toolchain::ensure(root)?;
            run(cargo(root)
                .args(["run", "--quiet", "--release", "-p", "megamoe-cli", "--"])
                .args(["run", &gpu_str, "--backend", "cuda"])
                .envs(env.clone()))?;
            megamoe(&["check", &dir_str, &gpu_str, "--tol", "1e-5"])?;
            eprintln!("{} GPU(s): the grouped-GEMM benchmark", gpus.len());
            run(cargo(root)
                .args(["bench", "--package", "megamoe-kernel", "--bench", "gemm"])
                .envs(env))
        }
        Ok(gpus) => {
            eprintln!(
                "{} GPU(s) for {ranks} ranks: the CPU backend ran; `--ranks {}` runs the GPU path here",
                gpus.len(),
                gpus.len()
            );
            Ok(())
        }
        Err(e) => {
            eprintln!("no GPU here ({e}): the CPU backend ran; the GPU path needs a CUDA GPU");
            Ok(())
        }
    }
}

/// A Python with numpy and ml_dtypes for the independent checks: `.venv-py/` in the checkout,
/// created on first use.
fn python_env(root: &Path) -> Result<PathBuf> {
    let venv = root.join(".venv-py");
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import numpy, ml_dtypes"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        eprintln!("installing numpy and ml_dtypes into {}", venv.display());
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "numpy", "ml_dtypes"]))?;
    }
    Ok(python)
}

/// The ignored (GPU) tests through the bundle's run.sh (each test its own process; SKIP counted
/// apart from PASS); with `require_gpus`, the machine must have that many GPUs and the tests are
/// told so (`cuda_rt::testing::REQUIRE_GPUS_ENV`), so none of them can pass by skipping.
fn test_gpu(root: &Path, filter: Option<&str>, require_gpus: Option<usize>) -> Result<()> {
    let devices = gpus_here()?;
    if let Some(needed) = require_gpus
        && devices < needed
    {
        bail!("the multi-GPU tests need {needed} GPUs, this machine has {devices}");
    }
    let mut env = toolchain::ensure(root)?;
    if let Some(needed) = require_gpus {
        env.push((
            cuda_rt::testing::REQUIRE_GPUS_ENV.into(),
            needed.to_string(),
        ));
    }
    let bundle = bundle::build(root)?;
    run(Command::new(bundle.join("run.sh"))
        .arg(filter.unwrap_or_default())
        .envs(env))
}

/// The GPUs of this machine, listed; an error that says where the GPU runs go when there is none.
fn gpus_here() -> Result<usize> {
    let devices = cuda_rt::Gpu::list().map_err(|e| {
        anyhow::anyhow!(
            "{e}\nthe GPU runs need a GPU: on a machine without one, build a bundle with \
             `cargo xtask gpu-bundle` and run .gpu-bundle/run.sh (tests) or \
             .gpu-bundle/sanitize.sh where the GPU is"
        )
    })?;
    for d in &devices {
        eprintln!(
            "GPU {}: {} (sm_{}{}, {} SMs)",
            d.ordinal, d.name, d.compute_capability.0, d.compute_capability.1, d.sm_count
        );
    }
    Ok(devices.len())
}

/// The workspace root: xtask's manifest dir is `<root>/xtask`.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The cargo that runs us (`$CARGO`), in the workspace root.
fn cargo(root: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root);
    cmd
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{:?} failed: {status}", cmd.get_program());
    }
    Ok(())
}
