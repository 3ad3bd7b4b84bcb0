// sm90_mega_moe.cu -- JIT entry point of the fused MoE forward (sm90_mega_moe.cuh): instantiates
// mm::mega::mega_moe from the specialization's defines: each layer's grouped GEMM as the GEMM's own
// entry point takes it, with the prefix MM_L1_ or MM_L2_ (BN, FP8, CTAS, ROW_BASE, FOLD_REGS,
// CLUSTER, NARROW, SPLIT, PAIRS, STAGES; the L1 hands its tiles to the SwiGLU epilogue's warps), -DMM_G=<32|128> (the recipe's activation group) and
// -DMM_SMEM_BYTES (the larger layer's shared memory, the host's plan).
#include "sm90_mega_moe.cuh"

using mm::gemm::ActMaps;
using mm::gemm::TmaDescriptor;

using L1Gemm = mm::gemm::Gemm<MM_L1_BN, MM_L1_FP8 != 0, MM_L1_CTAS, MM_L1_ROW_BASE != 0, MM_L1_FOLD_REGS != 0,
                              MM_L1_CLUSTER, MM_L1_NARROW != 0, MM_L1_SPLIT != 0, MM_L1_PAIRS != 0, true>;
using L2Gemm = mm::gemm::Gemm<MM_L2_BN, MM_L2_FP8 != 0, MM_L2_CTAS, MM_L2_ROW_BASE != 0, MM_L2_FOLD_REGS != 0,
                              MM_L2_CLUSTER, MM_L2_NARROW != 0, MM_L2_SPLIT != 0, MM_L2_PAIRS != 0, false>;

extern "C" __global__ void __launch_bounds__(mm::mega::kThreads, MM_L1_CTAS)
    mm_mega_moe(const __grid_constant__ mm::mega::MegaParams params, const __grid_constant__ ActMaps l1_act_maps,
                const __grid_constant__ ActMaps l2_act_maps, const __grid_constant__ TmaDescriptor l2_out_map) {
  mm::mega::mega_moe<L1Gemm, L2Gemm, MM_G>(params, &l1_act_maps.tile, &l2_act_maps.tile, &l2_out_map);
}

static_assert(mm::swiglu::SwigluOut<MM_G, MM_L2_FP8 != 0>::kPairs == (MM_L1_PAIRS != 0),
              "the L1's G = 128 groups span a pair of tiles");
// The host computes the same shared-memory plan (megamoe-kernel/src/gemm.rs, `TilePlan`; fused.rs).
static_assert(L1Gemm::kStages == MM_L1_STAGES && L2Gemm::kStages == MM_L2_STAGES, "host and device disagree on stages");
static_assert((L1Gemm::kSmemBytes > L2Gemm::kSmemBytes ? L1Gemm::kSmemBytes : L2Gemm::kSmemBytes) == MM_SMEM_BYTES,
              "host and device disagree on shared memory");
