// sm90_mega_moe.cuh -- the fused MoE forward on Hopper: one persistent launch per forward, from this
// rank's routes to y. Every CTA of the grid (all resident at once: one or two per SM, the GEMM's
// shape, 384 threads) runs the stages in turn, each stage the very device function the unfused
// pipeline's launch of it runs (sm90_unfused.cuh, and the grouped GEMM's pieces of
// sm90_moe_gemm.cuh), so the fused forward's bits are the unfused forward's — but the one-CTA
// kernels' whole-token dispatch, whose own functions write the same pool bytes by bulk stores:
//
//   0. inputs    only for an engine's inputs in other formats, over the grid: BF16 x quantized
//                (as the host quantizer does) and i64 expert ids narrowed, into the pipeline's
//                input buffers, which the stages below then read; grid barrier;
//   1. count     CTA 0: this rank's routes per expert, published into every rank's counts table;
//                the ranks meet (grid barrier, CTA 0 meets the other ranks, grid barrier; one
//                rank: CTA 0 goes on to its plan);
//   2. plan      CTA 0: every owner's pool plan from the counts table (capacity and ids checked:
//                an error stops every rank alike, each still meeting the others below);
//   3. route     a CTA per expert (strided over the grid): each pair's pool row at its owner,
//                the padding marks of this rank's pool; each CTA's first L1 weights into L2;
//   4. dispatch  tokens (pairs, when few) over the grid: each token's row into its owners' L1 pools
//                (peer stores), read once for its slots; the one-CTA kernels' whole tokens go
//                through the still idle shared memory, one bulk store a slot;
//                the ranks meet;
//   5. L1        the grouped GEMM's roles over the L1 pool (producer, two consumer warpgroups,
//                the epilogue warps; on two-CTA FP8 tiles a converter warp), its epilogue SwiGLU + clamp + top-k
//                weight + re-quantization into the L2 pool (sm90_swiglu.cuh), each tile counted
//                at its rows once stored (arrival counters);
//   6. L2        the grouped GEMM's roles over the L2 pool, each tile's loads once its rows'
//                count says every L1 tile of them is stored: a CTA goes on from its L1 tiles to
//                L2's while others still run L1; BF16 l2_out; grid barrier;
//   7. combine   pool rows of other ranks' tokens into their combine buffers (peer stores); the
//                ranks meet (one rank: no meeting, the grid barrier after L2 has ordered l2_out);
//                tokens over the grid: the top-k sum into y.
//
// Between the other stages a grid barrier (barriers.cuh: one word, never reset) orders every CTA's
// writes before every CTA's reads; stages that hand data to the TMA (the pools) or take it from the
// TMA (l2_out) also cross the async proxy (sm90::fence_proxy_async_global). The cross-rank meetings
// time out into the barrier's error word; every CTA then leaves the kernel. The workspace is left ready for the
// next call: the GEMMs' tickets, hand-over flags and row counts return to 0, the barrier words run on.
#pragma once

#include "barriers.cuh"
#include "sm90_swiglu.cuh"

