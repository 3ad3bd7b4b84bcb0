// sm90_unfused.cu -- JIT entry points of the unfused pipeline's glue kernels (sm90_unfused.cuh);
// specialized with -DUF_G=<32|128> -DUF_L1_FP8_POOL=<0|1> -DUF_L2_FP8_POOL=<0|1>. Launched with mm::unfused::kThreads threads per CTA (uf_route: kRouteThreads).
#include "cuda_rt.cuh"
#include "sm90_unfused.cuh"

// Every stage kernel may be launched programmatically after the previous stage (Pipeline's launch
// chain): it lets the next stage launch at once and waits for the previous one before touching
// memory, so only the launches overlap, never the stages' work. The cross-rank barrier is never
// chained, nor anything after it.
#define UF_CHAINED() \
  cuda_rt::launch_dependents(); \
  cuda_rt::wait_for_predecessor()

extern "C" __global__ void __launch_bounds__(mm::unfused::kRouteThreads)
    uf_route(const __grid_constant__ mm::unfused::RouteParams p) {
  UF_CHAINED();
  mm::unfused::route(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_dispatch(const __grid_constant__ mm::unfused::DispatchParams p) {
  UF_CHAINED();
  mm::unfused::dispatch(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_unstage(const __grid_constant__ mm::unfused::UnstageParams p) {
  UF_CHAINED();
  mm::unfused::unstage(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads) uf_silu_table(float* table) {
  mm::unfused::silu_table(table);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_swiglu(const __grid_constant__ mm::unfused::SwigluParams p) {
  UF_CHAINED();
  mm::unfused::swiglu(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_combine_send(const __grid_constant__ mm::unfused::CombineSendParams p) {
  UF_CHAINED();
  mm::unfused::combine_send(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_combine_reduce(const __grid_constant__ mm::unfused::CombineReduceParams p) {
  UF_CHAINED();
  mm::unfused::combine_reduce(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_rank_barrier(const __grid_constant__ mm::unfused::RankBarrierParams p) {
  mm::unfused::rank_barrier(p);
}
