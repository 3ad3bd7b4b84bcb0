//! The random problem generator: weights and tokens whose quantization error is realistic and
//! differs between the recipes. Weights are Gaussian with a per-32-block magnitude factor
//! 2^U(−3,3) (so the MXFP4 scales of one row spread over a few binades, well inside the 14
//! that the g128 fold allows); tokens are Gaussian with per-32-block factors 2^U(−2,2) and a
//! few outlier channels 20–100× larger, as in real LLM activations; routing picks distinct
//! experts per token. Every weight row is drawn from its own ChaCha stream keyed by (seed,
//! layer, global expert, row) and every token from (seed, rank, token), so generation is
//! parallel, reproducible, and the same global problem comes out for any rank count.

use crate::config::Config;
use crate::problem::{DenseInputs, DenseWeights, Problem, RankInputs, RankWeights};
use fp_formats::TieMode;
use fp_formats::quant::{self, WEIGHT_BLOCK};
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;

/// What to generate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GenOptions {
    /// Shape, ranks, clamp and recipe of the problem.
    pub config: Config,
    /// Tokens T on every rank.
    pub tokens: usize,
    pub seed: u64,
    /// Probability that a slot is masked (`topk_idx = −1`).
    pub mask_fraction: f64,
}

/// Weight blocks scale by 2^U(−WEIGHT_SPREAD, WEIGHT_SPREAD).
const WEIGHT_SPREAD: f64 = 3.0;
/// Activation blocks scale by 2^U(−ACT_SPREAD, ACT_SPREAD).
const ACT_SPREAD: f64 = 2.0;
/// One outlier channel per this many hidden channels (at least two).
const CHANNELS_PER_OUTLIER: usize = 256;
/// Outlier channels are this much larger than the others.
const OUTLIER_GAIN: std::ops::Range<f32> = 20.0..100.0;

/// Independent random streams, one per purpose.
#[derive(Clone, Copy)]
enum Stream {
    W1 = 1,
    W2 = 2,
    Tokens = 3,
    Routing = 4,
    Outliers = 5,
}

/// The two weight matrices of an expert.
#[derive(Clone, Copy)]
enum Layer {
    W1,
    W2,
}

impl Layer {
    fn stream(self) -> Stream {
        match self {
            Layer::W1 => Stream::W1,
            Layer::W2 => Stream::W2,
        }
    }

    /// (rows per expert, K) of this layer.
    fn dims(self, c: &Config) -> (usize, usize) {
        match self {
            Layer::W1 => (2 * c.intermediate, c.hidden),
            Layer::W2 => (c.hidden, c.intermediate),
        }
    }
}

