//! An inference engine's use of megamoe-rs, end to end: a world of R ranks (one per local GPU, or
//! all on GPU 0 with `--one-gpu`), each rank's weights loaded once and its fused kernels compiled
//! before the first forward, then forwards of varying T from device buffers on the engine's own
//! stream (no host synchronization inside a forward), one of them captured in a CUDA graph and
//! replayed with new inputs, every y checked against the CPU reference.
//!
//!     cargo run --release -p megamoe --example engine [-- --ranks R] [--one-gpu]

use std::error::Error;

use cuda_rt::cudarc::driver::sys;
use megamoe::cuda::{CudaRank, DeviceBatch, Placement, driver, run_local};
use megamoe::{Config, RankInputs, Recipe};
use megamoe_kernel::{Mma, Routes};
use megamoe_problems::check::calc_diff;
use megamoe_problems::generate::{self, GenOptions};
use megamoe_problems::reference;

const MAX_TOKENS: usize = 256;

fn main() -> Result<(), Box<dyn Error>> {
    // `--one-gpu` ranks each need a hardware queue of their own.
    // SAFETY: the first statement of main: no other thread runs yet.
    unsafe { megamoe::cuda::ask_for_every_connection() };
    let args: Vec<String> = std::env::args().collect();
    let ranks = args
        .iter()
        .position(|a| a == "--ranks")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(1), |r| r.parse())?;
    let placement = if args.iter().any(|a| a == "--one-gpu") {
        Placement::one_gpu(ranks)
    } else {
        Placement::one_gpu_per_rank(ranks)
    };
    let config = Config::tiny().with_recipe(Recipe::G128).with_ranks(ranks);
    let routes = Routes::both(Mma::Fp8);
    // Two batches per rank of MAX_TOKENS tokens; the forwards take their first T.
    let batches: Vec<_> = [21u64, 22]
        .map(|seed| {
            generate::problem(&GenOptions {
                config,
                tokens: MAX_TOKENS,
                seed,
                mask_fraction: 0.1,
            })
        })
        .into();
    let weights = &batches[0].weights;
    let steps: [(usize, usize); 4] = [(0, MAX_TOKENS), (1, 7), (0, 1), (1, 100)];
    let inputs = |b: usize, t: usize, r: usize| batches[b].inputs[r].first(&config, t);

    let ys = run_local(placement, |world| {
        let r = world.rank();
        let mut rank = CudaRank::new(world.clone(), &config, MAX_TOKENS, routes, &weights[r])?;
        let kernels = rank.warm_up_fused()?;
        let stream = driver(
            "new_stream",
            world.local_gpu().stream().context().new_stream(),
        )?;
        let mut batch = DeviceBatch::new(&stream, &config, MAX_TOKENS)?;
        let mut ys = Vec::new();
        // Eager forwards: upload, queue, and (here, to check) wait for y.
        for &(b, t) in &steps {
            batch.upload(&inputs(b, t, r))?;
            // SAFETY: the batch's buffers live on this rank's GPU until the stream is done.
            unsafe { rank.forward_device(&stream, &batch.io(false))? };
            let y = batch.y()?;
            rank.check_device_forward()?;
            ys.push(y);
        }
        // One graph for every T: captured once, replayed with new contents in the same buffers.
        driver(
            "begin_capture",
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )?;
        // SAFETY: as above; the graph reads the same buffers at every replay.
        let captured = unsafe { rank.forward_device(&stream, &batch.io(true)) };
        let graph = driver(
            "end_capture",
            stream.end_capture(sys::CUgraphInstantiate_flags(0)),
        )?
        .expect("a captured graph");
        captured?;
        for &(b, t) in &steps {
            batch.upload(&inputs(b, t, r))?;
            driver("cuGraphLaunch", graph.launch())?;
            let y = batch.y()?;
            rank.check_device_forward()?;
            ys.push(y);
        }
        if r == 0 {
            println!("rank 0: {kernels} fused kernels compiled before the first forward");
        }
        Ok(ys)
    })?;

    for (i, &(b, t)) in steps.iter().chain(&steps).enumerate() {
        let all: Vec<RankInputs> = (0..ranks).map(|r| inputs(b, t, r)).collect();
        let want = reference::forward(&config, weights, &all)?;
        for (r, y) in ys.iter().enumerate() {
            let got: Vec<f32> = y[i].iter().map(|v| v.to_f32()).collect();
            let w: Vec<f32> = want[r].iter().map(|v| v.to_f32()).collect();
            let diff = calc_diff(&got, &w);
            let path = if i < steps.len() { "eager" } else { "graph" };
            println!(
                "{path} forward {i}: rank {r}, T = {t}: calc_diff {diff:.2e} against the CPU reference"
            );
            if diff > 1e-3 || got.iter().any(|v| v.is_nan()) {
                return Err(format!("rank {r}, T = {t}: calc_diff {diff:.2e}").into());
            }
        }
    }
    println!("engine example: every y matches the CPU reference");
    Ok(())
}
