// weights_prefetch.cuh -- the first bytes of a grouped GEMM's weights pulled into L2 by the launch
// that runs before it, while HBM has time to spare (the pipeline: uf_route before the L1 GEMM, the
// L1 GEMM's CTAs that have drawn their last tile before the L2 GEMM). A launch's first tiles are
// its first experts with rows, in expert order, so the prefetch walks the same experts (skipping
// those without rows, as the GEMM does) and takes the first `bytes` of their codes (and the meta
// words alongside, 1/16 of them). Host twin: megamoe-kernel's `gemm::WeightsPrefetch`.
#pragma once
#include "sm90_ptx.cuh"

namespace mm {

struct WeightsPrefetch {
  const unsigned char* codes;           // [E][n_tiles][k_blocks] x 8 KiB; null: nothing to prefetch
  const unsigned char* meta;            // [E][n_tiles][k_blocks] x 512 B
  unsigned long long codes_per_expert;  // bytes, a multiple of 8 KiB (meta: 1/16 of it)
  unsigned long long bytes;             // codes to prefetch, a multiple of 8 KiB (meta: 1/16 of it)
};
static_assert(sizeof(WeightsPrefetch) == 32, "WeightsPrefetch layout (megamoe-kernel/src/gemm.rs)");

// Part `part` of `parts` of the prefetch, over the experts e < num_experts with expert_rows[e] > 0.
// One thread issues it; every piece is a multiple of 8 KiB (its meta of 512 B).
__device__ __forceinline__ void prefetch_weights(const WeightsPrefetch& w, const int* expert_rows, int num_experts,
                                                 int part, int parts) {
  typedef unsigned long long u64;
  constexpr u64 kChunk = 32768;
  if (w.codes == nullptr || w.bytes == 0) return;
  const u64 share = (w.bytes / parts + kChunk - 1) / kChunk * kChunk;
  const u64 lo = (u64)part * share, hi = lo + share < w.bytes ? lo + share : w.bytes;
  u64 at = 0;  // where expert e's codes start in the prefetched sequence
  for (int e = 0; e < num_experts && at < hi; ++e) {
    if (expert_rows[e] <= 0) continue;
    const u64 from = lo > at ? lo : at, end = at + w.codes_per_expert, to = hi < end ? hi : end;
    for (u64 x = from; x < to; x += kChunk) {
      const u64 n = to - x < kChunk ? to - x : kChunk;
      const u64 offset = (u64)e * w.codes_per_expert + (x - at);
      sm90::prefetch_l2(w.codes + offset, (unsigned)n);
      sm90::prefetch_l2(w.meta + offset / 16, (unsigned)(n / 16));
    }
    at = end;
  }
}

}  // namespace mm
