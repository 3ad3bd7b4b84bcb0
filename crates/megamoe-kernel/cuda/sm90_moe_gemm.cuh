// sm90_moe_gemm.cuh -- Hopper grouped GEMM, FP8 activations x MXFP4 weights -> BF16, for both recipes.
//
// out[row][n] = sum_k act[row][k] * w_e[n][k] for every pool row of expert e (rows are expert-contiguous).
// Swap-AB: weights are the WGMMA A operand (64 weight rows per consumer warpgroup, decoded from FP4 in
// registers), tokens are the WGMMA N (BN tokens per tile), so a few tokens per expert still fill the
// tensor core's M and the kernel streams weights at HBM speed.
// Two tensor-core routes (megamoe-kernel's `Mma`):
//   FP8 (g128 only): FP8 WGMMA; E2M1 -> E4M3 decode with the four per-32 weight scales of a k128 block
//         folded in as offsets d from a per-(row, k128) base; one promotion per k128 with
//         act_scale[token] x base[row]. Hopper's FP8 tensor core does not accumulate in full FP32.
//   BF16 (either recipe): BF16 WGMMA on exactly widened operands: E2M1 x 2^s_w decoded to BF16 in
//         registers, the activations arrive already widened (E4M3 x 2^s_a in BF16); FP32 accumulation
//         over all of K: exact.
// Warp roles: warpgroup 0 = producer (one thread walks the schedule, hands each unit of work to the
// other roles as a UnitDesc in shared memory and issues TMA for every stage, the FP8 token scales
// as the pool's floats; FP8 two-CTA tiles: one converter warp copies each stage's from their chunk),
// warpgroups 1 and 2 = consumers (64 weight rows each,
// the same BN tokens). Each role is a device function of its own (Producer, ScaleConverter,
// consumer_role with the Epilogue it is given), configured by template parameters only, so another
// kernel can compose them; moe_gemm is the grouped GEMM's composition. A persistent CTA walks
// tiles blockIdx.x, blockIdx.x + gridDim.x, ...; a tile is (expert, 128-row weight tile, BN-token
// block), token block minor, so CTAs working at once share weight tiles through L2. In a cluster
// of two (kCluster, BF16 route) the two CTAs walk pairs of neighbouring weight tiles of one token
// block in step: each loads one K half of the shared activation tile into both (TMA multicast) and
// a stage is refilled once the consumers of both CTAs released it. Twin units (one-CTA tiles of
// at most 96 tokens, Layout::kTwin): a unit is two neighbouring weight tiles of one token
// block, both loaded into each stage, each consumer warpgroup 64 rows of both at once; each tile
// still gets its own UnitDesc and epilogue.
// Schedule: with `tickets` (the default) each CTA's producer draws the launch's items from a counter
// when it needs one, so CTAs that run faster take more (two CTAs on one SM do not run at one pace),
// CTA c's first ticket being c (the counter's follow the grid's); a cluster's rank 0 draws for both
// its CTAs and mails each item to rank 1 (ClusterMail); otherwise CTA (cluster) c takes items c,
// c + grid, ... Split tail (two-CTA tiles, `split_parts` > 1, drawn tiles only): the last items of
// a launch, one per CTA at most, are drawn in parts of their k128 blocks, every item's last part
// first and its head (part 0) last, so a launch ends on small pieces.
// A later part hands its FP32 sums to a slot (`partials`, flag `partial_ready`); the head waits
// for them, adds them (head + part 1 + part 2 ...: a fixed order, results do not depend on timing)
// and stores the tile. A head waits only for parts drawn before it, whose CTAs wait for nothing, and
// every CTA of the grid is resident at once (the grid is the occupancy), so the wait ends; one that
// does not end within kLocalWaitTimeoutNs records a timeout in `error` (GemmParams).
// Narrow tiles: see kNarrowTiles in moe_gemm.
// Epilogue (the kernel's choice; sm90_swiglu.cuh has the L1's SwiGLU): Bf16Out, BF16 rows of the tile's outputs; on the FP8 route with one CTA per SM each consumer
// warpgroup turns its fragments into the tile's token rows of its 64 outputs in shared memory
// (stmatrix.trans) and one of its threads hands them to the TMA as one box (`out_map`, a 2-D map
// over out); otherwise the fragments are stored directly.
//
// Weight layout (made by megamoe-kernel's transform): per (expert, weight tile, k128 block) one weight
// block of kWeightBlockBytes, the codes then the meta, which the producer loads with one copy a stage
// (the producer thread's work per stage is on the critical path: perf.md v92):
//   codes: [k32 step j 4][consumer wg 2][thread 128] x {u32 row r, u32 row r+8} = 8 KiB,
//          r = 16 * warp + lane / 4 within the warpgroup's 64 rows; k is the pool's channel order
//          (pool_order.cuh), in which thread-in-quad t's weights all lie in scale block t.
//     FP8 word: sign-split layout of fp_formats.cuh; elements 0..3 = k 4t..4t+3, 4..7 = k 16+4t..16+4t+3.
//     BF16 word: pairs A,B,C,D = k (2t,2t+1), (2t+8,2t+9), (16+2t,17+2t), (24+2t,25+2t) placed for the
//                shift-and-multiply decode (decode_bf16_word; transform.rs's BF16_PAIRS).
//   meta:  [128 rows] u32. FP8: (d_b + 8) in nibble b, base byte in bits 16..23. BF16: UE8M0 byte b = s_b
//          (b = scale block of the k128 block).
// Activations: TMA 2-D map over [pool rows][K] (E4M3, or BF16 for the BF16 route) in pool channel order,
// 128-B swizzle, box {128 B, BN}; with short twins a second map beside it, of 64-row boxes.
// BN (tokens per tile) is 16..256: accumulators, FP8 temp sets and fragments must fit the consumers'
// 224 registers (FP8 at 256 tokens: one temp set and one stage of fragments, see Consumer). A
// block of FP8 256-token or BF16 128-token one-CTA tiles may hold up to BN + Layout::kOverhang rows
// (16 more tokens of each stage on the same decoded weights, GemmParams::overhang, ExpertBlocks).
// FP8 activation scales: floats, MN-major [K/128][sf_stride], each 16 rows in the consumers' order
// (pool_order.cuh's scale_column); expert pool offsets multiples of 16.
#pragma once

#include "barriers.cuh"
#include "cuda_rt.cuh"
#include "fp_formats.cuh"
#include "pool_order.cuh"
#include "sm90_ptx.cuh"
#include "timeline.cuh"

