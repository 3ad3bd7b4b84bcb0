// fp_formats.cuh -- device twin of the `fp-formats` crate: E4M3 / E2M1 / UE8M0 conversions, the
// quantizers of DESIGN §1, and the E2M1 -> E4M3 register decode with a folded power-of-two offset.
// Every function here must agree bit for bit with its host twin (tested on the GPU).
// Self-contained (no includes) so NVRTC compiles it without the toolkit headers.
#pragma once

namespace mm {
namespace fp {

typedef unsigned char u8;
typedef unsigned int u32;

// 2^k, exact for k in [-149, 127].
__device__ __forceinline__ float pow2(int k) {
  return k >= -126 ? __uint_as_float((u32)(k + 127) << 23) : __uint_as_float(1u << (k + 149));
}

// Bytes of {b, a} by selector nibble (bytes 0-3 a's, 4-7 b's); a nibble of 8 + i gives byte i's top
// bit over the whole byte.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// ---------------------------------------------------------------- E4M3 (fn: max 448, NaN 0x7f/0xff)
__device__ __forceinline__ float e4m3_decode(u8 c) {
  const int e = (c >> 3) & 0xf, m = c & 7;
  if (e == 0xf && m == 7) return __uint_as_float(0x7fc00000u);
  const float mag = e == 0 ? (float)m * pow2(-9) : (1.0f + (float)m * 0.125f) * pow2(e - 7);
  return (c & 0x80) ? -mag : mag;
}

// Round-to-nearest-even with saturation to +-448 (Inf saturates). NaN -> 0x7f with the input's sign,
// as the host does.
__device__ __forceinline__ u8 e4m3_encode(float x) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  if (x != x) return (u8)(0x7fu | ((__float_as_uint(x) >> 24) & 0x80u));
  return (u8)(r & 0xff);
}

// e4m3_encode of a and b, their codes in bytes 0 and 1, one conversion for both and no test for
// NaN: the conversion's code carries its input's sign but for a NaN's (0x7f or 0xff), so every code
// takes its sign bit from its input.
__device__ __forceinline__ u32 e4m3_encode2(float a, float b) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return ((u32)r & 0x7f7fu) | (prmt(__float_as_uint(a), __float_as_uint(b), 0xfb) & 0x8080u);
}

// e4m3_encode of a .. d: their codes in bytes 0 .. 3. Its own masks rather than two e4m3_encode2:
// one sign mask for all four codes is an instruction fewer in the SwiGLU epilogue's inner loop.
__device__ __forceinline__ u32 e4m3_encode4(float a, float b, float c, float d) {
  unsigned short ab, cd;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(ab) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(cd) : "f"(d), "f"(c));
  const u32 signs = (prmt(__float_as_uint(a), __float_as_uint(b), 0xfb) & 0xffffu) |
                    (prmt(__float_as_uint(c), __float_as_uint(d), 0xfb00) & 0xffff0000u);
  return (((u32)ab | (u32)cd << 16) & 0x7f7f7f7fu) | (signs & 0x80808080u);
}

// ---------------------------------------------------------------- E2M1 (0 .5 1 1.5 2 3 4 6)
__device__ __forceinline__ float e2m1_decode(u8 c) {
  const float mag = (c & 6) ? (1.0f + 0.5f * (float)(c & 1)) * pow2(((c >> 1) & 3) - 1) : 0.5f * (float)(c & 1);
  return (c & 8) ? -mag : mag;
}

// Round-to-nearest-even, saturating to +-6; the sign of zero is kept. Each threshold is a midpoint
// between two codes: `>` where the lower code is even, `>=` where the upper one is.
__device__ __forceinline__ u8 e2m1_encode(float x) {
  const float a = fabsf(x);
  const u32 code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return (u8)(code | ((__float_as_uint(x) >> 28) & 8u));
}

// ---------------------------------------------------------------- UE8M0
__device__ __forceinline__ float ue8m0_decode(u8 b) {
  return b == 255 ? __uint_as_float(0x7fc00000u) : pow2((int)b - 127);
}
// The factor of a scale byte the kernels have checked (1..254; 0 gives 0): one shift.
__device__ __forceinline__ float ue8m0_float(u32 b) { return __uint_as_float(b << 23); }

// Biased exponent of |s| rounded up to a power of two, unclamped (0 for 0, 255 for >= 2^127 / non-finite).
__device__ __forceinline__ u32 ceil_biased_exponent(float s) {
  const u32 bits = __float_as_uint(s) & 0x7fffffffu, e = bits >> 23;
  if (e == 0xff) return 0xff;
  return min(e + ((bits & 0x7fffffu) != 0u), 0xffu);
}

// ceil-UE8M0 of s, clamped to [1, 254].
__device__ __forceinline__ u8 ue8m0_ceil(float s) { return (u8)min(max(ceil_biased_exponent(s), 1u), 254u); }

// ---------------------------------------------------------------- quantizers (one group per call)
constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;
constexpr float kAmaxFloor = 1e-4f;

