//! `cargo xtask sanitize`: every kernel family run on tiny shapes under compute-sanitizer's four
//! tools (memcheck, racecheck, synccheck, initcheck), one line per (tool, test), failing on any
//! report. The runs are GPU tests of the bundle ([`ENTRIES`] names them), so the sanitizer sees the
//! kernels exactly as the tests launch and check them; the bundle's `sanitize.sh` ([`script`]) is
//! the one runner, used here and on a GPU machine without Rust.

use std::collections::BTreeSet;

use anyhow::{Result, bail};

/// compute-sanitizer's tools, in the order the runner reports them.
pub const TOOLS: [&str; 4] = ["memcheck", "racecheck", "synccheck", "initcheck"];

/// One sanitized run: a kernel family and the bundle test (`<suite>::<test>`) that launches it on
/// tiny shapes. Each family's tests check their results, so a run fails on a wrong answer too.
pub struct Entry {
    pub family: &'static str,
    pub test: &'static str,
    /// A tool that cannot run this test, and why: the runner reports it `SKIP` with the reason
    /// (never as clean) instead of running it.
    pub not_under: Option<(&'static str, &'static str)>,
}

const fn entry(family: &'static str, test: &'static str) -> Entry {
    Entry {
        family,
        test,
        not_under: None,
    }
}

/// Every kernel family the project registers, each through tests whose shapes are small enough
/// for the slowest tool (racecheck) to finish in minutes. A new kernel gets its entry the day it
/// lands.
pub const ENTRIES: &[Entry] = &[
    entry(
        "fp-formats twins",
        "fp-formats.gpu_twin::every_code_matches_the_host",
    ),
    entry(
        "fp-formats twins",
        "fp-formats.gpu_twin::quantizers_match_the_host",
    ),
    entry(
        "fp-formats twins",
        "fp-formats.gpu_twin::register_decode_matches_the_fold",
    ),
    entry(
        "cuda-rt selftest",
        "cuda-rt.gpu::saxpy_matches_the_host_and_writes_every_element",
    ),
    entry(
        "cuda-rt selftest",
        "cuda-rt.gpu::cooperative_launch_runs_all_blocks_at_once",
    ),
    entry(
        "cuda-rt selftest",
        "cuda-rt.gpu::cluster_launch_forms_clusters_of_two",
    ),
    entry(
        "cuda-rt selftest",
        "cuda-rt.gpu::dynamic_shared_memory_above_48_kib",
    ),
    entry(
        "cuda-rt selftest",
        "cuda-rt.gpu::tma_loads_tiles_and_zero_fills_past_the_edge",
    ),
    entry(
        "barriers",
        "barriers.gpu::grid_barrier_holds_over_a_few_phases",
    ),
    entry(
        "barriers",
        "barriers.gpu::the_device_encodes_timeouts_as_the_host_decodes",
    ),
    entry(
        "barriers",
        "barriers.gpu::a_missing_rank_times_out_instead_of_hanging_on_one_gpu",
    ),
    entry(
        "moe-sched twin",
        "moe-sched.device::device_twin_matches_the_model",
    ),
    entry(
        "symm-mem view",
        "symm-mem.device::device_view_maps_onto_every_rank",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::every_specialization_matches_the_reference",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::rows_too_wide_for_one_base_take_the_per_block_kernel",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::split_tails_match_the_reference",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::token_scales_in_several_chunks_match_the_reference",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::dynamic_schedule_matches_the_reference",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::narrow_tiles_match_the_reference",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::short_twin_units_match_the_reference",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::overhang_units_match_the_reference",
    ),
    entry(
        "gemm",
        "megamoe-kernel.lib::gemm::tests::a_lost_split_part_times_out_into_the_error_word",
    ),
    entry(
        "gemm",
        "megamoe-kernel.gpu_gemm::a_ring_wait_that_never_ends_gives_up_into_the_error_word",
    ),
    entry(
        "unfused glue",
        "megamoe-kernel.gpu_unfused::device_routes_match_their_host_twin",
    ),
    entry(
        "unfused glue",
        "megamoe-kernel.gpu_unfused::a_rank_that_never_arrives_times_out_into_an_error",
    ),
    entry(
        "unfused glue",
        "megamoe-kernel.gpu_unfused::the_device_plan_matches_its_host_twin",
    ),
    entry(
        "unfused pipeline",
        "megamoe.gpu_cuda::tiny_one_gpu_token_sweep_every_route",
    ),
    entry(
        "unfused pipeline",
        "megamoe.gpu_cuda::tiny_one_gpu_clamp_skew_and_masked_tokens",
    ),
    entry("fused kernel", "megamoe.gpu_fused::fused_tiny_one_forward"),
    Entry {
        family: "fused kernel",
        test: "megamoe.gpu_fused::fused_tiny_one_forward_two_ranks",
        // Every build since it exists (perf.md v84, v86, v89): the process dies (SIGSEGV) before
        // the kernel's first check, the tool saying the host dereferenced unified memory; the
        // other three tools run it clean with both ranks' kernels resident at once.
        not_under: Some((
            "initcheck",
            "initcheck cannot run two ranks' VMM-mapped symmetric buffers (the process dies under it before the first check)",
        )),
    },
    entry(
        "fused kernel",
        "megamoe.gpu_fused::fused_tiny_whole_token_dispatch",
    ),
    entry(
        "engine inputs",
        "megamoe.gpu_engine::bf16_activations_and_i64_ids_give_the_host_quantized_bits",
    ),
];

