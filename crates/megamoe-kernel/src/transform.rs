//! Weight transform: canonical MXFP4 expert weights (`w` packed E2M1 `[E, N, K/2]`, element 2i in
//! the low nibble; `w_sf` UE8M0 `[E, N, K/32]`) into the grouped GEMM's layout
//! (`cuda/sm90_moe_gemm.cuh` documents it): per (expert, 128-row tile, k128 block) one weight block
//! of 8 KiB of codes, in the order the consumer threads read their register fragments, then one u32
//! of scale metadata per row — one block, so the kernel's producer loads a stage's weights with one
//! copy. For the FP8 route ([`Mma::Fp8`]) the four per-32 scales of a k128 block are folded into offsets from a base;
//! a block whose scales span more than 14 binades cannot be folded exactly and is refused. The L1's
//! weights ([`transform_l1_weights`]) also interleave their gate and up rows ([`RowOrder::GateUp`]),
//! for the SwiGLU epilogue.

use fp_formats::{fold, pack};

use crate::gemm::Mma;
use crate::pool_order;
use rayon::prelude::*;

/// Weight rows per GEMM tile and K per pipeline stage (the kernel's `kTileRows`, `kBlockK`).
pub const TILE_ROWS: usize = 128;
pub const BLOCK_K: usize = 128;
/// Bytes of FP4 codes per (tile, k128 block) (`kCodeBytes`).
pub const CODE_BYTES: usize = TILE_ROWS * BLOCK_K / 2;
/// Bytes of scale metadata per (tile, k128 block): a u32 per row (`kMetaBytes`).
pub const META_BYTES: usize = 4 * TILE_ROWS;
/// Bytes of one weight block, the codes then the metadata (`kWeightBlockBytes`).
pub const WEIGHT_BLOCK_BYTES: usize = CODE_BYTES + META_BYTES;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransformError {
    #[error("weight dimension {name} = {value} is not a multiple of {multiple}")]
    NotMultiple {
        name: &'static str,
        value: usize,
        multiple: usize,
    },
    #[error("`{tensor}` has {got} bytes, expected {want} for [{experts}, {rows}, {cols}]")]
    Size {
        tensor: &'static str,
        got: usize,
        want: usize,
        experts: usize,
        rows: usize,
        cols: usize,
    },
    #[error(
        "expert {expert} row {row} k-block {k_block}: the four per-32 weight scales span {span} binades \
         (bytes {bytes:?}); the FP8 route's fold is exact only up to 14 — use the BF16 route for these weights"
    )]
    ScaleSpan {
        expert: usize,
        row: usize,
        k_block: usize,
        span: u32,
        bytes: [u8; 4],
    },
    #[error(
        "expert {expert} row {row} scale block {block}: UE8M0 byte {byte} is outside [{min}, {max}] for the {mma} route"
    )]
    ScaleRange {
        expert: usize,
        row: usize,
        block: usize,
        byte: u8,
        min: u8,
        max: u8,
        mma: Mma,
    },
}

/// How the FP8 route's weights fold their per-32 scales, as [`transform_weights`] found them; a
/// GEMM specialization is compiled for one fold (`TilePlan::with_fold`). Both off on the BF16
/// route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fold {
    /// Every row has one fold base over all of K (the promotion then skips the base).
    pub row_base: bool,
    /// Every fold offset is at least `fold::MIN_NORMAL_OFFSET` (a row's scales span at most 11
    /// binades around its base), so the decode tables are computed in registers.
    pub in_registers: bool,
}

/// Which canonical row each of the GEMM's weight rows (its output columns) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RowOrder {
    /// Weight row r is canonical row r.
    #[default]
    Canonical,
    /// The L1's gate and up rows interleaved for the SwiGLU epilogue (`cuda/sm90_swiglu.cuh`): in
    /// every 16 rows, the gates of 8 channels and then their ups, so that a consumer thread's two
    /// accumulator rows (r, r + 8) are one channel's gate and up. Row r holds channel
    /// c = 8 (r / 16) + r % 8: its gate (canonical row c) when r / 8 is even, its up (canonical row
    /// I + c, I = n / 2) when odd; weight tile t holds channels 64 t .. 64 t + 63.
    GateUp,
}

