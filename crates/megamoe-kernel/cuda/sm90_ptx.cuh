// sm90_ptx.cuh -- thin wrappers over the Hopper (sm_90a) instructions the kernels use: mbarriers,
// a cluster's shared memory (mapa, st.async, remote arrives, the cluster barrier), named barriers,
// TMA (tensor loads and stores, 1-D bulk copies, bulk-group waits and the proxy fence before a
// store), WGMMA with A from registers (FP8 k32 and BF16 k16), stmatrix, setmaxnreg, and the
// GPU-scope flag loads and stores that hand data from one CTA to another.
// Descriptor and fragment layouts were checked on the H200 by ../shared/bench/wgmma_ceiling.cu.
#pragma once

namespace mm {
namespace sm90 {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
// The dynamic shared memory's first 1024-byte boundary (TMA's 128-byte swizzle needs 1024-byte
// aligned stages); kernels reserve 1 KiB of slack. Offsetting the shared array itself keeps the
// address space: a pointer rebuilt from an integer would make every shared-memory read a generic LD.
__device__ __forceinline__ u8* align_smem(u8* raw) { return raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u); }
// A 32-bit store to shared memory that the compiler does not order against other memory accesses
// (no memory clobber): global loads around it stay free to move, where an ordinary store, which
// may alias them, holds every later load behind it. The barriers' asm (memory clobbers) orders it.
__device__ __forceinline__ void st_shared_unordered(void* p, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(smem_addr(p)), "r"(v));
}
// st_shared_unordered at byte `kOffset` from shared address `base`: one base register for a run of
// stores at fixed distances.
template <int kOffset>
__device__ __forceinline__ void st_shared_unordered_at(u32 base, u32 v) {
  asm volatile("st.shared.u32 [%0+%1], %2;" ::"r"(base), "n"(kOffset), "r"(v));
}
// The SM this thread runs on (the benchmark's CTA timelines).
__device__ __forceinline__ u32 smid() {
  u32 id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
// The SM's own cycle counter, %clock (the benchmark's CTA timelines: its cycles over
// %globaltimer's ns between two reads on one SM are that SM's clock meanwhile). The builtin, not
// an asm volatile read: ptxas may place it, where the asm made it serialize the wgmmas of the
// g128/bf16 two-CTA 32-token fused kernel (C7511).
__device__ __forceinline__ u32 sm_cycles() { return (u32)clock(); }

// threadIdx.x and blockIdx.x as instructions the compiler cannot hoist out of a loop or hold from the
// kernel's start (see their users).
__device__ __forceinline__ u32 fresh_tid_x() {
  u32 t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}
__device__ __forceinline__ u32 fresh_ctaid_x() {
  u32 c;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(c));
  return c;
}

// ---------------------------------------------------------------- mbarrier
__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Until phase `parity` of `bar` completes, unbounded: the GEMM's consumers wait so for their
// stages (sm90_moe_gemm.cuh's ring_wait says why that is bounded all the same).
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// The barrier's memory is free for another use (or another init) once nobody waits on it.
__device__ __forceinline__ void mbar_inval(u64* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// The shared::cluster address of `p`'s offset in CTA `cta` of this cluster.
__device__ __forceinline__ u32 cluster_smem_addr(const void* p, u32 cta) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(cta));
  return remote;
}
// When `leader` (one lane): arrive on `bar` and on the mbarrier at the same offset in CTA `cta` of
// this cluster. Predicated rather than branched, so the warp never diverges around it (a branch
// here costs the consumers their uniform descriptor arithmetic). Default (release, CTA-scope)
// semantics as CUTLASS's cluster barrier: `.release.cluster` compiles to MEMBAR.ALL.GPU, which
// waits for every outstanding store (35 % of the FP8 GEMM at T = 8192).
__device__ __forceinline__ void mbar_arrive_here_and_cluster(u64* bar, u32 cta, bool leader) {
  const u32 remote = cluster_smem_addr(bar, cta);
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.u32 p, %2, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
      "@p mbarrier.arrive.shared::cluster.b64 _, [%1];\n}" ::"r"(smem_addr(bar)),
      "r"(remote), "r"((u32)leader)
      : "memory");
}