/// A hazard racecheck reports that its model makes, not the kernel: a write site and a read site
/// (substrings of the function names racecheck prints) and why the two are ordered. A racecheck
/// run whose every reported pair matches one of these prints `KNOWN` with the count; any other
/// report fails.
pub struct KnownHazard {
    pub write: &'static str,
    pub read: &'static str,
    pub why: &'static str,
}

/// The GEMM's stage ring (the first four): each consumer warp frees a stage with one arrive of
/// lane 0 after `__syncwarp()` (which orders the other lanes' reads before it), and the producer
/// waits for that arrive before it reloads the stage, its token scales with it (on two-CTA FP8
/// tiles the converter warp rewrites the stage's scales only after that reload lands). Racecheck credits an arrive with the arriving thread's own
/// accesses only, so it reports the reads of lanes 1–31 against the next round's writes; the
/// tests' results are checked against the reference all the same. Every lane arriving itself would
/// give racecheck the order it looks for, but makes ptxas spill the 128-token FP8 kernels (48 B),
/// which `cargo xtask kernels` refuses (perf.md v72). The read sites are the two that racecheck
/// names: the stage's decode (`load_stage`, or `decode_tile` where racecheck names the decode's own
/// frame) and the promotion's scales (`chunk_scales`). Racecheck reports a pair write-first or,
/// when it saw the read first, read-first; the runner matches either.
pub const KNOWN_HAZARDS: &[KnownHazard] = &[
    KnownHazard {
        write: "mm::sm90::bulk_load(",
        read: "::load_stage<",
        why: "the producer's next load into a stage the consumer warps freed (lane-0 arrive)",
    },
    KnownHazard {
        write: "mm::sm90::bulk_load(",
        read: "::decode_tile<",
        why: "the producer's next load into a stage the consumer warps freed (lane-0 arrive)",
    },
    KnownHazard {
        write: "mm::sm90::bulk_load(",
        read: "::chunk_scales<",
        why: "the producer's next load of a stage's scales into a stage the consumer warps freed (lane-0 arrive)",
    },
    KnownHazard {
        write: "mm::gemm::ScaleConverter<",
        read: "::chunk_scales<",
        why: "the converter warp's scales for a stage the consumer warps freed (lane-0 arrive)",
    },
    // Two ranks' fused kernels on one GPU meet in `rank_barrier`, each rank's CTA 0 at once. Within
    // a CTA the pair racecheck names at one shared word — the threads' read after the entry
    // barrier and thread 0's rewrite of the error word after the wait — lie on either side of a
    // `__syncthreads`; racecheck reports it only there and only now and then, with one box or two
    // (perf.md v110), as if it kept one shadow of CTA (0,0,0)'s shared memory for both ranks' grids.
    KnownHazard {
        write: "barriers::rank_barrier(",
        read: "barriers::rank_barrier(",
        why: "two ranks' CTA 0 in rank_barrier at once on one GPU (its reads and rewrite lie on either side of a __syncthreads)",
    },
];

