//! UE8M0 scale bytes: an unsigned biased exponent, byte b means 2^(b−127); 255 is NaN.

/// The NaN code.
pub const NAN: u8 = 255;

/// Decodes a scale byte to its power of two (255 gives NaN).
#[inline]
pub fn decode(b: u8) -> f32 {
    if b == NAN {
        f32::NAN
    } else {
        crate::pow2(b as i32 - 127)
    }
}

/// The exponent a scale byte stands for, `b − 127`.
#[inline]
pub fn exponent(b: u8) -> i32 {
    b as i32 - 127
}

/// Biased exponent of `s` rounded up to a power of two: the f32 exponent field, plus one when
/// the mantissa is non-zero. Unclamped (0 for s = 0, 255 for s ≥ 2^127 or non-finite).
#[inline]
pub fn ceil_biased_exponent(s: f32) -> u32 {
    let bits = s.abs().to_bits();
    let exp = (bits >> 23) & 0xff;
    if exp == 0xff {
        return 0xff;
    }
    (exp + u32::from(bits & 0x7f_ffff != 0)).min(0xff)
}

/// "ceil-UE8M0 of s" of DESIGN §1: the smallest power of two ≥ s, as a byte clamped to [1, 254].
#[inline]
pub fn ceil_from(s: f32) -> u8 {
    ceil_biased_exponent(s).clamp(1, 254) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for b in 0..=254u8 {
            let v = decode(b);
            assert_eq!(v, 2f64.powi(b as i32 - 127) as f32);
            // 2^-127 (byte 0) is an f32 subnormal, whose field-based ceiling is 1.
            assert_eq!(ceil_biased_exponent(v), (b as u32).max(1), "byte {b}");
            assert_eq!(ceil_from(v), (b).clamp(1, 254));
        }
        assert!(decode(255).is_nan());
    }

    #[test]
    fn rounds_up_between_powers() {
        assert_eq!(ceil_from(1.0), 127);
        assert_eq!(ceil_from(1.0f32.next_up()), 128);
        assert_eq!(ceil_from(2.0f32.next_down()), 128);
        assert_eq!(ceil_from(0.0), 1);
        assert_eq!(ceil_from(f32::MAX), 254);
        assert_eq!(ceil_biased_exponent(0.0), 0);
    }
}