namespace mm {
namespace gemm {

using namespace mm::sm90;

constexpr int kThreads = 384;       // producer warpgroup + 2 consumer warpgroups
constexpr int kTileRows = 128;      // weight rows per tile
constexpr int kBlockK = 128;        // K per pipeline stage
constexpr int kCodeBytes = 8192;    // FP4 codes of one (tile, k128 block)
constexpr int kMetaBytes = 512;     // one u32 per weight row
constexpr int kWeightBlockBytes = kCodeBytes + kMetaBytes;  // one (tile, k128 block): codes, then meta
// The fused forward's L1 weights prefetched into L2 while its glue runs (Gemm::prefetch_first_weights),
// over the whole grid: about what the HBM moves in the small forwards' glue (≈ 8 us at 4.2 TB/s),
// well inside the H200's 50 MB L2.
constexpr unsigned kFirstWeightsPrefetchBytes = 32u << 20;
constexpr int kMaxSplitParts = 4;   // parts of K a split-tail item is drawn in, at most

// A TMA descriptor (CUtensorMap) as a kernel parameter (__grid_constant__), and a layer's
// activation maps: the tile's, then the short blocks' and the overhang rows' (TilePlan::tensor_maps),
// which the producer finds right after the first.
struct __align__(64) TmaDescriptor {
  unsigned long long opaque[16];
};
constexpr int kTensorMapBytes = sizeof(TmaDescriptor);
struct ActMaps {
  TmaDescriptor tile, short_block, overhang;
  // The token scales `[k_blocks][sf_stride]` (floats) in boxes of kScaleChunkBlocks k-blocks by BN
  // rows (Layout::kChunkedScales).
  TmaDescriptor scales;
};

struct GemmParams {
  const u8* w_blocks;        // [E][n_tiles][k_blocks] x kWeightBlockBytes
  const float* act_sf;       // FP8: [k_blocks][sf_stride] (pool_order.cuh); BF16: unused
  u16* out;                  // [pool rows][n_out] BF16 bits
  const int* expert_offset;  // [E] first pool row of each expert
  const int* expert_rows;    // [E] rows of each expert
  int num_experts;
  int n_out;                 // weight rows (2I for L1, H for L2); multiple of 128
  int k;                     // multiple of 128
  int sf_stride;             // FP8: pool rows padded; >= max(offset + align(rows, BN))
  // Split tail (two-CTA tiles, drawn): per slot (kMaxSplitParts - 1 per split item) the FP32 sums
  // of a later part, per consumer warp in fragment order [grid][3][8][BN / 8][32] float4, and a flag
  // per (slot, warp), 0 between launches (the reader clears it).
  float* partials;
  u32* partial_ready;
  int split_parts;  // split tail: parts of K per split item (1: no split)
  int arrivals_needed;  // with row_arrivals: the count at which a tile's activation rows are whole
  // Dynamic schedule (null: the static one): [0] the tickets drawn past the grid's first (CTA or
  // cluster c's first is c), each by a CTA's producer (a cluster's rank 0's) when it needs one;
  // [1] CTAs done drawing. Both 0 between launches: the last CTA to finish drawing resets them.
  u32* tickets;
  // Optional (null: off): every tile's event (timeline.cuh), for the benchmarks' timelines.
  const timeline::Timeline* timeline;
  // The error word (barriers.cuh's format), 0 while no wait gave up: a wait that lasts longer than
  // kLocalWaitTimeoutNs — a split tail's head, the fused L2's row wait, a ring wait (ring_wait) —
  // records it here (the first one: compare-and-swap from 0) and goes on, so a lost hand-over fails
  // the launch instead of hanging the GPU. The host reads it after the stream is synchronized; it
  // is never reset.
  unsigned long long* error;
  // Optional (null: the activations are whole at launch): per 16 pool rows (POOL_ROW_ALIGN), how
  // many tiles of the layer before have stored them (the fused forward's L1 epilogue counts, with
  // release); a tile's first load waits until its rows' count reaches arrivals_needed (longer than
  // kLocalWaitTimeoutNs: a timeout in `error`, and the tile goes on).
  const u32* row_arrivals;
  // Rows past BN that a block may hold (0, or Layout::kOverhang where the layout has it): an
  // expert's rows then run in the fewest blocks of up to BN + overhang rows where that saves the
  // block of a few rows (ExpertBlocks). The fused forward's two layers share one block partition
  // (the L2 waits on the L1's blocks' counts), so both have it or neither.
  int overhang;
};
static_assert(sizeof(GemmParams) == 120, "GemmParams layout (megamoe-kernel/src/gemm.rs)");

// How long an in-kernel wait on another CTA (a split tail's head for a later part, the fused L2's
// producer for its rows' L1 tiles) waits before it gives up: far beyond any launch (milliseconds),
// short enough that a lost hand-over fails a forward within seconds.
constexpr unsigned long long kLocalWaitTimeoutNs = 5'000'000'000ull;

// The ring's waits (this CTA's own mbarriers: a stage's release, a stage's loads for the converter
// warp, the epilogue's hand-off) are bounded as well. They end unless the CTA's roles are out of
// step, so one that outlasts kLocalWaitTimeoutNs records a ring timeout (the CTA in the detail) in
// the launch's error word and returns as if the phase had completed: the launch's results are
// void, the host says so, and the GPU is not hung. From its second millisecond on a wait also
// reads the word and returns at once when it is set, so the CTA's later waits do not each wait out
// a timeout of their own. The word's address is in shared memory (Layout::kRingErrorAt, set by
// Gemm::setup: a __shared__ variable of its own would cost the kernel its aligned shared base).
// The consumers wait for their stages with mbar_wait's plain loop: any code beside it in their main
// loop costs them registers (ptxas spilled, or serialized the wgmmas, C7511), and those waits end
// anyway, since every stage is filled by the producer thread and the converter warp, whose waits
// here give up and go on.
//
// One asm block with as few registers as it can: written in C++ (or its slow path as a call), the
// clock, the word's address and the CTA index were held across the consumers' main loops, which
// spilled (or, with a call, had every wgmma serialized, C7512). It counts the wait in the error
// word's own unit (2^kErrorWaitUnitLog2 ns, by the low 32 bits of %globaltimer), checks the word
// once per unit, and on a timeout builds encode_local_timeout's word from its fields: the count
// of units as the wait field (bits 32 up), the CTA as the detail (the static_asserts pin both).
__device__ __forceinline__ void ring_wait(u64* bar, u32 parity, const void* error_at) {
  constexpr unsigned long long kWordHigh =
      (barriers::kErrorKindLocalTimeout << barriers::kErrorKindShift) |
      ((unsigned long long)barriers::kLocalWaitRing << barriers::kErrorLocalWaitShift);
  constexpr u32 kUnit = 1u << barriers::kErrorWaitUnitLog2;
  constexpr u32 kTimeoutUnits = (u32)(kLocalWaitTimeoutNs >> barriers::kErrorWaitUnitLog2);
  static_assert(barriers::kErrorWaitShift == 32 && kTimeoutUnits < barriers::kErrorWaitMax,
                "the timeout's unit count is the error word's high half below the kind and wait code");
  asm volatile(
      "{\n.reg .pred p;\n.reg .u32 start, now, units;\n.reg .u64 error, word;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE_%=;\n"
      "mov.u32 start, %%globaltimer_lo;\n"
      "mov.u32 units, 0;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE_%=;\n"
      "mov.u32 now, %%globaltimer_lo;\n"
      "sub.u32 now, now, start;\n"
      "setp.lt.u32 p, now, %3;\n"
      "@p bra WAIT_%=;\n"
      "add.u32 start, start, %3;\n"
      "add.u32 units, units, 1;\n"
      "ld.shared.u64 error, [%2];\n"
      "ld.relaxed.gpu.global.u64 word, [error];\n"
      "setp.ne.u64 p, word, 0;\n"
      "@p bra DONE_%=;\n"
      "setp.le.u32 p, units, %4;\n"
      "@p bra WAIT_%=;\n"
      "mov.u32 now, %%ctaid.x;\n"
      "mov.b64 word, {now, units};\n"
      "or.b64 word, word, %5;\n"
      "atom.relaxed.gpu.global.cas.b64 word, [error], 0, word;\n"
      "DONE_%=:\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity), "r"(smem_addr(error_at)), "n"(kUnit), "n"(kTimeoutUnits), "n"(kWordHigh)
      : "memory");
}

// A cluster's drawn items (kCluster 2, GemmParams::tickets): its rank-0 CTA draws each and hands
// it to rank 1 through rank 1's `ticket` word (st.async, completing `full`'s transaction bytes);
// rank 1 gives the word back on rank 0's `empty`. Two words, so the next draw need not wait for
// the peer to have read the last.
struct ClusterMail {
  u32 ticket[2];
  u64 full[2];
  u64 empty[2];
};
static_assert(sizeof(ClusterMail) == 40, "Layout's tables");

// kCtas: CTAs per SM. Small token tiles run two per SM: their consumers are bound by the latency
// of the FP4 decode, and twice the warps hide it (the loads alone run at the HBM rate).
// kHandoff: the epilogue runs on the producer warpgroup's free warps (the epilogue warps), which
// take each finished tile from the consumers through the hand-off region (see Gemm).
// kTwin (one-CTA tiles of at most 96 tokens, the plan's `twin_tiles`): a unit of work is two
// neighbouring weight tiles of one token block at once, each consumer warpgroup 64 rows of both
// (Consumer's second accumulator set), so every stage's activations (and FP8 token scales) serve
// twice the tensor work. At these tiles a stage's cost is mostly fixed (waits, scale loads, the
// promotion's issue) and not the wgmmas' (perf.md v88, v89); on the BF16 route the twins take the
// place of the cluster's shared activations (v95).
// kShortTwin (FP8 256-token tiles): a block of at most kShortTwinRows rows (an expert's last, a few
// rows past a multiple of 256) is a twin unit as well, which the producer chooses unit by unit;
// whole blocks stay one tile a unit. Such a block costs 0.58 of a whole tile for a quarter of its
// tokens (perf.md v90): its stage's cost is fixed, as at the small tiles, so two tiles share it.
// Its stages load the activations' first 64 rows only (a box of its own map, the one after the
// tile's) and the second tile's codes and meta where the next 128 rows would be, so the stage is
// no larger (perf.md v91: a stage grown for the second tile takes shared memory past 196 KiB).
// kOverhang (FP8 256-token and BF16 128-token one-CTA tiles): a block may hold up to BN + kOverhang
// rows (GemmParams::overhang, ExpertBlocks), which the consumers run as 16 more tokens of each
// stage on the fragments the stage already decoded (FP8: a fifth chunk; BF16: a second wgmma
// beside each), so an expert of BN + 1 .. BN + 16 rows is one unit, and one of 4 BN + 1 ..
// 4 BN + 64 four: a block of a few rows costs 0.45 of a whole FP8 256-token tile however few they
// are (perf.md v90, v91), its decode and handshakes a stage being fixed. The stage holds the extra
// rows after the tile's box (a box of 16 rows per 128-byte half, ActMaps::overhang), the
// epilogue's region their outputs. 16 is what the registers allow (FP8 32 made ptxas serialize
// the fused kernel's wgmmas, C7511; the BF16 256-token tile has no room for any).
template <int BN, bool kFp8, int kCtas, bool kHandoff>
struct Layout {
  static constexpr int kBN = BN;
  static constexpr bool kFp8Route = kFp8;
  static constexpr bool kTwin = kCtas == 1 && BN <= 96;
  static constexpr bool kShortTwin = kFp8 && kCtas == 1 && BN == 256;
  static constexpr int kShortTwinRows = 64;
  static constexpr int kOverhang = kShortTwin || (!kFp8 && kCtas == 1 && BN == 128) ? 16 : 0;
  static constexpr int kUnitTokens = BN + kOverhang;  // a unit's tokens at most
  static constexpr int kTiles = kTwin ? 2 : 1;  // weight tiles a stage holds in their own place
  // Descriptors a unit hands out at most (one per weight tile); the walker's items are pairs then.
  static constexpr int kUnitTiles = kTwin || kShortTwin ? 2 : 1;
  static constexpr int kHalves = kFp8 ? 1 : 2;  // 128-byte boxes of K a stage: FP8 one, BF16 two of 64 channels
  static constexpr int kTileBoxBytes = BN * 128 * kHalves;
  static constexpr int kOverhangBoxBytes = kOverhang * 128;  // an overhang unit's extra rows, a half
  // The tile's boxes, then the overhang rows' (half h's at overhang_at(h)).
  static constexpr int kActBytes = kTileBoxBytes + kHalves * kOverhangBoxBytes;
  __host__ __device__ static constexpr int overhang_at(int h) { return kTileBoxBytes + h * kOverhangBoxBytes; }
  static constexpr int kShortBoxBytes = kShortTwinRows * 128;  // a short twin's activation box
  // FP8 two-CTA tiles take a unit's token scales in chunks of kScaleChunkBlocks k-blocks, one copy
  // each into one of kScaleChunks buffers, not one small copy a stage: at small T the producer
  // thread's work a stage is on the critical path, and a stage's scale copy was ≈ 5 % of the
  // forward at T = 8 (perf.md v92, call F). The converter warp copies a stage's floats from its
  // chunk into the stage in its consumers' order and gives the buffer back after the chunk's last
  // stage. One-CTA tiles keep the copy a stage, straight from the pool in their consumers' order
  // (no converter: its wait between a stage's arrival and its decode cost 1.4-1.9 %, perf.md
  // v124): their stages are long, and a chunk of their 256 rows would cost a stage of shared memory.
  static constexpr bool kChunkedScales = kFp8 && kCtas == 2;
  static constexpr int kScaleChunkBlocks = 16;
  static constexpr int kScaleChunks = kChunkedScales ? 2 : 0;  // the converter's buffer index toggles
  static constexpr int kScaleChunkBytes = BN * kScaleChunkBlocks * 4;
  static constexpr int kSfBytes = kFp8 ? kUnitTokens * 4 : 0;  // the stage's token scales (floats)
  // FP8: the floats in the pool's order (pool_order::scale_column), read four at a time
  // (Consumer::chunk_scales).
  static constexpr bool kQuadScales = kFp8 && kCtas == 1;
  // A stage: the activation box, each weight tile's block (codes, then meta), the token scales.
  static constexpr int kCodesAt = kActBytes;
  static constexpr int kSfAt = kCodesAt + kTiles * kWeightBlockBytes;
  // A unit's weight tile `tile` (0, or 1 of a twin) in a stage: a short twin's second tile's block
  // in the activation rows 64 .. 191 that its block of tokens does not have.
  static constexpr int kSecondBlockAt = kShortTwin ? kShortTwinRows * 128 : kCodesAt + kWeightBlockBytes;
  static_assert(!kShortTwin || kSecondBlockAt + kWeightBlockBytes <= kActBytes, "a short twin's second tile fits its free rows");
  __host__ __device__ static constexpr int block_at(int tile) { return tile == 0 ? kCodesAt : kSecondBlockAt; }
  static constexpr int kStageBytes = ((kSfAt + kSfBytes + 1023) / 1024) * 1024;
  // FP8 with one CTA per SM: a buffer of the tile's BN token rows of 64 outputs per consumer
  // warpgroup, which the TMA stores (Bf16Out; gemm.rs's `epilogue_bytes` says why only there).
  static constexpr bool kBoxEpilogue = !kHandoff && kFp8 && kCtas == 1;
  // The hand-off region: kHandoffBoxes boxes of a word per (weight row pair, token) of a tile,
  // then each box's full mbarrier, then each box's empty one. Twin units hand two tiles over at
  // once: with a box each, the consumers go on to their next unit while the epilogue warps still
  // work on the first tile (one box held them until the first tile's epilogue was done).
  static constexpr int kHandoffBoxes = kHandoff && kTwin ? 2 : 1;
  static constexpr int kHandoffBytes = 256 * kUnitTokens;  // a box
  // Warps of the producer warpgroup that run the epilogue: those neither the producer thread's
  // warp nor (FP8 two-CTA tiles) the converter warp. Its warps take issue slots from the consumer
  // warps on their schedulers, so the more schedulers share them the better (perf.md v124).
  static constexpr int kEpilogueWarps = !kHandoff ? 0 : kChunkedScales ? 2 : 3;
  static constexpr int kEpilogueThreads = 32 * kEpilogueWarps;
  // The SwiGLU epilogue's SiLU table (unfused::kSiluTableBytes), kept in shared memory so that its
  // lookups take no L1 or L2 traffic (perf.md v114), after the hand-off region.
  static constexpr int kSiluBytes = kHandoff ? 4112 : 0;
  // The epilogue's shared memory: the hand-off region and the SiLU table, the BF16 box, or none.
  static constexpr int kEpilogueBytes =
      kHandoff ? kHandoffBoxes * (kHandoffBytes + 16) + kSiluBytes : kBoxEpilogue ? 2 * kUnitTokens * 128 : 0;
  static constexpr int kScaleChunksBytes = kScaleChunks * kScaleChunkBytes;
  static constexpr int kBudget = (kCtas == 1 ? 221 : 108) * 1024 - kEpilogueBytes - kScaleChunksBytes;
  static constexpr int kStages = (kBudget / kStageBytes) > 16 ? 16 : (kBudget / kStageBytes);
  // One-CTA tiles of 128 and 256 tokens hold few stages (3 to 7); a unit whose rows end early (a
  // short main loop, consume_unit) runs its stages faster than the weights stream from HBM into
  // so few, so the producer prefetches its stages' weights a ring ahead into L2 (perf.md v90, FP8:
  // -3.5 % at T = 1000; whole units gain nothing from it; BF16, whose 128- and 256-token stages
  // are larger still, measured with its 128-token tiles at mid T in v96).
  static constexpr int kWeightPrefetch = kCtas == 1 && BN >= 128 ? kStages : 0;
  // alignment slack, the stages, the epilogue's rows, full/empty/scales-ready mbarriers, the FP8
  // fold tables (15 x 8 B), the launch's item count, the ring's error word address and the
  // cluster's mail (ClusterMail), the unit descriptors
  static constexpr int kTableBytes = 176;
  // The producer's unit descriptors (UnitDesc, one per weight tile: a twin unit's two side by
  // side), a ring one unit longer than the stages: it can run at most kStages stages, so kStages
  // units, ahead of the consumers' last read; with a hand-off two longer, for the epilogue warps
  // read a unit's descriptor while the consumers may be a unit on.
  static constexpr int kUnitSlots = kUnitTiles * (kStages + (kHandoff ? 2 : 1));
  static constexpr int kUnitBytes = kUnitSlots * 48;
  // The ring slot after a unit of `tiles` descriptors at `slot` (a short twin's may wrap around).
  __host__ __device__ static constexpr int slot_after(int slot, int tiles) {
    return slot + tiles >= kUnitSlots ? slot + tiles - kUnitSlots : slot + tiles;
  }
  // The descriptor after `d` in the ring at `smem`: a twin unit's second tile's.
  template <class Desc>
  __device__ static const Desc* second_desc(const Desc* d, const u8* smem) {
    const Desc* first = (const Desc*)(smem + kUnitsAt);
    return d + 1 == first + kUnitSlots ? first : d + 1;
  }
  // full, empty and scales-ready a stage, then the scale chunks' empty barriers
  static constexpr int kBarriers = 3 * kStages + kScaleChunks;
  static constexpr int kBarrierBytes = (kBarriers * 8 + 15) / 16 * 16;  // tables stay 16-B aligned
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kScaleChunksBytes + kEpilogueBytes + kBarrierBytes +
                                    kTableBytes + kUnitBytes;
  // Offsets from the aligned base: the barriers and tables are found from it, not kept in registers.
  static constexpr int kScaleChunksAt = kStages * kStageBytes;  // 1024-B aligned, as the TMA wants
  static constexpr int kEpilogueAt = kScaleChunksAt + kScaleChunksBytes;
  // Box b's full mbarrier (count: the 256 consumer threads) and empty one (count: the epilogue
  // threads) are the b-th after these.
  static constexpr int kHandoffFullAt = kEpilogueAt + kHandoffBoxes * kHandoffBytes;
  static constexpr int kHandoffEmptyAt = kHandoffFullAt + 8 * kHandoffBoxes;
  static constexpr int kSiluAt = kHandoffEmptyAt + 8 * kHandoffBoxes;  // 16-B aligned
  static constexpr int kFullAt = kEpilogueAt + kEpilogueBytes;
  static constexpr int kEmptyAt = kFullAt + 8 * kStages;
  static constexpr int kScalesReadyAt = kEmptyAt + 8 * kStages;
  static constexpr int kScaleEmptyAt = kScalesReadyAt + 8 * kStages;  // count: the converter warp's lanes
  static constexpr int kTablesAt = kFullAt + kBarrierBytes;
  static constexpr int kItemsAt = kTablesAt + 120;  // after the 15 tables: the launch's item count
  static constexpr int kRingErrorAt = kTablesAt + 128;  // the error word's address (ring_wait)
  static constexpr int kMailAt = kTablesAt + 136;       // ClusterMail, 8-B aligned
  static_assert(136 + sizeof(ClusterMail) == kTableBytes, "the tables end with the cluster's mail");
  static constexpr int kUnitsAt = kTablesAt + kTableBytes;
  static constexpr int kProducerRegs = kCtas == 1 ? 56 : 48;
  static constexpr int kConsumerRegs = kCtas == 1 ? 224 : 96;
  // setmaxnreg only moves registers between the CTA's warpgroups: the CTA launches with the
  // launch bound's share (65536 / (384 kCtas), in steps of 8), and an increase beyond the sum
  // waits forever (perf.md v24).
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * (65536 / (kThreads * kCtas) / 8 * 8),
                "the warpgroups' registers exceed the CTA's");
  static_assert(kStages >= 2, "tile too large for a 2-stage pipeline");
};

// An expert's blocks of BN-token tiles when a block may hold up to `overhang` rows past BN (a
// multiple of 16, or 0): the fewest blocks of at most BN + overhang rows where they are fewer than
// blocks of BN — the first `wide` of them BN + overhang rows, then BN, the last the rest (up to
// BN + overhang - 1), so every block starts a multiple of 16 rows past the expert's first — and
// otherwise blocks of BN, the last the rest (a short block when it is a few rows). An expert of
// 4 x 256 + 60 rows is four units of 272, 272, 272 and 268 rows instead of four whole ones and a
// short one.
template <int BN>
struct ExpertBlocks {
  int count, wide;
  __device__ __forceinline__ ExpertBlocks(int rows, int overhang) {
    count = (rows + BN - 1) / BN;
    wide = 0;
    if (overhang > 0 && rows > BN) {
      const int fewest = (rows + BN + overhang - 1) / (BN + overhang);
      if (fewest < count) {
        wide = (rows - fewest * BN) / overhang;
        count = fewest;
      }
    }
  }
  // Block m's first row past the expert's first, and its rows (of the expert's `rows`).
  __device__ __forceinline__ int start(int m, int overhang) const { return m * BN + min(m, wide) * overhang; }
  __device__ __forceinline__ int rows_of(int m, int rows, int overhang) const {
    return m + 1 < count ? (m < wide ? BN + overhang : BN) : rows - start(m, overhang);
  }
};

// How a tile stands to the other tile of its item (kPairs: an item is two neighbouring weight tiles
// of one token block, which one CTA computes one after the other).
constexpr int kAlone = 0, kFirstOfPair = 1, kSecondOfPair = 2;

// A piece of work: k128 blocks [kb_begin, kb_end) of one tile (expert, weight tile, token block);
// a part of a split item hands over through partials slot `slot`; `pair`: kAlone, or which tile of
// its pair.
struct WorkUnit {
  int expert, n_tile, m_block, kb_begin, kb_end, slot, pair;
};

// A unit as the producer hands it to the converter warp and the consumers, in shared memory (slot
// n % kUnitSlots), written before the arrive that completes the unit's first stage; the consumers
// re-read it after their main loop instead of holding it in registers they do not have.
// kb_end == 0 marks the end of the CTA's work (its stage completes without data).
struct alignas(16) UnitDesc {
  int row0;       // first pool row of the tile
  int rows;       // rows of the tile that exist (the expert's rows from row0, at most BN)
  int n_col;      // first output column (weight row) of the tile; >= n_out: a cluster's ghost
  u32 kb_range;   // kb_begin | kb_end << 16
  int slot;       // split item: a later part's slot (kb_begin > 0), or a head's first (kb_begin 0, kb_end < K / 128)
  int pair;       // kAlone, kFirstOfPair or kSecondOfPair
  int expert;     // this rank's expert of the tile
  u32 handed_ns;  // with a timeline: the low 32 bits of %globaltimer when the producer handed it out
  u32 handed_cycles;  // with a timeline: the SM's cycle counter then (sm90::sm_cycles)
  u32 seq;        // the tile's place among this CTA's descriptors of the launch (the end mark's: their count)
  int tiles;      // weight tiles of the unit, its descriptors side by side from its first (1 or 2)
};
static_assert(sizeof(UnitDesc) == 48, "Layout's unit slots");

// Walks the work of one CTA in order (the producer; it tells the other roles through UnitDesc).
// A work item is (expert, group of kGroup consecutive weight tiles, token block): a cluster of
// kGroup CTAs takes one item at a time, each CTA the weight tile of its rank in the cluster (the
// last group of an odd tile count has a ghost tile, past n_out); drawn, rank 0 draws for the
// cluster (ClusterMail). With kPairs (one-CTA clusters) an
// item is two neighbouring weight tiles, both this CTA's, the even one first (the SwiGLU epilogue's
// g128 groups span them). Items go in launch order (CTAs working at once share weight and
// activation tiles through L2): drawn from `tickets`, or strided over the grid; drawn with a split
// tail, the last items (one per CTA at most) in parts of K.
// kShortPairs (one-CTA clusters, Layout::kShortTwin without kPairs): items are single tiles, but an
// expert's last block of at most kShortRows rows is one item for each pair of neighbouring tiles,
// the short twin unit; per pair of tiles its items go the even tile's whole blocks, the odd
// tile's, then the pair's short block (CTAs working at once still share the pair's weights), and
// the odd tile of an odd tile count is a ghost (past n_out), which the producer skips.
// kOverhang (Layout::kOverhang): the launch's GemmParams::overhang applies (else no block holds
// more than BN rows).
template <int kGroup, int BN, bool kSplitTail, bool kPairs, bool kShortPairs = false, int kShortRows = 64,
          int kOverhang = 0>
struct TileWalker {
  static_assert(!kPairs || (kGroup == 1 && !kSplitTail), "a pair is one CTA's, drawn whole");
  static_assert(!kShortPairs || (kGroup == 1 && !kSplitTail && !kPairs), "short pairs are one CTA's, drawn whole");
  static_assert(kGroup <= 2, "ClusterMail hands a cluster's items to one peer");
  static constexpr int kItemTiles = kPairs ? 2 : kGroup;
  // The kernel's parameters, by reference: reads come from the constant bank, not through a
  // pointer held in the producer's 48 registers.
  const GemmParams& p;
  // Every item of the launch (split tail only), in shared memory: the producer has 48 registers.
  const volatile int* launch_items;
  // Drawn clusters: the mail of this CTA's shared memory (the peer's is at the same offset) and the
  // ring's error word address, for the waits on it.
  ClusterMail* mail;
  const void* error_at;
  int expert = -1, expert_first_item = 0, expert_m_blocks = 0, expert_items = 0;
  int drawn = 0;  // items this CTA has taken (the static schedule's stride; drawn: the first is its own)
  // kShortPairs: the expert's whole blocks per tile, and whether its last block is short.
  int expert_whole = 0;
  bool expert_short = false;

