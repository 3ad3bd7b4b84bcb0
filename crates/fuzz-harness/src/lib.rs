//! `fuzz-harness`: what the workspace's fuzz tests (ordinary integration tests, so `cargo test`
//! on stable runs them in CI) are built on. [`fuzz`] runs a proptest target within a case count
//! and a wall-clock budget and reports how many cases it checked; [`LargestAllocation`] is a
//! global allocator that remembers the largest single allocation of each thread, so a test can
//! check that a decoder never sized an allocation by a header field it did not bound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseResult, TestRunner};

/// No fuzz target may run longer than this in CI, shrinking a failure included.
pub const HARD_LIMIT: Duration = Duration::from_secs(60);
/// How long shrinking a failure may take: a failure still fails after it, with the smallest input
/// found so far.
const SHRINK_TIME: Duration = Duration::from_secs(15);

/// Runs `check` on up to `cases` inputs drawn from `strategy`, stopping early once `budget` has
/// passed (cases drawn after that pass unchecked), and prints the count checked and the time taken.
/// A failing or panicking case fails the calling test with proptest's smallest failing input.
pub fn fuzz<S: Strategy>(
    target: &str,
    cases: u32,
    budget: Duration,
    strategy: S,
    check: impl Fn(S::Value) -> TestCaseResult,
) {
    assert!(
        budget + SHRINK_TIME < HARD_LIMIT,
        "{target}: a budget of {budget:?} leaves no time to shrink a failure"
    );
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_time: SHRINK_TIME.as_millis() as u32,
        // Failures are reported, not saved: the seeds would land in the source tree.
        failure_persistence: None,
        ..Config::default()
    });
    let start = Instant::now();
    let checked = Cell::new(0u32);
    // Once a case fails, every later one (proptest's shrinking) is checked, budget or not.
    let failed = Cell::new(false);
    let result = runner.run(&strategy, |value| {
        if !failed.get() && start.elapsed() > budget {
            return Ok(());
        }
        checked.set(checked.get() + 1);
        let result = check(value);
        failed.set(failed.get() || result.is_err());
        result
    });
    eprintln!(
        "fuzz {target}: {} cases in {:.1?}",
        checked.get(),
        start.elapsed()
    );
    if let Err(e) = result {
        panic!("fuzz {target}: {e}");
    }
}

thread_local! {
    /// The largest allocation (or reallocation) this thread asked for since the last [`LargestAllocation::during`].
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, remembering each thread's largest request. A test binary installs it
/// with `#[global_allocator] static ALLOC: LargestAllocation = LargestAllocation;`.
pub struct LargestAllocation;

impl LargestAllocation {
    /// What `f` returns, and the largest allocation this thread made while it ran.
    pub fn during<R>(f: impl FnOnce() -> R) -> (R, usize) {
        LARGEST.with(|l| l.set(0));
        let r = f();
        (r, LARGEST.with(Cell::get))
    }

    fn note(size: usize) {
        // `try_with`: a thread being torn down still frees and allocates after its locals are gone.
        let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    }
}

// SAFETY: every call is forwarded unchanged to `System`; recording a size in a const-initialized
// thread local neither allocates nor unwinds.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::note(new_size);
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}
