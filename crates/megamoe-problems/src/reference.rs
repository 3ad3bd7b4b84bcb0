//! The CPU reference of the numeric contract (DESIGN §1): Linear1 → SwiGLU → re-quantize →
//! Linear2 per (token, expert) pair, and the combine on each token's own rank, for any rank
//! split and both recipes. Every GEMM sums exact products in f64 and rounds once to f32, so a
//! (token, expert) result does not depend on which rows share its call or on the rank split.
//!
//! Entry points: [`l1_rows`] / [`l2_rows`] (one layer on a list of rows of one rank, for GEMM
//! tests), [`Forward`] / [`forward`] (the whole layer), [`forward_f32`] (the layer in f32, for sanity checks).
//!
//! The per-block pieces ([`l1_acc`], [`l1_epilogue_row`], [`l2_acc`], [`combine_token`]) are
//! the ONE implementation of the per-row math: the CPU dataflow engine (`megamoe-dataflow`)
//! calls them on its pool blocks, which is why its results are bitwise equal to [`forward`].

use fp_formats::quant::WEIGHT_BLOCK;
use fp_formats::{bf16, bf16_rn, e2m1, quant, ue8m0};
use megamoe::config::Config;
use megamoe::problem::{DenseInputs, DenseWeights, RankInputs, RankWeights};
use rayon::prelude::*;
use std::ops::Range;

#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum ReferenceError {
    #[error(
        "L1 output h = {value} (rank-local expert {expert}, its row {row}) is not finite: it has no UE8M0 scale"
    )]
    NonFiniteL1 {
        expert: usize,
        row: usize,
        value: f32,
    },
}

/// FP8 E4M3 rows with one UE8M0 scale per G channels: the re-quantized L1 output.
#[derive(Clone, Debug, PartialEq)]
pub struct ActRows {
    /// `[rows, I]` E4M3 codes.
    pub q: Vec<u8>,
    /// `[rows, I/G]` UE8M0 bytes.
    pub sf: Vec<u8>,
}

/// Where one row of an [`l1_rows`] call goes: its rank-local expert and its slot's top-k weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowRoute {
    pub expert: usize,
    pub weight: f32,
}

/// Weight rows decoded per parallel task; every N (2I or H) is a multiple of 128.
const ROW_BLOCK: usize = 8;
/// Weight rows and token rows of one register tile.
const TILE_N: usize = 4;
const TILE_M: usize = 2;
/// f64 lanes per accumulator (the sum order is implementation-defined, DESIGN §1).
const LANES: usize = 4;

/// Where a GEMM runs: spread over rayon's pool (the reference's whole-layer calls), or on the
/// calling thread (a dataflow worker, already one of many threads, computing one block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exec {
    Rayon,
    Here,
}

/// `acc[n][i] = f32(Σ_k a[i][k]·b[n][k])`, the sum in f64 and rounded once. `a` holds rows of
/// `k` f64 values; `decode_b(n, row)` writes weight row `n` of `n_rows`. Returned n-major.
fn gemm_f64(
    a: &[f64],
    k: usize,
    n_rows: usize,
    decode_b: impl Fn(usize, &mut [f64]) + Sync,
    exec: Exec,
) -> Vec<f32> {
    assert_eq!(
        n_rows % ROW_BLOCK,
        0,
        "weight rows {n_rows} are not a multiple of {ROW_BLOCK}"
    );
    let m = a.len() / k;
    let mut out = vec![0f32; n_rows * m];
    if m == 0 {
        return out;
    }
    // Decoding a weight row once per task and reusing it for every token row is what makes
    // few-tokens-per-expert problems cheap.
    let task = |b: &mut Vec<f64>, (block, out): (usize, &mut [f32])| {
        for (r, row) in b.chunks_exact_mut(k).enumerate() {
            decode_b(block * ROW_BLOCK + r, row);
        }
        dot_block(a, b, k, out);
    };
    let scratch = || vec![0f64; ROW_BLOCK * k];
    match exec {
        Exec::Rayon => out
            .par_chunks_mut(ROW_BLOCK * m)
            .enumerate()
            .for_each_init(scratch, task),
        Exec::Here => {
            let mut b = scratch();
            out.chunks_mut(ROW_BLOCK * m)
                .enumerate()
                .for_each(|item| task(&mut b, item));
        }
    }
    out
}

