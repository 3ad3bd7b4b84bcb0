//! The CPU reference against hand-computed values, against itself under different rank
//! splits and row orders, and against the unquantized f32 forward.

use fp_formats::quant::{self, WEIGHT_BLOCK};
use fp_formats::{TieMode, bf16, bf16_rn};
use megamoe::{Config, Problem, RankInputs, RankWeights, Recipe};
use megamoe_problems::check::calc_diff;
use megamoe_problems::generate::{self, GenOptions};
use megamoe_problems::reference::{self, ActRows, ReferenceError, RowRoute};
use megamoe_problems::testing::{resplit, tiny_problem};
use rstest::rstest;

fn bits(y: &[Vec<bf16>]) -> Vec<u16> {
    y.iter().flatten().map(|v| v.to_bits()).collect()
}

/// One rank, one expert, H = I = 128, every x = 1, gate rows 2^-6, up rows `up`, w2 rows
/// 2^-7, top-k weight 0.5: every output channel is the same number, easy to follow by hand.
fn uniform_problem(recipe: Recipe, clamp: Option<f32>, up: f32) -> Problem {
    let config = Config {
        hidden: 128,
        intermediate: 128,
        num_experts: 1,
        top_k: 1,
        num_ranks: 1,
        clamp,
        recipe,
    };
    let (h, i, g) = (128, 128, recipe.group());
    let fp4_rows = |values: &[f32], k: usize| {
        let (mut packed, mut sf) = (
            vec![0; values.len() / 2],
            vec![0; values.len() / WEIGHT_BLOCK],
        );
        for ((row, p), s) in values
            .chunks(k)
            .zip(packed.chunks_mut(k / 2))
            .zip(sf.chunks_mut(k / WEIGHT_BLOCK))
        {
            quant::quantize_fp4_row(row, TieMode::NearestEven, p, s);
        }
        (packed, sf)
    };
    let w1_values: Vec<f32> = (0..2 * i)
        .flat_map(|n| vec![if n < i { 2f32.powi(-6) } else { up }; h])
        .collect();
    let (w1, w1_sf) = fp4_rows(&w1_values, h);
    let (w2, w2_sf) = fp4_rows(&vec![2f32.powi(-7); h * i], i);
    let (mut x, mut x_sf) = (vec![0; h], vec![0; h / g]);
    quant::quantize_act_row(&[1.0; 128], g, &mut x, &mut x_sf);
    Problem {
        config,
        weights: vec![RankWeights {
            w1,
            w1_sf,
            w2,
            w2_sf,
        }],
        inputs: vec![RankInputs {
            tokens: 1,
            x,
            x_sf,
            topk_idx: vec![0],
            topk_weights: vec![0.5],
        }],
    }
}

/// g = 2, u = 1: h = silu(2)·0.5 = 0.8808, scale 2^-8, 225.5 → E4M3 224 → h = 0.875, L2 sums
/// 128 · 0.875 · 2^-7. With clamp 1.5: h = silu(1.5)·0.5 = 0.6132, scale 2^-9, 313.9 → 320 →
/// 0.625. With u = -4 clamped to -1.5: h = -0.9198, scale 2^-8, -235.5 → -240 → -0.9375.
#[rstest]
#[case::plain(None, 2f32.powi(-7), 0.875)]
#[case::gate_clamped(Some(1.5), 2f32.powi(-7), 0.625)]
#[case::up_clamped(Some(1.5), -(2f32.powi(-5)), -0.9375)]
fn hand_computed_values(
    #[values(Recipe::Mx32, Recipe::G128)] recipe: Recipe,
    #[case] clamp: Option<f32>,
    #[case] up: f32,
    #[case] expected: f32,
) {
    let p = uniform_problem(recipe, clamp, up);
    p.validate().unwrap();
    let y = reference::forward(&p.config, &p.weights, &p.inputs).unwrap();
    assert!(
        y[0].iter().all(|v| v.to_f32() == expected),
        "{recipe} clamp {clamp:?}: {:?}",
        &y[0][..4]
    );
}

#[rstest]
fn rank_split_does_not_change_a_bit(
    #[values(Recipe::Mx32, Recipe::G128)] recipe: Recipe,
    #[values(None, Some(2.0))] clamp: Option<f32>,
) {
    let p = tiny_problem(2, 48, recipe, clamp, 0.2);
    let y2 = reference::forward(&p.config, &p.weights, &p.inputs).unwrap();
    for counts in [vec![96], vec![30, 0, 50, 16], vec![0, 1, 95, 0, 0, 0, 0, 0]] {
        let q = resplit(&p, &counts);
        q.validate().unwrap();
        let y = reference::forward(&q.config, &q.weights, &q.inputs).unwrap();
        assert_eq!(y.len(), counts.len());
        assert_eq!(
            bits(&y),
            bits(&y2),
            "{recipe}, clamp {clamp:?}, tokens per rank {counts:?}"
        );
    }
}

