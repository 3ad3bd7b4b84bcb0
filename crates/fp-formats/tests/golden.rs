//! 10^6 f32 values encoded to E4M3, E2M1 and BF16, bit-identical to the `ml_dtypes` package.
//! `scripts/golden_fp.py` draws the same inputs (splitmix64, re-implemented below) and writes
//! the BLAKE3 of each output stream plus its first values to `data/golden_fp.json`.

mod common;

use common::{bf16_bits, input};
use fp_formats::{e2m1, e4m3};

const GOLDEN: &str = include_str!("data/golden_fp.json");

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
