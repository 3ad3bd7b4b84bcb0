//! Helpers for the tests of the crates that run problems: temporary directories, small generated
//! problems, skewed routing and re-splitting one global problem over a different number of ranks.

use crate::generate::{self, GenOptions};
use megamoe::{Config, Problem, RankInputs, RankWeights, Recipe};
use std::path::PathBuf;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("megamoe-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn tiny_opts(
    ranks: usize,
    tokens: usize,
    recipe: Recipe,
    clamp: Option<f32>,
    mask_fraction: f64,
) -> GenOptions {
    GenOptions {
        config: Config::tiny()
            .with_ranks(ranks)
            .with_recipe(recipe)
            .with_clamp(clamp),
        tokens,
        seed: 7,
        mask_fraction,
    }
}

pub fn tiny_problem(
    ranks: usize,
    tokens: usize,
    recipe: Recipe,
    clamp: Option<f32>,
    mask_fraction: f64,
) -> Problem {
    generate::problem(&tiny_opts(ranks, tokens, recipe, clamp, mask_fraction))
}

/// A generated problem of `config`: `tokens` per rank from `seed`, `mask_fraction` of the slots
/// masked.
pub fn generated_problem(config: Config, tokens: usize, seed: u64, mask_fraction: f64) -> Problem {
    generate::problem(&GenOptions {
        config,
        tokens,
        seed,
        mask_fraction,
    })
}

/// Routes most slots of most tokens to experts of the last rank (expert E−1−j for slot j), and
/// masks every slot of token 3: one owner gets most rows, some tokens none.
pub fn skew(problem: &mut Problem) {
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

/// Splits `v` into `parts` equal pieces.
fn split_even<T: Clone>(v: &[T], parts: usize) -> Vec<Vec<T>> {
    v.chunks(v.len() / parts).map(<[T]>::to_vec).collect()
}

/// The same global problem (all experts, all tokens in rank order) over `token_counts.len()`
/// ranks, rank r getting the next `token_counts[r]` tokens. Weights are expert-major, so
/// concatenating and re-splitting the byte vectors moves whole experts.
pub fn resplit(p: &Problem, token_counts: &[usize]) -> Problem {
    let ranks = token_counts.len();
    let config = p.config.with_ranks(ranks);
    let cat = |f: fn(&RankWeights) -> &Vec<u8>| -> Vec<Vec<u8>> {
        split_even(
            &p.weights
                .iter()
                .flat_map(|w| f(w).iter().copied())
                .collect::<Vec<_>>(),
            ranks,
        )
    };
    let (w1, w1_sf, w2, w2_sf) = (
        cat(|w| &w.w1),
        cat(|w| &w.w1_sf),
        cat(|w| &w.w2),
        cat(|w| &w.w2_sf),
    );
    let weights = (0..ranks)
        .map(|r| RankWeights {
            w1: w1[r].clone(),
            w1_sf: w1_sf[r].clone(),
            w2: w2[r].clone(),
            w2_sf: w2_sf[r].clone(),
        })
        .collect();
    let (h, g, k) = (config.hidden, config.act_group(), config.top_k);
    let all = merge_inputs(&p.inputs);
    assert_eq!(token_counts.iter().sum::<usize>(), all.tokens);
    let mut start = 0;
    let inputs = token_counts
        .iter()
        .map(|&t| {
            let rows = start..start + t;
            start += t;
            RankInputs {
                tokens: t,
                x: all.x[rows.start * h..rows.end * h].to_vec(),
                x_sf: all.x_sf[rows.start * h / g..rows.end * h / g].to_vec(),
                topk_idx: all.topk_idx[rows.start * k..rows.end * k].to_vec(),
                topk_weights: all.topk_weights[rows.start * k..rows.end * k].to_vec(),
            }
        })
        .collect();
    Problem {
        config,
        weights,
        inputs,
    }
}

/// All ranks' tokens as one rank, in rank order.
pub fn merge_inputs(inputs: &[RankInputs]) -> RankInputs {
    RankInputs {
        tokens: inputs.iter().map(|x| x.tokens).sum(),
        x: inputs.iter().flat_map(|x| x.x.iter().copied()).collect(),
        x_sf: inputs.iter().flat_map(|x| x.x_sf.iter().copied()).collect(),
        topk_idx: inputs
            .iter()
            .flat_map(|x| x.topk_idx.iter().copied())
            .collect(),
        topk_weights: inputs
            .iter()
            .flat_map(|x| x.topk_weights.iter().copied())
            .collect(),
    }
}