/// Refuses a table that names a test the bundle does not hold (`bundled`: every `<suite>::<test>`
/// of its GPU tests), so the list cannot go stale when a test is renamed.
pub fn check_entries(bundled: &BTreeSet<String>) -> Result<()> {
    let missing: Vec<&str> = ENTRIES
        .iter()
        .map(|e| e.test)
        .filter(|t| !bundled.contains(*t))
        .collect();
    if !missing.is_empty() {
        bail!(
            "sanitize entries name tests the bundle does not hold: {}",
            missing.join(", ")
        );
    }
    Ok(())
}

/// The bundle's `sanitize.sh`: [`ENTRIES`] × [`TOOLS`], run in parallel (the sanitizer's cost is
/// mostly on the host), reported in table order.
pub fn script() -> String {
    let entries: String = ENTRIES
        .iter()
        .map(|e| format!("  \"{}|{}\"\n", e.family, e.test))
        .collect();
    let not_under: String = ENTRIES
        .iter()
        .filter_map(|e| {
            e.not_under
                .map(|(tool, why)| format!("  [\"{tool}|{}\"]=\"{why}\"\n", e.test))
        })
        .collect();
    let known: Vec<String> = KNOWN_HAZARDS
        .iter()
        .map(|k| format!("{}|{}", k.write, k.read))
        .collect();
    let whys: String = KNOWN_HAZARDS
        .iter()
        .map(|k| format!("#   {} vs {}: {}\n", k.write, k.read, k.why))
        .collect();
    SANITIZE_SH
        .replace("@GPU_ENV@\n", crate::bundle::GPU_ENV)
        .replace("@TOOLS@", &TOOLS.join(" "))
        .replace("@ENTRIES@", &entries)
        .replace("@NOT_UNDER@", &not_under)
        .replace("@KNOWN_WHY@\n", &whys)
        .replace("@KNOWN@", &known.join(";"))
}

const SANITIZE_SH: &str = r#"#!/usr/bin/env bash
# Runs every kernel family of this bundle (made by `cargo xtask gpu-bundle`) under compute-sanitizer's
# tools, each run a GPU test on tiny shapes, and prints one line per (tool, test): CLEAN when the tool
# ran, reported nothing and the test passed; KNOWN when racecheck reported only hazards of its own
# model that xtask/src/sanitize.rs (KNOWN_HAZARDS) names and explains; SKIP, not run, where the table
# says the tool cannot run the test and why; otherwise FAIL with the tool's report. Exits non-zero on
# any FAIL.
#
#   .gpu-bundle/sanitize.sh [TOOL_FILTER] [NAME_FILTER]    e.g. sanitize.sh racecheck gpu_gemm
#
# SANITIZE_JOBS (default 4) runs that many at once on the one GPU; SANITIZE_TIMEOUT (seconds, default
# 900) bounds each run; SANITIZE_LOGS (default a fresh temporary folder) keeps every run's full log.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tool_filter="${1:-}"
name_filter="${2:-}"
@GPU_ENV@
sanitizer="$(command -v compute-sanitizer || echo "$CUDA_PATH/bin/compute-sanitizer")"
[[ -x "$sanitizer" ]] || { echo "compute-sanitizer not found (PATH, \$CUDA_PATH/bin)"; exit 2; }
export sanitizer here
export timeout_s="${SANITIZE_TIMEOUT:-900}"
export logs="${SANITIZE_LOGS:-$(mktemp -d)}"
mkdir -p "$logs"
tools=(@TOOLS@)
entries=(
@ENTRIES@)
# "tool|test" -> why that tool cannot run that test.
declare -A not_under=(
@NOT_UNDER@)

# One run: its log in $logs/<tool>.<suite>.<test>.log and "status seconds" in the same name + .status.
run_one() {
  local tool="$1" name="$2" suite="${2%%::*}" test="${2#*::}"
  local log="$logs/$tool.$suite.$test.log" start=$SECONDS
  timeout "$timeout_s" "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 200 \
    "$here/tests/$suite" --ignored --exact "$test" --test-threads=1 --nocapture >"$log" 2>&1
  local status=$?
  echo "$status $((SECONDS - start))" >"$log.status"
  echo "  ran $tool $name: exit $status, $((SECONDS - start)) s"
}
export -f run_one

runs=()
for tool in "${tools[@]}"; do
  [[ -n "$tool_filter" && "$tool" != *"$tool_filter"* ]] && continue
  for e in "${entries[@]}"; do
    name="${e#*|}"
    [[ -n "$name_filter" && "$name" != *"$name_filter"* ]] && continue
    runs+=("$tool|$e")
  done
