//! The random problem generator: weights and tokens whose quantization error is realistic and
//! differs between the recipes. Weights are Gaussian with a per-32-block magnitude factor
//! 2^U(−3,3) (so the MXFP4 scales of one row spread over a few binades, well inside the 14
//! that the g128 fold allows); tokens are Gaussian with per-32-block factors 2^U(−2,2) and a
//! few outlier channels 20–100× larger, as in real LLM activations; routing picks distinct
//! experts per token. Every weight row is drawn from its own ChaCha stream keyed by (seed,
//! layer, global expert, row) and every token from (seed, rank, token), so generation is
//! parallel, reproducible, and the same global problem comes out for any rank count.

use fp_formats::TieMode;
use fp_formats::quant::{self, WEIGHT_BLOCK};
use megamoe::config::Config;
use megamoe::problem::{DenseInputs, Problem, RankInputs, RankWeights};
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

/// Per-channel gain of the hidden dimension: a few outlier channels 20–100× the others, the
/// same for every token and rank (outliers are a property of the model), normalized to a mean
/// square of 1 so tokens stay O(1) whatever the share of the outliers.
fn channel_gains(seed: u64, hidden: usize) -> Vec<f32> {
    let mut rng = stream(seed, Stream::Outliers, 0, 0);
    let mut gains = vec![1f32; hidden];
    let count = (hidden / CHANNELS_PER_OUTLIER).max(2);
    for c in rand::seq::index::sample(&mut rng, hidden, count) {
        gains[c] = rng.random_range(OUTLIER_GAIN);
    }
    let rms = (gains.iter().map(|g| f64::from(g * g)).sum::<f64>() / hidden as f64).sqrt() as f32;
    gains.iter_mut().for_each(|g| *g /= rms);
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

/// Weight rows of one rank (for sizing a progress bar).
pub fn weight_rows(config: &Config) -> u64 {
    (config.experts_per_rank() * (2 * config.intermediate + config.hidden)) as u64
}

/// Quantized weights of `rank`: every row is drawn and quantized on the fly by the rayon pool
/// (never the whole rank in f32). Calls `progress(1)` once per row, from the pool's threads.
pub fn rank_weights(opts: &GenOptions, rank: usize, progress: impl Fn(u64) + Sync) -> RankWeights {
    let c = &opts.config;
    let first_expert = rank * c.experts_per_rank();
    let quantize = |layer: Layer| {
        let (per_expert, k) = layer.dims(c);
        let rows = per_expert * c.experts_per_rank();
        let mut packed = vec![0u8; rows * k / 2];
        let mut sf = vec![0u8; rows * k / WEIGHT_BLOCK];
        packed
            .par_chunks_mut(k / 2)
            .zip(sf.par_chunks_mut(k / WEIGHT_BLOCK))
            .enumerate()
            .for_each_init(
                || vec![0f32; k],
                |w, (r, (p, s))| {
                    weight_row(
                        opts.seed,
                        layer,
                        first_expert + r / per_expert,
                        r % per_expert,
                        w,
                    );
                    quant::quantize_fp4_row(w, TieMode::NearestEven, p, s);
                    progress(1);
                },
            );
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
            .map(|r| rank_weights(opts, r, |_| {}))
            .collect(),
        inputs: ranks.map(|r| rank_inputs(opts, r)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fp_formats::Recipe;

    fn opts(ranks: usize, recipe: Recipe) -> GenOptions {
        let config = Config::tiny().with_ranks(ranks).with_recipe(recipe);
        GenOptions {
            config,
            tokens: 200,
            seed: 11,
            mask_fraction: 0.25,
        }
    }

    #[test]
    fn reproducible_and_seed_dependent() {
        let a = problem(&opts(2, Recipe::Mx32));
        assert_eq!(a, problem(&opts(2, Recipe::Mx32)));
        let other = problem(&GenOptions {
            seed: 12,
            ..opts(2, Recipe::Mx32)
        });
        assert_ne!(a.weights[0].w1, other.weights[0].w1);
        assert_ne!(a.inputs[0].x, other.inputs[0].x);
        a.validate().unwrap();
    }

    /// Weights are keyed by global expert, so the rank count does not change them.
    #[test]
    fn weights_do_not_depend_on_the_rank_split() {
        let one = rank_weights(&opts(1, Recipe::Mx32), 0, |_| {});
        let two: Vec<RankWeights> = (0..2)
            .map(|r| rank_weights(&opts(2, Recipe::Mx32), r, |_| {}))
            .collect();
        assert_eq!(one.w1, [two[0].w1.clone(), two[1].w1.clone()].concat());
        assert_eq!(
            one.w2_sf,
            [two[0].w2_sf.clone(), two[1].w2_sf.clone()].concat()
        );
    }

    #[test]
    fn routing_is_distinct_in_range_and_masked_as_asked() {
        let o = opts(1, Recipe::Mx32);
        let (k, e) = (o.config.top_k, o.config.num_experts as i64);
        let (idx, weights) = routing(&GenOptions { tokens: 2000, ..o }, 0);
        for (token, w) in idx.chunks(k).zip(weights.chunks(k)) {
            let valid: Vec<i64> = token.iter().copied().filter(|&x| x >= 0).collect();
            assert!(valid.iter().all(|&x| x < e));
            let mut dedup = valid.clone();
            dedup.sort_unstable();
            dedup.dedup();
            assert_eq!(
                dedup.len(),
                valid.len(),
                "experts of a token must be distinct: {token:?}"
            );
            assert!(w.iter().sum::<f32>() <= 1.0 + 1e-6 && w.iter().all(|&v| v >= 0.0));
        }
        let masked = idx.iter().filter(|&&x| x < 0).count() as f64 / idx.len() as f64;
        assert!((masked - 0.25).abs() < 0.03, "masked fraction {masked}");
    }

    /// The per-32 weight scales of one 128-block spread over a few binades (never beyond the 14
    /// that the g128 fold can take), and the per-32 activation scales of one 128-block differ,
    /// so a kernel that reads the wrong scale is caught.
    #[test]
    fn scales_spread_but_fit_the_g128_fold() {
        let p = problem(&opts(1, Recipe::Mx32));
        let mut widest = 0;
        for sf in [&p.weights[0].w1_sf, &p.weights[0].w2_sf] {
            for block in sf.chunks(4) {
                let span = block.iter().max().unwrap() - block.iter().min().unwrap();
                widest = widest.max(span);
            }
        }
        assert!(
            (3..=8).contains(&widest),
            "weight scale span within 128 channels: {widest} binades"
        );
        let varied = p.inputs[0]
            .x_sf
            .chunks(4)
            .filter(|b| b.iter().any(|&s| s != b[0]))
            .count();
        assert!(
            varied * 2 > p.inputs[0].x_sf.len() / 4,
            "only {varied} 128-blocks have varied activation scales"
        );
    }

    #[test]
    fn activations_have_outlier_channels() {
        let x = dense_inputs(&opts(1, Recipe::Mx32), 0);
        let h = Config::tiny().hidden;
        let mut channel_rms = vec![0f64; h];
        for row in x.x.chunks(h) {
            for (acc, &v) in channel_rms.iter_mut().zip(row) {
                *acc += f64::from(v * v) / x.tokens as f64;
            }
        }
        let mut sorted: Vec<f64> = channel_rms.iter().map(|v| v.sqrt()).collect();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[h / 2];
        assert!(
            sorted[h - 1] > 15.0 * median,
            "largest channel {} vs median {median}",
            sorted[h - 1]
        );
        assert!(
            sorted[h - 3] < 3.0 * median,
            "only a few channels should be outliers"
        );
    }
}
