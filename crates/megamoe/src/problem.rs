//! The in-memory problem of DESIGN §1: per-rank quantized weights and inputs in the canonical
//! layout, their f32 twins for sanity checks (dequantized weights, unquantized tokens), the
//! canonical tensor shapes, and validation of contents with errors that name the tensor.

use crate::config::Config;
use fp_formats::quant::WEIGHT_BLOCK;
use fp_formats::{e2m1, e4m3, pack, ue8m0};

/// One rank's expert weights, canonical layout (see the README, "Problem directory format").
#[derive(Clone, Debug, PartialEq)]
pub struct RankWeights {
    /// `[E_l, 2I, H/2]` packed E2M1; rows 0..I gate, I..2I up.
    pub w1: Vec<u8>,
    /// `[E_l, 2I, H/32]` UE8M0.
    pub w1_sf: Vec<u8>,
    /// `[E_l, H, I/2]` packed E2M1.
    pub w2: Vec<u8>,
    /// `[E_l, H, I/32]` UE8M0.
    pub w2_sf: Vec<u8>,
}

/// One rank's tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct RankInputs {
    /// T.
    pub tokens: usize,
    /// `[T, H]` E4M3.
    pub x: Vec<u8>,
    /// `[T, H/G]` UE8M0.
    pub x_sf: Vec<u8>,
    /// `[T, k]` global expert ids, −1 = masked slot.
    pub topk_idx: Vec<i64>,
    /// `[T, k]`.
    pub topk_weights: Vec<f32>,
}

/// A whole problem: one entry per rank in `weights` and `inputs`.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub config: Config,
    pub weights: Vec<RankWeights>,
    pub inputs: Vec<RankInputs>,
}

/// f32 weights of one rank, `w1` `[E_l, 2I, H]`, `w2` `[E_l, H, I]`: the dequantized MXFP4
/// weights (exact in f32), for the f32 forward.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseWeights {
    pub w1: Vec<f32>,
    pub w2: Vec<f32>,
}

/// Unquantized f32 tokens of one rank (what the generator quantized), same routing.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseInputs {
    pub tokens: usize,
    /// `[T, H]`.
    pub x: Vec<f32>,
    pub topk_idx: Vec<i64>,
    pub topk_weights: Vec<f32>,
}

#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum ProblemError {
    #[error("tensor `{tensor}` has {len} elements, its shape {shape:?} needs {}", shape.iter().product::<usize>())]
    Len {
        tensor: &'static str,
        shape: Vec<usize>,
        len: usize,
    },
    #[error("tensor `{tensor}` has shape {got:?}, expected {expected:?}")]
    Shape {
        tensor: &'static str,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("tensor `{tensor}` has {got} tokens but `x` has {expected}")]
    Tokens {
        tensor: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("tensor `{tensor}`{index:?}: UE8M0 byte 255 is NaN")]
    NanScale {
        tensor: &'static str,
        index: Vec<usize>,
    },
    #[error("tensor `{tensor}`{index:?}: E4M3 code {code:#04x} is NaN")]
    NanCode {
        tensor: &'static str,
        index: Vec<usize>,
        code: u8,
    },
    #[error("tensor `{tensor}`{index:?}: code times its scale 2^{exponent} is not a finite f32")]
    NonFinite {
        tensor: &'static str,
        index: Vec<usize>,
        exponent: i32,
    },
    #[error(
        "tensor `topk_idx`[{token}, {slot}] = {value} is not a global expert id in -1..{experts}"
    )]
    ExpertIndex {
        token: usize,
        slot: usize,
        value: i64,
        experts: usize,
    },
    #[error("tensor `topk_weights`[{token}, {slot}] = {value} is not finite")]
    TopkWeight {
        token: usize,
        slot: usize,
        value: f32,
    },
    #[error("{got} rank(s) of {what} but num_ranks = {expected}")]
    RankCount {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("rank {rank}: {source}")]
    Rank {
        rank: usize,
        source: Box<ProblemError>,
    },
}

