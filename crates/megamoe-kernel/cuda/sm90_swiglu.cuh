// sm90_swiglu.cuh -- the L1 GEMM's epilogue: SwiGLU + clamp + top-k weight + re-quantization per G
// channels (DESIGN §1 steps 2-3), from the consumers' accumulators straight into the L2 pool. The
// L1's output never reaches memory in BF16, and no stage runs between the two GEMMs.
//
// The weight transform interleaves gate and up rows (transform.rs, `interleave_gate_up`): in every
// 16 weight rows, rows 0..7 are the gates of 8 channels and rows 8..15 their ups, so a consumer
// thread's two accumulator rows (r, r + 8) hold one channel's gate and up for each of its tokens.
// Weight tile n covers channels 64 n .. 64 n + 63: consumer warp w (0..7) channels 8 w .. 8 w + 7,
// lane / 4 the channel within. An activation group of G channels is one consumer warpgroup's 32
// (G = 32) or two tiles' 128 (G = 128): the GEMM walks such tiles in pairs, both in one CTA, the
// even one first (Gemm's kPairs); the first spills its h to the CTA's slot of `spill` (L2) and
// leaves its exponents in shared memory, and the second stores both.
//
// A group's exponent is ceil-exponent(amax / 448), and x -> ceil-exponent(fl(x / 448)) is monotone,
// so it is the largest of the warps' exponents over their own channels (and the bytes' largest per
// item is their __vmaxu4): the warps meet over a byte per (token, warp) in the epilogue's shared
// memory (a pair's tiles each their half), never over the h values themselves. The bits
// are the contract's: h in f32 as the host computes it (SiLU from the table of every BF16 gate,
// products in the contract's order), the same re-quantizer.
#pragma once

#include "sm90_moe_gemm.cuh"
#include "sm90_unfused.cuh"

namespace mm {
namespace swiglu {

using gemm::GemmParams;
using gemm::UnitDesc;
using unfused::u16;
using unfused::u32;
using unfused::u8;

struct SwigluParams {
  const unfused::RowMeta* meta;  // [pool rows]: each row's top-k weight
  const float* silu;             // [65537] silu(g) of every BF16 g, then of the clamp (uf_silu_table)
  u8* l2_act;                    // FP8 pool: E4M3 [rows][I]; BF16 pool: BF16 [rows][I] (pool order)
  u8* l2_sf;                     // FP8 pool: [I/128][sf_stride]
  // G = 128: per CTA of the launch (kSpillFloats<BN> each), the first tile of a pair's h values
  // ([BN / 16][256 consumer threads] float4).
  float* spill;
  int inter, sf_stride, has_clamp;
  float clamp;
};
static_assert(sizeof(SwigluParams) == 56, "SwigluParams layout (megamoe-kernel/src/epilogue.rs)");

// Floats of one CTA's spill slot for BN-token tiles: the even tile's h.
template <int BN>
constexpr int kSpillFloats = 64 * BN;

// The consumer warpgroups meet: the ones of one group (G = 32: a warpgroup, named barriers 1 + wg
// as the GEMM's epilogue box; G = 128: both, barrier 3).
template <int G>
__device__ __forceinline__ void group_bar_sync(int warp) {
  if constexpr (G == 128) {
    sm90::named_bar_sync<3, 256>();
  } else if (warp < 4) {
    sm90::named_bar_sync<1, 128>();
  } else {
    sm90::named_bar_sync<2, 128>();
  }
}

template <int G, bool kFp8Pool>
struct SwigluOut {
  static_assert(G == 32 || G == 128, "activation groups of 32 or 128 channels");
  static_assert(unfused::kPoolFitsGroup<G, kFp8Pool>, "the FP8 pool carries one scale per 128 channels");
  // A group spans two weight tiles (64 channels each): the GEMM must walk them in pairs.
  static constexpr bool kPairs = G == 128;
  const SwigluParams& s;