/// `out[n][i]` for the `ROW_BLOCK` decoded weight rows `b` against all rows of `a`.
fn dot_block(a: &[f64], b: &[f64], k: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA are present, checked just above.
        return unsafe { avx2::dot_block(a, b, k, out) };
    }
    dot_block_with(a, b, k, out, tile_portable::<1>, tile_portable::<TILE_M>)
}

/// Walks `out` in tiles of `TILE_M` token rows × `TILE_N` weight rows (one token row at the
/// tail), with `tile1` / `tile2` computing a tile of 1 or `TILE_M` token rows.
#[inline(always)]
fn dot_block_with(
    a: &[f64],
    b: &[f64],
    k: usize,
    out: &mut [f32],
    tile1: impl Fn([&[f64]; 1], [&[f64]; TILE_N]) -> [[f32; TILE_N]; 1],
    tile2: impl Fn([&[f64]; TILE_M], [&[f64]; TILE_N]) -> [[f32; TILE_N]; TILE_M],
) {
    let m = a.len() / k;
    let row = |i: usize| &a[i * k..(i + 1) * k];
    for (n0, bs) in b.chunks_exact(TILE_N * k).enumerate() {
        let brows: [&[f64]; TILE_N] = std::array::from_fn(|j| &bs[j * k..(j + 1) * k]);
        let mut store = |i0: usize, acc: &[[f32; TILE_N]]| {
            for (di, sums) in acc.iter().enumerate() {
                for (j, &v) in sums.iter().enumerate() {
                    out[(n0 * TILE_N + j) * m + i0 + di] = v;
                }
            }
        };
        let mut i0 = 0;
        while i0 + TILE_M <= m {
            store(i0, &tile2(std::array::from_fn(|i| row(i0 + i)), brows));
            i0 += TILE_M;
        }
        if i0 < m {
            store(i0, &tile1([row(i0)], brows));
        }
    }
}

/// Sums the LANES partial sums of one dot product, lane 0 first, and rounds once to f32.
#[inline(always)]
fn finish_lanes(lanes: [f64; LANES]) -> f32 {
    lanes.iter().sum::<f64>() as f32
}

/// One register tile of MR token rows × TILE_N weight rows, LANES partial sums each: partial
/// sum l of a dot product collects the products at k ≡ l (mod LANES).
fn tile_portable<const MR: usize>(a: [&[f64]; MR], b: [&[f64]; TILE_N]) -> [[f32; TILE_N]; MR] {
    let mut acc = [[[0f64; LANES]; TILE_N]; MR];
    for c in (0..a[0].len()).step_by(LANES) {
        for i in 0..MR {
            for j in 0..TILE_N {
                for l in 0..LANES {
                    // Exact: both factors have at most 4 significant bits.
                    acc[i][j][l] += a[i][c + l] * b[j][c + l];
                }
            }
        }
    }
    acc.map(|row| row.map(finish_lanes))
}

/// The same tiles with AVX2 + FMA: one 4-lane register per partial-sum vector, so the sums are
/// bit-identical to the portable path (a fused multiply-add of an exact product rounds once,
/// like the separate add).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{LANES, TILE_M, TILE_N, dot_block_with, finish_lanes};
    use std::arch::x86_64::*;

    const _: () = assert!(LANES == 4, "one __m256d per partial-sum vector");

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_block(a: &[f64], b: &[f64], k: usize, out: &mut [f32]) {
        // SAFETY (both closures): this function only runs where AVX2 and FMA are present.
        dot_block_with(
            a,
            b,
            k,
            out,
            |a, b| unsafe { tile::<1>(a, b) },
            |a, b| unsafe { tile::<TILE_M>(a, b) },
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const MR: usize>(a: [&[f64]; MR], b: [&[f64]; TILE_N]) -> [[f32; TILE_N]; MR] {
        let k = a[0].len();
        assert!(k.is_multiple_of(LANES) && a.iter().chain(&b).all(|r| r.len() == k));
        let mut acc = [[_mm256_setzero_pd(); TILE_N]; MR];
        for c in (0..k).step_by(LANES) {
            // SAFETY: c + LANES ≤ k = the length of every row, asserted above.
            let bv: [__m256d; TILE_N] =
                std::array::from_fn(|j| unsafe { _mm256_loadu_pd(b[j].as_ptr().add(c)) });
            for i in 0..MR {
                // SAFETY: as above.
                let av = unsafe { _mm256_loadu_pd(a[i].as_ptr().add(c)) };
                for j in 0..TILE_N {
                    acc[i][j] = _mm256_fmadd_pd(av, bv[j], acc[i][j]);
                }
            }
        }
        acc.map(|row| {
            row.map(|v| {
                let mut lanes = [0f64; LANES];
                // SAFETY: `lanes` holds exactly one __m256d.
                unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), v) };
                finish_lanes(lanes)
            })
        })
    }
}

