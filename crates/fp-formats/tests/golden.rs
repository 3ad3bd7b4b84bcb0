//! 10^6 f32 values encoded to E4M3, E2M1 and BF16, bit-identical to the `ml_dtypes` package.
//! `scripts/golden_fp.py` draws the same inputs (splitmix64, re-implemented below) and writes
//! the BLAKE3 of each output stream plus its first values to `data/golden_fp.json`.

use fp_formats::{bf16, e2m1, e4m3};

const GOLDEN: &str = include_str!("data/golden_fp.json");

fn splitmix64(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add((index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn input(seed: u64, index: u64) -> f32 {
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

fn bf16_bits(x: f32) -> u16 {
    if x.is_nan() {
        ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7fc0
    } else {
        bf16::from_f32(x).to_bits()
    }
}

fn check_stream(golden: &serde_json::Value, name: &str, bytes: &[u8]) {
    let want_hash = golden["blake3"][name].as_str().unwrap();
    let first = hex_decode(golden["first"][name].as_str().unwrap());
    if let Some(i) = first.iter().zip(bytes).position(|(a, b)| a != b) {
        panic!(
            "{name}: first mismatch at byte {i}: ml_dtypes {:#04x}, ours {:#04x}",
            first[i], bytes[i]
        );
    }
    assert_eq!(
        blake3::hash(bytes).to_hex().as_str(),
        want_hash,
        "{name}: stream differs past the kept samples"
    );
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn million_values_match_ml_dtypes() {
    let golden: serde_json::Value = serde_json::from_str(GOLDEN).unwrap();
    let seed = golden["seed"].as_u64().unwrap();
    let count = golden["count"].as_u64().unwrap();
    let xs: Vec<f32> = (0..count).map(|i| input(seed, i)).collect();
    let input_bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    assert_eq!(
        blake3::hash(&input_bytes).to_hex().as_str(),
        golden["input_blake3"].as_str().unwrap(),
        "inputs differ from the script's"
    );

    let e4m3: Vec<u8> = xs.iter().map(|&x| e4m3::encode(x)).collect();
    let e2m1: Vec<u8> = xs
        .iter()
        .map(|&x| e2m1::encode(if x.is_nan() { 0.0 } else { x }))
        .collect();
    let bf: Vec<u8> = xs
        .iter()
        .flat_map(|&x| bf16_bits(x).to_le_bytes())
        .collect();
    check_stream(&golden, "e4m3", &e4m3);
    check_stream(&golden, "e2m1", &e2m1);
    check_stream(&golden, "bf16", &bf);
}