impl RowOrder {
    /// The canonical row that weight row `row` of `n` holds.
    pub fn source(self, row: usize, n: usize) -> usize {
        match self {
            RowOrder::Canonical => row,
            RowOrder::GateUp => {
                let channel = row / 16 * 8 + row % 8;
                if (row / 8).is_multiple_of(2) {
                    channel
                } else {
                    n / 2 + channel
                }
            }
        }
    }
}

/// Expert weights in the grouped GEMM's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmWeights {
    pub mma: Mma,
    pub num_experts: usize,
    /// Weight rows (the GEMM's output width): 2I for L1, H for L2.
    pub n: usize,
    /// Reduction length: H for L1, I for L2.
    pub k: usize,
    /// How the FP8 route's scales fold (the GEMM specialization must match it).
    pub fold: Fold,
    /// Which canonical row each weight row holds (the L1's SwiGLU epilogue needs [`RowOrder::GateUp`]).
    pub rows: RowOrder,
    /// `[E][n/128][k/128]` weight blocks of [`WEIGHT_BLOCK_BYTES`]: [`CODE_BYTES`] of codes, then
    /// the 128 rows' metadata (u32, little-endian).
    pub blocks: Vec<u8>,
}

impl GemmWeights {
    pub fn tiles(&self) -> usize {
        self.n / TILE_ROWS
    }
    pub fn k_blocks(&self) -> usize {
        self.k / BLOCK_K
    }
    /// Weight block `block` (`[E][n/128][k/128]` order): its codes, then its rows' metadata
    /// ([`block_metas`]).
    pub fn block(&self, block: usize) -> &[u8] {
        &self.blocks[block * WEIGHT_BLOCK_BYTES..][..WEIGHT_BLOCK_BYTES]
    }
}

/// The 128 rows' metadata words of one weight block (after its codes, little-endian).
pub fn block_metas(block: &[u8]) -> impl Iterator<Item = u32> + '_ {
    block[CODE_BYTES..WEIGHT_BLOCK_BYTES]
        .chunks_exact(4)
        .map(|m| u32::from_le_bytes(m.try_into().unwrap()))
}

/// Scale bytes the BF16 decode handles: its multiplier 2^(s-1) is a BF16 normal (s <= 128: a
/// block's largest weight at most 12), and the smallest decoded value 0.5·2^(s-127) one too (s >= 2).
const BF16_SCALE_RANGE: (u8, u8) = (2, 128);

/// Transforms `num_experts` experts of `n` rows by `k` columns, rows in their canonical order.
pub fn transform_weights(
    mma: Mma,
    w: &[u8],
    w_sf: &[u8],
    num_experts: usize,
    n: usize,
    k: usize,
) -> Result<GemmWeights, TransformError> {
    transform_rows(mma, w, w_sf, num_experts, n, k, RowOrder::Canonical)
}

/// Transforms the L1's weights (`w1`, `w1_sf`: `num_experts` experts of 2I rows, gates then ups, by
/// H columns) for the L1 GEMM with its SwiGLU epilogue: gate and up rows interleaved
/// ([`RowOrder::GateUp`]).
pub fn transform_l1_weights(
    mma: Mma,
    w1: &[u8],
    w1_sf: &[u8],
    num_experts: usize,
    intermediate: usize,
    hidden: usize,
) -> Result<GemmWeights, TransformError> {
    transform_rows(
        mma,
        w1,
        w1_sf,
        num_experts,
        2 * intermediate,
        hidden,
        RowOrder::GateUp,
    )
}

