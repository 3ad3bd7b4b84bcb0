// sm90_swiglu.cuh -- the L1 GEMM's epilogue: SwiGLU + clamp + top-k weight + re-quantization per G
// channels (DESIGN §1 steps 2-3), from the consumers' accumulators straight into the L2 pool. The
// L1's output never reaches memory in BF16, and no stage runs between the two GEMMs.
//
// The weight transform interleaves gate and up rows (transform.rs, `interleave_gate_up`): in every
// 16 weight rows, rows 0..7 are the gates of 8 channels and rows 8..15 their ups, so a consumer
// thread's two accumulator rows (r, r + 8) hold one channel's gate and up for each of its tokens.
// Weight tile n covers channels 64 n .. 64 n + 63: consumer warp w (0..7) channels 8 w .. 8 w + 7,
// lane / 4 the channel within.
//
// Two roles, so that the tensor core never waits for the epilogue:
//   consumers  (SwigluOut::tile) hand the tile over: each (channel, token)'s gate and up rounded to
//              BF16 as one word into the hand-off box in shared memory, and go on to their next tile;
//   epilogue   (SwigluOut::run, the producer warpgroup's free warps) take each box: per token, h of
//              its 64 channels, the group exponents, E4M3 (or the BF16 pool's widened values) into
//              the L2 pool as 8-byte pieces of the token's pool row (two pool words each).
// An activation group of G channels is half a tile (G = 32) or two tiles (G = 128): the GEMM walks
// such tiles in pairs, both in one CTA, the even one first (Gemm's kPairs); the epilogue keeps the
// first tile's h in the CTA's slot of `spill` (L2) and its exponent in a register, and stores both
// tiles' pieces of a token with the second.
//
// The bits are the contract's: h in f32 as the host computes it (the fast SiLU plus the SiLU
// table's correction of its BF16 gate, products in the contract's order); a group's exponent is
// ceil-exponent(amax / 448), the largest of its parts' (x -> ceil-exponent(fl(x / 448)) is
// monotone), and the same re-quantizer.
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
typedef unsigned long long u64;

struct SwigluParams {
  const unfused::RowMeta* meta;  // [pool rows]: each row's top-k weight
  const u32* silu;               // the SiLU table (unfused::kSiluTableWords, uf_silu_table)
  u8* l2_act;                    // FP8 pool: E4M3 [rows][I]; BF16 pool: BF16 [rows][I] (pool order)
  float* l2_sf;                  // FP8 pool: [I/128][sf_stride] (pool_order.cuh)
  // G = 128: per CTA of the launch (kSpillFloats<L> each), the first tile of a pair's h values
  // ([16 chunks of 4 channels][the tile's tokens, Layout::kUnitTokens] float4).
  float* spill;
  int inter, sf_stride, has_clamp;
  float clamp;
  // Optional (null: the launch's end publishes the pool): per 16 pool rows, the tiles that have
  // stored them, counted with release once a tile's rows are out (the fused forward's L2 waits on
  // them: GemmParams::row_arrivals).
  u32* row_arrivals;
};
static_assert(sizeof(SwigluParams) == 64, "SwigluParams layout (megamoe-kernel/src/epilogue.rs)");

// Floats of one CTA's spill slot for the GEMM layout L's tiles: the even tile's h.
template <class L>
constexpr int kSpillFloats = 64 * L::kUnitTokens;

// A byte per token of an epilogue thread's tiles: four fit a u32, more a u64.
template <bool kWide>
struct TokenBytes {
  using Type = u32;
};
template <>
struct TokenBytes<true> {
  using Type = u64;
};

