//! `scheduler.cuh` through NVRTC (no GPU needed, the CUDA toolkit is: see
//! scripts/cuda-toolchain.sh), and on a GPU (ignored by default; `cargo xtask test-gpu`): every
//! worker's walk, the interleave and the pool offsets computed on the device must equal the Rust
//! model's.

use cuda_rt::{Arch, Gpu, Jit, KernelSpec, LaunchConfig};
use moe_sched::{CUDA_HEADER, ScheduleShape, WaveSchedule, peel_interleave};

const PROBE: &str = r#"
#include "scheduler.cuh"

// One worker per thread; worker w writes its blocks as 5 words each to out[w * max_blocks * 5 ..]
// and its block count to num_blocks[w].
extern "C" __global__ void walk(const unsigned int* tokens, unsigned int num_local_experts,
                                unsigned int num_experts_per_wave, unsigned int block_m,
                                unsigned int l1_n_blocks, unsigned int l2_n_blocks,
                                unsigned int max_blocks, unsigned int* out, unsigned int* num_blocks) {
    const unsigned int worker = blockIdx.x * blockDim.x + threadIdx.x;
    moe_sched::WaveScheduler scheduler;
    scheduler.init(tokens, num_local_experts, num_experts_per_wave, block_m, l1_n_blocks, l2_n_blocks,
                   worker, gridDim.x * blockDim.x);
    moe_sched::Block block;
    unsigned int n = 0;
    while (scheduler.next(block)) {
        if (n < max_blocks) {
            unsigned int* o = out + (static_cast<unsigned long long>(worker) * max_blocks + n) * 5;
            o[0] = block.layer;
            o[1] = block.wave;
            o[2] = block.local_expert;
            o[3] = block.m_block;
            o[4] = block.n_block;
        }
        ++n;
    }
    num_blocks[worker] = n;
}

// Thread s finds slot s's source; past the end it writes ~0.
extern "C" __global__ void peel(const unsigned int* counts, unsigned int num_ranks, unsigned int num_slots,
                                unsigned int* out) {
    const unsigned int slot = blockIdx.x * blockDim.x + threadIdx.x;
    if (slot >= num_slots) return;
    unsigned int rank = ~0u, index = ~0u;
    moe_sched::peel_interleave_slot(counts, num_ranks, slot, rank, index);
    out[2 * slot] = rank;
    out[2 * slot + 1] = index;
}

extern "C" __global__ void offsets(const unsigned int* tokens, unsigned int num_local_experts,
                                   unsigned int block_m, unsigned long long* out) {
    const unsigned int expert = threadIdx.x;
    if (expert <= num_local_experts) out[expert] = moe_sched::pool_offset(tokens, expert, block_m);
}
"#;

fn spec() -> KernelSpec {
    KernelSpec::new("moe-sched/probe", ("sched_probe.cu", PROBE)).header(CUDA_HEADER)
}

fn jit() -> Jit {
    Jit::new().unwrap_or_else(|e| {
        panic!("{e}\nNVRTC tests need the CUDA toolkit: run scripts/cuda-toolchain.sh first")
    })
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
fn header_compiles_with_nvrtc_for_every_arch() {
    let jit = jit();
    for arch in Arch::ALL {
        let compiled = jit
            .compile(&spec(), arch)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(
            compiled.cubin.starts_with(b"\x7fELF"),
            "{arch}: not a cubin"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_twin_matches_the_model() {
    let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    let arch = gpu.info().arch().expect("a supported GPU");
    let module = gpu
        .load_module(&jit().compile(&spec(), arch).unwrap().cubin)
        .unwrap();

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