// The UE8M0 byte of an activation group whose largest magnitude is `amax` (a NaN channel counts
// as none, as fmaxf and the host's f32::max skip it).
__device__ __forceinline__ u8 act_group_scale(float amax) { return ue8m0_ceil(fmaxf(amax, kAmaxFloor) / kE4m3Max); }

// Activations: G channels -> G E4M3 codes, returns the UE8M0 byte.
template <int G>
__device__ __forceinline__ u8 quantize_act_group(const float* x, u8* q) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < G; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const u8 sf = act_group_scale(amax);
  const float inv = pow2(127 - (int)sf);
#pragma unroll
  for (int i = 0; i < G; ++i) q[i] = e4m3_encode(x[i] * inv);
  return sf;
}

// MXFP4 weights: 32 values along K -> 16 packed bytes (element 2i in the low nibble), returns the byte.
__device__ __forceinline__ u8 quantize_fp4_block(const float* w, u8* packed) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(w[i]));
  const u8 sf = ue8m0_ceil(fmaxf(amax, kAmaxFloor) / kE2m1Max);
  const float inv = pow2(127 - (int)sf);
#pragma unroll
  for (int i = 0; i < 16; ++i)
    packed[i] = (u8)(e2m1_encode(w[2 * i] * inv) | (e2m1_encode(w[2 * i + 1] * inv) << 4));
  return sf;
}

// L1-output re-quantizer: no amax floor, reciprocal multiply, unclamped exponent; all-zero -> byte 0.
template <int G>
__device__ __forceinline__ u8 requantize_group(const float* h, u8* q) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < G; ++i) amax = fmaxf(amax, fabsf(h[i]));
  const u32 biased = ceil_biased_exponent(amax * (1.0f / kE4m3Max));
  const float inv = pow2(127 - (int)biased);
#pragma unroll
  for (int i = 0; i < G; ++i) q[i] = e4m3_encode(h[i] * inv);
  return (u8)biased;
}

// ---------------------------------------------------------------- E2M1 -> E4M3 register decode
// E2M1 * 2^d is exact in E4M3 for d in [-8, 6]. The GEMM decodes eight weights at a time from one
// 32-bit word laid out by the weight transform ("sign-split" layout): bits [4i, 4i+3) hold the
// magnitude code of element i, the sign of element i (i < 4) sits at bit 8i+7 and the sign of
// element 4+i at bit 8i+3. Then one prmt per four elements gathers magnitudes from an 8-entry
// table and the signs land on bit 7 of each byte with one mask.

// The 8-entry magnitude table for offset d: bytes of E4M3(v * 2^d) for v = 0 .5 1 1.5 | 2 3 4 6.
struct __align__(8) E4m3Table { u32 lo, hi; };

// d = nibble - 8 >= -5 (fold::MIN_NORMAL_OFFSET): every nonzero entry stays normal, so the table
// is the d = 0 one with d added to each exponent field (entry 0 stays 0): two multiply-adds.
__device__ __forceinline__ E4m3Table e4m3_table_normal(u32 nibble) {
  // 0x3c383000 + (nibble - 8) * 0x08080800 and 0x4c484440 + (nibble - 8) * 0x08080808, mod 2^32.
  return {nibble * 0x08080800u + 0xfbf7f000u, nibble * 0x08080808u + 0x0c080400u};
}

__device__ __forceinline__ E4m3Table e4m3_table(int d) {
  if (d >= -5) return e4m3_table_normal((u32)(d + 8));
  // Below, small entries are E4M3 subnormals: encode each one exactly.
  const float s = pow2(d);
  return {(u32)e4m3_encode(0.5f * s) << 8 | (u32)e4m3_encode(s) << 16 | (u32)e4m3_encode(1.5f * s) << 24,
          (u32)e4m3_encode(2.0f * s) | (u32)e4m3_encode(3.0f * s) << 8 | (u32)e4m3_encode(4.0f * s) << 16 |
              (u32)e4m3_encode(6.0f * s) << 24};
}

// One sign-split word (8 weights) -> E4M3 bytes of elements 0..3 (lo) and 4..7 (hi). prmt reads only
// the low 16 bits of its selector, so one mask serves both halves, and the two shifts are integer
// multiplies: five ALU-pipe operations per word (masks, lookups, sign merges), two on the FMA pipe.
__device__ __forceinline__ void e2m1x8_to_e4m3(u32 w, E4m3Table t, u32& lo, u32& hi) {
  const u32 magnitudes = w & 0x77777777u;
  lo = prmt(t.lo, t.hi, magnitudes) | (w & 0x80808080u);
  hi = prmt(t.lo, t.hi, __umulhi(magnitudes, 0x10000u)) | ((w * 16u) & 0x80808080u);
}

// Host-layout helper for tests and transforms: eight E2M1 codes (code i = element i) -> sign-split word.
__device__ __forceinline__ u32 sign_split_word(const u8* codes) {
  u32 w = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w |= (u32)(codes[i] & 7) << (4 * i) | (u32)(codes[4 + i] & 7) << (16 + 4 * i);
    w |= (u32)((codes[i] >> 3) & 1) << (8 * i + 7) | (u32)((codes[4 + i] >> 3) & 1) << (8 * i + 3);
  }
  return w;
}

}  // namespace fp
}  // namespace mm