done
to_run=()
for r in "${runs[@]}"; do
  IFS='|' read -r tool family name <<<"$r"
  [[ -z "${not_under[$tool|$name]:-}" ]] && to_run+=("$r")
done
echo "compute-sanitizer: $("$sanitizer" --version | grep -m1 -o 'Version .*'); ${#to_run[@]} runs, ${SANITIZE_JOBS:-4} at a time; logs in $logs"
printf '%s\n' "${to_run[@]}" | awk -F'|' '{ print $1; print $3 }' |
  xargs -d '\n' -n 2 -P "${SANITIZE_JOBS:-4}" bash -c 'run_one "$1" "$2"' _

# Racecheck's reported (write, read) pairs: "pairs unexplained" by the known hazards, which are
@KNOWN_WHY@
# Racecheck names a pair in the order it saw the accesses: the write first ("Race reported between
# Write access at W" then "and Read access at R"), or the read first when the write came after it.
known='@KNOWN@'
unexplained() {
  awk -v known="$known" '
    /Race reported between/ { first = $0; next }
    /and (Read|Write) access at/ {
      if (index(first, "between Write access")) { w = first; r = $0 } else { w = $0; r = first }
      pairs++; ok = 0; n = split(known, k, ";")
      for (i = 1; i <= n; i++) { split(k[i], p, "|"); if (index(w, p[1]) && index(r, p[2])) ok = 1 }
      if (!ok) bad++
    }
    END { print pairs + 0, bad + 0 }' "$1"
}

clean=0 known_runs=0 skipped=0 failed=0
for r in "${runs[@]}"; do
  IFS='|' read -r tool family name <<<"$r"
  if [[ -n "${not_under[$tool|$name]:-}" ]]; then
    printf 'SKIP  %-9s %-16s %s: %s\n' "$tool" "$family" "$name" "${not_under[$tool|$name]}"
    skipped=$((skipped + 1))
    continue
  fi
  suite="${name%%::*}" test="${name#*::}"
  log="$logs/$tool.$suite.$test.log"
  read -r status secs <"$log.status"
  # The tool's own summary with nothing in it: proof that it ran and found nothing.
  if [[ "$tool" == racecheck ]]; then summary='RACECHECK SUMMARY: 0 hazards displayed'; else summary='ERROR SUMMARY: 0 errors'; fi
  why=""
  if (( status == 124 )); then why="timed out after ${timeout_s} s"
  elif (( status == 86 )); then why="the tool reported errors"
  elif (( status != 0 )); then why="the test failed (exit $status)"
  elif ! grep -q "$summary" "$log"; then why="no clean summary from the tool"
  fi
  if [[ "$why" == "the tool reported errors" && "$tool" == racecheck ]] &&
    grep -q 'test result: ok. 1 passed' "$log"; then
    read -r pairs bad < <(unexplained "$log")
    if (( pairs > 0 && bad == 0 )); then
      printf 'KNOWN %-9s %-16s %s (%d s): %d reported pairs, all known hazards of the tool\n' \
        "$tool" "$family" "$name" "$secs" "$pairs"
      known_runs=$((known_runs + 1))
      continue
    fi
  fi
  if [[ -z "$why" ]]; then
    printf 'CLEAN %-9s %-16s %s (%d s)\n' "$tool" "$family" "$name" "$secs"
    clean=$((clean + 1))
  else
    printf 'FAIL  %-9s %-16s %s (%d s): %s\n' "$tool" "$family" "$name" "$secs" "$why"
    grep -E '^=========|panicked|SUMMARY' "$log" | head -40 | sed 's/^/    /'
    failed=$((failed + 1))
  fi
done
echo "$clean clean, $known_runs known, $skipped skipped, $failed failed"
(( failed == 0 ))
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_that_cannot_run_a_test_is_one_of_the_tools_and_reported_as_skipped() {
        let script = script();
        for e in ENTRIES {
            if let Some((tool, why)) = e.not_under {
                assert!(TOOLS.contains(&tool), "{}: `{tool}` is not a tool", e.test);
                assert!(
                    !why.contains('"'),
                    "{}: the reason is a bash string",
                    e.test
                );
                assert!(
                    script.contains(&format!("[\"{tool}|{}\"]=\"{why}\"", e.test)),
                    "{} under {tool} not in the script's table",
                    e.test
                );
            }
        }
        assert!(
            script.contains("skipped"),
            "the summary counts skipped runs"
        );
    }
}
