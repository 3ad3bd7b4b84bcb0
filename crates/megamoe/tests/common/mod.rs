//! What the GPU tests of the facade share: the routes they sweep and each route's bound against
//! the reference (their problems come from `megamoe_problems::testing`).
#![allow(dead_code)] // each test binary uses its own part

use std::sync::Arc;

use megamoe::cuda::{CudaError, CudaRank};
use megamoe::{Problem, Recipe};
use megamoe_kernel::{Mma, Routes};
use symm_mem::World;

pub const TOL: f64 = 1e-5;
/// The FP8 route's bound: Hopper's FP8 tensor core accumulates with ~14 bits inside each wgmma, and
/// SwiGLU's re-quantization turns the GEMM's 5e-7 into 1–3e-5 on V4 shapes; a token whose group
/// amax sits at a power-of-two boundary re-quantizes its whole group at the other scale (up to 1e-3
/// for that token): tiny, where one group spans all of I, measured 1.35e-4 at T = 8192 and 3.3e-4
/// on the demo's problem (H200, 2026-11-30). Routing or layout errors land near 1.
pub const FP8_TOL: f64 = 1e-3;

/// Every (recipe, routes) of the pipeline.
pub const ROUTES: [(Recipe, Routes); 4] = [
    (Recipe::Mx32, Routes::EXACT),
    (Recipe::G128, Routes::EXACT),
    (Recipe::G128, Routes::EXACT_L1),
    (Recipe::G128, Routes::both(Mma::Fp8)),
];

/// The acceptance bound of a route: the contract's, unless the L1 (whose output is re-quantized)
/// goes through FP8; an FP8 L2 is held to the contract's bound.
pub fn tol(routes: Routes) -> f64 {
    match routes.l1 {
        Mma::Bf16 => TOL,
        Mma::Fp8 => FP8_TOL,
    }
}

/// This rank's handle for `problem`, its pipeline sized for the problem's largest T.
pub fn rank_for(
    world: &Arc<World>,
    problem: &Problem,
    routes: Routes,
) -> Result<CudaRank, CudaError> {
    let max_tokens = problem.inputs.iter().map(|x| x.tokens).max().unwrap_or(0);
    CudaRank::new(
        world.clone(),
        &problem.config,
        max_tokens,
        routes,
        &problem.weights[world.rank()],
    )
}
