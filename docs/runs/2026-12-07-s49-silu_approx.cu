// Session 49 experiment: how far fast f32 SiLU approximations land from the contract's
// silu(g) = g / (1 + (float)exp(-(double)g)) over every BF16 gate (bits difference per gate).
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cmath>
__device__ __forceinline__ float ex2a(float x) { float y; asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float rcpa(float x) { float y; asm("rcp.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float exact(float g) { const float e = (float)exp(-(double)g); return __fdiv_rn(g, __fadd_rn(1.0f, e)); }
// log2(e) split: hi with 16 significant bits (a BF16 gate times it is exact), lo the rest
constexpr float kL = 1.4426950408889634f;
__device__ float approx(int v, float g) {
  const float lh = __uint_as_float(__float_as_uint(kL) & 0xffffff00u);
  const float ll = (float)(1.4426950408889634 - (double)lh) * 0.6931471805599453f;  // (log2e - lh) ln2
  float d, R, q;
  switch (v) {
    case 0: {  // A: one product, no Newton
      d = __fadd_rn(1.0f, ex2a(__fmul_rn(-g, kL))); return __fmul_rn(g, rcpa(d)); }
    case 1: {  // A + a Newton step of the quotient
      d = __fadd_rn(1.0f, ex2a(__fmul_rn(-g, kL))); R = rcpa(d); q = __fmul_rn(g, R);
      return __fmaf_rn(__fmaf_rn(-d, q, g), R, q); }
    case 2: {  // B: split product, e corrected by its low part, no Newton
      const float E = ex2a(__fmul_rn(-g, lh)); const float e = __fmaf_rn(E, __fmul_rn(-g, ll), E);
      d = __fadd_rn(1.0f, e); return __fmul_rn(g, rcpa(d)); }
    case 3: {  // B + Newton
      const float E = ex2a(__fmul_rn(-g, lh)); const float e = __fmaf_rn(E, __fmul_rn(-g, ll), E);
      d = __fadd_rn(1.0f, e); R = rcpa(d); q = __fmul_rn(g, R);
      return __fmaf_rn(__fmaf_rn(-d, q, g), R, q); }
    case 4: {  // B + IEEE division (reference for the exp's own error)
      const float E = ex2a(__fmul_rn(-g, lh)); const float e = __fmaf_rn(E, __fmul_rn(-g, ll), E);
      return __fdiv_rn(g, __fadd_rn(1.0f, e)); }
  }
  return 0;
}
__global__ void run(int v, int* c, float* ex, float* ap) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536) return;
  const float g = __uint_as_float((uint32_t)i << 16);
  const float a = approx(v, g), e = exact(g);
  ex[i] = e; ap[i] = a;
}
static long ord(float f) { int32_t b; memcpy(&b, &f, 4); return b < 0 ? -(long)(b & 0x7fffffff) : (long)b; }
int main() {
  float *ex, *ap; int* c;
  cudaMallocManaged(&ex, 65536 * 4); cudaMallocManaged(&ap, 65536 * 4); cudaMallocManaged(&c, 4);
  const char* names[] = {"A one product", "A + Newton", "B split", "B split + Newton", "B split + div.rn"};
  for (int v = 0; v < 5; ++v) {
    run<<<256, 256>>>(v, c, ex, ap);
    if (cudaDeviceSynchronize() != cudaSuccess) { printf("cuda error\n"); return 1; }
    long mn = 0, mx = 0, nz = 0, big = 0; int lo[2] = {1 << 20, 1 << 20}, hi[2] = {-1, -1};
    long hist[33] = {0};
    for (int i = 0; i < 65536; ++i) {
      const float g = ex[i]; (void)g;
      uint32_t gb = (uint32_t)i << 16; float gf; memcpy(&gf, &gb, 4);
      if (std::isnan(gf) || std::isinf(gf)) continue;
      if (std::isnan(ex[i]) && std::isnan(ap[i])) continue;
      const long d = ord(ex[i]) - ord(ap[i]);
      if (d) { ++nz; const int s = i >> 15, m = i & 0x7fff; if (m < lo[s]) lo[s] = m; if (m > hi[s]) hi[s] = m; }
      if (d < mn) mn = d; if (d > mx) mx = d; if (d > 7 || d < -7) ++big;
      hist[d < -16 ? 0 : d > 16 ? 32 : d + 16]++;
    }
    printf("%-18s c in [%ld, %ld], %ld nonzero, %ld beyond +-7; nonzero gates: + bits [%#x, %#x] (exp %d..%d), - bits [%#x, %#x] (exp %d..%d)\n",
           names[v], mn, mx, nz, big, lo[0], hi[0], (lo[0] >> 7) - 127, (hi[0] >> 7) - 127, lo[1], hi[1], (lo[1] >> 7) - 127, (hi[1] >> 7) - 127);
    printf("   hist -16..16:"); for (int k = 0; k < 33; ++k) printf(" %ld", hist[k]); printf("\n");
  }
  return 0;
}
