// sm90_unfused.cuh -- the device functions of the unfused MoE pipeline's glue kernels (each its own
// launch, sm90_unfused.cu; the grouped GEMM of sm90_moe_gemm.cuh runs L1, with SwiGLU as its
// epilogue (sm90_swiglu.cuh), and L2 between them).
// Each function does one work item (an expert, pair, pool row or token), named by its caller, with
// the item's channels split over `threads` threads of which the caller is `thread`: the kernels
// pass their grid's shape (an item per CTA along x, channels over the CTAs along y when there are
// too few items to fill the GPU); a kernel with other roles walks its items itself (e.g. `for (row
// = first; row < rows; row += stride) combine_send_row(p, row, lane, 32)`). A loop over
// items inside them costs the grid's kernels registers: ptxas hoists the channel loops' trip counts
// out of it, and the dispatch then needs 48 registers where the host sizes its grids for 16 CTAs of
// 128 threads per SM, 32 registers each. Nothing here reads blockIdx or gridDim, and configuration
// comes as template parameters only.
//   uf_count           one CTA: this rank's routes per global expert, published as its row of every
//                      rank's counts table (peer stores), expert ids checked on the device;
//   uf_plan            one CTA, after a rank barrier: every owner's pool plan from the counts table
//                      (the host's PoolPlan), the plan tables uf_route reads, capacity checked: the
//                      plan without the host (two-word error word, first error wins);
//   uf_route           one CTA per global expert: the destination pool row of each of this rank's
//                      pairs of that expert, consecutive in (token, slot) order from the first row
//                      the owner's plan gives this rank (the host's plan is O(ranks x experts); the
//                      per-pair work stays on the device, so a forward needs no host round trip);
//                      for this rank's own experts it also marks the padding rows after each one, so
//                      that every row of the pool's plan is rewritten by every forward (the dispatch
//                      writes the others) and the metadata needs no reset between forwards;
//   uf_dispatch        one CTA per token of a source rank: reads the token's activations once and
//                      copies them (BF16 pools: widened once) into the owner rank's L1 pool row of
//                      each of its pairs (over a peer pointer) in the GEMM's layout and records the
//                      row's source (RowMeta);
//   uf_unstage         rows peers sent staged (large T, see DispatchParams::staged) into the pool: FP8,
//                      their scales ([rows][staged_row_bytes]) into the GEMM's [H/128][sf_stride] table;
//                      BF16, their E4M3 row and scales widened into the pool row;
//   uf_silu_table      the SiLU table (silu_fix_entry), once per pipeline, for the L1's SwiGLU epilogue;
//   uf_combine_send    one CTA per pool row of another rank's token: the row's L2 result into that
//                      rank's combine buffer [k][T_max][H] at (slot, token), over a peer pointer;
//   uf_combine_reduce  one CTA per token: the f32 sum of its valid slots in increasing order -> BF16 y,
//                      each slot from the combine buffer, or from this rank's own L2 output when
//                      its own experts computed it;
//   uf_rank_barrier    one CTA: the ranks meet after the stages that write into peers (barriers.cuh's
//                      rank_barrier over the pipeline's signals), so a forward is one stream of
//                      launches with no host round trip; a missing rank times out into the error word.
// Template parameters: G (32|128, the recipe's activation group) and kFp8Pool, the format of the pool
// a function writes (each GEMM's tensor-core route: the dispatch and the unstaging write the L1 pool,
// the L1's SwiGLU epilogue the L2 pool). Pools: FP8 route (g128 only) = E4M3 [rows][K] plus the
// token scales as floats [K/128][sf_stride] (MN-major, each 16 rows in the GEMM consumers' order);
// BF16 route = BF16 [rows][K] of E4M3 * 2^(scale-127), exact for either group; K in the GEMM's pool
// channel order, the scales' rows in theirs (pool_order.cuh).
#pragma once
#include "barriers.cuh"
#include "fp_formats.cuh"
#include "pool_order.cuh"