/// Decodes one packed MXFP4 row to f64 (each value is exact, as it is in f32 for valid data).
fn decode_fp4_row(packed: &[u8], sf: &[u8], out: &mut [f64]) {
    let values: [f64; 16] = std::array::from_fn(|c| e2m1::decode(c as u8) as f64);
    for ((bytes, &s), o) in packed
        .chunks_exact(WEIGHT_BLOCK / 2)
        .zip(sf)
        .zip(out.chunks_exact_mut(WEIGHT_BLOCK))
    {
        let scale = ue8m0::decode(s) as f64;
        for (pair, &byte) in o.chunks_exact_mut(2).zip(bytes) {
            pair[0] = values[(byte & 0xf) as usize] * scale;
            pair[1] = values[(byte >> 4) as usize] * scale;
        }
    }
}

/// Dequantizes FP8 rows of `width` channels with scales per `g` to f64.
pub fn dequantize_act(q: &[u8], sf: &[u8], width: usize, g: usize) -> Vec<f64> {
    let mut row = vec![0f32; width];
    let mut out = Vec::with_capacity(q.len());
    for (qr, sr) in q.chunks_exact(width).zip(sf.chunks_exact(width / g)) {
        quant::dequantize_act_row(qr, sr, g, &mut row);
        out.extend(row.iter().map(|&v| f64::from(v)));
    }
    out
}

/// SwiGLU of DESIGN §1 step 2 on already-rounded g and u: clamp, `(silu(g)·u)·weight` in f32.
#[inline]
fn swiglu(g: f32, u: f32, clamp: Option<f32>, weight: f32) -> f32 {
    let (g, u) = match clamp {
        Some(c) => (g.min(c), u.clamp(-c, c)),
        None => (g, u),
    };
    let silu = g / (1.0 + (-g).exp());
    (silu * u) * weight
}

/// Packed codes and scales of row `n` of rank-local `expert`'s `w1`.
fn w1_row<'w>(
    config: &Config,
    weights: &'w RankWeights,
    expert: usize,
    n: usize,
) -> (&'w [u8], &'w [u8]) {
    let (h, rows) = (config.hidden, 2 * config.intermediate);
    let r = expert * rows + n;
    (
        &weights.w1[r * h / 2..][..h / 2],
        &weights.w1_sf[r * h / WEIGHT_BLOCK..][..h / WEIGHT_BLOCK],
    )
}

/// Packed codes and scales of row `n` of rank-local `expert`'s `w2`.
fn w2_row<'w>(
    config: &Config,
    weights: &'w RankWeights,
    expert: usize,
    n: usize,
) -> (&'w [u8], &'w [u8]) {
    let (i, rows) = (config.intermediate, config.hidden);
    let r = expert * rows + n;
    (
        &weights.w2[r * i / 2..][..i / 2],
        &weights.w2_sf[r * i / WEIGHT_BLOCK..][..i / WEIGHT_BLOCK],
    )
}

/// Linear1 accumulators (step 1) of `m` rows for `len` h channels: for each channel its gate
/// row and its up row, n-major.
pub struct L1Acc {
    /// `[2·len][m]`: the gate rows of the channels, then their up rows.
    acc: Vec<f32>,
    m: usize,
    len: usize,
}

impl L1Acc {
    /// The (gate, up) accumulators of row `r`, channel `c` (both counted from the call's start).
    #[inline]
    fn gate_up(&self, r: usize, c: usize) -> (f32, f32) {
        (
            self.acc[c * self.m + r],
            self.acc[(self.len + c) * self.m + r],
        )
    }
}

