//! The CUDA backend (unfused pipeline) on 1 and 2 local GPUs against the CPU reference: every
//! route (g128 and mx32 through the exact BF16 tensor-core route, g128 through FP8), the tiny
//! preset and the per-rank shapes of DeepSeek-V4-Flash / -Pro with few experts, T ∈ {0, 1, 7, 128},
//! masked slots, all-masked tokens, skewed routing, a rank without tokens, and the same pipeline
//! reused for several forwards (outputs poisoned before each). The exact route is accepted at the
//! contract's calc_diff ≤ 1e-5 (DESIGN §1), the FP8 route at its documented bound, with every
//! element written and no NaN; the number of BF16 values that differ from the reference is printed
//! (on the BF16 route only FP32 summation order separates it from the f64 reference: 0 on tiny,
//! a few per thousand on V4 shapes).

use megamoe::check::calc_diff;
use megamoe::cuda::{CudaRank, run_local};
use megamoe::generate::{self, GenOptions};
use megamoe::{Config, Problem, RankInputs, Recipe, reference};
use megamoe_kernel::Mma;

/// The contract's acceptance (DESIGN §1), for the exact BF16 route.
const TOL: f64 = 1e-5;
/// The FP8 route's bound: Hopper's FP8 tensor core accumulates with ~14 bits inside each wgmma, and
/// SwiGLU's re-quantization turns the GEMM's 5e-7 into 1–3e-5 on V4 shapes (H200, 2026-11-30).
const FP8_TOL: f64 = 5e-5;

/// Every (recipe, route) of the pipeline.
const ROUTES: [(Recipe, Mma); 3] = [
    (Recipe::Mx32, Mma::Bf16),
    (Recipe::G128, Mma::Bf16),
    (Recipe::G128, Mma::Fp8),
];

/// The first `t` tokens of `inputs`.
fn truncate(inputs: &RankInputs, config: &Config, t: usize) -> RankInputs {
    let (h, g, k) = (config.hidden, config.act_group(), config.top_k);
    RankInputs {
        tokens: t,
        x: inputs.x[..t * h].to_vec(),
        x_sf: inputs.x_sf[..t * h / g].to_vec(),
        topk_idx: inputs.topk_idx[..t * k].to_vec(),
        topk_weights: inputs.topk_weights[..t * k].to_vec(),
    }
}

/// The tokens `picked` of `inputs`, in that order.
fn select(inputs: &RankInputs, config: &Config, picked: &[usize]) -> RankInputs {
    let (h, g, k) = (config.hidden, config.act_group(), config.top_k);
    let rows = |v: &[u8], w: usize| {
        picked
            .iter()
            .flat_map(|&t| v[t * w..][..w].to_vec())
            .collect()
    };
    RankInputs {
        tokens: picked.len(),
        x: rows(&inputs.x, h),
        x_sf: rows(&inputs.x_sf, h / g),
        topk_idx: picked
            .iter()
            .flat_map(|&t| inputs.topk_idx[t * k..][..k].to_vec())
            .collect(),
        topk_weights: picked
            .iter()
            .flat_map(|&t| inputs.topk_weights[t * k..][..k].to_vec())
            .collect(),
    }
}

fn problem(config: Config, tokens: usize, seed: u64, mask: f64) -> Problem {
    generate::problem(&GenOptions {
        config,
        tokens,
        seed,
        mask_fraction: mask,
    })
}

/// Routes most slots of most tokens to experts of the last rank (expert E−1−j for slot j), and
/// masks every slot of token 3.
fn skew(problem: &mut Problem) {
    let (k, e) = (problem.config.top_k, problem.config.num_experts);
    for x in &mut problem.inputs {
        for t in 0..x.tokens {
            for j in 0..k {
                let slot = &mut x.topk_idx[t * k + j];
                if t == 3 {
                    *slot = -1;
                } else if t % 5 != 0 && *slot >= 0 {
                    *slot = (e - 1 - j % e) as i64;
                }
            }
        }
    }
}