template <int G, bool kFp8Pool>
struct SwigluOut {
  static_assert(G == 32 || G == 128, "activation groups of 32 or 128 channels");
  static_assert(unfused::kPoolFitsGroup<G, kFp8Pool>, "the FP8 pool carries one scale per 128 channels");
  // A group spans two weight tiles (64 channels each): the GEMM must walk them in pairs.
  static constexpr bool kPairs = G == 128;
  // The consumers hand their tiles to warps of the producer warpgroup (Gemm's kHandoff).
  static constexpr bool kHandoff = true;
  // Pool channels per 4-byte word, and 16-byte groups per 128-channel block of a pool row: group k
  // holds the words of 4 (E4M3) or 2 (BF16) channels at k, k + 32 of each tile of the block
  // (pool_order.cuh: word o of the block sits at 4 (o % n) + o / n).
  static constexpr int kWordChannels = kFp8Pool ? 4 : 2;
  static constexpr int kGroups = 32 / kWordChannels;
  const SwigluParams& s;

  // silu of one item's gate (`gu`: gate low, up high; the L1's sum rounded to BF16 as its output
  // would be), clamped (`clamp` +inf: none): silu_fast corrected by the SiLU table's nibble
  // (`table`: in shared memory), or the clamp's own silu where the clamped gate is the clamp and no
  // BF16 value: from a register (`clamp_silu`) where the epilogue warps have one to spare
  // (kSpareRegs, run's), else read from the table then.
  template <bool kSpareRegs>
  __device__ __forceinline__ static float silu_of(u32 gu, float clamp, float clamp_silu, const u32* table) {
    const u32 gb = __float_as_uint(fminf(__uint_as_float(gu << 16), clamp));
    if constexpr (!kSpareRegs) {
      if (gb & 0xffffu) return __uint_as_float(table[unfused::kSiluClampWord]);
    }
    const u32 byte = reinterpret_cast<const u8*>(table)[unfused::silu_fix_byte(gb)];
    const u32 fast = __float_as_uint(unfused::silu_fast(__uint_as_float(gb)));
    const float silu = __uint_as_float(fast + unfused::silu_fix_of(byte, gb));
    return kSpareRegs && (gb & 0xffffu) ? clamp_silu : silu;
  }

  // h of one (channel, token) from its packed gate and up, its SiLU and its top-k weight.
  __device__ __forceinline__ static float h_of(u32 gu, float silu, float w, float clamp) {
    const float u = fminf(fmaxf(__uint_as_float(gu & 0xffff0000u), -clamp), clamp);
    return __fmul_rn(__fmul_rn(silu, u), w);
  }

  __device__ __forceinline__ static u32 exponent_of(float amax) {
    return fp::ceil_biased_exponent(amax * (1.0f / fp::kE4m3Max));
  }

  // ------------------------------------------------------------ the hand-off box
  // The GEMM's hand-off region (Layout's kHandoff*) starts with its boxes (two for twin units, tile
  // seq in box seq % Layout::kHandoffBoxes): token row tau of a box holds 64
  // words (one per channel of the tile) in 16 chunks of 4 channels; chunk k sits at k ^ (tau % 8),
  // so the consumers' stores (8 channels x 4 tokens a warp) and the epilogue's 16-byte loads (a
  // token per lane) both hit all 32 banks. Once it has taken the box, the epilogue keeps h there in
  // place of the gate/up words.
  __device__ __forceinline__ static int box_word(int tau, int ch) { return tau * 64 + 4 * ((ch >> 2) ^ (tau & 7)) + (ch & 3); }
  template <int BN>
  static constexpr int kBoxBytes = 256 * BN;

