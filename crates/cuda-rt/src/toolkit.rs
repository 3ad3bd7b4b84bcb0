//! Finding the CUDA toolkit that NVRTC needs: its headers (`include/`, `include/cccl/`) and the directory
//! holding `libnvrtc.so.13`. No driver and no GPU are involved.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Set by the workspace's `.cargo/config.toml` to the checkout's `.cuda/toolkit`, where
/// `scripts/cuda-toolchain.sh` installs the pinned wheels; absent outside cargo.
pub const TOOLCHAIN_ENV: &str = "MEGAMOE_CUDA_TOOLCHAIN";

const SYSTEM_CUDA: &str = "/usr/local/cuda";

/// A CUDA toolkit on disk: `root` has `include/cuda.h` and a library directory with `libnvrtc.so*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolkit {
    root: PathBuf,
    lib_dir: PathBuf,
}

impl Toolkit {
    /// The first usable toolkit among `$CUDA_PATH`, `$MEGAMOE_CUDA_TOOLCHAIN` and `/usr/local/cuda`.
    pub fn locate() -> Result<Self> {
        let candidates: Vec<PathBuf> = [
            std::env::var_os("CUDA_PATH"),
            std::env::var_os(TOOLCHAIN_ENV),
        ]
        .into_iter()
        .flatten()
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .chain([PathBuf::from(SYSTEM_CUDA)])
        .collect();
        for root in &candidates {
            if let Some(toolkit) = Self::at(root) {
                tracing::debug!(root = %toolkit.root.display(), "CUDA toolkit found");
                return Ok(toolkit);
            }
            tracing::debug!(root = %root.display(), "not a usable CUDA toolkit");
        }
        Err(Error::ToolkitNotFound {
            searched: candidates,
        })
    }

    /// The toolkit rooted at `root`, if it has the headers and NVRTC.
    pub fn at(root: &Path) -> Option<Self> {
        if !root.join("include/cuda.h").is_file() {
            return None;
        }
        // System installs use lib64/, the wheels lib/.
        let lib_dir = ["lib64", "lib", "targets/x86_64-linux/lib"]
            .iter()
            .map(|d| root.join(d))
            .find(|d| d.join(NVRTC_SONAME).exists())?;
        Some(Self {
            root: root.to_path_buf(),
            lib_dir,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `libnvrtc.so.13` and `libnvrtc-builtins.so.13.*` live.
    pub fn lib_dir(&self) -> &Path {
        &self.lib_dir
    }

    /// `include/` and, where present, `include/cccl/` (CUDA 13 moved `cuda/`, `cub/`, `thrust/` there).
    pub fn include_dirs(&self) -> Vec<PathBuf> {
        let include = self.root.join("include");
        let cccl = include.join("cccl");
        let mut dirs = vec![include];
        if cccl.is_dir() {
            dirs.push(cccl);
        }
        dirs
    }
}

/// The NVRTC major this workspace binds (cudarc feature `cuda-13000`).
pub(crate) const NVRTC_SONAME: &str = "libnvrtc.so.13";
