//! Comparison metrics for outputs: DeepGEMM's `calc_diff` and the largest absolute error,
//! both in f64, plus the acceptance verdict used by `megamoe check`.

/// `1 − 2Σ(a·b) / Σ(a² + b²)` in f64: 0 for identical data, scale-free. Two all-zero inputs
/// are identical (0). NaN anywhere gives NaN.
pub fn calc_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(
        a.len(),
        b.len(),
        "calc_diff of {} vs {} values",
        a.len(),
        b.len()
    );
    let (mut dot, mut norms) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        dot += x * y;
        norms += x * x + y * y;
    }
    if norms == 0.0 && dot == 0.0 {
        0.0
    } else {
        1.0 - 2.0 * dot / norms
    }
}

/// The largest `|a − b|` in f64 (NaN if either side has a NaN; 0 for empty data).
pub fn max_abs_error(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(
        a.len(),
        b.len(),
        "max_abs_error of {} vs {} values",
        a.len(),
        b.len()
    );
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs())
        .fold(0f64, |m, d| {
            if d.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(d)
            }
        })
}

/// Both metrics of one comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    pub calc_diff: f64,
    pub max_abs_error: f64,
    /// Elements compared.
    pub len: usize,
}

impl Comparison {
    pub fn of(a: &[f32], b: &[f32]) -> Comparison {
        Comparison {
            calc_diff: calc_diff(a, b),
            max_abs_error: max_abs_error(a, b),
            len: a.len(),
        }
    }

    /// Accepted when `calc_diff ≤ tol` and nothing is NaN.
    pub fn passes(&self, tol: f64) -> bool {
        self.calc_diff <= tol && !self.max_abs_error.is_nan()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values() {
        assert_eq!(calc_diff(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert_eq!(calc_diff(&[1.0, 0.0], &[-1.0, 0.0]), 2.0);
        assert_eq!(calc_diff(&[1.0, 0.0], &[0.0, 1.0]), 1.0);
        assert_eq!(calc_diff(&[0.0; 3], &[0.0; 3]), 0.0);
        assert_eq!(calc_diff(&[], &[]), 0.0);
        // 1 − 2·2/(1+4) = 0.2
        assert!((calc_diff(&[1.0], &[2.0]) - 0.2).abs() < 1e-15);
        assert_eq!(max_abs_error(&[1.0, -3.0], &[1.5, 0.0]), 3.0);
        assert!(max_abs_error(&[f32::NAN, 1.0], &[0.0, 1.0]).is_nan());
        assert!(!Comparison::of(&[f32::NAN], &[0.0]).passes(1.0));
    }

    proptest! {
        #[test]
        fn calc_diff_is_symmetric_scale_free_and_bounded(
            pairs in proptest::collection::vec((-1e3f32..1e3, -1e3f32..1e3), 1..64),
            scale in 1e-3f32..1e3,
        ) {
            let (a, b): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
            let d = calc_diff(&a, &b);
            prop_assert!((0.0..=2.0).contains(&d));
            prop_assert!((d - calc_diff(&b, &a)).abs() < 1e-12);
            let sa: Vec<f32> = a.iter().map(|v| v * scale).collect();
            let sb: Vec<f32> = b.iter().map(|v| v * scale).collect();
            prop_assert!((d - calc_diff(&sa, &sb)).abs() < 1e-5);
        }
    }
}