namespace mm {
namespace unfused {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

constexpr int kThreads = 128;

// The source of one pool row; token < 0 marks a padding row (uf_route writes them; the host fills the
// table with 0xff when the pipeline is built).
struct RowMeta {
  int rank;
  int token;
  int slot;
  float weight;
};
static_assert(sizeof(RowMeta) == 16, "RowMeta is pinned to 16 bytes (megamoe-kernel/src/protocol.rs)");

// Where each rank's regions that peers write into lie, as this process maps them, indexed by rank
// (the host's PeerLayout::peer_table; 0 past the world's ranks).
struct PeerTable {
  u64 l1_act[symm_mem::kMaxRanks];     // L1 pool activations
  u64 l1_sf[symm_mem::kMaxRanks];      // L1 pool scales [H/128][sf_stride] (FP8 pool)
  u64 l1_staged[symm_mem::kMaxRanks];  // rows from peers as sent, staged: [pool_rows][staged_row_bytes]
  u64 meta[symm_mem::kMaxRanks];       // RowMeta tables
  u64 combine[symm_mem::kMaxRanks];    // combine buffers [k][T_max][H] BF16
  u64 counts[symm_mem::kMaxRanks];     // routes per expert [R][E] u32, row r from rank r (uf_count)
};
// Six arrays of one type: no padding, so the size pins every member's offset.
static_assert(sizeof(PeerTable) == 6 * 8 * symm_mem::kMaxRanks, "PeerTable (megamoe-kernel/src/protocol.rs)");

struct DispatchParams {
  const u8* x;             // [T][H] E4M3
  const u8* x_sf;          // [T][H/G] UE8M0
  const int* route;        // [T*k] destination row in the owner's pool, -1 = masked
  const int* topk_idx;     // [T*k] global expert, -1 = masked
  const float* topk_w;     // [T*k]
  const PeerTable* peers;  // every owner's pool, scales, staged rows and RowMeta table
  int tokens, top_k, hidden, experts_per_rank, staged_row_bytes, sf_stride, rank;
  // Rows for peers go to l1_staged as few whole NVLink stores, and the owner finishes them
  // (uf_unstage): FP8 pool, the row's H/128 scales (floats) side by side (instead of one store per
  // k128 block into the table); BF16 pool, the E4M3 row and its H/G scales (half the bytes of the
  // widened row).
  int staged;
  u64* error;  // [2] the plan's error words: a NaN scale (kPlanErrorScale)
};

struct RouteParams {
  const int* topk_idx;      // [pairs] global expert, -1 = masked
  const int* first_row;     // [E] this rank's first row among expert e's rows in its owner's pool
  int* route;               // [pairs] out: destination row, -1 = masked
  const int* expert_offset; // [E/R] this rank's own plan: first row and rows of each local expert
  const int* expert_rows;
  RowMeta* meta;            // [pool rows] this rank's own
  int pairs, experts_per_rank, rank, pad_;
};

struct UnstageParams {
  const u8* staged;        // [rows][staged_row_bytes]
  float* sf;               // FP8 pool: [k_blocks][sf_stride] (pool_order.cuh)
  u16* pool;               // BF16 pool: [rows][hidden]
  const RowMeta* meta;     // [rows]: rows from other ranks move, the rest stay
  int rows, hidden, staged_row_bytes, sf_stride, rank, pad_;
};

struct CombineSendParams {
  const u16* l2_out;       // [rows][H] BF16
  const RowMeta* meta;     // [rows]
  const PeerTable* peers;  // each rank's combine buffer
  int rows, hidden, max_tokens;
  int rank;                // rows of this rank's own tokens stay in l2_out (combine_reduce reads them)
};

struct CombineReduceParams {
  const u16* combine;      // [k][T_max][H] BF16, the slots other ranks computed
  const int* topk_idx;     // [T*k]
  u16* y;                  // [T][H] BF16
  const u16* l2_out;       // [rows][H] BF16, this rank's pool: the slots it computed itself
  const int* route;        // [T*k] each slot's pool row at its owner
  int tokens, top_k, hidden, max_tokens, experts_per_rank, rank;
};

// The plan on the device (uf_count, uf_plan: one CTA of kPlanThreads each): what the host's
// expert_counts, counts exchange and PoolPlan compute, with errors into a two-word error word.
constexpr int kPlanThreads = 1024;
// error[0]: kind in bits 63..60 (first error wins), then kind 1 (an expert id outside -1..E):
// slot in bits 47..32, token in 31..0, error[1] the id; kind 2 (an owner's pools overflow): the
// owner in 31..0, error[1] the rows its plan needs; kind 3 (another rank refused its routes, kind 1
// there): that rank in 31..0; kind 5 (a NaN activation scale, UE8M0 255, which only the device
// sees in an engine's inputs): the token in 31..0, error[1] the scale's group. Decoded by
// megamoe-kernel/src/unfused.rs. (Kind 4 is the fused kernel's, sm90_mega_moe.cuh.)
constexpr u64 kPlanErrorExpert = 1;
constexpr u64 kPlanErrorCapacity = 2;
constexpr u64 kPlanErrorPeerRoutes = 3;
constexpr u64 kPlanErrorScale = 5;
// A rank whose routes hold an invalid expert id publishes this count for its expert 0, so that
// every rank's plan refuses the forward alike (no rank sends rows into a pool whose owner stopped).
constexpr u32 kCountRefused = 0xffffffffu;

struct CountParams {
  const int* topk_idx;     // [pairs] global expert, -1 = masked
  const PeerTable* peers;  // every rank's counts table
  u64* error;              // [2]
  int pairs, top_k, num_experts, num_ranks, rank, pad_;
};

struct PlanParams {
  const u32* counts;       // [R][E] this rank's counts table: row r from rank r
  int* first_row;          // [E] out: this rank's first row among expert e's rows at its owner
  int* expert_offset;      // [E/R] out: this rank's own experts' first rows
  int* expert_rows;        // [E/R] out: and rows
  u64* error;              // [2]
  int num_ranks, num_experts, rank, capacity, row_align, pad_;
};

struct RankBarrierParams {
  const symm_mem::SymmBuffer* view;  // this rank's view of every rank's buffer
  u64* signals;                      // [R] in this rank's buffer (the pipeline's `signals` region)
  u64* error_word;                   // this rank's own, 0 while the ranks are in step
  u64 timeout_ns;
};

// Records the plan's first error (error[0] from 0 to `kind_and_where`, then error[1] = `value`).
__device__ __forceinline__ void record_plan_error(u64* error, u64 kind_and_where, u64 value) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(error), 0ull, kind_and_where) == 0ull) error[1] = value;
}

