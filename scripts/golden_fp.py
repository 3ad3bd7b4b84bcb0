#!/usr/bin/env python3
"""Golden vectors for fp-formats, from an independent implementation (the `ml_dtypes` package).

Inputs are 10^6 f32 values drawn by splitmix64 (re-implemented in crates/fp-formats/tests/golden.rs),
mixing raw random bit patterns (NaN, Inf, subnormals), values spread over the E4M3 and E2M1 ranges,
and values with short mantissas (many exact ties). Outputs are hashed with BLAKE3 so the file stays
small; the first values of each stream are kept verbatim to point at the first mismatch.

Usage: pip install numpy ml_dtypes blake3 && python3 scripts/golden_fp.py > crates/fp-formats/tests/data/golden_fp.json
"""
import json

import blake3
import ml_dtypes
import numpy as np

SEED = 0x5EED_F00D
COUNT = 1_000_000
SAMPLES = 4096
M64 = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def splitmix64(index):
    with np.errstate(over="ignore"):
        z = np.uint64(SEED) + (index + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & M64


def inputs():
    z = splitmix64(np.arange(COUNT, dtype=np.uint64))
    mode = z & np.uint64(3)
    sign = (z >> np.uint64(2)) & np.uint64(1)
    mant = (z >> np.uint64(3)) & np.uint64(0x7FFFFF)
    pick = z >> np.uint64(26)
    e4m3_exp = np.int64(-12) + (pick % np.uint64(22)).astype(np.int64)  # 2^-12 .. 2^9
    e2m1_exp = np.int64(-3) + (pick % np.uint64(7)).astype(np.int64)  # 2^-3 .. 2^3
    short_mant = ((z >> np.uint64(3)) & np.uint64(0x1F)) << np.uint64(18)
    exp = np.where(mode == 2, e2m1_exp, e4m3_exp)
    mant = np.where(mode == 3, short_mant, mant)
    built = (sign << np.uint64(31)) | ((exp + 127).astype(np.uint64) << np.uint64(23)) | mant
    raw = z >> np.uint64(32)
    bits = np.where(mode == 0, raw, built).astype(np.uint32)
    return bits.view(np.float32)


def main():
    x = inputs()
    finite = np.nan_to_num(x, nan=0.0)  # E2M1 has no NaN: both sides map NaN inputs to 0 first
    e4m3 = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    e2m1 = finite.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    bf16 = x.astype(ml_dtypes.bfloat16).view(np.uint16).copy()
    # NaN payloads are not part of the contract: canonicalize to the quiet NaN with the input's sign.
    nan = np.isnan(x)
    bf16[nan] = (x.view(np.uint32)[nan] >> 16).astype(np.uint16) & 0x8000 | 0x7FC0
    streams = {"e4m3": e4m3.tobytes(), "e2m1": e2m1.tobytes(), "bf16": bf16.astype("<u2").tobytes()}
    out = {
        "generator": f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}",
        "seed": SEED,
        "count": COUNT,
        "input_blake3": blake3.blake3(x.view(np.uint32).astype("<u4").tobytes()).hexdigest(),
        "blake3": {k: blake3.blake3(v).hexdigest() for k, v in streams.items()},
        "first": {
            "e4m3": e4m3[:SAMPLES].tobytes().hex(),
            "e2m1": e2m1[:SAMPLES].tobytes().hex(),
            "bf16": bf16[:SAMPLES].astype("<u2").tobytes().hex(),
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
