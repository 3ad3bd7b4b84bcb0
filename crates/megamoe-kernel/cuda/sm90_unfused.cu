// sm90_unfused.cu -- JIT entry points of the unfused pipeline's glue kernels (sm90_unfused.cuh);
// specialized with -DUF_G=<32|128> -DUF_L1_FP8_POOL=<0|1> -DUF_L2_FP8_POOL=<0|1>. Launched with mm::unfused::kThreads threads per CTA (uf_route: kRouteThreads).
#include "sm90_unfused.cuh"

extern "C" __global__ void __launch_bounds__(mm::unfused::kRouteThreads)
    uf_route(const __grid_constant__ mm::unfused::RouteParams p) {
  mm::unfused::route(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_dispatch(const __grid_constant__ mm::unfused::DispatchParams p) {
  mm::unfused::dispatch(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_unstage(const __grid_constant__ mm::unfused::UnstageParams p) {
  mm::unfused::unstage(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads) uf_silu_table(float* table) {
  mm::unfused::silu_table(table);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_swiglu(const __grid_constant__ mm::unfused::SwigluParams p) {
  mm::unfused::swiglu(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_combine_send(const __grid_constant__ mm::unfused::CombineSendParams p) {
  mm::unfused::combine_send(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_combine_reduce(const __grid_constant__ mm::unfused::CombineReduceParams p) {
  mm::unfused::combine_reduce(p);
}

extern "C" __global__ void __launch_bounds__(mm::unfused::kThreads)
    uf_rank_barrier(const __grid_constant__ mm::unfused::RankBarrierParams p) {
  mm::unfused::rank_barrier(p);
}