#[test]
fn no_tokens_anywhere() {
    let p = tiny_problem(2, 0, Recipe::Mx32, None, 0.0);
    p.validate().unwrap();
    let y = reference::forward(&p.config, &p.weights, &p.inputs).unwrap();
    assert_eq!(y, vec![Vec::<bf16>::new(), Vec::new()]);
}

#[test]
fn masked_slots_are_skipped() {
    let mut p = tiny_problem(2, 32, Recipe::Mx32, Some(10.0), 0.3);
    let k = p.config.top_k;
    p.inputs[1].topk_idx[..k].fill(-1); // token 0 of rank 1: every slot masked
    let y = reference::forward(&p.config, &p.weights, &p.inputs).unwrap();
    let h = p.config.hidden;
    assert!(
        y[1][..h].iter().all(|v| v.to_bits() == 0),
        "all-masked token must be +0"
    );
    let masked = p
        .inputs
        .iter()
        .flat_map(|x| &x.topk_idx)
        .filter(|&&e| e < 0)
        .count();
    assert!(masked > 10, "only {masked} masked slots");
    // Whatever a masked slot's weight says, it contributes nothing.
    for x in &mut p.inputs {
        for (e, w) in x.topk_idx.iter().zip(&mut x.topk_weights) {
            if *e < 0 {
                *w = 1e30;
            }
        }
    }
    assert_eq!(
        bits(&reference::forward(&p.config, &p.weights, &p.inputs).unwrap()),
        bits(&y)
    );
}

/// The per-layer entry points, fed every valid slot in reverse order, reproduce `forward`.
#[rstest]
fn layer_rows_reproduce_forward(#[values(Recipe::Mx32, Recipe::G128)] recipe: Recipe) {
    let p = tiny_problem(1, 40, recipe, Some(10.0), 0.1);
    let (c, x) = (&p.config, &p.inputs[0]);
    let (h, g, k) = (c.hidden, c.act_group(), c.top_k);
    let slots: Vec<(usize, usize)> = (0..x.tokens * k)
        .rev()
        .filter(|&s| x.topk_idx[s] >= 0)
        .map(|s| (s / k, s % k))
        .collect();
    let rows: Vec<usize> = slots.iter().map(|&(t, _)| t).collect();
    let gather = |src: &[u8], w: usize| -> Vec<u8> {
        rows.iter()
            .flat_map(|&t| &src[t * w..(t + 1) * w])
            .copied()
            .collect()
    };
    let routes: Vec<RowRoute> = slots
        .iter()
        .map(|&(t, j)| RowRoute {
            expert: x.topk_idx[t * k + j] as usize,
            weight: x.topk_weights[t * k + j],
        })
        .collect();
    let h_rows = reference::l1_rows(
        c,
        &p.weights[0],
        &gather(&x.x, h),
        &gather(&x.x_sf, h / g),
        &routes,
    )
    .unwrap();
    let experts: Vec<usize> = routes.iter().map(|r| r.expert).collect();
    let out = reference::l2_rows(c, &p.weights[0], &h_rows, &experts);
    // Combine by hand: slots of a token in increasing j, f32 sum from 0, then BF16.
    let mut sums = vec![0f32; x.tokens * h];
    for (r, &(t, _)) in slots.iter().enumerate().rev() {
        for (acc, v) in sums[t * h..(t + 1) * h]
            .iter_mut()
            .zip(&out[r * h..(r + 1) * h])
        {
            *acc += v.to_f32();
        }
    }
    let by_hand: Vec<u16> = sums.iter().map(|&s| bf16::from_f32(s).to_bits()).collect();
    assert_eq!(
        bits(&reference::forward(c, &p.weights, &p.inputs).unwrap()),
        by_hand
    );
}

