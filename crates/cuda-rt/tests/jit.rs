//! NVRTC and the JIT cache. No GPU needed, but the CUDA toolkit is: without it these tests fail with a
//! hint to run scripts/cuda-toolchain.sh (the README's test command does), rather than skip.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cuda_rt::{Arch, CompileOutcome, Error, Jit, KernelSpec, selftest};

/// A fresh cache directory per test, removed afterwards.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("cuda-rt-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn jit(cache: &Path) -> Jit {
    match Jit::new() {
        Ok(jit) => jit.with_cache_dir(cache),
        Err(e) => {
            panic!("{e}\nNVRTC tests need the CUDA toolkit: run scripts/cuda-toolchain.sh first")
        }
    }
}

#[test]
fn compiles_the_selftest_kernels_to_cubin_for_both_arches() {
    let dir = TempDir::new("arches");
    let jit = jit(&dir.0);
    let spec = &selftest::kernels()[0];
    let mut cubins = Vec::new();
    for arch in Arch::ALL {
        let c = jit.compile(spec, arch).unwrap();
        assert_eq!(c.outcome, CompileOutcome::Compiled);
        assert_eq!(c.arch, arch);
        assert!(c.cubin.starts_with(b"\x7fELF"), "{arch}: not an ELF cubin");
        let mut names: Vec<_> = c.resources.iter().map(|r| r.name.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "cluster_ranks",
                "grid_barrier",
                "saxpy",
                "smem_reverse",
                "smid_rendezvous",
                "tma_load_2d"
            ],
            "{arch}: ptxas report:\n{}",
            c.log
        );
        for r in &c.resources {
            assert!(r.registers > 0 && !r.spills(), "{arch}: {r:?}");
        }
        let tile = c
            .resources
            .iter()
            .find(|r| r.name == "tma_load_2d")
            .unwrap();
        let box_bytes = selftest::TMA_BOX[0] * selftest::TMA_BOX[1] * 4;
        assert!(
            tile.smem_bytes >= box_bytes,
            "{tile:?}: the -D box size did not reach the kernel"
        );
        cubins.push(c.cubin);
    }
    assert_ne!(cubins[0], cubins[1]);
}

#[test]
fn a_second_compile_comes_from_the_cache() {
    let dir = TempDir::new("cache");
    let spec = &selftest::kernels()[0];
    let first = jit(&dir.0).compile(spec, Arch::Sm90a).unwrap();
    assert_eq!(first.outcome, CompileOutcome::Compiled);

    // A new Jit: the hit comes from disk, not from memory.
    let second = jit(&dir.0).compile(spec, Arch::Sm90a).unwrap();
    assert_eq!(second.outcome, CompileOutcome::Cached);
    assert_eq!(second.cubin, first.cubin);
    assert_eq!(second.resources, first.resources);
    assert_eq!(second.key, first.key);
    assert!(
        second.elapsed < Duration::from_millis(10),
        "cache hit took {:?} (compile took {:?})",
        second.elapsed,
        first.elapsed
    );
    eprintln!(
        "compile {:?}, cache hit {:?}",
        first.elapsed, second.elapsed
    );

    // Anything in the key changes the entry: a define, the arch.
    let other = spec.clone().define("UNUSED_KNOB", 1);
    assert_eq!(
        jit(&dir.0).compile(&other, Arch::Sm90a).unwrap().outcome,
        CompileOutcome::Compiled
    );
    assert_eq!(
        jit(&dir.0).compile(spec, Arch::Sm100a).unwrap().outcome,
        CompileOutcome::Compiled
    );
    // Header order does not.
    let headers = [("a.cuh", "#define A 1\n"), ("b.cuh", "#define B 2\n")];
    let src = (
        "ab.cu",
        "#include \"a.cuh\"\n#include \"b.cuh\"\nextern \"C\" __global__ void k(int* p) { *p = A + B; }\n",
    );
    let ab = KernelSpec::new("ab", src)
        .header(headers[0])
        .header(headers[1]);
    let ba = KernelSpec::new("ab", src)
        .header(headers[1])
        .header(headers[0]);
    let j = jit(&dir.0);
    assert_eq!(
        j.compile(&ab, Arch::Sm90a).unwrap().outcome,
        CompileOutcome::Compiled
    );
    assert_eq!(
        j.compile(&ba, Arch::Sm90a).unwrap().outcome,
        CompileOutcome::Cached
    );
    assert_eq!(j.cache_dir(), Some(dir.0.as_path()));
}

#[test]
fn compile_errors_carry_the_log_with_file_and_line() {
    let dir = TempDir::new("error");
    let header = (
        "broken.cuh",
        "#pragma once\n\ninline int broken() { return not_declared; }\n",
    );
    let source = (
        "user.cu",
        "#include \"broken.cuh\"\nextern \"C\" __global__ void k(int* p) { *p = broken(); }\n",
    );
    let spec = KernelSpec::new("test/broken", source).header(header);
    let err = jit(&dir.0).compile(&spec, Arch::Sm90a).unwrap_err();
    let Error::Compile { kernel, arch, log } = &err else {
        panic!("expected a compile error, got {err:?}");
    };
    assert_eq!((kernel.as_str(), *arch), ("test/broken", Arch::Sm90a));
    assert!(
        log.contains("broken.cuh(3)") && log.contains("not_declared"),
        "{log}"
    );
    let message = err.to_string();
    assert!(
        message.contains("test/broken") && message.contains("broken.cuh(3)"),
        "{message}"
    );
}

#[test]
fn invalid_specs_are_refused_before_nvrtc() {
    let dir = TempDir::new("invalid");
    let jit = jit(&dir.0);
    let source = ("k.cu", "extern \"C\" __global__ void k() {}\n");
    let two = KernelSpec::new("t", source)
        .header(("h.cuh", "1"))
        .header(("h.cuh", "2"));
    let err = jit.compile(&two, Arch::Sm90a).unwrap_err().to_string();
    assert!(
        err.contains("two different headers are named `h.cuh`"),
        "{err}"
    );
    let same = KernelSpec::new("t", source)
        .header(("h.cuh", "1"))
        .header(("h.cuh", "1"));
    jit.compile(&same, Arch::Sm90a).unwrap();
    let define = KernelSpec::new("t", source).define("1X", 0);
    assert!(matches!(
        jit.compile(&define, Arch::Sm90a),
        Err(Error::InvalidSpec { .. })
    ));
    let nul = KernelSpec::new("t", ("k.cu", "\0"));
    assert!(matches!(
        jit.compile(&nul, Arch::Sm90a),
        Err(Error::InvalidSpec { .. })
    ));
}