/// y of every rank checked against the reference.
fn compare(
    what: &str,
    mma: Mma,
    config: &Config,
    inputs: &[RankInputs],
    got: &[Vec<fp_formats::bf16>],
    want: &[Vec<fp_formats::bf16>],
) {
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.len(),
            inputs[r].tokens * config.hidden,
            "{what}: rank {r}: y has {} values, T×H = {}",
            g.len(),
            inputs[r].tokens * config.hidden
        );
        let nan = g.iter().position(|v| v.is_nan());
        assert!(
            nan.is_none(),
            "{what}: rank {r}: y[{}][{}] is NaN (unwritten: the output was poisoned with 0xffff) — {} NaN values",
            nan.unwrap_or(0) / config.hidden,
            nan.unwrap_or(0) % config.hidden,
            g.iter().filter(|v| v.is_nan()).count()
        );
        let gf: Vec<f32> = g.iter().map(|v| v.to_f32()).collect();
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let diff = calc_diff(&gf, &wf);
        let differ = g
            .iter()
            .zip(w)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let first = g
            .iter()
            .zip(w)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        eprintln!(
            "{what}: rank {r}: T = {}, calc_diff {diff:.3e}, {differ} of {} BF16 values differ{}",
            inputs[r].tokens,
            g.len(),
            first.map_or(String::new(), |i| format!(
                " (first at token {} channel {}: got {} want {})",
                i / config.hidden,
                i % config.hidden,
                g[i],
                w[i]
            ))
        );
        let tol = if mma == Mma::Fp8 { FP8_TOL } else { TOL };
        assert!(
            diff <= tol,
            "{what}: rank {r}: calc_diff {diff:.3e} > {tol:e} ({differ} values differ)"
        );
    }
}

/// Builds one pipeline per rank for `problem` (T_max = its largest T) and runs, on the same
/// pipelines, a forward of the first `t` tokens of every rank for each `t` in `token_counts`
/// (clamped to each rank's T), checking each against the reference.
fn run_sweep(what: &str, problem: &Problem, mma: Mma, token_counts: &[usize]) {
    let config = &problem.config;
    let max_tokens = problem.inputs.iter().map(|x| x.tokens).max().unwrap_or(0);
    let cases: Vec<Vec<RankInputs>> = token_counts
        .iter()
        .map(|&t| {
            problem
                .inputs
                .iter()
                .map(|x| truncate(x, config, t.min(x.tokens)))
                .collect()
        })
        .collect();
    let wants: Vec<Vec<Vec<fp_formats::bf16>>> = cases
        .iter()
        .map(|inputs| reference::forward(config, &problem.weights, inputs).expect("reference"))
        .collect();
    let got = run_local(config.num_ranks, |world| {
        let r = world.rank();
        let mut rank = CudaRank::new(world, config, max_tokens, mma, &problem.weights[r])?;
        let mut ys = Vec::new();
        for inputs in &cases {
            rank.poison()?;
            world.barrier()?;
            let (y, times) = rank.forward(&inputs[r])?;
            eprintln!(
                "{what}: rank {r}: T = {}: {:.3} ms ({:?})",
                inputs[r].tokens,
                times.total().as_secs_f64() * 1e3,
                times
            );
            ys.push(y);
        }
        Ok(ys)
    })
    .unwrap_or_else(|e| panic!("{what}: the cuda backend failed: {e:?}"));
    for (c, (inputs, want)) in cases.iter().zip(&wants).enumerate() {
        let got: Vec<Vec<fp_formats::bf16>> = got.iter().map(|ys| ys[c].clone()).collect();
        compare(
            &format!(
                "{what}, T = {:?}",
                inputs.iter().map(|x| x.tokens).collect::<Vec<_>>()
            ),
            mma,
            config,
            inputs,
            &got,
            want,
        );
    }
}

