// cuda-rt's device header: what kernels need from the host runtime's side of the contract.
#pragma once

// CUtensorMap, the 128-byte TMA descriptor that cuda_rt::TensorMap encodes and a launch passes by value
// (`const __grid_constant__ CUtensorMap`). cuda.h defines it, but cuda.h cannot be included under NVRTC
// (it pulls in <stdlib.h>); CCCL's <cuda/barrier> only forward-declares it. Same layout as cuda.h.
#ifndef CU_TENSOR_MAP_NUM_QWORDS
#define CU_TENSOR_MAP_NUM_QWORDS 16
typedef struct CUtensorMap_st {
    alignas(128) unsigned long long opaque[CU_TENSOR_MAP_NUM_QWORDS];
} CUtensorMap;
#endif

// Programmatic dependent launch (cuda_rt::LaunchConfig::programmatic). A kernel launched with it may
// run while the previous kernel on its stream still does: it must call wait_for_predecessor() before
// touching global memory that kernel (or any before it) writes or reads; wait_for_predecessor()
// returns once the previous kernel has completed and its memory operations are visible. Either
// call is a no-op in a kernel launched without the attribute.
namespace cuda_rt {
// Lets the next kernel on the stream (if launched programmatically) start once every block of this
// one has called this or exited; called early, the next kernel's launch hides behind this one's work.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_predecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
}  // namespace cuda_rt