  __device__ TileWalker(const GemmParams& params, const int* items, ClusterMail* cluster_mail = nullptr,
                        const void* ring_error_at = nullptr)
      : p(params), launch_items(items), mail(cluster_mail), error_at(ring_error_at) {
    next_expert();
  }
  __device__ void next_expert() {
    expert_first_item += expert_items;
    ++expert;
    const int rows = expert < p.num_experts ? p.expert_rows[expert] : 0;
    const int overhang = kOverhang > 0 ? p.overhang : 0;
    const ExpertBlocks<BN> blocks(rows, overhang);
    expert_m_blocks = blocks.count;
    if constexpr (kShortPairs) {
      expert_short = expert_m_blocks > 0 && blocks.rows_of(expert_m_blocks - 1, rows, overhang) <= kShortRows;
      expert_whole = expert_m_blocks - (expert_short ? 1 : 0);
      expert_items = (p.n_out / kTileRows + 1) / 2 * (2 * expert_whole + (expert_short ? 1 : 0));
    } else {
      expert_items = expert_m_blocks * ((p.n_out / kTileRows + kItemTiles - 1) / kItemTiles);
    }
  }
  // Finds item `idx` and the weight tile of cluster rank `rank` in it; walks forward from the last
  // call (a split tail's heads go back once, to the start). Returns false past the last item.
  __device__ bool seek(int idx, int rank, WorkUnit& u) {
    if (idx < expert_first_item) {
      expert = -1;
      expert_first_item = expert_items = 0;
      next_expert();
    }
    while (expert < p.num_experts && idx >= expert_first_item + expert_items) next_expert();
    if (expert >= p.num_experts) return false;
    const int local = idx - expert_first_item;
    u.expert = expert;
    if constexpr (kShortPairs) {
      const int per_pair = 2 * expert_whole + (expert_short ? 1 : 0), r = local % per_pair;
      const int first_tile = local / per_pair * 2;
      u.n_tile = first_tile + (r < 2 * expert_whole ? r / expert_whole : 0);
      u.m_block = r < 2 * expert_whole ? r % expert_whole : expert_whole;
      u.pair = r < 2 * expert_whole ? kAlone : kFirstOfPair;
    } else {
      u.n_tile = local / expert_m_blocks * kItemTiles + rank;
      u.m_block = local % expert_m_blocks;
      u.pair = kPairs ? kFirstOfPair : kAlone;
    }
    return true;
  }
  // This CTA's next unit (`u` holding its last, kAlone before the first); false when there is
  // none. The schedule is recomputed each time rather than held in registers (the producer has 48).
  __device__ bool unit(int rank, WorkUnit& u) {
    if ((kPairs || kShortPairs) && u.pair == kFirstOfPair) {  // the pair's odd tile, right after the even one
      ++u.n_tile;
      u.pair = kSecondOfPair;
      return true;
    }
    const int k_blocks = p.k / kBlockK;
    u.kb_begin = 0;
    u.kb_end = k_blocks;
    u.slot = 0;
    if (kGroup == 1 && p.tickets) {
      // Drawn: items in launch order, each to the CTA that asks first. CTAs do not run at one
      // pace (of two on one SM one runs ahead, perf.md v28), so fixed shares leave the launch
      // waiting for the slowest. The first ticket is this CTA's own (every CTA starts at once):
      // the grid's first round costs no round trip to the counter, whose tickets follow it. The
      // CTA is read afresh: blockIdx.x made ptxas serialize the wgmmas of the g128/bf16 32-token
      // fused kernel (C7511).
      int item = drawn++ == 0 ? (int)fresh_ctaid_x() : (int)gridDim.x + (int)atomicAdd(p.tickets, 1u);
      const int parts = min(p.split_parts, k_blocks);
      if (kSplitTail && parts > 1) {
        // Split tail: tickets past the whole items are the split items' last parts, then the
        // parts before them, the heads (part 0) last. Part q > 0 of split item s hands over in
        // slot s (kMaxSplitParts - 1) + q - 1; a head gets its item's first slot.
        const int total = *launch_items, split = min(total, (int)gridDim.x), whole = total - split;
        const int j = item - whole;
        if (j >= 0 && j < parts * split) {
          const int round = j / split, s = j - round * split, part = parts - 1 - round;
          item = whole + s;
          u.kb_begin = part * k_blocks / parts;
          u.kb_end = (part + 1) * k_blocks / parts;
          u.slot = s * (kMaxSplitParts - 1) + max(part - 1, 0);
        } else if (j >= 0) {
          item = total;  // past the end
        }
      }
      if (seek(item, rank, u)) return true;
      return past_the_end();
    }
    if (kGroup > 1 && p.tickets) {
      // Drawn by the cluster: rank 0 draws, rank 1 takes the same item. The first is the cluster's own.
      const int n = drawn++;
      if (seek(n == 0 ? (int)fresh_ctaid_x() / kGroup : cluster_ticket(rank, n - 1), rank, u)) return true;
      return past_the_end();
    }
    return seek(blockIdx.x / kGroup + drawn++ * (gridDim.x / kGroup), rank, u);
  }
  // The cluster's ticket `n` past its first: rank 0 draws it and mails it to rank 1, which waits
  // for it. Both waits are the ring's (bounded): the peer draws as its producer moves on.
  __device__ int cluster_ticket(int rank, int n) {
    const int word = n & 1;
    const u32 parity = (n >> 1) & 1;
    if (rank == 0) {
      const u32 item = gridDim.x / kGroup + atomicAdd(p.tickets, 1u);
      ring_wait(&mail->empty[word], parity ^ 1, error_at);  // rank 1 has read the word's last ticket
      st_async_cluster(&mail->ticket[word], &mail->full[word], 1, item);
      return (int)item;
    }
    mbar_expect_tx(&mail->full[word], sizeof(u32));
    ring_wait(&mail->full[word], parity, error_at);
    const int item = (int)((volatile u32*)mail->ticket)[word];
    mbar_arrive_cluster(&mail->empty[word], 0);
    return item;
  }
  // Past the end: this CTA draws no more. The last one to get here resets the tickets for the
  // next launch (nobody draws after it: a cluster's rank 0 drew its last before it got here).
  __device__ bool past_the_end() {
    if (atomicAdd(p.tickets + 1, 1u) == gridDim.x - 1) {
      atomicExch(p.tickets, 0u);
      atomicExch(p.tickets + 1, 0u);
    }
    return false;
  }
};

// Every item of the launch: the split tail needs the total, which only the device knows (the
// expert row counts are written by the dispatch). One warp sums it.
template <int kGroup>
__device__ int count_items(const GemmParams& p, int bn, int lane) {  // lane: of a whole warp
  int blocks = 0;
  for (int e = lane; e < p.num_experts; e += 32) blocks += (p.expert_rows[e] + bn - 1) / bn;
  // (Items of kGroup tiles: the split tail never walks pairs.)
  return __reduce_add_sync(0xffffffffu, blocks) * ((p.n_out / kTileRows + kGroup - 1) / kGroup);
}

// ---------------------------------------------------------------- weight decode
// In pool order (pool_order.cuh) every weight a thread holds in a stage is from scale block t, so a
// thread needs one decode table (FP8) or multiplier (BF16) per row and stage.
// FP8: one sign-split word of row r (or r+8) -> E4M3 regs for k 4t.. (lo) and 16+4t.. (hi).
// kRegs (every offset d >= -5, transform's `fold_in_registers`): the tables are two multiply-adds of
// the meta nibble d + 8 (FMA pipe, no load on the critical path). Otherwise `fold_table[d + 8]` is
// fp::e4m3_table(d), built once per CTA in shared memory: one LDS.64 per row and stage.
template <bool kRegs>
__device__ __forceinline__ fp::E4m3Table fold_table_at(u32 nibble, const fp::E4m3Table* fold_table) {
  if constexpr (kRegs) {
    return fp::e4m3_table_normal(nibble);
  } else {
    return fold_table[nibble];
  }
}
__device__ __forceinline__ void decode_fp8(uint2 w, const fp::E4m3Table& tr, const fp::E4m3Table& tr8, u32* a) {
  fp::e2m1x8_to_e4m3(w.x, tr, a[0], a[2]);
  fp::e2m1x8_to_e4m3(w.y, tr8, a[1], a[3]);
}

// BF16 route: one word (8 weights of one row) -> 4 BF16x2 regs, pairs A, B (k16 step 0) and C, D
// (step 1). A shift and a mask put each pair's E2M1 magnitudes at bits 6..8 / 22..24, where they read
// as BF16 values 2^126 times too small (code 1 = 0.5 as a BF16 subnormal); one multiply by
// `mult` = 2^(s-1) in both halves makes E2M1 x 2^(s-127) exactly. C and D bring their signs along
// (bits 15/31 after the same shift); A and B flip the multiplier's sign instead. The shifts are
// transform.rs's BF16_PAIRS; the shifts and multiplies run on the FMA pipe, only the masks on the ALU.
__device__ __forceinline__ u32 mul_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// BF16x2 bits of 2^(s-1), s = byte j of `scales` (2 <= s <= 128, checked by the transform).
__device__ __forceinline__ u32 bf16_multiplier(u32 scales, int j) {
  return ((scales >> (8 * j)) & 0xffu) * 0x00800080u + 0x3f003f00u;  // exponent field s - 1 + 127
}
__device__ __forceinline__ void decode_bf16_word(u32 w, u32 mult, u32& pa, u32& pb, u32& pc, u32& pd) {
  constexpr u32 kMag = 0x01c001c0u, kSign = 0x80008000u;
  pa = mul_bf16x2(w & kMag, mult ^ ((w << 4) & kSign));
  pb = mul_bf16x2((w >> 7) & kMag, mult ^ ((w << 5) & kSign));
  pc = mul_bf16x2((w << 3) & (kMag | kSign), mult);
  pd = mul_bf16x2((w << 6) & (kMag | kSign), mult);
}

// ---------------------------------------------------------------- consumer main loop
// One consumer warpgroup: 64 weight rows x BN tokens. Software-pipelined so that the decode of
// stage s+1 and the promotion of chunk c-1 run on the CUDA cores while the tensor core works on
// chunk c. A chunk is the WGMMA work of one stage on kNsub tokens; fragments of two stages live
// in registers (parity P = stage index & 1; FP8 256-token tiles: one), FP8 temp accumulators
// rotate through kLag + 1 sets.
// kRowBase (FP8): every k128 block of a weight row shares one fold base, so the promotion needs
// only the token's scale and the base multiplies the finished row once (exact: a power of two).
// kRegs (FP8): decode tables from the meta nibbles in registers (see decode_fp8).
// kCluster: CTAs per cluster (2: BF16 route only, see the header).
template <int BN, bool kFp8, int kCtas, bool kRowBase, bool kRegs, int kCluster, bool kHandoff>
struct Consumer {
  static_assert(!kFp8 || kCluster == 1, "clusters serve the BF16 route");
  using L = Layout<BN, kFp8, kCtas, kHandoff>;
  static constexpr int kBN = BN;
  static constexpr bool kFp8Route = kFp8;
  static constexpr int kCtasPerSm = kCtas;
  static constexpr int kClusterCtas = kCluster;
  // FP8 chunks: 64 tokens above 64, but 32 in 96-token tiles (whole chunks for their 64-token
  // loop, see consume_unit); with two CTAs per SM (96 registers) 16. (A whole 32-token tile per
  // chunk fit once, with 6 % fewer instructions and no measured gain, v14; the split tail's
  // hand-over took those registers. 32-token chunks lose 2-6 % at 128 and 256 tokens, v40/v41.)
  static constexpr int kNsub = !kFp8 ? BN : kCtas == 2 ? 16 : BN == 96 ? 32 : BN <= 64 ? BN : 64;
  // FP8, one CTA per SM: 256-token tiles hold one fragment set (its 128 accumulators, a temp set
  // and the prefetched scales leave no room for a second), so a stage's decode waits for its
  // predecessor's wgmmas; they halve the decode per token, which pays at large T (perf.md v41).
  // Twin units (Layout::kTwin) hold one fragment set of each tile instead: a[0] the first tile's,
  // a[1] the second's; each chunk's wgmmas of both tiles go in one group, whose promotion waits
  // for it (perf.md v89: alternating the tiles' groups, one in flight while the other promotes,
  // was 10 % slower).
  static constexpr bool kTwin = L::kTwin;
  static constexpr bool kShortTwin = L::kShortTwin;
  static constexpr bool kOneParity = kFp8 && kCtas == 1 && (BN > 128 || kTwin);
  // FP8 promotion lag (chunks issued after a chunk before it is promoted) and temp sets (lag + 1):
  // 128-token tiles keep two chunks queued on the tensor core while they promote (+2-3 %, v40);
  // 256-token tiles have registers for one temp set besides the scales' prefetch, which is worth
  // more there (lag 1 without it: -4 %, v41c; with it at 232 registers: -2 %, v45). 96-token
  // twins promote one chunk behind (their 32-token chunks leave the registers for it: -4 %,
  // perf.md v90); 64-token twins do not (a 64-token chunk is the whole loop).
  static constexpr int kLag = !kFp8 || kCtas == 2 ? 1 : kTwin && BN > 64 ? 1 : kOneParity ? 0 : BN > 64 ? 2 : 1;
  static constexpr int kTempSets = kLag + 1;
  // The main loop runs on the first kN tokens of the tile (BN, or fewer when the tile's rows fit:
  // less wgmma and promotion work). FP8 chunks of that: chunk h is the kNsub tokens from h kNsub
  // (the last one narrower when kN is not a multiple), all four k32 steps of the stage. A loop of
  // fewer chunks than kLag promotes each chunk one chunk later (a trip's stage 0 must be done
  // before the next trip decodes into its fragments).
  template <int kN>
  struct Active {
    static constexpr int kChunks = (kN + kNsub - 1) / kNsub;
    static constexpr int kLag = kChunks < Consumer::kLag ? kChunks : Consumer::kLag;
    __host__ __device__ static constexpr int width(int h) { return kN - h * kNsub < kNsub ? kN - h * kNsub : kNsub; }
  };
  // Fragments per parity. FP8: a whole stage (4 k32 steps x 4). BF16: half a stage (4 k16 steps
  // x 4); its two halves alternate between the parities.
  static constexpr int kAregs = 16;

