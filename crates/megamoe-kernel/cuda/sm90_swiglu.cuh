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
// even one first (Gemm's kPairs); the first spills its h and group exponents to the CTA's slot of
// `spill` (L2) and the second stores both.
//
// A group's exponent is ceil-exponent(amax / 448), and x -> ceil-exponent(fl(x / 448)) is monotone,
// so it is the largest of the warps' exponents over their own channels (and the bytes' largest per
// item is their __vmaxu4): the warps meet over a byte per (token, warp) in the epilogue's shared
// memory, never over the h values themselves. The bits
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
  // G = 128: per CTA of the launch (kSpillFloats<BN> each), the first tile of a pair: its h values
  // ([BN / 16][256 consumer threads] float4) and its group exponents ([BN / 16][4] u32).
  float* spill;
  int inter, sf_stride, has_clamp;
  float clamp;
};
static_assert(sizeof(SwigluParams) == 56, "SwigluParams layout (megamoe-kernel/src/epilogue.rs)");

// Floats of one CTA's spill slot for BN-token tiles: the even tile's h and exponents.
template <int BN>
constexpr int kSpillFloats = 64 * BN + BN / 4;

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

// Largest byte of a word.
__device__ __forceinline__ u32 max_byte(u32 v) {
  v = __vmaxu4(v, v >> 16);
  return __vmaxu4(v, v >> 8) & 0xffu;
}

template <int G, bool kFp8Pool>
struct SwigluOut {
  static_assert(G == 32 || G == 128, "activation groups of 32 or 128 channels");
  static_assert(unfused::kPoolFitsGroup<G, kFp8Pool>, "the FP8 pool carries one scale per 128 channels");
  // A group spans two weight tiles (64 channels each): the GEMM must walk them in pairs.
  static constexpr bool kPairs = G == 128;
  const SwigluParams& s;

  // h of one (channel, token): the L1's sums rounded to BF16 as its output would be (one cvt for
  // the pair), clamped (`clamp` +inf: none), SiLU from the table (a clamped gate that is no BF16
  // value is the clamp itself: its own entry).
  __device__ __forceinline__ static float h_of(float gate_acc, float up_acc, float w, float clamp,
                                               const float* silu_table) {
    const u32 gu = sm90::pack_bf16x2(gate_acc, up_acc);
    const float g = fminf(__uint_as_float(gu << 16), clamp);
    const float u = fminf(fmaxf(__uint_as_float(gu & 0xffff0000u), -clamp), clamp);
    const u32 gb = __float_as_uint(g);
    const float silu = silu_table[(gb & 0xffffu) == 0 ? gb >> 16 : unfused::kSiluClampEntry];
    return __fmul_rn(__fmul_rn(silu, u), w);
  }

  // Where warp `warp` puts its exponent of item k of block pair bp of thread-in-quad t in the
  // exchange: the group's warps' bytes of one thread's four items side by side (G = 128: 8 warps,
  // 32 bytes; G = 32: the warpgroup's 4 warps, 16 bytes), read back with one or two 16-B loads.
  template <int BN>
  __device__ __forceinline__ static int exchange_at(int warp, int bp, int t, int k) {
    if constexpr (G == 128) {
      return ((bp * 4 + t) * 4 + k) * 8 + warp;
    } else {
      return ((((warp / 4) * (BN / 16) + bp) * 4 + t) * 4 + k) * 4 + warp % 4;
    }
  }

