//! Barrier latency and peer-copy bandwidth on the GPUs at hand (2 used when there are 2 or more):
//! - grid barrier: device time per barrier of a loop of 100 000, for 1 block up to one per SM;
//! - cross-rank barrier round trip, local world: one block per rank (the signal exchange alone) and
//!   one block per SM (grid barrier, exchange, grid barrier), 100 000 rounds, per round;
//! - peer copy, 1 MiB to 1 GiB, GPU 1's buffer to GPU 0 and back: SM-driven (16-byte loads and
//!   stores through the symmetric pointers; pull = GPU 0 reads the peer, push = GPU 0 writes it)
//!   next to the copy engine (`cuMemcpyPeerAsync`), and GPU 0's local copy for scale. Median of 9
//!   timed copies after 2 warm-ups; GB/s = bytes copied / time (10^9);
//! - both ways at once: each GPU pushes into the other at the same time (as a pipeline's dispatch
//!   and combine do), GB/s per direction, 64 MiB to 1 GiB.
//!
//! `cargo bench -p barriers --bench barriers`, or `.gpu-bundle/bench/barriers.barriers`. Takes no
//! arguments and ignores any (cargo passes `--bench`, scripts/gpu-run.sh the GEMM benchmark's).

use std::time::Duration;

use barriers::DEFAULT_TIMEOUT;
use barriers::testkit::{TestKernels, buffer_bytes};
use cuda_rt::{Gpu, GpuTimer};
use symm_mem::{SymmAllocation, World};

const ROUNDS: u32 = 100_000;
const WARMUP_ROUNDS: u32 = 1_000;
const COPY_SIZES_MIB: [u64; 6] = [1, 4, 16, 64, 256, 1024];
const COPY_SAMPLES: usize = 9;
/// Copy kernel blocks per SM (of 512 threads: a full SM).
const COPY_BLOCKS_PER_SM: u32 = 4;

fn main() {
    let count = match Gpu::count() {
        Ok(n) if n > 0 => n,
        other => {
            println!("SKIP: the barrier benchmark needs a CUDA GPU ({other:?})");
            return;
        }
    };
    let ordinals: Vec<usize> = (0..count.min(2)).collect();
    let worlds = World::local(&ordinals).expect("a local world over the GPUs");
    for w in &worlds {
        let info = w.local_gpu().info();
        println!(
            "GPU {}: {} ({} SMs)",
            info.ordinal, info.name, info.sm_count
        );
    }
    grid_barrier(worlds[0].local_gpu());
    std::thread::scope(|s| {
        for world in &worlds {
            s.spawn(move || {
                cross_rank_barrier(world);
                if world.num_ranks() == 2 {
                    peer_copy(world);
                } else {
                    println!("\npeer copy: SKIP: needs 2 GPUs");
                }
            });
        }
    });
}

fn grid_barrier(gpu: &Gpu) {
    let kernels = TestKernels::load(gpu).unwrap();
    let sms = gpu.info().sm_count;
    let mut grids = vec![1, 8, 32, sms / 2, sms];
    grids.sort_unstable();
    grids.dedup();
    println!(
        "\ngrid barrier (one u64 phase/count word, {ROUNDS} in a loop, 128 threads per block)"
    );
    println!("{:>8} {:>12}", "blocks", "per barrier");
    for blocks in grids {
        kernels
            .grid_barrier_loop(gpu, blocks, WARMUP_ROUNDS)
            .unwrap();
        let t = kernels.grid_barrier_loop(gpu, blocks, ROUNDS).unwrap();
        println!(
            "{blocks:>8} {:>9.0} ns",
            t.as_nanos() as f64 / f64::from(ROUNDS)
        );
    }
}

