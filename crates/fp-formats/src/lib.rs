//! `fp-formats` owns the bit-exact narrow number formats of the numeric contract (DESIGN §1):
//! FP8 E4M3 (the `fn` variant), FP4 E2M1, UE8M0 scale bytes and BF16 rounding, their packing,
//! and the three quantizers (activations per G channels, MXFP4 weights per 32 along K, the
//! L1-output re-quantizer). `cuda/fp_formats.cuh` is the device twin; both must agree bit for bit.

pub mod e2m1;
pub mod e4m3;
pub mod fold;
pub mod pack;
pub mod quant;
pub mod ue8m0;

pub use half::bf16;
pub use quant::{Recipe, TieMode};

/// The device twin of this crate, for the JIT's in-memory include tree.
pub const CUDA_HEADER: (&str, &str) = ("fp_formats.cuh", include_str!("../cuda/fp_formats.cuh"));
/// Kernels that exercise every device function over every code and random values (GPU twin test).
pub const TWIN_TEST_SOURCE: (&str, &str) = ("twin_test.cu", include_str!("../cuda/twin_test.cu"));

/// Rounds an f32 to the nearest BF16 (ties to even) and widens it back. NaN stays NaN.
#[inline]
pub fn bf16_rn(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// 2^k as an f32, exact for every k in [-149, 127] (subnormal powers included).
#[inline]
pub fn pow2(k: i32) -> f32 {
    assert!((-149..=127).contains(&k), "2^{k} is not an f32");
    if k >= -126 {
        f32::from_bits(((k + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (k + 149))
    }
}

/// Round-to-nearest-even of a finite, non-negative `x` onto a binary grid with `mantissa_bits`
/// fraction bits and smallest normal exponent `min_exp` (subnormals below it). Returns the
/// rounded value, which may be one binade above `x` and is not yet range-limited.
#[inline]
pub(crate) fn round_to_grid(x: f32, mantissa_bits: i32, min_exp: i32, tie: TieMode) -> f32 {
    debug_assert!(x >= 0.0 && x.is_finite());
    if x == 0.0 {
        return 0.0;
    }
    // floor(log2 x) from the bits; f32 subnormals are far below every grid we use.
    let exp = ((x.to_bits() >> 23) & 0xff) as i32 - 127;
    let quantum_exp = exp.max(min_exp) - mantissa_bits;
    // Scaling by powers of two is exact here: the scaled value sits below 2^(mantissa_bits+1).
    let scaled = x * pow2(-quantum_exp);
    // Adding and removing 2^23 rounds to an integer with the FPU's ties-to-even (0 <= scaled < 2^23);
    // `round_ties_even` would be a libm call on baseline x86-64.
    const MAGIC: f32 = 8_388_608.0;
    let rounded = match tie {
        TieMode::NearestEven => (scaled + MAGIC) - MAGIC,
        TieMode::TowardZero => {
            let floor = scaled.floor();
            if scaled - floor > 0.5 {
                floor + 1.0
            } else {
                floor
            }
        }
    };
    rounded * pow2(quantum_exp)
}
