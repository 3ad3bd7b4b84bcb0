// Kernels of crates/barriers' GPU tests (tests/gpu.rs) and benchmark (benches/barriers.rs). Every
// kernel that calls a grid barrier needs a cooperative launch (all blocks resident) of 1-D blocks.
#include "barriers.cuh"

using barriers::u32;
using barriers::u64;

// A 32-bit value that differs for every (round, source rank, block, index) and is never 0, so a
// stale word from an earlier round or a zeroed one never passes for the expected one.
__device__ __forceinline__ u32 pattern(u32 round, u32 src, u32 block, u32 i) {
    u32 x = round * 0x9E3779B1u + src * 0x85EBCA77u + block * 0xC2B2AE3Du + i * 0x27D4EB2Fu;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x | 1u;
}

// Adds this thread's mismatches to failures[0] and its first bad round to failures[1] (a minimum).
__device__ __forceinline__ void report(u32* failures, u32 bad, u32 first_bad) {
    if (bad != 0) {
        atomicAdd(failures, bad);
        atomicMin(failures + 1, first_bad);
    }
}

// `rounds` grid barriers. Before each, thread t of block b writes its word of slots[round % 2][b];
// after it, reads the same word of another block (a different one every round) and checks it.
// `slots` holds 2 * gridDim.x * blockDim.x words; failures = {mismatches, first bad round}.
extern "C" __global__ void grid_barrier_rounds(u64* word, u32* slots, u32 rounds, u32* failures) {
    const u32 blocks = gridDim.x, threads = blockDim.x, b = blockIdx.x, t = threadIdx.x;
    u32 bad = 0, first_bad = ~0u;
    for (u32 r = 0; r < rounds; ++r) {
        u32* buf = slots + u64(r & 1) * blocks * threads;
        buf[b * threads + t] = pattern(r, 0, b, t);
        barriers::grid_barrier(word);
        const u32 other = (b + 1 + r) % blocks;
        if (buf[other * threads + t] != pattern(r, 0, other, t)) {
            ++bad;
            first_bad = min(first_bad, r);
        }
    }
    report(failures, bad, first_bad);
}

// `rounds` grid-wide cross-rank barriers. Before each, block b writes `words` words into every
// rank's data[round % 2][this rank][b]; after it, checks what every rank wrote into its own
// data[round % 2][src][b]. data holds 2 * num_ranks * gridDim.x * words words on every rank.
// result = {mismatches, first bad round, rounds completed}: a failed barrier (its error word set)
// stops every block at the same round. words = 0 times the barrier alone.
extern "C" __global__ void rank_barrier_rounds(const symm_mem::SymmBuffer* view, u64* grid_word,
                                               u64* signals, u64* error_word, u32* data, u32 words,
                                               u32 rounds, u64 timeout_ns, u32* result) {
    const u32 me = view->rank, num_ranks = view->num_ranks, blocks = gridDim.x, b = blockIdx.x;
    u32 bad = 0, first_bad = ~0u, r = 0;
    for (; r < rounds; ++r) {
        const u64 parity = r & 1;
        for (u32 peer = 0; peer < num_ranks; ++peer) {
            u32* dst = view->map(data + ((parity * num_ranks + me) * blocks + b) * words, peer);
            for (u32 i = threadIdx.x; i < words; i += blockDim.x) dst[i] = pattern(r, me, b, i);
        }
        if (!barriers::grid_rank_barrier(grid_word, view, signals, error_word, timeout_ns)) break;
        for (u32 src = 0; src < num_ranks; ++src) {
            const u32* from = data + ((parity * num_ranks + src) * blocks + b) * words;
            for (u32 i = threadIdx.x; i < words; i += blockDim.x) {
                if (from[i] != pattern(r, src, b, i)) {
                    ++bad;
                    first_bad = min(first_bad, r);
                }
            }
        }
    }
    report(result, bad, first_bad);
    if (b == 0 && threadIdx.x == 0) result[2] = r;
}

// `rounds` bare grid barriers: the latency benchmark.
extern "C" __global__ void grid_barrier_loop(u64* word, u32 rounds) {
    for (u32 r = 0; r < rounds; ++r) barriers::grid_barrier(word);
}

// The device's encoding of n timeouts, inputs[4i..4i+4] = (kind, a, b, waited ns): kind 1 a rank
// timeout (a = missing rank, b = epoch), kind 2 an in-kernel wait's (a = wait, b = detail).
extern "C" __global__ void encode_timeouts(const u64* inputs, u64* out, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u64* in = inputs + 4 * i;
    out[i] = in[0] == barriers::kErrorKindRankTimeout ? barriers::encode_rank_timeout(u32(in[1]), in[2], in[3])
                                                      : barriers::encode_local_timeout(u32(in[1]), u32(in[2]), in[3]);
}

struct alignas(16) V4 {
    u32 x, y, z, w;
};

__device__ __forceinline__ V4 ld16(const V4* p) {
    V4 v;
    asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ void st16(V4* p, V4 v) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// dst[i] = src[i] for n 16-byte words, with 16-byte loads and stores; either side may be a peer's
// memory (the SM-driven copy of the benchmark). Four loads in flight per thread before the stores.
extern "C" __global__ void copy16(const V4* src, V4* dst, u64 n) {
    constexpr u32 kUnroll = 4;
    const u64 stride = u64(gridDim.x) * blockDim.x;
    u64 i = u64(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
        V4 v[kUnroll];
#pragma unroll
        for (u32 u = 0; u < kUnroll; ++u) v[u] = ld16(src + i + u * stride);
#pragma unroll
        for (u32 u = 0; u < kUnroll; ++u) st16(dst + i + u * stride, v[u]);
    }
    for (; i < n; i += stride) st16(dst + i, ld16(src + i));
}
