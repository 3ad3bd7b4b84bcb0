//! The `megamoe` CLI on GPUs: `megamoe run --backend cuda --world process` (a process per rank,
//! launched by the CLI itself) against the CPU backend, and `megamoe bench --world process`.

use std::path::PathBuf;
use std::process::Command;

/// The `megamoe` CLI: next to this test binary in cargo's target directory, or in the GPU bundle's
/// `bin/` (`tests/..` of this binary).
fn megamoe_exe() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_megamoe"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("this test binary");
    exe.parent()
        .and_then(|tests| tests.parent())
        .map(|bundle| bundle.join("bin/megamoe"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "no megamoe binary at {} nor in a bundle's bin/",
                built.display()
            )
        })
}

fn megamoe_cli(args: &[&str]) -> String {
    let out = Command::new(megamoe_exe())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run megamoe");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "megamoe {args:?} failed:\n{text}");
    eprintln!("megamoe {args:?}:\n{text}");
    text
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cli_process_world_matches_the_cpu_backend() {
    if !cuda_rt::testing::gpus_or_skip(2) {
        return;
    }
    let root = std::env::temp_dir().join(format!("megamoe-gpu-cli-{}", std::process::id()));
    let (cpu, gpu) = (root.join("cpu"), root.join("cuda"));
    let _ = std::fs::remove_dir_all(&root);
    // The same seed twice: the same problem in both directories.
    for dir in [&cpu, &gpu] {
        megamoe_cli(&[
            "gen",
            dir.to_str().unwrap(),
            "--preset",
            "tiny",
            "--ranks",
            "2",
            "--tokens",
            "48",
            "--seed",
            "5",
            "--mask-fraction",
            "0.2",
        ]);
    }
    let (cpu, gpu) = (cpu.to_str().unwrap(), gpu.to_str().unwrap());
    megamoe_cli(&["run", cpu, "--backend", "cpu"]);
    let text = megamoe_cli(&["run", gpu, "--backend", "cuda", "--world", "process"]);
    assert!(
        text.contains("rank 0: T = 48") && text.contains("rank 1: T = 48"),
        "{text}"
    );
    let text = megamoe_cli(&["check", cpu, gpu, "--tol", "1e-5"]);
    assert!(text.contains("PASS"), "{text}");
    let text = megamoe_cli(&[
        "bench",
        "--preset",
        "tiny",
        "--ranks",
        "2",
        "--tokens",
        "8",
        "--reps",
        "1",
        "--routes",
        "mx32/bf16",
        "--world",
        "process",
    ]);
    assert!(
        text.contains(megamoe_bench::BenchRow::HEADER) && text.contains("a process each"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