  // The group exponents of this thread's items of block pair bp, once the warps met: the largest
  // of their bytes, packed a byte an item.
  template <int BN>
  __device__ __forceinline__ static u32 group_exponents(const u8* exchange, int warp, int bp, int t) {
    // The group's first warp: its bytes start the item's (16-B aligned).
    const uint4* at = reinterpret_cast<const uint4*>(exchange + exchange_at<BN>(G == 128 ? 0 : warp / 4 * 4, bp, t, 0));
    const uint4 v = at[0];
    if constexpr (G == 128) {
      const uint4 w = at[1];
      return max_byte(__vmaxu4(v.x, v.y)) | max_byte(__vmaxu4(v.z, v.w)) << 8 | max_byte(__vmaxu4(w.x, w.y)) << 16 |
             max_byte(__vmaxu4(w.z, w.w)) << 24;
    } else {
      return max_byte(v.x) | max_byte(v.y) << 8 | max_byte(v.z) << 16 | max_byte(v.w) << 24;
    }
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
    constexpr int BN = C::kBN, kBlocks = BN / 8, kRoundBlocks = 8;
    static_assert(kBlocks % 2 == 0, "items go in pairs of 8-token blocks");
    // Coordinates read afresh (volatile): derived from the consumer's members or kept from the
    // kernel's start, ptxas holds them across the main loop, where they spill.
    const int tid = (int)sm90::fresh_tid_x() - 128, warp = tid / 32, j = tid % 32 / 4, t = tid % 4;
    u32 cta;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
    const int ch0 = d.n_col / 2;  // the tile's first channel
    // Pairs are the GEMM's (kPairs): every G = 128 tile is one of a pair.
    const int pair = d.pair;
    u8* exchange = c.smem + C::L::kEpilogueAt;
    // Read once from the parameters (a read per use became a register per use).
    const float clamp = s.has_clamp ? s.clamp : __int_as_float(0x7f800000);
    const float* silu_table = s.silu;

    // h of this thread's channel for each of its tokens, in place of the gate's accumulators
    // (acc[4b + cb]: block b, column 2t + cb); the warp's exponent per token into the exchange.
    // In rounds of kRoundBlocks blocks, whose loads may not move to an earlier round: with every
    // top-k weight loaded at once, 256-token tiles ran out of registers.
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      if (b > 0 && b % kRoundBlocks == 0) asm volatile("" ::: "memory");
#pragma unroll
      for (int cb = 0; cb < 2; ++cb) {
        const int col = 8 * b + 2 * t + cb;
        const float w = col < d.rows ? s.meta[d.row0 + col].weight : 0.0f;
        const float h = h_of(c.acc[4 * b + cb], c.acc[4 * b + 2 + cb], w, clamp, silu_table);
        c.acc[4 * b + cb] = h;
        float amax = fabsf(h);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (j == 0)
          exchange[exchange_at<BN>(warp, b / 2, t, 2 * (b % 2) + cb)] =
              (u8)fp::ceil_biased_exponent(amax * (1.0f / fp::kE4m3Max));
      }
    }
    group_bar_sync<G>(warp);

    // G = 128: the even tile of a pair spills its h and exponents ([bp][256 threads] float4, then
    // [bp][t] u32) for the odd one, this CTA's next tile, which stores both.
    float* spill = s.spill + (size_t)cta * kSpillFloats<BN>;
    u32* spill_e = reinterpret_cast<u32*>(spill + 64 * BN);
    if (kPairs && pair == gemm::kFirstOfPair) {
#pragma unroll
      for (int bp = 0; bp < kBlocks / 2; ++bp) {
        const float* a = c.acc + 8 * bp;
        __stcg(reinterpret_cast<float4*>(spill) + bp * 256 + tid, make_float4(a[0], a[1], a[4], a[5]));
        if (warp == 0 && j == 0) __stcg(spill_e + bp * 4 + t, group_exponents<BN>(exchange, warp, bp, t));
      }
    } else {
#pragma unroll
      for (int bp = 0; bp < kBlocks / 2; ++bp) {
        if (bp > 0 && bp % (kRoundBlocks / 2) == 0) asm volatile("" ::: "memory");  // rounds, as above
        u32 es = group_exponents<BN>(exchange, warp, bp, t);
        if (kPairs) es = __vmaxu4(es, __ldcg(spill_e + bp * 4 + t));  // the even tile's
        const float* a = c.acc + 8 * bp;
        store_items(tid, d, bp, ch0, {a[0], a[1], a[4], a[5]}, es, kPairs);
      }
      if (kPairs) {
        // The even tile's, from the spill (not from the accumulators: a loop, not unrolled).
#pragma unroll 1
        for (int bp = 0; bp < kBlocks / 2; ++bp) {
          const u32 es = __vmaxu4(group_exponents<BN>(exchange, warp, bp, t), __ldcg(spill_e + bp * 4 + t));
          const float4 f = __ldcg(reinterpret_cast<const float4*>(spill) + bp * 256 + tid);
          store_items(tid, d, bp, ch0 - 64, {f.x, f.y, f.z, f.w}, es, false);
        }
      }
    }
    // Every warp has read the exchange (and the even tile's exponents) before the next tile's writes.
    group_bar_sync<G>(warp);
  }

  template <class C>
  __device__ __forceinline__ void finish(C&) const {}
};

}  // namespace swiglu
}  // namespace mm
