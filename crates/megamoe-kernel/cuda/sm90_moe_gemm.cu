// sm90_moe_gemm.cu -- JIT entry point of the Hopper grouped GEMM: instantiates mm::gemm::moe_gemm
// (sm90_moe_gemm.cuh) from the specialization's defines: -DMM_BN=<tokens per tile> -DMM_FP8=<0|1>
// (the FP8 route, else BF16) -DMM_CTAS=<CTAs per SM, 1|2> -DMM_ROW_BASE=<0|1> (FP8: one fold base
// per weight row) -DMM_FOLD_REGS=<0|1> (FP8: decode tables in registers) -DMM_CLUSTER=<1|2> (BF16:
// CTAs per cluster sharing activation loads by multicast) -DMM_NARROW=<0|1> (narrow tiles)
// -DMM_SPLIT=<0|1> (split tail) -DMM_PAIRS=<0|1> (items of two weight tiles), the epilogue's
// -DMM_SWIGLU_G=<0|32|128> (0: BF16 out; else the L1's SwiGLU into an L2 pool of activation group
// G, sm90_swiglu.cuh, on the epilogue warps the consumers hand their tiles to) and -DMM_SWIGLU_FP8_POOL=<0|1> (that pool's format), and -DMM_STAGES /
// -DMM_SMEM_BYTES, the host's shared-memory plan.
#include "sm90_swiglu.cuh"

using mm::gemm::ActMaps;
using mm::gemm::TmaDescriptor;

using Core = mm::gemm::Gemm<MM_BN, MM_FP8 != 0, MM_CTAS, MM_ROW_BASE != 0, MM_FOLD_REGS != 0, MM_CLUSTER,
                            MM_NARROW != 0, MM_SPLIT != 0, MM_PAIRS != 0, MM_SWIGLU_G != 0>;

#if MM_SWIGLU_G
using Epilogue = mm::swiglu::SwigluOut<MM_SWIGLU_G, MM_SWIGLU_FP8_POOL != 0>;
static_assert(Epilogue::kPairs == (MM_PAIRS != 0), "G = 128 groups span a pair of tiles");

extern "C" __global__ void __launch_bounds__(mm::gemm::kThreads, MM_CTAS)
    mm_moe_gemm(const __grid_constant__ mm::gemm::GemmParams params, const __grid_constant__ ActMaps act_maps,
                const __grid_constant__ TmaDescriptor out_map, const __grid_constant__ mm::swiglu::SwigluParams swiglu) {
  mm::gemm::moe_gemm<Core>(params, &act_maps.tile, &out_map, Epilogue{swiglu});
}
#else
extern "C" __global__ void __launch_bounds__(mm::gemm::kThreads, MM_CTAS)
    mm_moe_gemm(const __grid_constant__ mm::gemm::GemmParams params, const __grid_constant__ ActMaps act_maps,
                const __grid_constant__ TmaDescriptor out_map) {
  mm::gemm::moe_gemm<Core>(params, &act_maps.tile, &out_map, mm::gemm::Bf16Out{});
}
#endif

// The host computes the same shared-memory plan (megamoe-kernel/src/gemm.rs, `TilePlan`).
static_assert(Core::kStages == MM_STAGES, "host and device disagree on stages");
static_assert(Core::kSmemBytes == MM_SMEM_BYTES, "host and device disagree on smem");
