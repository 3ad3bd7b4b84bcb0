// twin_test.cu -- kernels that run every function of fp_formats.cuh over every code and over
// device-generated random values, so the host test can compare them with the Rust twin bit for bit.
#include "fp_formats.cuh"

using namespace mm::fp;

// The golden-vector input stream (tests/common/mod.rs has the host copy): splitmix64 mixing raw
// bit patterns, values over the E4M3 and E2M1 ranges, and short mantissas (exact ties).
__device__ __forceinline__ float twin_input(unsigned long long seed, unsigned long long i) {
  unsigned long long z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const unsigned long long mode = z & 3, sign = (z >> 2) & 1, pick = z >> 26;
  const long long e = mode == 2 ? -3 + (long long)(pick % 7) : -12 + (long long)(pick % 22);
  const unsigned long long mant = mode == 3 ? ((z >> 3) & 0x1f) << 18 : (z >> 3) & 0x7fffff;
  const unsigned long long bits = mode == 0 ? z >> 32 : (sign << 31) | ((unsigned long long)(e + 127) << 23) | mant;
  return __uint_as_float((u32)bits);
}

// Every code: decodes (as f32 bits) and re-encodes; the fold table for every (d, code).
extern "C" __global__ void twin_all_codes(u32* e4m3_dec, u8* e4m3_enc, u32* e2m1_dec, u8* e2m1_enc, u32* ue8m0_dec,
                                          u8* fold) {
  const int i = threadIdx.x;  // 256 threads
  const float v = e4m3_decode((u8)i);
  e4m3_dec[i] = __float_as_uint(v);
  e4m3_enc[i] = e4m3_encode(v);
  ue8m0_dec[i] = __float_as_uint(ue8m0_decode((u8)i));
  if (i < 16) {
    e2m1_dec[i] = __float_as_uint(e2m1_decode((u8)i));
    e2m1_enc[i] = e2m1_encode(e2m1_decode((u8)i));
  }
  // fold[(d + 8) * 16 + code] through the table + sign-split decode, 15 offsets x 16 codes.
  if (i < 15 * 16) {
    const int d = i / 16 - 8, code = i % 16;
    u8 codes[8] = {(u8)code, 0, 0, 0, (u8)code, 0, 0, 0};
    u32 lo, hi;
    e2m1x8_to_e4m3(sign_split_word(codes), e4m3_table(d), lo, hi);
    fold[i] = (lo & 0xff) == (hi & 0xff) ? (u8)(lo & 0xff) : 0x7f;  // both halves must agree
  }
}

// n random values: E4M3, E2M1 (NaN -> 0 first, as the host test does), ceil exponent, BF16 bits.
// E4M3 by value i's place: e4m3_encode, or its byte of e4m3_encode2 of its pair, or of e4m3_encode4
// of its four (values 8j .. 8j + 7: one, one, a pair, the four of 8j + 4 ..), so each of the three
// meets every kind of value in every byte.
extern "C" __global__ void twin_random(unsigned long long seed, unsigned long long n, u8* e4m3, u8* e2m1, u8* ceil_exp,
                                       unsigned short* bf16) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const float x = twin_input(seed, i);
    const unsigned long long pair = i & ~1ull, quad = i & ~3ull;
    if (i % 8 < 2) {
      e4m3[i] = e4m3_encode(x);
    } else if (i % 8 < 4) {
      e4m3[i] = (u8)(e4m3_encode2(twin_input(seed, pair), twin_input(seed, pair + 1)) >> (8 * (i % 2)));
    } else {
      e4m3[i] = (u8)(e4m3_encode4(twin_input(seed, quad), twin_input(seed, quad + 1), twin_input(seed, quad + 2),
                                  twin_input(seed, quad + 3)) >>
                     (8 * (i % 4)));
    }
    e2m1[i] = e2m1_encode(x != x ? 0.0f : x);
    ceil_exp[i] = (u8)ceil_biased_exponent(x);
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(x));
    bf16[i] = x != x ? (unsigned short)(((__float_as_uint(x) >> 16) & 0x8000u) | 0x7fc0u) : b;
  }
}

// Quantizers, one row of `cols` floats per block-row; thread g handles group g.
// Outputs: act (G=32 and G=128) codes + scales, FP4 packed + scales, re-quantizer (G=32) codes + scales.
extern "C" __global__ void twin_quantizers(const float* x, int rows, int cols, u8* q32, u8* sf32, u8* q128, u8* sf128,
                                           u8* w4, u8* wsf, u8* rq32, u8* rsf32) {
  const int row = blockIdx.x;
  if (row >= rows) return;
  const float* xr = x + (long long)row * cols;
  for (int g = threadIdx.x; g < cols / 32; g += blockDim.x) {
    const long long o = (long long)row * cols + g * 32;
    const long long s = (long long)row * (cols / 32) + g;
    sf32[s] = quantize_act_group<32>(xr + g * 32, q32 + o);
    wsf[s] = quantize_fp4_block(xr + g * 32, w4 + o / 2);
    rsf32[s] = requantize_group<32>(xr + g * 32, rq32 + o);
  }
  for (int g = threadIdx.x; g < cols / 128; g += blockDim.x) {
    const long long o = (long long)row * cols + g * 128;
    sf128[(long long)row * (cols / 128) + g] = quantize_act_group<128>(xr + g * 128, q128 + o);
  }
}

// Random sign-split words through the register decode: out[2i], out[2i+1] = lo, hi of word i.
extern "C" __global__ void twin_fold_words(const u32* words, const int* offsets, u32* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  u32 lo, hi;
  e2m1x8_to_e4m3(words[i], e4m3_table(offsets[i]), lo, hi);
  out[2 * i] = lo;
  out[2 * i + 1] = hi;
}