// Pairs a thread of the count and the route takes per round (loaded before any is used).
constexpr int kRoutePerThread = 16;

// The kRoutePerThread expert ids from pair `first` on, `past` for pairs at or past `pairs`: 64
// aligned bytes as four 16-byte loads when all are there (topk_idx is a whole allocation), so that
// a thread's ids are in flight at once instead of a chain of single loads.
__device__ __forceinline__ void load_route_ids(const int* topk_idx, int first, int pairs, int past,
                                               int (&ids)[kRoutePerThread]) {
  if (first + kRoutePerThread <= pairs) {
#pragma unroll
    for (int v = 0; v < kRoutePerThread / 4; ++v) {
      const int4 q = reinterpret_cast<const int4*>(topk_idx + first)[v];
      ids[4 * v] = q.x;
      ids[4 * v + 1] = q.y;
      ids[4 * v + 2] = q.z;
      ids[4 * v + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRoutePerThread; ++i) ids[i] = first + i < pairs ? topk_idx[first + i] : past;
  }
}

// uf_count: this rank's routes per global expert into `hist` (shared, [E]), then published as row
// `rank` of every rank's counts table (peer stores, made visible to the owners by the rank
// barrier that follows); a refused id makes the row's first count kCountRefused. `thread` of
// `threads`, all of one CTA.
__device__ __forceinline__ void count_routes(const CountParams& p, u32* hist, int thread, int threads) {
  for (int e = thread; e < p.num_experts; e += threads) hist[e] = 0;
  __syncthreads();
  // kRoutePerThread consecutive ids a thread per round, loaded before any is counted, so that one
  // CTA's count is not a chain of single loads (pairs past the end read as masked, -1).
  for (int round = 0; round < p.pairs; round += threads * kRoutePerThread) {
    const int first = round + thread * kRoutePerThread;
    int ids[kRoutePerThread];
    load_route_ids(p.topk_idx, first, p.pairs, -1, ids);
#pragma unroll
    for (int q = 0; q < kRoutePerThread; ++q) {
      const int e = ids[q], i = first + q;
      if (e == -1) continue;
      if (e < -1 || e >= p.num_experts) {
        record_plan_error(p.error, (kPlanErrorExpert << 60) | ((u64)(i % p.top_k) << 32) | (u32)(i / p.top_k),
                          (u64)(long long)e);
        continue;
      }
      atomicAdd(&hist[e], 1u);
    }
  }
  __syncthreads();
  if (thread == 0 && *reinterpret_cast<volatile u64*>(p.error) != 0) hist[0] = kCountRefused;
  __syncthreads();
  for (int r = 0; r < p.num_ranks; ++r) {
    u32* row = reinterpret_cast<u32*>(p.peers->counts[r]) + (size_t)p.rank * p.num_experts;
    for (int e = thread; e < p.num_experts; e += threads) row[e] = hist[e];
  }
}

// uf_plan: every owner's plan from the counts table (the host's PoolPlan::new): owner o's local
// experts in order, each taking its sources' rows in rank order, each expert's first row aligned
// to `row_align`. A warp lays out an owner, a lane an expert: an expert's first row is the
// exclusive prefix sum of the aligned row counts before it (a warp scan per 32 experts), so the
// counts' loads overlap instead of following one another. Every rank lays out every owner, so all
// ranks see a capacity error alike; a rank that refused its routes (kCountRefused) makes every
// plan refuse, and the tables are not written. All threads of one CTA (a multiple of 32).
__device__ __forceinline__ void plan_pools(const PlanParams& p, int thread, int threads) {
  for (int src = thread; src < p.num_ranks; src += threads)
    if (p.counts[(size_t)src * p.num_experts] == kCountRefused && src != p.rank)
      record_plan_error(p.error, (kPlanErrorPeerRoutes << 60) | (u32)src, 0);
  __syncthreads();
  if (*reinterpret_cast<volatile u64*>(p.error) != 0) return;
  const int el = p.num_experts / p.num_ranks, lane = thread % 32;
  for (int o = thread / 32; o < p.num_ranks; o += threads / 32) {
    long long next = 0;  // the owner's first free row after the experts laid out so far
    for (int x0 = 0; x0 < el; x0 += 32) {
      const int x = x0 + lane, e = o * el + x;
      long long rows = 0, before_mine = 0;
      if (x < el)
        for (int src = 0; src < p.num_ranks; ++src) {
          if (src == p.rank) before_mine = rows;
          rows += p.counts[(size_t)src * p.num_experts + e];
        }
      const long long aligned = (rows + p.row_align - 1) / p.row_align * p.row_align;
      long long upto = aligned;  // inclusive prefix sum of `aligned` over the chunk's lanes
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const long long left = __shfl_up_sync(0xffffffffu, upto, d);
        if (lane >= d) upto += left;
      }
      const long long offset = next + upto - aligned;
      if (x < el) {
        p.first_row[e] = (int)(offset + before_mine);
        if (o == p.rank) {
          p.expert_offset[x] = (int)offset;
          p.expert_rows[x] = (int)rows;
        }
      }
      next += __shfl_sync(0xffffffffu, upto, 31);
    }
    if (lane == 0 && next > p.capacity)
      record_plan_error(p.error, (kPlanErrorCapacity << 60) | (u32)o, (u64)next);
  }
}

