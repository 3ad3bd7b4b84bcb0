#!/usr/bin/env python3
"""Independent check of `megamoe run --backend cpu`.

Recomputes y for every rank of a problem directory straight from the numeric contract
(docs DESIGN §1) with numpy + ml_dtypes, and compares it with the y.rank{r}.safetensors that
`megamoe run` wrote: prints calc_diff per rank and exits 1 when any exceeds --tol.

Accumulations are float64 matmuls (exact products, implementation-defined order) rounded once
to float32, as the contract's reference does. Files are read with a small safetensors parser of
its own (the `safetensors` package's numpy loader has no F8_E4M3).

    python scripts/check_reference.py DIR [--tol 1e-5]
"""

import argparse
import json
import pathlib
import sys

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
# E2M1 code -> value: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
E2M1_TABLE = np.concatenate([E2M1_VALUES, -E2M1_VALUES])
E4M3_MAX = np.float32(448.0)


DTYPES = {"U8": np.uint8, "I64": np.int64, "F32": np.float32, "F8_E4M3": E4M3, "BF16": BF16}


def load_file(path):
    """safetensors: u64 LE header length, JSON header {name: {dtype, shape, data_offsets}}, data."""
    raw = pathlib.Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n :]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def scale_of(sf_bytes):
    """UE8M0 byte b -> 2^(b-127) as float64 (255 is NaN)."""
    b = sf_bytes.astype(np.int64)
    return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127))


def deq_fp4(packed, sf):
    """Packed E2M1 (element 2i in the low nibble) [..., K/2] with one scale per 32 -> float64."""
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return E2M1_TABLE[codes] * np.repeat(scale_of(sf), 32, axis=-1)


def deq_fp8(x, sf, group):
    """E4M3 [..., K] with one scale per `group` channels -> float64."""
    return x.astype(np.float64) * np.repeat(scale_of(sf), group, axis=-1)


def bf16_round(a):
    return a.astype(np.float32).astype(BF16).astype(np.float32)


def requantize(h, group):
    """Step 3: per group amax (no floor), e = ceil-exponent(amax * fl32(1/448)) read from the
    float32 bits (biased exponent field, +1 if the mantissa is non-zero), q = e4m3(h * 2^-e)
    with saturation. Returns the float64 value of q * 2^e."""
    rows, width = h.shape
    hg = h.reshape(rows, width // group, group).astype(np.float32)
    amax = np.abs(hg).max(axis=-1)
    s = (amax * np.float32(1.0 / 448.0)).astype(np.float32)
    bits = s.view(np.uint32)
    biased = ((bits >> 23) & 0xFF).astype(np.int64) + ((bits & 0x7FFFFF) != 0)
    assert (biased < 255).all(), "L1 output has no UE8M0 scale"
    e = biased - 127
    scaled = np.ldexp(hg, -e[..., None]).astype(np.float32)
    q = np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(E4M3)
    return (q.astype(np.float64) * np.ldexp(1.0, e)[..., None]).reshape(rows, width)


def silu_glu(acc, intermediate, clamp, topk_weight):
    """Step 2 in float32: bf16 g and u, optional clamp, (silu(g) * u) * w."""
    g = bf16_round(acc[:, :intermediate])
    u = bf16_round(acc[:, intermediate:])
    if clamp is not None:
        c = np.float32(clamp)
        g = np.minimum(g, c)
        u = np.clip(u, -c, c)
    one = np.float32(1.0)
    with np.errstate(over="ignore"):  # exp(-g) = inf for very negative g: silu = -0, as in f32
        silu = (g / (one + np.exp(-g))).astype(np.float32)
    return ((silu * u).astype(np.float32) * topk_weight[:, None].astype(np.float32)).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=pathlib.Path)
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()

    cfg = json.loads((args.dir / "config.json").read_text())
    H, I, E, k, R = (cfg[key] for key in ("hidden", "intermediate", "num_experts", "top_k", "num_ranks"))
    clamp = cfg["clamp"]
    G = cfg.get("act_scale_block", 32)
    E_l = E // R
    print(f"{args.dir}: H={H} I={I} E={E} k={k} R={R} clamp={clamp} G={G}")

    inputs = [load_file(args.dir / f"inputs.rank{r}.safetensors") for r in range(R)]
    # slots[r][j]: the BF16 L2 output of slot j for every token of rank r (float32 values).
    slots = [np.zeros((k, inp["x"].shape[0], H), dtype=np.float32) for inp in inputs]

    for owner in range(R):
        w = load_file(args.dir / f"weights.rank{owner}.safetensors")
        for le in range(E_l):
            expert = owner * E_l + le
            hits = [(r, t, j) for r, inp in enumerate(inputs) for t, j in zip(*np.nonzero(inp["topk_idx"] == expert))]
            if not hits:
                continue
            x = np.stack([deq_fp8(inputs[r]["x"][t], inputs[r]["x_sf"][t], G) for r, t, _ in hits])
            topk_w = np.array([inputs[r]["topk_weights"][t, j] for r, t, j in hits], dtype=np.float32)
            w1 = deq_fp4(w["w1"][le], w["w1_sf"][le])
            acc1 = (x @ w1.T).astype(np.float32)
            h = silu_glu(acc1, I, clamp, topk_w)
            w2 = deq_fp4(w["w2"][le], w["w2_sf"][le])
            out = bf16_round((requantize(h, G) @ w2.T).astype(np.float32))
            for (r, t, j), row in zip(hits, out):
                slots[r][j, t] = row

    worst = 0.0
    for r, inp in enumerate(inputs):
        y = np.zeros((inp["x"].shape[0], H), dtype=np.float32)
        for j in range(k):
            valid = inp["topk_idx"][:, j] >= 0
            y[valid] = (y[valid] + slots[r][j, valid]).astype(np.float32)
        y = bf16_round(y).astype(np.float64)
        got = load_file(args.dir / f"y.rank{r}.safetensors")["y"].astype(np.float64)
        assert got.shape == y.shape, f"rank {r}: y has shape {got.shape}, expected {y.shape}"
        denom = (y * y + got * got).sum()
        diff = 0.0 if denom == 0 else 1.0 - 2.0 * (y * got).sum() / denom
        if np.isnan(got).any():
            diff = float("nan")
        worst = max(worst, diff) if not np.isnan(diff) else float("inf")
        mismatched = int((y != got).sum())
        print(f"rank {r}: T={y.shape[0]} calc_diff {diff:.3e}, max abs error {np.abs(y - got).max(initial=0):.3e}, "
              f"{mismatched}/{y.size} values differ")
    ok = worst <= args.tol
    print(f"worst calc_diff {worst:.3e}: {'PASS' if ok else 'FAIL'} (tol {args.tol:g})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