/// Linear1 of rows `a` (dequantized, f64 `[m, H]`) on rank-local `expert` for the h channels
/// `channels` (a multiple of 4 of them).
pub fn l1_acc(
    config: &Config,
    weights: &RankWeights,
    expert: usize,
    a: &[f64],
    channels: Range<usize>,
    exec: Exec,
) -> L1Acc {
    let (h, i, len) = (config.hidden, config.intermediate, channels.len());
    let w1_row_of = |n: usize| {
        if n < len {
            channels.start + n
        } else {
            i + channels.start + n - len
        }
    };
    let acc = gemm_f64(
        a,
        h,
        2 * len,
        |n, row| {
            let (packed, sf) = w1_row(config, weights, expert, w1_row_of(n));
            decode_fp4_row(packed, sf, row)
        },
        exec,
    );
    L1Acc {
        acc,
        m: a.len() / h,
        len,
    }
}

/// Steps 2–3 for row `r` of `acc`: SwiGLU × `weight` of every channel into `h` (`len` long),
/// then the re-quantization per G into `q` (`len` codes) and `sf` (`len/G` scale bytes); the
/// channels must start on a G boundary. `Err(h)` with the first h that is not finite (it has
/// no scale).
pub fn l1_epilogue_row(
    config: &Config,
    acc: &L1Acc,
    r: usize,
    weight: f32,
    h: &mut [f32],
    q: &mut [u8],
    sf: &mut [u8],
) -> Result<(), f32> {
    assert_eq!(h.len(), acc.len, "one h per accumulated channel");
    for (c, hv) in h.iter_mut().enumerate() {
        let (g, u) = acc.gate_up(r, c);
        *hv = swiglu(bf16_rn(g), bf16_rn(u), config.clamp, weight);
    }
    if let Some(&value) = h.iter().find(|v| !v.is_finite()) {
        return Err(value);
    }
    quant::requantize_row(h, config.act_group(), q, sf);
    Ok(())
}

/// Linear2 accumulators (step 4) of `m` rows for a range of output columns, n-major.
pub struct L2Acc {
    /// `[len][m]`.
    acc: Vec<f32>,
    m: usize,
}

impl L2Acc {
    /// Step 4's result for row `r`, column `c` (counted from the call's first column): BF16.
    #[inline]
    pub fn bf16(&self, r: usize, c: usize) -> bf16 {
        bf16::from_f32(self.acc[c * self.m + r])
    }
}

/// Linear2 of re-quantized rows `a` (dequantized, f64 `[m, I]`) on rank-local `expert` for
/// the output columns `cols` (a multiple of 8 of them).
pub fn l2_acc(
    config: &Config,
    weights: &RankWeights,
    expert: usize,
    a: &[f64],
    cols: Range<usize>,
    exec: Exec,
) -> L2Acc {
    let i = config.intermediate;
    let acc = gemm_f64(
        a,
        i,
        cols.len(),
        |n, row| {
            let (packed, sf) = w2_row(config, weights, expert, cols.start + n);
            decode_fp4_row(packed, sf, row)
        },
        exec,
    );
    L2Acc {
        acc,
        m: a.len() / i,
    }
}

/// L1 + SwiGLU + re-quantization of rows that all go to rank-local `expert`.
fn expert_l1(
    config: &Config,
    weights: &RankWeights,
    expert: usize,
    x: &[u8],
    x_sf: &[u8],
    topk_weights: &[f32],
) -> Result<ActRows, ReferenceError> {
    let (h, i, g) = (config.hidden, config.intermediate, config.act_group());
    let a = dequantize_act(x, x_sf, h, g);
    let acc = l1_acc(config, weights, expert, &a, 0..i, Exec::Rayon);
    let m = topk_weights.len();
    let mut out = ActRows {
        q: vec![0; m * i],
        sf: vec![0; m * i / g],
    };
    let mut h_row = vec![0f32; i];
    for (((r, &w), q), sf) in topk_weights
        .iter()
        .enumerate()
        .zip(out.q.chunks_exact_mut(i))
        .zip(out.sf.chunks_exact_mut(i / g))
    {
        l1_epilogue_row(config, &acc, r, w, &mut h_row, q, sf).map_err(|value| {
            ReferenceError::NonFiniteL1 {
                expert,
                row: r,
                value,
            }
        })?;
    }
    Ok(out)
}