// f32 -> BF16 bits, round to nearest even (NaN stays a quiet NaN), as the host's `half::bf16::from_f32`.
__device__ __forceinline__ u16 bf16_rn(float f) {
  u32 b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x40u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return (u16)(b >> 16);
}
__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float((u32)h << 16); }
// The line of global address p into L2, without a register to wait on.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Two E4M3 codes (byte 0 -> low half) times `scale` = 2^(b-127) as BF16x2, through the hardware's
// exact E4M3 -> F16 conversion: exact for every finite code and the scales the pools see.
__device__ __forceinline__ u32 widen2(u32 codes, float scale) {
  u32 h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)codes));
  float lo, hi;
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"((u16)h2));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"((u16)(h2 >> 16)));
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(__fmul_rn(hi, scale)), "f"(__fmul_rn(lo, scale)));
  return r;
}

// An FP8 pool carries one scale per 128 channels.
template <int G, bool kFp8Pool>
constexpr bool kPoolFitsGroup = !kFp8Pool || G == 128;

// 16 pool-order channels of a BF16 pool row (a unit): four canonical 4-byte E4M3 words of the
// 128-channel block, one of each scale block, and each word's scale (G is 32 or 128).
struct WideUnit {
  u32 q[4];
  u8 e[4];
};
// The unit at pool-order channel c (a multiple of 16) of E4M3 row `src` (canonical order).
template <int G>
__device__ __forceinline__ WideUnit load_wide_unit(const u8* src, const u8* src_sf, int c) {
  WideUnit w;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const int from = (c & ~127) + pool_order::unit_source_byte((c & 127) / 16, b);
    w.q[b] = *reinterpret_cast<const u32*>(src + from);
    w.e[b] = src_sf[from / G];
  }
  return w;
}
// The unit widened with each word's own scale: 16 BF16 channels as two 16-byte stores at dst.
__device__ __forceinline__ void store_wide_unit(const WideUnit& w, u16* dst) {
  u32 lo[4], hi[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const float scale = fp::ue8m0_decode(w.e[b]);
    lo[b] = widen2(w.q[b], scale);
    hi[b] = widen2(w.q[b] >> 16, scale);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  *reinterpret_cast<uint4*>(dst + 8) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
}

// One E4M3 row (canonical order) and its H/G scales -> the BF16 pool row in pool order, a unit
// (16 channels) per thread at a time (the owner's unstage of a staged row).
template <int G>
__device__ __forceinline__ void widen_row(const u8* src, const u8* src_sf, u16* dst, int h, int thread, int threads) {
  for (int c = thread * 16; c < h; c += threads * 16) store_wide_unit(load_wide_unit<G>(src, src_sf, c), dst + c);
}

// uf_route: global expert e, by all kThreads threads of one CTA (it meets with __syncthreads):
// they take kRoutePerThread consecutive pairs each per round; a block-wide exclusive scan of each
// thread's matches gives every pair of expert e its rank in (token, slot) order. Every expert reads
// all pairs (E x 4 bytes x T x k from L2: 9 MB for V4-Pro at T = 8192, one rank), in rounds of 8192
// pairs. Expert 0 also marks the masked pairs.
constexpr int kRouteThreads = 512;
template <int kThreads>
__device__ __forceinline__ void route_expert(const RouteParams& p, int e) {
  constexpr int kWarps = kThreads / 32;
  __shared__ int warp_matches[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // This rank's own expert: its padding rows (up to the next multiple of 16, as the plan pads).
  if (e / p.experts_per_rank == p.rank && threadIdx.x < 16) {
    const int el = e % p.experts_per_rank;
    const int end = p.expert_offset[el] + p.expert_rows[el], row = end + threadIdx.x;
    if (row < ((end + 15) & ~15)) {
      RowMeta pad;
      pad.rank = pad.token = pad.slot = -1;
      pad.weight = __int_as_float(-1);
      p.meta[row] = pad;
    }
  }
  int next = p.first_row[e];
  for (int round = 0; round < p.pairs; round += kThreads * kRoutePerThread) {
    const int first = round + threadIdx.x * kRoutePerThread;
    int ids[kRoutePerThread];
    load_route_ids(p.topk_idx, first, p.pairs, -2, ids);  // -2: past the end, neither an expert nor masked
    int mine = 0;
#pragma unroll
    for (int i = 0; i < kRoutePerThread; ++i) mine += ids[i] == e;
    int inclusive = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += v;
    }
    if (lane == 31) warp_matches[warp] = inclusive;
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int m = warp_matches[w];
      before += w < warp ? m : 0;
      total += m;
    }
    __syncthreads();  // warp_matches is rewritten in the next round
    int row = next + before + inclusive - mine;
#pragma unroll
    for (int i = 0; i < kRoutePerThread; ++i) {
      if (ids[i] == e) {
        p.route[first + i] = row++;
      } else if (e == 0 && ids[i] == -1) {
        p.route[first + i] = -1;
      }
    }
    next += total;
  }
}