  u8* smem;
  int thread, lane, t, row_r;  // thread: among the 256 consumer threads (= 128 warpgroup + thread in it)
  int stage = 0;   // next stage to wait for
  u32 phase = 0;
  int held[2];     // ring stage whose fragments are in parity P
  u32 a[2][kAregs];
  float base[2][2];  // FP8: weight base of rows r, r+8 per parity (twin: per tile)
  u32 mult_r, mult_r8;  // BF16: the current stage's multipliers of rows r, r+8 (scale block t)
  // BF16 twin: the second tile's fragments of each half (a: the first tile's) and multipliers.
  static constexpr bool kBf16Twin = !kFp8 && kTwin;
  u32 a2[kBf16Twin ? 2 : 1][kBf16Twin ? kAregs : 1];
  u32 mult2_r, mult2_r8;
  float tmp[kTempSets][kNsub / 2];  // FP8: chunks' wgmma results
  // The tile's sums; an overhang unit's extra tokens in acc[BN / 2 ..] (the fifth chunk's).
  float acc[L::kUnitTokens / 2];
  // Twin: the second tile's chunk results and sums (a single unused register otherwise).
  float tmp2[kTempSets][kTwin ? kNsub / 2 : 1];
  float acc2[kTwin ? BN / 2 : 1];

  __device__ u64* full(int s) const { return (u64*)(smem + L::kFullAt) + s; }
  __device__ u64* empty(int s) const { return (u64*)(smem + L::kEmptyAt) + s; }
  __device__ u64* scales_ready(int s) const { return (u64*)(smem + L::kScalesReadyAt) + s; }  // FP8: floats ready
  __device__ const fp::E4m3Table* fold_table() const { return (const fp::E4m3Table*)(smem + L::kTablesAt); }
  // WGMMA descriptor of stage s's activations: stage 0's plus whole stages (one 64-bit add, not a
  // descriptor rebuilt from the address per stage).
  u64 act_desc0;
  __device__ u64 act_desc(int s) const { return act_desc0 + (u64)(s * (L::kStageBytes >> 4)); }
  // Stage s's codes and meta of weight tile `tile` of the unit (0, or 1 in a twin unit).
  __device__ const uint2* stage_codes(int s, int tile = 0) const {
    return (const uint2*)(smem + s * L::kStageBytes + L::block_at(tile));
  }
  __device__ const u32* stage_meta(int s, int tile = 0) const {
    return (const u32*)(smem + s * L::kStageBytes + L::block_at(tile) + kCodeBytes);
  }
  __device__ const float* stage_sf(int s) const { return (const float*)(smem + s * L::kStageBytes + L::kSfAt); }

  // Waits for the next stage and decodes its weight fragments into parity P (twin: both tiles',
  // into a[0] and a[1]).
  template <int P>
  __device__ __forceinline__ void load_stage() {
    mbar_wait(full(stage), phase);
    if constexpr (L::kChunkedScales) mbar_wait(scales_ready(stage), phase);
    held[P] = stage;
    if constexpr (kTwin) {
      decode_tile<0, 0>(stage);
      decode_tile<1, 1>(stage);
    } else {
      decode_tile<P, kRowBase ? 0 : P>(stage);  // one base per row needs one register pair
    }
    next_stage();
  }
  __device__ __forceinline__ void next_stage() {
    if (++stage == L::kStages) { stage = 0; phase ^= 1; }
  }
  // Weight tile kSet of stage s (twin), or its one tile, into fragment set kSet, its rows' bases
  // into base[kBase].
  template <int kSet, int kBase>
  __device__ __forceinline__ void decode_tile(int s) {
    constexpr int tile = L::kUnitTiles == 2 ? kSet : 0;
    const u32 meta_r = stage_meta(s, tile)[row_r], meta_r8 = stage_meta(s, tile)[row_r + 8];
    const uint2* codes = stage_codes(s, tile) + thread;
    const fp::E4m3Table tr = fold_table_at<kRegs>((meta_r >> (4 * t)) & 0xf, fold_table());
    const fp::E4m3Table tr8 = fold_table_at<kRegs>((meta_r8 >> (4 * t)) & 0xf, fold_table());
#pragma unroll
    for (int j = 0; j < 4; ++j) decode_fp8(codes[j * 256], tr, tr8, &a[kSet][4 * j]);
    base[kBase][0] = fp::ue8m0_float((meta_r >> 16) & 0xff);
    base[kBase][1] = fp::ue8m0_float((meta_r8 >> 16) & 0xff);
  }

  // BF16: waits for the next stage; it becomes the current one (held[1] keeps the previous).
  __device__ __forceinline__ void bf16_wait_stage() {
    mbar_wait(full(stage), phase);
    held[1] = held[0];
    held[0] = stage;
    mult_r = bf16_multiplier(stage_meta(stage)[row_r], t);
    mult_r8 = bf16_multiplier(stage_meta(stage)[row_r + 8], t);
    if constexpr (kBf16Twin) {
      mult2_r = bf16_multiplier(stage_meta(stage, 1)[row_r], t);
      mult2_r8 = bf16_multiplier(stage_meta(stage, 1)[row_r + 8], t);
    }
    next_stage();
  }

  // BF16: half H of the current stage (k32 steps 2H, 2H+1 = k16 steps 4H..4H+3) into parity H
  // (a twin: the second tile's into a2[H]).
  template <int H>
  __device__ __forceinline__ void bf16_decode_half() {
    bf16_decode_tile_half<H>(stage_codes(held[0]) + thread, mult_r, mult_r8, a[H]);
    if constexpr (kBf16Twin) bf16_decode_tile_half<H>(stage_codes(held[0], 1) + thread, mult2_r, mult2_r8, a2[H]);
  }
  template <int H>
  __device__ __forceinline__ static void bf16_decode_tile_half(const uint2* codes, u32 mr, u32 mr8, u32* frag) {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int j = 2 * H + jj;
      const uint2 w = codes[j * 256];
      u32* q0 = &frag[8 * jj];  // k16 step 2jj of the half; step 2jj+1 at +4
      decode_bf16_word(w.x, mr, q0[0], q0[2], q0[4], q0[6]);
      decode_bf16_word(w.y, mr8, q0[1], q0[3], q0[5], q0[7]);
    }
  }