  // Consumers (every thread of both warpgroups): once tile `d.seq`'s box is free (the epilogue has
  // taken the tile before it in that box: `d.seq` - Layout::kHandoffBoxes), this thread's gate/up
  // words of its channel into it. The warpgroups then go on to their next unit.
  template <class C>
  __device__ __forceinline__ void tile(C& c, const GemmParams&, const void*, const UnitDesc& d) const {
    using L = typename C::L;
    static_assert(L::kHandoffBytes >= kBoxBytes<L::kUnitTokens>, "the hand-off region holds the box");
    // Read afresh (volatile): derived from the consumer's members, ptxas holds it across the main
    // loop, where it spills.
    const int tid = (int)sm90::fresh_tid_x() - 128, ch = 8 * (tid / 32) + tid % 32 / 4, t = tid % 4;
    const u32 box = d.seq % L::kHandoffBoxes, round = d.seq / L::kHandoffBoxes;
    gemm::ring_wait((u64*)(c.smem + L::kHandoffEmptyAt) + box, (round & 1) ^ 1, c.smem + L::kRingErrorAt);
    u32* words = reinterpret_cast<u32*>(c.smem + L::kEpilogueAt + box * L::kHandoffBytes);
    // Block b: tokens 8b + 2t (+ 1), gate acc[4b (+ 1)], up acc[4b + 2 (+ 1)]; token 8b + x's
    // word of the channel is block 0's token x's plus 512 b words. The overhang's blocks go over
    // whether the unit has those rows or not (the epilogue reads only its rows): a branch there
    // made ptxas serialize the fused kernel's wgmmas (C7511).
    hand_over_blocks<L::kUnitTokens / 8>(c, sm90::smem_addr(words + box_word(2 * t, ch)),
                                         sm90::smem_addr(words + box_word(2 * t + 1, ch)));
    sm90::mbar_arrive((u64*)(c.smem + L::kHandoffFullAt) + box);  // release: the words are visible to the epilogue
  }

  template <int kBlocks, int b = 0, class C>
  __device__ __forceinline__ static void hand_over_blocks(C& c, u32 at0, u32 at1) {
    if constexpr (b < kBlocks) {
      sm90::st_shared_unordered_at<2048 * b>(at0, sm90::pack_bf16x2(c.acc[4 * b], c.acc[4 * b + 2]));
      sm90::st_shared_unordered_at<2048 * b>(at1, sm90::pack_bf16x2(c.acc[4 * b + 1], c.acc[4 * b + 3]));
      hand_over_blocks<kBlocks, b + 1>(c, at0, at1);
    }
  }

  // Consumers, after their last tile (`end`: the producer's end mark): the end mark to the epilogue.
  template <class C>
  __device__ __forceinline__ void finish(C& c, const UnitDesc& end) const {
    using L = typename C::L;
    const u32 box = end.seq % L::kHandoffBoxes, round = end.seq / L::kHandoffBoxes;
    gemm::ring_wait((u64*)(c.smem + L::kHandoffEmptyAt) + box, (round & 1) ^ 1, c.smem + L::kRingErrorAt);
    sm90::mbar_arrive((u64*)(c.smem + L::kHandoffFullAt) + box);
  }

  // ------------------------------------------------------------ the epilogue warps
  // The 8-byte piece of tile-local group k of a token (its channels kWordChannels k .. and 32 +
  // kWordChannels k .., two pool words) from h (`h0`: the first word's channels, `h1` the second's)
  // with exponents e0 and e1 (G = 32: each word's group; G = 128: the same).
  struct Word {
    float h[4];  // kWordChannels of them
  };
  // With kSpareRegs (run's) a conversion for two codes (fp::e4m3_encode2, e4m3_encode4), a third of
  // the instructions of one a code (e4m3_encode, whose NaN test the pairs do without), for more
  // registers.
  template <bool kSpareRegs>
  __device__ __forceinline__ static uint2 piece(const Word& h0, const Word& h1, u32 e0, u32 e1) {
    if constexpr (kFp8Pool) {
      return make_uint2(quantize4<kSpareRegs>(h0.h, e0), quantize4<kSpareRegs>(h1.h, e1));
    } else {
      return make_uint2(quantize2_widened<kSpareRegs>(h0.h, e0), quantize2_widened<kSpareRegs>(h1.h, e1));
    }
  }
  template <bool kSpareRegs>
  __device__ __forceinline__ static u32 quantize4(const float* h, u32 e) {
    const float inv = fp::pow2(127 - (int)e);
    if constexpr (kSpareRegs) return fp::e4m3_encode4(h[0] * inv, h[1] * inv, h[2] * inv, h[3] * inv);
    return (u32)fp::e4m3_encode(h[0] * inv) | (u32)fp::e4m3_encode(h[1] * inv) << 8 |
           (u32)fp::e4m3_encode(h[2] * inv) << 16 | (u32)fp::e4m3_encode(h[3] * inv) << 24;
  }
  template <bool kSpareRegs>
  __device__ __forceinline__ static u32 quantize2_widened(const float* h, u32 e) {
    const float inv = fp::pow2(127 - (int)e);
    const u32 q = kSpareRegs ? fp::e4m3_encode2(h[0] * inv, h[1] * inv)
                               : (u32)fp::e4m3_encode(h[0] * inv) | (u32)fp::e4m3_encode(h[1] * inv) << 8;
    return unfused::widen2(q, fp::pow2((int)e - 127));
  }

