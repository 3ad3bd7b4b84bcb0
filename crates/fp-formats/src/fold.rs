//! The g128 weight fold (DESIGN §1): an E2M1 code times 2^d, d in [-8, 6], is exact in E4M3, so the
//! four per-32 weight scales of a 128-block become offsets from one base, and the GEMM decodes
//! FP4 straight to FP8 in registers. This module is the host twin of that decode and of the
//! "sign-split" word layout it reads (see `cuda/fp_formats.cuh`).

use crate::{e2m1, e4m3};

/// Smallest and largest exponent offset that keeps every E2M1 value exact in E4M3.
pub const MIN_OFFSET: i32 = -8;
pub const MAX_OFFSET: i32 = 6;
/// From this offset up every nonzero E2M1 value times 2^d is a normal E4M3, so the decode table is
/// the d = 0 table with d added to each exponent field: two multiply-adds, no table in memory
/// (`e4m3_table_normal` in `cuda/fp_formats.cuh`).
pub const MIN_NORMAL_OFFSET: i32 = -5;

/// E4M3 code of `decode(code) · 2^d`, exact for `d` in [`MIN_OFFSET`, `MAX_OFFSET`].
pub fn e2m1_to_e4m3(code: u8, d: i32) -> u8 {
    assert!(
        (MIN_OFFSET..=MAX_OFFSET).contains(&d),
        "offset {d} outside [-8, 6]"
    );
    e4m3::encode(e2m1::decode(code) * crate::pow2(d))
}

/// Eight E2M1 codes (code i = element i, sign in bit 3) in the sign-split word layout: bits
/// [4i, 4i+3) hold the magnitude of element i (elements 4..7 from bit 16), the sign of element i < 4
/// sits at bit 8i+7 and that of element 4+i at bit 8i+3.
pub fn sign_split_word(codes: [u8; 8]) -> u32 {
    let mut w = 0u32;
    for i in 0..4 {
        w |= u32::from(codes[i] & 7) << (4 * i) | u32::from(codes[4 + i] & 7) << (16 + 4 * i);
        w |= u32::from(codes[i] >> 3 & 1) << (8 * i + 7)
            | u32::from(codes[4 + i] >> 3 & 1) << (8 * i + 3);
    }
    w
}

/// What the device decode of one sign-split word yields: the E4M3 bytes of elements 0..3 and 4..7.
pub fn decode_sign_split_word(w: u32, d: i32) -> [u8; 8] {
    std::array::from_fn(|i| {
        let (mag_shift, sign_bit) = if i < 4 {
            (4 * i, 8 * i + 7)
        } else {
            (16 + 4 * (i - 4), 8 * (i - 4) + 3)
        };
        let code = ((w >> mag_shift) & 7) as u8 | (((w >> sign_bit) & 1) as u8) << 3;
        e2m1_to_e4m3(code, d)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_is_exact_over_the_offset_range() {
        for d in MIN_OFFSET..=MAX_OFFSET {
            for code in 0..16u8 {
                let want = e2m1::decode(code) * crate::pow2(d);
                assert_eq!(
                    e4m3::decode(e2m1_to_e4m3(code, d)),
                    want,
                    "code {code} d {d}"
                );
            }
        }
    }

    #[test]
    fn sign_split_word_round_trips() {
        let codes = [0x1, 0x9, 0x7, 0xf, 0x0, 0x8, 0x3, 0xc];
        let w = sign_split_word(codes);
        let bytes = decode_sign_split_word(w, 0);
        for (c, b) in codes.iter().zip(bytes) {
            assert_eq!(e4m3::decode(b), e2m1::decode(*c));
        }
    }
}