/// L2 of re-quantized rows that all go to rank-local `expert`: `[rows, H]` BF16.
fn expert_l2(config: &Config, weights: &RankWeights, expert: usize, h_rows: &ActRows) -> Vec<bf16> {
    let (h, i, g) = (config.hidden, config.intermediate, config.act_group());
    let a = dequantize_act(&h_rows.q, &h_rows.sf, i, g);
    let acc = l2_acc(config, weights, expert, &a, 0..h, Exec::Rayon);
    (0..a.len() / i * h)
        .map(|e| acc.bf16(e / h, e % h))
        .collect()
}

/// Row indices grouped by their expert (ascending), each group in call order.
fn group_by_expert(
    experts: impl Iterator<Item = usize>,
    experts_per_rank: usize,
) -> Vec<Vec<usize>> {
    let mut groups = vec![Vec::new(); experts_per_rank];
    for (row, e) in experts.enumerate() {
        assert!(
            e < experts_per_rank,
            "rank-local expert {e} is not below E_l = {experts_per_rank}"
        );
        groups[e].push(row);
    }
    groups
}

/// The rows `rows` of a row-major matrix of `width` columns, in that order.
fn gather<T: Copy>(src: &[T], width: usize, rows: &[usize]) -> Vec<T> {
    rows.iter()
        .flat_map(|&r| &src[r * width..(r + 1) * width])
        .copied()
        .collect()
}

/// Writes consecutive rows of `part` to rows `rows` of `dst`.
fn scatter<T: Copy>(part: &[T], width: usize, rows: &[usize], dst: &mut [T]) {
    for (src, &r) in part.chunks_exact(width).zip(rows) {
        dst[r * width..(r + 1) * width].copy_from_slice(src);
    }
}

/// L1 + SwiGLU + re-quantization (DESIGN §1 steps 1–3) of rows `x` `[rows, H]` with scales
/// `x_sf` `[rows, H/G]` on one rank's weights; `routes[r]` gives row r's rank-local expert and
/// top-k weight. Returns the FP8 rows `[rows, I]` and scales `[rows, I/G]` in row order.
pub fn l1_rows(
    config: &Config,
    weights: &RankWeights,
    x: &[u8],
    x_sf: &[u8],
    routes: &[RowRoute],
) -> Result<ActRows, ReferenceError> {
    let (h, i, g) = (config.hidden, config.intermediate, config.act_group());
    assert_eq!(
        x.len(),
        routes.len() * h,
        "x does not hold one row per route"
    );
    let mut out = ActRows {
        q: vec![0; routes.len() * i],
        sf: vec![0; routes.len() * i / g],
    };
    for (expert, rows) in
        group_by_expert(routes.iter().map(|r| r.expert), config.experts_per_rank())
            .iter()
            .enumerate()
    {
        if rows.is_empty() {
            continue;
        }
        let topk: Vec<f32> = rows.iter().map(|&r| routes[r].weight).collect();
        let part = expert_l1(
            config,
            weights,
            expert,
            &gather(x, h, rows),
            &gather(x_sf, h / g, rows),
            &topk,
        )?;
        scatter(&part.q, i, rows, &mut out.q);
        scatter(&part.sf, i / g, rows, &mut out.sf);
    }
    Ok(out)
}

/// L2 (DESIGN §1 step 4) of re-quantized rows on one rank's weights; `experts[r]` is row r's
/// rank-local expert. Returns BF16 `[rows, H]` in row order.
pub fn l2_rows(
    config: &Config,
    weights: &RankWeights,
    h_rows: &ActRows,
    experts: &[usize],
) -> Vec<bf16> {
    let (h, i, g) = (config.hidden, config.intermediate, config.act_group());
    assert_eq!(
        h_rows.q.len(),
        experts.len() * i,
        "h does not hold one row per expert id"
    );
    let mut out = vec![bf16::ZERO; experts.len() * h];
    for (expert, rows) in group_by_expert(experts.iter().copied(), config.experts_per_rank())
        .iter()
        .enumerate()
    {
        if rows.is_empty() {
            continue;
        }
        let part_in = ActRows {
            q: gather(&h_rows.q, i, rows),
            sf: gather(&h_rows.sf, i / g, rows),
        };
        scatter(
            &expert_l2(config, weights, expert, &part_in),
            h,
            rows,
            &mut out,
        );
    }
    out
}

