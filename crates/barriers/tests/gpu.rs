//! The barriers on real GPUs. Ignored by default; run with `cargo xtask test-gpu` or from the
//! bundle (`cargo xtask gpu-bundle`). One GPU: grid-barrier reuse over many phases (and the phase
//! wrapping), the device's error encoding, the timeout path with two ranks faked on one GPU, and
//! 100 000 grid-wide barriers of a one-rank world. Two GPUs (`SKIP:` with one): 100 000 rounds in
//! which every rank writes into every rank before the barrier and checks everything after it, for
//! the local world and for two processes; a rank that never arrives fails the other with
//! `Timeout { missing_rank }` instead of hanging.

use std::time::{Duration, Instant};

use barriers::testkit::{self, RankRun, THREADS, TestKernels, buffer_bytes};
use barriers::{BarrierError, BarrierWords, DEFAULT_TIMEOUT, LocalWait, check_error_word};
use cuda_rt::cudarc::driver::DevicePtr;
use cuda_rt::{Gpu, LaunchConfig};
use symm_mem::world::{is_test_rank, spawn_test_ranks};
use symm_mem::{SymmBuffer, World};

/// Words each block writes into each rank per round.
const WORDS: u32 = 64;
const ROUNDS: u32 = 100_000;

fn gpu(ordinal: usize) -> Gpu {
    Gpu::open(ordinal).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

fn two_gpus() -> bool {
    cuda_rt::testing::gpus_or_skip(2)
}

fn kernels(gpu: &Gpu) -> TestKernels {
    TestKernels::load(gpu).unwrap()
}

/// `rank_barrier_rounds` on one block per SM with `WORDS` words per block.
fn run_rounds(
    gpu: &Gpu,
    k: &TestKernels,
    view: &SymmBuffer,
    rounds: u32,
    timeout: Duration,
) -> RankRun {
    k.rank_barrier_rounds(gpu, view, gpu.info().sm_count, WORDS, rounds, timeout)
        .unwrap()
}

fn bytes_for(num_ranks: usize, gpu: &Gpu) -> usize {
    buffer_bytes(num_ranks, gpu.info().sm_count, WORDS)
}

fn read_u64s(gpu: &Gpu, ptr: u64, n: usize) -> Vec<u64> {
    // SAFETY: the callers read barrier words inside live buffers.
    unsafe { testkit::read_u64s(gpu, ptr, n).unwrap() }
}

/// One rank of a world: `ROUNDS` checked barriers, then every rank's signal must say `ROUNDS`.
fn stay_in_step(world: &World) {
    let gpu = world.local_gpu();
    let k = kernels(gpu);
    let alloc = world
        .alloc_symmetric(bytes_for(world.num_ranks(), gpu))
        .unwrap();
    let run = run_rounds(gpu, &k, &alloc.view(), ROUNDS, DEFAULT_TIMEOUT);
    eprintln!(
        "rank {} of {}: {} rounds in {:.1?} ({:.2} µs per round: grid barrier, cross-rank barrier, grid barrier; {} KiB written into each rank)",
        world.rank(),
        world.num_ranks(),
        run.completed,
        run.elapsed,
        run.elapsed.as_secs_f64() * 1e6 / f64::from(ROUNDS),
        gpu.info().sm_count * WORDS * 4 / 1024,
    );
    assert_eq!(run.error, Ok(()), "rank {}: {run:?}", world.rank());
    assert_eq!(
        (run.mismatches, run.completed),
        (0, ROUNDS),
        "rank {}: {} words were not what the peers wrote, first in round {}",
        world.rank(),
        run.mismatches,
        run.first_bad_round
    );
    assert!(
        run.signals.iter().all(|&s| s == u64::from(ROUNDS)),
        "{:?}",
        run.signals
    );
    world.barrier().unwrap();
}

/// Two ranks of a world; rank 1 never launches. Rank 0 must come back with Timeout { missing 1 }.
fn rank_1_never_arrives(world: &World, epoch: u32) {
    let timeout = Duration::from_millis(300);
    let gpu = world.local_gpu();
    let k = kernels(gpu);
    let alloc = world
        .alloc_symmetric(bytes_for(world.num_ranks(), gpu))
        .unwrap();
    // Bring the signals to epoch − 1 with a barrier loop both ranks run, then rank 1 stays away.
    if epoch > 1 {
        let run = run_rounds(gpu, &k, &alloc.view(), epoch - 1, timeout);
        assert_eq!((run.error, run.completed), (Ok(()), epoch - 1));
    }
    world.barrier().unwrap();
    if world.rank() == 0 {
        let start = Instant::now();
        let run = run_rounds(gpu, &k, &alloc.view(), 5, timeout);
        eprintln!("rank 0: {:?} after {:.1?}", run.error, start.elapsed());
        assert_eq!(run.completed, 0);
        let Err(BarrierError::Timeout {
            missing_rank,
            epoch: at,
            waited_ns,
        }) = run.error
        else {
            panic!("expected a timeout, got {run:?}");
        };
        assert_eq!((missing_rank, at), (1, epoch));
        assert!(
            waited_ns + (1 << 20) >= timeout.as_nanos() as u64,
            "{waited_ns}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }
    world.barrier().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn grid_barrier_is_reusable_over_many_phases() {
    grid_barrier_rounds_hold(ROUNDS);
}

/// The same check over a few phases: what `cargo xtask sanitize` runs (racecheck instruments every
/// spin of the barrier and would take hours over 100 000).
#[test]
#[ignore = "needs a CUDA GPU"]
fn grid_barrier_holds_over_a_few_phases() {
    grid_barrier_rounds_hold(20);
}

/// `rounds` checked grid barriers on 1, 7 and every SM's block, launched twice without a reset,
/// then the phase's wrap from 2^32 − 1 to 0.
fn grid_barrier_rounds_hold(rounds: u32) {
    let gpu = gpu(0);
    let k = kernels(&gpu);
    let kernel = k.module().kernel("grid_barrier_rounds").unwrap();
    let run = |blocks: u32, initial: u64, rounds: u32| -> (Vec<u32>, u64) {
        let mut word = gpu.upload(&[initial]).unwrap();
        let mut slots = gpu
            .alloc_zeros::<u32>((2 * blocks * THREADS) as usize)
            .unwrap();
        let mut failures = gpu.upload(&[0u32, u32::MAX]).unwrap();
        for _ in 0..2 {
            // SAFETY: grid_barrier_rounds(word, slots[2·blocks·threads], rounds, failures[2]).
            unsafe {
                kernel
                    .launch(
                        gpu.stream(),
                        LaunchConfig::linear(blocks, THREADS).cooperative(),
                    )
                    .ptr_mut(&mut word)
                    .ptr_mut(&mut slots)
                    .scalar(rounds)
                    .ptr_mut(&mut failures)
                    .launch()
                    .unwrap();
            }
        }
        (
            gpu.download(&failures).unwrap(),
            gpu.download(&word).unwrap()[0],
        )
    };
    let sms = gpu.info().sm_count;
    let start = Instant::now();
    for blocks in [1, 7, sms] {
        let (failures, word) = run(blocks, 0, rounds);
        assert_eq!(
            failures,
            [0, u32::MAX],
            "{blocks} blocks: mismatches, first bad round"
        );
        // Two launches without a reset: the phase counts on, the count is back to 0.
        assert_eq!(
            word,
            u64::from(2 * rounds) << 32,
            "{blocks} blocks: {word:#x}"
        );
    }
    eprintln!(
        "3 × 2 × {rounds} grid barriers (1, 7, {sms} blocks) in {:.1?}",
        start.elapsed()
    );
    // The phase wraps from 2^32 − 1 to 0.
    let (failures, word) = run(sms, 0xFFFF_FFFE << 32, 2);
    assert_eq!((failures[0], word), (0, 2 << 32));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_encodes_timeouts_as_the_host_decodes() {
    let gpu = gpu(0);
    let k = kernels(&gpu);
    let kernel = k.module().kernel("encode_timeouts").unwrap();
    // (kind, a, b, waited ns): rank timeouts (missing rank, epoch), then local ones (wait, detail).
    let cases: [(u64, u64, u64, u64); 7] = [
        (1, 1, 1, 300_000_000),
        (1, 71, 0x1_2345_6789, 5 << 20),
        (1, 255, u64::MAX, u64::MAX),
        (1, 0, 7, 0),
        (2, 1, 0, 5_000_000_000),
        (2, 1, 0xFFFF_FFFF, u64::MAX),
        (2, 1, 17, 0),
    ];
    let inputs: Vec<u64> = cases
        .iter()
        .flat_map(|&(k, a, b, w)| [k, a, b, w])
        .collect();
    let d_inputs = gpu.upload(&inputs).unwrap();
    let mut out = gpu.alloc_zeros::<u64>(cases.len()).unwrap();
    // SAFETY: encode_timeouts(inputs[4n], out[n], n).
    unsafe {
        kernel
            .launch(gpu.stream(), LaunchConfig::linear(1, 32))
            .ptr(&d_inputs)
            .ptr_mut(&mut out)
            .scalar(cases.len() as u32)
            .launch()
            .unwrap();
    }
    let words = gpu.download(&out).unwrap();
    for (&(kind, a, b, waited), &word) in cases.iter().zip(&words) {
        let waited_ns = (waited >> 20).min(barriers::error::ERROR_WAIT_MAX) << 20;
        let expected = if kind == 1 {
            BarrierError::Timeout {
                missing_rank: a as u32,
                epoch: b as u32,
                waited_ns,
            }
        } else {
            BarrierError::LocalTimeout {
                wait: LocalWait::SplitTailHandOver,
                detail: b as u32,
                waited_ns,
            }
        };
        assert_eq!(check_error_word(word), Err(expected), "{word:#018x}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_missing_rank_times_out_instead_of_hanging_on_one_gpu() {
    // Two ranks faked on one GPU: two buffers and rank 0's view of them; only rank 0 launches.
    let gpu = gpu(0);
    let k = kernels(&gpu);
    let bytes = bytes_for(2, &gpu);
    let buffers = [
        gpu.alloc_zeros::<u8>(bytes).unwrap(),
        gpu.alloc_zeros::<u8>(bytes).unwrap(),
    ];
    let bases: Vec<u64> = buffers
        .iter()
        .map(|b| b.device_ptr(gpu.stream()).0)
        .collect();
    let view = SymmBuffer::new(0, &bases).unwrap();
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let run = run_rounds(&gpu, &k, &view, 3, timeout);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(run.completed, 0, "{run:?}");
    assert!(
        matches!(run.error, Err(BarrierError::Timeout { missing_rank: 1, epoch: 1, waited_ns })
            if waited_ns + (1 << 20) >= 200_000_000),
        "{run:?}"
    );
    // Rank 0 announced epoch 1 to both buffers (rank 1 would see it on arrival).
    assert_eq!(run.signals, [1, 0]);
    assert_eq!(
        read_u64s(&gpu, bases[1] + BarrierWords::LEADING.signals, 2),
        [1, 0]
    );
    // With the error word set, the next launch fails at once and changes nothing.
    let start = Instant::now();
    let again = run_rounds(&gpu, &k, &view, 3, Duration::from_secs(60));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        (again.completed, again.error, again.signals),
        (0, run.error, vec![1, 0])
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_one_rank_world_runs_100k_checked_barriers() {
    let world = World::local(&[0]).unwrap().pop().unwrap();
    stay_in_step(&world);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_local_ranks_stay_in_step_over_100k_barriers() {
    if !two_gpus() {
        return;
    }
    std::thread::scope(|s| {
        for world in World::local(&[0, 1]).unwrap() {
            s.spawn(move || stay_in_step(&world));
        }
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_local_rank_that_never_arrives_times_out() {
    if !two_gpus() {
        return;
    }
    std::thread::scope(|s| {
        for world in World::local(&[0, 1]).unwrap() {
            s.spawn(move || rank_1_never_arrives(&world, 1));
        }
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn two_processes_stay_in_step_and_time_out_cleanly() {
    const TEST: &str = "two_processes_stay_in_step_and_time_out_cleanly";
    if is_test_rank(TEST) {
        let world = World::from_env().unwrap();
        stay_in_step(&world);
        rank_1_never_arrives(&world, 1000);
        return;
    }
    if !two_gpus() {
        return;
    }
    let outputs = spawn_test_ranks(
        TEST,
        2,
        1,
        Duration::from_secs(30),
        Duration::from_secs(120),
    )
    .unwrap();
    for output in &outputs {
        eprint!("{output}");
        assert!(output.passed_its_test(), "{output}");
    }
}
