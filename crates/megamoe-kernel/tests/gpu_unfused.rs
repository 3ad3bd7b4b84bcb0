//! The unfused pipeline's device-side pieces, on one GPU, as rank 0 of a two-rank world whose rank 1
//! exists only as a second buffer:
//! - the cross-rank barrier: one passes once rank 1's signal is there; one that rank 1 never
//!   reaches ends after the timeout in an error naming rank 1 and the epoch, not a hang, and every
//!   later barrier of the out-of-step pipeline fails at once;
//! - the device's routes (`uf_route`): every pair lands in the row its host twin `routes` gives,
//!   in both owners' pools, as the dispatch's row metadata shows, and every other row of the plan
//!   is either a peer's or marked as padding;
//! - the plan on the device (`uf_count`, `uf_plan`): this rank's counts row lands in both ranks'
//!   tables, the plan tables equal the host's `set_plans` bit for bit, and a plan that overflows
//!   the pools is refused through the error word as the host refuses it.
//!
//! (The barrier between real ranks runs in every multi-GPU test of `megamoe`'s `gpu_cuda`.)

use std::time::{Duration, Instant};

use barriers::BarrierError;
use cuda_rt::Gpu;
use cuda_rt::Jit;
use cuda_rt::cudarc::driver::{CudaSlice, DevicePtr};
use fp_formats::Recipe;
use megamoe_kernel::problem::ExpertWeights;
use megamoe_kernel::protocol::{PipelineShape, PoolPlan, RowMeta, routes};
use megamoe_kernel::unfused::{Pipeline, UnfusedError};
use megamoe_kernel::{Mma, transform_l1_weights, transform_weights};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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

/// Rank 0's pipeline (H 256, I 128, top-2, E experts over two ranks, T_max tokens) and both
/// ranks' symmetric buffers; the pipeline must be dropped before the buffers.
fn rank_0_of_two(
    gpu: &Gpu,
    experts: usize,
    max_tokens: usize,
) -> (Pipeline, Vec<CudaSlice<u8>>, Vec<u64>) {
    let jit = Jit::new().expect("JIT");
    let (h, i, top_k, ranks) = (256, 128, 2, 2);
    let shape = PipelineShape::new(
        Recipe::G128,
        Mma::Bf16,
        h,
        i,
        experts,
        top_k,
        ranks,
        max_tokens,
        None,
    )
    .unwrap();
    let local = experts / ranks;
    let (w1, w2) = (
        ExpertWeights::random(local, 2 * i, h, 1),
        ExpertWeights::random(local, h, i, 2),
    );
    let w1 = transform_l1_weights(Mma::Bf16, &w1.w, &w1.w_sf, local, i, h).unwrap();
    let w2 = transform_weights(Mma::Bf16, &w2.w, &w2.w_sf, local, h, i).unwrap();
    let layout = shape.peer_layout();
    let buffers: Vec<CudaSlice<u8>> = (0..ranks)
        .map(|_| gpu.alloc_zeros::<u8>(layout.bytes).unwrap())
        .collect();
    let bases: Vec<u64> = buffers.iter().map(|b| address(gpu, b)).collect();
    // SAFETY: both buffers are live until the caller drops them after the pipeline and hold
    // `layout.bytes` bytes on this GPU; only this pipeline (and the host, as rank 1) writes into them.
    let pipe = unsafe { Pipeline::new(gpu, &jit, shape, 0, &w1, &w2, &bases) }.unwrap();
    (pipe, buffers, bases)
}

/// One rank's inputs (g128 scales all 2^0).
struct Inputs {
    topk: Vec<i64>,
    weights: Vec<f32>,
    x: Vec<u8>,
    x_sf: Vec<u8>,
}

