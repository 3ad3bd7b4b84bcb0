//! The engine's forward (`CudaRank::forward_device`): inputs already on the device, y into the
//! caller's buffer, queued on the caller's stream with no host synchronization. A forward queued
//! behind a 50 ms kernel returns at once and its y, once the stream is done, equals the host
//! forward's bit for bit; a CUDA graph captured once (T read from the device) replays three
//! different inputs and T to the eager forward's bits; a device T above the captured bound is
//! refused through the error word, and the next replay works. After warm-up no forward allocates
//! device memory: the count of the rank's GPU handle stands still across device forwards at
//! several T, graph replays and host forwards on both paths. A rank that never launches its
//! forward leaves the others with the timeout naming it; after `recover` the next forward works.
//! An engine's BF16 activations and i64 expert ids give the bits of the host-quantized E4M3 and
//! i32 forward, and an i64 id past i32's range is refused with its full value. A rank built from
//! weights already on the device forwards as one built from the same weights on the host. The
//! safe layer over cudarc views gives the same bits and refuses a view shorter than T needs.

use std::time::{Duration, Instant};

use cuda_rt::cudarc::driver::DevicePtr;
use cuda_rt::cudarc::driver::sys;
use cuda_rt::{Arch, KernelSpec, LaunchConfig};
use fp_formats::bf16;
use megamoe::cuda::{
    ActivationFormat, ActivationsView, CudaError, CudaRank, DeviceBatch, DeviceRankWeights,
    ForwardPath, IdsView, IndexWidth, InputViews, Placement, TokenCount, driver, run_local,
};
use megamoe::{Config, RankInputs, Recipe};
use megamoe_kernel::protocol::ProtocolError;
use megamoe_kernel::unfused::UnfusedError;
use megamoe_kernel::{Mma, Routes};

use megamoe_problems::testing::generated_problem;

const SPIN: (&str, &str) = (
    "spin.cu",
    r#"extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}"#,
);

fn same_bits(a: &[bf16], b: &[bf16]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
        + a.len().abs_diff(b.len())
}

/// The host forward (fused, the given tile) of `inputs`: what the device forward must equal.
fn host_y(rank: &mut CudaRank, inputs: &RankInputs, tile: usize) -> Result<Vec<bf16>, CudaError> {
    rank.set_path(ForwardPath::Fused);
    rank.set_fused_tile(Some(tile));
    rank.poison()?;
    Ok(rank.forward(inputs)?.0)
}