fn transform_rows(
    mma: Mma,
    w: &[u8],
    w_sf: &[u8],
    num_experts: usize,
    n: usize,
    k: usize,
    rows: RowOrder,
) -> Result<GemmWeights, TransformError> {
    for (name, value) in [("rows", n), ("K", k)] {
        if value % TILE_ROWS != 0 {
            return Err(TransformError::NotMultiple {
                name,
                value,
                multiple: TILE_ROWS,
            });
        }
    }
    check_size("w", w.len(), num_experts, n, k / 2)?;
    check_size("w_sf", w_sf.len(), num_experts, n, k / 32)?;
    let (tiles, k_blocks) = (n / TILE_ROWS, k / BLOCK_K);
    // FP8: one fold base per row when every row's scales span at most 14 binades over all of K
    // (the promotion then skips the base); otherwise a base per (row, k128 block).
    let row_max: Option<Vec<u8>> = (mma == Mma::Fp8)
        .then(|| {
            let spans: Vec<(u8, u8)> = w_sf
                .par_chunks(k / 32)
                .map(|row| (*row.iter().min().unwrap(), *row.iter().max().unwrap()))
                .collect();
            let fits = spans.iter().all(|&(lo, hi)| {
                i32::from(hi) - i32::from(lo) <= fold::MAX_OFFSET - fold::MIN_OFFSET
                    && i32::from(hi) - fold::MAX_OFFSET >= 1
            });
            fits.then(|| spans.into_iter().map(|(_, hi)| hi).collect())
        })
        .flatten();
    let chunks = num_experts * tiles * k_blocks;
    let mut blocks = vec![0u8; chunks * WEIGHT_BLOCK_BYTES];
    blocks
        .par_chunks_mut(WEIGHT_BLOCK_BYTES)
        .enumerate()
        .try_for_each(|(chunk, out)| {
            let (codes, meta) = out.split_at_mut(CODE_BYTES);
            let (e, rest) = (chunk / (tiles * k_blocks), chunk % (tiles * k_blocks));
            let (tile, kb) = (rest / k_blocks, rest % k_blocks);
            let block = Block {
                mma,
                w: &w[e * n * k / 2..][..n * k / 2],
                sf: &w_sf[e * n * k / 32..][..n * k / 32],
                n,
                k,
                e,
                rows,
                row0: tile * TILE_ROWS,
                kb,
                row_max: row_max.as_deref().map(|m| &m[e * n..][..n]),
            };
            block.write_meta(meta)?;
            block.write_codes(codes);
            Ok(())
        })?;
    // FP8: every offset d (nibble d + 8) at least MIN_NORMAL_OFFSET lets the kernel build its decode
    // tables in registers instead of loading them from shared memory.
    let min_nibble = (fold::MIN_NORMAL_OFFSET - fold::MIN_OFFSET) as u32;
    let in_registers = mma == Mma::Fp8
        && blocks.par_chunks(WEIGHT_BLOCK_BYTES).all(|block| {
            block_metas(block).all(|m| (0..4).all(|j| (m >> (4 * j)) & 0xf >= min_nibble))
        });
    Ok(GemmWeights {
        mma,
        num_experts,
        n,
        k,
        fold: Fold {
            row_base: row_max.is_some(),
            in_registers,
        },
        rows,
        blocks,
    })
}

fn check_size(
    tensor: &'static str,
    got: usize,
    experts: usize,
    rows: usize,
    cols: usize,
) -> Result<(), TransformError> {
    let want = experts * rows * cols;
    if got == want {
        Ok(())
    } else {
        Err(TransformError::Size {
            tensor,
            got,
            want,
            experts,
            rows,
            cols,
        })
    }
}

/// One (expert, tile, k128 block) of one expert's canonical weights (`n` rows of `k`), its weight
/// rows in `rows` order.
struct Block<'a> {
    mma: Mma,
    w: &'a [u8],
    sf: &'a [u8],
    n: usize,
    k: usize,
    e: usize,
    rows: RowOrder,
    row0: usize,
    kb: usize,
    /// FP8 with one base per row: each canonical row's largest scale byte over all of K.
    row_max: Option<&'a [u8]>,
}

