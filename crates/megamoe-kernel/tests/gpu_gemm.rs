//! The Hopper grouped GEMM on a GPU against the contract's reference (f64 sums of exact products,
//! rounded once): every (recipe, tensor-core route) pair, every tokens-per-tile specialization,
//! the shapes of every preset and odd ones, experts with 0, 1, 7, 129 rows and one holding half of all rows. The output is
//! poisoned first; every row of every expert must be written and the padding between experts not.

use cuda_rt::{Gpu, Jit};
use fp_formats::Recipe;
use megamoe_kernel::problem::{ActPool, ExpertWeights, reference_rows};
use megamoe_kernel::{
    DeviceBytes, DeviceWeights, GemmCore, Mma, Pool, Routes, TilePlan, transform_weights,
};

const POISON: u16 = 0xFFFF; // a BF16 NaN

/// Every route the GEMM offers: g128 through FP8 (fast) and BF16 (exact), mx32 through BF16.
const ROUTES: [(Recipe, Mma); 3] = [
    (Recipe::G128, Mma::Fp8),
    (Recipe::G128, Mma::Bf16),
    (Recipe::Mx32, Mma::Bf16),
];

fn calc_diff(a: &[f64], b: &[f64]) -> f64 {
    let (mut ab, mut sq) = (0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        ab += x * y;
        sq += x * x + y * y;
    }
    if sq == 0.0 { 0.0 } else { 1.0 - 2.0 * ab / sq }
}

struct Case<'a> {
    recipe: Recipe,
    mma: Mma,
    tokens_per_tile: Option<usize>,
    expert_rows: &'a [usize],
    n: usize,
    k: usize,
    seed: u64,
    /// Check every this many rows of each expert (and its last); `None`: its ends and middle.
    check_stride: Option<usize>,
    /// Push one k128 block of expert 0's row 0 down by 12 binades, so that (g128) no single fold
    /// base fits the whole row and the per-block specialization runs.
    wide_rows: bool,
    /// Give expert 0's row 0 one k128 block whose sub-scales span 13 binades, so that (FP8) an
    /// offset falls below -5 and the decode tables come from shared memory.
    deep_block: bool,
    /// The split tail on or off (`None`: the plan's default).
    split_parts: Option<usize>,
    /// Narrow tiles on or off (`None`: the plan's default).
    narrow_tiles: Option<bool>,
    /// The dynamic schedule on or off (`None`: the plan's default).
    dynamic: Option<bool>,
    /// CTAs per cluster (`None`: the plan's default).
    cluster: Option<usize>,
    /// Launches, the output poisoned before each; the last one is checked (a schedule's state
    /// must be ready for the next launch).
    launches: usize,
}

impl<'a> Case<'a> {
    /// The plan's tile choice, the ends of large experts checked, canonical scales.
    fn new(
        recipe: Recipe,
        mma: Mma,
        expert_rows: &'a [usize],
        n: usize,
        k: usize,
        seed: u64,
    ) -> Self {
        Case {
            recipe,
            mma,
            tokens_per_tile: None,
            expert_rows,
            n,
            k,
            seed,
            check_stride: None,
            wide_rows: false,
            deep_block: false,
            split_parts: None,
            narrow_tiles: None,
            dynamic: None,
            cluster: None,
            launches: 1,
        }
    }
}

