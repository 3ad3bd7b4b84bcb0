// sm90_unfused.cu -- JIT entry points of the unfused pipeline's glue kernels: each instantiates its
// device function of sm90_unfused.cuh from the specialization's defines, -DUF_G=<32|128> (the
// recipe's activation group) and -DUF_L1_FP8_POOL=<0|1> (the L1 GEMM's tensor-core route: the
// format of the pool the dispatch writes), and hands it its item and work split from the grid the host launches
// (unfused.rs, glue_grid): an item per CTA along x, its channels over the CTAs along y. Launched
// with mm::unfused::kThreads threads per CTA (uf_route: kRouteThreads).
#include "cuda_rt.cuh"
#include "sm90_unfused.cuh"

// Every stage kernel may be launched programmatically after the previous stage (Pipeline's launch
// chain): it lets the next stage launch at once and waits for the previous one before touching
// memory, so only the launches overlap, never the stages' work. The cross-rank barrier is never
// chained, nor anything after it.
#define UF_CHAINED() \
  cuda_rt::launch_dependents(); \
  cuda_rt::wait_for_predecessor()

constexpr bool kL1Fp8Pool = UF_L1_FP8_POOL != 0;

// An item's channels over the grid's y CTAs: this thread among them, and how many there are.
__device__ __forceinline__ int channel_thread() { return blockIdx.y * mm::unfused::kThreads + threadIdx.x; }
__device__ __forceinline__ int channel_threads() { return gridDim.y * mm::unfused::kThreads; }

extern "C" __global__ void __launch_bounds__(mm::unfused::kRouteThreads)
    uf_route(const __grid_constant__ mm::unfused::RouteParams p) {
  UF_CHAINED();
  mm::unfused::route_expert<mm::unfused::kRouteThreads>(p, blockIdx.x);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_dispatch(const __grid_constant__ mm::unfused::DispatchParams p) {
  UF_CHAINED();
  if constexpr (kL1Fp8Pool) {
    mm::unfused::dispatch_slots_fp8(p, blockIdx.x, 0, p.top_k, channel_thread(), channel_threads());
  } else {
    mm::unfused::dispatch_slots_bf16<UF_G>(p, blockIdx.x, 0, p.top_k, channel_thread(), channel_threads());
  }
}

// FP8 pool: a thread per row (a row's scales are a few bytes); BF16 pool: a CTA per row, as the dispatch.
extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_unstage(const __grid_constant__ mm::unfused::UnstageParams p) {
  UF_CHAINED();
  if constexpr (kL1Fp8Pool) {
    const int row = blockIdx.x * mm::unfused::kThreads + threadIdx.x;
    if (row < p.rows) mm::unfused::unstage_row<UF_G, true>(p, row, 0, 1);
  } else {
    mm::unfused::unstage_row<UF_G, false>(p, blockIdx.x, channel_thread(), channel_threads());
  }
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_silu_table(unsigned* table, int has_clamp, float clamp) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= mm::unfused::kSiluClampEntry) mm::unfused::silu_fix_entry(table, i, has_clamp, clamp);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_combine_send(const __grid_constant__ mm::unfused::CombineSendParams p) {
  UF_CHAINED();
  mm::unfused::combine_send_row<1>(p, blockIdx.x, channel_thread(), channel_threads());
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_combine_reduce(const __grid_constant__ mm::unfused::CombineReduceParams p) {
  UF_CHAINED();
  mm::unfused::combine_reduce_token(p, blockIdx.x, channel_thread(), channel_threads());
}

// One CTA; dynamic shared memory: the histogram, E u32.
extern "C" __global__ void __launch_bounds__(mm::unfused::kPlanThreads)
    uf_count(const __grid_constant__ mm::unfused::CountParams p) {
  extern __shared__ unsigned int hist[];
  mm::unfused::count_routes(p, hist, threadIdx.x, blockDim.x);
}

// One CTA, after the rank barrier that follows every rank's uf_count.
extern "C" __global__ void __launch_bounds__(mm::unfused::kPlanThreads)
    uf_plan(const __grid_constant__ mm::unfused::PlanParams p) {
  mm::unfused::plan_pools(p, threadIdx.x, blockDim.x);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_rank_barrier(const __grid_constant__ mm::unfused::RankBarrierParams p) {
  mm::unfused::rank_barrier(p);
}