namespace mm {
namespace mega {

using gemm::GemmParams;
using swiglu::SwigluParams;
using namespace mm::unfused;
typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

constexpr int kThreads = gemm::kThreads;

// An engine's inputs in formats the stages do not read, and where stage 0 puts them converted (the
// pipeline's own input buffers, which the stages' parameters then name).
struct InputParams {
  const u16* x_bf16;          // [T][H] BF16, or null: the stages read the engine's E4M3 x and x_sf
  const long long* topk_i64;  // [T*k] i64 expert ids, or null: the stages read the engine's i32 ids
  u8* x;                      // [T][H] E4M3, out
  u8* x_sf;                   // [T][H/G] UE8M0, out
  int* topk_idx;              // [T*k] i32, out
  u64* error;                 // [2] the plan's error words: an id outside -1..E (kPlanErrorExpert)
  int hidden, top_k, num_experts, pad_;
};

// Everything one forward of one rank needs, each stage's part as that stage's own parameters (the
// unfused launches take the same structs). Rows and tokens the device learns in the kernel (the
// pool's rows from the plan) are filled in there, not here.
struct MegaParams {
  InputParams inputs;
  CountParams count;
  PlanParams plan;
  RouteParams route;
  DispatchParams dispatch;
  SwigluParams swiglu;            // the L1's epilogue
  CombineSendParams combine_send; // rows: from the plan, in the kernel
  CombineReduceParams combine_reduce;
  RankBarrierParams ranks;        // the cross-rank meetings (signals, error word, timeout)
  GemmParams l1, l2;              // expert tables: this rank's plan tables, written in stage 2
  u64* grid_word;                 // the grid barrier's word (0 when first used, never reset)
  // Optional (null: off): [kStamps] %globaltimer ns at the start and after each stage's barrier,
  // by CTA 0 (each barrier ends a stage for the whole grid): the forward's stage times.
  u64* stage_clock;
  // Optional (null: `tokens` is T): T read from the device when the kernel starts, at most `tokens`
  // (then the most the buffers hold), so that one captured launch serves every T. A T outside
  // 0..tokens is refused through the plan's error word (kPlanErrorTokens) and the forward does
  // nothing but meet the other ranks.
  const int* tokens_dev;
  int num_ranks, tokens;
  int row_granules;  // counters of swiglu.row_arrivals (= l2.row_arrivals): pool rows / 16
  int pad_;
};
static_assert(sizeof(InputParams) == 64, "InputParams layout");
static_assert(sizeof(MegaParams) == 64 + 48 + 64 + 64 + 88 + 64 + 40 + 64 + 32 + 2 * 120 + 40, "MegaParams layout");

// The plan error word's kind for a device T outside 0..max (error[1]: that T).
constexpr u64 kPlanErrorTokens = 4;

// This forward's T (every CTA reads the same; read afresh where needed, nothing held across the
// GEMM roles): 0 when the device's T is out of range, which stage 1 reports.
__device__ __forceinline__ int forward_tokens(const MegaParams& p) {
  if (!p.tokens_dev) return p.tokens;
  const int t = *p.tokens_dev;
  return t >= 0 && t <= p.tokens ? t : 0;
}

// Stamps of stage_clock: start, counts met, plan, dispatch met, L1 (with SwiGLU), L2, combine met, end.
constexpr int kStamps = 8;
// The thread and CTA are read afresh (volatile): held in registers from the kernel's start, they
// would be live across the GEMM roles.
__device__ __forceinline__ void stamp(const MegaParams& p, int i) {
  if (p.stage_clock && (sm90::fresh_ctaid_x() | sm90::fresh_tid_x()) == 0) p.stage_clock[i] = barriers::ptx::globaltimer();
}


// Every CTA: after a stage whose writes other ranks read (and before one that reads theirs). One
// rank: a grid barrier (nothing leaves the GPU before the kernel ends). Returns false, in every
// thread of every CTA, when a rank did not arrive.
__device__ __forceinline__ bool meet_ranks(const MegaParams& p) {
  if (p.num_ranks == 1) {
    barriers::grid_barrier(p.grid_word);
    return true;
  }
  return barriers::grid_rank_barrier(p.grid_word, p.ranks.view, p.ranks.signals, p.ranks.error_word,
                                     p.ranks.timeout_ns);
}

// `items` work items over the grid's warps, each a worker of its own (a CTA per item would leave
// most of its threads a unit or two of a row, one load in flight each), an item split in parts
// along its channels when there are fewer items than warps (as the unfused launches split them
// over gridDim.y), at most `max_parts` so that every lane keeps work: f(item, thread, threads)
// with this lane's place among the item's.
constexpr int kWarps = kThreads / 32;
template <class F>
__device__ __forceinline__ void over_warps(int items, int max_parts, F f) {
  if (items <= 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int workers = gridDim.x * kWarps;
  const int parts = max(1, min(max_parts, workers / items));
  for (int w = blockIdx.x * kWarps + warp; w < items * parts; w += workers) {
    const int part = w % parts;
    f(w / parts, part * 32 + lane, parts * 32);
  }
}

// Parts an item of `units` channel units may be split in with every lane keeping kUnroll.
template <int kUnroll>
__device__ __forceinline__ int max_parts(int units) { return max(1, units / (32 * kUnroll)); }

// Units each lane of the glue stages loads before it stores (sm90_unfused.cuh's kUnroll): a CTA of
// 384 threads per SM has a fifth of the unfused launches' warps (16 CTAs of 128), so each lane
// keeps several units in flight; two CTAs per SM (80 registers a thread, small T) take fewer.
template <int kCtasPerSm>
constexpr int kGlueUnroll = kCtasPerSm == 1 ? 8 : 2;
// Slot rows each lane of the top-k reduction loads at once (combine_reduce_token's kLoads).
template <int kCtasPerSm>
constexpr int kReduceLoads = kCtasPerSm == 1 ? 8 : 4;

// The grouped GEMM of one layer: set up, its roles over this rank's pool with the layer's epilogue,
// back to one thread group with every barrier of its ring invalidated. The shared memory's aligned
// base is found afresh: nothing is held across the other layer's roles.
template <class Layer, class Epilogue>
__device__ __forceinline__ void gemm_layer(const GemmParams& layer, const void* act_map, const void* out_map,
                                           const Epilogue& epi) {
  extern __shared__ __align__(1024) u8 smem_raw[];
  u8* smem = sm90::align_smem(smem_raw);
  Layer::setup(layer, smem);
  Layer::roles(layer, act_map, out_map, epi, smem);
  Layer::rejoin(smem);
}


// Rows of this rank's pool plan (the last expert's end), read once the plan is published.
__device__ __forceinline__ int pool_rows(const GemmParams& layer) {
  const int last = layer.num_experts - 1;
  return layer.expert_offset[last] + layer.expert_rows[last];
}

// The glue stages. (Calls of their own, noinline, spill under the call convention's registers.)

// A warp's part of a token's pool row, `bytes` of `buf` written by its lanes, out to each routed
// slot of the token (`route`, `ids`: its k pool rows and experts) at byte `at` of the slot's row
// (`row_bytes` a row): one bulk store a slot by lane 0, committed as one group.
__device__ __forceinline__ void store_slots_bulk(const DispatchParams& p, const int* route, const int* ids, int k,
                                                 int lane, int row_bytes, int at, const void* buf, int bytes) {
  sm90::fence_proxy_async_shared();  // the lanes' writes of buf, before the async proxy reads it
  __syncwarp();
  if (lane == 0) {
    for (int j = 0; j < k; ++j)
      if (route[j] >= 0)
        sm90::bulk_store(reinterpret_cast<u8*>(p.peers->l1_act[ids[j] / p.experts_per_rank]) +
                             (size_t)route[j] * row_bytes + at,
                         buf, (u32)bytes);
    sm90::bulk_commit();
  }
}

// 4. dispatch of an FP8 pool's whole token t by one warp of a one-CTA kernel (`lane` its place):
// the row in pool order into `buf` (h bytes of this warp's two: the one its last bulk stores but
// one read from), then one bulk store of it per routed slot, which the TMA writes while the warp
// goes on (no registers held for it: the stage 8 % shorter than with stores from registers,
// perf.md v122), then the scales and RowMeta as dispatch_slots_fp8 — its lines, not a function
// both share: as a call of its own they spilled the two-CTA 32-token kernel (16 B). Its scale loop
// steps one 64-bit address: in dispatch_slots_fp8's pointer-and-stride form ptxas serialized the
// 256-token fused kernel's wgmmas (C7511, perf.md v125). Returns
// whether the token has a routed slot (then it committed a bulk group that reads `buf`).
// kUnroll 6: at 8 ptxas spilled the 128-token kernel's consumers, at 4 it serialized the
// 256-token kernel's wgmmas (C7511).
template <int kUnroll>
__device__ __forceinline__ bool dispatch_token_fp8_bulk(const DispatchParams& p, int t, int lane, u8* buf) {
  const int h = p.hidden, k = p.top_k;
  const u8* src = p.x + (size_t)t * h;
  const int* route = p.route + (size_t)t * k;
  const int* ids = p.topk_idx + (size_t)t * k;
  bool routed = false;
  for (int j = 0; j < k; ++j) routed |= route[j] >= 0;
  if (!routed) return false;
  if (lane == 0) sm90::bulk_wait_read<1>();  // the buffer's last stores (two tokens ago) have read it
  __syncwarp();
  for (int c0 = lane * 16; c0 < h; c0 += 32 * 16 * kUnroll) {
    u32 w[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32 * 16;
      if (c >= h) break;
      const u8* block = src + (c & ~127);
#pragma unroll
      for (int b = 0; b < 4; ++b)
        w[u][b] = *reinterpret_cast<const u32*>(block + pool_order::unit_source_byte((c & 127) / 16, b));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32 * 16;
      if (c >= h) break;
      *reinterpret_cast<uint4*>(buf + c) = make_uint4(w[u][0], w[u][1], w[u][2], w[u][3]);
    }
  }
  store_slots_bulk(p, route, ids, k, lane, h, 0, buf, h);
  const int k_blocks = h / 128;
  const u8* src_sf = p.x_sf + (size_t)t * k_blocks;
  check_token_scales<128>(p, t, src_sf, lane, 32);
  for (int j = 0; j < k; ++j) {
    const int row = route[j];
    if (row < 0) continue;
    const int owner = ids[j] / p.experts_per_rank;
    const bool in_table = !p.staged || owner == p.rank;
    const u64 kb_stride = in_table ? 4ull * p.sf_stride : 4ull;
    u64 at = (in_table ? p.peers->l1_sf[owner] + 4ull * pool_order::scale_column(row)
                       : p.peers->l1_staged[owner] + (u64)row * p.staged_row_bytes) + lane * kb_stride;
    for (int kb = lane; kb < k_blocks; kb += 32, at += 32 * kb_stride)
      *reinterpret_cast<float*>(at) = fp::ue8m0_float(src_sf[kb]);
    if (lane == 0) store_row_meta(p, owner, row, t, j);
  }
  return true;
}

// 4. dispatch of a BF16 pool's whole token t, part `part` of `parts` (contiguous runs of its
// 128-channel blocks), by one warp of a one-CTA kernel: the part widened into `buf` (this warp's
// buffer of two the group two parts back no longer reads), one bulk store of it per routed slot,
// then (part 0) the token's scale check and RowMeta. Pools without staged rows only (the staged
// slots' raw rows are dispatch_slots_bf16's). Returns whether it committed a bulk group.
template <int G, int kUnroll>
__device__ __forceinline__ bool dispatch_part_bf16_bulk(const DispatchParams& p, int t, int part, int parts, int lane,
                                                        u16* buf) {
  const int h = p.hidden, k = p.top_k, blocks = h / 128;
  const u8* src = p.x + (size_t)t * h;
  const u8* src_sf = p.x_sf + (size_t)t * (h / G);
  const int* route = p.route + (size_t)t * k;
  const int* ids = p.topk_idx + (size_t)t * k;
  bool routed = false;
  for (int j = 0; j < k; ++j) routed |= route[j] >= 0;
  if (!routed) return false;
  const int c_begin = part * blocks / parts * 128, c_end = (part + 1) * blocks / parts * 128;
  if (lane == 0) sm90::bulk_wait_read<1>();
  __syncwarp();
  for (int c0 = c_begin + lane * 16; c0 < c_end; c0 += 32 * 16 * kUnroll) {
    WideUnit w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32 * 16;
      if (c >= c_end) break;
      w[u] = load_wide_unit<G>(src, src_sf, c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32 * 16;
      if (c >= c_end) break;
      store_wide_unit(w[u], buf + (c - c_begin));
    }
  }
  store_slots_bulk(p, route, ids, k, lane, 2 * h, 2 * c_begin, buf, 2 * (c_end - c_begin));
  if (part == 0) {
    check_token_scales<G>(p, t, src_sf, lane, 32);
    if (lane == 0)
      for (int j = 0; j < k; ++j)
        if (route[j] >= 0) store_row_meta(p, ids[j] / p.experts_per_rank, route[j], t, j);
  }
  return true;
}

__device__ __forceinline__ u32 dynamic_smem_bytes() {
  u32 b;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(b));
  return b;
}

// 3. route: a CTA per expert; 4. dispatch: tokens (when they fill the grid) or pairs over the grid.
template <int G, bool kL1Fp8Pool, int kUnroll>
__device__ __forceinline__ void route_and_dispatch(const MegaParams& p) {
  RouteParams route = p.route;
  route.pairs = forward_tokens(p) * p.count.top_k;
  for (int e = blockIdx.x; e < p.count.num_experts; e += gridDim.x) route_expert<kThreads>(route, e);
  barriers::grid_barrier(p.grid_word);
  const int parts = max_parts<kUnroll>(p.dispatch.hidden / 16), tokens = forward_tokens(p), k = p.count.top_k;
  // Tokens enough for every warp: each row read once for its k slots; fewer (small T): a pair at
  // a time, so that k times the warps share the work. A BF16 pool's row (widened, twice the bytes
  // stored) goes in kRowParts parts of its channels: a token a warp leaves the grid's last round
  // mostly idle at T = 2048 (1.3 tokens a warp), and three parts gain 1-1.5 % there, where an FP8
  // row's parts cost 0.5 % at T = 8192 (perf.md v104). Such rows go whole once their parts fill
  // half the warps (T ≥ 264 on V4-Pro): a row widened once for its k slots beats two rounds of
  // pairs, each widening its row (mx32 T = 384 … 1000 −0.7 … −0.9 %, v108). The two-CTA kernels'
  // rule stays as it is (a factor there made ptxas serialize a 32-token kernel's wgmmas, C7511).
  constexpr int kRowParts = !kL1Fp8Pool && kUnroll >= 8 ? 3 : 1;
  const bool whole = tokens * parts * (kRowParts > 1 ? 2 * kRowParts : 1) >= (int)gridDim.x * kWarps;
  if constexpr (kL1Fp8Pool && kUnroll >= 8) {
    // One-CTA kernels' whole FP8 tokens: through two buffers a warp in the (still idle) shared
    // memory, written out by bulk stores, when they fit.
    const int h = p.dispatch.hidden;
    if (whole && 2 * kWarps * h + 1024 <= (int)dynamic_smem_bytes()) {
      extern __shared__ __align__(1024) u8 smem_raw[];
      u8* bufs = sm90::align_smem(smem_raw) + (threadIdx.x / 32) * 2 * h;
      int n = 0;
      over_warps(tokens, 1, [&](int token, int lane, int) {
        if (dispatch_token_fp8_bulk<6>(p.dispatch, token, lane, bufs + (n & 1) * h)) ++n;
      });
      if (threadIdx.x % 32 == 0) sm90::bulk_wait<0>();  // written, and the buffers free for the GEMM
      __syncwarp();
      sm90::fence_proxy_async_global();
      return;
    }
  }
  if constexpr (!kL1Fp8Pool && kUnroll >= 8) {
    // One-CTA kernels' whole BF16 tokens without staged rows: likewise, a part a warp.
    const int h = p.dispatch.hidden, part_bytes = (h / 128 + kRowParts - 1) / kRowParts * 256;
    if (whole && !p.dispatch.staged && 2 * kWarps * part_bytes + 1024 <= (int)dynamic_smem_bytes()) {
      extern __shared__ __align__(1024) u8 smem_raw[];
      u8* bufs = sm90::align_smem(smem_raw) + (threadIdx.x / 32) * 2 * part_bytes;
      int n = 0;
      over_warps(tokens * kRowParts, 1, [&](int item, int lane, int) {
        const int token = item / kRowParts;
        if (dispatch_part_bf16_bulk<G, 4>(p.dispatch, token, item - token * kRowParts, kRowParts, lane,
                                          reinterpret_cast<u16*>(bufs + (n & 1) * part_bytes)))
          ++n;
      });
      if (threadIdx.x % 32 == 0) sm90::bulk_wait<0>();
      __syncwarp();
      sm90::fence_proxy_async_global();
      return;
    }
  }
  over_warps(whole ? tokens * kRowParts : route.pairs, whole ? 1 : parts, [&](int item, int t, int threads) {
    const int token = whole ? item / kRowParts : item / k, j0 = whole ? 0 : item - token * k, j1 = whole ? k : j0 + 1;
    if (whole) {
      t += (item - token * kRowParts) * 32;
      threads = kRowParts * 32;
    }
    if constexpr (kL1Fp8Pool) {
      dispatch_slots_fp8<kUnroll>(p.dispatch, token, j0, j1, t, threads);
    } else {
      dispatch_slots_bf16<G, kUnroll>(p.dispatch, token, j0, j1, t, threads);
    }
  });
  sm90::fence_proxy_async_global();
}

// 7a. combine send: pool rows of other ranks' tokens into their combine buffers.
template <int kUnroll>
__device__ __forceinline__ void combine_send(const MegaParams& p) {
  CombineSendParams send = p.combine_send;
  send.rows = pool_rows(p.l1);
  over_warps(send.rows, max_parts<kUnroll>(send.hidden / 8), [&](int row, int t, int threads) {
    combine_send_row<kUnroll>(send, row, t, threads);
  });
}

// 7b. combine reduce: tokens over the grid, the top-k sums into y (kLoads slots' rows loaded at once).
template <int kLoads>
__device__ __forceinline__ void combine_reduce(const MegaParams& p) {
  over_warps(forward_tokens(p), max_parts<1>(p.combine_reduce.hidden / 8), [&](int token, int t, int threads) {
    combine_reduce_token<kLoads>(p.combine_reduce, token, t, threads);
  });
}

// 0. inputs: the grid's threads over the pairs (ids) and over the channels, 8 each (BF16 x): a
// group's G channels lie on G/8 consecutive lanes of one warp, which share its amax by shuffles and
// encode as fp::quantize_act_group does. The loop over channels runs warp by warp (every lane
// through each step), and a group is wholly in or out of range (H is a multiple of G).
template <int G>
__device__ __forceinline__ void convert_inputs(const MegaParams& p) {
  const InputParams& in = p.inputs;
  const int tokens = forward_tokens(p);
  const int thread = blockIdx.x * kThreads + threadIdx.x, threads = gridDim.x * kThreads;
  if (in.topk_i64) {
    for (int i = thread; i < tokens * in.top_k; i += threads) {
      const long long e = in.topk_i64[i];
      const bool valid = e >= -1 && e < in.num_experts;
      // An id outside the experts is refused with its full value; -2 tells stage 1 to count it
      // as refused without recording it again (the first error stands).
      if (!valid)
        record_plan_error(in.error, (kPlanErrorExpert << 60) | ((u64)(i % in.top_k) << 32) | (u32)(i / in.top_k),
                          (u64)e);
      in.topk_idx[i] = valid ? (int)e : -2;
    }
  }
  if (in.x_bf16) {
    constexpr int kLanes = G / 8;
    const int lane = threadIdx.x % 32;
    const int units = tokens * (in.hidden / 8);
    for (int u0 = thread - lane; u0 < units; u0 += threads) {
      const int u = u0 + lane;
      const bool valid = u < units;
      const uint4 v = valid ? reinterpret_cast<const uint4*>(in.x_bf16)[u] : make_uint4(0, 0, 0, 0);
      const u32 w[4] = {v.x, v.y, v.z, v.w};
      float f[8];
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        f[2 * i] = bf16_to_f32((u16)(w[i] & 0xffffu));
        f[2 * i + 1] = bf16_to_f32((u16)(w[i] >> 16));
        amax = fmaxf(amax, fmaxf(fabsf(f[2 * i]), fabsf(f[2 * i + 1])));
      }
#pragma unroll
      for (int o = 1; o < kLanes; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      if (!valid) continue;
      const u8 sf = fp::act_group_scale(amax);
      const float inv = fp::pow2(127 - (int)sf);
      u32 q[2] = {0, 0};
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i / 4] |= (u32)fp::e4m3_encode(f[i] * inv) << (8 * (i % 4));
      reinterpret_cast<uint2*>(in.x)[u] = make_uint2(q[0], q[1]);
      if (lane % kLanes == 0) in.x_sf[u / kLanes] = sf;
    }
  }
}

// Whether this rank's plan stands (read afresh: nothing is held across the GEMM roles).
__device__ __forceinline__ bool planned(const MegaParams& p) { return barriers::ptx::ld_relaxed_gpu(p.plan.error) == 0; }

// The forward, every thread of every CTA. L1, L2: the layers' gemm::Gemm specializations (one
// shape of CTA: the same CTAs per SM); G: the recipe's activation group; the pools' formats follow
// the layers' tensor-core routes. Dynamic shared memory: the larger layer's plan (stage 1 borrows
// its start for the histogram).
template <class L1, class L2, int G>
__device__ __forceinline__ void mega_moe(const MegaParams& p, const void* l1_act_map, const void* l2_act_map,
                                         const void* l2_out_map) {
  static_assert(L1::kCtasPerSm == L2::kCtasPerSm, "both layers run on one shape of grid");
  extern __shared__ __align__(1024) u8 smem_raw[];

  stamp(p, 0);
  // 0. inputs in the engine's other formats, converted.
  if (p.inputs.x_bf16 || p.inputs.topk_i64) {
    convert_inputs<G>(p);
    barriers::grid_barrier(p.grid_word);
  }

  // 1. count, and the ranks meet: every rank's counts are in every rank's table. One rank's table
  // is CTA 0's own writes, which its plan reads next: no meeting (a grid barrier's 1-2 us of the
  // small forwards' glue).
  if (blockIdx.x == 0) {
    CountParams count = p.count;
    count.pairs = forward_tokens(p) * count.top_k;
    if (p.tokens_dev && threadIdx.x == 0 && (*p.tokens_dev < 0 || *p.tokens_dev > p.tokens))
      record_plan_error(count.error, kPlanErrorTokens << 60, (u64)(long long)*p.tokens_dev);
    __syncthreads();
    count_routes(count, reinterpret_cast<u32*>(sm90::align_smem(smem_raw)), threadIdx.x, kThreads);
  }
  if (p.num_ranks > 1 && !meet_ranks(p)) return;
  stamp(p, 1);

  // 2. plan, by CTA 0 for the grid; a refusal (this rank's ids, any owner's capacity, another
  // rank's ids) is the same in every CTA and, but for the ids' own rank, on every rank: the
  // stages are skipped, the meetings kept.
  if (blockIdx.x == 0) {
    __syncthreads();  // one rank: the counts its threads published
    plan_pools(p.plan, threadIdx.x, kThreads);
  }
  barriers::grid_barrier(p.grid_word);
  stamp(p, 2);

  // 3. route and 4. dispatch, the L1's first weights on their way into L2 meanwhile (the plan
  // says which experts it has); the ranks meet: every pool holds its rows.
  constexpr int kUnroll = kGlueUnroll<L1::kCtasPerSm>;
  if (planned(p)) {
    if (threadIdx.x == 0) L1::prefetch_first_weights(p.l1);
    route_and_dispatch<G, L1::kFp8Route, kUnroll>(p);
  }
  if (!meet_ranks(p)) return;
  stamp(p, 3);

  // 5. L1 with SwiGLU, 6. L2 (each L2 tile once its rows' L1 tiles are stored: no barrier between
  // the layers, a CTA done with its L1 tiles goes on to L2's), grid barrier (l2_out is whole; the
  // row counts go back to 0 for the next forward), 7a. combine send.
  if (planned(p)) {
    sm90::fence_proxy_async_global();
    gemm_layer<L1>(p.l1, l1_act_map, nullptr, swiglu::SwigluOut<G, L2::kFp8Route>{p.swiglu});
    stamp(p, 4);
    gemm_layer<L2>(p.l2, l2_act_map, l2_out_map, gemm::Bf16Out{});
    sm90::fence_proxy_async_global();
    barriers::grid_barrier(p.grid_word);
    stamp(p, 5);
    for (int i = blockIdx.x * kThreads + threadIdx.x; i < p.row_granules; i += gridDim.x * kThreads)
      p.swiglu.row_arrivals[i] = 0;
    if (p.num_ranks > 1) combine_send<kUnroll>(p);
  }
  // The ranks meet: every combine buffer holds its rows (one rank: the grid barrier after the L2
  // has ordered l2_out before every read of it). 7b. the top-k sums.
  if (p.num_ranks > 1 && !meet_ranks(p)) return;
  stamp(p, 6);
  if (planned(p)) combine_reduce<kReduceLoads<L1::kCtasPerSm>>(p);
  stamp(p, 7);
}

}  // namespace mega
}  // namespace mm