/// Fresh random inputs of `tokens` tokens: ids skewed to expert `hot` (about half the slots), a
/// tenth of the slots masked.
fn skewed_inputs(tokens: usize, k: usize, h: usize, experts: usize, hot: i64, seed: u64) -> Inputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let topk = (0..tokens * k)
        .map(|_| match rng.random_range(0..10) {
            0 => -1,
            1..=4 => hot,
            _ => rng.random_range(0..experts as i64),
        })
        .collect();
    Inputs {
        topk,
        weights: (0..tokens * k).map(|_| rng.random()).collect(),
        x: (0..tokens * h).map(|_| rng.random_range(0..0x7e)).collect(),
        x_sf: vec![127u8; tokens * h / 128],
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_routes_match_their_host_twin() {
    let gpu = Gpu::open(0).expect("GPU 0");
    // 5000 pairs: two rounds of uf_route's 4096.
    let (experts, tokens) = (6, 2500);
    let (mut pipe, buffers, bases) = rank_0_of_two(&gpu, experts, tokens);
    let s = pipe.shape;
    let (h, k, el) = (s.hidden, s.top_k, s.experts_per_rank());
    let Inputs {
        topk,
        weights,
        x,
        x_sf,
    } = skewed_inputs(tokens, k, h, experts, 0, 7);
    let ours = pipe.set_inputs(&gpu, &x, &x_sf, &topk, &weights).unwrap();
    // Rank 1's counts: some rows ahead of ours in every expert.
    let theirs: Vec<u32> = (0..experts).map(|e| 3 * e as u32 + 1).collect();
    let counts = vec![ours, theirs];
    pipe.set_plans(&gpu, &counts).unwrap();
    // Our pool's metadata as a past forward may have left it: every row a valid-looking source.
    let layout = s.peer_layout();
    // SAFETY: the meta region of our live buffer; nothing else is queued.
    unsafe { gpu.memset_raw(bases[0] + layout.meta.offset as u64, layout.meta.bytes, 0) }.unwrap();
    pipe.dispatch(&gpu).unwrap();
    pipe.stage_sync(&gpu).unwrap();

    let plans: Vec<PoolPlan> = (0..2)
        .map(|owner| PoolPlan::new(&counts, owner, el, s.pool_rows).unwrap())
        .collect();
    let expected = routes(&topk, 0, &plans, el);
    let metas: Vec<Vec<RowMeta>> = bases
        .iter()
        .map(|&base| {
            let mut bytes = vec![0u8; layout.meta.bytes];
            // SAFETY: the meta region of a live buffer of `layout.bytes` bytes.
            unsafe { gpu.read_raw(base + layout.meta.offset as u64, &mut bytes) }.unwrap();
            bytes
                .chunks_exact(size_of::<RowMeta>())
                .map(bytemuck::pod_read_unaligned)
                .collect()
        })
        .collect();
    // Each of our pairs is in the row the host twin gives, in its owner's pool.
    let mut ours_in_own_pool = vec![false; plans[0].rows];
    for (pair, &e) in topk.iter().enumerate() {
        if e < 0 {
            continue;
        }
        let owner = e as usize / el;
        let row = expected[pair] as usize;
        let m = metas[owner][row];
        assert_eq!(
            (m.rank, m.token, m.slot, m.weight),
            (0, (pair / k) as i32, (pair % k) as i32, weights[pair]),
            "pair {pair} (expert {e}) should be row {row} of rank {owner}'s pool"
        );
        if owner == 0 {
            ours_in_own_pool[row] = true;
        }
    }
    // Every other row of our plan: rank 1's (it never dispatched: left as it was) or padding.
    let own = &plans[0];
    for (row, m) in metas[0][..own.rows].iter().enumerate() {
        if ours_in_own_pool[row] {
            continue;
        }
        let of_rank_1 = (0..el).any(|x| {
            let first = own.source_base[1][x] as usize;
            (first..first + counts[1][x] as usize).contains(&row)
        });
        if of_rank_1 {
            assert_eq!(
                (m.rank, m.token),
                (0, 0),
                "row {row} (rank 1's) was written"
            );
        } else {
            assert!(m.token < 0, "padding row {row} is not marked: {m:?}");
        }
    }
    assert!(
        own.rows > own.expert_rows.iter().sum::<i32>() as usize,
        "the plan has padding"
    );
    drop(pipe);
    drop(buffers);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_rank_that_never_arrives_times_out_into_an_error() {
    let gpu = Gpu::open(0).expect("GPU 0");
    let (mut pipe, buffers, bases) = rank_0_of_two(&gpu, 4, 8);
    let layout = pipe.shape.peer_layout();
    let timeout = Duration::from_millis(50);
    pipe.set_barrier_timeout(timeout);

    // Rank 1 entered barrier 1: its signal (epoch 1) in its slot of rank 0's buffer.
    let slot_of_rank_1 = bases[0] + layout.signals.offset as u64 + 8;
    // SAFETY: slot 1 of rank 0's signals region, inside buffers[0].
    unsafe { gpu.write_raw(slot_of_rank_1, &1u64.to_le_bytes()) }.unwrap();
    pipe.rank_barrier(&gpu).unwrap();
    pipe.stage_sync(&gpu).unwrap();
    pipe.check_errors(&gpu)
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
        .check_errors(&gpu)
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
    assert_eq!(timeout_of(pipe.check_errors(&gpu).unwrap_err()).0, 1);
    drop(pipe);
    drop(buffers);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_plan_matches_its_host_twin() {
    let gpu = Gpu::open(0).expect("GPU 0");
    let (experts, tokens) = (6, 2500);
    let (mut pipe, buffers, bases) = rank_0_of_two(&gpu, experts, tokens);
    let s = pipe.shape;
    let (h, k, el) = (s.hidden, s.top_k, s.experts_per_rank());
    let layout = s.peer_layout();
    let Inputs {
        topk,
        weights,
        x,
        x_sf,
    } = skewed_inputs(tokens, k, h, experts, 4, 9);
    let ours = pipe.set_inputs(&gpu, &x, &x_sf, &topk, &weights).unwrap();
    // Rank 1's row of our counts table, as its uf_count would publish it (rank 1 is a buffer here,
    // so no rank barrier: the stream orders our own row before uf_plan).
    let row_bytes = experts * size_of::<u32>();
    let publish = |theirs: &[u32]| {
        // SAFETY: row 1 of the counts region of our live buffer; nothing else is queued.
        unsafe {
            gpu.write_raw(
                bases[0] + (layout.counts.offset + row_bytes) as u64,
                bytemuck::cast_slice(theirs),
            )
        }
        .unwrap();
    };
    let theirs: Vec<u32> = (0..experts).map(|e| 5 * e as u32 + 2).collect();
    publish(&theirs);
    pipe.count_routes(&gpu).unwrap();
    pipe.plan_on_device(&gpu).unwrap();
    let device = pipe.plan_tables_on_device(&gpu).unwrap();
    pipe.check_errors(&gpu).unwrap();
    // Our row is in both ranks' tables.
    for (r, &base) in bases.iter().enumerate() {
        let mut row = vec![0u8; row_bytes];
        // SAFETY: row 0 of the counts region of a live buffer.
        unsafe { gpu.read_raw(base + layout.counts.offset as u64, &mut row) }.unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u8, u32>(&row),
            &ours[..],
            "rank {r}'s table: our counts row"
        );
    }
    let counts = vec![ours.clone(), theirs];
    pipe.set_plans(&gpu, &counts).unwrap();
    let host = pipe.plan_tables_on_device(&gpu).unwrap();
    assert_eq!(
        device, host,
        "device plan tables (first rows, offsets, rows) vs set_plans'"
    );
    eprintln!(
        "device plan == host plan: first rows {:?}, offsets {:?}, rows {:?}",
        host[0], host[1], host[2]
    );

    // Rank 1 claims more rows of one of our experts than our pools hold: refused on the device as
    // the host refuses it, and the next count starts clean.
    let mut flood: Vec<u32> = vec![0; experts];
    flood[el - 1] = s.pool_rows as u32;
    publish(&flood);
    pipe.count_routes(&gpu).unwrap();
    pipe.plan_on_device(&gpu).unwrap();
    let err = pipe.check_errors(&gpu).expect_err("the pools overflow");
    let want = PoolPlan::new(&[ours.clone(), flood], 0, el, s.pool_rows).unwrap_err();
    eprintln!("refused on the device: {err}");
    assert_eq!(err.to_string(), want.to_string());
    publish(&vec![1; experts]);
    pipe.count_routes(&gpu).unwrap();
    pipe.plan_on_device(&gpu).unwrap();
    pipe.check_errors(&gpu)
        .expect("a fitting plan after a refused one");
    drop(pipe);
    drop(buffers);
}
