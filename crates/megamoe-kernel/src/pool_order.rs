//! The channel order of the grouped GEMM's activation pools, and the row order of the FP8 pools'
//! token scales (device twin: `cuda/pool_order.cuh`).
//!
//! A WGMMA register fragment gives thread-in-quad `t` the same few columns of every k-step, so in
//! natural channel order each thread touches all four per-32 weight scale blocks of a k128 block
//! and builds four decode tables (FP8) or multipliers (BF16) per row and stage. Pools store each
//! 128-channel block with its 4-byte words transposed instead: the block is a 4 × n matrix of
//! words (row = scale block b, n = 8 words of E4M3 or 16 of BF16) stored column by column, so the
//! words thread `t` reads in every k-step are all from scale block `t` and it needs one table per
//! row and stage. The weights take the same order ([`crate::transform`]); a dot product does not
//! care in which order K is summed, and the per-128 activation scales see whole blocks.
//!
//! Every pool producer (the tests' [`crate::problem::ActPool::device_image`], the unfused
//! pipeline's dispatch and SwiGLU, the CPU dataflow engine's dispatch) writes this order; nothing
//! reads a pool but the GEMM and the CPU engine's L1 blocks ([`canonical_channel`]).
//!
//! An FP8 pool's token scales are floats (2^(e − 127) of each UE8M0 byte e), `[k/128][sf_stride]`,
//! so that the TMA hands each stage's factors to the promotion as they are (no converter warp
//! between a stage's arrival and its decode, perf.md v124). The promotion of a WGMMA accumulator
//! fragment gives thread-in-quad `t` the columns 2t, 2t + 1, 8 + 2t, 9 + 2t of every 16; within
//! each 16 rows the table holds those four side by side ([`scale_column`]), so a thread reads its
//! four factors with one 16-byte load. Tiles start on multiples of 16 rows.

use crate::gemm::Mma;
use crate::transform::BLOCK_K;

/// The device twin, for the JIT's include tree.
pub const CUDA_HEADER: (&str, &str) = ("pool_order.cuh", include_str!("../cuda/pool_order.cuh"));

/// Channels per weight scale block (the MXFP4 group).
const SCALE_BLOCK: usize = 32;

/// Elements of route `mma`'s pool per 4-byte word.
fn per_word(mma: Mma) -> usize {
    4 / mma.act_elem()
}

/// Pool position of channel `channel` (any row offset of whole 128-blocks is kept).
pub fn pool_position(mma: Mma, channel: usize) -> usize {
    let e = per_word(mma);
    let n = SCALE_BLOCK / e;
    let (block, c) = (channel / BLOCK_K, channel % BLOCK_K);
    let word = c / e;
    let (b, m) = (word / n, word % n);
    block * BLOCK_K + (4 * m + b) * e + c % e
}

/// Channel stored at pool position `position` (the inverse of [`pool_position`]).
pub fn canonical_channel(mma: Mma, position: usize) -> usize {
    let e = per_word(mma);
    let n = SCALE_BLOCK / e;
    let (block, p) = (position / BLOCK_K, position % BLOCK_K);
    let word = p / e;
    let (m, b) = (word / 4, word % 4);
    block * BLOCK_K + (b * n + m) * e + p % e
}

/// Column of pool row `row`'s token scale in each k-block's row of an FP8 pool's scale table.
pub fn scale_column(row: usize) -> usize {
    // Bits 2..1 of the row to 3..2, bit 3 to 1.
    (row & !15) | (row & 6) << 1 | (row >> 2 & 2) | (row & 1)
}

/// A row of `k` channels (elements of `elem` bytes) in pool order.
pub fn permute_row(mma: Mma, row: &[u8], out: &mut [u8]) {
    let elem = mma.act_elem();
    debug_assert_eq!(row.len(), out.len());
    for (c, value) in row.chunks_exact(elem).enumerate() {
        let at = pool_position(mma, c) * elem;
        out[at..at + elem].copy_from_slice(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTES: [Mma; 2] = [Mma::Fp8, Mma::Bf16];

    #[test]
    fn the_order_is_a_permutation_of_each_block() {
        for mma in ROUTES {
            let mut seen = vec![false; 2 * BLOCK_K];
            for c in 0..2 * BLOCK_K {
                let p = pool_position(mma, c);
                assert_eq!(p / BLOCK_K, c / BLOCK_K, "{mma}: {c} leaves its block");
                assert!(!seen[p], "{mma}: position {p} twice");
                seen[p] = true;
                assert_eq!(canonical_channel(mma, p), c, "{mma}");
            }
        }
    }

    /// What the order is for: every element a thread-in-quad `t` holds in a WGMMA A fragment of
    /// a k128 block comes from scale block `t`.
    #[test]
    fn each_thread_reads_one_scale_block() {
        for t in 0..4 {
            // FP8 m64nNk32: elements 4t..4t+3 and 16+4t..16+4t+3 of each of the four k32 steps.
            for j in 0..4 {
                for i in 0..4 {
                    for k in [32 * j + 4 * t + i, 32 * j + 16 + 4 * t + i] {
                        assert_eq!(canonical_channel(Mma::Fp8, k) / SCALE_BLOCK, t, "fp8 k {k}");
                    }
                }
            }
            // BF16 m64nNk16: elements 2t, 2t+1 and 2t+8, 2t+9 of each of the eight k16 steps.
            for q in 0..8 {
                for i in 0..2 {
                    for k in [16 * q + 2 * t + i, 16 * q + 8 + 2 * t + i] {
                        assert_eq!(
                            canonical_channel(Mma::Bf16, k) / SCALE_BLOCK,
                            t,
                            "bf16 k {k}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn each_thread_reads_its_four_scales_side_by_side() {
        let mut seen = [false; 32];
        for row in 0..32 {
            let c = scale_column(row);
            assert_eq!(c / 16, row / 16, "row {row} leaves its 16");
            assert!(!seen[c], "column {c} twice");
            seen[c] = true;
        }
        for t in 0..4 {
            let columns: Vec<usize> = [2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t]
                .map(scale_column)
                .into();
            assert_eq!(columns, (4 * t..4 * t + 4).collect::<Vec<_>>(), "t {t}");
        }
        // The device's twin is the same bit formula (its writers and the GEMM's loads meet only
        // on a GPU, so drift there would show in no host test).
        assert!(
            CUDA_HEADER
                .1
                .contains("return (r & ~15) | (r & 6) << 1 | (r >> 2 & 2) | (r & 1);"),
            "pool_order.cuh's scale_column differs from the host's"
        );
    }

    #[test]
    fn rows_are_permuted_element_by_element() {
        for mma in ROUTES {
            let elem = mma.act_elem();
            let row: Vec<u8> = (0..BLOCK_K * elem).map(|i| i as u8).collect();
            let mut out = vec![0; row.len()];
            permute_row(mma, &row, &mut out);
            for c in 0..BLOCK_K {
                let p = pool_position(mma, c);
                assert_eq!(out[p * elem..(p + 1) * elem], row[c * elem..(c + 1) * elem]);
            }
        }
    }
}