  // One token of a tile, by kLanes lanes (`j` this one's place among them): h of chunks j,
  // j + kLanes, .. of its 16 (4 channels each) in place of their gate/up words, and the largest |h|
  // of each half (channels 0..31, 32..63) over the token's lanes.
  template <int kLanes, bool kSpareRegs>
  __device__ __forceinline__ float2 token_h(u32* row, int swizzle, float w, float clamp, float clamp_silu,
                                            const u32* table, int j) const {
    float2 amax = make_float2(0.0f, 0.0f);
#pragma unroll 1
    for (int k = 0; k < 16 / kLanes; ++k) {
      u32* at = row + 4 * ((j + k * kLanes) ^ swizzle);
      const uint4 gu = *reinterpret_cast<const uint4*>(at);
      const float4 h = make_float4(h_of(gu.x, silu_of<kSpareRegs>(gu.x, clamp, clamp_silu, table), w, clamp),
                                   h_of(gu.y, silu_of<kSpareRegs>(gu.y, clamp, clamp_silu, table), w, clamp),
                                   h_of(gu.z, silu_of<kSpareRegs>(gu.z, clamp, clamp_silu, table), w, clamp),
                                   h_of(gu.w, silu_of<kSpareRegs>(gu.w, clamp, clamp_silu, table), w, clamp));
      const float m = fmaxf(fmaxf(fabsf(h.x), fabsf(h.y)), fmaxf(fabsf(h.z), fabsf(h.w)));
      *reinterpret_cast<float4*>(at) = h;
      if (k * kLanes < 8) {
        amax.x = fmaxf(amax.x, m);
      } else {
        amax.y = fmaxf(amax.y, m);
      }
    }
    if constexpr (kLanes > 1) {
      // The token's lanes: kLanes consecutive lanes of one warp, every one through the same tokens.
      const u32 lanes = ((1u << kLanes) - 1) << (sm90::fresh_tid_x() % 32 & ~(kLanes - 1));
#pragma unroll
      for (int o = 1; o < kLanes; o <<= 1) {
        amax.x = fmaxf(amax.x, __shfl_xor_sync(lanes, amax.x, o));
        amax.y = fmaxf(amax.y, __shfl_xor_sync(lanes, amax.y, o));
      }
      __syncwarp(lanes);  // the box row's h, which other lanes of the token store from (BF16 pools)
    }
    return amax;
  }