  // The table entry of one item's SiLU: its gate, the L1's sum rounded to BF16 as its output would
  // be (`gu`: gate low, up high, one cvt for the pair), clamped (`clamp` +inf: none); a clamped gate
  // that is no BF16 value is the clamp itself, which has its own entry.
  __device__ __forceinline__ static u32 silu_entry(u32 gu, float clamp) {
    const u32 gb = __float_as_uint(fminf(__uint_as_float(gu << 16), clamp));
    return (gb & 0xffffu) == 0 ? gb >> 16 : unfused::kSiluClampEntry;
  }

  // h of one (channel, token) from its packed gate and up, its SiLU and its top-k weight.
  __device__ __forceinline__ static float h_of(u32 gu, float silu, float w, float clamp) {
    const float u = fminf(fmaxf(__uint_as_float(gu & 0xffff0000u), -clamp), clamp);
    return __fmul_rn(__fmul_rn(silu, u), w);
  }

  // Where warp `warp` puts its exponents of block pair bp of thread-in-quad t in the exchange (a
  // word, a byte an item): the group's warps' words side by side (G = 128: 8 warps, in the half of
  // the pair's tile `half`; G = 32: the warpgroup's 4 warps), read back with 16-B loads.
  template <int BN>
  __device__ __forceinline__ static int exchange_at(int half, int warp, int bp, int t) {
    if constexpr (G == 128) {
      return ((half * (BN / 16) + bp) * 4 + t) * 8 + warp;
    } else {
      return (((warp / 4) * (BN / 16) + bp) * 4 + t) * 4 + warp % 4;
    }
  }

  // The group exponents of this thread's items of block pair bp, once the warps met (G = 128: those
  // of both tiles of the pair): the largest of their bytes, item by item.
  template <int BN>
  __device__ __forceinline__ static u32 group_exponents(const u32* exchange, int warp, int bp, int t) {
    // The group's first warp: its word starts the group's (16-B aligned).
    const uint4* at = reinterpret_cast<const uint4*>(exchange + exchange_at<BN>(0, G == 128 ? 0 : warp / 4 * 4, bp, t));
    const uint4 v = at[0];
    u32 m = __vmaxu4(__vmaxu4(v.x, v.y), __vmaxu4(v.z, v.w));
    if constexpr (G == 128) {
      constexpr int kHalf = BN / 16 * 4 * 8 / 4;  // uint4s of one tile's half
      const uint4 w = at[1], v1 = at[kHalf], w1 = at[kHalf + 1];
      m = __vmaxu4(m, __vmaxu4(__vmaxu4(w.x, w.y), __vmaxu4(w.z, w.w)));
      m = __vmaxu4(m, __vmaxu4(__vmaxu4(v1.x, v1.y), __vmaxu4(v1.z, v1.w)));
      m = __vmaxu4(m, __vmaxu4(__vmaxu4(w1.x, w1.y), __vmaxu4(w1.z, w1.w)));
    }
    return m;
  }

