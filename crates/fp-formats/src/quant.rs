//! The quantizers of DESIGN §1: activations (FP8 E4M3 with one UE8M0 scale per G channels),
//! MXFP4 weights (E2M1 with one UE8M0 scale per 32 along K) and the L1-output re-quantizer.
//! Every function works on row-major data, one row at a time, so callers can parallelize rows.

use crate::{e2m1, e4m3, pack, pow2, ue8m0};

/// The activation-scale recipe: how many channels share one UE8M0 scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Recipe {
    /// G = 32: DeepGEMM's SM100 recipe `(1,1,32)`; exact on Hopper through BF16 WGMMA.
    #[serde(rename = "mx32")]
    Mx32,
    /// G = 128: the Hopper-fast recipe: FP8 WGMMA with one promotion per k128 is possible (fast, but
    /// Hopper's FP8 tensor core does not accumulate in full FP32); exact through BF16 WGMMA.
    #[serde(rename = "g128")]
    G128,
}

impl Recipe {
    /// Channels per activation scale.
    pub const fn group(self) -> usize {
        match self {
            Recipe::Mx32 => 32,
            Recipe::G128 => 128,
        }
    }

    /// The recipe whose group is `g`, if any.
    pub fn from_group(g: usize) -> Option<Recipe> {
        match g {
            32 => Some(Recipe::Mx32),
            128 => Some(Recipe::G128),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Recipe::Mx32 => "mx32",
            Recipe::G128 => "g128",
        }
    }
}

impl std::fmt::Display for Recipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Recipe {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mx32" => Ok(Recipe::Mx32),
            "g128" => Ok(Recipe::G128),
            _ => Err(format!("unknown recipe `{s}` (expected mx32 or g128)")),
        }
    }
}

/// How the E2M1 weight encoder breaks exact ties.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TieMode {
    /// Round half to even (OCP MX, PTX `cvt.rn`): the contract's rule.
    #[default]
    NearestEven,
    /// Ties go to the smaller magnitude, reproducing DeepGEMM's `per_token_cast_to_fp4` helper.
    TowardZero,
}

/// Weight block along K that shares one UE8M0 scale.
pub const WEIGHT_BLOCK: usize = 32;
/// Floor under an activation or weight block's amax before its scale is chosen.
pub const AMAX_FLOOR: f32 = 1e-4;

/// Quantizes one activation row: per `g` channels, `sf = ceil-UE8M0(max(amax,1e-4)/448)`,
/// `q = e4m3(x / 2^sf)`. Writes `q` (len = row len) and `sf` (len = row len / g).
pub fn quantize_act_row(x: &[f32], g: usize, q: &mut [u8], sf: &mut [u8]) {
    assert_eq!(
        x.len() % g,
        0,
        "row of {} channels is not a multiple of the group {g}",
        x.len()
    );
    assert_eq!(q.len(), x.len());
    assert_eq!(sf.len(), x.len() / g);
    for ((xs, qs), s) in x
        .chunks_exact(g)
        .zip(q.chunks_exact_mut(g))
        .zip(sf.iter_mut())
    {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs())).max(AMAX_FLOOR);
        *s = ue8m0::ceil_from(amax / e4m3::MAX);
        let inv = pow2(-ue8m0::exponent(*s));
        for (qv, &xv) in qs.iter_mut().zip(xs) {
            *qv = e4m3::encode(xv * inv);
        }
    }
}

/// Quantizes one weight row to packed E2M1 (len = K/2) with one UE8M0 per 32 along K
/// (len = K/32): `sf = ceil-UE8M0(max(amax,1e-4)/6)`, `q = e2m1(w / 2^sf)`.
pub fn quantize_fp4_row(w: &[f32], tie: TieMode, packed: &mut [u8], sf: &mut [u8]) {
    let k = w.len();
    assert_eq!(
        k % WEIGHT_BLOCK,
        0,
        "weight row of {k} is not a multiple of {WEIGHT_BLOCK}"
    );
    assert_eq!(packed.len(), k / 2);
    assert_eq!(sf.len(), k / WEIGHT_BLOCK);
    let mut codes = [0u8; WEIGHT_BLOCK];
    for (blk, s) in sf.iter_mut().enumerate() {
        let ws = &w[blk * WEIGHT_BLOCK..][..WEIGHT_BLOCK];
        let amax = ws.iter().fold(0f32, |m, v| m.max(v.abs())).max(AMAX_FLOOR);
        *s = ue8m0::ceil_from(amax / e2m1::MAX);
        let inv = pow2(-ue8m0::exponent(*s));
        for (c, &wv) in codes.iter_mut().zip(ws) {
            *c = e2m1::encode_with(wv * inv, tie);
        }
        packed[blk * WEIGHT_BLOCK / 2..][..WEIGHT_BLOCK / 2]
            .copy_from_slice(&pack::pack_e2m1(&codes));
    }
}

