//! Shared by the golden-vector and GPU twin tests: the input stream of `scripts/golden_fp.py`
//! (splitmix64 over four kinds of values; `cuda/twin_test.cu` has the device copy) and the BF16
//! bit pattern with NaN payloads made canonical.
#![allow(dead_code)] // each test binary uses its own subset

use fp_formats::bf16;

pub fn splitmix64(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add((index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn input(seed: u64, index: u64) -> f32 {
    let z = splitmix64(seed, index);
    let (mode, sign) = (z & 3, (z >> 2) & 1);
    let pick = z >> 26;
    let exp = if mode == 2 {
        -3 + (pick % 7) as i64
    } else {
        -12 + (pick % 22) as i64
    };
    let mant = if mode == 3 {
        ((z >> 3) & 0x1f) << 18
    } else {
        (z >> 3) & 0x7f_ffff
    };
    let bits = if mode == 0 {
        z >> 32
    } else {
        (sign << 31) | (((exp + 127) as u64) << 23) | mant
    };
    f32::from_bits(bits as u32)
}

pub fn bf16_bits(x: f32) -> u16 {
    if x.is_nan() {
        ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7fc0
    } else {
        bf16::from_f32(x).to_bits()
    }
}
