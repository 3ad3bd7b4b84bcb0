//! `cargo xtask kernels`: compile every registered kernel specialization for each of its targets and
//! print the ptxas resource report. Fails when a kernel does not compile, a `no_spill` kernel spills,
//! or any kernel gets a ptxas performance diagnostic (serialized wgmma, injected waits, ignored
//! setmaxnreg).
//! NVRTC only: no GPU needed.

use std::time::Instant;

use anyhow::{Result, bail};
use cuda_rt::{Arch, CompileOutcome, Compiled, Jit, KernelSpec};
use rayon::prelude::*;

/// ptxas messages that fail any kernel, a known register shortfall's too (it may spill a few bytes,
/// never serialize its wgmmas): wgmma serialized (C7511: too few registers for the wgmma pipeline;
/// C7512, C7514, C7515), a wgmma wait injected by the compiler (C7517), setmaxnreg ignored (C7508).
const PERF_DIAGNOSTICS: [&str; 6] = [
    "(C7511)", "(C7512)", "(C7514)", "(C7515)", "(C7517)", "(C7508)",
];

/// The kernel registry: every crate that ships kernels contributes its specializations here, one entry
/// per crate. A crate that depends on cuda-rt exports `pub fn kernels() -> Vec<KernelSpec>`; one that
/// only exports its CUDA sources as `(&str, &str)` constants gets its specs built here.
fn registry() -> Vec<KernelSpec> {
    let mut specs = cuda_rt::selftest::kernels();
    specs.push(
        KernelSpec::new("fp-formats/twin_test", fp_formats::TWIN_TEST_SOURCE)
            .header(fp_formats::CUDA_HEADER),
    );
    specs.push(
        KernelSpec::new("symm-mem/probe", symm_mem::PROBE_SOURCE).header(symm_mem::CUDA_HEADER),
    );
    specs.push(
        KernelSpec::new("moe-sched/probe", moe_sched::PROBE_SOURCE).header(moe_sched::CUDA_HEADER),
    );
    specs.extend(megamoe_kernel::kernels());
    specs.extend(barriers::kernels());
    // Add further crates here.
    specs
}

#[derive(clap::Args, Default)]
pub struct Args {
    /// Only this target (sm_90a or sm_100a).
    #[arg(long, value_parser = parse_arch)]
    arch: Option<Arch>,
    /// Only specs whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Compile everything afresh, ignoring and not filling the JIT cache.
    #[arg(long)]
    no_cache: bool,
}

fn parse_arch(name: &str) -> Result<Arch, String> {
    Arch::from_name(name).ok_or_else(|| format!("unknown target `{name}` (sm_90a or sm_100a)"))
}

pub fn run(args: &Args) -> Result<()> {
    let jit = Jit::new()?;
    let jit = if args.no_cache {
        jit.without_cache()
    } else {
        jit
    };
    let v = jit.nvrtc_version();
    println!(
        "NVRTC {}.{} from {}",
        v.major,
        v.minor,
        jit.toolkit().lib_dir().display()
    );

    let jobs: Vec<(KernelSpec, Arch)> = registry()
        .into_iter()
        .filter(|s| {
            args.filter
                .as_ref()
                .is_none_or(|f| s.name.contains(f.as_str()))
        })
        .flat_map(|s| {
            let arches = s.arches.clone();
            arches
                .into_iter()
                .filter(|a| args.arch.is_none_or(|only| only == *a))
                .map(move |a| (s.clone(), a))
        })
        .collect();
    if jobs.is_empty() {
        bail!("no kernel matches");
    }
    let start = Instant::now();
    let results: Vec<_> = jobs
        .par_iter()
        .map(|(spec, arch)| jit.compile(spec, *arch))
        .collect();

    let mut failures = Vec::new();
    let widths = [
        jobs.iter().map(|(s, _)| s.name.len()).max().unwrap_or(0),
        results
            .iter()
            .flatten()
            .flat_map(|c| c.resources.iter().map(|r| r.name.len()))
            .max()
            .unwrap_or(0)
            .max(5),
    ];
    println!(
        "{:<w0$} {:<w1$} {:<8} {:>5} {:>9} {:>9} {:>6} {:>7} {:>9}",
        "kernel",
        "entry",
        "arch",
        "regs",
        "spill st",
        "spill ld",
        "stack",
        "smem",
        "compile",
        w0 = widths[0],
        w1 = widths[1],
    );
    for ((spec, arch), result) in jobs.iter().zip(results) {
        match result {
            Ok(compiled) => {
                print_rows(spec, &compiled, widths);
                for r in compiled
                    .resources
                    .iter()
                    .filter(|r| spec.no_spill && r.spills())
                {
                    failures.push(format!(
                        "{} {} on {arch}: {} B spill stores, {} B spill loads in a no-spill kernel",
                        spec.name, r.name, r.spill_stores, r.spill_loads
                    ));
                }
                // ptxas' own performance diagnostics: serialized or stalled wgmma pipelines and an
                // ignored setmaxnreg cost a hot kernel more than a spill does.
                for line in compiled
                    .log
                    .lines()
                    .filter(|l| PERF_DIAGNOSTICS.iter().any(|d| l.contains(d)))
                {
                    failures.push(format!("{} on {arch}: {}", spec.name, line.trim()));
                }
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    println!("{} compiles in {:.2?}", jobs.len(), start.elapsed());
    if !failures.is_empty() {
        bail!(
            "{} kernel check(s) failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

/// One row per entry function; `widths` are the kernel and entry column widths.
fn print_rows(spec: &KernelSpec, compiled: &Compiled, [w0, w1]: [usize; 2]) {
    let time = match compiled.outcome {
        CompileOutcome::Compiled => format!("{:.0} ms", compiled.elapsed.as_secs_f64() * 1e3),
        CompileOutcome::Cached => "cached".to_owned(),
    };
    let mut rows: Vec<_> = compiled.resources.iter().collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    for r in rows {
        let flag = if spec.no_spill && r.spills() {
            "  <- SPILLS"
        } else {
            ""
        };
        println!(
            "{:<w0$} {:<w1$} {:<8} {:>5} {:>9} {:>9} {:>6} {:>7} {:>9}{flag}",
            spec.name,
            r.name,
            compiled.arch.name(),
            r.registers,
            r.spill_stores,
            r.spill_loads,
            r.stack_bytes,
            r.smem_bytes,
            time
        );
    }
}
