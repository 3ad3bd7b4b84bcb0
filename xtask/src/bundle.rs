//! `cargo xtask gpu-bundle`: the GPU tests as a self-contained folder for a GPU machine without Rust.
//!
//! `.gpu-bundle/` gets every workspace test binary that has ignored (GPU) tests, built in release and
//! stripped of debug info, the workspace's release binaries (the `megamoe` CLI), `run.sh` (the GPU
//! tests, counted as passed, failed and skipped) and `sanitize.sh` (the kernel families under
//! compute-sanitizer, `crate::sanitize`). The binaries need only glibc: cudarc loads libcuda and
//! libnvrtc at run time, and the scripts point `CUDA_PATH` at the machine's toolkit.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{cargo, sanitize};

pub const BUNDLE_DIR: &str = ".gpu-bundle";
const SIZE_BUDGET: u64 = 60 << 20;

/// One test or bin executable from cargo's JSON messages.
struct Artifact {
    /// `<crate dir>.<target>`, e.g. `cuda-rt.gpu`; unit tests are `<crate dir>.lib`.
    name: String,
    path: PathBuf,
}

/// Builds the bundle and returns its folder.
pub fn build(root: &Path) -> Result<PathBuf> {
    let tests = artifacts(
        root,
        &["test", "--workspace", "--release", "--no-run"],
        Pick::Tests,
    )?;
    let bins = artifacts(
        root,
        &["build", "--workspace", "--release", "--bins", "--examples"],
        Pick::Bins,
    )?;
    let benches = artifacts(root, &["bench", "--workspace", "--no-run"], Pick::Benches)?;

    let dir = root.join(BUNDLE_DIR);
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    fs::create_dir_all(dir.join("tests"))?;
    fs::create_dir_all(dir.join("bin"))?;
    fs::create_dir_all(dir.join("bench"))?;

    let mut bundled = 0;
    let mut gpu_tests = BTreeSet::new();
    for test in &tests {
        let ignored = ignored_tests(&test.path)?;
        if ignored.is_empty() {
            continue;
        }
        copy_stripped(&test.path, &dir.join("tests").join(&test.name))?;
        println!("tests/{:<32} {} GPU test(s)", test.name, ignored.len());
        gpu_tests.extend(ignored.iter().map(|t| format!("{}::{t}", test.name)));
        bundled += 1;
    }
    for bin in bins.iter().filter(|b| !b.name.starts_with("xtask.")) {
        let file_name = bin.path.file_name().context("binary without a file name")?;
        copy_stripped(&bin.path, &dir.join("bin").join(file_name))?;
        println!("bin/{}", file_name.to_string_lossy());
    }
    for bench in &benches {
        copy_stripped(&bench.path, &dir.join("bench").join(&bench.name))?;
        println!("bench/{}", bench.name);
    }
    if bundled == 0 {
        bail!("no test binary has ignored (GPU) tests");
    }
    check_device_sources(root, &dir)?;
    sanitize::check_entries(&gpu_tests)?;
    for (name, text) in [
        ("run.sh", RUN_SH.replace("@GPU_ENV@\n", GPU_ENV)),
        ("sanitize.sh", sanitize::script()),
    ] {
        let path = dir.join(name);
        fs::write(&path, text)?;
        make_executable(&path)?;
    }
    fs::write(dir.join("VERSION"), version(root))?;

    let size = dir_size(&dir)?;
    println!(
        "{} ({:.1} MiB): copy it to the GPU machine and run {BUNDLE_DIR}/run.sh",
        dir.display(),
        size as f64 / (1 << 20) as f64
    );
    if size > SIZE_BUDGET {
        bail!("the bundle is {size} B, over the {SIZE_BUDGET} B budget");
    }
    Ok(dir)
}

/// Which executables of a cargo run to keep.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// libtest binaries of lib and integration-test targets.
    Tests,
    /// `[[bin]]` and example targets (the examples run as they are on the GPU machine).
    Bins,
    /// `[[bench]]` targets (benchmark programs, run by hand on the GPU machine).
    Benches,
}

