//! The GPU architectures this workspace compiles for.

use std::fmt;

/// A compile target. The `a` variants unlock the architecture-specific instructions (WGMMA, `setmaxnreg`
/// on sm_90a; tcgen05 on sm_100a) and run only on exactly that compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Hopper: H100, H200.
    Sm90a,
    /// Blackwell datacenter: B200, GB200.
    Sm100a,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Sm90a, Arch::Sm100a];

    /// The NVRTC `--gpu-architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
        }
    }

    /// The compute capability a cubin for this target runs on.
    pub fn compute_capability(self) -> (u32, u32) {
        match self {
            Arch::Sm90a => (9, 0),
            Arch::Sm100a => (10, 0),
        }
    }

    /// The target for a device of compute capability `cc`, if we compile for it.
    pub fn for_compute_capability(cc: (u32, u32)) -> Option<Arch> {
        Self::ALL.into_iter().find(|a| a.compute_capability() == cc)
    }

    /// Parses `sm_90a` / `sm_100a`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