// A NaN scale (UE8M0 255) of token t refuses the forward through the error word (each routed token
// checks its scales: a token no pair routes is never read); its rows still move, y is not to be read.
template <int G>
__device__ __forceinline__ void check_token_scales(const DispatchParams& p, int t, const u8* src_sf, int thread,
                                                   int threads) {
  for (int g = thread; g < p.hidden / G; g += threads)
    if (src_sf[g] == 0xffu) record_plan_error(p.error, (kPlanErrorScale << 60) | (u32)t, (u64)g);
}

// Pair (t, j)'s RowMeta into its owner's meta region at pool row `row`.
__device__ __forceinline__ void store_row_meta(const DispatchParams& p, int owner, int row, int t, int j) {
  RowMeta m;
  m.rank = p.rank;
  m.token = t;
  m.slot = j;
  m.weight = p.topk_w[t * p.top_k + j];
  reinterpret_cast<RowMeta*>(p.peers->meta[owner])[row] = m;
}

// kUnroll (the dispatch, combine_send_row): units a thread loads before it stores any, memory
// parallelism for the fused kernel's few threads per SM; 1 in the unfused launches.

// uf_dispatch of BF16 pools: slots [j0, j1) of token t of this rank's T (a whole token, or one
// pair), as dispatch_slots_fp8 below: the row read and widened once (kUnroll units loaded before
// any is stored; a unit's two 16-byte stores into the pool row of each routed slot), instead of
// once a slot. A staged slot (a peer's, at large T) gets the raw E4M3 row and its H/G scales for
// the owner's unstage, which widens it as here. Then each slot's RowMeta.
template <int G, int kUnroll = 1>
__device__ __forceinline__ void dispatch_slots_bf16(const DispatchParams& p, int t, int j0, int j1, int thread,
                                                    int threads) {
  const int h = p.hidden, k = p.top_k;
  const u8* src = p.x + (size_t)t * h;
  const u8* src_sf = p.x_sf + (size_t)t * (h / G);
  const int* route = p.route + (size_t)t * k;
  const int* ids = p.topk_idx + (size_t)t * k;
  bool in_pool = false, staged = false;
  for (int j = j0; j < j1; ++j) {
    if (route[j] < 0) continue;
    const bool own = !p.staged || ids[j] / p.experts_per_rank == p.rank;
    in_pool |= own;
    staged |= !own;
  }
  if (!in_pool && !staged) return;
  if (in_pool) {
    for (int c0 = thread * 16; c0 < h; c0 += threads * 16 * kUnroll) {
      WideUnit w[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * threads * 16;
        if (c >= h) break;
        w[u] = load_wide_unit<G>(src, src_sf, c);
      }
      for (int j = j0; j < j1; ++j) {
        const int row = route[j], owner = ids[j] / p.experts_per_rank;
        if (row < 0 || (p.staged && owner != p.rank)) continue;
        u16* dst = reinterpret_cast<u16*>(p.peers->l1_act[owner]) + (size_t)row * h;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int c = c0 + u * threads * 16;
          if (c >= h) break;
          store_wide_unit(w[u], dst + c);
        }
      }
    }
  }
  if (staged) {
    for (int j = j0; j < j1; ++j) {
      const int row = route[j], owner = ids[j] / p.experts_per_rank;
      if (row < 0 || owner == p.rank) continue;
      u8* dst = reinterpret_cast<u8*>(p.peers->l1_staged[owner]) + (size_t)row * p.staged_row_bytes;
      for (int c = thread * 16; c < h; c += threads * 16)
        *reinterpret_cast<uint4*>(dst + c) = *reinterpret_cast<const uint4*>(src + c);
      for (int g = thread; g < h / G; g += threads) dst[h + g] = src_sf[g];
    }
  }
  check_token_scales<G>(p, t, src_sf, thread, threads);
  if (thread == 0)
    for (int j = j0; j < j1; ++j)
      if (route[j] >= 0) store_row_meta(p, ids[j] / p.experts_per_rank, route[j], t, j);
}