  // BF16: the wgmmas of half H of the current stage (one 64-K box of BN rows), on the first kN
  // tokens, accumulated into acc.
  template <int kN, int H>
  __device__ __forceinline__ void bf16_issue_half() {
    wg_fence();
    const u64 desc = act_desc(held[0]) + H * (BN * 128 / 16);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      mma_bf16_rs<(kN > BN ? BN : kN)>(acc, &a[H][4 * q], desc + 2 * q, 1);  // 32 B per k16
      if constexpr (kN > BN)  // an overhang unit's last tokens, from their box of the half
        mma_bf16_rs<(kN > BN ? kN - BN : 8)>(acc + BN / 2, &a[H][4 * q],
                                            act_desc(held[0]) + L::overhang_at(H) / 16 + 2 * q, 1);
    }
    if constexpr (kBf16Twin) {  // the second tile's rows on the same tokens, in the same group
#pragma unroll
      for (int q = 0; q < 4; ++q) mma_bf16_rs<kN>(acc2, &a2[H][4 * q], desc + 2 * q, 1);
    }
    wg_commit();
  }

  // This warp is done with the stage of parity P (its wgmmas completed, its reads issued). In a
  // cluster the peer's producer multicasts into this stage too, so its empty barrier hears it.
  u32 peer;  // the other CTA of a cluster of two
  template <int P>
  __device__ __forceinline__ void release() {
    __syncwarp();
    if constexpr (kCluster == 2) {
      mbar_arrive_here_and_cluster(empty(held[P]), peer, lane == 0);
    } else if (lane == 0) {
      mbar_arrive(empty(held[P]));
    }
  }
  // Epilogue of FP8 one-CTA tiles: the warpgroup writes its 64 outputs of the tile's BN tokens as
  // BF16 token rows into its own buffer (128-byte rows in the TMA's 128-byte swizzle: 16-byte chunk
  // c of row r at c ^ (r % 8), so each stmatrix.trans row group hits all 32 banks), and one thread
  // hands the whole box to the TMA: the warpgroup goes on to its next tile while the box is stored.
  // Stores by the consumers themselves stalled both warpgroups at every tile end (4 % of L1, 8 % of
  // L2 at T=8192, perf.md v48); 512 row-sized bulk copies a tile queued ahead of the producer's
  // loads (v49b). A tile that ends inside its expert's rows stores the rows that exist itself: the
  // box would run into the next expert's; so does an overhang unit its rows past BN (the box holds
  // BN). `out_rows`: out[first pool row of the tile][first weight row of this warpgroup]; (x, y)
  // the same place in `out_map`'s coordinates.
  __device__ __forceinline__ void store_tile(const void* out_map, u16* out_rows, int n_out, int rows_left, int x,
                                             int y) {
    // Thread coordinates read afresh (volatile): derived from the members, ptxas computes the
    // fallback's addresses once per CTA and keeps them across the main loop, where they spill.
    const int tid = (int)fresh_tid_x() - 128, lane = tid % 32;  // among the consumer threads; shadows the members
    const int wg = tid / 128, w = (tid / 32) % 4;  // warpgroup, warp in it
    u8* buf = smem + L::kEpilogueAt + wg * (L::kUnitTokens * 128);
    const u32 buf_addr = smem_addr(buf);
    // The previous tile's box is out of the buffer (every thread waits for its own bulk groups:
    // only the leader has any, and a branch around the wait made the 128-token tile spill).
    bulk_wait_read<0>();
    wg_bar_sync(wg);
    const int m = lane / 8, j = lane % 8;  // the stored row this lane addresses: row j of matrix m
#pragma unroll
    for (int round = 0; round < BN / 32; ++round) stmatrix_round<2>(buf_addr, round, w, m, j);
    if constexpr (L::kOverhang > 0) {
      if (rows_left > BN) stmatrix_round<L::kOverhang / 16>(buf_addr, BN / 32, w, m, j);
    }
    fence_proxy_async_shared();
    wg_bar_sync(wg);  // the box is whole
    if (rows_left >= BN) {
      if (tid % 128 == 0) {
        tma_store_2d(out_map, buf, x, y);
        bulk_commit();
      }
      if constexpr (L::kOverhang > 0) store_rows(buf, out_rows, n_out, BN, rows_left, w, lane);
    } else {
      store_rows(buf, out_rows, n_out, 0, rows_left, w, lane);
    }
  }
  // Token rows [first, end) of the buffer `buf` to out, by the warpgroup's threads: eight lanes a
  // row, one 16-byte chunk each (whole 128-byte lines).
  __device__ __forceinline__ static void store_rows(const u8* buf, u16* out_rows, int n_out, int first, int end, int w,
                                                    int lane) {
    const int chunk = lane % 8;
    for (int token = first + 4 * w + lane / 8; token < end; token += 16) {
      const uint4 v = *(const uint4*)(buf + token * 128 + ((chunk ^ (token % 8)) << 4));
      *(uint4*)(out_rows + (size_t)token * n_out + 8 * chunk) = v;
    }
  }
  // Tokens 32 round .. of this warp's fragments as BF16 token rows into the buffer at `buf_addr`, in
  // kX4 stmatrix.x4 of 16 tokens (2: a whole round of 32 tokens; 1: an overhang's 16).
  template <int kX4>
  __device__ __forceinline__ void stmatrix_round(u32 buf_addr, int round, int w, int m, int j) const {
    u32 packed[4 * kX4];  // matrix 2g + h: token group g of the round, weight rows r (h = 0) or r + 8
#pragma unroll
    for (int q = 0; q < 4 * kX4; ++q) {
      const int i = 16 * round + 4 * (q / 2) + 2 * (q % 2);
      packed[q] = pack_bf16x2(acc[i], acc[i + 1]);
    }
#pragma unroll
    for (int x4 = 0; x4 < kX4; ++x4) {
      const int g = 2 * x4 + m / 2, h = m % 2, row = 32 * round + 8 * g + j;  // row % 8 == j
      stmatrix_x4_trans(buf_addr + row * 128 + (((2 * w + h) ^ j) << 4), packed[4 * x4], packed[4 * x4 + 1],
                        packed[4 * x4 + 2], packed[4 * x4 + 3]);
    }
  }
  // The 128 threads of consumer warpgroup wg meet (named barrier 1 + wg).
  __device__ __forceinline__ static void wg_bar_sync(int wg) {
    if (wg == 0) {
      named_bar_sync<1, 128>();
    } else {
      named_bar_sync<2, 128>();
    }
  }

  // This warp among the 8 consumer warps, from the thread index (a member would cost a register
  // the main loop needs).
  __device__ __forceinline__ static int consumer_warp() { return (int)threadIdx.x / 32 - 4; }
  // Split tail: this warp's FP32 sums of a later part of a tile, for its head, in `slot`. Fragment order,
  // one float4 per 32 lanes at a time: whole 512-B lines.
  __device__ __forceinline__ void store_partial(float* partials, u32* ready, int slot) const {
    const int w = consumer_warp();
    float4* dst = (float4*)partials + (size_t)(slot * 8 + w) * (BN / 8) * 32 + lane;
#pragma unroll
    for (int q = 0; q < BN / 8; ++q)
      __stcg(dst + 32 * q, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
    // The warp barrier orders every lane's stores before each lane's release of the flag (the same
    // word and value from all lanes: a branch for lane 0 alone made ptxas spill the main loop).
    __syncwarp();
    st_release_gpu(ready + slot * 8 + w, 1);
  }
  // Split tail: waits until a later part of the tile whose head this warp is about to compute has
  // been handed over in `slot`. The part was drawn a round of tickets earlier or more, so the wait is
  // normally over at once; it ends because the part's CTA waits for nothing and every CTA of the grid is
  // resident (GemmCore::new checks the occupancy), like the kernel's mbarrier waits. Should it not
  // (a lost part), it gives up after kLocalWaitTimeoutNs, records a timeout in `error` and goes on
  // with the tile's sums void: no trap, whose path makes ptxas spill the main loop. The wait runs
  // before the main loop, where no accumulator is live, and keeps its clock in one register (32-bit
  // steps of the error word's 2^20 ns, read every poll): with a 64-bit start and a poll count as
  // well, ptxas serialized the FP8 two-CTA wgmmas (C7511).
  __device__ __forceinline__ void wait_partial(u32* ready, unsigned long long* error, int slot) const {
    constexpr u32 kUnit = barriers::kErrorWaitUnitLog2;
    u32* flag = ready + slot * 8 + consumer_warp();
    const u32 start = (u32)(barriers::ptx::globaltimer() >> kUnit);
    while (!__any_sync(0xffffffffu, ld_acquire_gpu(flag) != 0)) {
      const u32 waited = (u32)(barriers::ptx::globaltimer() >> kUnit) - start;
      if (__any_sync(0xffffffffu, waited > (u32)(kLocalWaitTimeoutNs >> kUnit))) {
        if (lane == 0) {
          const u64 word = barriers::encode_local_timeout(barriers::kLocalWaitSplitTail, (u32)slot, (u64)waited << kUnit);
          barriers::ptx::atom_cas_relaxed_gpu(error, 0, word);
        }
        break;
      }
    }
    if (lane == 0) *flag = 0;  // ready for the next launch
  }
  // Split tail: acc (a tile head) += a later part's sums in `slot` (parts added in order).
  __device__ __forceinline__ void add_partial(const float* partials, int slot) {
    const int w = consumer_warp();
    const float4* src = (const float4*)partials + (size_t)(slot * 8 + w) * (BN / 8) * 32 + lane;
#pragma unroll
    for (int q = 0; q < BN / 8; ++q) {
      const float4 v = __ldcg(src + 32 * q);
      acc[4 * q] += v.x;
      acc[4 * q + 1] += v.y;
      acc[4 * q + 2] += v.z;
      acc[4 * q + 3] += v.w;
    }
  }

  // FP8: chunk h of the stage in parity P into temp set B.
  template <int kN, int P, int B, int h>
  __device__ __forceinline__ void issue_fp8() {
    constexpr int kW = Active<kN>::width(h);
#pragma unroll
    for (int i = 0; i < kW / 2; ++i) fence_operand(tmp[B][i]);
    wg_fence();
    const u64 desc = act_desc(held[P]) + h * kNsub * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) mma_fp8_rs<kW>(tmp[B], &a[P][4 * j], desc + 2 * j, j > 0);
    if constexpr (kTwin) {  // the second tile's rows on the same tokens, in the same group
#pragma unroll
      for (int i = 0; i < kW / 2; ++i) fence_operand(tmp2[B][i]);
#pragma unroll
      for (int j = 0; j < 4; ++j) mma_fp8_rs<kW>(tmp2[B], &a[1][4 * j], desc + 2 * j, j > 0);
    }
    wg_commit();
  }

  // FP8: the token scales of chunk h of parity P's stage (two per 8 columns). One CTA per SM: in
  // the pool's order (pool_order::scale_column), one LDS.128 per 16 columns, and (one base per
  // row) loaded before the wgmma wait that precedes their promotion, so the shared-memory latency
  // hides behind it. Two CTAs per SM have no registers to spare for either (with them ptxas serialized the
  // wgmmas, C7511): one LDS.64 per 8 columns after the wait.
  static constexpr bool kQuadScales = L::kQuadScales;
  static constexpr bool kPrefetchScales = kCtas == 1 && kRowBase;
  static constexpr int kScalePairs = kNsub / 8;  // FP8: two token scales per 8 columns of a chunk
  template <int kN, int P, int h>
  __device__ __forceinline__ void chunk_scales(float2* sc) const {
    constexpr int kPairs = Active<kN>::width(h) / 8;
    if constexpr (kQuadScales) {
      const float* sf = stage_sf(held[P]) + h * kNsub + 4 * t;  // chunks start on 16 columns
#pragma unroll
      for (int g = 0; g < kPairs / 2; ++g) {
        const float4 v = *(const float4*)(sf + 16 * g);
        sc[2 * g] = make_float2(v.x, v.y);
        sc[2 * g + 1] = make_float2(v.z, v.w);
      }
      if constexpr (kPairs % 2 == 1) sc[kPairs - 1] = *(const float2*)(sf + 16 * (kPairs / 2));
    } else {
      const float* sf = stage_sf(held[P]) + h * kNsub + 2 * t;
#pragma unroll
      for (int q = 0; q < kPairs; ++q) sc[q] = *(const float2*)(sf + 8 * q);
    }
  }

  // FP8: acc += temp set B (chunk h of parity P's stage) x act_scale[token] (x base[row] unless the
  // base is per row); twin: acc2 += tmp2 the same way, with the second tile's bases.
  template <int kN, int P, int B, int h>
  __device__ __forceinline__ void promote(const float2* sc) {
    promote_into<kN, h>(tmp[B], acc, sc, base[P]);
    if constexpr (kTwin) promote_into<kN, h>(tmp2[B], acc2, sc, base[1]);
  }
  template <int kN, int h>
  __device__ __forceinline__ static void promote_into(float* chunk, float* sums, const float2* sc, const float* row_base) {
    constexpr int kW = Active<kN>::width(h);
#pragma unroll
    for (int i = 0; i < kW / 2; ++i) fence_operand(chunk[i]);
    // accumulator i: row = row_r + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2t + (i & 1)
#pragma unroll
    for (int q = 0; q < kW / 8; ++q) {
      float* out = sums + h * (kNsub / 2) + 4 * q;
      if constexpr (kRowBase) {
        out[0] = fmaf(chunk[4 * q + 0], sc[q].x, out[0]);
        out[1] = fmaf(chunk[4 * q + 1], sc[q].y, out[1]);
        out[2] = fmaf(chunk[4 * q + 2], sc[q].x, out[2]);
        out[3] = fmaf(chunk[4 * q + 3], sc[q].y, out[3]);
      } else {
        out[0] = fmaf(chunk[4 * q + 0], sc[q].x * row_base[0], out[0]);
        out[1] = fmaf(chunk[4 * q + 1], sc[q].y * row_base[0], out[1]);
        out[2] = fmaf(chunk[4 * q + 2], sc[q].x * row_base[1], out[2]);
        out[3] = fmaf(chunk[4 * q + 3], sc[q].y * row_base[1], out[3]);
      }
    }
  }

  // FP8, step c of a trip of kTripStages stages (c = stage parity x kChunks + chunk): the chunk goes
  // into temp set c % kTempSets, then chunk c - lag is promoted (lag: Active<kN>::kLag), so lag
  // chunks of this warpgroup stay queued on the tensor core while its warps promote. The trip's
  // last lag chunks are promoted by fp8_drain, after the next stage's decode. Stage 1 is decoded
  // once stage 0's last chunk is issued.
  template <int kN, int kTripStages, int c = 0>
  __device__ __forceinline__ void fp8_trip() {
    constexpr int kChunks = Active<kN>::kChunks, lag = Active<kN>::kLag;
    if constexpr (c < kTripStages * kChunks) {
      issue_fp8<kN, c / kChunks, c % kTempSets, c % kChunks>();
      if constexpr (c >= lag) fp8_promote<kN, c - lag, lag>();
      if constexpr (kTripStages == 2 && c == kChunks - 1) load_stage<1>();
      fp8_trip<kN, kTripStages, c + 1>();
    }
  }
  // FP8, end of a trip: the chunks not yet promoted, oldest first.
  template <int kN, int kTripStages, int d = (kTripStages * Active<kN>::kChunks > Active<kN>::kLag
                                                  ? kTripStages * Active<kN>::kChunks - Active<kN>::kLag
                                                  : 0)>
  __device__ __forceinline__ void fp8_drain() {
    constexpr int kSteps = kTripStages * Active<kN>::kChunks;
    if constexpr (d < kSteps) {
      fp8_promote<kN, d, kSteps - 1 - d>();
      fp8_drain<kN, kTripStages, d + 1>();
    }
  }
  // FP8: once at most kPending wgmma groups are in flight (chunk d is done), promote chunk d of the
  // trip; its stage's last chunk releases the stage.
  template <int kN, int d, int kPending>
  __device__ __forceinline__ void fp8_promote() {
    constexpr int kChunks = Active<kN>::kChunks;
    constexpr int P = d / kChunks, h = d % kChunks;
    float2 sc[kScalePairs];
    if constexpr (kPrefetchScales) chunk_scales<kN, P, h>(sc);
    wg_wait<kPending>();
    if constexpr (!kPrefetchScales) chunk_scales<kN, P, h>(sc);
    promote<kN, P, d % kTempSets, h>(sc);
    if constexpr (h == kChunks - 1) release<P>();
  }

  // acc = this warpgroup's 64 x BN tile of one (expert, weight tile, token block), computed on its
  // first kN tokens (the rest stay 0; kN past BN: an overhang unit's BN + kOverhang tokens). FP8
  // stages go in trips of two (parity 0, 1), or of one with one fragment set; FP8 drains its
  // pipeline at the end of every trip, because ptxas serializes all wgmmas (C7514) when a temp set
  // may still be in flight across a branch or loop.
  template <int kN>
  __device__ __forceinline__ void mainloop(int k_blocks) {
    constexpr int kSums = (kN > BN ? kN : BN) / 2;  // the accumulators the unit fills
#pragma unroll
    for (int i = 0; i < kSums; ++i) {
      acc[i] = 0.0f;
      fence_operand(acc[i]);
      if constexpr (kTwin) {
        acc2[i] = 0.0f;
        fence_operand(acc2[i]);
      }
    }
    if constexpr (kFp8 && kOneParity) {
      for (int kb = 0; kb < k_blocks; ++kb) {
        load_stage<0>();
        fp8_trip<kN, 1>();
        fp8_drain<kN, 1>();
      }
    } else if constexpr (kFp8) {
      // The next trip's stage 0 is decoded before the drain: stage 0's chunks are done by then
      // (Active<kN>::kLag is at most the chunks of a stage).
      load_stage<0>();
      int kb = 0;
      for (; kb + 1 < k_blocks; kb += 2) {
        fp8_trip<kN, 2>();
        if (kb + 2 < k_blocks) load_stage<0>();  // decoded while the trip's last chunks run
        fp8_drain<kN, 2>();
      }
      if (kb < k_blocks) {  // an odd last stage, in parity 0
        fp8_trip<kN, 1>();
        fp8_drain<kN, 1>();
      }
    }
    if constexpr (kFp8) {
      if constexpr (kRowBase) {
#pragma unroll
        for (int i = 0; i < kSums; ++i) {
          acc[i] *= base[0][(i >> 1) & 1];
          if constexpr (kTwin) acc2[i] *= base[1][(i >> 1) & 1];
        }
      }
    } else {
      // Half-stage chunks: decode one half while the tensor core runs the other. Every wait is
      // unconditional so ptxas can see which fragment set is free.
      bf16_wait_stage();
      bf16_decode_half<0>();
      for (int kb = 0; kb < k_blocks; ++kb) {
        bf16_issue_half<kN, 0>();
        wg_wait<1>();  // the previous stage's second half is done
        if (kb > 0) release<1>();
        bf16_decode_half<1>();
        bf16_issue_half<kN, 1>();
        wg_wait<1>();  // this stage's first half is done: parity 0 is free
        if (kb + 1 < k_blocks) {
          bf16_wait_stage();
          bf16_decode_half<0>();
        }
      }
      wg_wait<0>();
      release<0>();
    }
    // The overhang's sums the unit does not fill are 0 from here, not held across the loop (the
    // SwiGLU hand-off passes them on with the rest).
#pragma unroll
    for (int i = kSums; i < L::kUnitTokens / 2; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < L::kUnitTokens / 2; ++i) {
      fence_operand(acc[i]);
      if constexpr (kTwin) fence_operand(acc2[i]);
    }
  }

  // A twin's second tile's sums become acc, for its epilogue (a short twin's: acc's first 64
  // tokens).
  __device__ __forceinline__ void take_second_tile() {
    if constexpr (kTwin) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = acc2[i];
    } else if constexpr (kShortTwin) {
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[i] = acc[32 + i];
    }
  }

  // A short twin unit (Layout::kShortTwin): both tiles of the unit on its block's first 64 tokens,
  // in the accumulators that a 64-token loop leaves idle — the first tile's sums in acc[0, 32),
  // the second's in acc[32, 64), its chunk results in acc[64, 96) — with both fragment sets (a[1]
  // the second tile's). Each stage's wgmmas of both tiles go in one group, as the twins' do, and
  // each tile's sums are the bits its own 64-token loop gives. acc past 64 is zeroed after the
  // loop, not held across it.
  __device__ __forceinline__ void mainloop_short_twin(int k_blocks) {
    static_assert(kShortTwin && kOneParity && kNsub == 64 && kTempSets == 1, "the 256-token FP8 tile's 64-token loop");
    float* const sums2 = acc + 32;
    float* const temp2 = acc + 64;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      acc[i] = 0.0f;
      fence_operand(acc[i]);
    }
    for (int kb = 0; kb < k_blocks; ++kb) {
      mbar_wait(full(stage), phase);
      if constexpr (L::kChunkedScales) mbar_wait(scales_ready(stage), phase);
      held[0] = stage;
      decode_tile<0, 0>(stage);
      decode_tile<1, 1>(stage);
      next_stage();
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        fence_operand(tmp[0][i]);
        fence_operand(temp2[i]);
      }
      wg_fence();
      const u64 desc = act_desc(held[0]);
