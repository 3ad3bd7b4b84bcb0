// barriers.cuh — device half of crates/barriers: the in-rank grid barrier on one 64-bit word and the
// cross-rank barrier through symmetric memory, which gives up after a timeout and records why in an
// error word instead of hanging. Inline PTX only (no toolkit headers: NVRTC builds it from the
// in-memory include tree); symm_buffer.cuh (crate symm-mem) maps addresses onto peers.
//
// Words, all 8-byte aligned device memory that starts zeroed and is never reset:
// - grid word: phase in the high 32 bits, arrivals of the current phase in the low 32 bits;
// - signals: [num_ranks] u64 in every rank's buffer at the same offset; slot s is written only by
//   rank s, with the epoch (1, 2, 3, ...) of the barrier it entered; slot `rank` doubles as this
//   rank's own epoch counter;
// - error word: 0, or the first failure, encoded as the kError* constants say (decoded by the host);
//   a cross-rank barrier's timeout, or an in-kernel wait's (a kernel's own wait on another of its
//   CTAs, e.g. the grouped GEMM's split-tail hand-over, which records into its own error word).
#pragma once

#include "symm_buffer.cuh"

namespace barriers {

using u32 = unsigned int;
using u64 = unsigned long long;

// Error word: kind in bits 63..60, the missing rank in 59..52, how long the barrier waited in
// 51..32 (units of 2^20 ns, saturating), the low 32 bits of the epoch in 31..0. Pinned against the
// constants of the same names in crates/barriers/src/error.rs.
constexpr u32 kErrorKindShift = 60;
constexpr u64 kErrorKindRankTimeout = 1;
constexpr u32 kErrorRankShift = 52;
constexpr u32 kErrorWaitShift = 32;
constexpr u32 kErrorWaitUnitLog2 = 20;
constexpr u64 kErrorWaitMax = (1ull << 20) - 1;

// An in-kernel wait's timeout: kind 2, the wait (kLocalWait*) in 59..52, how long it waited in 51..32
// as above, a detail of the wait (the split-tail hand-over: its slot) in 31..0.
constexpr u64 kErrorKindLocalTimeout = 2;
constexpr u32 kErrorLocalWaitShift = 52;
constexpr u32 kLocalWaitSplitTail = 1;  // the grouped GEMM's split-tail hand-over (megamoe-kernel)
constexpr u32 kLocalWaitRowArrivals = 2;  // the fused L2 GEMM's wait for its rows' L1 tiles (megamoe-kernel)
constexpr u32 kLocalWaitRing = 3;  // a grouped GEMM CTA's wait on its own ring's mbarriers (megamoe-kernel)

__device__ __forceinline__ u64 error_wait_field(u64 waited_ns) {
    const u64 wait = waited_ns >> kErrorWaitUnitLog2;
    return (wait < kErrorWaitMax ? wait : kErrorWaitMax) << kErrorWaitShift;
}

__device__ __forceinline__ u64 encode_rank_timeout(u32 missing_rank, u64 epoch, u64 waited_ns) {
    return (kErrorKindRankTimeout << kErrorKindShift) | (u64(missing_rank & 0xFF) << kErrorRankShift) |
           error_wait_field(waited_ns) | (epoch & 0xFFFFFFFFull);
}

__device__ __forceinline__ u64 encode_local_timeout(u32 wait, u32 detail, u64 waited_ns) {
    return (kErrorKindLocalTimeout << kErrorKindShift) | (u64(wait & 0xFF) << kErrorLocalWaitShift) |
           error_wait_field(waited_ns) | detail;
}

namespace ptx {

__device__ __forceinline__ u64 ld_acquire_gpu(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Strong load that bypasses L1: sees what other blocks wrote once they are ordered before us.
__device__ __forceinline__ u64 ld_relaxed_gpu(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ u64 atom_add_acq_rel_gpu(u64* p, u64 v) {
    u64 old;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}

__device__ __forceinline__ void red_add_release_gpu(u64* p, u64 v) {
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 atom_cas_relaxed_gpu(u64* p, u64 expected, u64 desired) {
    u64 old;
    asm volatile("atom.relaxed.gpu.global.cas.b64 %0, [%1], %2, %3;"
                 : "=l"(old) : "l"(p), "l"(expected), "l"(desired) : "memory");
    return old;
}

__device__ __forceinline__ void st_release_sys(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Nanoseconds of the GPU's global timer (the same clock on every SM).
__device__ __forceinline__ u64 globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

}  // namespace ptx

// How far the writes before a grid barrier are published: to this GPU (enough for data that only
// this GPU's blocks read), or to the whole system (for data written to or read by peers, before a
// cross-rank barrier).
enum class Scope { Gpu, Sys };

// All threads of `num_blocks` co-resident blocks (a cooperative launch) call it; 1-D blocks. Every
// write before it, by any thread of those blocks, is visible to every thread after it. Reusable
// without reset: the last arriver of a phase bumps the phase and zeroes the count in one atomic;
// the others spin on the phase with acquire loads.
template <Scope kPublish = Scope::Gpu>
__device__ __forceinline__ void grid_barrier(u64* word, u32 num_blocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if constexpr (kPublish == Scope::Sys) ptx::fence_acq_rel_sys();
        const u64 old = ptx::atom_add_acq_rel_gpu(word, 1);
        const u32 phase = u32(old >> 32);
        if (u32(old) + 1 == num_blocks) {
            // Count back to 0 and phase + 1 (wrapping): (phase, n) + 2^32 - n = (phase + 1, 0).
            ptx::red_add_release_gpu(word, (1ull << 32) - num_blocks);
        } else {
            while (u32(ptx::ld_acquire_gpu(word) >> 32) == phase) {
            }
        }
    }
    __syncthreads();
}

// The grid's block count is read afresh at every barrier: a kernel with other work between its
// barriers (the fused MoE kernel's GEMM roles) must not hold it in a register, or spill it, across.
__device__ __forceinline__ u32 grid_blocks() {
    u32 x, y, z;
    asm volatile("mov.u32 %0, %%nctaid.x;\n\tmov.u32 %1, %%nctaid.y;\n\tmov.u32 %2, %%nctaid.z;"
                 : "=r"(x), "=r"(y), "=r"(z));
    return x * y * z;
}

template <Scope kPublish = Scope::Gpu>
__device__ __forceinline__ void grid_barrier(u64* word) {
    grid_barrier<kPublish>(word, grid_blocks());
}

// The cross-rank barrier, for all threads of ONE block of each rank (1-D). `view` is this rank's
// SymmBuffer (in global memory), `signals` and `error_word` this rank's own copies. Each thread
// takes peers t, t + blockDim.x, ...: it stores the new epoch into that peer's slot for this rank
// with release semantics at system scope, then spins with acquire loads on its own slot for that
// peer until the peer's epoch arrives. A peer missing for `timeout_ns` (by %globaltimer) makes the
// first thread to notice record which rank and epoch in the error word; the others stop too.
// Returns true (in every thread of the block) when all ranks arrived. A non-zero error word on
// entry returns false at once: the ranks are out of step and only the host can recover them.
__device__ __forceinline__ bool rank_barrier(const symm_mem::SymmBuffer* view, u64* signals,
                                             u64* error_word, u64 timeout_ns) {
    __shared__ u64 s_epoch;
    __shared__ u64 s_error;
    const u32 rank = view->rank;
    const u32 num_ranks = view->num_ranks;
    if (threadIdx.x == 0) {
        // Our own slot holds the epoch we entered last; read once, before any thread rewrites it.
        s_epoch = ptx::ld_relaxed_gpu(signals + rank) + 1;
        s_error = ptx::ld_relaxed_gpu(error_word);
    }
    __syncthreads();
    const u64 epoch = s_epoch;
    if (s_error == 0) {
        for (u32 peer = threadIdx.x; peer < num_ranks; peer += blockDim.x) {
            ptx::st_release_sys(view->map(signals + rank, peer), epoch);
        }
        const u64 start = ptx::globaltimer();
        for (u32 peer = threadIdx.x; peer < num_ranks; peer += blockDim.x) {
            for (u32 spins = 1; ptx::ld_acquire_sys(signals + peer) < epoch; ++spins) {
                // The timer and the error word are checked every 16 polls: cheap, and fast enough.
                if (spins % 16 != 0) continue;
                if (ptx::ld_relaxed_gpu(error_word) != 0) break;
                const u64 waited = ptx::globaltimer() - start;
                if (waited > timeout_ns) {
                    ptx::atom_cas_relaxed_gpu(error_word, 0, encode_rank_timeout(peer, epoch, waited));
                    break;
                }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) s_error = ptx::ld_relaxed_gpu(error_word);
    __syncthreads();
    const bool ok = s_error == 0;
    // Nobody may overwrite the shared words (in the next call) before every thread has read them.
    __syncthreads();
    return ok;
}

// The grid-wide cross-rank barrier, for all threads of every block (co-resident, 1-D): a grid
// barrier that publishes to the system, block 0 meets the other ranks, a second grid barrier lets
// the rest of the grid through. Every write before it on any rank is visible after it on every
// rank. Returns false everywhere when the cross-rank part failed (see rank_barrier).
__device__ __forceinline__ bool grid_rank_barrier(u64* grid_word, const symm_mem::SymmBuffer* view,
                                                  u64* signals, u64* error_word, u64 timeout_ns) {
    grid_barrier<Scope::Sys>(grid_word);
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
        rank_barrier(view, signals, error_word, timeout_ns);
    }
    grid_barrier(grid_word);
    __shared__ u64 s_error;
    if (threadIdx.x == 0) s_error = ptx::ld_relaxed_gpu(error_word);
    __syncthreads();
    const bool ok = s_error == 0;
    // Nobody may overwrite s_error (in the next call) before every thread has read it.
    __syncthreads();
    return ok;
}

}  // namespace barriers
