// ring_wait_test.cu -- the GPU test of the grouped GEMM's bounded ring wait (sm90_moe_gemm.cuh's
// ring_wait), on a barrier of its own: `arrivals` of the two arrivals its phase needs are made,
// then every thread of every CTA waits for the phase with ring_wait, reporting to `error`.
#include "sm90_moe_gemm.cuh"

extern "C" __global__ void ring_wait_for_arrivals(unsigned long long* error, unsigned int arrivals) {
  __shared__ __align__(8) unsigned long long bar;
  __shared__ unsigned long long* error_at;
  if (threadIdx.x == 0) {
    error_at = error;
    mm::sm90::mbar_init(&bar, 2);
    mm::sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < arrivals) mm::sm90::mbar_arrive(&bar);
  mm::gemm::ring_wait(&bar, 0, &error_at);
}
