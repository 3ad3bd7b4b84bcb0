// symm_buffer.cuh — device twin of crates/symm-mem/src/device.rs.
// The per-rank view of every rank's symmetric buffer (passed by value as a kernel argument). Every
// size and offset below is asserted on the Rust side as well.
// No includes: NVRTC compiles it from the in-memory include tree.
#pragma once

namespace symm_mem {

constexpr unsigned int kMaxRanks = 72;

// This rank's base address and, for every rank r, base_r - base_self.
struct SymmBuffer {
    unsigned long long base;
    unsigned int rank;
    unsigned int num_ranks;
    long long rank_offsets[kMaxRanks];

    // The address on dst_rank of what ptr addresses in this rank's buffer.
    template <typename T>
    __device__ __forceinline__ T* map(T* ptr, unsigned int dst_rank) const {
        return reinterpret_cast<T*>(reinterpret_cast<char*>(ptr) + rank_offsets[dst_rank]);
    }

    // This rank's address of byte offset `offset` of its buffer.
    template <typename T>
    __device__ __forceinline__ T* at(unsigned long long offset) const {
        return reinterpret_cast<T*>(base + offset);
    }
};

// Pinned against symm-mem (device.rs asserts the same numbers). NVRTC has no offsetof, so there
// the offsets follow from each member's size and alignment in declaration order (standard
// layout); nvcc and host compilers check the offsets themselves as well.
static_assert(sizeof(SymmBuffer) == 592, "SymmBuffer size differs from symm-mem's");
static_assert(alignof(SymmBuffer) == 8, "SymmBuffer alignment differs from symm-mem's");
static_assert(sizeof(SymmBuffer::base) == 8 && alignof(decltype(SymmBuffer::base)) == 8, "SymmBuffer::base");
static_assert(sizeof(SymmBuffer::rank) == 4 && alignof(decltype(SymmBuffer::rank)) == 4, "SymmBuffer::rank");
static_assert(sizeof(SymmBuffer::num_ranks) == 4, "SymmBuffer::num_ranks");
static_assert(sizeof(SymmBuffer::rank_offsets) == 8 * kMaxRanks && alignof(long long) == 8, "SymmBuffer::rank_offsets");
#ifndef __CUDACC_RTC__
static_assert(__builtin_offsetof(SymmBuffer, base) == 0, "SymmBuffer::base");
static_assert(__builtin_offsetof(SymmBuffer, rank) == 8, "SymmBuffer::rank");
static_assert(__builtin_offsetof(SymmBuffer, num_ranks) == 12, "SymmBuffer::num_ranks");
static_assert(__builtin_offsetof(SymmBuffer, rank_offsets) == 16, "SymmBuffer::rank_offsets");
#endif

}  // namespace symm_mem
