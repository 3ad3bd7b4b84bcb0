//! The crate's one error type. Every fallible call returns [`Error`]; nothing here panics on a machine
//! without a driver, a GPU or a toolkit.

use std::path::PathBuf;

use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;

use crate::Arch;
use crate::tma::TmaError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the CUDA driver library (libcuda.so.1) cannot be loaded: this machine has no NVIDIA driver"
    )]
    NoDriver,
    #[error("the CUDA driver reports no device")]
    NoDevice,
    #[error("device ordinal {ordinal} is out of range: the driver reports {count} device(s)")]
    InvalidOrdinal { ordinal: usize, count: usize },
    #[error("{call} failed: {source}")]
    Driver {
        call: &'static str,
        source: DriverError,
    },
    #[error(
        "no CUDA toolkit found (looked at {}); run scripts/cuda-toolchain.sh, or set CUDA_PATH",
        display_paths(searched)
    )]
    ToolkitNotFound { searched: Vec<PathBuf> },
    #[error(
        "NVRTC cannot be loaded from {}: {reason}; run scripts/cuda-toolchain.sh, or set CUDA_PATH",
        lib_dir.display()
    )]
    NvrtcNotFound { lib_dir: PathBuf, reason: String },
    #[error("{call} failed: {source}")]
    Nvrtc {
        call: &'static str,
        source: NvrtcError,
    },
    #[error("NVRTC failed to compile `{kernel}` for {arch}:\n{log}")]
    Compile {
        kernel: String,
        arch: Arch,
        log: String,
    },
    #[error("cannot load module: {0}")]
    InvalidModule(&'static str),
    #[error("the module has no entry function `{0}` (kernels should be declared extern \"C\")")]
    KernelNotFound(String),
    #[error("invalid kernel spec `{kernel}`: {reason}")]
    InvalidSpec { kernel: String, reason: String },
    #[error("invalid launch of `{kernel}`: {reason}")]
    InvalidLaunch { kernel: String, reason: String },
    #[error("cannot copy {len} elements into a device buffer of {capacity}")]
    CopyTooLong { len: usize, capacity: usize },
    #[error(
        "GPU {ordinal} split into {parts} shares would have {needed} streams of shares, but \
         CUDA_DEVICE_MAX_CONNECTIONS gives the process {connections} hardware queues; streams that \
         share a queue start in order, so one rank's grid could wait behind a peer's that waits \
         for it: set CUDA_DEVICE_MAX_CONNECTIONS={max} before CUDA starts, or split into fewer shares",
        max = crate::green::MAX_CONNECTIONS
    )]
    TooFewConnections {
        ordinal: usize,
        parts: usize,
        needed: usize,
        connections: usize,
    },
    #[error("device {from} cannot access device {to}'s memory (cuDeviceCanAccessPeer says no)")]
    PeerAccess { from: usize, to: usize },
    #[error(transparent)]
    Tma(#[from] TmaError),
}

fn display_paths(paths: &[PathBuf]) -> String {
    let names: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

/// Attaches the name of the failed call to a cudarc driver result.
pub(crate) trait DriverCall<T> {
    fn call(self, call: &'static str) -> Result<T>;
}

impl<T> DriverCall<T> for std::result::Result<T, DriverError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Driver { call, source })
    }
}

impl<T> DriverCall<T> for std::result::Result<T, NvrtcError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Nvrtc { call, source })
    }
}
