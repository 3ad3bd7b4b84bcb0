//! `moe-sched` owns how MegaMoE's work is ordered, as a host model with a device twin
//! (`cuda/scheduler.cuh`) that follows the same rules:
//!
//! - [`routing`]: routing statistics from every rank's `topk_idx`;
//! - [`heuristics`]: BLOCK_M and experts-per-wave from the expected load;
//! - [`wave`]: the wave scheduler (per wave, all L1 blocks then all L2 blocks) and one
//!   persistent worker's walk over it;
//! - [`interleave`]: the "peel the minimum remaining" order of source ranks in an expert's pool;
//! - [`plan`]: a config's block sizes, waves, traffic and FLOPs per rank.
//!
//! The buffers the work runs on — the symmetric buffer's regions, the pool plan, a pool row's
//! source — are the buffer protocol's (`megamoe_kernel::protocol`).

pub mod error;
pub mod heuristics;
pub mod interleave;
pub mod plan;
pub mod routing;
pub mod wave;

pub use error::SchedError;
pub use interleave::{peel_interleave, peel_interleave_slot};
pub use plan::{Plan, PlanConfig};
pub use routing::RoutingStats;
pub use wave::{Block, Layer, ScheduleShape, WaveSchedule, WorkerBlocks};

/// Kernels that run the device twin in this crate's GPU tests (`cargo xtask kernels` compiles them).
pub const PROBE_SOURCE: (&str, &str) = ("sched_probe.cu", include_str!("../cuda/sched_probe.cu"));

/// The device twin of this crate, for the JIT's in-memory include tree.
pub const CUDA_HEADER: (&str, &str) = ("scheduler.cuh", include_str!("../cuda/scheduler.cuh"));