// uf_dispatch of FP8 pools: slots [j0, j1) of token t of this rank's T (a whole token, or one
// pair), its row read once and stored into the pool row of each routed slot (16 pool-order
// channels a thread at a time: four canonical 4-byte words, one of each scale block of the
// 128-channel block; kUnroll units loaded before any is stored), then each slot's scales as floats
// — into the owner's table ([kb][scale_column(row)]), or staged side by side ([row][kb]) for its
// unstage — and RowMeta.
// A whole token's row is read once instead of k times; a pair at a time spreads the slots' chain
// of lookups over k times the warps when the tokens are few (route_and_dispatch).
template <int kUnroll = 1>
__device__ __forceinline__ void dispatch_slots_fp8(const DispatchParams& p, int t, int j0, int j1, int thread,
                                                   int threads) {
  const int h = p.hidden, k = p.top_k, k_blocks = h / 128;
  const u8* src = p.x + (size_t)t * h;
  const u8* src_sf = p.x_sf + (size_t)t * k_blocks;
  const int* route = p.route + (size_t)t * k;
  const int* ids = p.topk_idx + (size_t)t * k;
  bool routed = false;
  for (int j = j0; j < j1; ++j) routed |= route[j] >= 0;
  if (!routed) return;
  for (int c0 = thread * 16; c0 < h; c0 += threads * 16 * kUnroll) {
    u32 w[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * threads * 16;
      if (c >= h) break;
      const u8* block = src + (c & ~127);
#pragma unroll
      for (int b = 0; b < 4; ++b)
        w[u][b] = *reinterpret_cast<const u32*>(block + pool_order::unit_source_byte((c & 127) / 16, b));
    }
    for (int j = j0; j < j1; ++j) {
      const int row = route[j];
      if (row < 0) continue;
      u8* dst = reinterpret_cast<u8*>(p.peers->l1_act[ids[j] / p.experts_per_rank]) + (size_t)row * h;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * threads * 16;
        if (c >= h) break;
        *reinterpret_cast<uint4*>(dst + c) = make_uint4(w[u][0], w[u][1], w[u][2], w[u][3]);
      }
    }
  }
  check_token_scales<128>(p, t, src_sf, thread, threads);
  for (int j = j0; j < j1; ++j) {
    const int row = route[j];
    if (row < 0) continue;
    const int owner = ids[j] / p.experts_per_rank;
    const bool in_table = !p.staged || owner == p.rank;
    float* sf = in_table ? reinterpret_cast<float*>(p.peers->l1_sf[owner]) + pool_order::scale_column(row)
                         : reinterpret_cast<float*>(p.peers->l1_staged[owner] + (size_t)row * p.staged_row_bytes);
    const size_t kb_stride = in_table ? (size_t)p.sf_stride : 1;
    // Not unrolled: unrolled, the float stores spilled uf_dispatch (8 B); stepping one address
    // instead made ptxas serialize the two-CTA 32-token fused kernel's wgmmas (perf.md v125).
#pragma unroll 1
    for (int kb = thread; kb < k_blocks; kb += threads) sf[kb * kb_stride] = fp::ue8m0_float(src_sf[kb]);
    if (thread == 0) store_row_meta(p, owner, row, t, j);
  }
}

// uf_unstage: pool row `row` (< rows); its work over `threads` threads (this one is `thread`). FP8
// pool: the row's scales (four floats at a time, a 16-byte load) to [kb][scale_column(row)]; the
// kernel gives each row one thread, so a warp stores 128 consecutive bytes per kb. BF16 pool: the
// row widened as the dispatch would have, 16 channels per thread at a time. Padding rows and this
// rank's own rows (written in place) stay.
template <int G, bool kFp8Pool>
__device__ __forceinline__ void unstage_row(const UnstageParams& p, int row, int thread, int threads) {
  static_assert(kPoolFitsGroup<G, kFp8Pool>, "the FP8 pool carries one scale per 128 channels");
  const RowMeta m = p.meta[row];
  if (m.token < 0 || m.rank == p.rank) return;
  const u8* staged = p.staged + (size_t)row * p.staged_row_bytes;
  if constexpr (kFp8Pool) {
    const int k_blocks = p.hidden / 128;
    float* sf = p.sf + pool_order::scale_column(row);
    for (int k0 = thread * 4; k0 < k_blocks; k0 += threads * 4) {
      const float4 v = reinterpret_cast<const float4*>(staged)[k0 / 4];
      const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (k0 + i < k_blocks) sf[(size_t)(k0 + i) * p.sf_stride] = f[i];
    }
  } else {
    widen_row<G>(staged, staged + p.hidden, p.pool + (size_t)row * p.hidden, p.hidden, thread, threads);
  }
}

// silu(g) = g / (1 + exp(-g)) in f32 as the host computes it: IEEE division, exp rounded from double
// like the host's libm expf.
__device__ __forceinline__ float silu_exact(float g) {
  const float e = (float)exp(-(double)g);
  return __fdiv_rn(g, __fadd_rn(1.0f, e));
}