fn stream(seed: u64, which: Stream, a: usize, b: usize) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    for (chunk, word) in key
        .chunks_exact_mut(8)
        .zip([seed, which as u64, a as u64, b as u64])
    {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// E[(2^u)²] for u ~ U(−s, s): keeps the blocks' factors from changing the overall scale.
fn mean_square_factor(spread: f64) -> f64 {
    (4f64.powf(spread) - 4f64.powf(-spread)) / (2.0 * spread * 4f64.ln())
}

/// Fills `out` with Gaussian values times a 2^U(−spread, spread) factor per 32-block, scaled
/// so the mean square is `mean_square`.
fn blocky_gaussian(rng: &mut ChaCha8Rng, spread: f64, mean_square: f64, out: &mut [f32]) {
    let norm = (mean_square / mean_square_factor(spread)).sqrt();
    for block in out.chunks_mut(WEIGHT_BLOCK) {
        let factor = (rng.random_range(-spread..spread).exp2() * norm) as f32;
        for v in block {
            *v = rng.sample::<f32, _>(StandardNormal) * factor;
        }
    }
}

/// Row `row` of `layer` of global `expert`, `k` long: variance 1/k, so outputs stay O(|x|).
fn weight_row(seed: u64, layer: Layer, expert: usize, row: usize, out: &mut [f32]) {
    let k = out.len();
    blocky_gaussian(
        &mut stream(seed, layer.stream(), expert, row),
        WEIGHT_SPREAD,
        1.0 / k as f64,
        out,
    );
}

/// Per-channel gain of the hidden dimension: 1 except a few outlier channels, the same for
/// every token and rank (outliers are a property of the model).
fn channel_gains(seed: u64, hidden: usize) -> Vec<f32> {
    let mut rng = stream(seed, Stream::Outliers, 0, 0);
    let mut gains = vec![1f32; hidden];
    let count = (hidden / CHANNELS_PER_OUTLIER).max(2);
    for c in rand::seq::index::sample(&mut rng, hidden, count) {
        gains[c] = rng.random_range(OUTLIER_GAIN);
    }
    gains
}

/// Token `token` of rank `rank`.
fn token_row(seed: u64, rank: usize, token: usize, gains: &[f32], out: &mut [f32]) {
    blocky_gaussian(
        &mut stream(seed, Stream::Tokens, rank, token),
        ACT_SPREAD,
        1.0,
        out,
    );
    for (v, g) in out.iter_mut().zip(gains) {
        *v *= g;
    }
}

/// Top-k routing of one rank: distinct global experts per token, weights that sum to 1 over
/// the k slots, then each slot masked (−1, weight 0) with probability `mask_fraction`.
fn routing(opts: &GenOptions, rank: usize) -> (Vec<i64>, Vec<f32>) {
    let (e, k) = (opts.config.num_experts, opts.config.top_k);
    let mut idx = Vec::with_capacity(opts.tokens * k);
    let mut weights = Vec::with_capacity(opts.tokens * k);
    for t in 0..opts.tokens {
        let mut rng = stream(opts.seed, Stream::Routing, rank, t);
        let experts = rand::seq::index::sample(&mut rng, e, k);
        let raw: Vec<f32> = (0..k).map(|_| rng.random_range(0.1f32..1.0)).collect();
        let total: f32 = raw.iter().sum();
        for (expert, w) in experts.iter().zip(raw) {
            if rng.random_bool(opts.mask_fraction) {
                idx.push(-1);
                weights.push(0.0);
            } else {
                idx.push(expert as i64);
                weights.push(w / total);
            }
        }
    }
    (idx, weights)
}

/// Draws every row of `layer` of `rank` in parallel and hands it to `fill` with its output
/// slot (`rows` holds one slot per row, canonical order). Ticks `progress` once per row.
fn for_each_weight_row<T: Send>(
    opts: &GenOptions,
    rank: usize,
    layer: Layer,
    rows: &mut [T],
    progress: &ProgressBar,
    fill: impl Fn(&[f32], &mut T) + Sync,
) {
    let c = &opts.config;
    let (per_expert, k) = layer.dims(c);
    let first_expert = rank * c.experts_per_rank();
    rows.par_iter_mut().enumerate().for_each_init(
        || vec![0f32; k],
        |buf, (r, out)| {
            weight_row(
                opts.seed,
                layer,
                first_expert + r / per_expert,
                r % per_expert,
                buf,
            );
            fill(buf, out);
            progress.inc(1);
        },
    );
}

/// Weight rows of one rank (for sizing a progress bar).
pub fn weight_rows(config: &Config) -> u64 {
    (config.experts_per_rank() * (2 * config.intermediate + config.hidden)) as u64
}

/// Quantized weights of `rank`, quantized row by row as they are drawn (never the whole rank
/// in f32). Ticks `progress` once per row.
pub fn rank_weights(opts: &GenOptions, rank: usize, progress: &ProgressBar) -> RankWeights {
    let quantize = |layer: Layer| {
        let (per_expert, k) = layer.dims(&opts.config);
        let rows = per_expert * opts.config.experts_per_rank();
        let mut packed = vec![0u8; rows * k / 2];
        let mut sf = vec![0u8; rows * k / WEIGHT_BLOCK];
        let mut row_slices: Vec<(&mut [u8], &mut [u8])> = packed
            .chunks_exact_mut(k / 2)
            .zip(sf.chunks_exact_mut(k / WEIGHT_BLOCK))
            .collect();
        for_each_weight_row(opts, rank, layer, &mut row_slices, progress, |w, (p, s)| {
            quant::quantize_fp4_row(w, TieMode::NearestEven, p, s)
        });
        (packed, sf)
    };
    let (w1, w1_sf) = quantize(Layer::W1);
    let (w2, w2_sf) = quantize(Layer::W2);
    RankWeights {
        w1,
        w1_sf,
        w2,
        w2_sf,
    }
}

/// The unquantized f32 weights that [`rank_weights`] quantizes.
pub fn dense_weights(opts: &GenOptions, rank: usize) -> DenseWeights {
    let draw = |layer: Layer| {
        let (per_expert, k) = layer.dims(&opts.config);
        let mut w = vec![0f32; per_expert * opts.config.experts_per_rank() * k];
        let mut row_slices: Vec<&mut [f32]> = w.chunks_exact_mut(k).collect();
        for_each_weight_row(
            opts,
            rank,
            layer,
            &mut row_slices,
            &ProgressBar::hidden(),
            |src, dst| dst.copy_from_slice(src),
        );
        w
    };
    DenseWeights {
        w1: draw(Layer::W1),
        w2: draw(Layer::W2),
    }
}

/// The unquantized tokens and routing of `rank`.
pub fn dense_inputs(opts: &GenOptions, rank: usize) -> DenseInputs {
    let h = opts.config.hidden;
    let gains = channel_gains(opts.seed, h);
    let mut x = vec![0f32; opts.tokens * h];
    x.par_chunks_mut(h)
        .enumerate()
        .for_each(|(t, row)| token_row(opts.seed, rank, t, &gains, row));
    let (topk_idx, topk_weights) = routing(opts, rank);
    DenseInputs {
        tokens: opts.tokens,
        x,
        topk_idx,
        topk_weights,
    }
}

/// The quantized tokens of `rank` (activation recipe of the config) with their routing.
pub fn rank_inputs(opts: &GenOptions, rank: usize) -> RankInputs {
    let dense = dense_inputs(opts, rank);
    let (h, g) = (opts.config.hidden, opts.config.act_group());
    let mut x = vec![0u8; dense.x.len()];
    let mut x_sf = vec![0u8; dense.x.len() / g];
    x.par_chunks_mut(h)
        .zip(x_sf.par_chunks_mut(h / g))
        .zip(dense.x.par_chunks(h))
        .for_each(|((q, sf), row)| quant::quantize_act_row(row, g, q, sf));
    RankInputs {
        tokens: dense.tokens,
        x,
        x_sf,
        topk_idx: dense.topk_idx,
        topk_weights: dense.topk_weights,
    }
}

/// A whole problem in memory (small configs; big ones go rank by rank through the CLI).
pub fn problem(opts: &GenOptions) -> Problem {
    let ranks = 0..opts.config.num_ranks;
    Problem {
        config: opts.config,
        weights: ranks
            .clone()
            .map(|r| rank_weights(opts, r, &ProgressBar::hidden()))
            .collect(),
        inputs: ranks.map(|r| rank_inputs(opts, r)).collect(),
    }
}

/// The unquantized twin of [`problem`]: per rank, weights and inputs.
pub fn dense_problem(opts: &GenOptions) -> (Vec<DenseWeights>, Vec<DenseInputs>) {
    let ranks = 0..opts.config.num_ranks;
    (
        ranks.clone().map(|r| dense_weights(opts, r)).collect(),
        ranks.map(|r| dense_inputs(opts, r)).collect(),
    )
}