/// One forward of every rank's `t` first tokens at a T where the reference of every token would
/// take minutes: every output must be written, and every `stride`-th token (and the last) is checked
/// against the reference of those tokens alone — each token's y depends only on its own routes, so
/// that is the same as the full reference restricted to them.
fn run_sampled(what: &str, problem: &Problem, mma: Mma, t: usize, stride: usize) {
    let config = &problem.config;
    let inputs: Vec<RankInputs> = problem
        .inputs
        .iter()
        .map(|x| truncate(x, config, t.min(x.tokens)))
        .collect();
    let got = run_local(config.num_ranks, |world| {
        let r = world.rank();
        let mut rank = CudaRank::new(world, config, t, mma, &problem.weights[r])?;
        rank.poison()?;
        world.barrier()?;
        let (y, times) = rank.forward(&inputs[r])?;
        eprintln!("{what}: rank {r}: T = {}: {times:?}", inputs[r].tokens);
        Ok(y)
    })
    .unwrap_or_else(|e| panic!("{what}: the cuda backend failed: {e:?}"));
    let picked: Vec<Vec<usize>> = inputs
        .iter()
        .map(|x| {
            let mut p: Vec<usize> = (0..x.tokens).step_by(stride).collect();
            if x.tokens > 0 && p.last() != Some(&(x.tokens - 1)) {
                p.push(x.tokens - 1);
            }
            p
        })
        .collect();
    let sub_inputs: Vec<RankInputs> = inputs
        .iter()
        .zip(&picked)
        .map(|(x, p)| select(x, config, p))
        .collect();
    let want = reference::forward(config, &problem.weights, &sub_inputs).expect("reference");
    let h = config.hidden;
    let sub_got: Vec<Vec<fp_formats::bf16>> = got
        .iter()
        .zip(&picked)
        .enumerate()
        .map(|(r, (y, p))| {
            assert_eq!(y.len(), inputs[r].tokens * h, "{what}: rank {r}: y length");
            let unwritten = y.iter().filter(|v| v.is_nan()).count();
            assert_eq!(
                unwritten, 0,
                "{what}: rank {r}: {unwritten} outputs NaN or unwritten"
            );
            p.iter().flat_map(|&t| y[t * h..][..h].to_vec()).collect()
        })
        .collect();
    compare(
        &format!("{what}, T = {t}, every {stride}th token checked"),
        mma,
        config,
        &sub_inputs,
        &sub_got,
        &want,
    );
}

fn v4_flash_shape(experts: usize) -> Config {
    Config {
        num_experts: experts,
        ..Config::deepseek_v4_flash()
    }
}