__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// silu of a BF16 gate g the fast way, two MUFU operations: exp(-g) = 2^(-g head) (1 - g tail ln 2),
// log2(e) split into a head of 15 significant bits, whose product with a BF16 gate is exact, and
// the tail; a single product -g log2(e) rounded in f32 would carry |g| 2^-24 into the exponent
// (29 .. 53 ulp at |g| ~ 88). Within -3 .. +2 ulp of silu_exact on every BF16 gate on an H100
// (perf.md v114); the SiLU table's corrections make it exact. The .ftz forms are single MUFU
// operations (the others scale around them): 2^x flushed below 2^-126 leaves 1 + e = 1, as the
// exact e does; the reciprocal is of (1 + e) / 4, so that it stays normal up to 1 + e = 2^128
// (g = -88.5 .. -87.5, whose silu is normal), and g / 4 is exact for every BF16 g (its lowest bit
// is at least 2^-133), so (g / 4) (4 / (1 + e)) rounds once, as g / (1 + e) would, and does not
// overflow. The exponent's g is capped at 128 (2^(-128 log2 e) is flushed to 0 as e^-g is from
// g ~ 88 on), so that g = +inf gives e = 0, not 0 x inf.
__device__ __forceinline__ float silu_fast(float g) {
  const float ge = fminf(g, 128.0f);
  const float big = ex2_approx_ftz(__fmul_rn(-ge, 0x1.7154p+0f));
  const float e = __fmaf_rn(big, __fmul_rn(-ge, 0x1.480fb4p-18f), big);
  return __fmul_rn(__fmul_rn(g, 0.25f), rcp_approx_ftz(__fmul_rn(__fadd_rn(1.0f, e), 0.25f)));
}

// The SiLU table: silu_fast(g) + c(g) = silu_exact(g) bit for bit (c added to the f32's bits), c a
// 4-bit two's complement number per BF16 gate whose magnitude bits m lie in kSiluFixFirst ..
// + kSiluFixSpan - 2 (exponents -25 .. 6): byte m - kSiluFixFirst holds the positive gate's c in
// its low nibble, the negative one's in its high nibble. Every other gate has c = 0, and so has the
// span's last byte, which every gate past either end reads (silu_fix_byte). Then the clamp's silu
// (silu_exact, a float; 0 without a clamp), the count of gates the table cannot correct (c beyond
// -8 .. 7, or not 0 outside the range), which the host reads once and refuses if not 0
// (ex2.approx and rcp.approx are the GPU's own, so the table is built and checked on the GPU that
// uses it), and two words that keep the table whole 16 bytes, as the SwiGLU epilogue copies it
// into shared memory.
constexpr u32 kSiluFixFirst = 0x3300;
constexpr u32 kSiluFixSpan = 0x1000;
constexpr int kSiluFixWords = kSiluFixSpan / 4;
constexpr int kSiluClampWord = kSiluFixWords, kSiluMisfitsWord = kSiluFixWords + 1;
constexpr int kSiluTableWords = kSiluFixWords + 4;
constexpr int kSiluTableBytes = 4 * kSiluTableWords;

// The table's byte of the gate whose f32 bits are gb (a BF16 value): m - kSiluFixFirst, the last
// byte for m past either end (below it, the difference wraps around to a large number).
__device__ __forceinline__ u32 silu_fix_byte(u32 gb) {
  return min(((gb << 1) - (kSiluFixFirst << 17)) >> 17, kSiluFixSpan - 1);
}
// c from the gate's byte: the nibble of its sign, sign-extended.
__device__ __forceinline__ int silu_fix_of(u32 byte, u32 gb) { return (int)(byte << ((gb >> 29 & 4u) ^ 28u)) >> 28; }

// Entries the SiLU table is built from: every BF16 gate (its bits), then the clamp.
constexpr int kSiluClampEntry = 1 << 16;
// Entry i (<= kSiluClampEntry) of the SiLU table, the table's words zeroed before.
__device__ __forceinline__ void silu_fix_entry(u32* table, int i, int has_clamp, float clamp) {
  if (i == kSiluClampEntry) {
    reinterpret_cast<float*>(table)[kSiluClampWord] = has_clamp ? silu_exact(clamp) : 0.0f;
    return;
  }
  const float g = bf16_to_f32((u16)i), exact = silu_exact(g), fast = silu_fast(g);
  if (isnan(exact) && isnan(fast)) return;
  const int c = (int)(__float_as_uint(exact) - __float_as_uint(fast));
  if (c == 0) return;
  const u32 gb = __float_as_uint(g), byte = silu_fix_byte(gb);
  if (byte == kSiluFixSpan - 1 || c < -8 || c > 7) {
    atomicAdd(table + kSiluMisfitsWord, 1u);
    return;
  }
  atomicOr(table + byte / 4, (u32)(c & 0xf) << (8 * (byte % 4) + (gb >> 29 & 4u)));
}

