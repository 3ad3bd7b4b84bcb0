//! No GPU needed (the CUDA toolkit is: scripts/cuda-toolchain.sh): the kernels compile to spill-free
//! cubins for every target, the header's error-word constants are the host's, and the barrier
//! words lie where the caller puts them.

use barriers::error::{
    ERROR_KIND_LOCAL_TIMEOUT, ERROR_KIND_RANK_TIMEOUT, ERROR_KIND_SHIFT, ERROR_LOCAL_WAIT_RING,
    ERROR_LOCAL_WAIT_ROW_ARRIVALS, ERROR_LOCAL_WAIT_SHIFT, ERROR_LOCAL_WAIT_SPLIT_TAIL,
    ERROR_RANK_SHIFT, ERROR_WAIT_MAX, ERROR_WAIT_SHIFT, ERROR_WAIT_UNIT_LOG2,
};
use barriers::{BarrierWords, CUDA_HEADER, kernels};
use cuda_rt::Arch;
use symm_mem::MAX_RANKS;

#[test]
fn test_kernels_compile_spill_free_for_every_arch() {
    let jit = cuda_rt::testing::jit();
    let spec = &kernels()[0];
    assert!(spec.no_spill);
    for arch in Arch::ALL {
        let compiled = jit
            .compile(spec, arch)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(compiled.cubin.starts_with(b"\x7fELF"), "{arch}");
        let mut names: Vec<_> = compiled.resources.iter().map(|r| r.name.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "copy16",
                "encode_timeouts",
                "grid_barrier_loop",
                "grid_barrier_rounds",
                "rank_barrier_rounds"
            ],
            "{arch}"
        );
        for r in &compiled.resources {
            assert!(!r.spills(), "{arch}: {r:?}");
        }
    }
}

#[test]
fn header_error_constants_are_the_hosts() {
    let text = CUDA_HEADER.1;
    for (name, value) in [
        ("u32 kErrorKindShift", u64::from(ERROR_KIND_SHIFT)),
        ("u64 kErrorKindRankTimeout", ERROR_KIND_RANK_TIMEOUT),
        ("u32 kErrorRankShift", u64::from(ERROR_RANK_SHIFT)),
        ("u32 kErrorWaitShift", u64::from(ERROR_WAIT_SHIFT)),
        ("u32 kErrorWaitUnitLog2", u64::from(ERROR_WAIT_UNIT_LOG2)),
        ("u64 kErrorKindLocalTimeout", ERROR_KIND_LOCAL_TIMEOUT),
        (
            "u32 kErrorLocalWaitShift",
            u64::from(ERROR_LOCAL_WAIT_SHIFT),
        ),
        ("u32 kLocalWaitSplitTail", ERROR_LOCAL_WAIT_SPLIT_TAIL),
        ("u32 kLocalWaitRowArrivals", ERROR_LOCAL_WAIT_ROW_ARRIVALS),
        ("u32 kLocalWaitRing", ERROR_LOCAL_WAIT_RING),
    ] {
        let line = format!("constexpr {name} = {value};");
        assert!(text.contains(&line), "barriers.cuh lacks `{line}`");
    }
    assert_eq!(
        ERROR_WAIT_MAX,
        (1 << (ERROR_RANK_SHIFT - ERROR_WAIT_SHIFT)) - 1
    );
    assert!(text.contains("constexpr u64 kErrorWaitMax = (1ull << 20) - 1;"));
}

#[test]
fn barrier_words_lie_where_the_caller_puts_them() {
    for offset in [0, 128, 1 << 20] {
        let words = BarrierWords::at(offset);
        let end = offset + BarrierWords::LEADING_BYTES;
        for w in [words.grid, words.error] {
            assert!(
                w.is_multiple_of(8) && (offset..end).contains(&w),
                "{offset}: {words:?}"
            );
        }
        assert!(words.signals.is_multiple_of(128) && words.signals + 8 * MAX_RANKS as u64 <= end);
        // Each kind on its own 128-byte lines.
        let lines = [words.grid / 128, words.error / 128, words.signals / 128];
        assert!(lines[0] < lines[1] && lines[1] < lines[2], "{words:?}");
    }
    assert_eq!(BarrierWords::LEADING, BarrierWords::at(0));
}