fn v4_pro_shape(experts: usize) -> Config {
    Config {
        num_experts: experts,
        ..Config::deepseek_v4_pro()
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_one_gpu_token_sweep_every_route() {
    for (recipe, mma) in ROUTES {
        let config = Config::tiny().with_recipe(recipe);
        let p = problem(config, 128, 11, 0.25);
        run_sweep(
            &format!("tiny {recipe}/{mma} R=1"),
            &p,
            mma,
            &[128, 7, 1, 0, 128],
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_one_gpu_clamp_skew_and_masked_tokens() {
    for (recipe, mma) in ROUTES {
        let config = Config::tiny().with_recipe(recipe).with_clamp(Some(0.5));
        let mut p = problem(config, 128, 12, 0.1);
        skew(&mut p);
        run_sweep(
            &format!("tiny skewed clamp 0.5 {recipe}/{mma} R=1"),
            &p,
            mma,
            &[128, 7],
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn v4_flash_shape_one_gpu() {
    for (recipe, mma) in ROUTES {
        let p = problem(v4_flash_shape(16).with_recipe(recipe), 7, 13, 0.2);
        run_sweep(
            &format!("v4-flash shape (16 experts) {recipe}/{mma} R=1"),
            &p,
            mma,
            &[7, 1],
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn v4_pro_shape_one_gpu() {
    for (recipe, mma) in ROUTES {
        let p = problem(v4_pro_shape(8).with_recipe(recipe), 7, 14, 0.1);
        run_sweep(
            &format!("v4-pro shape (8 experts) {recipe}/{mma} R=1"),
            &p,
            mma,
            &[7, 1],
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn large_t_every_preset_shape_one_and_two_gpus() {
    let two = cuda_rt::testing::gpus_or_skip(2);
    for recipe in [Recipe::Mx32, Recipe::G128] {
        for ranks in [1, 2].into_iter().filter(|&r| r == 1 || two) {
            for (name, config) in [
                ("tiny", Config::tiny()),
                ("v4-flash shape (16 experts)", v4_flash_shape(16)),
                ("v4-pro shape (8 experts)", v4_pro_shape(8)),
            ] {
                let p = problem(config.with_recipe(recipe).with_ranks(ranks), 8192, 41, 0.05);
                for mma in ROUTES.iter().filter(|r| r.0 == recipe).map(|r| r.1) {
                    for (t, stride) in [(1000, 37), (8192, 331)] {
                        let what = format!("{name} {recipe}/{mma} R={ranks}");
                        run_sampled(&what, &p, mma, t, stride);
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_two_gpus_token_sweep_every_route() {
    if !cuda_rt::testing::gpus_or_skip(2) {
        return;
    }
    for (recipe, mma) in ROUTES {
        let config = Config::tiny().with_recipe(recipe).with_ranks(2);
        let p = problem(config, 128, 21, 0.25);
        run_sweep(
            &format!("tiny {recipe}/{mma} R=2"),
            &p,
            mma,
            &[128, 7, 1, 0],
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_gpus_skew_and_a_rank_without_tokens() {
    if !cuda_rt::testing::gpus_or_skip(2) {
        return;
    }
    for (recipe, mma) in ROUTES {
        let config = Config::tiny()
            .with_recipe(recipe)
            .with_ranks(2)
            .with_clamp(Some(1.0));
        let mut p = problem(config, 128, 22, 0.1);
        skew(&mut p);
        run_sweep(
            &format!("tiny skewed {recipe}/{mma} R=2"),
            &p,
            mma,
            &[128, 7],
        );
        // Rank 0 without tokens: it only serves rank 1's tokens.
        let mut p = problem(config, 64, 23, 0.1);
        p.inputs[0] = truncate(&p.inputs[0], &config, 0);
        run_sweep(
            &format!("tiny rank 0 empty {recipe}/{mma} R=2"),
            &p,
            mma,
            &[64],
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn v4_pro_shape_two_gpus() {
    if !cuda_rt::testing::gpus_or_skip(2) {
        return;
    }
    for (recipe, mma) in ROUTES {
        let p = problem(
            v4_pro_shape(8).with_recipe(recipe).with_ranks(2),
            7,
            24,
            0.1,
        );
        run_sweep(
            &format!("v4-pro shape (8 experts) {recipe}/{mma} R=2"),
            &p,
            mma,
            &[7, 1],
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn capacity_overflow_and_token_overflow_are_refused() {
    let config = Config::tiny().with_recipe(Recipe::G128);
    let p = problem(config, 32, 31, 0.0);
    let errs = run_local(1, |world| {
        let mut shape = megamoe::cuda::pipeline_shape(&p.config, 32, Mma::Fp8)?;
        shape.pool_rows = 16; // 64 routed pairs cannot fit
        let mut rank = CudaRank::with_shape(world, &p.config, shape, &p.weights[0])?;
        let capacity = rank
            .forward(&p.inputs[0])
            .expect_err("16 pool rows are too few");
        let mut rank = CudaRank::new(world, &p.config, 8, Mma::Fp8, &p.weights[0])?;
        let tokens = rank.forward(&p.inputs[0]).expect_err("32 tokens > T_max 8");
        Ok((capacity.to_string(), tokens.to_string()))
    })
    .expect("the refusals are errors of forward, not of the world");
    let (capacity, tokens) = &errs[0];
    eprintln!("capacity: {capacity}\ntokens: {tokens}");
    assert!(capacity.contains("pool capacity"), "{capacity}");
    assert!(tokens.contains("32 tokens"), "{tokens}");
}