/// Runs one case; returns (calc_diff over the checked rows, BF16 values that differ from the reference).
fn run(gpu: &Gpu, jit: &Jit, case: Case) -> (f64, usize) {
    let Case {
        recipe,
        mma,
        tokens_per_tile,
        expert_rows,
        n,
        k,
        seed,
        check_stride,
        wide_rows,
        deep_block,
        split_parts,
        narrow_tiles,
        dynamic,
        cluster,
        launches,
    } = case;
    let experts = expert_rows.len();
    let mut weights = ExpertWeights::random(experts, n, k, seed);
    if wide_rows {
        weights.w_sf[..4].iter_mut().for_each(|b| *b -= 12);
    }
    if deep_block {
        let top = *weights.w_sf[..4].iter().max().unwrap();
        weights.w_sf[..4].copy_from_slice(&[top, top, top, top - 13]);
    }
    let transformed = transform_weights(mma, &weights.w, &weights.w_sf, experts, n, k).unwrap();
    // (A deep block leaves the row's base mode to the rest of the row's scales.)
    if !deep_block {
        assert_eq!(
            transformed.fold.row_base,
            mma == Mma::Fp8 && !wide_rows,
            "fold base mode"
        );
    }
    assert_eq!(
        transformed.fold.in_registers,
        mma == Mma::Fp8 && !deep_block,
        "fold tables in registers"
    );
    let device_weights = DeviceWeights::upload(gpu, &transformed).unwrap();
    let pool = ActPool::random(recipe, expert_rows, k, seed + 1);
    let hit: Vec<usize> = expert_rows.iter().copied().filter(|&r| r > 0).collect();
    let bn = tokens_per_tile.unwrap_or_else(|| {
        TilePlan::tokens_per_tile_for(
            hit.iter().sum::<usize>() as f64 / hit.len().max(1) as f64,
            Routes::both(mma),
        )
    });
    let mut plan = TilePlan::new(mma, bn).unwrap().with_fold(transformed.fold);
    if let Some(split_parts) = split_parts {
        plan = plan.with_split_parts(split_parts);
    }
    if let Some(narrow_tiles) = narrow_tiles {
        plan = plan.with_narrow_tiles(narrow_tiles);
    }
    if let Some(dynamic) = dynamic {
        plan = plan.with_dynamic(dynamic);
    }
    if let Some(cluster) = cluster {
        plan = plan.with_cluster(cluster);
    }
    let mut core = GemmCore::new(gpu, jit, plan).unwrap();

    let sf_stride = pool.sf_stride(bn);
    let (act, act_sf) = pool.device_image(mma, sf_stride);
    let act = gpu.upload(&act).unwrap();
    let act_sf = act_sf.map(|sf| gpu.upload(&sf).unwrap());
    let offsets_dev = gpu.upload(&pool.expert_offset).unwrap();
    let rows_dev = gpu.upload(&pool.expert_rows).unwrap();
    let device_pool = Pool {
        act: DeviceBytes::of(gpu, &act),
        act_sf: act_sf.as_ref().map(|sf| DeviceBytes::of(gpu, sf)),
        sf_stride,
        rows: pool.rows,
        expert_offset: &pool.expert_offset,
        expert_rows: &pool.expert_rows,
        expert_offset_dev: offsets_dev.slice(..),
        expert_rows_dev: rows_dev.slice(..),
    };
    let mut out = gpu.alloc_zeros::<u16>(pool.rows * n).unwrap();
    for _ in 0..launches {
        gpu.memset(&mut out, 0xFF).unwrap();
        core.run(gpu, &device_weights, &device_pool, &mut out)
            .unwrap();
    }
    let out = gpu.download(&out).unwrap();
    core.check_error(gpu)
        .expect("no split-tail hand-over gave up");

    let mut owned = vec![false; pool.rows];
    let (mut got, mut want, mut differ) = (Vec::new(), Vec::new(), 0);
    for (e, &rows) in expert_rows.iter().enumerate() {
        let off = pool.expert_offset[e] as usize;
        owned[off..off + rows].iter_mut().for_each(|o| *o = true);
        for row in off..off + rows {
            let line = &out[row * n..][..n];
            let unwritten = line.iter().filter(|&&v| v == POISON).count();
            assert_eq!(
                unwritten, 0,
                "{recipe}/{mma} bn {bn}: expert {e} pool row {row}: {unwritten} of {n} outputs not written (or NaN)"
            );
        }
        // Every row of small experts; the ends and a stride of large ones.
        let checked: Vec<usize> = match check_stride {
            _ if rows <= 9 => (off..off + rows).collect(),
            Some(stride) => (off..off + rows)
                .step_by(stride)
                .chain(std::iter::once(off + rows - 1))
                .collect(),
            None => [off, off + 1, off + rows / 2, off + rows - 2, off + rows - 1].into(),
        };
        for (row, reference) in checked
            .iter()
            .zip(reference_rows(&weights, &pool, e, &checked))
        {
            for (&g, &r) in out[row * n..][..n].iter().zip(&reference) {
                differ += usize::from(g != r);
                got.push(f64::from(fp_formats::bf16::from_bits(g).to_f32()));
                want.push(f64::from(fp_formats::bf16::from_bits(r).to_f32()));
            }
        }
    }
    for (row, owned) in owned.iter().enumerate() {
        if !owned {
            assert!(
                out[row * n..][..n].iter().all(|&v| v == POISON),
                "{recipe}/{mma} bn {bn}: padding row {row} was written"
            );
        }
    }
    let diff = calc_diff(&got, &want);
    let base = match (plan.fold.row_base, plan.tables_in_registers()) {
        (true, true) => "row base, reg tables",
        (true, false) => "row base, smem tables",
        (false, true) => "block base, reg tables",
        (false, false) => "block base, smem tables",
    };
    eprintln!(
        "{recipe}/{mma:<4} bn {bn:>3} {base}{}{}{} n {n:>5} k {k:>5} rows {expert_rows:?}: calc_diff {diff:.3e}, {differ} of {} BF16 values differ",
        if plan.dynamic { ", drawn" } else { "" },
        if plan.splits_tail() {
            ", split tail"
        } else {
            ""
        },
        if plan.narrows_tiles() {
            ", narrow tiles"
        } else {
            ""
        },
        got.len()
    );
    (diff, differ)
}

