// sm90_moe_gemm.cu -- JIT entry point of the Hopper grouped GEMM: instantiates mm::gemm::moe_gemm
// (sm90_moe_gemm.cuh) from the specialization's defines: -DMM_BN=<tokens per tile> -DMM_FP8=<0|1>
// (the FP8 route, else BF16) -DMM_CTAS=<CTAs per SM, 1|2> -DMM_ROW_BASE=<0|1> (FP8: one fold base
// per weight row) -DMM_FOLD_REGS=<0|1> (FP8: decode tables in registers) -DMM_CLUSTER=<1|2> (BF16:
// CTAs per cluster sharing activation loads by multicast) -DMM_NARROW=<0|1> (narrow tiles)
// -DMM_SPLIT=<0|1> (split tail), and -DMM_STAGES / -DMM_SMEM_BYTES, the host's shared-memory plan.
#include "sm90_moe_gemm.cuh"

struct __align__(64) TmaDescriptor {
  unsigned long long opaque[16];
};

extern "C" __global__ void __launch_bounds__(mm::gemm::kThreads, MM_CTAS)
    mm_moe_gemm(const __grid_constant__ mm::gemm::GemmParams params, const __grid_constant__ TmaDescriptor act_map,
                const __grid_constant__ TmaDescriptor out_map) {
  mm::gemm::moe_gemm<mm::gemm::Gemm<MM_BN, MM_FP8 != 0, MM_CTAS, MM_ROW_BASE != 0, MM_FOLD_REGS != 0, MM_CLUSTER,
                                    MM_NARROW != 0, MM_SPLIT != 0>>(params, &act_map, &out_map);
}

// The host computes the same shared-memory plan (megamoe-kernel/src/gemm.rs, `TilePlan`).
static_assert(mm::gemm::Layout<MM_BN, MM_FP8 != 0, MM_CTAS>::kStages == MM_STAGES, "host and device disagree on stages");
static_assert(mm::gemm::Layout<MM_BN, MM_FP8 != 0, MM_CTAS>::kSmemBytes == MM_SMEM_BYTES, "host and device disagree on smem");