/// With clamp c, |h| ≤ max(silu(c), 0.2785)·c·w before re-quantization, and E4M3 rounding adds
/// at most 1/16; without the clamp the same data goes well past that.
#[test]
fn clamp_bounds_the_l1_output() {
    let clamp = 0.75f32;
    let mut largest = Vec::new();
    for clamp_opt in [Some(clamp), None] {
        let p = tiny_problem(1, 64, Recipe::Mx32, clamp_opt, 0.0);
        let (c, x) = (&p.config, &p.inputs[0]);
        let (i, g, k) = (c.intermediate, c.act_group(), c.top_k);
        let rows: Vec<usize> = (0..x.tokens * k).collect();
        let xs: Vec<u8> = rows
            .iter()
            .flat_map(|&s| &x.x[s / k * c.hidden..][..c.hidden])
            .copied()
            .collect();
        let sfs: Vec<u8> = rows
            .iter()
            .flat_map(|&s| &x.x_sf[s / k * c.hidden / g..][..c.hidden / g])
            .copied()
            .collect();
        // Top-k weight 1 for every row, so the bound does not depend on the routing weights.
        let routes: Vec<RowRoute> = rows
            .iter()
            .map(|&s| RowRoute {
                expert: x.topk_idx[s] as usize,
                weight: 1.0,
            })
            .collect();
        let ActRows { q, sf } = reference::l1_rows(c, &p.weights[0], &xs, &sfs, &routes).unwrap();
        let mut deq = vec![0f32; q.len()];
        for ((qr, sr), d) in q.chunks(i).zip(sf.chunks(i / g)).zip(deq.chunks_mut(i)) {
            quant::dequantize_act_row(qr, sr, g, d);
        }
        largest.push(deq.iter().fold(0f32, |m, v| m.max(v.abs())));
    }
    let silu_c = clamp / (1.0 + (-clamp).exp());
    let bound = silu_c.max(0.2785) * clamp * (1.0 + 1.0 / 16.0);
    assert!(
        largest[0] <= bound,
        "clamped |h| = {} > {bound}",
        largest[0]
    );
    assert!(
        largest[1] > 4.0 * bound,
        "unclamped |h| = {} should exceed {bound} by far",
        largest[1]
    );
}

#[test]
fn overflowing_l1_is_an_error() {
    let mut p = uniform_problem(Recipe::Mx32, None, 2f32.powi(-7));
    p.inputs[0].x.fill(0x7e); // 448
    p.inputs[0].x_sf.fill(127 + 100);
    p.weights[0].w1.fill(0x77); // 6, 6
    p.weights[0].w1_sf.fill(127 + 20);
    p.validate().unwrap(); // every value is finite; only the sums overflow
    let err = reference::forward(&p.config, &p.weights, &p.inputs).unwrap_err();
    assert!(
        matches!(
            err,
            ReferenceError::NonFiniteL1 {
                expert: 0,
                row: 0,
                ..
            }
        ),
        "{err}"
    );
}

/// A realistic mid-size layer: the quantized contract stays within 2e-2 (calc_diff) of the f32
/// layer for both recipes, and the two recipes do not give the same bits. (They differ only a
/// little: scaling by a power of two commutes with E4M3 rounding, so G only matters for values
/// far enough below their block's amax to be E4M3 subnormals.)
#[test]
fn quantized_forward_tracks_f32() {
    let config = Config {
        hidden: 1024,
        intermediate: 512,
        num_experts: 16,
        top_k: 4,
        num_ranks: 2,
        clamp: Some(10.0),
        recipe: Recipe::Mx32,
    };
    let mut ys = Vec::new();
    for recipe in [Recipe::Mx32, Recipe::G128] {
        let opts = GenOptions {
            config: config.with_recipe(recipe),
            tokens: 32,
            seed: 3,
            mask_fraction: 0.1,
        };
        let p = generate::problem(&opts);
        let dense_w: Vec<_> = p.weights.iter().map(|w| w.dequantize(&p.config)).collect();
        let dense_x: Vec<_> = (0..config.num_ranks)
            .map(|r| generate::dense_inputs(&opts, r))
            .collect();
        let y = reference::forward(&p.config, &p.weights, &p.inputs).unwrap();
        let y32 = reference::forward_f32(&p.config, &dense_w, &dense_x);
        let flat: Vec<f32> = y.iter().flatten().map(|v| v.to_f32()).collect();
        let flat32: Vec<f32> = y32.into_iter().flatten().collect();
        let rms =
            (flat32.iter().map(|v| f64::from(v * v)).sum::<f64>() / flat32.len() as f64).sqrt();
        let diff = calc_diff(&flat, &flat32);
        eprintln!("{recipe}: calc_diff(quantized, f32) = {diff:.3e}, rms(y_f32) = {rms:.3}");
        assert!(diff < 2e-2, "{recipe}: calc_diff {diff}");
        assert!(
            (0.05..20.0).contains(&rms),
            "outputs should be O(1), rms {rms}"
        );
        ys.push(flat);
    }
    let between = calc_diff(&ys[0], &ys[1]);
    eprintln!("calc_diff(mx32, g128) = {between:.3e}");
    assert!(
        between > 0.0,
        "the recipes should not agree bit for bit on this data"
    );
}

#[test]
fn bf16_rn_matches_the_combine_rounding() {
    // The combine rounds with the same rule as fp-formats: ties to even.
    let tie = f32::from_bits(0x3f80_8000); // 1 + 2^-8: halfway between two BF16 values
    assert_eq!(bf16::from_f32(tie).to_f32(), bf16_rn(tie));
    assert_eq!(bf16_rn(tie), 1.0);
}
