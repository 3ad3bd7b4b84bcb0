//! `symm-mem` owns symmetric memory: one allocation of the same size on every rank, reached from
//! peers by adding the difference of the two ranks' base addresses. What lies where in it is the
//! caller's (MegaMoE's regions: `megamoe_kernel::protocol`).
//!
//! - [`device`]: the `#[repr(C)]` view of every rank's buffer the kernels see ([`SymmBuffer`]),
//!   pinned field by field against `cuda/symm_buffer.cuh`.
//! - [`world`]: the ranks and how they allocate the buffer: [`World::local`] (one process, a thread
//!   per GPU, peer access) and [`World::from_env`] (a process per GPU, VMM memory passed as fds over
//!   a Unix socket); host-side barriers and all-gathers; [`spawn_ranks`] to launch a world locally.

pub mod device;
pub mod error;
pub mod world;

pub use device::SymmBuffer;
pub use error::SymmError;
pub use world::{ProcessEnv, SymmAllocation, World, WorldError, spawn_ranks};

/// Most ranks a buffer can span (one NVL72 domain); the device view has one offset slot each.
pub const MAX_RANKS: usize = 72;

/// Kernels that run the device twin in this crate's GPU tests (`cargo xtask kernels` compiles them).
pub const PROBE_SOURCE: (&str, &str) = ("symm_probe.cu", include_str!("../cuda/symm_probe.cu"));

/// The device twin of [`device`], for the JIT's in-memory include tree.
pub const CUDA_HEADER: (&str, &str) = ("symm_buffer.cuh", include_str!("../cuda/symm_buffer.cuh"));