/// One valid slot: token `token` of rank `rank`, top-k slot `slot`.
#[derive(Clone, Copy, Debug)]
struct SlotRef {
    rank: usize,
    token: usize,
    slot: usize,
}

/// Every valid slot of every rank routed to an expert of `owner`, grouped by rank-local expert.
fn slots_of_owner(config: &Config, topk_idx: &[&[i64]], owner: usize) -> Vec<Vec<SlotRef>> {
    let (k, e_l) = (config.top_k, config.experts_per_rank());
    let mut groups = vec![Vec::new(); e_l];
    for (rank, idx) in topk_idx.iter().enumerate() {
        for (flat, &e) in idx.iter().enumerate() {
            if e >= 0 && config.owner_rank(e as usize) == owner {
                groups[e as usize % e_l].push(SlotRef {
                    rank,
                    token: flat / k,
                    slot: flat % k,
                });
            }
        }
    }
    groups
}

/// The slots a token's sum adds, in increasing j: those its `[k]` expert ids route (not masked).
pub fn valid_slots(topk_idx: &[i64]) -> impl Iterator<Item = usize> + '_ {
    (0..topk_idx.len()).filter(|&j| topk_idx[j] >= 0)
}

/// Step 5 for one token: adds the values of its valid slots, given in increasing j, to `acc`
/// (f32, starting from 0.0); the caller rounds to BF16.
pub fn combine_token<'s, S: Copy + 's>(
    slots: impl IntoIterator<Item = &'s [S]>,
    value: impl Fn(S) -> f32,
    acc: &mut [f32],
) {
    for slot in slots {
        for (a, &s) in acc.iter_mut().zip(slot) {
            *a += value(s);
        }
    }
}

/// Step 5 on one rank: per token, the f32 sum from 0.0 of its valid slots in increasing j.
/// `slots` is `[T, k, H]`.
fn combine<S: Copy + Sync>(
    topk_idx: &[i64],
    k: usize,
    h: usize,
    slots: &[S],
    value: impl Fn(S) -> f32 + Sync,
) -> Vec<f32> {
    let mut y = vec![0f32; topk_idx.len() / k * h];
    y.par_chunks_mut(h).enumerate().for_each(|(t, yt)| {
        let valid = valid_slots(&topk_idx[t * k..(t + 1) * k]);
        combine_token(valid.map(|j| &slots[(t * k + j) * h..][..h]), &value, yt);
    });
    y
}

/// The whole layer, one owner rank's weights at a time (so huge problems need only one rank's
/// weights in memory): `new`, then `run_owner` for every rank in any order, then `finish`.
pub struct Forward<'a> {
    config: Config,
    inputs: &'a [RankInputs],
    /// Per source rank, the L2 output of every slot, `[T, k, H]`; masked slots are never read.
    slots: Vec<Vec<bf16>>,
    /// Which owner ranks have run: combining before all have would silently drop slots.
    owners_done: Vec<bool>,
    /// Called with 1 per (owner rank, expert) done: the caller's progress report, if any.
    progress: Box<dyn FnMut(u64) + 'a>,
}

impl<'a> Forward<'a> {
    /// `inputs` must be validated, one entry per rank.
    pub fn new(config: &Config, inputs: &'a [RankInputs]) -> Self {
        assert_eq!(inputs.len(), config.num_ranks, "one RankInputs per rank");
        let slots = inputs
            .iter()
            .map(|x| vec![bf16::ZERO; x.tokens * config.top_k * config.hidden])
            .collect();
        Forward {
            config: *config,
            inputs,
            slots,
            owners_done: vec![false; config.num_ranks],
            progress: Box::new(|_| {}),
        }
    }

    /// Calls `progress(1)` once per (owner rank, expert) with routed tokens; see
    /// [`Forward::active_experts`].
    pub fn with_progress(self, progress: impl FnMut(u64) + 'a) -> Self {
        Forward {
            progress: Box::new(progress),
            ..self
        }
    }

