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
