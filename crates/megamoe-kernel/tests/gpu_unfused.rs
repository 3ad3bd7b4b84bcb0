//! The unfused pipeline's device-side cross-rank barrier, on one GPU: rank 0 of a two-rank world
//! whose rank 1 exists only as a second buffer. A barrier passes once rank 1's signal is there; one
//! that rank 1 never reaches ends after the timeout in an error naming rank 1 and the epoch, not a
//! hang, and every later barrier of the out-of-step pipeline fails at once.
//! (The barrier between real ranks runs in every multi-GPU test of `megamoe`'s `gpu_cuda`.)

use std::time::{Duration, Instant};

use barriers::BarrierError;
use cuda_rt::Gpu;
use cuda_rt::Jit;
use cuda_rt::cudarc::driver::{CudaSlice, DevicePtr};
use fp_formats::Recipe;
use megamoe_kernel::problem::ExpertWeights;
use megamoe_kernel::unfused::{Pipeline, PipelineShape, UnfusedError};
use megamoe_kernel::{Mma, transform_weights};

fn address(gpu: &Gpu, buffer: &CudaSlice<u8>) -> u64 {
    buffer.device_ptr(gpu.stream()).0
}

fn timeout_of(err: UnfusedError) -> (u32, u32, u64) {
    match err {
        UnfusedError::Barrier(BarrierError::Timeout {
            missing_rank,
            epoch,
            waited_ns,
        }) => (missing_rank, epoch, waited_ns),
        other => panic!("expected a barrier timeout, got {other}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_rank_that_never_arrives_times_out_into_an_error() {
    let gpu = Gpu::open(0).expect("GPU 0");
    let jit = Jit::new().expect("JIT");
    let (h, i, experts, top_k, ranks, tokens) = (256, 128, 4, 2, 2, 8);
    let shape = PipelineShape::new(
        Recipe::G128,
        Mma::Bf16,
        h,
        i,
        experts,
        top_k,
        ranks,
        tokens,
        None,
    )
    .unwrap();
    let local = experts / ranks;
    let weights = |n, k, seed| {
        let w = ExpertWeights::random(local, n, k, seed);
        transform_weights(Mma::Bf16, &w.w, &w.w_sf, local, n, k).unwrap()
    };
    let (w1, w2) = (weights(2 * i, h, 1), weights(h, i, 2));
    let layout = shape.peer_layout();
    let buffers: Vec<CudaSlice<u8>> = (0..ranks)
        .map(|_| gpu.alloc_zeros::<u8>(layout.bytes).unwrap())
        .collect();
    let bases: Vec<u64> = buffers.iter().map(|b| address(&gpu, b)).collect();
    // SAFETY: both buffers are live for the whole test and hold `layout.bytes` bytes on this GPU;
    // only this pipeline (and the host, below, as rank 1) writes into them.
    let mut pipe = unsafe { Pipeline::new(&gpu, &jit, shape, 0, &w1, &w2, &bases) }.unwrap();
    let timeout = Duration::from_millis(50);
    pipe.set_barrier_timeout(timeout);

    // Rank 1 entered barrier 1: its signal (epoch 1) in its slot of rank 0's buffer.
    let slot_of_rank_1 = bases[0] + layout.signals.offset as u64 + 8;
    // SAFETY: slot 1 of rank 0's signals region, inside buffers[0].
    unsafe { gpu.write_raw(slot_of_rank_1, &1u64.to_le_bytes()) }.unwrap();
    pipe.rank_barrier(&gpu).unwrap();
    pipe.stage_sync(&gpu).unwrap();
    pipe.check_barriers(&gpu)
        .expect("barrier 1: both ranks arrived");
    let mut ours = [0u8; 8];
    // SAFETY: slot 0 of rank 1's signals region, inside buffers[1].
    unsafe { gpu.read_raw(bases[1] + layout.signals.offset as u64, &mut ours) }.unwrap();
    assert_eq!(
        u64::from_le_bytes(ours),
        1,
        "rank 0 signalled epoch 1 to rank 1"
    );

    // Barrier 2: rank 1 never comes.
    let started = Instant::now();
    pipe.rank_barrier(&gpu).unwrap();
    pipe.stage_sync(&gpu).unwrap();
    let waited = started.elapsed();
    let err = pipe
        .check_barriers(&gpu)
        .expect_err("rank 1 never entered barrier 2");
    eprintln!("after {waited:?}: {err}");
    assert!(err.to_string().contains("rank 1"), "{err}");
    let (missing, epoch, waited_ns) = timeout_of(err);
    assert_eq!((missing, epoch), (1, 2));
    assert!(
        Duration::from_nanos(waited_ns) + Duration::from_millis(2) >= timeout,
        "the error says it waited {waited_ns} ns, the timeout is {timeout:?}"
    );
    assert!(
        waited >= timeout && waited < 20 * timeout,
        "waited {waited:?}"
    );

    // Out of step: the next barrier gives up at once, with the same error.
    let started = Instant::now();
    pipe.rank_barrier(&gpu).unwrap();
    pipe.stage_sync(&gpu).unwrap();
    assert!(started.elapsed() < timeout, "{:?}", started.elapsed());
    assert_eq!(timeout_of(pipe.check_barriers(&gpu).unwrap_err()).0, 1);
    drop(pipe);
    drop(buffers);
}
