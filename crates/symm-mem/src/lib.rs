//! `symm-mem` owns the symmetric buffer of MegaMoE: one allocation of identical layout on every
//! rank, reached from peers by adding the difference of the two ranks' base addresses.
//!
//! - [`layout`]: the regions of the buffer (workspace counters, inputs, the L1/L2 pools, the
//!   combine buffer), their offsets and alignments, and the pool capacity that every valid routing
//!   fits in.
//! - [`device`]: the `#[repr(C)]` structs the kernel sees ([`SymmBuffer`], [`TokenSrc`]), pinned
//!   field by field against `cuda/symm_buffer.cuh`.
//! - [`world`]: the ranks and how they allocate the buffer: [`World::local`] (one process, a thread
//!   per GPU, peer access) and [`World::from_env`] (a process per GPU, VMM memory passed as fds over
//!   a Unix socket); host-side barriers and all-gathers; [`spawn_ranks`] to launch a world locally.

pub mod device;
pub mod error;
pub mod layout;
pub mod world;

pub use device::{SymmBuffer, TokenSrc};
pub use error::SymmError;
pub use layout::{BlockMs, ByteSize, Region, SymmLayout, SymmParams, pool_capacity};
pub use world::{ProcessEnv, SymmAllocation, World, WorldError, spawn_ranks};

/// Most ranks a buffer can span (one NVL72 domain); the device view has one offset slot each.
pub const MAX_RANKS: usize = 72;

/// Kernels that run the device twin in this crate's GPU tests (`cargo xtask kernels` compiles them).
pub const PROBE_SOURCE: (&str, &str) = ("symm_probe.cu", include_str!("../cuda/symm_probe.cu"));

/// The device twin of [`device`], for the JIT's in-memory include tree.
pub const CUDA_HEADER: (&str, &str) = ("symm_buffer.cuh", include_str!("../cuda/symm_buffer.cuh"));