// uf_combine_send: pool row `row` (< rows), if it holds another rank's token; its channels over
// `threads` threads (this one is `thread`), 8 at a time; kUnroll as the dispatch's.
template <int kUnroll = 1>
__device__ __forceinline__ void combine_send_row(const CombineSendParams& p, int row, int thread, int threads) {
  const RowMeta m = p.meta[row];
  if (m.token < 0 || m.rank == p.rank) return;
  const u16* src = p.l2_out + (size_t)row * p.hidden;
  u16* dst = reinterpret_cast<u16*>(p.peers->combine[m.rank]) + ((size_t)m.slot * p.max_tokens + m.token) * p.hidden;
  for (int c0 = thread * 8; c0 < p.hidden; c0 += threads * 8 * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * threads * 8 < p.hidden) v[u] = *reinterpret_cast<const uint4*>(src + c0 + u * threads * 8);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * threads * 8 < p.hidden) *reinterpret_cast<uint4*>(dst + c0 + u * threads * 8) = v[u];
  }
}

// Where token t's k slot j (< top_k) comes from: a slot this rank's experts computed is still in
// its pool; the others were sent here. Null for a masked slot.
__device__ __forceinline__ const u16* combine_source(const CombineReduceParams& p, int t, int j) {
  const int e = p.topk_idx[t * p.top_k + j];
  if (e < 0) return nullptr;
  return e / p.experts_per_rank == p.rank ? p.l2_out + (size_t)p.route[t * p.top_k + j] * p.hidden
                                          : p.combine + ((size_t)j * p.max_tokens + t) * p.hidden;
}

// uf_combine_reduce: token t (< tokens); its channels over `threads` threads (this one is
// `thread`; the lanes of a warp share the token), 8 at a time, each slot added in order. Lane j
// finds slot j's source once (two dependent loads) and the warp reads it by shuffle: per chunk of
// channels, kLoads slots' rows are loaded at once, none waits on an index, and the chunk after
// next of each is prefetched into L2.
template <int kLoads = 4>
__device__ __forceinline__ void combine_reduce_token(const CombineReduceParams& p, int t, int thread, int threads) {
  const int lane = thread % 32;
  const u16* mine = lane < p.top_k ? combine_source(p, t, lane) : nullptr;
  for (int c0 = 0; c0 < p.hidden; c0 += threads * 8) {  // uniform over the warp: the shuffles need every lane
    const int c = c0 + thread * 8;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
    for (int j0 = 0; j0 < p.top_k; j0 += 32) {
      // Slots j0 .. j0 + 31 (beyond the first 32, found again per chunk: no model routes that many).
      const u16* block = j0 == 0 ? mine : lane + j0 < p.top_k ? combine_source(p, t, lane + j0) : nullptr;
      const int n = min(32, p.top_k - j0);
      for (int j = 0; j < n; j += kLoads) {
        uint4 v[kLoads];
        bool has[kLoads];
#pragma unroll
        for (int q = 0; q < kLoads; ++q) {
          const u16* src = reinterpret_cast<const u16*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(block), (j + q) % 32));
          has[q] = j + q < n && src != nullptr && c < p.hidden;
          if (has[q]) v[q] = *reinterpret_cast<const uint4*>(src + c);
          // The chunk after next on its way to L2 meanwhile (no register waits for it).
          if (has[q] && c + 2 * threads * 8 < p.hidden) prefetch_l2(src + c + 2 * threads * 8);
        }
#pragma unroll
        for (int q = 0; q < kLoads; ++q) {
          if (!has[q]) continue;
          const u32 w[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[2 * i] = __fadd_rn(acc[2 * i], bf16_to_f32((u16)(w[i] & 0xffffu)));
            acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], bf16_to_f32((u16)(w[i] >> 16)));
          }
        }
      }
    }
    if (c >= p.hidden) continue;
    u32 out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = (u32)bf16_rn(acc[2 * i]) | ((u32)bf16_rn(acc[2 * i + 1]) << 16);
    *reinterpret_cast<uint4*>(p.y + (size_t)t * p.hidden + c) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

// uf_rank_barrier, all threads of one CTA: every write of the stages before it, on any rank, is
// visible to every stage after it on every rank. The stages before ran in earlier launches of this
// stream: the fence publishes their peer writes at system scope before this rank's signals go out
// (rank_barrier's release stores are per thread).
__device__ __forceinline__ void rank_barrier(const RankBarrierParams& p) {
  if (threadIdx.x == 0) barriers::ptx::fence_acq_rel_sys();
  __syncthreads();
  barriers::rank_barrier(p.view, p.signals, p.error_word, p.timeout_ns);
}

// Pinned against the #[repr(C)] twins in megamoe-kernel/src/unfused.rs.
static_assert(sizeof(DispatchParams) == 88, "DispatchParams layout");
static_assert(sizeof(CountParams) == 48, "CountParams layout");
static_assert(sizeof(PlanParams) == 64, "PlanParams layout");
static_assert(sizeof(RouteParams) == 64, "RouteParams layout");
static_assert(sizeof(UnstageParams) == 56, "UnstageParams layout");
static_assert(sizeof(CombineSendParams) == 40, "CombineSendParams layout");
static_assert(sizeof(CombineReduceParams) == 64, "CombineReduceParams layout");
static_assert(sizeof(RankBarrierParams) == 32, "RankBarrierParams layout");

}  // namespace unfused
}  // namespace mm