  // The epilogue warps (`thread` 0 .. L::kEpilogueThreads - 1 among them), until the consumers' end
  // mark: each tile's tokens over the threads, kLanes threads a token at a time; the box back to
  // the consumers once every token of it is stored. Small tiles (two CTAs per SM: a few rows a
  // tile) give a token 8 lanes, so that its 16 chunks are 2 rounds of one lane's latency instead
  // of 16: the layer's last tile waits for its epilogue before the next layer
  // starts (perf.md v104); the large tiles' tokens fill the warps one a lane. The FP8 route's
  // 32-token tile keeps a lane a token too: with 8 (or 2), ptxas serializes that fused kernel's
  // wgmmas (C7511; perf.md v105).
  template <class L>
  __device__ __forceinline__ void run(u8* smem) const {
    constexpr int kTokens = L::kUnitTokens, kThreads = L::kEpilogueThreads;
    constexpr int kLanes = kTokens <= (L::kFp8Route ? 16 : 32) ? 8 : 1;
    // Tokens of a tile at most, and of this thread's lanes (each kThreads / kLanes-th).
    constexpr int kThreadTokens = (kTokens + kThreads / kLanes - 1) / (kThreads / kLanes);
    // One CTA per SM: the epilogue warps have registers to spare (56 or more) for the clamp's silu
    // (silu_of) and paired codes (piece); with two CTAs per SM, one more register held (either)
    // made ptxas serialize a 32-token fused kernel's wgmmas (C7511).
    constexpr bool kSpareRegs = L::kProducerRegs >= 56;
    static_assert(!kPairs || kThreadTokens <= 8, "a pair's first exponents: a byte per token");
    static_assert(L::kHandoffBytes >= kBoxBytes<kTokens>, "the hand-off region holds the box");
    using Exponents = typename TokenBytes<(kThreadTokens > 4)>::Type;
    Exponents first_exponents = 0;  // G = 128: the pair's first tile's exponent of each of this thread's tokens
    static_assert(L::kSiluBytes == unfused::kSiluTableBytes, "the layout holds the SiLU table");
    {
      // The SiLU table into shared memory before the first tile, which comes a main loop later.
      const int thread = (int)sm90::fresh_tid_x() - (128 - kThreads);
      uint4* table = reinterpret_cast<uint4*>(smem + L::kSiluAt);
#pragma unroll 1
      for (int i = thread; i < unfused::kSiluTableBytes / 16; i += kThreads)
        table[i] = __ldg(reinterpret_cast<const uint4*>(s.silu) + i);
      sm90::named_bar_sync<3, kThreads>();
    }
    // Unit seq's descriptor is in the producer's ring (slot seq % kUnitSlots) until the consumers'
    // next unit but one (Layout::kUnitSlots).
    for (u32 seq = 0, slot = 0;; ++seq, slot = slot + 1 == L::kUnitSlots ? 0 : slot + 1) {
      const u32 box = seq % L::kHandoffBoxes;
      gemm::ring_wait((u64*)(smem + L::kHandoffFullAt) + box, seq / L::kHandoffBoxes & 1, smem + L::kRingErrorAt);
      const UnitDesc* desc = reinterpret_cast<const UnitDesc*>(smem + L::kUnitsAt) + slot;
      const int ch0 = desc->n_col / 2;  // the tile's first channel; a cluster's ghost tile: past I
      const int rows = ch0 < s.inter ? desc->rows : 0, row0 = desc->row0;
      if (desc->kb_range == 0) break;
      const int pair = kPairs ? desc->pair : gemm::kAlone;
      // Read here (the thread afresh), not before the loop: values the compiler holds from the
      // role's start cost the consumers registers (their wgmmas serialized, C7511).
      const int thread = (int)sm90::fresh_tid_x() - (128 - kThreads), j = thread % kLanes;
      const float clamp = s.has_clamp ? s.clamp : __int_as_float(0x7f800000);
      const u32* table = reinterpret_cast<const u32*>(smem + L::kSiluAt);
      const float clamp_silu = kSpareRegs ? __uint_as_float(table[unfused::kSiluClampWord]) : 0.0f;
#pragma unroll 1
      for (int tau = thread / kLanes, n = 0; tau < rows; tau += kThreads / kLanes, ++n) {
        u32* row = reinterpret_cast<u32*>(smem + L::kEpilogueAt + box * L::kHandoffBytes) + tau * 64;
        const int swizzle = tau & 7;
        // G = 128: this CTA's spill slot, [chunk k of 4 channels][token] float4; this token's
        // chunks, on their way to L1 while h is computed when the first tile's h is to come back.
        // (A pair is FP8 pools': a lane's pieces are its own chunks, k and 8 + k.)
        float4* spill = reinterpret_cast<float4*>(s.spill) + (size_t)blockIdx.x * (kSpillFloats<L> / 4) + tau;
        if (pair == gemm::kSecondOfPair) {
#pragma unroll
          for (int k = j; k < 16; k += kLanes) sm90::prefetch_l1(spill + k * kTokens);
        }
        const float w = __ldg(&s.meta[row0 + tau].weight);
        const float2 amax = token_h<kLanes, kSpareRegs>(row, swizzle, w, clamp, clamp_silu, table, j);
        u32 e0 = exponent_of(amax.x), e1 = exponent_of(amax.y);
        if (pair == gemm::kFirstOfPair) {
          // h waits in the spill, its exponent in a byte of this thread, for the pair's second tile.
#pragma unroll 1
          for (int k = j; k < 16; k += kLanes)
            spill[k * kTokens] = *reinterpret_cast<const float4*>(row + 4 * (k ^ swizzle));
          first_exponents = (first_exponents & ~((Exponents)0xff << (8 * n))) | (Exponents)max(e0, e1) << (8 * n);
          continue;
        }
        if constexpr (kPairs) e0 = e1 = max(max(e0, e1), (u32)(first_exponents >> (8 * n)) & 0xffu);
        u8* dst = s.l2_act + ((size_t)(row0 + tau) * s.inter + (ch0 & ~127)) * (kFp8Pool ? 1 : 2);
        // This tile's piece of each 16-byte group k of the block's pool row: its channels of pool
        // words k and k + kGroups (kWordChannels each, from kWordChannels k and 32 + kWordChannels k).
#pragma unroll 1
        for (int k = j; k < kGroups; k += kLanes) {
          const int a = kWordChannels * k, b = 32 + a;
          const Word h0 = box_channels(row, swizzle, a), h1 = box_channels(row, swizzle, b);
          *reinterpret_cast<uint2*>(dst + 16 * k + 8 * ((ch0 / 64) % 2)) = piece<kSpareRegs>(h0, h1, e0, e1);
        }
        if constexpr (kPairs) {
          // The pair's first tile's pieces (its half of every group), from the spill.
#pragma unroll 1
          for (int k = j; k < kGroups; k += kLanes) {
            const int a = kWordChannels * k, b = 32 + a;
            const Word h0 = spilled(spill, kTokens, a), h1 = spilled(spill, kTokens, b);
            *reinterpret_cast<uint2*>(dst + 16 * k) = piece<kSpareRegs>(h0, h1, e0, e0);
          }
        }
        if (kFp8Pool && j == 0)
          s.l2_sf[(size_t)(ch0 / 128) * s.sf_stride + pool_order::scale_column(row0 + tau)] = fp::ue8m0_float(e0);
      }
      sm90::mbar_arrive((u64*)(smem + L::kHandoffEmptyAt) + box);  // the box is the consumers' again
      if (s.row_arrivals && ch0 < s.inter) count_rows<kThreads>(row0);
    }
  }

