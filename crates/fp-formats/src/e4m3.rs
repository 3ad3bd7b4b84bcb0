//! FP8 E4M3 in its `fn` variant (OCP FP8, `__nv_fp8_e4m3`): bias 7, no infinities, max ±448,
//! NaN = 0x7f / 0xff, subnormals down to 2^-9.

use crate::{TieMode, round_to_grid};

/// Largest finite magnitude.
pub const MAX: f32 = 448.0;
/// The canonical NaN code (sign bit clear).
pub const NAN: u8 = 0x7f;

/// Decodes one E4M3 code; 0x7f and 0xff give NaN.
#[inline]
pub fn decode(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((code >> 3) & 0xf) as i32;
    let man = (code & 0x7) as f32;
    if exp == 0xf && code & 0x7 == 0x7 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man * crate::pow2(-9)
    } else {
        (1.0 + man / 8.0) * crate::pow2(exp - 7)
    };
    sign * mag
}

/// Encodes with round-to-nearest-even and saturation to ±448 (PTX `cvt.rn.satfinite.e4m3x2.f32`):
/// infinities saturate, NaN gives 0x7f with the input's sign bit.
#[inline]
pub fn encode(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    if x.is_nan() {
        return NAN | sign;
    }
    let mag = x.abs();
    if mag >= MAX {
        return 0x7e | sign;
    }
    let q = round_to_grid(mag, 3, -6, TieMode::NearestEven);
    sign | bits_of_grid_value(q)
}

/// Code of a non-negative value that is already on the E4M3 grid and ≤ 448.
#[inline]
fn bits_of_grid_value(q: f32) -> u8 {
    if q == 0.0 {
        return 0;
    }
    if q > MAX {
        return 0x7e;
    }
    let exp = ((q.to_bits() >> 23) & 0xff) as i32 - 127;
    if exp < -6 {
        // Subnormal: q = man · 2^-9.
        (q * crate::pow2(9)) as u8
    } else {
        let man = ((q.to_bits() >> 20) & 0x7) as u8;
        (((exp + 7) as u8) << 3) | man
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for code in 0..=255u8 {
            let v = decode(code);
            if code & 0x7f == 0x7f {
                assert!(v.is_nan(), "{code:#04x}");
                assert_eq!(
                    encode(v.copysign(if code & 0x80 != 0 { -1.0 } else { 1.0 })),
                    code
                );
                continue;
            }
            assert_eq!(encode(v), code, "code {code:#04x} decodes to {v}");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(decode(0x7e), 448.0);
        assert_eq!(decode(0x01), 2f32.powi(-9));
        assert_eq!(decode(0x08), 2f32.powi(-6));
        assert_eq!(decode(0x38), 1.0);
        assert_eq!(decode(0xb8), -1.0);
        assert_eq!(encode(f32::INFINITY), 0x7e);
        assert_eq!(encode(f32::NEG_INFINITY), 0xfe);
        assert_eq!(encode(1e30), 0x7e);
        assert_eq!(encode(-0.0), 0x80);
    }

    /// Every midpoint between neighbouring codes rounds to the even one; one ulp (of f32) either
    /// side rounds to the nearer code.
    #[test]
    fn every_rounding_boundary() {
        for code in 0..0x7eu8 {
            let (lo, hi) = (decode(code), decode(code + 1));
            let mid = (lo + hi) / 2.0; // exact: both on a grid far coarser than f32's
            let even = if code % 2 == 0 { code } else { code + 1 };
            assert_eq!(
                encode(mid),
                even,
                "midpoint of {code:#04x}/{:#04x}",
                code + 1
            );
            assert_eq!(encode(mid.next_down()), code);
            assert_eq!(encode(mid.next_up()), code + 1);
            assert_eq!(encode(-mid), even | 0x80);
        }
        // Above the largest code: everything saturates, including the would-be midpoint 464.
        assert_eq!(encode(464.0), 0x7e);
        assert_eq!(encode(448.0f32.next_up()), 0x7e);
        // Below the smallest subnormal: half of 2^-9 is a tie to zero (even), above it rounds up.
        assert_eq!(encode(2f32.powi(-10)), 0x00);
        assert_eq!(encode(2f32.powi(-10).next_up()), 0x01);
    }
}
