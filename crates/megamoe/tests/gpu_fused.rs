//! The fused forward (`ForwardPath::Fused`: one persistent launch per forward, the plan made on the
//! device) on one GPU: bit for bit the unfused forward of the same inputs with the same GEMM tile,
//! and within the contract's bound of the CPU reference, on every route — the tiny preset and the
//! per-rank shapes of DeepSeek-V4-Flash / -Pro, T ∈ {0, 1, 7, 128, 376, 1000, 2048, 8192}, masked slots,
//! skewed routing, a rank without tokens, R = 1 and R = 2, 4, 8 ranks sharing the GPU. Every
//! forward writes into poisoned outputs; calls of different T share one pipeline, and a forward run
//! again from the inputs on the device (A, B, A) gives A's bits.

use fp_formats::bf16;
use megamoe::cuda::{CudaError, CudaRank, ForwardPath, Placement, run_local};
use megamoe::{Config, Problem, RankInputs, Recipe};
use megamoe_kernel::{Mma, Routes};
use megamoe_problems::check::calc_diff;
use megamoe_problems::reference;
use std::sync::Arc;
use symm_mem::World;

mod common;
use common::{ROUTES, rank_for, tol};
use megamoe_problems::testing::{generated_problem, skew};

fn differing(a: &[bf16], b: &[bf16]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// One rank's part: one pipeline for the problem's largest T; per case the unfused forward, then
/// the fused forward with the unfused forward's tile (bitwise equal), then the fused forward run
/// again from the inputs on the device (the same bits), each into poisoned outputs. Returns the
/// fused y per case.
fn fused_rank(
    what: &str,
    world: &Arc<World>,
    problem: &Problem,
    routes: Routes,
    cases: &[Vec<RankInputs>],
) -> Result<Vec<Vec<bf16>>, CudaError> {
    let r = world.rank();
    let mut rank = rank_for(world, problem, routes)?;
    // Every kernel compiled before the first collective launch: a rank compiling a tile its
    // peers do not need would keep them waiting at the device meeting past its timeout.
    rank.warm_up()?;
    rank.warm_up_fused()?;
    world.barrier()?;
    let mut ys = Vec::new();
    for inputs in cases {
        let t = inputs[r].tokens;
        rank.set_path(ForwardPath::Unfused);
        rank.poison()?;
        world.barrier()?;
        let (unfused, _) = rank.forward(&inputs[r])?;
        let tile = rank.pipeline().tokens_per_tile();
        rank.set_path(ForwardPath::Fused);
        rank.set_fused_tile(Some(tile));
        rank.poison()?;
        world.barrier()?;
        let (fused, times) = rank.forward(&inputs[r])?;
        eprintln!(
            "{what}: rank {r}: T = {t}, tile {tile}, grid {:?} on {} SMs: fused span {:.1} us, wall {:.1} us, stages {:?}",
            rank.pipeline().fused_grid(tile),
            rank.gpu().info().sm_count,
            times.span.as_secs_f64() * 1e6,
            times.wall.as_secs_f64() * 1e6,
            rank.pipeline().fused_stage_times(rank.gpu())?
        );
        let nan = fused.iter().filter(|v| v.is_nan()).count();
        assert_eq!(
            nan, 0,
            "{what}: rank {r}: T = {t}: {nan} fused outputs unwritten (poisoned) or NaN"
        );
        let differ = differing(&fused, &unfused);
        assert_eq!(
            differ,
            0,
            "{what}: rank {r}: T = {t}: {differ} of {} values of the fused y differ from the unfused y",
            fused.len()
        );
        rank.poison()?;
        world.barrier()?;
        rank.rerun()?;
        let again = rank.y()?;
        assert_eq!(
            differing(&again, &fused),
            0,
            "{what}: rank {r}: T = {t}: the fused forward run again differs"
        );
        ys.push(fused);
    }
    rank.set_fused_tile(None);
    Ok(ys)
}

/// The fused and unfused forwards of the first `t` tokens of every rank for each `t` in
/// `token_counts`, ranks placed as `placement` says, on one pipeline per rank; the fused y checked
/// against the reference unless `check_reference` is false (large T).
fn run_cases(
    what: &str,
    problem: &Problem,
    routes: Routes,
    token_counts: &[usize],
    placement: Placement,
    check_reference: bool,
) {
    let config = &problem.config;
    let cases: Vec<Vec<RankInputs>> = token_counts
        .iter()
        .map(|&t| problem.inputs.iter().map(|x| x.first(config, t)).collect())
        .collect();
    let got = run_local(placement, |world| {
        fused_rank(what, world, problem, routes, &cases)
    })
    .unwrap_or_else(|e| panic!("{what}: the fused forward failed: {e:?}"));
    if !check_reference {
        return;
    }
    for (c, inputs) in cases.iter().enumerate() {
        let want = reference::forward(config, &problem.weights, inputs).expect("reference");
        for (r, ys) in got.iter().enumerate() {
            let g: Vec<f32> = ys[c].iter().map(|v| v.to_f32()).collect();
            let w: Vec<f32> = want[r].iter().map(|v| v.to_f32()).collect();
            let diff = calc_diff(&g, &w);
            eprintln!(
                "{what}: rank {r}: T = {}: calc_diff {diff:.3e} against the reference",
                inputs[r].tokens
            );
            assert!(
                diff <= tol(routes),
                "{what}: rank {r}: T = {}: calc_diff {diff:.3e} > {:e}",
                inputs[r].tokens,
                tol(routes)
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_equals_unfused_tiny_every_route() {
    for (recipe, routes) in ROUTES {
        let config = Config::tiny().with_recipe(recipe);
        let p = generated_problem(config, 1000, 91, 0.25);
        let what = format!("tiny {recipe}/{routes} fused");
        run_cases(
            &what,
            &p,
            routes,
            &[1000, 128, 7, 1, 0, 128],
            Placement::one_gpu(1),
            true,
        );
        let mut p = generated_problem(config.with_clamp(Some(1.0)), 256, 92, 0.1);
        skew(&mut p);
        let what = format!("tiny skewed clamped {recipe}/{routes} fused");
        run_cases(&what, &p, routes, &[256, 7], Placement::one_gpu(1), true);
    }
}

/// The sanitizer's cases (xtask/src/sanitize.rs): small forwards of each recipe, checked, on
/// `ranks` ranks sharing GPU 0 (compute-sanitizer runs both ranks' kernels at once, as their
/// device meetings need): 24 tokens (two-CTA tiles) and 256 (64 rows an expert at R = 1: the
/// 96-token one-CTA twin units, whose two tiles the SwiGLU epilogue takes through two hand-off
/// boxes).
fn tiny_one_forward(ranks: usize) {
    for (recipe, routes) in [
        (Recipe::Mx32, Routes::EXACT),
        (Recipe::G128, Routes::both(Mma::Fp8)),
    ] {
        let config = Config::tiny().with_recipe(recipe).with_ranks(ranks);
        let p = generated_problem(config, 256, 93, 0.1);
        let what = format!("tiny {recipe}/{routes} R={ranks} fused, sanitizer case");
        run_cases(
            &what,
            &p,
            routes,
            &[256, 24],
            Placement::one_gpu(ranks),
            true,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_tiny_one_forward() {
    tiny_one_forward(1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_tiny_one_forward_two_ranks() {
    tiny_one_forward(2);
}

/// The sanitizer's case of the one-CTA kernels' whole-token dispatch (bulk stores from shared
/// memory): 2048 tokens of the tiny preset (512 rows an expert), enough for every warp of the grid
/// to take whole tokens on both pools (FP8 from 12 tokens an SM, BF16 from 2), checked.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_tiny_whole_token_dispatch() {
    for (recipe, routes) in [
        (Recipe::Mx32, Routes::EXACT),
        (Recipe::G128, Routes::both(Mma::Fp8)),
    ] {
        let config = Config::tiny().with_recipe(recipe);
        let p = generated_problem(config, 2048, 94, 0.1);
        let what = format!("tiny {recipe}/{routes} fused, whole-token dispatch");
        run_cases(&what, &p, routes, &[2048], Placement::one_gpu(1), true);
    }
}

/// The fused forward's timeline on one rank: every tile of both layers recorded once (their k128
/// blocks add up to the layers'), none dropped, the stages in order, and y the same bits as
/// without it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_timeline_records_every_tile() {
    use megamoe_kernel::timeline::EventKind;
    let config = Config::deepseek_v4_flash().with_ranks(1);
    let config = Config {
        num_experts: 16,
        ..config
    };
    let p = generated_problem(config.with_recipe(Recipe::G128), 384, 94, 0.1);
    let routes = Routes::both(Mma::Fp8);
    run_local(Placement::one_gpu(1), |world| -> Result<(), CudaError> {
        let inputs = &p.inputs[0];
        let mut rank = CudaRank::new(
            world.clone(),
            &p.config,
            inputs.tokens,
            routes,
            &p.weights[0],
        )?;
        rank.warm_up_fused()?;
        rank.set_path(ForwardPath::Fused);
        rank.poison()?;
        let (plain, _) = rank.forward(inputs)?;
        rank.record_timeline(Some(4096))?;
        rank.poison()?;
        let (recorded, _) = rank.forward(inputs)?;
        let timeline = rank
            .fused_timeline()?
            .expect("a recorded forward's timeline");
        assert_eq!(
            differing(&plain, &recorded),
            0,
            "y with the timeline differs"
        );
        assert_eq!(timeline.dropped, 0);
        // Rows per expert: the valid routes to it.
        let mut rows = vec![0usize; p.config.num_experts];
        for &e in inputs.topk_idx.iter().filter(|&&e| e >= 0) {
            rows[e as usize] += 1;
        }
        let tile = rank.pipeline().fused_tile(inputs.tokens, None);
        let blocks = rows.iter().map(|r| r.div_ceil(tile)).sum::<usize>();
        let (h, i) = (p.config.hidden / 128, p.config.intermediate / 128);
        let k_blocks = |kind| -> usize {
            timeline
                .events
                .iter()
                .filter(|e| e.kind == kind)
                .map(|e| e.tile.expect("a tile").k_blocks as usize)
                .sum()
        };
        assert_eq!(
            k_blocks(EventKind::L1Tile),
            blocks * 2 * i * h,
            "L1: every tile's K"
        );
        assert_eq!(
            k_blocks(EventKind::L2Tile),
            blocks * h * i,
            "L2: every tile's K"
        );
        let stage = |kind| {
            let e = timeline
                .events
                .iter()
                .find(|e| e.kind == kind)
                .expect("the stage");
            (e.start_ns, e.end_ns)
        };
        let dispatch = stage(EventKind::Dispatch);
        let reduce = stage(EventKind::CombineReduce);
        // (The stage clock is CTA 0's: another CTA may leave a meeting a little before it.)
        for e in timeline.events.iter().filter(|e| e.kind.is_tile()) {
            assert!(
                e.start_ns >= dispatch.0 && e.end_ns <= reduce.1,
                "a tile outside the forward's GEMM stages: {e:?}"
            );
        }
        // Each tile's SM cycles over its ns: a clock a GPU runs at (Hopper: ≤ 1980 MHz), not a
        // field read from the wrong word or a counter of another SM. Tiles of 2 µs or more, so
        // that the timer's granularity is small against their span.
        let timed: Vec<f64> = timeline
            .events
            .iter()
            .filter(|e| e.kind.is_tile() && e.end_ns - e.start_ns >= 2_000)
            .filter_map(|e| e.sm_mhz())
            .collect();
        assert!(!timed.is_empty(), "no tile of 2 µs or more");
        for mhz in &timed {
            assert!(
                (100.0..=3000.0).contains(mhz),
                "a tile at {mhz:.0} MHz of {} timed",
                timed.len()
            );
        }
        let overlap = timeline.overlap();
        eprintln!(
            "tiles {} ({} token blocks of {tile}): {overlap}",
            timeline.events.len(),
            blocks
        );
        rank.record_timeline(None)?;
        Ok(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_equals_unfused_v4_shapes() {
    for (recipe, routes) in ROUTES {
        let flash = Config {
            num_experts: 16,
            ..Config::deepseek_v4_flash()
        }
        .with_recipe(recipe);
        let p = generated_problem(flash, 128, 94, 0.1);
        let what = format!("v4-flash shape {recipe}/{routes} fused");
        run_cases(&what, &p, routes, &[128, 7, 1], Placement::one_gpu(1), true);
    }
    for (recipe, routes) in [
        (Recipe::G128, Routes::both(Mma::Fp8)),
        (Recipe::Mx32, Routes::EXACT),
    ] {
        let pro = Config {
            num_experts: 8,
            ..Config::deepseek_v4_pro()
        }
        .with_recipe(recipe);
        let p = generated_problem(pro, 7, 95, 0.1);
        let what = format!("v4-pro shape {recipe}/{routes} fused");
        run_cases(&what, &p, routes, &[7, 1], Placement::one_gpu(1), true);
        // Large T: bit for bit the unfused forward (the reference of 8192 tokens takes minutes).
        // With 8 experts, T = 80 puts 60 rows on an expert: the 96-token tile and its short tail.
        let p = generated_problem(pro, 8192, 96, 0.05);
        let what = format!("v4-pro shape {recipe}/{routes} fused, large T");
        run_cases(
            &what,
            &p,
            routes,
            &[8192, 1000, 128, 80],
            Placement::one_gpu(1),
            false,
        );
    }
    // T = 376 puts ≈ 268 ± 9 rows on each of 8 experts: 256-token tiles, on the FP8 route with
    // last blocks of 257 .. 272 rows (overhang units) and of a few rows (short twins); with the
    // BF16 L1 the FP8 L2 runs without overhangs (the layers' blocks must match); mx32 takes
    // 128-token tiles there, with overhangs of the same rows.
    let pro = Config {
        num_experts: 8,
        ..Config::deepseek_v4_pro()
    }
    .with_recipe(Recipe::G128);
    let p = generated_problem(pro, 376, 97, 0.05);
    let mut rows = vec![0usize; pro.num_experts];
    for &e in p.inputs[0].topk_idx.iter().filter(|&&e| e >= 0) {
        rows[e as usize] += 1;
    }
    assert!(
        rows.iter().any(|r| (257..=272).contains(r)),
        "no expert with an overhang: {rows:?}"
    );
    for routes in [Routes::both(Mma::Fp8), Routes::EXACT_L1] {
        let what = format!("v4-pro shape g128/{routes} fused, rows {rows:?}");
        run_cases(&what, &p, routes, &[376], Placement::one_gpu(1), true);
    }
    let p = generated_problem(pro.with_recipe(Recipe::Mx32), 376, 97, 0.05);
    let what = format!("v4-pro shape mx32/{} fused, rows {rows:?}", Routes::EXACT);
    run_cases(
        &what,
        &p,
        Routes::EXACT,
        &[376],
        Placement::one_gpu(1),
        true,
    );
}

/// The fused kernel's cross-rank protocol (peer counts, dispatch and combine stores, device
/// meetings) among R ranks on GPU 0, each on its own share of the SMs: R = 2 with a token sweep
/// (T = 2048: ≈ 1500 rows a rank from its peer, so they go staged, `stages_rows`),
/// R = 4 skewed and clamped (and V4-Flash's per-rank shape), R = 8 (one expert each) with a rank
/// without tokens.
fn sharing_one_gpu(ranks: usize) {
    for (recipe, routes) in ROUTES {
        let config = Config::tiny().with_recipe(recipe).with_ranks(ranks);
        let what = format!("tiny {recipe}/{routes} R={ranks} on one GPU, fused");
        match ranks {
            2 => {
                let p = generated_problem(config, 2048, 97, 0.25);
                run_cases(
                    &what,
                    &p,
                    routes,
                    &[2048, 128, 7, 1, 0],
                    Placement::one_gpu(2),
                    true,
                );
            }
            4 => {
                let mut p = generated_problem(config.with_clamp(Some(1.0)), 96, 98, 0.1);
                skew(&mut p);
                run_cases(&what, &p, routes, &[96, 7], Placement::one_gpu(4), true);
                let flash = Config {
                    num_experts: 16,
                    ..Config::deepseek_v4_flash()
                }
                .with_recipe(recipe)
                .with_ranks(4);
                let p = generated_problem(flash, 128, 100, 0.1);
                let what = format!("v4-flash shape {recipe}/{routes} R=4 on one GPU, fused");
                run_cases(&what, &p, routes, &[128, 1], Placement::one_gpu(4), true);
            }
            _ => {
                let mut p = generated_problem(config, 64, 99, 0.1);
                p.inputs[5] = p.inputs[5].first(&config, 0);
                run_cases(&what, &p, routes, &[64, 1], Placement::one_gpu(ranks), true);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_two_ranks_sharing_one_gpu() {
    sharing_one_gpu(2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_four_ranks_sharing_one_gpu() {
    sharing_one_gpu(4);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_eight_ranks_sharing_one_gpu() {
    sharing_one_gpu(8);
}