  // Items k = 0..3 of block pair bp of this thread (blocks 2 bp + k / 2, its column 2t + k % 2 in
  // them) of the tile whose first channel is ch0, with their group exponents (byte k of `es`):
  // q = E4M3(h · 2^-e) into the L2 pool, transposed over the lanes of the warp that hold the pool
  // word's other channels; the FP8 pool's scales by warp 0's lanes of channel 0 when `scales`.
  // `tid`: this thread among the consumers.
  __device__ __forceinline__ void store_items(int tid, const UnitDesc& d, int bp, int ch0, const float (&h)[4], u32 es,
                                              bool scales) const {
    const int warp = tid / 32, j = tid % 32 / 4, t = tid % 4;
    u32 e[4], q[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      e[k] = (es >> (8 * k)) & 0xffu;
      q[k] = fp::e4m3_encode(h[k] * fp::pow2(127 - (int)e[k]));
    }
    const int col_of_block = 16 * bp + 2 * t;  // item k: col_of_block + 8 (k / 2) + k % 2
    if constexpr (kFp8Pool) {
      // Lanes j = 4a .. 4a + 3 hold channels 4a .. 4a + 3, one pool word: lane j % 4 == m takes item m.
      const u32 x = q[0] | q[1] << 8 | q[2] << 16 | q[3] << 24;
      const u32 v1 = __shfl_xor_sync(0xffffffffu, x, 4), v2 = __shfl_xor_sync(0xffffffffu, x, 8),
                v3 = __shfl_xor_sync(0xffffffffu, x, 12);
      const int m = j % 4;
      u32 word = 0;
#pragma unroll
      for (int from = 0; from < 4; ++from) {  // the lane of channel 4a + from
        const u32 v = from == m ? x : from == (m ^ 1) ? v1 : from == (m ^ 2) ? v2 : v3;
        word |= ((v >> (8 * m)) & 0xffu) << (8 * from);
      }
      const int col = col_of_block + 8 * (m / 2) + m % 2, ch = ch0 + 8 * warp + 4 * (j / 4);
      if (col < d.rows)
        *reinterpret_cast<u32*>(s.l2_act + (size_t)(d.row0 + col) * s.inter + (ch & ~127) +
                                4 * pool_order::pool_word<8>((ch & 127) / 4)) = word;
      if (scales && warp == 0 && j == 0) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int col_k = col_of_block + 8 * (k / 2) + k % 2;
          if (col_k < d.rows) s.l2_sf[(size_t)(ch0 / 128) * s.sf_stride + d.row0 + col_k] = (u8)e[k];
        }
      }
    } else {
      // BF16 pool: E4M3 x 2^(e - 127) widened, lanes j and j ^ 1 (channels 2a, 2a + 1) make the
      // words: the even lane those of block 2 bp, the odd one those of block 2 bp + 1.
      u32 hb[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) hb[k] = unfused::widen2(q[k], fp::pow2((int)e[k] - 127)) & 0xffffu;
      const u32 x0 = hb[0] | hb[1] << 16, x1 = hb[2] | hb[3] << 16;
      const int odd = j % 2;
      const u32 recv = __shfl_xor_sync(0xffffffffu, odd ? x0 : x1, 4);
      const u32 w0 = odd ? __byte_perm(recv, x1, 0x5410) : __byte_perm(x0, recv, 0x5410);
      const u32 w1 = odd ? __byte_perm(recv, x1, 0x7632) : __byte_perm(x0, recv, 0x7632);
      const int col = col_of_block + 8 * odd, ch = ch0 + 8 * warp + 2 * (j / 2);
      u16* dst = reinterpret_cast<u16*>(s.l2_act) + (ch & ~127) + 2 * pool_order::pool_word<16>((ch & 127) / 2);
      if (col < d.rows) *reinterpret_cast<u32*>(dst + (size_t)(d.row0 + col) * s.inter) = w0;
      if (col + 1 < d.rows) *reinterpret_cast<u32*>(dst + (size_t)(d.row0 + col + 1) * s.inter) = w1;
    }
  }