/// Re-quantizes one row of the L1 output `h` per `g` channels (DESIGN §1 step 3): no amax
/// floor, `e = ceil-exponent(amax · (1/448))` unclamped, `q = e4m3(h · 2^−e)`, byte `e + 127`.
/// An all-zero group gets byte 0 and zero codes.
pub fn requantize_row(h: &[f32], g: usize, q: &mut [u8], sf: &mut [u8]) {
    assert_eq!(
        h.len() % g,
        0,
        "row of {} channels is not a multiple of the group {g}",
        h.len()
    );
    assert_eq!(q.len(), h.len());
    assert_eq!(sf.len(), h.len() / g);
    const INV_MAX: f32 = 1.0 / e4m3::MAX;
    for ((hs, qs), s) in h
        .chunks_exact(g)
        .zip(q.chunks_exact_mut(g))
        .zip(sf.iter_mut())
    {
        let amax = hs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let biased = ue8m0::ceil_biased_exponent(amax * INV_MAX);
        assert!(biased < 255, "L1 output amax {amax} has no UE8M0 scale");
        *s = biased as u8;
        let inv = pow2(127 - biased as i32);
        for (qv, &hv) in qs.iter_mut().zip(hs) {
            *qv = e4m3::encode(hv * inv);
        }
    }
}

/// Dequantizes one FP8 row with its UE8M0 scales per `g` channels.
pub fn dequantize_act_row(q: &[u8], sf: &[u8], g: usize, out: &mut [f32]) {
    assert_eq!(q.len(), sf.len() * g);
    for ((qs, &s), os) in q.chunks_exact(g).zip(sf).zip(out.chunks_exact_mut(g)) {
        let scale = ue8m0::decode(s);
        for (o, &c) in os.iter_mut().zip(qs) {
            *o = e4m3::decode(c) * scale;
        }
    }
}

/// Dequantizes one packed-E2M1 weight row with its UE8M0 scales per 32.
pub fn dequantize_fp4_row(packed: &[u8], sf: &[u8], out: &mut [f32]) {
    assert_eq!(out.len(), packed.len() * 2);
    assert_eq!(sf.len() * WEIGHT_BLOCK, out.len());
    for (i, o) in out.iter_mut().enumerate() {
        *o = e2m1::decode(pack::e2m1_at(packed, i)) * ue8m0::decode(sf[i / WEIGHT_BLOCK]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_scale_covers_amax() {
        let x: Vec<f32> = (0..128).map(|i| ((i as f32) - 60.0) * 0.37).collect();
        for g in [32, 128] {
            let (mut q, mut sf) = (vec![0; 128], vec![0; 128 / g]);
            quantize_act_row(&x, g, &mut q, &mut sf);
            let mut back = vec![0f32; 128];
            dequantize_act_row(&q, &sf, g, &mut back);
            for (chunk, &s) in x.chunks(g).zip(&sf) {
                let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = ue8m0::decode(s);
                assert!(
                    amax / scale <= 448.0 && amax / scale > 224.0,
                    "g={g} amax={amax} scale={scale}"
                );
            }
            for (a, b) in x.iter().zip(&back) {
                assert!((a - b).abs() <= a.abs() / 16.0 + 1e-6, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn all_zero_blocks() {
        let (mut q, mut sf) = (vec![1; 32], vec![9; 1]);
        quantize_act_row(&[0.0; 32], 32, &mut q, &mut sf);
        assert_eq!(sf[0], ue8m0::ceil_from(1e-4 / 448.0));
        assert!(q.iter().all(|&c| c == 0));
        requantize_row(&[0.0; 32], 32, &mut q, &mut sf);
        assert_eq!((sf[0], q[0]), (0, 0));
        let (mut p, mut wsf) = (vec![1; 16], vec![0; 1]);
        quantize_fp4_row(&[0.0; 32], TieMode::NearestEven, &mut p, &mut wsf);
        assert!(p.iter().all(|&c| c == 0));
    }

    #[test]
    fn requant_uses_reciprocal_multiply() {
        // amax = 448·(1+2^-23): amax/448 is just above 1, amax·fl(1/448) rounds to exactly 1 or above;
        // whichever it is, the byte must follow the reciprocal product, not the quotient.
        let amax = 448.0f32.next_up();
        let (mut q, mut sf) = (vec![0; 32], vec![0; 1]);
        let mut h = [0f32; 32];
        h[3] = -amax;
        requantize_row(&h, 32, &mut q, &mut sf);
        assert_eq!(
            sf[0] as u32,
            ue8m0::ceil_biased_exponent(amax * (1.0 / 448.0))
        );
    }

    #[test]
    fn fp4_weights_round_trip_within_half_step() {
        let w: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.013)
            .collect();
        let (mut p, mut sf) = (vec![0; 32], vec![0; 2]);
        quantize_fp4_row(&w, TieMode::NearestEven, &mut p, &mut sf);
        let mut back = vec![0f32; 64];
        dequantize_fp4_row(&p, &sf, &mut back);
        for (blk, s) in sf.iter().enumerate() {
            let scale = ue8m0::decode(*s);
            for i in blk * 32..blk * 32 + 32 {
                assert!((w[i] - back[i]).abs() <= scale, "{} vs {}", w[i], back[i]);
            }
        }
    }
}
