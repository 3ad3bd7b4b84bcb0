//! The device twin `cuda/fp_formats.cuh` against this crate, bit for bit, on a GPU: every E4M3,
//! E2M1 and UE8M0 code, the E2M1→E4M3 fold for every (offset, code), 10^7 random values in one
//! launch, and the three quantizers on random rows.

mod common;

use common::{bf16_bits, input};
use cuda_rt::{KernelSpec, LaunchConfig};
use fp_formats::{e2m1, e4m3, fold, quant, ue8m0};
use rand::{Rng, SeedableRng};

fn twin_spec() -> KernelSpec {
    KernelSpec::new("fp-formats/twin_test", fp_formats::TWIN_TEST_SOURCE)
        .header(fp_formats::CUDA_HEADER)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_code_matches_the_host() {
    let (gpu, module) = cuda_rt::testing::gpu_with_module(&twin_spec());
    let mut e4m3_dec = gpu.alloc_zeros::<u32>(256).unwrap();
    let mut e4m3_enc = gpu.alloc_zeros::<u8>(256).unwrap();
    let mut e2m1_dec = gpu.alloc_zeros::<u32>(16).unwrap();
    let mut e2m1_enc = gpu.alloc_zeros::<u8>(16).unwrap();
    let mut ue8m0_dec = gpu.alloc_zeros::<u32>(256).unwrap();
    let mut fold_out = gpu.alloc_zeros::<u8>(15 * 16).unwrap();
    gpu.memset(&mut fold_out, 0xAA).unwrap();
    let kernel = module.kernel("twin_all_codes").unwrap();
    // SAFETY: six buffers of the sizes the kernel writes with 256 threads.
    unsafe {
        kernel
            .launch(gpu.stream(), LaunchConfig::linear(1, 256))
            .ptr_mut(&mut e4m3_dec)
            .ptr_mut(&mut e4m3_enc)
            .ptr_mut(&mut e2m1_dec)
            .ptr_mut(&mut e2m1_enc)
            .ptr_mut(&mut ue8m0_dec)
            .ptr_mut(&mut fold_out)
            .launch()
            .unwrap();
    }
    let (dec, enc) = (
        gpu.download(&e4m3_dec).unwrap(),
        gpu.download(&e4m3_enc).unwrap(),
    );
    for c in 0..=255u8 {
        let host = e4m3::decode(c);
        if host.is_nan() {
            assert!(f32::from_bits(dec[c as usize]).is_nan(), "E4M3 {c:#04x}");
        } else {
            assert_eq!(dec[c as usize], host.to_bits(), "E4M3 decode {c:#04x}");
        }
        assert_eq!(
            enc[c as usize],
            e4m3::encode(f32::from_bits(dec[c as usize])),
            "E4M3 encode {c:#04x}"
        );
    }
    let (dec, enc) = (
        gpu.download(&e2m1_dec).unwrap(),
        gpu.download(&e2m1_enc).unwrap(),
    );
    for c in 0..16u8 {
        assert_eq!(
            dec[c as usize],
            e2m1::decode(c).to_bits(),
            "E2M1 decode {c}"
        );
        assert_eq!(enc[c as usize], c, "E2M1 encode {c}");
    }
    let dec = gpu.download(&ue8m0_dec).unwrap();
    for b in 0..255u8 {
        assert_eq!(dec[b as usize], ue8m0::decode(b).to_bits(), "UE8M0 {b}");
    }
    assert!(f32::from_bits(dec[255]).is_nan());
    let folded = gpu.download(&fold_out).unwrap();
    for d in fold::MIN_OFFSET..=fold::MAX_OFFSET {
        for c in 0..16u8 {
            assert_eq!(
                folded[((d + 8) * 16) as usize + c as usize],
                fold::e2m1_to_e4m3(c, d),
                "fold d={d} code={c}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ten_million_random_values_match_the_host() {
    const N: usize = 10_000_000;
    const SEED: u64 = 0xD1CE_5EED;
    let (gpu, module) = cuda_rt::testing::gpu_with_module(&twin_spec());
    let mut e4m3_out = gpu.alloc_zeros::<u8>(N).unwrap();
    let mut e2m1_out = gpu.alloc_zeros::<u8>(N).unwrap();
    let mut ceil_out = gpu.alloc_zeros::<u8>(N).unwrap();
    let mut bf16_out = gpu.alloc_zeros::<u16>(N).unwrap();
    let kernel = module.kernel("twin_random").unwrap();
    // SAFETY: four outputs of N elements; the kernel writes indices below N only.
    unsafe {
        kernel
            .launch(
                gpu.stream(),
                LaunchConfig::linear(4 * gpu.info().sm_count, 256),
            )
            .scalar(SEED)
            .scalar(N as u64)
            .ptr_mut(&mut e4m3_out)
            .ptr_mut(&mut e2m1_out)
            .ptr_mut(&mut ceil_out)
            .ptr_mut(&mut bf16_out)
            .launch()
            .unwrap();
    }
    let (e4, e2, ce, bf) = (
        gpu.download(&e4m3_out).unwrap(),
        gpu.download(&e2m1_out).unwrap(),
        gpu.download(&ceil_out).unwrap(),
        gpu.download(&bf16_out).unwrap(),
    );
    let mut mismatches = 0usize;
    for i in 0..N {
        let x = input(SEED, i as u64);
        let host = (
            e4m3::encode(x),
            e2m1::encode(if x.is_nan() { 0.0 } else { x }),
            ue8m0::ceil_biased_exponent(x) as u8,
            bf16_bits(x),
        );
        let dev = (e4[i], e2[i], ce[i], bf[i]);
        if host != dev {
            if mismatches < 10 {
                eprintln!(
                    "value {i} ({x:e}, bits {:#010x}): host {host:x?} device {dev:x?}",
                    x.to_bits()
                );
            }
            mismatches += 1;
        }
    }
    assert_eq!(
        mismatches, 0,
        "{mismatches} of {N} values differ (E4M3, E2M1, ceil exponent, BF16)"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quantizers_match_the_host() {
    let (rows, cols) = (4096usize, 1024usize);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    // Per-32 block magnitudes over many binades, a few outlier channels, some all-zero groups.
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let (row, col) = (i / cols, i % cols);
            if row % 97 == 0 && col < 128 {
                return 0.0;
            }
            let block_scale = 2f32.powi(((i / 32) * 7919 % 24) as i32 - 12);
            let outlier = if col % 173 == 0 { 64.0 } else { 1.0 };
            (rng.random::<f32>() * 2.0 - 1.0) * block_scale * outlier
        })
        .collect();
    let (gpu, module) = cuda_rt::testing::gpu_with_module(&twin_spec());
    let dx = gpu.upload(&x).unwrap();
    let n = rows * cols;
    let mut bufs: Vec<_> = [n, n / 32, n, n / 128, n / 2, n / 32, n, n / 32]
        .iter()
        .map(|&len| gpu.alloc_zeros::<u8>(len).unwrap())
        .collect();
    for b in bufs.iter_mut() {
        gpu.memset(b, 0xEE).unwrap();
    }
    let kernel = module.kernel("twin_quantizers").unwrap();
    {
        let [q32, sf32, q128, sf128, w4, wsf, rq, rsf] = &mut bufs[..] else {
            unreachable!()
        };
        // SAFETY: buffers sized for `rows` x `cols` as the kernel indexes them.
        unsafe {
            kernel
                .launch(gpu.stream(), LaunchConfig::linear(rows as u32, 32))
                .ptr(&dx)
                .scalar(rows as i32)
                .scalar(cols as i32)
                .ptr_mut(q32)
                .ptr_mut(sf32)
                .ptr_mut(q128)
                .ptr_mut(sf128)
                .ptr_mut(w4)
                .ptr_mut(wsf)
                .ptr_mut(rq)
                .ptr_mut(rsf)
                .launch()
                .unwrap();
        }
    }
    let dev: Vec<Vec<u8>> = bufs.iter().map(|b| gpu.download(b).unwrap()).collect();
    for row in 0..rows {
        let xr = &x[row * cols..][..cols];
        let (mut q, mut sf) = (vec![0; cols], vec![0; cols / 32]);
        quant::quantize_act_row(xr, 32, &mut q, &mut sf);
        assert_eq!(
            (
                &dev[0][row * cols..][..cols],
                &dev[1][row * cols / 32..][..cols / 32]
            ),
            (&q[..], &sf[..]),
            "act G=32 row {row}"
        );
        let (mut q, mut sf) = (vec![0; cols], vec![0; cols / 128]);
        quant::quantize_act_row(xr, 128, &mut q, &mut sf);
        assert_eq!(
            (
                &dev[2][row * cols..][..cols],
                &dev[3][row * cols / 128..][..cols / 128]
            ),
            (&q[..], &sf[..]),
            "act G=128 row {row}"
        );
        let (mut p, mut sf) = (vec![0; cols / 2], vec![0; cols / 32]);
        quant::quantize_fp4_row(xr, quant::TieMode::NearestEven, &mut p, &mut sf);
        assert_eq!(
            (
                &dev[4][row * cols / 2..][..cols / 2],
                &dev[5][row * cols / 32..][..cols / 32]
            ),
            (&p[..], &sf[..]),
            "FP4 row {row}"
        );
        let (mut q, mut sf) = (vec![0; cols], vec![0; cols / 32]);
        quant::requantize_row(xr, 32, &mut q, &mut sf);
        assert_eq!(
            (
                &dev[6][row * cols..][..cols],
                &dev[7][row * cols / 32..][..cols / 32]
            ),
            (&q[..], &sf[..]),
            "requant row {row}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn register_decode_matches_the_fold() {
    let n = 1 << 20;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let words: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    let offsets: Vec<i32> = (0..n)
        .map(|_| rng.random_range(fold::MIN_OFFSET..=fold::MAX_OFFSET))
        .collect();
    let (gpu, module) = cuda_rt::testing::gpu_with_module(&twin_spec());
    let (dw, doff) = (gpu.upload(&words).unwrap(), gpu.upload(&offsets).unwrap());
    let mut out = gpu.alloc_zeros::<u32>(2 * n).unwrap();
    gpu.memset(&mut out, 0xFF).unwrap();
    let kernel = module.kernel("twin_fold_words").unwrap();
    // SAFETY: n words and offsets in, 2n words out.
    unsafe {
        kernel
            .launch(
                gpu.stream(),
                LaunchConfig::linear(n.div_ceil(256) as u32, 256),
            )
            .ptr(&dw)
            .ptr(&doff)
            .ptr_mut(&mut out)
            .scalar(n as i32)
            .launch()
            .unwrap();
    }
    let out = gpu.download(&out).unwrap();
    for i in 0..n {
        let host = fold::decode_sign_split_word(words[i], offsets[i]);
        let dev: Vec<u8> = out[2 * i]
            .to_le_bytes()
            .into_iter()
            .chain(out[2 * i + 1].to_le_bytes())
            .collect();
        assert_eq!(dev, host, "word {:#010x} offset {}", words[i], offsets[i]);
    }
}
