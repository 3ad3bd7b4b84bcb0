// pool_order.cuh -- the channel order of the grouped GEMM's activation pools and the order of the
// FP8 pools' token scales (host twin: megamoe-kernel/src/pool_order.rs, which says why). Each
// 128-channel block is a 4 x n matrix of 4-byte words (row = per-32 scale block, n = 8 words of
// E4M3 or 16 of BF16) stored transposed: canonical word o of a block sits at word 4 * (o % n) + o / n.
#pragma once

namespace mm {
namespace pool_order {

// Word position within its 128-channel block of the block's canonical word `o`; kWordsPerScale is 8
// for an E4M3 pool, 16 for a BF16 pool.
template <int kWordsPerScale>
__device__ __forceinline__ int pool_word(int o) {
  return 4 * (o % kWordsPerScale) + o / kWordsPerScale;
}

// The 16 channels of unit u (0..7) of a 128-channel block are, in pool order, the canonical bytes
// 32b + 4u .. 32b + 4u + 3 of scale blocks b = 0..3 (E4M3: at pool bytes 16u + 4b; BF16: channel
// pairs 2 and 3 of each word at pool words 8u + b and 8u + 4 + b).
__device__ __forceinline__ int unit_source_byte(int u, int b) { return 32 * b + 4 * u; }

// An FP8 pool's token scales: [K/128][sf_stride] floats, 2^(e - 127) of each row's UE8M0 byte e
// (fp::ue8m0_float), so that the TMA hands the promotion its factors with each stage. Within each
// 16 rows (tiles start on 16) pool row r's float sits at column scale_column(r): thread-in-quad t's
// four (rows 2t, 2t + 1, 8 + 2t, 9 + 2t: its columns of two 8-column blocks) side by side, so a
// consumer reads them with one LDS.128.
__device__ __forceinline__ int scale_column(int r) {  // bits 2..1 of r to 3..2, bit 3 to 1
  return (r & ~15) | (r & 6) << 1 | (r >> 2 & 2) | (r & 1);
}

}  // namespace pool_order
}  // namespace mm