// ---------------------------------------------------------------- clusters
// Stores `value` at `word`'s offset in CTA `cta`'s shared memory and completes 4 bytes of the
// transaction count of the mbarrier at `bar`'s offset there: the peer learns the word is written
// from its own barrier, with no fence on this side.
__device__ __forceinline__ void st_async_cluster(u32* word, u64* bar, u32 cta, u32 value) {
  const u32 remote_word = cluster_smem_addr(word, cta), remote_bar = cluster_smem_addr(bar, cta);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(remote_word),
               "r"(value), "r"(remote_bar)
               : "memory");
}
// Arrives on the mbarrier at `bar`'s offset in CTA `cta` of this cluster (not on this CTA's).
__device__ __forceinline__ void mbar_arrive_cluster(u64* bar, u32 cta) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_smem_addr(bar, cta)) : "memory");
}
// Every thread of every CTA of the cluster: release what came before, acquire what the others did.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// ---------------------------------------------------------------- named barriers
// kThreads threads of the CTA (a multiple of 32) meet at barrier kId (1..15; 0 is __syncthreads).
template <u32 kId, u32 kThreads>
__device__ __forceinline__ void named_bar_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}
// The same meeting for threads that reach it from different places (role branches): barrier.sync
// without .aligned. bar.sync promises that every thread of a generation runs the one instruction,
// which two sites break (undefined in PTX terms). ptxas 13.0 emits the same SASS for both forms;
// synccheck reported the fused kernel's two-site meeting in the aligned form and passes this one
// (perf.md v86, v87).
template <u32 kId, u32 kThreads>
__device__ __forceinline__ void named_bar_sync_unaligned() {
  asm volatile("barrier.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}

// ---------------------------------------------------------------- TMA
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, u64* bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y)
      : "memory");
}
// The same box into the same shared-memory offset of every CTA in `cta_mask`, each CTA's mbarrier at
// `bar`'s offset counting its bytes.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const void* map, u64* bar, int x, int y, u16 cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(
          smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y), "h"(cta_mask)
      : "memory");
}
// Contiguous copy; bytes and both addresses multiples of 16.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u64* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// `bytes` (a multiple of 16) from `src` into L2, asynchronously; nothing waits for it.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, u32 bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
// A box of `map` at (x, y) from shared memory to global, in this thread's bulk group. The writes
// that filled `src` must be ordered before it by fence_proxy_async_shared.
__device__ __forceinline__ void tma_store_2d(const void* map, const void* src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(smem_addr(src)), "r"(x), "r"(y)
               : "memory");
}
// Contiguous copy from shared memory to global, in this thread's bulk group; bytes and both
// addresses multiples of 16. The writes that filled `src` must be ordered before it by
// fence_proxy_async_shared.
__device__ __forceinline__ void bulk_store(void* dst, const void* src, u32 bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// This thread's bulk groups, all but the last N: done reading shared memory / done altogether.
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory"); }
// This thread's shared-memory writes, visible to the TMA (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// The line of global address p into this SM's L1, without a register to wait on.
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }
__device__ __forceinline__ void prefetch_tensormap(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// ---------------------------------------------------------------- between CTAs
__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_add_release_gpu(u32* p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Writes this thread made with ordinary stores are seen by async-proxy (TMA, bulk copy) reads that
// follow a barrier or a release and acquire of them, and the TMA's stores by ordinary loads after one.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
__device__ __forceinline__ void st_release_gpu(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---------------------------------------------------------------- registers
template <u32 N> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
template <u32 N> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }

// ---------------------------------------------------------------- WGMMA
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int K> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(K) : "memory"); }
// Keeps the compiler from moving accumulator reads/writes across wgmma boundaries.
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }

// Four 8x8 b16 matrices stored transposed: register m holds this lane's pair of matrix m in the
// mma fragment layout (row lane / 4, columns 2 (lane % 4) and +1); lanes 8m..8m+7 give the shared
// addresses (16 B each) of the stored rows of matrix m, i.e. of its columns.
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
// BF16x2 of two floats, round to nearest even; `lo` in the low half (the lower address).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// K-major operand in shared memory with 128-byte swizzle: 8-row atoms of 1024 B (1024-B aligned),
// LBO unused (1), SBO = 1024 B. Advancing K within the 128-B row adds bytes >> 4 to the start field.
__device__ __forceinline__ u64 desc_k_sw128(u32 saddr) {
  return (u64)((saddr & 0x3FFFFu) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
#define MM_D8(o) "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), "+f"(d[o + 7])

// D(64xN f32) (+)= A(64x32 fp8, 4 regs/thread) * B(Nx32, smem desc)^T; scale_d = 0 overwrites D.
template <int N> __device__ __forceinline__ void mma_fp8_rs(float* d, const u32* a, u64 b, int scale_d);
template <> __device__ __forceinline__ void mma_fp8_rs<8>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_fp8_rs<16>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3, %4, %5, %6, %7}, "
               "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
               : MM_D8(0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_fp8_rs<32>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
               "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
               : MM_D8(0), MM_D8(8)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_fp8_rs<64>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
               : MM_D8(0), MM_D8(8), MM_D8(16), MM_D8(24)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_fp8_rs<128>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
               "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
               : MM_D8(0), MM_D8(8), MM_D8(16), MM_D8(24), MM_D8(32), MM_D8(40), MM_D8(48), MM_D8(56)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_fp8_rs<256>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
               "{%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
               : MM_D8(0), MM_D8(8), MM_D8(16), MM_D8(24), MM_D8(32), MM_D8(40), MM_D8(48), MM_D8(56), MM_D8(64), MM_D8(72), MM_D8(80), MM_D8(88), MM_D8(96), MM_D8(104), MM_D8(112), MM_D8(120)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

// D(64xN f32) (+)= A(64x16 bf16, 4 regs/thread) * B(Nx16, smem desc)^T; scale_d = 0 overwrites D.
template <int N> __device__ __forceinline__ void mma_bf16_rs(float* d, const u32* a, u64 b, int scale_d);
template <> __device__ __forceinline__ void mma_bf16_rs<8>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_bf16_rs<16>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7}, "
               "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
               : MM_D8(0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_bf16_rs<32>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
               "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
               : MM_D8(0), MM_D8(8)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_bf16_rs<64>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : MM_D8(0), MM_D8(8), MM_D8(16), MM_D8(24)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_bf16_rs<96>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
               "{%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n"
               : MM_D8(0), MM_D8(8), MM_D8(16), MM_D8(24), MM_D8(32), MM_D8(40)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_bf16_rs<128>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
               "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
               : MM_D8(0), MM_D8(8), MM_D8(16), MM_D8(24), MM_D8(32), MM_D8(40), MM_D8(48), MM_D8(56)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <> __device__ __forceinline__ void mma_bf16_rs<256>(float* d, const u32* a, u64 b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
               "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
               : MM_D8(0), MM_D8(8), MM_D8(16), MM_D8(24), MM_D8(32), MM_D8(40), MM_D8(48), MM_D8(56), MM_D8(64), MM_D8(72), MM_D8(80), MM_D8(88), MM_D8(96), MM_D8(104), MM_D8(112), MM_D8(120)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

}  // namespace sm90
}  // namespace mm