impl Block<'_> {
    /// The canonical row of the block's weight row `row`.
    fn source(&self, row: usize) -> usize {
        self.rows.source(self.row0 + row, self.n)
    }

    fn code(&self, row: usize, col: usize) -> u8 {
        pack::e2m1_at(
            &self.w[self.source(row) * self.k / 2..][..self.k / 2],
            self.kb * BLOCK_K + col,
        )
    }

    fn scales(&self, row: usize) -> [u8; 4] {
        let at = self.source(row) * (self.k / 32) + self.kb * 4;
        self.sf[at..at + 4].try_into().unwrap()
    }

    /// The rows' metadata words, little-endian (the block's bytes after its codes).
    fn write_meta(&self, meta: &mut [u8]) -> Result<(), TransformError> {
        for (row, m) in meta.chunks_exact_mut(4).enumerate() {
            let bytes = self.scales(row);
            let global_row = self.source(row);
            let range = match self.mma {
                Mma::Bf16 => BF16_SCALE_RANGE,
                Mma::Fp8 => (1, 254),
            };
            if let Some((block, &byte)) = bytes
                .iter()
                .enumerate()
                .find(|(_, b)| !(range.0..=range.1).contains(*b))
            {
                return Err(TransformError::ScaleRange {
                    expert: self.e,
                    row: global_row,
                    block: self.kb * 4 + block,
                    byte,
                    min: range.0,
                    max: range.1,
                    mma: self.mma,
                });
            }
            let word = match self.mma {
                Mma::Bf16 => u32::from_le_bytes(bytes),
                Mma::Fp8 => {
                    let (lo, hi) = (*bytes.iter().min().unwrap(), *bytes.iter().max().unwrap());
                    let span = u32::from(hi - lo);
                    if span > (fold::MAX_OFFSET - fold::MIN_OFFSET) as u32 {
                        return Err(TransformError::ScaleSpan {
                            expert: self.e,
                            row: global_row,
                            k_block: self.kb,
                            span,
                            bytes,
                        });
                    }
                    // The largest sub-scale (of the block, or of the whole row) sits at +6; the
                    // base must stay a valid UE8M0 byte (>= 1).
                    let top = self.row_max.map_or(hi, |m| m[global_row]);
                    let base = i32::from(top) - fold::MAX_OFFSET;
                    if base < 1 {
                        return Err(TransformError::ScaleRange {
                            expert: self.e,
                            row: global_row,
                            block: self.kb * 4,
                            byte: hi,
                            min: (1 + fold::MAX_OFFSET) as u8,
                            max: 254,
                            mma: self.mma,
                        });
                    }
                    let offsets = bytes.iter().enumerate().map(|(j, &b)| {
                        ((i32::from(b) - base - fold::MIN_OFFSET) as u32) << (4 * j)
                    });
                    offsets.fold((base as u32) << 16, |acc, o| acc | o)
                }
            };
            m.copy_from_slice(&word.to_le_bytes());
        }
        Ok(())
    }

    /// Codes in consumer order: [k32 step j][warpgroup][thread] x {word of row r, word of row r+8},
    /// k in the pool's channel order.
    fn write_codes(&self, out: &mut [u8]) {
        let code = |r: usize, k: usize| self.code(r, pool_order::canonical_channel(self.mma, k));
        for j in 0..4 {
            for wg in 0..2 {
                for tid in 0..128 {
                    let (warp, g, t) = (tid / 32, (tid % 32) / 4, tid % 4);
                    let row = wg * 64 + warp * 16 + g;
                    let at = ((j * 2 + wg) * 128 + tid) * 8;
                    for (half, r) in [row, row + 8].into_iter().enumerate() {
                        let word = match self.mma {
                            Mma::Fp8 => fp8_word(|c| code(r, 32 * j + c), t),
                            Mma::Bf16 => bf16_word(|c| code(r, 32 * j + c), t),
                        };
                        out[at + 4 * half..at + 4 * half + 4].copy_from_slice(&word.to_le_bytes());
                    }
                }
            }
        }
    }
}

/// FP8 k32 fragment of thread-in-quad `t`: elements 0..3 at k = 4t.., 4..7 at k = 16 + 4t...
fn fp8_word(code_at: impl Fn(usize) -> u8, t: usize) -> u32 {
    fold::sign_split_word(std::array::from_fn(|i| {
        code_at(if i < 4 { 4 * t + i } else { 16 + 4 * t + i - 4 })
    }))
}