#pragma unroll
      for (int j = 0; j < 4; ++j) mma_fp8_rs<64>(tmp[0], &a[0][4 * j], desc + 2 * j, j > 0);
#pragma unroll
      for (int j = 0; j < 4; ++j) mma_fp8_rs<64>(temp2, &a[1][4 * j], desc + 2 * j, j > 0);
      wg_commit();
      float2 sc[kScalePairs];
      if constexpr (kPrefetchScales) chunk_scales<64, 0, 0>(sc);
      wg_wait<0>();
      if constexpr (!kPrefetchScales) chunk_scales<64, 0, 0>(sc);
      promote_into<64, 0>(tmp[0], acc, sc, base[0]);
      promote_into<64, 0>(temp2, sums2, sc, base[1]);
      release<0>();
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      if constexpr (kRowBase) {
        acc[i] *= base[0][(i >> 1) & 1];
        sums2[i] *= base[1][(i >> 1) & 1];
      }
    }
#pragma unroll
    for (int i = 64; i < L::kUnitTokens / 2; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < L::kUnitTokens / 2; ++i) fence_operand(acc[i]);
  }
};

// ---------------------------------------------------------------- producer role
// Warpgroup 0. Warp 0 counts the launch's items (split tail only); then its thread 0 alone walks
// this CTA's units (TileWalker), hands each to the converter warp and the consumers as a UnitDesc
// and issues every stage's loads: the activation tile by TMA (in a cluster of two, one K half into
// both CTAs by multicast), the FP8 token scales and the weight tile by bulk copy. Its last stage
// completes without data and carries the end mark.
template <int BN, bool kFp8, int kCtas, int kCluster, bool kSplitTail, bool kPairs, bool kHandoff>
struct Producer {
  using L = Layout<BN, kFp8, kCtas, kHandoff>;

  // Warp 0 (lane: of the whole warp), before its thread 0 runs: every item of the launch, for the
  // split tail, into shared memory (the producer thread has no registers to keep it).
  __device__ __forceinline__ static void count_launch_items(const GemmParams& p, u8* smem, int lane) {
    const int items = kSplitTail && p.split_parts > 1 ? count_items<kCluster>(p, BN, lane) : 0;
    if (lane == 0) *(int*)(smem + L::kItemsAt) = items;
  }

  // Until the tiles of the layer before have stored rows row0 .. (their 16-row granule's count),
  // then the async proxy (the TMA) sees what they stored. The wait itself is a call of its own:
  // inlined, its clock cost the producer's few registers (ptxas spilled).
  __device__ __forceinline__ static void wait_row_arrivals(const GemmParams& p, int row0) {
    const u32* count = p.row_arrivals + row0 / 16;
    if (ld_acquire_gpu(count) < (u32)p.arrivals_needed) poll_row_arrivals(p, count, row0);
    fence_proxy_async_global();
  }
  // Gives up after kLocalWaitTimeoutNs into the error word — or at once when the word is set
  // already: a wait that gave up voids the launch (and the core's later ones: the word is never
  // reset), so the tiles after it do not each wait out a timeout of their own, which for a
  // launch of many tiles would be a hang in all but name.
  __device__ __noinline__ static void poll_row_arrivals(const GemmParams& p, const u32* count, int row0) {
    const unsigned long long start = barriers::ptx::globaltimer();
    while (ld_acquire_gpu(count) < (u32)p.arrivals_needed) {
      if (barriers::ptx::ld_relaxed_gpu(p.error) != 0) return;
      const unsigned long long waited = barriers::ptx::globaltimer() - start;
      if (waited > kLocalWaitTimeoutNs) {
        barriers::ptx::atom_cas_relaxed_gpu(
            p.error, 0, barriers::encode_local_timeout(barriers::kLocalWaitRowArrivals, (u32)row0, waited));
        return;
      }
    }
  }

  // One unit's stages through `map` (kBox: the tile's box, kShortBox: a short twin's, the 64-row
  // boxes of the short blocks' map, kOverhangBox: the tile's box and the overhang rows' box of the
  // map after the short one), each loading up to kMaxTiles weight blocks. The loop's shape is fixed
  // per kind of unit, so a whole unit's stage costs the producer thread what it costs without short
  // twins or overhangs: its work a stage is on the critical path (perf.md v92). `weights` is the
  // first tile's block at u.kb_begin; the sources are pointers that step a k-block a stage, as
  // 64-bit index arithmetic was a fifth of that work. (Not unrolled: the unrolled loop's
  // precomputed addresses spill its registers.)
  static constexpr int kBox = 0, kShortBox = 1, kOverhangBox = 2;
  template <int kBoxes, int kMaxTiles>
  __device__ __forceinline__ static void load_stages(const GemmParams& p, const void* map, u8* smem, u32 rank,
                                                     const WorkUnit& u, int row0, int loaded_tiles, bool prefetch,
                                                     const u8* weights, int& stage, u32& phase, u32& chunks) {
    static_assert(!L::kChunkedScales || kBoxes == kBox, "two-CTA tiles load the tile's box alone");
    u64* full = (u64*)(smem + L::kFullAt);
    u64* empty = (u64*)(smem + L::kEmptyAt);
    constexpr int kTokens = kBoxes == kOverhangBox ? L::kUnitTokens : BN;  // token scales a stage
    constexpr u32 kActTx = kBoxes == kShortBox ? L::kShortBoxBytes
                           : kBoxes == kOverhangBox ? L::kActBytes
                                                    : L::kTileBoxBytes;
    const u32 tx_bytes = kActTx + loaded_tiles * kWeightBlockBytes + (kFp8 && !L::kChunkedScales ? 4 * kTokens : 0);
    const size_t tile_stride = p.k / kBlockK * kWeightBlockBytes;
    const float* scales = kFp8 ? p.act_sf + (size_t)u.kb_begin * p.sf_stride + row0 : nullptr;
#pragma unroll 1
    for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
      u8* dst = smem + stage * L::kStageBytes;
      ring_wait(&empty[stage], phase ^ 1, smem + L::kRingErrorAt);
      if constexpr (L::kChunkedScales) {
        // The unit's next kScaleChunkBlocks k-blocks of scales ride on this stage's barrier, into
        // the buffer the converter warp gave back after its chunk two before.
        if ((kb - u.kb_begin) % L::kScaleChunkBlocks == 0) {
          const int buffer = chunks % L::kScaleChunks;
          ring_wait((u64*)(smem + L::kScaleEmptyAt) + buffer, (chunks / L::kScaleChunks & 1) ^ 1,
                    smem + L::kRingErrorAt);
          mbar_expect_tx(&full[stage], tx_bytes + L::kScaleChunkBytes);
          tma_load_2d(smem + L::kScaleChunksAt + buffer * L::kScaleChunkBytes, (const u8*)map + 3 * kTensorMapBytes,
                      &full[stage], row0, kb);
          ++chunks;
        } else {
          mbar_expect_tx(&full[stage], tx_bytes);
        }
      } else {
        mbar_expect_tx(&full[stage], tx_bytes);
      }
      if constexpr (kCluster == 2) {
        // The activation tile is the same for both CTAs: each loads one of its two K halves into both.
        tma_load_2d_multicast(dst + rank * BN * 128, map, &full[stage], kb * kBlockK + (int)rank * 64, row0, 0x3);
        if constexpr (kBoxes == kOverhangBox)
          tma_load_2d_multicast(dst + L::overhang_at(rank), (const u8*)map + 2 * kTensorMapBytes, &full[stage],
                                kb * kBlockK + (int)rank * 64, row0 + BN, 0x3);
      } else {
        tma_load_2d(dst, map, &full[stage], kb * kBlockK, row0);
        if constexpr (!kFp8) tma_load_2d(dst + BN * 128, map, &full[stage], kb * kBlockK + 64, row0);
        if constexpr (kBoxes == kOverhangBox) {
#pragma unroll
          for (int h = 0; h < L::kHalves; ++h)
            tma_load_2d(dst + L::overhang_at(h), (const u8*)map + 2 * kTensorMapBytes, &full[stage],
                        kb * kBlockK + 64 * h, row0 + BN);
        }
      }
      if constexpr (kFp8 && !L::kChunkedScales) {
        bulk_load(dst + L::kSfAt, scales, 4 * kTokens, &full[stage]);
        scales += p.sf_stride;
      }
#pragma unroll
      for (int tile = 0; tile < kMaxTiles; ++tile) {
        if (tile >= loaded_tiles) break;
        const u8* block = weights + tile * tile_stride;
        bulk_load(dst + L::block_at(tile), block, kWeightBlockBytes, &full[stage]);
        if (prefetch && kb + L::kWeightPrefetch < u.kb_end)
          bulk_prefetch_l2(block + L::kWeightPrefetch * kWeightBlockBytes, kWeightBlockBytes);
      }
      weights += kWeightBlockBytes;
      if (++stage == L::kStages) { stage = 0; phase ^= 1; }
    }
  }

  // The walker of run(): its items are pairs for twin units, and for short twins only the short
  // blocks' (with kPairs every item is a pair already).
  using Walker = TileWalker<kCluster, BN, kSplitTail, kPairs || L::kTwin, L::kShortTwin && !kPairs, L::kShortTwinRows,
                            L::kOverhang>;

  // Item `item`'s first `blocks` weight blocks of each of its tiles (tile `rank` of a cluster's
  // item) into L2. Without the split tail's item list: only for launches without one.
  __device__ __forceinline__ static void prefetch_item_weights(const GemmParams& p, int item, u32 rank, int blocks) {
    static_assert(!kSplitTail, "the walker's split items need the launch's item list");
    Walker walker(p, nullptr);
    WorkUnit u{};
    if (!walker.seek(item, rank, u)) return;
    const int n_tiles = p.n_out / kTileRows, k_blocks = p.k / kBlockK;
    const int last_tile = min(u.n_tile + (u.pair == kFirstOfPair ? 2 : 1), n_tiles);
    for (int tile = u.n_tile; tile < last_tile; ++tile)
      bulk_prefetch_l2(p.w_blocks + (size_t)(u.expert * n_tiles + tile) * k_blocks * kWeightBlockBytes,
                       (u32)min(blocks, k_blocks) * kWeightBlockBytes);
  }

  // Thread 0 of warpgroup 0; `rank` in the cluster.
  // act_map: the tile's activation map, then the short blocks' and the overhang rows' (ActMaps).
  __device__ __forceinline__ static void run(const GemmParams& p, const void* act_map, u8* smem, u32 rank) {
    const void* short_act_map = (const u8*)act_map + kTensorMapBytes;
    u64* full = (u64*)(smem + L::kFullAt);
    u64* empty = (u64*)(smem + L::kEmptyAt);
    UnitDesc* units = (UnitDesc*)(smem + L::kUnitsAt);
    prefetch_tensormap(act_map);
    if constexpr (L::kShortTwin) prefetch_tensormap(short_act_map);
    if constexpr (L::kOverhang > 0) prefetch_tensormap((const u8*)act_map + 2 * kTensorMapBytes);
    if constexpr (L::kChunkedScales) {
      prefetch_tensormap((const u8*)act_map + 3 * kTensorMapBytes);
      // The scale chunks' empty barriers, set up here rather than in setup (there, ptxas serialized
      // the wgmmas of the two-CTA FP8 32-token split kernel, C7511): the converter warp first
      // arrives on one after it has waited for a stage this thread's arrive completes, which orders
      // the set-up before it.
      for (int c = 0; c < L::kScaleChunks; ++c) mbar_init((u64*)(smem + L::kScaleEmptyAt) + c, 32);
    }
    // A twin unit is a pair of tiles: the walker's items are pairs, their two units one. Short
    // twins: with kPairs a pair whose block is short is one unit, the others two; without, the
    // walker pairs the short blocks' tiles only.
    Walker walker(p, (const int*)(smem + L::kItemsAt), (ClusterMail*)(smem + L::kMailAt), smem + L::kRingErrorAt);
    int stage = 0, slot = 0;
    u32 phase = 0, seq = 0;  // seq: descriptors handed out
    u32 chunks = 0;          // scale chunks loaded (Layout::kChunkedScales)
    WorkUnit u{};
    while (walker.unit(rank, u)) {
      const int n_tiles = p.n_out / kTileRows;
      const int overhang = L::kOverhang > 0 ? p.overhang : 0, expert_rows = p.expert_rows[u.expert];
      const ExpertBlocks<BN> blocks(expert_rows, overhang);
      const int rows = blocks.rows_of(u.m_block, expert_rows, overhang);
      const int tiles =
          L::kTwin || (L::kShortTwin && u.pair == kFirstOfPair && rows <= L::kShortTwinRows) ? 2 : 1;
      // A pair's ghost tile (past n_out) alone is no work; with twins it rides along unloaded.
      if (L::kShortTwin && tiles == 1 && u.n_tile >= n_tiles) continue;
      const int row0 = p.expert_offset[u.expert] + blocks.start(u.m_block, overhang);
      if (p.row_arrivals) wait_row_arrivals(p, row0);
      const int first_tile = u.n_tile;
      const bool prefetch = L::kWeightPrefetch > 0 && rows <= BN - 64;
      // The unit's descriptors (a twin's two) go out before the arrive that completes its first stage.
      ring_wait(&empty[stage], phase ^ 1, smem + L::kRingErrorAt);
      for (int tile = 0; tile < tiles; ++tile) {
        if (tile > 0) walker.unit(rank, u);  // the pair's second tile: always there
        units[slot] = UnitDesc{row0, rows, u.n_tile * kTileRows,
                               (u32)u.kb_begin | (u32)u.kb_end << 16, u.slot, u.pair, u.expert,
                               p.timeline ? (u32)timeline::now() : 0u, p.timeline ? sm_cycles() : 0u, seq++,
                               tiles};
        if (++slot == L::kUnitSlots) slot = 0;
      }
      // Tiles past n_out (a cluster's ghost, a twin's odd last) have no weights to load.
      const int loaded_tiles = max(0, min(tiles, n_tiles - first_tile));
      const u8* weights =
          p.w_blocks + ((size_t)(u.expert * n_tiles + first_tile) * (p.k / kBlockK) + u.kb_begin) * kWeightBlockBytes;
      // A short twin's stages load its rows' box of the short map; an overhang unit's the tile's box
      // and its extra rows'; the others the tile's.
      if constexpr (L::kShortTwin) {
        if (tiles == 2) {
          load_stages<kShortBox, 2>(p, short_act_map, smem, rank, u, row0, loaded_tiles, prefetch, weights, stage,
                                    phase, chunks);
          continue;
        }
      }
      if constexpr (L::kOverhang > 0) {
        if (rows > BN) {
          load_stages<kOverhangBox, L::kTiles>(p, act_map, smem, rank, u, row0, loaded_tiles, prefetch, weights, stage,
                                               phase, chunks);
          continue;
        }
      }
      load_stages<kBox, L::kTiles>(p, act_map, smem, rank, u, row0, loaded_tiles, prefetch, weights, stage, phase,
                                   chunks);
    }
    // The end of this CTA's work: a stage that completes without data, with an end mark.
    ring_wait(&empty[stage], phase ^ 1, smem + L::kRingErrorAt);
    units[slot].kb_range = 0;
    units[slot].seq = seq;
    units[slot].tiles = 1;
    mbar_arrive(&full[stage]);
  }
};