  template <class C>
  __device__ __forceinline__ void tile(C& c, const GemmParams&, const void*, const UnitDesc& d) const {
    constexpr int BN = C::kBN, kBlocks = BN / 8;
    static_assert(kBlocks % 2 == 0, "items go in pairs of 8-token blocks");
    // Coordinates read afresh (volatile): derived from the consumer's members or kept from the
    // kernel's start, ptxas holds them across the main loop, where they spill.
    const int tid = (int)sm90::fresh_tid_x() - 128, warp = tid / 32, j = tid % 32 / 4, t = tid % 4;
    const u32 cta = sm90::fresh_ctaid_x();
    const int ch0 = d.n_col / 2;  // the tile's first channel
    // Pairs are the GEMM's (kPairs): every G = 128 tile is one of a pair, and its exponents go to
    // its half of the exchange.
    const int pair = d.pair, half = pair == gemm::kSecondOfPair ? 1 : 0;
    // Read once from the parameters (a read per use became a register per use).
    const float clamp = s.has_clamp ? s.clamp : __int_as_float(0x7f800000);
    const float* silu_table = s.silu;

    // h of this thread's channel for each of its tokens, in place of the gate's accumulators
    // (acc[4b + cb]: block b, column 2t + cb), and the warp's exponent per token into the exchange:
    // a byte per item, a word per block pair (item k = 2 (b % 2) + cb its byte k). The word goes out
    // by a store the compiler keeps out of the loads' way: an ordinary one may alias the next
    // items' global loads (top-k weight, SiLU) for it and hold them behind, a latency of L2 per pair.
    // Rounds of kRoundPairs block pairs bound the loads in flight, and the registers they hold.
    u32* words = reinterpret_cast<u32*>(c.smem + C::L::kEpilogueAt);
    constexpr int kRoundPairs = 4;
#pragma unroll
    for (int bp = 0; bp < kBlocks / 2; ++bp) {
      if (bp > 0 && bp % kRoundPairs == 0) asm volatile("" ::: "memory");
      u32 exponents = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int b = 2 * bp + k / 2, cb = k % 2, col = 8 * b + 2 * t + cb;
        const float w = col < d.rows ? s.meta[d.row0 + col].weight : 0.0f;
        const u32 gu = sm90::pack_bf16x2(c.acc[4 * b + cb], c.acc[4 * b + 2 + cb]);
        const float h = h_of(gu, silu_table[silu_entry(gu, clamp)], w, clamp);
        c.acc[4 * b + cb] = h;
        float amax = fabsf(h);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        exponents |= (u32)fp::ceil_biased_exponent(amax * (1.0f / fp::kE4m3Max)) << (8 * k);
      }
      if (j == 0) sm90::st_shared_unordered(words + exchange_at<BN>(half, warp, bp, t), exponents);
    }

    // G = 128: the even tile of a pair spills its h ([bp][256 threads] float4) for the odd one,
    // this CTA's next tile, which stores both with the exponents of both halves of the exchange;
    // the even tile's exponents wait there (the odd tile's meeting orders them before its reads).
    if (kPairs && pair == gemm::kFirstOfPair) {
      float* spill = s.spill + (size_t)cta * kSpillFloats<BN>;
#pragma unroll
      for (int bp = 0; bp < kBlocks / 2; ++bp) {
        const float* a = c.acc + 8 * bp;
        __stcg(reinterpret_cast<float4*>(spill) + bp * 256 + tid, make_float4(a[0], a[1], a[4], a[5]));
      }
      return;
    }
    group_bar_sync<G>(warp);

#pragma unroll
    for (int bp = 0; bp < kBlocks / 2; ++bp) {
      const float* a = c.acc + 8 * bp;
      store_items(tid, d, bp, ch0, {a[0], a[1], a[4], a[5]}, group_exponents<BN>(words, warp, bp, t), kPairs);
    }
    // The even tile's h, from the spill, kSpillRound block pairs loaded before any of them is
    // stored (a store may alias them, as above), once this tile's are out of the registers.
    if constexpr (kPairs) {
      const float* spill = s.spill + (size_t)cta * kSpillFloats<BN>;
      constexpr int kSpillRound = kBlocks / 2 < 4 ? kBlocks / 2 : 4;
      static_assert(kBlocks / 2 % kSpillRound == 0, "whole rounds of block pairs");
#pragma unroll
      for (int bp0 = 0; bp0 < kBlocks / 2; bp0 += kSpillRound) {
        float4 f[kSpillRound];
#pragma unroll
        for (int i = 0; i < kSpillRound; ++i) f[i] = __ldcg(reinterpret_cast<const float4*>(spill) + (bp0 + i) * 256 + tid);
#pragma unroll
        for (int i = 0; i < kSpillRound; ++i)
          store_items(tid, d, bp0 + i, ch0 - 64, {f[i].x, f[i].y, f[i].z, f[i].w},
                      group_exponents<BN>(words, warp, bp0 + i, t), false);
      }
    }
    // Every warp has read the exchange (both halves) before the next tile's writes.
    group_bar_sync<G>(warp);
  }

  template <class C>
  __device__ __forceinline__ void finish(C&) const {}
};

}  // namespace swiglu
}  // namespace mm