/// BF16 k16 fragments of thread-in-quad `t` over one k32 block: pairs A, B, C, D at
/// k = 2t, 2t+8, 16+2t, 24+2t (two elements each), laid out for the kernel's shift-and-multiply
/// decode: each pair's two 3-bit magnitudes land at bits 6..8 and 22..24 of a BF16x2 register after
/// one shift and mask (E2M1 there reads as a BF16 2^126 times too small, subnormals included), which
/// one `mul.bf16x2` by 2^(s-1) scales exactly; C and D carry their signs at bits 15/31 after the
/// same shift, A and B put theirs into the multiplier. `BF16_PAIRS[p]` = (magnitude shift, sign
/// shift), left shifts positive: every bit of the word is used once.
fn bf16_word(code_at: impl Fn(usize) -> u8, t: usize) -> u32 {
    let mut w = 0u32;
    for (&dk, &(mag_shift, sign_shift)) in BF16_PAIR_K.iter().zip(&BF16_PAIRS) {
        for e in 0..2 {
            let code = u32::from(code_at(dk + 2 * t + e));
            // Bit b of the word lands at b + shift: the magnitude at 6 + 16e, the sign at 15 + 16e.
            let half = 16 * e as i32;
            w |= (code & 7) << (6 + half - mag_shift);
            w |= (code >> 3) << (15 + half - sign_shift);
        }
    }
    w
}

/// K offsets of the pairs A, B, C, D within a k32 block (plus 2t for thread-in-quad t).
const BF16_PAIR_K: [usize; 4] = [0, 8, 16, 24];
/// (magnitude shift, sign shift) of the pairs A, B, C, D: mirrors `decode_bf16_word` in the kernel.
const BF16_PAIRS: [(i32, i32); 4] = [(0, 4), (-7, 5), (3, 3), (6, 6)];

#[cfg(test)]
mod tests {
    use super::*;
    use fp_formats::{e2m1, e4m3, ue8m0};
    use rand::{Rng, SeedableRng};

    /// Random canonical weights whose per-32 scale bytes lie in `scale_range`.
    fn random_weights(
        e: usize,
        n: usize,
        k: usize,
        scale_range: std::ops::RangeInclusive<u8>,
        seed: u64,
    ) -> (Vec<u8>, Vec<u8>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let w = (0..e * n * k / 2).map(|_| rng.random()).collect();
        let sf = (0..e * n * k / 32)
            .map(|_| rng.random_range(scale_range.clone()))
            .collect();
        (w, sf)
    }

    fn canonical(w: &[u8], sf: &[u8], n: usize, k: usize, e: usize, row: usize, col: usize) -> f32 {
        let base = (e * n + row) * k;
        e2m1::decode(pack::e2m1_at(w, base + col)) * ue8m0::decode(sf[base / 32 + col / 32])
    }

    /// One code word of a transformed layout, where a consumer thread finds it.
    struct FragmentWord {
        expert: usize,
        tile: usize,
        k_block: usize,
        /// k32 step within the k128 block.
        j: usize,
        /// Thread in quad: the scale block of every weight the word holds.
        tq: usize,
        /// Weight row within the tile.
        row: usize,
        word: u32,
        meta: u32,
    }