/// Runs cargo with JSON messages and returns the executables it reports that `pick` selects.
/// Diagnostics stay human-readable on stderr.
fn artifacts(root: &Path, args: &[&str], pick: Pick) -> Result<Vec<Artifact>> {
    let out = cargo(root)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    if !out.status.success() {
        bail!("cargo {} failed: {}", args.join(" "), out.status);
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let kinds = &msg["target"]["kind"];
        let is_bench = kinds
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "bench"));
        let is_test = msg["profile"]["test"].as_bool() == Some(true);
        let wanted = match pick {
            Pick::Tests => is_test && !is_bench,
            Pick::Bins => !is_test && !is_bench,
            Pick::Benches => is_bench,
        };
        if msg["reason"] != "compiler-artifact" || !wanted {
            continue;
        }
        let Some(path) = msg["executable"].as_str() else {
            continue;
        };
        let crate_dir = Path::new(msg["manifest_path"].as_str().unwrap_or_default())
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let target = if kinds
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "lib"))
        {
            "lib"
        } else {
            msg["target"]["name"].as_str().unwrap_or_default()
        };
        found.push(Artifact {
            name: format!("{crate_dir}.{target}"),
            path: PathBuf::from(path),
        });
    }
    Ok(found)
}

/// The ignored (GPU) tests of a libtest binary (`--list --ignored` lists only those).
fn ignored_tests(test: &Path) -> Result<Vec<String>> {
    let out = Command::new(test)
        .args(["--list", "--ignored"])
        .output()
        .with_context(|| format!("cannot list the tests of {}", test.display()))?;
    if !out.status.success() {
        bail!("{} --list failed: {}", test.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// Copies `from` to `to` without debug info (panic messages keep file:line; they need none).
fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to).with_context(|| format!("cannot copy {}", from.display()))?;
    let stripped = Command::new("strip").arg("--strip-debug").arg(to).status();
    if !stripped.is_ok_and(|s| s.success()) {
        eprintln!(
            "warning: could not strip {}; bundling it as is",
            to.display()
        );
    }
    Ok(())
}

/// Every bundled executable that holds one of the workspace's CUDA sources (`crates/*/cuda/*`: found
/// by its first line, the top-of-file comment) holds it as this checkout has it. Cargo names a
/// workspace package's outputs by its path inside the workspace, so two checkouts that share a
/// target folder overwrite each other's binaries, and the one whose sources are older takes the
/// other's as fresh: a bundle built so would time and test another checkout's kernels under this
/// one's name (perf.md v103).
fn check_device_sources(root: &Path, dir: &Path) -> Result<()> {
    let mut sources = Vec::new();
    for crate_dir in fs::read_dir(root.join("crates"))? {
        let cuda = crate_dir?.path().join("cuda");
        if !cuda.is_dir() {
            continue;
        }
        for file in fs::read_dir(&cuda)? {
            let path = file?.path();
            let text = fs::read(&path)?;
            let first_line = text
                .split(|&b| b == b'\n')
                .next()
                .unwrap_or_default()
                .to_vec();
            // A first line too short to name its file names none.
            if first_line.len() >= 16 {
                sources.push((path, first_line, text));
            }
        }
    }
    for sub in ["tests", "bin", "bench"] {
        for exe in fs::read_dir(dir.join(sub))? {
            let exe = exe?.path();
            let bytes = fs::read(&exe)?;
            for (path, first_line, text) in &sources {
                if memchr::memmem::find(&bytes, first_line).is_some()
                    && memchr::memmem::find(&bytes, text).is_none()
                {
                    bail!(
                        "{} holds another version of {} than this checkout: its build came from another \
                         checkout that shares this target folder (give each checkout a CARGO_TARGET_DIR \
                         of its own, or touch the source and rebuild)",
                        exe.display(),
                        path.display()
                    );
                }
            }
        }
    }
    Ok(())
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn version(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let dirty = if git(&["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        ""
    } else {
        " (with uncommitted changes)"
    };
    format!("{}{dirty}\n", git(&["rev-parse", "HEAD"]))
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// The environment both of the bundle's scripts (`run.sh`, `sanitize.sh`) set up for its programs.
pub(crate) const GPU_ENV: &str = r#"export CUDA_PATH="${CUDA_PATH:-/usr/local/cuda}"
export LD_LIBRARY_PATH="$CUDA_PATH/lib64:$CUDA_PATH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
# Worlds of ranks that share the GPU need a hardware work queue per stream (cuda_rt::green).
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}"
"#;

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs the GPU tests of this bundle (made by `cargo xtask gpu-bundle`) on a machine with a GPU and the
# CUDA toolkit, without Rust. Each test runs in its own process, so a crashed or poisoned CUDA context
# cannot take the following tests down with it. Prints PASS/FAIL/SKIP per test and a summary line;
# exits non-zero when any test failed.
#
#   .gpu-bundle/run.sh [FILTER]     FILTER: only tests whose "binary::test" name contains it
#
# CUDA_PATH (default /usr/local/cuda) must hold include/ and lib64/libnvrtc.so.13. TEST_TIMEOUT (seconds,
# default 600) bounds each test. VERBOSE=1 also shows the output of passing tests.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
filter="${1:-}"
@GPU_ENV@
timeout_s="${TEST_TIMEOUT:-600}"

echo "bundle $(cat "$here/VERSION" 2>/dev/null)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
passed=0 failed=0 skipped=0
for bin in "$here"/tests/*; do
  suite="$(basename "$bin")"
  while IFS= read -r test; do
    name="$suite::$test"
    [[ -n "$filter" && "$name" != *"$filter"* ]] && continue
    output="$(timeout "$timeout_s" "$bin" --ignored --exact "$test" --test-threads=1 --nocapture 2>&1)"
    status=$?
    if (( status != 0 )); then
      echo "FAIL $name"
      (( status == 124 )) && echo "    (timed out after ${timeout_s} s)"
      printf '%s\n' "$output" | sed 's/^/    /'
      failed=$((failed + 1))
    elif skip="$(printf '%s\n' "$output" | grep -o -m1 'SKIP: .*')"; then
      # A test that cannot run here (e.g. needs 2 GPUs) prints "SKIP: <why>"; some still run the
      # part they can (one GPU of "one and two GPUs"), whose checks VERBOSE shows.
      echo "SKIP $name: ${skip#SKIP: }"
      [[ -n "${VERBOSE:-}" ]] && printf '%s\n' "$output" | sed 's/^/    /'
      skipped=$((skipped + 1))
    else
      echo "PASS $name"
      [[ -n "${VERBOSE:-}" ]] && printf '%s\n' "$output" | sed 's/^/    /'
      passed=$((passed + 1))
    fi
  done < <("$bin" --list --ignored 2>/dev/null | sed -n 's/: test$//p')
done
echo "$passed passed, $failed failed, $skipped skipped"
(( failed == 0 ))
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkout with one CUDA source, and a bundle whose one test binary embeds `embedded`.
    fn checkout_and_bundle(embedded: &[u8]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("crates/k/cuda")).unwrap();
        fs::write(
            root.path().join("crates/k/cuda/k.cuh"),
            "// k.cuh -- what this header owns\nint k = 2;\n",
        )
        .unwrap();
        for sub in ["tests", "bin", "bench"] {
            fs::create_dir_all(root.path().join(".gpu-bundle").join(sub)).unwrap();
        }
        let mut exe = b"\x7fELF ... ".to_vec();
        exe.extend_from_slice(embedded);
        fs::write(root.path().join(".gpu-bundle/tests/k.gpu"), exe).unwrap();
        root
    }

    #[test]
    fn a_bundle_with_this_checkouts_sources_passes() {
        let root = checkout_and_bundle(b"// k.cuh -- what this header owns\nint k = 2;\n");
        check_device_sources(root.path(), &root.path().join(".gpu-bundle")).unwrap();
    }

    #[test]
    fn a_bundle_with_another_checkouts_version_of_a_source_is_refused() {
        let root = checkout_and_bundle(b"// k.cuh -- what this header owns\nint k = 1;\n");
        let err = check_device_sources(root.path(), &root.path().join(".gpu-bundle")).unwrap_err();
        assert!(
            err.to_string().contains("k.gpu holds another version of"),
            "{err}"
        );
        assert!(err.to_string().contains("crates/k/cuda/k.cuh"), "{err}");
    }

    #[test]
    fn a_bundle_that_embeds_no_source_passes() {
        let root = checkout_and_bundle(b"no kernels here");
        check_device_sources(root.path(), &root.path().join(".gpu-bundle")).unwrap();
    }
}
