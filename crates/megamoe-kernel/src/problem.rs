//! Grouped-GEMM problems on the host: random expert weights and expert-contiguous activation
//! pools, their device images for either tensor-core route, and the contract's reference result (exact
//! products summed in f64, rounded once to f32, then to BF16). Used by the GPU tests and the
//! benchmark; the data tells the recipes apart (per-32 block magnitudes over several binades,
//! activation outlier channels).

use fp_formats::{Recipe, TieMode, bf16, e4m3, pack, quant, ue8m0};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

use crate::gemm::Mma;
use crate::pool_order;
use crate::protocol::POOL_ROW_ALIGN;
use crate::transform::BLOCK_K;

/// Canonical MXFP4 weights of `experts` experts, `n` rows by `k`.
pub struct ExpertWeights {
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    /// Packed E2M1 `[experts][n][k/2]`.
    pub w: Vec<u8>,
    /// UE8M0 `[experts][n][k/32]`.
    pub w_sf: Vec<u8>,
}

impl ExpertWeights {
    /// Gaussian rows (σ = 1/√k) times a per-32 block factor 2^U{-3..3}, quantized to MXFP4.
    pub fn random(experts: usize, n: usize, k: usize, seed: u64) -> Self {
        let mut w = vec![0u8; experts * n * k / 2];
        let mut w_sf = vec![0u8; experts * n * k / 32];
        w.par_chunks_mut(k / 2)
            .zip(w_sf.par_chunks_mut(k / 32))
            .enumerate()
            .for_each(|(row, (wr, sr))| {
                let mut rng = ChaCha8Rng::seed_from_u64(
                    seed ^ (row as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
                let sigma = 1.0 / (k as f32).sqrt();
                let mut vals = vec![0f32; k];
                for block in vals.chunks_mut(32) {
                    let factor = fp_formats::pow2(rng.random_range(-3..=3));
                    for v in block {
                        let g: f32 = StandardNormal.sample(&mut rng);
                        *v = g * sigma * factor;
                    }
                }
                quant::quantize_fp4_row(&vals, TieMode::NearestEven, wr, sr);
            });
        Self {
            experts,
            n,
            k,
            w,
            w_sf,
        }
    }

    /// Random codes and scale bytes in a narrow range: realistic bytes without the cost of
    /// quantizing, for benchmarks of the largest shapes.
    pub fn random_codes(experts: usize, n: usize, k: usize, seed: u64) -> Self {
        let mut w = vec![0u8; experts * n * k / 2];
        let mut w_sf = vec![0u8; experts * n * k / 32];
        w.par_chunks_mut(1 << 20)
            .enumerate()
            .for_each(|(i, c)| ChaCha8Rng::seed_from_u64(seed + i as u64).fill(c));
        w_sf.par_chunks_mut(1 << 16).enumerate().for_each(|(i, c)| {
            let mut rng = ChaCha8Rng::seed_from_u64(!seed + i as u64);
            c.iter_mut().for_each(|b| *b = rng.random_range(118..=122));
        });
        Self {
            experts,
            n,
            k,
            w,
            w_sf,
        }
    }

    /// The dequantized weight `w_e[row][col]`.
    pub fn value(&self, e: usize, row: usize, col: usize) -> f32 {
        let at = (e * self.n + row) * self.k + col;
        fp_formats::e2m1::decode(pack::e2m1_at(&self.w, at)) * ue8m0::decode(self.w_sf[at / 32])
    }
}

/// An expert-contiguous FP8 activation pool with one UE8M0 scale per token per `recipe.group()`.
pub struct ActPool {
    pub recipe: Recipe,
    pub k: usize,
    pub expert_offset: Vec<i32>,
    pub expert_rows: Vec<i32>,
    /// Pool rows, padding between experts included.
    pub rows: usize,
    /// E4M3 `[rows][k]` (padding rows hold random data too: the GEMM must ignore them).
    pub q: Vec<u8>,
    /// UE8M0 `[rows][k/G]`.
    pub sf: Vec<u8>,
}

impl ActPool {
    /// Rows of N(0,1) times a per-32 block factor 2^U{-2..2}, with every 97th channel an outlier
    /// (×48), quantized per `recipe.group()` channels.
    pub fn random(recipe: Recipe, expert_rows: &[usize], k: usize, seed: u64) -> Self {
        let mut expert_offset = Vec::with_capacity(expert_rows.len());
        let mut rows = 0;
        for &r in expert_rows {
            expert_offset.push(rows as i32);
            rows = (rows + r).next_multiple_of(POOL_ROW_ALIGN);
        }
        let g = recipe.group();
        let mut q = vec![0u8; rows * k];
        let mut sf = vec![0u8; rows * k / g];
        q.par_chunks_mut(k)
            .zip(sf.par_chunks_mut(k / g))
            .enumerate()
            .for_each(|(row, (qr, sr))| {
                let mut rng = ChaCha8Rng::seed_from_u64(
                    seed ^ (row as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
                );
                let mut vals = vec![0f32; k];
                for (b, block) in vals.chunks_mut(32).enumerate() {
                    let factor = fp_formats::pow2(rng.random_range(-2..=2));
                    for (i, v) in block.iter_mut().enumerate() {
                        let outlier = if (b * 32 + i) % 97 == 0 { 48.0 } else { 1.0 };
                        let x: f32 = StandardNormal.sample(&mut rng);
                        *v = x * factor * outlier;
                    }
                }
                quant::quantize_act_row(&vals, g, qr, sr);
            });
        let expert_rows = expert_rows.iter().map(|&r| r as i32).collect();
        Self {
            recipe,
            k,
            expert_offset,
            expert_rows,
            rows,
            q,
            sf,
        }
    }

    pub fn value(&self, row: usize, col: usize) -> f32 {
        let g = self.recipe.group();
        e4m3::decode(self.q[row * self.k + col])
            * ue8m0::decode(self.sf[row * self.k / g + col / g])
    }

    /// Scale stride of the FP8 route's device image: every tile of `max_tile` rows reads in bounds.
    pub fn sf_stride(&self, max_tile: usize) -> usize {
        (self.rows + max_tile).next_multiple_of(POOL_ROW_ALIGN)
    }

    /// The pool as the GEMM of route `mma` reads it: the activations (BF16 widened, or E4M3) in
    /// the pool's channel order ([`pool_order`]) and, for FP8, the token scales as f32
    /// `[k/128][sf_stride]`, MN-major, each 16 rows in [`pool_order::scale_column`] order. FP8 needs
    /// a g128 pool.
    pub fn device_image(&self, mma: Mma, sf_stride: usize) -> (Vec<u8>, Option<Vec<u8>>) {
        let widened;
        let natural: &[u8] = match mma {
            Mma::Bf16 => {
                widened = self.widened();
                &widened
            }
            Mma::Fp8 => &self.q,
        };
        let row_bytes = self.k * mma.act_elem();
        let mut act = vec![0u8; natural.len()];
        act.par_chunks_mut(row_bytes)
            .zip(natural.par_chunks(row_bytes))
            .for_each(|(out, row)| pool_order::permute_row(mma, row, out));
        (act, (mma == Mma::Fp8).then(|| self.fp8_scales(sf_stride)))
    }

    fn fp8_scales(&self, sf_stride: usize) -> Vec<u8> {
        assert_eq!(
            self.recipe,
            Recipe::G128,
            "the FP8 route takes per-128 scales"
        );
        let blocks = self.k / BLOCK_K;
        let mut table = vec![1.0f32; blocks * sf_stride];
        for row in 0..self.rows {
            for kb in 0..blocks {
                table[kb * sf_stride + pool_order::scale_column(row)] =
                    ue8m0::decode(self.sf[row * blocks + kb]);
            }
        }
        table.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    /// BF16 bits of E4M3 × 2^scale (exact for either group), `[rows][k]`, as bytes.
    fn widened(&self) -> Vec<u8> {
        (0..self.rows * self.k)
            .into_par_iter()
            .flat_map_iter(|i| {
                let v = self.value(i / self.k, i % self.k);
                debug_assert_eq!(bf16::from_f32(v).to_f32(), v);
                bf16::from_f32(v).to_bits().to_le_bytes()
            })
            .collect()
    }
}

/// The contract's L1/L2 GEMM for pool rows `rows` of expert `e`: for every weight row, BF16 of the
/// f64-accumulated sum of exact products.
pub fn reference_rows(
    weights: &ExpertWeights,
    pool: &ActPool,
    e: usize,
    rows: &[usize],
) -> Vec<Vec<u16>> {
    let (n, k) = (weights.n, weights.k);
    let w: Vec<f32> = (0..n * k)
        .into_par_iter()
        .map(|i| weights.value(e, i / k, i % k))
        .collect();
    rows.iter()
        .map(|&row| {
            let act: Vec<f64> = (0..k).map(|c| pool.value(row, c) as f64).collect();
            w.par_chunks(k)
                .map(|wr| {
                    let sum: f64 = act.iter().zip(wr).map(|(&a, &b)| a * b as f64).sum();
                    bf16::from_f32(sum as f32).to_bits()
                })
                .collect()
        })
        .collect()
}
