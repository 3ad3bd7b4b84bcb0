//! The `megamoe` binary end to end: gen → run → check (both CPU backends, bit for bit), plan,
//! and its refusals.

use megamoe_problems::files;
use std::path::{Path, PathBuf};
use std::process::{Command, Output as Exit};

fn megamoe(args: &[&str]) -> Exit {
    Command::new(env!("CARGO_BIN_EXE_megamoe"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn text(out: &Exit) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("megamoe-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn gen_run_check() {
    let (a, b) = (temp("a"), temp("b"));
    for dir in [&a, &b] {
        let gen_args = [
            "gen",
            s(dir),
            "--preset",
            "tiny",
            "--tokens",
            "24",
            "--ranks",
            "2",
            "--seed",
            "3",
        ];
        let out = megamoe(
            &[
                &gen_args[..],
                &[
                    "--mask-fraction",
                    "0.25",
                    "--clamp",
                    "none",
                    "--recipe",
                    "g128",
                ],
            ]
            .concat(),
        );
        assert!(out.status.success(), "{}", text(&out));
        assert!(files::read_config(dir).unwrap().clamp.is_none());
        let out = megamoe(&["run", s(dir), "--backend", "cpu"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("GFLOP/s"), "{}", text(&out));
    }
    // Same seed, same problem: identical outputs pass, directory against directory.
    let out = megamoe(&["check", s(&a), s(&b)]);
    assert!(
        out.status.success() && text(&out).contains("calc_diff 0.000e0"),
        "{}",
        text(&out)
    );

    // A perturbed output fails, file against file.
    let path = files::output_path(&b, 1);
    let mut y = files::read_output(&path).unwrap();
    y.y.iter_mut().step_by(3).for_each(|v| *v = -*v);
    files::write_output(&path, &y).unwrap();
    let out = megamoe(&["check", s(&files::output_path(&a, 1)), s(&path)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("FAIL"));
    // ...unless the tolerance says it is fine.
    assert!(
        megamoe(&["check", s(&a), s(&b), "--tol", "2"])
            .status
            .success()
    );
    for dir in [a, b] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn dataflow_backend_writes_the_same_bits_as_cpu() {
    let (cpu, flow) = (temp("cpu"), temp("flow"));
    let gen_args = |dir| {
        [
            "gen",
            dir,
            "--tokens",
            "40",
            "--ranks",
            "4",
            "--seed",
            "9",
            "--mask-fraction",
            "0.2",
        ]
    };
    for dir in [&cpu, &flow] {
        let out = megamoe(&gen_args(s(dir)));
        assert!(out.status.success(), "{}", text(&out));
    }
    let out = megamoe(&["run", s(&cpu), "--backend", "cpu"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = megamoe(&[
        "run",
        s(&flow),
        "--backend",
        "cpu-dataflow",
        "--workers",
        "3",
        "--dispatch-threads",
        "2",
    ]);
    assert!(
        out.status.success() && text(&out).contains("cpu-dataflow: y per rank"),
        "{}",
        text(&out)
    );
    for rank in 0..4 {
        let a = files::read_output(&files::output_path(&cpu, rank)).unwrap();
        let b = files::read_output(&files::output_path(&flow, rank)).unwrap();
        assert_eq!(a, b, "rank {rank}");
    }
    let out = megamoe(&["check", s(&cpu), s(&flow), "--tol", "0"]);
    assert!(
        out.status.success() && text(&out).contains("PASS"),
        "{}",
        text(&out)
    );
    for dir in [cpu, flow] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn plan_prints_moe_scheds_plan() {
    let out = megamoe(&[
        "plan",
        "--preset",
        "deepseek-v4-pro",
        "--ranks",
        "8",
        "--tokens",
        "8192",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    for needle in [
        "EP8",
        "buffer per rank",
        "BLOCK_M",
        "256",
        "experts per wave",
        "6.494 TFLOP",
        "NVLink",
    ] {
        assert!(
            text(&out).contains(needle),
            "{needle:?} missing:\n{}",
            text(&out)
        );
    }
    let out = megamoe(&[
        "plan",
        "--preset",
        "deepseek-v4-pro",
        "--ranks",
        "5",
        "--tokens",
        "8",
    ]);
    assert!(
        !out.status.success() && text(&out).contains("not a positive multiple of num_ranks R = 5"),
        "{}",
        text(&out)
    );
}

#[test]
fn refusals() {
    let dir = temp("refusals");
    let out = megamoe(&["gen", s(&dir), "--ranks", "3"]);
    assert!(
        !out.status.success() && text(&out).contains("not a positive multiple of num_ranks R = 3"),
        "{}",
        text(&out)
    );
    let out = megamoe(&["gen", s(&dir), "--preset", "gpt-5"]);
    assert!(
        !out.status.success() && text(&out).contains("unknown preset `gpt-5`"),
        "{}",
        text(&out)
    );
    let out = megamoe(&["run", s(&dir), "--backend", "gpu"]);
    assert!(
        !out.status.success() && text(&out).contains("invalid value 'gpu'"),
        "{}",
        text(&out)
    );
    let out = megamoe(&["run", s(&dir), "--backend", "cuda"]);
    assert!(
        !out.status.success() && text(&out).contains("config.json"),
        "{}",
        text(&out)
    );
    let out = megamoe(&["run", s(&dir)]);
    assert!(
        !out.status.success() && text(&out).contains("config.json"),
        "{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `bench` refuses bad shapes before touching a GPU, and without one says so instead of panicking.
#[test]
fn bench_refusals() {
    let out = megamoe(&[
        "bench",
        "--preset",
        "deepseek-v4-pro",
        "--ranks",
        "2",
        "--experts",
        "47",
    ]);
    assert!(
        !out.status.success()
            && text(&out).contains("E = 47 is not a positive multiple of num_ranks R = 2"),
        "{}",
        text(&out)
    );
    let out = megamoe(&["bench", "--preset", "tiny", "--tokens", "8", "--reps", "1"]);
    if cuda_rt::Gpu::count().is_err() {
        assert!(
            !out.status.success() && text(&out).contains("driver"),
            "{}",
            text(&out)
        );
        assert!(!text(&out).contains("panicked"), "{}", text(&out));
    }
}

/// `--world process` is for the cuda backend; without a GPU the launcher says so instead of
/// panicking, and a process started as a rank (torchrun's variables set) names its rank.
#[test]
fn process_world_refusals() {
    let dir = temp("process-world");
    let out = megamoe(&["gen", s(&dir), "--ranks", "2", "--tokens", "4"]);
    assert!(out.status.success(), "{}", text(&out));
    // The default recipe is mx32: an FP8 GEMM (either layer) is refused before any GPU is touched.
    for mma in ["fp8", "bf16-fp8"] {
        let out = megamoe(&["run", s(&dir), "--backend", "cuda", "--mma", mma]);
        assert!(
            !out.status.success() && text(&out).contains("cannot run the mx32 recipe"),
            "{mma}: {}",
            text(&out)
        );
    }
    for routes in ["mx32/fp8", "mx32/bf16-fp8"] {
        let out = megamoe(&["bench", "--routes", routes]);
        assert!(
            !out.status.success() && text(&out).contains("does not compute mx32"),
            "{routes}: {}",
            text(&out)
        );
    }
    let out = megamoe(&["run", s(&dir), "--backend", "cpu", "--world", "process"]);
    assert!(
        !out.status.success() && text(&out).contains("--world process is for the cuda backend"),
        "{}",
        text(&out)
    );
    let missing = temp("process-world-missing");
    let out = megamoe(&[
        "run",
        s(&missing),
        "--backend",
        "cuda",
        "--world",
        "process",
    ]);
    assert!(
        !out.status.success() && text(&out).contains("config.json"),
        "{}",
        text(&out)
    );
    if cuda_rt::Gpu::count().is_err() {
        let run = ["run", s(&dir), "--backend", "cuda", "--world", "process"];
        let bench = [
            "bench", "--preset", "tiny", "--ranks", "2", "--tokens", "8", "--world", "process",
        ];
        for args in [&run[..], &bench[..]] {
            let out = megamoe(args);
            assert!(
                !out.status.success()
                    && text(&out).contains("driver")
                    && !text(&out).contains("panicked"),
                "{args:?}: {}",
                text(&out)
            );
        }
        // Rank 0 of a world of one, as the launcher would start it.
        let out = Command::new(env!("CARGO_BIN_EXE_megamoe"))
            .args(run)
            .envs([
                ("RUST_LOG", "warn"),
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29999"),
            ])
            .output()
            .unwrap();
        assert!(
            !out.status.success()
                && text(&out).contains("rank 0: the CUDA driver library")
                && !text(&out).contains("panicked"),
            "{}",
            text(&out)
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