    /// Every code word of `t`, in the layout `write_codes` documents.
    fn fragment_words(t: &GemmWeights) -> impl Iterator<Item = FragmentWord> + '_ {
        let (tiles, k_blocks) = (t.tiles(), t.k_blocks());
        (0..t.num_experts * tiles * k_blocks).flat_map(move |chunk| {
            (0..4).flat_map(move |j| {
                (0..256).flat_map(move |tid| {
                    (0..2).map(move |half| {
                        let (wg, warp, g) = (tid / 128, tid % 128 / 32, tid % 32 / 4);
                        let row = wg * 64 + warp * 16 + g + 8 * half;
                        let at = (j * 256 + tid) * 8 + 4 * half;
                        FragmentWord {
                            expert: chunk / (tiles * k_blocks),
                            tile: chunk / k_blocks % tiles,
                            k_block: chunk % k_blocks,
                            j,
                            tq: tid % 4,
                            row,
                            word: u32::from_le_bytes(
                                t.block(chunk)[at..at + 4].try_into().unwrap(),
                            ),
                            meta: block_metas(t.block(chunk)).nth(row).unwrap(),
                        }
                    })
                })
            })
        })
    }

    /// Replays the kernel's register decode on the host and checks every weight lands where the
    /// fragment layout says, with its exact value.
    #[test]
    fn fp8_fragments_hold_the_exact_weights() {
        let (e, n, k) = (2, 256, 256);
        let (w, sf) = random_weights(e, n, k, 110..=124, 1);
        let t = transform_weights(Mma::Fp8, &w, &sf, e, n, k).unwrap();
        for f in fragment_words(&t) {
            // The kernel decodes all of a thread's words with scale block tq's offset.
            let d = ((f.meta >> (4 * f.tq)) & 0xf) as i32 - 8;
            let base = ue8m0::decode(((f.meta >> 16) & 0xff) as u8);
            for (i, byte) in fold::decode_sign_split_word(f.word, d)
                .into_iter()
                .enumerate()
            {
                let k_in_step = if i < 4 {
                    4 * f.tq + i
                } else {
                    12 + 4 * f.tq + i
                };
                let col = f.k_block * BLOCK_K
                    + pool_order::canonical_channel(Mma::Fp8, 32 * f.j + k_in_step);
                let want = canonical(&w, &sf, n, k, f.expert, f.tile * TILE_ROWS + f.row, col);
                assert_eq!(
                    e4m3::decode(byte) * base,
                    want,
                    "expert {} row {} col {col}",
                    f.expert,
                    f.row
                );
            }
        }
    }

    /// The kernel's `decode_bf16_word` on the host: shift, mask, and an exact multiply by 2^(s-1)
    /// (f64 holds every product) -> the value of pair `p`'s element `e`.
    fn bf16_decode(w: u32, scale: u8, p: usize, e: usize) -> f64 {
        let (mag_shift, sign_shift) = BF16_PAIRS[p];
        let shift = |v: u32, s: i32| if s >= 0 { v << s } else { v >> -s };
        let half = |v: u32| (v >> (16 * e)) & 0xffff;
        let mag = half(shift(w, mag_shift))
            & if mag_shift == sign_shift {
                0x81c0
            } else {
                0x01c0
            };
        let sign = half(shift(w, sign_shift)) & 0x8000;
        let value = f64::from(fp_formats::bf16::from_bits((mag | sign) as u16).to_f32());
        value * f64::from(scale as i32 - 1).exp2()
    }

    /// The BF16 route's counterpart of `fp8_fragments_hold_the_exact_weights`: every pair of every
    /// word, decoded with the multiplier of the thread's scale block, is its canonical weight.
    #[test]
    fn bf16_fragments_hold_the_exact_weights() {
        let (e, n, k) = (2, 128, 256);
        let (w, sf) = random_weights(e, n, k, BF16_SCALE_RANGE.0..=BF16_SCALE_RANGE.1, 4);
        let t = transform_weights(Mma::Bf16, &w, &sf, e, n, k).unwrap();
        for f in fragment_words(&t) {
            let scale = f.meta.to_le_bytes()[f.tq];
            for (p, dk) in BF16_PAIR_K.into_iter().enumerate() {
                for el in 0..2 {
                    let col = f.k_block * BLOCK_K
                        + pool_order::canonical_channel(Mma::Bf16, 32 * f.j + dk + 2 * f.tq + el);
                    let want = canonical(&w, &sf, n, k, f.expert, f.tile * TILE_ROWS + f.row, col);
                    assert_eq!(
                        bf16_decode(f.word, scale, p, el),
                        f64::from(want),
                        "expert {} row {} col {col}",
                        f.expert,
                        f.row
                    );
                }
            }
        }
    }

    #[test]
    fn bf16_words_decode_every_code_at_every_scale() {
        for t in 0..4 {
            for scale in BF16_SCALE_RANGE.0..=BF16_SCALE_RANGE.1 {
                // Every code in every position (element i gets code (i + r) % 16 in round r).
                for r in 0..16 {
                    let codes: Vec<u8> = (0..32).map(|i| ((i + r) % 16) as u8).collect();
                    let w = bf16_word(|c| codes[c], t);
                    for (p, dk) in BF16_PAIR_K.into_iter().enumerate() {
                        for e in 0..2 {
                            let code = codes[dk + 2 * t + e];
                            let want =
                                f64::from(e2m1::decode(code)) * f64::from(ue8m0::decode(scale));
                            let got = bf16_decode(w, scale, p, e);
                            assert!(
                                got == want && got.is_sign_negative() == (code >= 8),
                                "t {t} scale {scale} code {code:#x} pair {p}.{e}: {got} != {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_pairs_use_every_bit_once() {
        let mut used = 0u64;
        for &(mag_shift, sign_shift) in &BF16_PAIRS {
            for e in 0..2 {
                let half = 16 * e;
                for bit in
                    (6 + half - mag_shift..9 + half - mag_shift).chain([15 + half - sign_shift])
                {
                    assert!(
                        (0..32).contains(&bit) && used & (1 << bit) == 0,
                        "bit {bit}"
                    );
                    used |= 1 << bit;
                }
            }
        }
        assert_eq!(used, 0xffff_ffff);
    }

    #[test]
    fn fp8_refuses_wide_scale_spans() {
        let (e, n, k) = (1, 128, 128);
        let (w, mut sf) = random_weights(e, n, k, 120..=121, 2);
        sf[5 * 4..5 * 4 + 4].copy_from_slice(&[100, 104, 110, 115]); // span 15 in row 5
        let err = transform_weights(Mma::Fp8, &w, &sf, e, n, k).unwrap_err();
        assert!(
            matches!(
                err,
                TransformError::ScaleSpan {
                    row: 5,
                    span: 15,
                    ..
                }
            ),
            "{err}"
        );
        sf[5 * 4 + 3] = 114; // span 14 folds exactly
        transform_weights(Mma::Fp8, &w, &sf, e, n, k).unwrap();
        // BF16 takes any span inside its scale range, and names a scale above it.
        sf[5 * 4 + 3] = 2;
        sf[6 * 4] = 128;
        transform_weights(Mma::Bf16, &w, &sf, e, n, k).unwrap();
        sf[6 * 4] = 129;
        let err = transform_weights(Mma::Bf16, &w, &sf, e, n, k).unwrap_err();
        assert!(
            matches!(
                err,
                TransformError::ScaleRange {
                    row: 6,
                    byte: 129,
                    max: 128,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn bad_shapes_and_scales_are_named() {
        let (w, mut sf) = random_weights(1, 128, 128, 120..=121, 3);
        assert!(matches!(
            transform_weights(Mma::Fp8, &w, &sf, 1, 96, 128),
            Err(TransformError::NotMultiple { name: "rows", .. })
        ));
        assert!(matches!(
            transform_weights(Mma::Fp8, &w[1..], &sf, 1, 128, 128),
            Err(TransformError::Size { tensor: "w", .. })
        ));
        sf[7] = 255;
        let err = transform_weights(Mma::Bf16, &w, &sf, 1, 128, 128).unwrap_err();
        assert!(
            matches!(err, TransformError::ScaleRange { byte: 255, .. }),
            "{err}"
        );
    }

    /// The L1's transform is the plain transform of its rows interleaved as `RowOrder::GateUp`
    /// says: in every 16 rows the gates of 8 channels, then their ups.
    #[test]
    fn l1_rows_interleave_gate_and_up() {
        let (e, i, h) = (2, 128, 256);
        let (w, sf) = random_weights(e, 2 * i, h, 118..=124, 7);
        let order: Vec<usize> = (0..2 * i)
            .map(|r| RowOrder::GateUp.source(r, 2 * i))
            .collect();
        assert_eq!(
            &order[..17],
            &[
                0, 1, 2, 3, 4, 5, 6, 7, 128, 129, 130, 131, 132, 133, 134, 135, 8
            ]
        );
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..2 * i).collect::<Vec<_>>(), "a permutation");
        let (mut pw, mut psf) = (Vec::new(), Vec::new());
        for x in 0..e {
            for &r in &order {
                let row = x * 2 * i + r;
                pw.extend_from_slice(&w[row * h / 2..][..h / 2]);
                psf.extend_from_slice(&sf[row * h / 32..][..h / 32]);
            }
        }
        for mma in [Mma::Fp8, Mma::Bf16] {
            let l1 = transform_l1_weights(mma, &w, &sf, e, i, h).unwrap();
            let plain = transform_weights(mma, &pw, &psf, e, 2 * i, h).unwrap();
            assert_eq!(l1.rows, RowOrder::GateUp);
            assert_eq!((l1.blocks, l1.fold), (plain.blocks, plain.fold));
        }
    }
}
