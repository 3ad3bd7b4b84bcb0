//! The unfused CUDA pipeline (megamoe::cuda, one launch per stage with host synchronization between
//! stages) on one GPU, V4-Pro per-rank shape: 48 local experts, H 7168, I 3072, top-6, 1 rank,
//! random MXFP4 weights (`ExpertWeights::random_codes`) and random routing from the generator.
//! Per recipe and T: median time of the forward with the host's upload of the inputs and download
//! of y, and without them (route + dispatch + L1 + SwiGLU + L2 + combine), TFLOPS = 2·pairs·H·3I
//! over the latter, and each stage's share of the mean.
//!
//! `cargo bench -p megamoe --bench pipeline -- [--tokens 8,128,8192] [--recipes g128,mx32] [--reps 10]`

use std::time::Duration;

use megamoe::cuda::{CudaRank, StageTimes, run_local};
use megamoe::generate::{self, GenOptions};
use megamoe::{Config, RankWeights, Recipe};
use megamoe_kernel::problem::ExpertWeights;

/// Benchmark arguments; lists are comma-separated.
#[derive(clap::Parser)]
struct Args {
    #[arg(long, value_delimiter = ',', default_value = "8,128,8192")]
    tokens: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "g128,mx32")]
    recipes: Vec<Recipe>,
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let Args {
        tokens,
        recipes,
        reps,
        ..
    } = clap::Parser::parse();
    let max_tokens = tokens.iter().copied().max().unwrap_or(0);
    match cuda_rt::Gpu::count() {
        Ok(n) if n >= 1 => {}
        other => {
            eprintln!("SKIP: needs a CUDA GPU ({other:?})");
            return;
        }
    }
    let base = Config {
        num_experts: 48,
        ..Config::deepseek_v4_pro()
    };
    let (h, i, el) = (base.hidden, base.intermediate, base.num_experts);
    let w1 = ExpertWeights::random_codes(el, 2 * i, h, 1);
    let w2 = ExpertWeights::random_codes(el, h, i, 2);
    let weights = RankWeights {
        w1: w1.w,
        w1_sf: w1.w_sf,
        w2: w2.w,
        w2_sf: w2.w_sf,
    };
    println!(
        "unfused pipeline, V4-Pro per-rank shape: E_l {el}, H {h}, I {i}, k {}, 1 GPU; median of {reps}",
        base.top_k
    );
    for recipe in recipes {
        let config = base.with_recipe(recipe);
        let inputs: Vec<_> = tokens
            .iter()
            .map(|&t| {
                generate::rank_inputs(
                    &GenOptions {
                        config,
                        tokens: t,
                        seed: 7 + t as u64,
                        mask_fraction: 0.0,
                    },
                    0,
                )
            })
            .collect();
        let results = run_local(1, |world| {
            let mut rank = CudaRank::new(world, &config, max_tokens, &weights)?;
            let mut out = Vec::new();
            for x in &inputs {
                rank.forward(x)?; // warm-up: JIT of the GEMM tile, first touch
                let mut runs: Vec<StageTimes> = Vec::new();
                for _ in 0..reps {
                    runs.push(rank.forward(x)?.1);
                }
                out.push(runs);
            }
            Ok(out)
        })
        .unwrap_or_else(|e| panic!("{recipe}: {e:?}"));
        for (x, runs) in inputs.iter().zip(&results[0]) {
            let pairs = x.topk_idx.iter().filter(|&&e| e >= 0).count();
            let median_of = |f: fn(&StageTimes) -> Duration| {
                let mut v: Vec<Duration> = runs.iter().map(f).collect();
                v.sort();
                v[v.len() / 2]
            };
            let (median, device) = (median_of(StageTimes::total), median_of(StageTimes::device));
            let flop = 2.0 * pairs as f64 * (h * 3 * i) as f64;
            let mean_total: f64 = runs.iter().map(|r| r.total().as_secs_f64()).sum();
            let shares: Vec<String> = (0..runs[0].stages().len())
                .map(|s| {
                    let name = runs[0].stages()[s].0;
                    let sum: f64 = runs.iter().map(|r| r.stages()[s].1.as_secs_f64()).sum();
                    format!("{name} {:.0}%", 100.0 * sum / mean_total.max(1e-12))
                })
                .collect();
            println!(
                "{recipe} T={:>5}: {:>9.1} us with host I/O, {:>9.1} us on the device side ({:>6.1} TFLOPS)  ({} pairs)  {}",
                x.tokens,
                median.as_secs_f64() * 1e6,
                device.as_secs_f64() * 1e6,
                flop / device.as_secs_f64() / 1e12,
                pairs,
                shares.join(", ")
            );
        }
    }
}