/// Runs `case` and holds it to calc_diff ≤ 1e-5; `what` names it in the failure.
fn assert_matches(gpu: &Gpu, jit: &Jit, case: Case, what: &str) {
    let (recipe, mma, bn) = (case.recipe, case.mma, case.tokens_per_tile);
    let (diff, _) = run(gpu, jit, case);
    assert!(
        diff <= 1e-5,
        "{recipe}/{mma} bn {bn:?} {what}: calc_diff {diff:e}"
    );
}

/// 40 experts of 0..70 rows in no order: many tiles and rounds of them, empty experts between.
fn scattered_rows() -> Vec<usize> {
    (0..40).map(|e| (e * 37) % 71).collect()
}

fn setup() -> (Gpu, Jit) {
    (
        Gpu::open(0).expect("this test needs a CUDA GPU"),
        cuda_rt::testing::jit(),
    )
}

/// Every route and tokens-per-tile specialization on one expert layout, each held to 1e-5.
fn every_tile(expert_rows: &[usize], n: usize, seed: u64, check_stride: Option<usize>) {
    let (gpu, jit) = setup();
    for (recipe, mma) in ROUTES {
        for bn in megamoe_kernel::gemm::TOKEN_TILES {
            let (diff, _) = run(
                &gpu,
                &jit,
                Case {
                    tokens_per_tile: Some(bn),
                    check_stride,
                    ..Case::new(recipe, mma, expert_rows, n, 384, seed + bn as u64)
                },
            );
            assert!(diff <= 1e-5, "{recipe}/{mma} bn {bn}: calc_diff {diff:e}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_specialization_matches_the_reference() {
    every_tile(&[0, 1, 7, 129, 40, 16, 100, 300], 256, 0, None);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn skewed_and_odd_shapes_match_the_reference() {
    let (gpu, jit) = setup();
    for (recipe, mma) in ROUTES {
        for (rows, n, k) in [
            (&[600usize, 50, 50, 100, 0, 200][..], 384, 640),
            (&[1, 0, 0, 2][..], 128, 128),
            (&[300, 299, 1][..], 640, 1152),
        ] {
            let (diff, _) = run(&gpu, &jit, Case::new(recipe, mma, rows, n, k, 42));
            assert!(
                diff <= 1e-5,
                "{recipe}/{mma} {rows:?} {n}x{k}: calc_diff {diff:e}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn preset_shapes_match_the_reference() {
    let (gpu, jit) = setup();
    // (name, L1 n = 2I, L2 n = H, H, I): tiny, DeepSeek-V4-Flash, DeepSeek-V4-Pro, DeepSeek-V3.
    let presets = [
        ("tiny", 256, 128),
        ("v4-flash", 4096, 2048),
        ("v4-pro", 7168, 3072),
        ("v3", 7168, 2048),
    ];
    for (recipe, mma) in ROUTES {
        for (name, h, i) in presets {
            for (layer, n, k) in [("L1", 2 * i, h), ("L2", h, i)] {
                let (diff, _) = run(&gpu, &jit, Case::new(recipe, mma, &[3, 70, 0, 33], n, k, 7));
                assert!(
                    diff <= 1e-5,
                    "{recipe}/{mma} {name} {layer}: calc_diff {diff:e}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rows_too_wide_for_one_base_take_the_per_block_kernel() {
    let (gpu, jit) = setup();
    // (256: two short twin units, 5 and 33 rows, and an overhang unit of 270.)
    for bn in [16, 128, 256] {
        for (wide_rows, deep_block) in [(true, false), (false, true)] {
            let (diff, _) = run(
                &gpu,
                &jit,
                Case {
                    tokens_per_tile: Some(bn),
                    wide_rows,
                    deep_block,
                    ..Case::new(Recipe::G128, Mma::Fp8, &[5, 140, 0, 33, 270], 256, 512, 3)
                },
            );
            assert!(
                diff <= 1e-5,
                "g128 bn {bn} wide {wide_rows} deep {deep_block}: calc_diff {diff:e}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn many_tiles_per_cta_match_the_reference() {
    // More tiles than CTAs for every tile size: each persistent CTA walks several tiles, experts
    // and weight tiles, so the pipelines' phases and the fold bases carry from tile to tile.
    every_tile(&[2000, 1, 1500, 700, 0, 333], 1024, 100, Some(7));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn split_tails_match_the_reference() {
    // The two-CTA tiles' last items drawn in parts of K: fewer items than CTAs (all split), about
    // one round, and many rounds; K of 3 and 5 blocks (parts of 1–3 blocks, with 4 parts of 3
    // blocks only 3). Two launches each (tickets and hand-over flags must be back at 0), also
    // unsplit and with the static schedule.
    let (gpu, jit) = setup();
    let grid = 2 * gpu.info().sm_count as usize;
    let few: Vec<usize> = vec![5, 0, 17, 1, 9];
    let one_round: Vec<usize> = (0..40).map(|e| 1 + e % 13).collect();
    let rounds = scattered_rows();
    for (recipe, mma) in ROUTES {
        for bn in [16, 32] {
            for (rows, n, k) in [
                (&few, 512, 384),
                (&one_round, 1024, 384),
                (&rounds, 2048, 640),
            ] {
                let items: usize = rows.iter().map(|r| r.div_ceil(bn)).sum::<usize>() * (n / 128);
                for (parts, dynamic) in [(2, true), (3, true), (4, true), (1, true), (1, false)] {
                    assert_matches(
                        &gpu,
                        &jit,
                        Case {
                            tokens_per_tile: Some(bn),
                            check_stride: Some(5),
                            split_parts: Some(parts),
                            dynamic: Some(dynamic),
                            launches: 2,
                            ..Case::new(recipe, mma, rows, n, k, 11 + bn as u64)
                        },
                        &format!(
                            "{n}x{k} {items} items (grid {grid}), {parts} parts, drawn {dynamic}"
                        ),
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn token_scales_in_several_chunks_match_the_reference() {
    // FP8 two-CTA tiles load a unit's token scales 64 k-blocks at a time into two buffers in turn
    // (Layout::kChunkedScales): K of 150 blocks is three chunks a unit (64, 64, 22), its split
    // parts start and end inside chunks, and a CTA's buffers turn over many times; two launches.
    let (gpu, jit) = setup();
    for bn in [16, 32] {
        for parts in [1, 2, 3] {
            assert_matches(
                &gpu,
                &jit,
                Case {
                    tokens_per_tile: Some(bn),
                    check_stride: Some(3),
                    split_parts: Some(parts),
                    launches: 2,
                    ..Case::new(Recipe::G128, Mma::Fp8, &[5, 40, 0, 17], 256, 150 * 128, 13)
                },
                &format!("K = 150 blocks, {parts} parts"),
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn dynamic_schedule_matches_the_reference() {
    // Tiles drawn from a counter (the two-CTA ones: split_tails_match_the_reference), one-CTA tiles
    // alone and the BF16 ones also in clusters of two, whose first CTA draws for both: fewer items
    // than CTAs and many rounds; three launches each, the last checked (the counter must be back
    // at 0, the clusters' mail in step).
    let (gpu, jit) = setup();
    let few: Vec<usize> = vec![3, 0, 17, 1];
    let many = scattered_rows();
    for (recipe, mma) in ROUTES {
        for bn in [64, 128] {
            let clusters: &[usize] = if mma == Mma::Bf16 && bn == 128 {
                &[1, 2]
            } else {
                &[1]
            };
            for &cluster in clusters {
                for (rows, n, k) in [(&few, 256, 256), (&many, 2048, 640)] {
                    assert_matches(
                        &gpu,
                        &jit,
                        Case {
                            tokens_per_tile: Some(bn),
                            check_stride: Some(5),
                            dynamic: Some(true),
                            cluster: Some(cluster),
                            launches: 3,
                            ..Case::new(recipe, mma, rows, n, k, 23 + bn as u64)
                        },
                        &format!("{n}x{k}, drawn, cluster {cluster}"),
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn short_twin_units_match_the_reference() {
    // FP8 256-token tiles: an expert's last block of at most 64 rows is one unit of two tiles.
    // Blocks of 1, 44, 64 and 65 rows after whole ones and alone, odd tile counts (the last
    // pair's odd tile a ghost). (The per-block fold's short twins:
    // rows_too_wide_for_one_base_take_the_per_block_kernel.)
    let (gpu, jit) = setup();
    wide_fp8_tiles_match(&gpu, &jit, &[300, 64, 65, 0, 577, 1, 256, 44], 31);
}

/// FP8 256-token tiles on experts of `rows` rows in three shapes (odd tile counts among them),
/// drawn and strided, three launches each.
fn wide_fp8_tiles_match(gpu: &Gpu, jit: &Jit, rows: &[usize], seed: u64) {
    for (n, k) in [(640, 384), (128, 256), (1024, 128)] {
        for dynamic in [true, false] {
            assert_matches(
                gpu,
                jit,
                Case {
                    tokens_per_tile: Some(256),
                    dynamic: Some(dynamic),
                    launches: 3,
                    ..Case::new(Recipe::G128, Mma::Fp8, rows, n, k, seed + n as u64)
                },
                &format!("{n}x{k}, drawn {dynamic}"),
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn overhang_units_match_the_reference() {
    // FP8 256-token tiles: an expert's rows in the fewest blocks of up to 272 where that saves a
    // block, the rows past 256 a fifth chunk of each stage. Overhangs of 1, 15 and 16 rows alone
    // and after whole blocks (257, 271, 272, 528), of 60 over four blocks (1084: 272, 272, 272,
    // 268) and of 64 (1088: four of 272), one row past them (273, 545, 1089: whole blocks and a
    // short twin), whole blocks (256, 512).
    let (gpu, jit) = setup();
    wide_fp8_tiles_match(
        &gpu,
        &jit,
        &[
            257, 273, 0, 528, 16, 271, 1084, 512, 545, 272, 1088, 256, 1089, 1,
        ],
        41,
    );
    // BF16 128-token tiles: up to 144 rows a unit (272 and 288: two units), both recipes, in
    // clusters of two (the overhang rows multicast by half like the tile's) and alone.
    let rows: Vec<usize> = vec![129, 145, 0, 272, 16, 143, 288, 256, 273, 289, 144, 128, 1];
    for recipe in [Recipe::Mx32, Recipe::G128] {
        for cluster in [2, 1] {
            assert_matches(
                &gpu,
                &jit,
                Case {
                    tokens_per_tile: Some(128),
                    cluster: Some(cluster),
                    launches: 3,
                    ..Case::new(recipe, Mma::Bf16, &rows, 640, 384, 43 + cluster as u64)
                },
                &format!("BF16 cluster {cluster}"),
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn narrow_tiles_match_the_reference() {
    // Token blocks on both sides of each narrow width (8, 16, 24 rows), narrow tiles on and off.
    let (gpu, jit) = setup();
    let rows = [
        1usize, 8, 9, 16, 17, 24, 25, 31, 32, 33, 0, 5, 48, 40, 56, 57,
    ];
    for (recipe, mma) in ROUTES {
        for bn in [16, 32] {
            for narrow_tiles in [true, false] {
                let (diff, _) = run(
                    &gpu,
                    &jit,
                    Case {
                        tokens_per_tile: Some(bn),
                        check_stride: Some(1),
                        narrow_tiles: Some(narrow_tiles),
                        ..Case::new(recipe, mma, &rows, 256, 640, 21 + bn as u64)
                    },
                );
                assert!(
                    diff <= 1e-5,
                    "{recipe}/{mma} bn {bn} narrow tiles {narrow_tiles}: calc_diff {diff:e}"
                );
            }
        }
    }
}

/// The ring's bounded wait (`ring_wait`, every GEMM role's wait but the consumers' own stage
/// waits): a phase that never completes makes it give up after the in-kernel timeout into the
/// error word, which names the ring and a CTA of the launch; a later wait in a launch whose word is
/// set gives up within milliseconds; a phase that completes leaves the word at 0.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_ring_wait_that_never_ends_gives_up_into_the_error_word() {
    use barriers::{BarrierError, LocalWait, check_error_word};
    use cuda_rt::LaunchConfig;
    use std::time::{Duration, Instant};
    let (gpu, module) =
        cuda_rt::testing::gpu_with_module(&megamoe_kernel::gemm::ring_wait_test_spec());
    let kernel = module.kernel("ring_wait_for_arrivals").unwrap();
    let mut error = gpu.alloc_zeros::<u64>(1).unwrap();
    let run = |error: &mut _, arrivals: u32| {
        let start = Instant::now();
        // SAFETY: ring_wait_for_arrivals(error: one u64, arrivals), 32 threads per CTA.
        unsafe {
            kernel
                .launch(gpu.stream(), LaunchConfig::linear(3, 32))
                .ptr_mut(error)
                .scalar(arrivals)
                .launch()
                .unwrap();
        }
        gpu.synchronize().unwrap();
        start.elapsed()
    };
    let took = run(&mut error, 2);
    assert_eq!(
        gpu.download(&error).unwrap()[0],
        0,
        "a completed phase is no error"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");

    let took = run(&mut error, 1);
    let word = gpu.download(&error).unwrap()[0];
    let err = check_error_word(word).expect_err("the wait gave up");
    eprintln!("after {took:?}: {err}");
    let BarrierError::LocalTimeout {
        wait: LocalWait::Ring,
        detail,
        waited_ns,
    } = err
    else {
        panic!("not a ring timeout: {err}");
    };
    assert!(detail < 3, "CTA {detail} of 3");
    assert!(waited_ns >= 4_900_000_000, "{waited_ns} ns");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(20),
        "{took:?}"
    );

    // The word is set: the next launch's waits give up at their first check, the word unchanged.
    let took = run(&mut error, 0);
    assert_eq!(gpu.download(&error).unwrap()[0], word);
    assert!(took < Duration::from_millis(500), "{took:?}");
}
