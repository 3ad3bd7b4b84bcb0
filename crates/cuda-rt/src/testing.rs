//! Helpers for GPU and NVRTC tests shared by every crate: the multi-GPU check, the JIT with the
//! toolkit hint, a GPU with a spec's module loaded.

use crate::{Gpu, Jit, KernelSpec, Module};

/// Environment variable: the number of GPUs a run promises (`cargo xtask test-multigpu` sets 2).
/// Under it, a test that needs more GPUs than the machine has fails instead of skipping.
pub const REQUIRE_GPUS_ENV: &str = "MEGAMOE_REQUIRE_GPUS";

/// Whether `needed` GPUs are present. If not, prints `SKIP: needs N GPUs, found M` (the line the
/// bundle's run.sh reports) and returns false — or panics when [`REQUIRE_GPUS_ENV`] promises at
/// least `needed`, so a multi-GPU run cannot pass by skipping. Panics without a driver or GPU.
pub fn gpus_or_skip(needed: usize) -> bool {
    let found = Gpu::count().unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    if found >= needed {
        return true;
    }
    let promised = std::env::var(REQUIRE_GPUS_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    if promised.is_some_and(|p| p >= needed) {
        panic!(
            "needs {needed} GPUs, found {found}, but {REQUIRE_GPUS_ENV} promises {}",
            promised.unwrap()
        );
    }
    eprintln!("SKIP: needs {needed} GPUs, found {found}");
    false
}

/// The JIT for tests: NVRTC from the project's toolkit, with the hint to install it when missing.
pub fn jit() -> Jit {
    Jit::new().unwrap_or_else(|e| {
        panic!("{e}\nNVRTC tests need the CUDA toolkit: run scripts/cuda-toolchain.sh first")
    })
}

/// GPU 0 and `spec` compiled for it and loaded (panics with the reason when either is missing).
pub fn gpu_with_module(spec: &KernelSpec) -> (Gpu, Module) {
    let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    let arch = gpu
        .info()
        .arch()
        .expect("a GPU of an architecture the kernels are built for");
    let compiled = jit()
        .compile(spec, arch)
        .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
    let module = gpu
        .load_module(&compiled.cubin)
        .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
    (gpu, module)
}

/// Builds a host program that includes a device twin (`.cuh` headers that also compile as plain
/// C++) with g++ into `dir`, and returns its path. A missing compiler is a broken test machine,
/// not a pass: it panics with the fix.
pub fn build_host_twin(source: &std::path::Path, dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let exe = dir.join(source.file_stem().expect("a source file name"));
    let build = std::process::Command::new("g++")
        .args(["-std=c++17", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(source)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "g++ is needed to build {} (apt-get install g++): {e}",
                source.display()
            )
        });
    assert!(
        build.status.success(),
        "g++ failed on {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&build.stderr)
    );
    exe
}