fn cross_rank_barrier(world: &World) {
    let gpu = world.local_gpu();
    let kernels = TestKernels::load(gpu).unwrap();
    let sms = gpu.info().sm_count;
    let alloc = world
        .alloc_symmetric(buffer_bytes(world.num_ranks(), sms, 0))
        .unwrap();
    if world.rank() == 0 {
        println!(
            "\ncross-rank barrier ({} rank(s), {ROUNDS} rounds, round trip per round)",
            world.num_ranks()
        );
        println!("{:>8} {:>12}   what", "blocks", "per round");
    }
    for (blocks, what) in [
        (1, "signal exchange: st.release.sys + ld.acquire.sys spin"),
        (
            sms,
            "grid barrier (sys) + exchange by block 0 + grid barrier",
        ),
    ] {
        world.barrier().unwrap();
        let run = |rounds| {
            let run = kernels
                .rank_barrier_rounds(gpu, &alloc.view(), blocks, 0, rounds, DEFAULT_TIMEOUT)
                .unwrap();
            assert_eq!(run.error, Ok(()), "rank {}: {run:?}", world.rank());
            run.elapsed
        };
        run(WARMUP_ROUNDS);
        world.barrier().unwrap();
        let t = run(ROUNDS);
        if world.rank() == 0 {
            println!(
                "{blocks:>8} {:>9.2} µs   {what}",
                t.as_secs_f64() * 1e6 / f64::from(ROUNDS)
            );
        }
    }
    world.barrier().unwrap();
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Device time of `op` queued on `gpu`'s stream: median of COPY_SAMPLES after 2 warm-ups.
fn time(gpu: &Gpu, mut op: impl FnMut()) -> Duration {
    let timer = GpuTimer::new(gpu).unwrap();
    op();
    op();
    median(
        (0..COPY_SAMPLES)
            .map(|_| {
                timer.start(gpu.stream()).unwrap();
                op();
                timer.stop(gpu.stream()).unwrap();
                Duration::from_secs_f64(f64::from(timer.elapsed_ms().unwrap()) / 1e3)
            })
            .collect(),
    )
}

/// Rank 0 copies between its buffer and rank 1's; rank 1 only allocates and waits.
fn peer_copy(world: &World) {
    const MAX: u64 = 1 << 30;
    // [0, 1 GiB): source; [1 GiB, 2 GiB): destination; on both ranks.
    let alloc: SymmAllocation = world.alloc_symmetric(2 * MAX as usize).unwrap();
    if world.rank() == 0 {
        let gpu = world.local_gpu();
        let kernels = TestKernels::load(gpu).unwrap();
        let blocks = gpu.info().sm_count * COPY_BLOCKS_PER_SM;
        let (local, peer) = (alloc.bases()[0], alloc.bases()[1]);
        // GPU 1's primary context, which the copy engine names as the source's.
        let peer_gpu = Gpu::open(1).unwrap();
        println!(
            "\npeer copy GPU 1 <-> GPU 0, GB/s ({blocks} blocks × 512 threads for the SM copies)"
        );
        println!(
            "{:>9} {:>10} {:>10} {:>12} {:>12}",
            "size", "SM pull", "SM push", "copy engine", "local (SM)"
        );
        for mib in COPY_SIZES_MIB {
            let bytes = mib << 20;
            let gbps = |t: Duration| bytes as f64 / t.as_secs_f64() / 1e9;
            // SAFETY (all four): ranges inside the two live 2 GiB buffers, used by nothing else.
            let pull = time(gpu, || unsafe {
                kernels
                    .copy16(gpu, peer, local + MAX, bytes, blocks)
                    .unwrap()
            });
            let push = time(gpu, || unsafe {
                kernels
                    .copy16(gpu, local, peer + MAX, bytes, blocks)
                    .unwrap()
            });
            let engine = time(gpu, || unsafe {
                gpu.copy_peer_raw(local + MAX, &peer_gpu, peer, bytes as usize)
                    .unwrap()
            });
            let own = time(gpu, || unsafe {
                kernels
                    .copy16(gpu, local, local + MAX, bytes, blocks)
                    .unwrap()
            });
            println!(
                "{:>5} MiB {:>10.1} {:>10.1} {:>12.1} {:>12.1}",
                mib,
                gbps(pull),
                gbps(push),
                gbps(engine),
                gbps(own)
            );
        }
        gpu.synchronize().unwrap();
    }
    world.barrier().unwrap();
    both_ways(world, &alloc, MAX);
}

/// Each rank pushes `bytes` from its buffer into the peer's at once; each times its own copies
/// (they start together after a barrier and run for milliseconds, so they overlap).
fn both_ways(world: &World, alloc: &SymmAllocation, max: u64) {
    let gpu = world.local_gpu();
    let kernels = TestKernels::load(gpu).unwrap();
    let blocks = gpu.info().sm_count * COPY_BLOCKS_PER_SM;
    let rank = world.rank();
    let (local, peer) = (alloc.bases()[rank], alloc.bases()[1 - rank]);
    if rank == 0 {
        println!(
            "
SM push both ways at once, GB/s per direction (GPU 0 -> 1, GPU 1 -> 0)"
        );
    }
    for mib in COPY_SIZES_MIB.into_iter().filter(|&m| m >= 64) {
        let bytes = mib << 20;
        world.barrier().unwrap();
        // SAFETY: each rank writes only the destination half of the peer's 2 GiB buffer, which
        // nothing else uses now; sources are its own first half.
        let t = time(gpu, || unsafe {
            kernels
                .copy16(gpu, local, peer + max, bytes, blocks)
                .unwrap()
        });
        gpu.synchronize().unwrap();
        let rate = bytes as f64 / t.as_secs_f64() / 1e9;
        let rates: Vec<f64> = world
            .all_gather(&rate.to_le_bytes())
            .unwrap()
            .iter()
            .map(|b| f64::from_le_bytes(b[..8].try_into().unwrap()))
            .collect();
        if rank == 0 {
            println!("{:>5} MiB {:>10.1} {:>10.1}", mib, rates[0], rates[1]);
        }
    }
    world.barrier().unwrap();
}
