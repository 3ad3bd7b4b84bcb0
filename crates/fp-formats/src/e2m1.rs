//! FP4 E2M1 (OCP MX): sign, 2 exponent bits (bias 1), 1 mantissa bit; the values
//! 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. No NaN or infinity; encoding saturates.

use crate::TieMode;

/// Largest finite magnitude.
pub const MAX: f32 = 6.0;

const VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Decodes the low nibble of `code`.
#[inline]
pub fn decode(code: u8) -> f32 {
    let mag = VALUES[(code & 0x7) as usize];
    if code & 0x8 != 0 { -mag } else { mag }
}

/// Encodes with round-to-nearest-even and saturation to ±6. The sign of zero is kept.
/// NaN has no E2M1 code: callers validate their input (the weight quantizer refuses it).
#[inline]
pub fn encode(x: f32) -> u8 {
    encode_with(x, TieMode::NearestEven)
}

/// Encodes with the given tie rule (see [`TieMode`]). Each threshold is the midpoint between two
/// neighbouring codes; under round-to-nearest-even a tie goes up exactly where the upper code is
/// even (`>=`), under `TowardZero` never (`>`).
#[inline]
pub fn encode_with(x: f32, tie: TieMode) -> u8 {
    debug_assert!(!x.is_nan(), "E2M1 has no NaN");
    let sign = if x.is_sign_negative() { 0x8 } else { 0 };
    let a = x.abs();
    let even_up = tie == TieMode::NearestEven;
    let code = u8::from(a > 0.25)
        + u8::from(a > 0.75 || (even_up && a == 0.75))
        + u8::from(a > 1.25)
        + u8::from(a > 1.75 || (even_up && a == 1.75))
        + u8::from(a > 2.5)
        + u8::from(a > 3.5 || (even_up && a == 3.5))
        + u8::from(a > 5.0);
    // DeepGEMM's helper drops the sign of a zero code; keep it under its tie mode only.
    if code == 0 && tie == TieMode::TowardZero {
        0
    } else {
        sign | code
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for code in 0..16u8 {
            assert_eq!(encode(decode(code)), code, "code {code}");
        }
    }

    #[test]
    fn every_rounding_boundary() {
        for code in 0..7u8 {
            let (lo, hi) = (decode(code), decode(code + 1));
            let mid = (lo + hi) / 2.0;
            let even = if code % 2 == 0 { code } else { code + 1 };
            assert_eq!(encode(mid), even, "midpoint {mid}");
            assert_eq!(encode(-mid), even | 0x8);
            assert_eq!(encode(mid.next_down()), code);
            assert_eq!(encode(mid.next_up()), code + 1);
            assert_eq!(
                encode_with(mid, TieMode::TowardZero),
                code,
                "tie toward zero at {mid}"
            );
        }
        assert_eq!(encode(7.0), 0x7);
        assert_eq!(encode(-1e9), 0xf);
        assert_eq!(encode(f32::INFINITY), 0x7);
    }
}