fn engine_case(config: Config, routes: Routes, max: usize) {
    let p = generated_problem(config, max, 111, 0.1);
    let q = generated_problem(config, max, 112, 0.1);
    let spin_spec = KernelSpec::new("megamoe/tests/spin", SPIN).arches(&[Arch::Sm90a]);
    let what = format!("{}/{routes}", config.recipe);
    run_local(Placement::one_gpu(1), |world| {
        let gpu = world.local_gpu();
        let mut rank = CudaRank::new(world.clone(), &config, max, routes, &p.weights[0])?;
        let compiled = rank.warm_up_fused()?;
        let jit = cuda_rt::testing::jit();
        let spin = gpu
            .load_module(&jit.compile(&spin_spec, Arch::Sm90a)?.cubin)?
            .kernel("spin")?;
        let stream = driver("new_stream", gpu.stream().context().new_stream())?;
        let mut dev = DeviceBatch::new(&stream, &config, max)?;

        // Behind 50 ms of other work on the caller's stream: the call returns at once.
        let inputs = &p.inputs[0];
        let tile = rank.pipeline().fused_tile(inputs.tokens, None);
        let want = host_y(&mut rank, inputs, tile)?;
        dev.upload(inputs)?;
        // SAFETY: one thread, no buffers.
        unsafe {
            spin.launch(&stream, LaunchConfig::linear(1, 32))
                .scalar(50_000_000u64)
                .launch()?
        };
        let clock = Instant::now();
        // SAFETY: the buffers hold `inputs` on this GPU and live until the stream is done. (The
        // raw layer: the stream as a CUstream.)
        unsafe { rank.forward_device_raw(stream.cu_stream(), &dev.io(false))? };
        let queued = clock.elapsed();
        driver("synchronize", stream.synchronize())?;
        let done = clock.elapsed();
        rank.check_device_forward()?;
        let got = dev.y()?;
        eprintln!(
            "{what}: {compiled} fused kernels warm; forward_device returned after {:.1} us, the stream was done after {:.1} ms; {} of {} values differ from the host forward",
            queued.as_secs_f64() * 1e6,
            done.as_secs_f64() * 1e3,
            same_bits(&got, &want),
            want.len()
        );
        assert!(queued < Duration::from_millis(5), "{what}: forward_device waited {queued:?}");
        assert!(done >= Duration::from_millis(50), "{what}: the stream finished before its spin");
        assert_eq!(same_bits(&got, &want), 0, "{what}: the device forward's y differs");

        // One graph, captured with T read from the device, replayed on three inputs and T.
        let bound = max;
        let tile = rank.pipeline().fused_tile(bound, None);
        dev.upload(inputs)?;
        driver(
            "begin_capture",
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )?;
        // SAFETY: as above; the graph reads the same buffers at every replay.
        let queued = unsafe { rank.forward_device(&stream, &dev.io(true)) };
        let graph = driver("end_capture", stream.end_capture(sys::CUgraphInstantiate_flags(0)))?
            .expect("a captured graph");
        queued?;
        let cases = [
            inputs.clone(),
            q.inputs[0].first(&config, max / 2),
            p.inputs[0].first(&config, 7),
        ];
        for case in &cases {
            dev.upload(case)?;
            driver("graph launch", graph.launch())?;
            driver("synchronize", stream.synchronize())?;
            rank.check_device_forward()?;
            let got = dev.y()?;
            let want = host_y(&mut rank, case, tile)?;
            eprintln!(
                "{what}: graph replay at T = {}: {} of {} values differ from the eager forward",
                case.tokens,
                same_bits(&got, &want),
                want.len()
            );
            assert_eq!(same_bits(&got, &want), 0, "{what}: replay at T = {}", case.tokens);
        }
        // A device T above the bound the graph was captured for is refused, and the next works.
        dev.set_tokens(bound as i32 + 1)?;
        driver("graph launch", graph.launch())?;
        driver("synchronize", stream.synchronize())?;
        match rank.check_device_forward() {
            Err(CudaError::Unfused(UnfusedError::DeviceTokens { tokens, max })) => {
                assert_eq!((tokens, max), (bound as i64 + 1, bound), "{what}");
            }
            other => panic!("{what}: a device T past the bound gave {other:?}"),
        }
        dev.upload(&cases[1])?;
        driver("graph launch", graph.launch())?;
        driver("synchronize", stream.synchronize())?;
        rank.check_device_forward()?;
        let want = host_y(&mut rank, &cases[1], tile)?;
        assert_eq!(same_bits(&dev.y()?, &want), 0, "{what}: after the refusal");

        // A NaN scale only the device sees (x_sf in the engine's buffer) is refused through the
        // error word, and the next forward works.
        let mut nan = cases[2].clone();
        let groups = config.hidden / config.recipe.group();
        nan.x_sf[3 * groups + 1] = 0xff;
        dev.upload(&nan)?;
        driver("graph launch", graph.launch())?;
        driver("synchronize", stream.synchronize())?;
        match rank.check_device_forward() {
            Err(CudaError::Unfused(UnfusedError::NanScale { token, group })) => {
                assert_eq!((token, group), (3, 1), "{what}");
            }
            other => panic!("{what}: a NaN scale gave {other:?}"),
        }
        dev.upload(&cases[1])?;
        driver("graph launch", graph.launch())?;
        driver("synchronize", stream.synchronize())?;
        rank.check_device_forward()?;
        assert_eq!(same_bits(&dev.y()?, &want), 0, "{what}: after the NaN scale");
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
}

/// `case` on the engine tests' shapes: tiny g128/fp8 and mx32/bf16 (256 tokens at most),
/// V4-Flash's per-rank shape g128/fp8 (128).
fn on_engine_shapes(case: fn(Config, Routes, usize)) {
    case(
        Config::tiny().with_recipe(Recipe::G128),
        Routes::both(Mma::Fp8),
        256,
    );
    case(Config::tiny(), Routes::EXACT, 256);
    let flash = Config {
        num_experts: 16,
        ..Config::deepseek_v4_flash()
    };
    case(flash.with_recipe(Recipe::G128), Routes::both(Mma::Fp8), 128);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_forward_on_the_callers_stream_and_in_a_graph() {
    on_engine_shapes(engine_case);
}

/// Fresh BF16 activations `[T][H]` that tell the quantizer's cases apart: per token a scale from
/// 2^-12 to 2^12, per 32 channels a spread of 1 to 2^6 (so the groups of 32 and 128 differ), a
/// zero group now and then, and values past E4M3's range at the largest scales.
fn bf16_activations(tokens: usize, hidden: usize, seed: u64) -> Vec<bf16> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut x = Vec::with_capacity(tokens * hidden);
    for _ in 0..tokens {
        let token_scale = 2f32.powi((next() % 25) as i32 - 12);
        for _ in 0..hidden / 32 {
            let zero = next() % 97 == 0;
            let spread = 2f32.powi((next() % 7) as i32);
            for _ in 0..32 {
                let u = (next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                x.push(bf16::from_f32(if zero {
                    0.0
                } else {
                    u * spread * token_scale
                }));
            }
        }
    }
    x
}

/// `inputs` with `x` (BF16) quantized on the host as the generator quantizes.
fn host_quantized(config: &Config, inputs: &RankInputs, x: &[bf16]) -> RankInputs {
    let (h, g) = (config.hidden, config.act_group());
    let mut q = RankInputs {
        x: vec![0; inputs.tokens * h],
        x_sf: vec![0; inputs.tokens * h / g],
        ..inputs.clone()
    };
    for t in 0..inputs.tokens {
        let row: Vec<f32> = x[t * h..][..h].iter().map(|v| v.to_f32()).collect();
        fp_formats::quant::quantize_act_row(
            &row,
            g,
            &mut q.x[t * h..][..h],
            &mut q.x_sf[t * h / g..][..h / g],
        );
    }
    q
}

/// An engine's own formats: BF16 x (quantized in the kernel) and i64 ids, alone and together,
/// at two T: y bit for bit the host forward of the host-quantized E4M3 inputs with i32 ids. An
/// i64 id past i32's range is refused with its full value, and the next forward works.
fn input_formats_case(config: Config, routes: Routes, max: usize) {
    let p = generated_problem(config, max, 114, 0.1);
    let what = format!("{}/{routes}", config.recipe);
    run_local(Placement::one_gpu(1), |world| {
        let gpu = world.local_gpu();
        let mut rank = CudaRank::new(world.clone(), &config, max, routes, &p.weights[0])?;
        rank.warm_up_fused()?;
        let stream = driver("new_stream", gpu.stream().context().new_stream())?;
        let x = bf16_activations(max, config.hidden, 115);
        for tokens in [max, 7] {
            let routed = p.inputs[0].first(&config, tokens);
            let x = &x[..tokens * config.hidden];
            let quantized = host_quantized(&config, &routed, x);
            let tile = rank.pipeline().fused_tile(tokens, None);
            let want = host_y(&mut rank, &quantized, tile)?;
            for (x_format, width) in [
                (ActivationFormat::Bf16, IndexWidth::I64),
                (ActivationFormat::Bf16, IndexWidth::I32),
                (ActivationFormat::E4m3, IndexWidth::I64),
            ] {
                let mut dev = DeviceBatch::with_formats(&stream, &config, max, x_format, width)?;
                match x_format {
                    ActivationFormat::E4m3 => dev.upload(&quantized)?,
                    ActivationFormat::Bf16 => dev.upload_bf16(x, &quantized)?,
                }
                // SAFETY: the buffers hold the batch on this GPU and live until the stream is done.
                unsafe { rank.forward_device(&stream, &dev.io(false))? };
                driver("synchronize", stream.synchronize())?;
                rank.check_device_forward()?;
                let got = dev.y()?;
                eprintln!(
                    "{what}: T = {tokens}, {x_format:?} x, {width:?} ids: {} of {} values differ \
                     from the host-quantized forward",
                    same_bits(&got, &want),
                    want.len()
                );
                assert_eq!(
                    same_bits(&got, &want),
                    0,
                    "{what}: T = {tokens}, {x_format:?} x, {width:?} ids"
                );
            }
        }

        // An id only the device sees, past i32's range: refused with its value; then a forward works.
        let routed = p.inputs[0].first(&config, 7);
        let x = &x[..7 * config.hidden];
        let mut bad = routed.clone();
        bad.topk_idx[2 * config.top_k + 1] = 1 << 40;
        let mut dev = DeviceBatch::with_formats(
            &stream,
            &config,
            max,
            ActivationFormat::Bf16,
            IndexWidth::I64,
        )?;
        dev.upload_bf16(x, &bad)?;
        // SAFETY: as above.
        unsafe { rank.forward_device(&stream, &dev.io(false))? };
        driver("synchronize", stream.synchronize())?;
        match rank.check_device_forward() {
            Err(CudaError::Unfused(UnfusedError::Protocol(ProtocolError::Expert {
                token,
                slot,
                value,
                ..
            }))) => assert_eq!((token, slot, value), (2, 1, 1 << 40), "{what}"),
            other => panic!("{what}: an i64 id of 2^40 gave {other:?}"),
        }
        dev.upload_bf16(x, &routed)?;
        // SAFETY: as above.
        unsafe { rank.forward_device(&stream, &dev.io(false))? };
        driver("synchronize", stream.synchronize())?;
        rank.check_device_forward()?;
        let tile = rank.pipeline().fused_tile(7, None);
        let want = host_y(&mut rank, &host_quantized(&config, &routed, x), tile)?;
        assert_eq!(
            same_bits(&dev.y()?, &want),
            0,
            "{what}: after the refused id"
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_activations_and_i64_ids_give_the_host_quantized_bits() {
    on_engine_shapes(input_formats_case);
}

/// Weights an engine already holds on the device (`CudaRank::from_device_weights`): the rank's
/// forward is bit for bit that of a rank built from the same weights on the host.
#[test]
#[ignore = "needs a CUDA GPU"]
fn weights_on_the_device_give_the_host_weights_forward() {
    let config = Config::tiny().with_recipe(Recipe::G128);
    let routes = Routes::both(Mma::Fp8);
    let p = generated_problem(config, 64, 116, 0.1);
    run_local(Placement::one_gpu(1), |world| {
        let w = &p.weights[0];
        let stream = world.local_gpu().stream().clone();
        let upload = |host: &[u8]| driver("cuMemcpyHtoD", stream.clone_htod(host));
        let (w1, w1_sf) = (upload(&w.w1)?, upload(&w.w1_sf)?);
        let (w2, w2_sf) = (upload(&w.w2)?, upload(&w.w2_sf)?);
        let on_device = DeviceRankWeights {
            w1: w1.device_ptr(&stream).0,
            w1_sf: w1_sf.device_ptr(&stream).0,
            w2: w2.device_ptr(&stream).0,
            w2_sf: w2_sf.device_ptr(&stream).0,
        };
        let mut ys = Vec::new();
        for from_device in [true, false] {
            let mut rank = if from_device {
                // SAFETY: the four tensors of the rank's shape, on its GPU, alive and unwritten.
                unsafe {
                    CudaRank::from_device_weights(world.clone(), &config, 64, routes, &on_device)?
                }
            } else {
                CudaRank::new(world.clone(), &config, 64, routes, w)?
            };
            rank.set_path(ForwardPath::Fused);
            rank.poison()?;
            ys.push(rank.forward(&p.inputs[0])?.0);
        }
        eprintln!(
            "weights on the device: {} of {} values differ from the host weights' forward",
            same_bits(&ys[0], &ys[1]),
            ys[1].len()
        );
        assert_eq!(same_bits(&ys[0], &ys[1]), 0, "weights read from the device");
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:?}"));
}

/// The safe layer (`CudaRank::forward_views`): an engine's cudarc tensors — BF16 x and i64 ids
/// here — give the host-quantized forward's bits; a view shorter than T needs is refused by name
/// before anything is queued, and the next forward works.
#[test]
#[ignore = "needs a CUDA GPU"]
fn forward_views_checks_lengths_and_gives_the_host_bits() {
    let config = Config::tiny().with_recipe(Recipe::G128);
    let routes = Routes::both(Mma::Fp8);
    let max = 64;
    let p = generated_problem(config, max, 117, 0.1);
    run_local(Placement::one_gpu(1), |world| {
        let gpu = world.local_gpu();
        let mut rank = CudaRank::new(world.clone(), &config, max, routes, &p.weights[0])?;
        rank.warm_up_fused()?;
        let stream = driver("new_stream", gpu.stream().context().new_stream())?;
        let tokens = 40;
        let routed = p.inputs[0].first(&config, tokens);
        let x = bf16_activations(tokens, config.hidden, 118);
        let want = {
            let tile = rank.pipeline().fused_tile(tokens, None);
            host_y(&mut rank, &host_quantized(&config, &routed, &x), tile)?
        };
        let bits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
        let x_dev = driver("cuMemcpyHtoD", stream.clone_htod(&bits))?;
        let ids = driver("cuMemcpyHtoD", stream.clone_htod(&routed.topk_idx))?;
        let weights = driver("cuMemcpyHtoD", stream.clone_htod(&routed.topk_weights))?;
        let poison = vec![0xffffu16; tokens * config.hidden];
        let mut y = driver("cuMemcpyHtoD", stream.clone_htod(&poison))?;
        let inputs = |ids_len: usize| InputViews {
            activations: ActivationsView::Bf16 { x: x_dev.as_view() },
            topk_idx: IdsView::I64(ids.slice(..ids_len)),
            topk_weights: weights.as_view(),
            tokens: TokenCount::Host(tokens),
        };
        match rank.forward_views(&stream, &inputs(ids.len() - 1), &mut y.as_view_mut()) {
            Err(CudaError::DeviceTensorLength { tensor, .. }) => assert_eq!(tensor, "topk_idx"),
            other => panic!("a short topk_idx view gave {other:?}"),
        }
        rank.forward_views(&stream, &inputs(ids.len()), &mut y.as_view_mut())?;
        driver("synchronize", stream.synchronize())?;
        rank.check_device_forward()?;
        let got: Vec<bf16> = driver("cuMemcpyDtoH", stream.clone_dtoh(&y))?
            .into_iter()
            .map(bf16::from_bits)
            .collect();
        eprintln!(
            "forward_views: {} of {} values differ from the host-quantized forward",
            same_bits(&got, &want),
            want.len()
        );
        assert_eq!(same_bits(&got, &want), 0, "forward_views");
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:?}"));
}

/// No forward allocates device memory once its kernels are compiled: `CudaRank::device_allocations`
/// (every allocation through the rank's GPU handle) stands still across device forwards at four T,
/// a graph captured around one and replayed at two T, and host forwards on both paths.
fn allocation_free_case(config: Config, routes: Routes, max: usize) {
    let p = generated_problem(config, max, 113, 0.1);
    let what = format!("{}/{routes}", config.recipe);
    run_local(Placement::one_gpu(1), |world| {
        let gpu = world.local_gpu();
        let mut rank = CudaRank::new(world.clone(), &config, max, routes, &p.weights[0])?;
        rank.warm_up()?;
        rank.warm_up_fused()?;
        let stream = driver("new_stream", gpu.stream().context().new_stream())?;
        let mut dev = DeviceBatch::new(&stream, &config, max)?;
        let cases: Vec<RankInputs> = [max, max / 2, 7, 1]
            .map(|t| p.inputs[0].first(&config, t))
            .to_vec();
        let warm = rank.device_allocations();
        assert!(warm > 0, "{what}: the rank's buffers were not counted");

        for case in &cases {
            dev.upload(case)?;
            // SAFETY: the buffers hold `case` on this GPU and live until the stream is done.
            unsafe { rank.forward_device(&stream, &dev.io(false))? };
            driver("synchronize", stream.synchronize())?;
            rank.check_device_forward()?;
        }
        let eager = rank.device_allocations();

        dev.upload(&cases[0])?;
        driver(
            "begin_capture",
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )?;
        // SAFETY: as above; the graph reads the same buffers at every replay.
        let queued = unsafe { rank.forward_device(&stream, &dev.io(true)) };
        let graph = driver(
            "end_capture",
            stream.end_capture(sys::CUgraphInstantiate_flags(0)),
        )?
        .expect("a captured graph");
        queued?;
        for case in &cases[1..3] {
            dev.upload(case)?;
            driver("graph launch", graph.launch())?;
            driver("synchronize", stream.synchronize())?;
            rank.check_device_forward()?;
        }
        let replayed = rank.device_allocations();

        for path in [ForwardPath::Unfused, ForwardPath::Fused] {
            rank.set_path(path);
            rank.forward(&cases[1])?;
        }
        let host = rank.device_allocations();
        eprintln!(
            "{what}: {warm} device allocations after warm-up; after the device forwards {eager}, \
             the graph replays {replayed}, the host forwards {host}"
        );
        assert_eq!(
            [eager, replayed, host],
            [warm; 3],
            "{what}: forwards allocated device memory (after warm-up, device forwards, replays, \
             host forwards)"
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forwards_allocate_no_device_memory_after_warm_up() {
    allocation_free_case(
        Config::tiny().with_recipe(Recipe::G128),
        Routes::both(Mma::Fp8),
        256,
    );
    let flash = Config {
        num_experts: 16,
        ..Config::deepseek_v4_flash()
    };
    allocation_free_case(flash.with_recipe(Recipe::G128), Routes::both(Mma::Fp8), 128);
}

/// A rank that never launches its forward: with two ranks sharing the GPU, rank 1 skips one
/// device forward; rank 0's forward comes back (within a few timeouts, no hang) with the timeout
/// naming rank 1 at its first device meeting. After `recover` on both ranks, the next forward of
/// both is bit for bit their first one's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_rank_that_never_launches_times_out_and_the_next_forward_works() {
    let config = Config::tiny().with_recipe(Recipe::G128).with_ranks(2);
    let routes = Routes::both(Mma::Fp8);
    let tokens = 64;
    let p = generated_problem(config, tokens, 113, 0.1);
    let timeout = Duration::from_millis(300);
    run_local(Placement::one_gpu(2), |world| {
        let r = world.rank();
        let mut rank = CudaRank::new(world.clone(), &config, tokens, routes, &p.weights[r])?;
        rank.set_barrier_timeout(timeout);
        rank.warm_up_fused()?;
        let stream = driver(
            "new_stream",
            world.local_gpu().stream().context().new_stream(),
        )?;
        let mut dev = DeviceBatch::new(&stream, &config, tokens)?;
        dev.upload(&p.inputs[r])?;
        // Both ranks warm (a cold JIT cache keeps one compiling for seconds) before the first
        // forward, whose device meetings then wait well within this test's short timeout.
        world.barrier()?;
        let forward = |rank: &mut CudaRank| -> Result<Duration, CudaError> {
            let clock = Instant::now();
            // SAFETY: the buffers hold this rank's inputs on its GPU and live past the sync.
            unsafe { rank.forward_device(&stream, &dev.io(false))? };
            driver("synchronize", stream.synchronize())?;
            Ok(clock.elapsed())
        };

        forward(&mut rank)?;
        rank.check_device_forward()?;
        let first = dev.y()?;

        world.barrier()?;
        if r == 0 {
            let waited = forward(&mut rank)?;
            let err = rank
                .check_device_forward()
                .expect_err("rank 1 never launched");
            eprintln!("rank 0, alone, after {waited:?}: {err}");
            assert!(err.to_string().contains("rank 1 had not reached"), "{err}");
            assert!(
                waited >= timeout && waited < 10 * timeout,
                "waited {waited:?}"
            );
        }

        rank.recover()?;
        forward(&mut rank)?;
        rank.check_device_forward()?;
        assert_eq!(
            same_bits(&dev.y()?, &first),
            0,
            "rank {r}: the forward after recovering differs from the first"
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:?}"));
}