    /// How many (owner rank, expert) pairs have at least one valid slot routed to them.
    pub fn active_experts(&self) -> usize {
        let mut hit = vec![false; self.config.num_experts];
        for x in self.inputs {
            for &e in x.topk_idx.iter().filter(|&&e| e >= 0) {
                hit[e as usize] = true;
            }
        }
        hit.iter().filter(|&&h| h).count()
    }

    /// Computes every slot routed to the experts of rank `owner`, whose weights are `weights`.
    pub fn run_owner(&mut self, owner: usize, weights: &RankWeights) -> Result<(), ReferenceError> {
        let config = &self.config;
        let (h, g, k) = (config.hidden, config.act_group(), config.top_k);
        let topk_idx: Vec<&[i64]> = self.inputs.iter().map(|x| x.topk_idx.as_slice()).collect();
        for (expert, refs) in slots_of_owner(config, &topk_idx, owner).iter().enumerate() {
            if refs.is_empty() {
                continue;
            }
            let mut x = Vec::with_capacity(refs.len() * h);
            let mut x_sf = Vec::with_capacity(refs.len() * h / g);
            let mut topk = Vec::with_capacity(refs.len());
            for s in refs {
                let src = &self.inputs[s.rank];
                x.extend_from_slice(&src.x[s.token * h..][..h]);
                x_sf.extend_from_slice(&src.x_sf[s.token * h / g..][..h / g]);
                topk.push(src.topk_weights[s.token * k + s.slot]);
            }
            let h_rows = expert_l1(config, weights, expert, &x, &x_sf, &topk)?;
            let y = expert_l2(config, weights, expert, &h_rows);
            for (s, row) in refs.iter().zip(y.chunks_exact(h)) {
                self.slots[s.rank][(s.token * k + s.slot) * h..][..h].copy_from_slice(row);
            }
            (self.progress)(1);
        }
        self.owners_done[owner] = true;
        Ok(())
    }

    /// The combine (step 5): `y` `[T, H]` BF16 per rank.
    pub fn finish(self) -> Vec<Vec<bf16>> {
        let missing: Vec<usize> = (0..self.config.num_ranks)
            .filter(|&r| !self.owners_done[r])
            .collect();
        assert!(
            missing.is_empty(),
            "combine before owner ranks {missing:?} ran"
        );
        let (k, h) = (self.config.top_k, self.config.hidden);
        self.inputs
            .iter()
            .zip(&self.slots)
            .map(|(x, slots)| {
                combine(&x.topk_idx, k, h, slots, bf16::to_f32)
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect()
            })
            .collect()
    }
}

/// The whole layer with every rank's weights in memory: `y` `[T, H]` BF16 per rank.
pub fn forward(
    config: &Config,
    weights: &[RankWeights],
    inputs: &[RankInputs],
) -> Result<Vec<Vec<bf16>>, ReferenceError> {
    assert_eq!(weights.len(), config.num_ranks, "one RankWeights per rank");
    let mut fwd = Forward::new(config, inputs);
    for (owner, w) in weights.iter().enumerate() {
        fwd.run_owner(owner, w)?;
    }
    Ok(fwd.finish())
}

