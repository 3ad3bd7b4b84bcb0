//! `scheduler.cuh` on a GPU (ignored by default; `cargo xtask test-gpu`; `cargo xtask kernels` compiles the
//! probe for every target): every
//! worker's walk, the interleave and the pool offsets computed on the device must equal the Rust
//! model's.

use cuda_rt::{KernelSpec, LaunchConfig};
use moe_sched::{CUDA_HEADER, ScheduleShape, WaveSchedule, peel_interleave};

fn spec() -> KernelSpec {
    KernelSpec::new("moe-sched/probe", moe_sched::PROBE_SOURCE).header(CUDA_HEADER)
}

/// Reproducible counts with zeros mixed in (xorshift64).
fn counts(len: usize, max: u32, seed: u64) -> Vec<u32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if state.is_multiple_of(5) {
                0
            } else {
                (state >> 8) as u32 % (max + 1)
            }
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_twin_matches_the_model() {
    let (gpu, module) = cuda_rt::testing::gpu_with_module(&spec());

    // V4-Pro-like per-rank shapes: 48 local experts, 48 L1 and 56 L2 n-blocks, 2·132 workers.
    let walk = module.kernel("walk").unwrap();
    let (blocks_x, threads) = (2u32, 132u32);
    let workers = blocks_x * threads;
    for (seed, block_m, per_wave) in [(1u64, 256u32, 2u32), (2, 32, 6), (3, 16, 48), (4, 128, 5)] {
        let tokens = counts(48, 1100, seed);
        let shape = ScheduleShape {
            block_m,
            l1_n_blocks: 48,
            l2_n_blocks: 56,
            num_experts_per_wave: per_wave,
        };
        let schedule = WaveSchedule::new(shape, &tokens).unwrap();
        let max_blocks = schedule.num_blocks().div_ceil(u64::from(workers)) as u32;
        let d_tokens = gpu.upload(&tokens).unwrap();
        let mut out = gpu
            .alloc_zeros::<u32>((workers * max_blocks * 5) as usize)
            .unwrap();
        let mut num_blocks = gpu.alloc_zeros::<u32>(workers as usize).unwrap();
        // SAFETY: walk(...) writes ≤ max_blocks blocks of 5 words per worker and one count each.
        unsafe {
            walk.launch(gpu.stream(), LaunchConfig::linear(blocks_x, threads))
                .ptr(&d_tokens)
                .scalar(48u32)
                .scalar(per_wave)
                .scalar(block_m)
                .scalar(48u32)
                .scalar(56u32)
                .scalar(max_blocks)
                .ptr_mut(&mut out)
                .ptr_mut(&mut num_blocks)
                .launch()
                .unwrap();
        }
        let out = gpu.download(&out).unwrap();
        let num_blocks = gpu.download(&num_blocks).unwrap();
        for w in 0..workers {
            let expected: Vec<[u32; 5]> = schedule
                .worker(w, workers)
                .map(|b| [b.layer as u32, b.wave, b.local_expert, b.m_block, b.n_block])
                .collect();
            assert_eq!(
                num_blocks[w as usize] as usize,
                expected.len(),
                "worker {w}, seed {seed}"
            );
            for (i, block) in expected.iter().enumerate() {
                let at = ((w * max_blocks) as usize + i) * 5;
                assert_eq!(
                    &out[at..at + 5],
                    block,
                    "worker {w}, block {i}, seed {seed}"
                );
            }
        }

        let offsets = module.kernel("offsets").unwrap();
        let mut d_offsets = gpu.alloc_zeros::<u64>(49).unwrap();
        // SAFETY: offsets(...) writes 49 entries.
        unsafe {
            offsets
                .launch(gpu.stream(), LaunchConfig::linear(1, 64))
                .ptr(&d_tokens)
                .scalar(48u32)
                .scalar(block_m)
                .ptr_mut(&mut d_offsets)
                .launch()
                .unwrap();
        }
        let mut expected = vec![0u64];
        for &t in &tokens {
            expected.push(expected[expected.len() - 1] + u64::from(t.div_ceil(block_m) * block_m));
        }
        assert_eq!(gpu.download(&d_offsets).unwrap(), expected);
    }

    let peel = module.kernel("peel").unwrap();
    for (seed, num_ranks) in [(5u64, 72usize), (6, 8), (7, 1)] {
        let counts = counts(num_ranks, 300, seed);
        let order: Vec<(u32, u32)> = peel_interleave(&counts).collect();
        let num_slots = order.len() as u32 + 3;
        let d_counts = gpu.upload(&counts).unwrap();
        let mut out = gpu.alloc_zeros::<u32>(2 * num_slots as usize).unwrap();
        // SAFETY: peel(...) writes 2 words per slot.
        unsafe {
            peel.launch(
                gpu.stream(),
                LaunchConfig::linear(num_slots.div_ceil(256), 256),
            )
            .ptr(&d_counts)
            .scalar(num_ranks as u32)
            .scalar(num_slots)
            .ptr_mut(&mut out)
            .launch()
            .unwrap();
        }
        let out = gpu.download(&out).unwrap();
        for slot in 0..num_slots as usize {
            let got = (out[2 * slot], out[2 * slot + 1]);
            let want = order.get(slot).copied().unwrap_or((!0, !0));
            assert_eq!(got, want, "slot {slot} of {num_ranks} ranks");
        }
    }
}