  // Every epilogue thread, after its stores of a tile: the tile counts at its rows' first 16-row
  // granule (their count reaches the layer's tiles per row block once all are out), published to
  // the async proxy that reads them.
  template <int kThreads>
  __device__ __forceinline__ void count_rows(int row0) const {
    sm90::fence_proxy_async_global();
    sm90::named_bar_sync<3, kThreads>();  // the epilogue warps: every thread's stores are done
    if (sm90::fresh_tid_x() == 128 - kThreads) sm90::red_add_release_gpu(s.row_arrivals + row0 / 16, 1);
  }

  // h of a pool word's channels ch .. ch + kWordChannels - 1 of a token: from its row of the box,
  // or from its chunks of the spill (the pair's first tile).
  __device__ __forceinline__ static Word box_channels(const u32* row, int swizzle, int ch) {
    const u32* at = row + 4 * ((ch >> 2) ^ swizzle) + (ch & 3);
    if constexpr (kWordChannels == 4) {
      const float4 f = *reinterpret_cast<const float4*>(at);
      return Word{{f.x, f.y, f.z, f.w}};
    } else {
      const float2 f = *reinterpret_cast<const float2*>(at);
      return Word{{f.x, f.y, 0.0f, 0.0f}};
    }
  }
  __device__ __forceinline__ static Word spilled(const float4* spill, int bn, int ch) {
    if constexpr (kWordChannels == 4) {
      const float4 f = spill[(ch / 4) * bn];
      return Word{{f.x, f.y, f.z, f.w}};
    } else {
      const float2 f = reinterpret_cast<const float2*>(spill + (ch / 4) * bn)[(ch / 2) % 2];
      return Word{{f.x, f.y, 0.0f, 0.0f}};
    }
  }
};

}  // namespace swiglu
}  // namespace mm