// ---------------------------------------------------------------- converter role (FP8 two-CTA tiles)
// Warp 1 of warpgroup 0: each stage's token scales from the unit's chunk (the pool's floats, in
// pool_order::scale_column order) into the stage in column order, once for both consumer
// warpgroups, so the promotion reads two factors per LDS.64 (Consumer::chunk_scales). It follows
// the units the producer hands out to the end mark.
template <int BN, int kCtas, bool kHandoff>
struct ScaleConverter {
  using L = Layout<BN, true, kCtas, kHandoff>;
  static_assert(L::kChunkedScales, "one-CTA tiles load their floats in the consumers' order");

  __device__ __forceinline__ static void run(u8* smem, int lane) {
    u64* full = (u64*)(smem + L::kFullAt);
    u64* scales_ready = (u64*)(smem + L::kScalesReadyAt);
    const UnitDesc* units = (const UnitDesc*)(smem + L::kUnitsAt);
    int stage = 0, slot = 0;
    u32 phase = 0;
    int buffer = 0;  // the scale chunk buffer the next chunk lies in
    for (;; slot = L::slot_after(slot, L::kUnitTiles)) {
      ring_wait(&full[stage], phase, smem + L::kRingErrorAt);  // the unit's first stage, or the end mark
      const u32 range = units[slot].kb_range;
      if (range == 0) break;
      const int kb_end = (int)(range >> 16);
      int at = 0;  // the stage's k-block in its scale chunk
      for (int kb = range & 0xffff; kb < kb_end; ++kb) {
        float* dst = (float*)(smem + stage * L::kStageBytes + L::kSfAt);
        ring_wait(&full[stage], phase, smem + L::kRingErrorAt);
        const float* chunk = (const float*)(smem + L::kScaleChunksAt + buffer * L::kScaleChunkBytes) + at * BN;
        for (int i = lane; i < BN; i += 32) dst[i] = chunk[pool_order::scale_column(i)];
        mbar_arrive(&scales_ready[stage]);  // release: the floats are visible to whoever waits
        // The chunk's last stage gives its buffer back to the producer (each lane after its reads).
        if (++at == L::kScaleChunkBlocks || kb + 1 == kb_end) {
          mbar_arrive((u64*)(smem + L::kScaleEmptyAt) + buffer);
          buffer ^= 1;
          at = 0;
        }
        if (++stage == L::kStages) { stage = 0; phase ^= 1; }
      }
    }
  }
};

// ---------------------------------------------------------------- consumer role
// The epilogue: what the consumers do with a finished tile (c.acc: this warpgroup's 64 weight rows
// x BN tokens of FP32 sums, complete, the split tail's parts added), an object the kernel hands to
// the roles (it may hold references to the kernel's parameters). `tile` runs once per tile a CTA
// stores, `finish` once after its last. Bf16Out is the grouped GEMM's: BF16 out[pool row][weight
// row], only the expert's rows (FP8 one-CTA tiles through the shared-memory box and the TMA,
// Consumer::store_tile; otherwise the fragments directly). sm90_swiglu.cuh's SwigluOut is the L1's.
struct Bf16Out {
  template <class C>
  __device__ __forceinline__ void tile(C& c, const GemmParams& p, const void* out_map, const UnitDesc& d) const {
    const int rows_left = d.rows;
    const size_t row0 = (size_t)d.row0;
    if constexpr (C::L::kBoxEpilogue) {
      const int col0 = d.n_col + (c.thread / 128) * 64;
      c.store_tile(out_map, p.out + row0 * p.n_out + col0, p.n_out, rows_left, col0, d.row0);
    } else {
      const int n0 = d.n_col + c.row_r;
#pragma unroll
      for (int i = 0; i < C::L::kUnitTokens / 2; ++i) {
        const int col = 8 * (i >> 2) + 2 * c.t + (i & 1);
        const int n = n0 + 8 * ((i >> 1) & 1);
        if (col < rows_left) {
          unsigned short b;
          asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(c.acc[i]));
          p.out[(row0 + col) * p.n_out + n] = b;
        }
      }
    }
  }
  static constexpr bool kHandoff = false;
  // The last box is stored before the CTA's shared memory goes away.
  template <class C>
  __device__ __forceinline__ void finish(C&, const UnitDesc&) const {
    if constexpr (C::L::kBoxEpilogue) bulk_wait<0>();
  }
  template <class L>
  __device__ __forceinline__ void run(u8*) const {}
};

// One unit of a consumer warpgroup (its range, broadcast, is not the end mark): the split tail's
// wait for a head's later parts, the main loop built for the unit's rows, the hand-over of a later
// part or the sum of a head's, and the epilogue.
template <bool kNarrowTiles, bool kSplitTail, class Epilogue, class C>
__device__ __forceinline__ void consume_unit(C& c, const GemmParams& p, const void* out_map, const Epilogue& epi,
                                             const UnitDesc* unit, u32 range) {
  constexpr int BN = C::kBN;
  // Broadcast, so that ptxas sees warp-uniform values (the loop bounds stay uniform registers).
  const int rows = __shfl_sync(0xffffffffu, unit->rows, 0);
  const int blocks = (int)(range >> 16) - (int)(range & 0xffff);
  if (kSplitTail && (range & 0xffff) == 0 && (int)(range >> 16) < p.k / kBlockK) {  // a split tile's head
    const int first = __shfl_sync(0xffffffffu, unit->slot, 0), parts = min(p.split_parts, p.k / kBlockK);
    for (int q = 0; q < parts - 1; ++q) c.wait_partial(p.partial_ready, p.error, first + q);
  }
  // One-CTA tiles of 96 tokens and more: a tile whose rows end early runs on its rows rounded up
  // to a main loop built for fewer tokens — 64 of 96 or 128; 64, 128 and (FP8) 192 of 256 (BF16
  // has no n192 wgmma here). The token tile is sized to cover most experts in one block, so at
  // mid T (96-token tiles, ≈ 64 rows per expert) about half the tiles hold ≤ 64 rows, and at large
  // T most experts' last block holds a few rows past a multiple of 256. FP8 loops of whole chunks
  // only: a chunk narrower than the others (64 of a 96-token chunk, 32 after a 64) makes ptxas
  // serialize the wgmmas (C7511) or spill, so the 96-token FP8 tile runs 32-token chunks.
  // (The producer's weight prefetch, Layout::kWeightPrefetch, keys on the same rule: rows ≤ BN − 64.)
  constexpr bool kFp8 = C::kFp8Route;
  constexpr bool kShortTail = BN >= 96 && C::kCtasPerSm == 1;
  constexpr int kTail1 = kShortTail ? 64 : BN;
  constexpr int kTail2 = kShortTail && BN == 256 ? 128 : BN;
  constexpr int kTail3 = kShortTail && BN == 256 && kFp8 ? 192 : BN;
  if (C::kShortTwin && __shfl_sync(0xffffffffu, unit->tiles, 0) == 2) {
    if constexpr (C::kShortTwin) c.mainloop_short_twin(blocks);
  } else if (kTail1 < BN && rows <= kTail1) {
    c.template mainloop<kTail1>(blocks);
  } else if (kTail2 < BN && rows <= kTail2) {
    c.template mainloop<kTail2>(blocks);
  } else if (kTail3 < BN && rows <= kTail3) {
    c.template mainloop<kTail3>(blocks);
  } else if (kNarrowTiles && rows <= BN / 2) {
    c.template mainloop<kNarrowTiles ? BN / 2 : BN>(blocks);
  } else if (kNarrowTiles && kFp8 && BN == 32 && rows <= 24) {
    c.template mainloop<kNarrowTiles && kFp8 && BN == 32 ? 24 : BN>(blocks);
  } else if (C::L::kOverhang > 0 && rows > BN) {  // an overhang unit: a fifth chunk on its last rows
    c.template mainloop<C::L::kUnitTokens>(blocks);
  } else {
    c.template mainloop<BN>(blocks);
  }
  const UnitDesc d = *unit;  // read again: no registers held across the main loop
  // A ghost tile (past n_out: the odd last tile of a cluster's group or a twin unit) ran the math
  // on whatever its stages held (its weights are not loaded) and writes nothing: a separate
  // path would cost the main loop its uniform descriptor arithmetic. (A hand-off epilogue takes
  // every unit in turn and leaves the ghost's out itself.)
  if (!Epilogue::kHandoff && C::kClusterCtas > 1 && d.n_col >= p.n_out) return;
  if constexpr (kSplitTail) {
    if ((d.kb_range & 0xffff) > 0) {  // a later part of a split tile: its head adds it
      c.store_partial(p.partials, p.partial_ready, d.slot);
      return;
    }
    if ((int)(d.kb_range >> 16) < p.k / kBlockK) {  // a head: + the later parts' sums, in order
      const int parts = min(p.split_parts, p.k / kBlockK);
      for (int q = 0; q < parts - 1; ++q) c.add_partial(p.partials, d.slot + q);
    }
  }
  // Each tile of the unit (a twin's second: its descriptor is the next slot's) through one call
  // of the epilogue, whose code is long: inlined once per tile, it made the fused kernel's tiles
  // slower (perf.md v91). A twin's second tile past n_out (a ghost) stores nothing.
  const int tiles = C::kTwin ? 2 : C::kShortTwin ? __shfl_sync(0xffffffffu, unit->tiles, 0) : 1;
#pragma unroll 1
  for (int tile = 0;; ++tile) {
    const UnitDesc dt = tile == 0 ? d : *C::L::second_desc(unit, c.smem);
    if (tile == 0 || Epilogue::kHandoff || dt.n_col < p.n_out) epi.tile(c, p, out_map, dt);
    if (tile + 1 >= tiles) break;
    c.take_second_tile();
  }
}

