//! `cuda-rt`: the thin, checked layer between the megamoe crates and the GPU.
//!
//! Layering follows cudarc, which it builds on: cudarc's `sys` (raw FFI) and safe API underneath, and
//! here a checked API in which every fallible call returns [`Error`] — none panics on a machine without
//! a driver, a GPU or a CUDA toolkit (cudarc itself panics there, so every entry point checks first).
//!
//! # Map
//!
//! | module | owns |
//! |---|---|
//! | [`device`] | [`Gpu::list`], [`Gpu::open`], [`DeviceInfo`] (name, SMs, compute capability, opt-in shared memory, L2, PCI bus id); the primary context and stream; `alloc_zeros` / `upload` / `download` / `memset`; the count of device allocations made through a handle (`Gpu::device_allocations`) |
//! | [`green`] | [`Gpu::split`]: one device as handles whose streams run on their own shares of the SMs (green contexts), for ranks that share a GPU |
//! | [`arch`] | [`Arch`]: `sm_90a` (Hopper, runs here) and `sm_100a` (Blackwell, compiles here) |
//! | [`toolkit`] | [`Toolkit::locate`]: `$CUDA_PATH`, then `$MEGAMOE_CUDA_TOOLCHAIN` (the checkout's `.cuda/toolkit`, set in `.cargo/config.toml`), then `/usr/local/cuda` |
//! | [`spec`] | [`KernelSpec`]: source + in-memory headers ([`Header`]) + `-D` defines + targets + `no_spill`; the unit of the kernel registry behind `cargo xtask kernels` |
//! | [`jit`] | [`Jit::compile`]: NVRTC → **cubin** with the on-disk cache (`$MEGAMOE_CACHE/jit` or `~/.cache/megamoe/jit`, keyed by BLAKE3 of source, headers, options, arch and NVRTC version); [`Compiled`], [`CompileOutcome`] |
//! | `nvrtc` (private) | loading `libnvrtc.so.13` from the toolkit without `LD_LIBRARY_PATH`; the raw compile |
//! | `cache` (private) | the cache files, written atomically |
//! | [`ptxas`] | [`KernelResources`] (registers, spills, stack, static smem) parsed from the ptxas `-v` report |
//! | [`module`] | [`Gpu::load_module`] → [`Module`] → [`Kernel`]; dynamic shared memory past 48 KiB |
//! | [`launch`] | [`LaunchConfig`] (cluster shape, cooperative, programmatic dependent launch) and the [`Launch`] argument builder, over `cuLaunchKernelEx`; [`LaunchArgs`], arguments assembled once for a launch that repeats (`Kernel::launch_with`: no allocation); the occupancy of a persistent grid (resident clusters, blocks per SM) |
//! | [`tma`] | [`TensorMapDesc`] with field-by-field validation ([`TmaError`]) and `cuTensorMapEncodeTiled` → [`TensorMap`] |
//! | [`peer`] | [`Gpu::enable_peer_access`], [`enable_peer_access_all`] |
//! | [`vmm`] | [`SharedMemory`] (`cuMemCreate`, export/import as a POSIX fd) and its [`Mapping`]s (reserve, map, access per device); copies and memsets on raw device addresses (`Gpu::write_raw`, `read_raw`, `memset_raw`, `copy_peer_raw`) |
//! | [`timing`] | CUDA-event timing: [`GpuTimer`] (start/stop), [`timing::EventTrail`] (marks along a stream, the time between any two) |
//! | [`telemetry`] | [`Telemetry`]: the SM clock and board power over a benchmark's samples ([`Reading`]), NVML loaded at run time and read on a thread of its own; none without NVML |
//! | [`selftest`] | the kernels this crate tests itself with on a GPU |
//! | [`testing`] | helpers for GPU tests: [`testing::gpus_or_skip`] |
//! | [`CUDA_HEADER`] | `cuda/cuda_rt.cuh`: `CUtensorMap` for NVRTC-compiled kernels (cuda.h does not compile under NVRTC); `launch_dependents` / `wait_for_predecessor`, the device side of a programmatic launch |
//!
//! Device memory is cudarc's [`CudaSlice`]; this crate does not wrap it.
//!
//! # Tests
//!
//! Plain `cargo test` runs everything that needs no GPU, NVRTC included: it requires the toolkit
//! (`scripts/cuda-toolchain.sh`) and fails with that hint otherwise. GPU tests are `#[ignore = "needs a
//! CUDA GPU"]` and run with `cargo xtask test-gpu` or from `cargo xtask gpu-bundle`; without a GPU they
//! fail. One that cannot run on the machine at hand (e.g. needs 2 GPUs) prints `SKIP: <why>` and
//! returns, and the bundle's `run.sh` reports it as a skip, not a pass.

pub mod arch;
mod cache;
pub mod device;
mod error;
pub mod green;
pub mod jit;
pub mod launch;
pub mod module;
mod nvrtc;
pub mod peer;
pub mod ptxas;
pub mod selftest;
pub mod spec;
pub mod telemetry;
pub mod testing;
pub mod timing;
pub mod tma;
pub mod toolkit;
pub mod vmm;

pub use arch::Arch;
pub use cache::CACHE_ENV;
pub use device::{DeviceInfo, Gpu, driver_present};
pub use error::{Error, Result};
pub use jit::{CompileOutcome, Compiled, Jit};
pub use launch::{ArgIndex, Launch, LaunchArgs, LaunchConfig};
pub use module::{Kernel, Module};
pub use nvrtc::NvrtcVersion;
pub use peer::enable_peer_access_all;
pub use ptxas::{KernelResources, parse_ptxas_log};
pub use spec::{Header, KernelSpec};
pub use telemetry::{Reading, Sampling, Telemetry};
pub use timing::GpuTimer;
pub use tma::{
    Interleave, L2Promotion, OobFill, Swizzle, TensorMap, TensorMapDesc, TmaDataType, TmaError,
};
pub use toolkit::Toolkit;
pub use vmm::{Mapping, SharedMemory};

/// The device header (`#include "cuda_rt.cuh"`): `CUtensorMap` for kernels compiled by NVRTC, and the
/// grid-dependency calls of a programmatic launch ([`LaunchConfig::programmatic`]).
pub const CUDA_HEADER: Header = ("cuda_rt.cuh", include_str!("../cuda/cuda_rt.cuh"));

/// cudarc, re-exported so dependants use the same version: `CudaSlice`, `CudaStream`, `sys`, ...
pub use cudarc;
pub use cudarc::driver::{CudaSlice, CudaStream};
