//! [`KernelSpec`]: one specialization of one kernel. The JIT compiles it; every kernel crate lists its
//! specs so that `cargo xtask kernels` can compile all of them for every target and report resources.

use crate::Arch;

/// An in-memory file: (include name, contents). Layer crates export their device twins this way
/// (e.g. `fp_formats::CUDA_HEADER`); sources `#include "name"` them and NVRTC never touches the disk.
pub type Header = (&'static str, &'static str);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSpec {
    /// Registry name, shown by `cargo xtask kernels` and in compile errors; e.g. `cuda-rt/saxpy`.
    pub name: String,
    /// The translation unit: (file name for diagnostics, text).
    pub source: Header,
    pub headers: Vec<Header>,
    /// `-DNAME=VALUE` specialization constants, in order.
    pub defines: Vec<(String, String)>,
    /// Targets `cargo xtask kernels` compiles it for.
    pub arches: Vec<Arch>,
    /// `cargo xtask kernels` fails when an entry function of this spec spills registers.
    pub no_spill: bool,
    /// Pass `-lineinfo`: source lines for profilers and compute-sanitizer; the code is unchanged.
    pub line_info: bool,
}

impl KernelSpec {
    /// A spec for every [`Arch`], with line info, spills allowed.
    pub fn new(name: impl Into<String>, source: Header) -> Self {
        Self {
            name: name.into(),
            source,
            headers: Vec::new(),
            defines: Vec::new(),
            arches: Arch::ALL.to_vec(),
            no_spill: false,
            line_info: true,
        }
    }

    pub fn header(mut self, header: Header) -> Self {
        self.headers.push(header);
        self
    }

    /// Several headers, e.g. a crate's header with the ones it includes.
    pub fn headers(mut self, headers: impl IntoIterator<Item = Header>) -> Self {
        self.headers.extend(headers);
        self
    }

    pub fn define(mut self, name: impl Into<String>, value: impl std::fmt::Display) -> Self {
        self.defines.push((name.into(), value.to_string()));
        self
    }

    pub fn arches(mut self, arches: &[Arch]) -> Self {
        self.arches = arches.to_vec();
        self
    }

    pub fn no_spill(mut self) -> Self {
        self.no_spill = true;
        self
    }
}