/// The canonical weight tensors of one rank: (name, shape).
pub fn weight_shapes(config: &Config) -> [(&'static str, Vec<usize>); 4] {
    let (e, h, i) = (
        config.experts_per_rank(),
        config.hidden,
        config.intermediate,
    );
    [
        ("w1", vec![e, 2 * i, h / 2]),
        ("w1_sf", vec![e, 2 * i, h / WEIGHT_BLOCK]),
        ("w2", vec![e, h, i / 2]),
        ("w2_sf", vec![e, h, i / WEIGHT_BLOCK]),
    ]
}

/// The canonical input tensors of one rank with `tokens` tokens: (name, shape).
pub fn input_shapes(config: &Config, tokens: usize) -> [(&'static str, Vec<usize>); 4] {
    let h = config.hidden;
    [
        ("x", vec![tokens, h]),
        ("x_sf", vec![tokens, h / config.act_group()]),
        ("topk_idx", vec![tokens, config.top_k]),
        ("topk_weights", vec![tokens, config.top_k]),
    ]
}

fn check_len(tensor: &'static str, shape: &[usize], len: usize) -> Result<(), ProblemError> {
    if shape.iter().product::<usize>() == len {
        Ok(())
    } else {
        Err(ProblemError::Len {
            tensor,
            shape: shape.to_vec(),
            len,
        })
    }
}

/// The multi-dimensional index of flat element `flat` in a row-major `shape`.
fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (i, &d) in shape.iter().enumerate().rev() {
        index[i] = flat % d;
        flat /= d;
    }
    index
}

/// Checks packed E2M1 elements (`elem_shape` counts elements, not bytes) with one scale per 32:
/// no NaN scale, and every dequantized value finite. Only blocks whose scale could overflow
/// (6·2^s not finite) need their codes looked at.
fn check_fp4(
    tensor: &'static str,
    sf_tensor: &'static str,
    elem_shape: &[usize],
    sf_shape: &[usize],
    packed: &[u8],
    sf: &[u8],
) -> Result<(), ProblemError> {
    for (block, &s) in sf.iter().enumerate() {
        if s == ue8m0::NAN {
            return Err(ProblemError::NanScale {
                tensor: sf_tensor,
                index: unravel(block, sf_shape),
            });
        }
        let scale = ue8m0::decode(s);
        if !(e2m1::MAX * scale).is_finite() {
            for i in block * WEIGHT_BLOCK..(block + 1) * WEIGHT_BLOCK {
                if !(e2m1::decode(pack::e2m1_at(packed, i)) * scale).is_finite() {
                    let index = unravel(i, elem_shape);
                    return Err(ProblemError::NonFinite {
                        tensor,
                        index,
                        exponent: ue8m0::exponent(s),
                    });
                }
            }
        }
    }
    Ok(())
}

impl RankWeights {
    /// Checks sizes against `config`, NaN scale bytes and non-finite dequantized values.
    pub fn validate(&self, config: &Config) -> Result<(), ProblemError> {
        let [(_, w1), (_, w1_sf), (_, w2), (_, w2_sf)] = weight_shapes(config);
        check_len("w1", &w1, self.w1.len())?;
        check_len("w1_sf", &w1_sf, self.w1_sf.len())?;
        check_len("w2", &w2, self.w2.len())?;
        check_len("w2_sf", &w2_sf, self.w2_sf.len())?;
        let elems = |packed: &[usize]| [packed[0], packed[1], packed[2] * 2];
        check_fp4("w1", "w1_sf", &elems(&w1), &w1_sf, &self.w1, &self.w1_sf)?;
        check_fp4("w2", "w2_sf", &elems(&w2), &w2_sf, &self.w2, &self.w2_sf)
    }

    /// The f32 values of the weights (exact: E2M1 times a power of two).
    pub fn dequantize(&self, config: &Config) -> DenseWeights {
        let deq = |packed: &[u8], sf: &[u8], k: usize| {
            let mut out = vec![0f32; packed.len() * 2];
            for ((p, s), o) in packed
                .chunks_exact(k / 2)
                .zip(sf.chunks_exact(k / WEIGHT_BLOCK))
                .zip(out.chunks_exact_mut(k))
            {
                fp_formats::quant::dequantize_fp4_row(p, s, o);
            }
            out
        };
        DenseWeights {
            w1: deq(&self.w1, &self.w1_sf, config.hidden),
            w2: deq(&self.w2, &self.w2_sf, config.intermediate),
        }
    }
}

impl RankInputs {
    /// The first `t` tokens (at most T) of these inputs of `config`'s shape.
    pub fn first(&self, config: &Config, t: usize) -> RankInputs {
        let (h, g, k) = (config.hidden, config.act_group(), config.top_k);
        let t = t.min(self.tokens);
        RankInputs {
            tokens: t,
            x: self.x[..t * h].to_vec(),
            x_sf: self.x_sf[..t * h / g].to_vec(),
            topk_idx: self.topk_idx[..t * k].to_vec(),
            topk_weights: self.topk_weights[..t * k].to_vec(),
        }
    }

    /// Checks sizes against `config`, NaN codes and scales, non-finite dequantized values,
    /// expert ids in −1..E and finite top-k weights.
    pub fn validate(&self, config: &Config) -> Result<(), ProblemError> {
        let [(_, x), (_, x_sf), (_, idx), (_, weights)] = input_shapes(config, self.tokens);
        check_len("x", &x, self.x.len())?;
        check_len("x_sf", &x_sf, self.x_sf.len())?;
        check_len("topk_idx", &idx, self.topk_idx.len())?;
        check_len("topk_weights", &weights, self.topk_weights.len())?;
        let g = config.act_group();
        for (block, &s) in self.x_sf.iter().enumerate() {
            if s == ue8m0::NAN {
                return Err(ProblemError::NanScale {
                    tensor: "x_sf",
                    index: unravel(block, &x_sf),
                });
            }
            let scale = ue8m0::decode(s);
            let finite_max = (e4m3::MAX * scale).is_finite();
            for (i, &code) in self.x.iter().enumerate().skip(block * g).take(g) {
                if code & 0x7f == e4m3::NAN {
                    return Err(ProblemError::NanCode {
                        tensor: "x",
                        index: unravel(i, &x),
                        code,
                    });
                }
                if !finite_max && !(e4m3::decode(code) * scale).is_finite() {
                    let index = unravel(i, &x);
                    return Err(ProblemError::NonFinite {
                        tensor: "x",
                        index,
                        exponent: ue8m0::exponent(s),
                    });
                }
            }
        }
        let k = config.top_k;
        for (i, (&e, &w)) in self.topk_idx.iter().zip(&self.topk_weights).enumerate() {
            let (token, slot) = (i / k, i % k);
            if e < -1 || e >= config.num_experts as i64 {
                return Err(ProblemError::ExpertIndex {
                    token,
                    slot,
                    value: e,
                    experts: config.num_experts,
                });
            }
            if !w.is_finite() {
                return Err(ProblemError::TopkWeight {
                    token,
                    slot,
                    value: w,
                });
            }
        }
        Ok(())
    }
}

impl Problem {
    /// Validates the config, the rank counts and every rank's tensors.
    pub fn validate(&self) -> Result<(), ProblemError> {
        self.config.validate()?;
        let expected = self.config.num_ranks;
        for (what, got) in [
            ("weights", self.weights.len()),
            ("inputs", self.inputs.len()),
        ] {
            if got != expected {
                return Err(ProblemError::RankCount {
                    what,
                    got,
                    expected,
                });
            }
        }
        for (rank, (w, x)) in self.weights.iter().zip(&self.inputs).enumerate() {
            let in_rank = |e: ProblemError| ProblemError::Rank {
                rank,
                source: Box::new(e),
            };
            w.validate(&self.config).map_err(in_rank)?;
            x.validate(&self.config).map_err(in_rank)?;
        }
        Ok(())
    }
}
