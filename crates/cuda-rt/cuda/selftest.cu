// Kernels with which cuda-rt tests itself on a GPU: plain, cooperative, cluster and large-shared-memory
// launches, a TMA load, and two grids meeting across shares of the SMs. Compiled for sm_90a and sm_100a; TMA_BOX_ROWS/TMA_BOX_COLS come from -D.
#include <cooperative_groups.h>
#include "cuda_rt.cuh"
#include <cuda/std/cstdint>

namespace cg = cooperative_groups;
using cuda::std::uint32_t;
using cuda::std::uint64_t;

extern "C" __global__ void saxpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}

// Needs all blocks resident at once: launched cooperatively with at most one block per SM.
extern "C" __global__ void grid_barrier(uint32_t* counter, uint32_t* out) {
    if (threadIdx.x == 0) {
        atomicAdd(counter, 1u);
        while (atomicAdd(counter, 0u) < gridDim.x) {}
        out[blockIdx.x] = atomicAdd(counter, 0u);
    }
}

// Records its block's SM in sm[block], counts itself in *mine, then waits until *theirs counts
// `expected` started blocks of another grid, for at most `timeout_ns` (then sm[block] = ~0u): two
// grids whose blocks all wait for each other end only if both are resident at once.
extern "C" __global__ void smid_rendezvous(uint32_t* sm, uint32_t* mine, const volatile uint32_t* theirs,
                                           uint32_t expected, uint64_t timeout_ns) {
    if (threadIdx.x != 0) return;
    uint32_t id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    sm[blockIdx.x] = id;
    atomicAdd(mine, 1u);
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (*theirs < expected) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns) {
            sm[blockIdx.x] = ~0u;
            return;
        }
    }
}

// out[block] = cluster rank | cluster size << 8 | partner's rank << 16, the partner's value read through
// distributed shared memory: proves the launch really formed clusters.
extern "C" __global__ void cluster_ranks(uint32_t* out) {
    __shared__ uint32_t mine;
    cg::cluster_group cluster = cg::this_cluster();
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (threadIdx.x == 0) mine = rank;
    cluster.sync();
    if (threadIdx.x == 0) {
        uint32_t partner_rank = rank ^ 1u;
        const uint32_t* theirs = cluster.map_shared_rank(&mine, partner_rank);
        out[blockIdx.x] = rank | (cluster.num_blocks() << 8) | (*theirs << 16);
    }
    cluster.sync();  // keep our shared memory alive until the partner has read it
}

// Fills `words` words of dynamic shared memory, then copies them out reversed.
extern "C" __global__ void smem_reverse(uint32_t* out, uint32_t words) {
    extern __shared__ uint32_t smem[];
    for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) smem[i] = i * 2654435761u;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) out[i] = smem[words - 1 - i];
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Each block moves one TMA_BOX_ROWS x TMA_BOX_COLS f32 tile of a row-major matrix into shared memory
// with cp.async.bulk.tensor (completion on an mbarrier), then stores it to `out`, which has the
// matrix's columns and whole tiles of rows. Rows past the matrix come back as TMA's zero fill.
extern "C" __global__ void tma_load_2d(const __grid_constant__ CUtensorMap map, float* out) {
    __shared__ alignas(128) float tile[TMA_BOX_ROWS * TMA_BOX_COLS];
    __shared__ alignas(8) uint64_t bar;
    const uint32_t col0 = blockIdx.x * TMA_BOX_COLS, row0 = blockIdx.y * TMA_BOX_ROWS;
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar)));
        // Make the initialised barrier visible to the async (TMA) proxy.
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     ::"r"(smem_addr(&bar)), "r"(uint32_t(sizeof(tile))) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3}], [%4];"
            ::"r"(smem_addr(tile)), "l"(uint64_t(&map)), "r"(col0), "r"(row0),
              "r"(smem_addr(&bar))
            : "memory");
    }
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_addr(&bar)) : "memory");
    const uint32_t cols = gridDim.x * TMA_BOX_COLS;
    for (uint32_t i = threadIdx.x; i < TMA_BOX_ROWS * TMA_BOX_COLS; i += blockDim.x) {
        out[(row0 + i / TMA_BOX_COLS) * cols + col0 + i % TMA_BOX_COLS] = tile[i];
    }
}