// Warpgroups 1 and 2 (thread 128 on), after setmaxnreg: every unit the producer hands out, until
// the end mark, which goes to the epilogue's `finish`; `rank` in the cluster.
template <int BN, bool kFp8, int kCtas, bool kRowBase, bool kRegs, int kCluster, bool kNarrowTiles, bool kSplitTail,
          bool kHandoff, class Epilogue>
__device__ __forceinline__ void consumer_role(const GemmParams& p, const void* out_map, const Epilogue& epi, u8* smem,
                                              u32 rank) {
  using L = Layout<BN, kFp8, kCtas, kHandoff>;
  const UnitDesc* units = (const UnitDesc*)(smem + L::kUnitsAt);
  Consumer<BN, kFp8, kCtas, kRowBase, kRegs, kCluster, kHandoff> c;
  c.smem = smem;
  c.act_desc0 = desc_k_sw128(smem_addr(smem));
  c.thread = threadIdx.x - 128;  // warpgroup wg - 1 takes weight rows 64 (wg - 1) ..
  c.lane = threadIdx.x % 32;
  c.t = c.lane % 4;
  c.row_r = (c.thread / 32) * 16 + c.lane / 4;  // this thread's rows: row_r and row_r + 8
  if constexpr (kCluster == 2) c.peer = rank ^ 1;
  for (int slot = 0;; slot = L::slot_after(slot, L::kShortTwin ? units[slot].tiles : L::kUnitTiles)) {
    mbar_wait(c.full(c.stage), c.phase);  // the unit's first stage, or the end mark
    const UnitDesc* unit = units + slot;
    const u32 range = __shfl_sync(0xffffffffu, unit->kb_range, 0);
    if (range == 0) {
      epi.finish(c, *unit);
      break;
    }
    consume_unit<kNarrowTiles, kSplitTail>(c, p, out_map, epi, unit, range);
    // Each tile of the unit as one event, from its hand-out to now (nothing held across the main
    // loop for it).
    if (p.timeline && c.thread == 0) {
      timeline::tile_done(p.timeline, *unit, smid());
      if (L::kTwin || (L::kShortTwin && unit->tiles == 2))
        timeline::tile_done(p.timeline, *L::second_desc(unit, smem), smid());
    }
  }
}

// ---------------------------------------------------------------- the kernel
// One specialization of the grouped GEMM as a whole, in the pieces a kernel composes: `setup`
// (barriers, decode tables, the cluster's meeting), `roles` (the registers split between the
// warpgroups, then one role per warpgroup: 0 the producer thread, (FP8 two-CTA tiles) the
// converter warp and the epilogue warps, 1 and 2 the consumers) and `rejoin` (every warpgroup back at the launch's share of registers, for
// a kernel that goes on to other work; the barriers are free to set up again once every thread of
// the CTA, and of its cluster, has left `roles`). moe_gemm is setup + roles; the fused kernel
// (sm90_mega_moe.cuh) runs setup + roles + rejoin once per layer.
// kPairs: each item is a pair of neighbouring weight tiles, both this CTA's (TileWalker), for an
// epilogue whose output groups span two tiles (the L1's SwiGLU at G = 128).
// kHandoff: the epilogue's own warps (Layout::kEpilogueWarps of the producer warpgroup) do its
// work: the consumers hand each finished unit over in shared memory (the epilogue's `tile`: wait
// for the hand-off region to be empty, fill it, arrive on its full barrier) and go on to their
// next unit's main loop, so the tensor core does not wait for the epilogue; `run` on the epilogue
// warps takes the units in order (their descriptors from the producer's ring), until the end mark
// that `finish` hands over.
template <int BN, bool kFp8, int kCtas, bool kRowBase, bool kRegs, int kCluster, bool kNarrowTiles, bool kSplitTail,
          bool kPairs, bool kHandoff>
struct Gemm {
  using L = Layout<BN, kFp8, kCtas, kHandoff>;
  // The split tail (`kSplitTail`) serves the small tiles (two CTAs per SM), a few of which make a
  // CTA's work; the large tiles' launches make dozens of rounds, and their consumers have no
  // registers for it. Narrow tiles (`kNarrowTiles`): a two-CTA (small-T) tile whose rows fit in
  // fewer tokens runs a main loop built for them (8 of 16; 16 of 32, and on the FP8 route 24 of 32
  // — a BF16 n24 wgmma made ptxas serialize every wgmma of the kernel, C7512): less wgmma and
  // promotion work where most experts hold a few tokens. Either one's code costs registers, so
  // each is compiled in only where the plan asks for it (ptxas serializes the FP8 two-CTA wgmmas,
  // C7511, when they do not fit).
  static_assert(!kSplitTail || (kCtas == 2 && kCluster == 1), "the split tail is for two-CTA tiles without clusters");
  static_assert(!kNarrowTiles || kCtas == 2, "narrow tiles are two-CTA tiles");
  static_assert(!kPairs || (kCluster == 1 && !kSplitTail), "a pair is one CTA's, drawn whole");
  static constexpr int kCtasPerSm = kCtas;
  static constexpr int kClusterCtas = kCluster;
  static constexpr bool kFp8Route = kFp8;
  static constexpr int kStages = L::kStages;
  static constexpr int kSmemBytes = L::kSmemBytes;
  // Registers per thread at launch: the launch bound's share (Layout's static_assert).
  static constexpr u32 kLaunchRegs = 65536 / (kThreads * kCtas) / 8 * 8;

  // Every thread of the CTA, `smem` aligned to 1024 bytes.
  __device__ __forceinline__ static void setup(const GemmParams& p, u8* smem) {
    u64* full = (u64*)(smem + L::kFullAt);
    u64* empty = (u64*)(smem + L::kEmptyAt);
    u64* scales_ready = (u64*)(smem + L::kScalesReadyAt);
    // Decode tables, built once per CTA: one shared-memory load per row and stage instead of a
    // computation on the consumers' critical path.
    fp::E4m3Table* fold_table = (fp::E4m3Table*)(smem + L::kTablesAt);
    if (threadIdx.x == 0) {
      for (int s = 0; s < L::kStages; ++s) {
        mbar_init(&full[s], 1);
        mbar_init(&scales_ready[s], 32);  // every lane of the converter warp
        mbar_init(&empty[s], 8 * kCluster);  // every consumer warp of the cluster
      }
      if constexpr (kHandoff) {
        for (int b = 0; b < L::kHandoffBoxes; ++b) {
          mbar_init((u64*)(smem + L::kHandoffFullAt) + b, 256);
          mbar_init((u64*)(smem + L::kHandoffEmptyAt) + b, L::kEpilogueThreads);
        }
      }
      if constexpr (kCluster > 1) {
        ClusterMail* mail = (ClusterMail*)(smem + L::kMailAt);
        for (int w = 0; w < 2; ++w) {
          mbar_init(&mail->full[w], 1);   // this CTA's expect_tx (rank 1)
          mbar_init(&mail->empty[w], 1);  // the peer's arrive (rank 0)
        }
      }
      fence_barrier_init();
    }
    if constexpr (kFp8 && !kRegs) {
      if (threadIdx.x < 15) fold_table[threadIdx.x] = fp::e4m3_table((int)threadIdx.x - 8);  // d in [-8, 6]
    }
    // The ring's waits report to p.error (stored apart from the barriers' set-up above: there,
    // ptxas serialized the wgmmas of the two-CTA FP8 32-token kernels, C7511).
    if (threadIdx.x == 0) *(unsigned long long**)(smem + L::kRingErrorAt) = p.error;
    // A cluster's CTAs arrive on each other's barriers and multicast into each other's stages: all
    // barriers are initialized before anyone starts, and nobody leaves while a peer may still do so.
    if constexpr (kCluster > 1) {
      cluster_sync();
    } else {
      __syncthreads();
    }
  }

  // One thread of each CTA of a fused forward, before the layer, while the glue before it runs
  // (route and dispatch: at small T a few microseconds of latency with the HBM idle): the first
  // weights of the item this CTA's cluster rank would take first (the first draws take the first
  // items, and which CTA takes which is no matter: L2 is the chip's) into L2,
  // kFirstWeightsPrefetchBytes over the grid at most, so that the layer starts on weights already
  // on the chip and its stream runs at the HBM's rate from there.
  __device__ __forceinline__ static void prefetch_first_weights(const GemmParams& p) {
    using Role = Producer<BN, kFp8, kCtas, kCluster, kSplitTail, kPairs, kHandoff>;
    constexpr int kItemTiles = kPairs || L::kUnitTiles == 2 ? 2 : 1;
    const int blocks = (int)(kFirstWeightsPrefetchBytes / gridDim.x / (kItemTiles * kWeightBlockBytes));
    if (blocks > 0) Role::prefetch_item_weights(p, (int)blockIdx.x / kCluster, blockIdx.x % kCluster, blocks);
  }

  // Every thread of the CTA, after setup: this CTA's part of the launch's tiles, each finished tile
  // handed to `epi`.
  template <class Epilogue>
  __device__ __forceinline__ static void roles(const GemmParams& p, const void* act_map, const void* out_map,
                                               const Epilogue& epi, u8* smem) {
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
    // (K / 128 and the tile count are read from the parameters where used: kept in registers from
    // here, ptxas spilled them in the producer.)
    // The rank in a cluster of kCluster along x (blockIdx.x % kCluster: visibly warp-uniform to the
    // compiler, unlike %cluster_ctarank, so the consumers keep their uniform descriptor arithmetic).
    static_assert(Epilogue::kHandoff == kHandoff, "the epilogue's hand-off is the layout's");
    const u32 rank = blockIdx.x % kCluster;
    if (wg == 0) {
      using Role = Producer<BN, kFp8, kCtas, kCluster, kSplitTail, kPairs, kHandoff>;
      setmaxnreg_dec<L::kProducerRegs>();
      if (threadIdx.x < 32) Role::count_launch_items(p, smem, threadIdx.x);
      constexpr int kFirstEpilogueThread = 128 - L::kEpilogueThreads;
      if (threadIdx.x == 0) {
        Role::run(p, act_map, smem, rank);
      } else if (kHandoff && threadIdx.x >= kFirstEpilogueThread) {
        epi.template run<L>(smem);
      } else if constexpr (L::kChunkedScales) {
        if (threadIdx.x / 32 == 1) ScaleConverter<BN, kCtas, kHandoff>::run(smem, threadIdx.x % 32);
      }
    } else {
      setmaxnreg_inc<L::kConsumerRegs>();
      consumer_role<BN, kFp8, kCtas, kRowBase, kRegs, kCluster, kNarrowTiles, kSplitTail, kHandoff>(p, out_map, epi,
                                                                                                   smem, rank);
    }
    if constexpr (kCluster > 1) cluster_sync();
  }

  // Every thread of the CTA, after roles: back at kLaunchRegs, every barrier of the ring
  // invalidated. One branch for both directions: ptxas then knows every warpgroup leaves at
  // kLaunchRegs (after two separate tests it held the code that follows to the producer's count,
  // and the fused kernel's glue after the GEMMs spilled at 56 registers); the producer warpgroup
  // increases once every consumer warp has decreased, all of them meeting at named barrier 4 in
  // between — from the two branches, so in the barrier's unaligned form (an increase that did not
  // wait for them stopped the two-CTA BF16 fused kernel, perf.md v85; consumers that only arrived
  // there, bar.arrive, made racecheck lose the CTA's barrier count, perf.md v86). The meeting
  // before the invalidation is every warp's: setmaxnreg.inc returns once registers for its own
  // warp are free, so thread 0 may pass it while consumer warps still wait on the ring's barriers.
  __device__ __forceinline__ static void rejoin(u8* smem) {
    if (threadIdx.x < 128) {
      named_bar_sync_unaligned<4, kThreads>();
      setmaxnreg_inc<kLaunchRegs>();
    } else {
      setmaxnreg_dec<kLaunchRegs>();
      named_bar_sync_unaligned<4, kThreads>();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int b = 0; b < L::kBarriers; ++b) mbar_inval((u64*)(smem + L::kFullAt) + b);
      if constexpr (kHandoff) {
        for (int b = 0; b < 2 * L::kHandoffBoxes; ++b) mbar_inval((u64*)(smem + L::kHandoffFullAt) + b);
      }
      if constexpr (kCluster > 1) {
        ClusterMail* mail = (ClusterMail*)(smem + L::kMailAt);
        for (int w = 0; w < 2; ++w) {
          mbar_inval(&mail->full[w]);
          mbar_inval(&mail->empty[w]);
        }
      }
    }
    __syncthreads();
  }
};

// The grouped GEMM's kernel body. Launched programmatically in a pipeline, the launch overlapped the
// previous stage; nothing below may touch what that stage writes before it is complete. The next
// stage launches as the CTAs exit: an explicit launch_dependents here (or a wait after the
// barriers' set-up) made ptxas serialize the two-CTA FP8 wgmmas (C7511).
template <class G, class Epilogue>
__device__ __forceinline__ void moe_gemm(const GemmParams& p, const void* act_map, const void* out_map,
                                         const Epilogue& epi) {
  cuda_rt::wait_for_predecessor();
  extern __shared__ __align__(1024) u8 smem_raw[];
  u8* smem = align_smem(smem_raw);
  G::setup(p, smem);
  G::roles(p, act_map, out_map, epi, smem);
}

}  // namespace gemm
}  // namespace mm