/// The layer in f32, for sanity checks of the quantized contract: on the MXFP4 weights (the
/// model's weights are MXFP4; [`RankWeights::dequantize`]) and the original unquantized f32
/// tokens. f64 sums rounded to f32 as in [`forward`], the same clamp, SwiGLU and combine
/// order, but no FP8 activations, no BF16 rounding of g, u, the L2 output or y, and no
/// re-quantization of h. What it measures is the activation-side quantization of the contract.
///
/// [`RankWeights::dequantize`]: megamoe::problem::RankWeights::dequantize
pub fn forward_f32(
    config: &Config,
    weights: &[DenseWeights],
    inputs: &[DenseInputs],
) -> Vec<Vec<f32>> {
    let (h, i, k) = (config.hidden, config.intermediate, config.top_k);
    assert!(
        weights.len() == config.num_ranks && inputs.len() == config.num_ranks,
        "one entry per rank"
    );
    let topk_idx: Vec<&[i64]> = inputs.iter().map(|x| x.topk_idx.as_slice()).collect();
    let mut slots: Vec<Vec<f32>> = inputs
        .iter()
        .map(|x| vec![0f32; x.tokens * k * h])
        .collect();
    for (owner, w) in weights.iter().enumerate() {
        for (expert, refs) in slots_of_owner(config, &topk_idx, owner).iter().enumerate() {
            if refs.is_empty() {
                continue;
            }
            let x: Vec<f64> = refs
                .iter()
                .flat_map(|s| &inputs[s.rank].x[s.token * h..][..h])
                .map(|&v| f64::from(v))
                .collect();
            let w1 = &w.w1[expert * 2 * i * h..][..2 * i * h];
            let acc = gemm_f64(
                &x,
                h,
                2 * i,
                |n, row| widen(&w1[n * h..][..h], row),
                Exec::Rayon,
            );
            let m = refs.len();
            let hidden: Vec<f64> = (0..m * i)
                .map(|e| {
                    let (r, c) = (e / i, e % i);
                    let s = refs[r];
                    let weight = inputs[s.rank].topk_weights[s.token * k + s.slot];
                    f64::from(swiglu(
                        acc[c * m + r],
                        acc[(i + c) * m + r],
                        config.clamp,
                        weight,
                    ))
                })
                .collect();
            let w2 = &w.w2[expert * h * i..][..h * i];
            let acc = gemm_f64(
                &hidden,
                i,
                h,
                |n, row| widen(&w2[n * i..][..i], row),
                Exec::Rayon,
            );
            for (r, s) in refs.iter().enumerate() {
                for (c, dst) in slots[s.rank][(s.token * k + s.slot) * h..][..h]
                    .iter_mut()
                    .enumerate()
                {
                    *dst = acc[c * m + r];
                }
            }
        }
    }
    inputs
        .iter()
        .zip(&slots)
        .map(|(x, s)| combine(&x.topk_idx, k, h, s, |v| v))
        .collect()
}

fn widen(src: &[f32], dst: &mut [f64]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f64::from(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Exact-product operands like the real ones: small integers times powers of two.
    fn operands(len: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<f64> {
        (0..len)
            .map(|_| {
                f64::from(rng.random_range(-15i32..=15)) * 2f64.powi(rng.random_range(-20..20))
            })
            .collect()
    }

    #[test]
    fn dispatched_tiles_match_the_portable_ones_bit_for_bit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let k = 256;
        for m in [1, 2, 3, 7] {
            let a = operands(m * k, &mut rng);
            let b = operands(ROW_BLOCK * k, &mut rng);
            let (mut fast, mut portable) = (vec![0f32; ROW_BLOCK * m], vec![0f32; ROW_BLOCK * m]);
            dot_block(&a, &b, k, &mut fast);
            dot_block_with(
                &a,
                &b,
                k,
                &mut portable,
                tile_portable::<1>,
                tile_portable::<TILE_M>,
            );
            assert_eq!(fast, portable, "m = {m}");
            // And both are the f64 dot product rounded once (up to f64 reassociation).
            for (idx, &v) in portable.iter().enumerate() {
                let (n, i) = (idx / m, idx % m);
                let exact: f64 = (0..k).map(|c| a[i * k + c] * b[n * k + c]).sum();
                assert!(
                    (f64::from(v) - exact).abs() <= exact.abs() * 1e-6 + 1e-30,
                    "{v} vs {exact}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "combine before owner ranks [1] ran")]
    fn combining_before_every_owner_ran_is_a_bug() {
        let opts = crate::generate::GenOptions {
            config: Config::tiny().with_ranks(2),
            tokens: 4,
            seed: 1,
            mask_fraction: 0.0,
        };
        let p = crate::generate::problem(&opts);
        let mut fwd = Forward::new(&p.config, &p.inputs);
        fwd.run_owner(0, &p.weights[0]).unwrap();
        fwd.finish();
    }

    #[test]
    fn fp4_decode_matches_fp_formats() {
        let packed: Vec<u8> = (0..=255).collect();
        let sf: Vec<u8> = (0..16).map(|i| 100 + 3 * i).collect();
        let mut ours = vec![0f64; 512];
        decode_fp4_row(&packed, &sf, &mut ours);
        let mut theirs = vec![0f32; 512];
        quant::dequantize_fp4_row(&packed, &sf, &mut theirs);
        assert!(ours.iter().zip(&theirs).all(|(&a, &b)| a == f64::from(b)));
    }
}
