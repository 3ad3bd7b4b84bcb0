// pool_order.cuh -- the channel order of the grouped GEMM's activation pools (host twin:
// megamoe-kernel/src/pool_order.rs, which says why). Each 128-channel block is a 4 x n matrix of
// 4-byte words (row = per-32 scale block, n = 8 words of E4M3 or 16 of BF16) stored transposed:
// canonical word o of a block sits at word 4 * (o % n) + o / n.
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

}  // namespace pool_order
}  // namespace mm
