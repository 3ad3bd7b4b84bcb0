//! The host-memory world of the dataflow engine: one zeroed, 128-byte-aligned allocation per
//! rank laid out by [`SymmLayout`], typed views of its regions, the failure record, bounded
//! waits, and the two barriers of the kernel.
//!
//! Symmetric pointers are emulated, not faked: every rank holds a [`SymmBuffer`] built from
//! all ranks' base addresses, and reaches a peer's copy of a region by `map`ping its own
//! address of that region, as a GPU thread does over NVLink. Addresses are plain integers, so
//! pointers are rebuilt from them with exposed provenance.
//!
//! Concurrency follows the kernel's protocol instead of Rust's borrow rules: workspace counters
//! are only ever touched as atomics, and every plain read or write of a region covers exactly
//! the rows one thread owns at that point of the protocol (after the barrier or the
//! release/acquire counter that hands them over). The `unsafe` region accessors state that
//! contract; their callers say why it holds.

use super::EngineError;
use std::alloc::{self, Layout};
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use symm_mem::layout::TMA_ALIGN;
use symm_mem::{Region, SymmBuffer, SymmLayout};

/// One rank's buffer: `total_bytes` bytes aligned to [`TMA_ALIGN`], zeroed when allocated.
pub(super) struct HostBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain memory owned by this value; concurrent access goes through
// `World`'s accessors under the protocol described at the top of the module.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    fn zeroed(rank: usize, bytes: u64) -> Result<Self, EngineError> {
        let too_big = || EngineError::OutOfMemory { rank, bytes };
        let size = usize::try_from(bytes).map_err(|_| too_big())?;
        let layout = Layout::from_size_align(size, TMA_ALIGN as usize).map_err(|_| too_big())?;
        assert!(
            size > 0,
            "a symmetric buffer always holds its barrier words"
        );
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).ok_or_else(too_big)?;
        Ok(HostBuffer { ptr, layout })
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `layout.size()` initialized (zeroed) bytes, and `&mut self`
        // excludes every other access while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A thread stops because the run failed; the cause is recorded in the [`World`].
#[derive(Debug)]
pub(super) struct Stop;

/// The first error of a run, and a flag every wait polls so the other threads stop too.
#[derive(Default)]
struct Failure {
    failed: AtomicBool,
    first: Mutex<Option<EngineError>>,
}

/// Every rank's symmetric buffer plus the run-wide failure record.
pub(super) struct World<'l> {
    pub layout: &'l SymmLayout,
    buffers: Vec<HostBuffer>,
    /// `views[r]`: rank r's device view (its base and every peer's offset).
    views: Vec<SymmBuffer>,
    failure: Failure,
    timeout: Duration,
}

/// Zeroed buffers for every rank of `layout`.
pub(super) fn zeroed_buffers(layout: &SymmLayout) -> Result<Vec<HostBuffer>, EngineError> {
    (0..layout.params.num_ranks as usize)
        .map(|r| HostBuffer::zeroed(r, layout.total_bytes))
        .collect()
}

impl<'l> World<'l> {
    /// A world on `buffers`: fresh ones ([`zeroed_buffers`]) or those of an earlier call that
    /// ended cleanly ([`World::into_parts`]), whose counters were reset at that call's end and
    /// whose barrier words have settled, as a GPU kernel finds its symmetric buffer at the next
    /// launch. `fill(rank, bytes)` then writes each rank's inputs while nothing else can see the
    /// buffers (the caller's copy-in).
    pub fn reuse(
        layout: &'l SymmLayout,
        mut buffers: Vec<HostBuffer>,
        timeout: Duration,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<Self, EngineError> {
        assert!(
            buffers.len() == layout.params.num_ranks as usize
                && buffers
                    .iter()
                    .all(|b| b.layout.size() as u64 == layout.total_bytes),
            "buffers of another layout"
        );
        for (rank, buffer) in buffers.iter_mut().enumerate() {
            fill(rank, buffer.bytes_mut());
        }
        let bases: Vec<u64> = buffers
            .iter()
            .map(|b| b.ptr.as_ptr().expose_provenance() as u64)
            .collect();
        let views = (0..buffers.len() as u32)
            .map(|r| SymmBuffer::new(r, &bases))
            .collect::<Result<_, _>>()?;
        Ok(World {
            layout,
            buffers,
            views,
            failure: Failure::default(),
            timeout,
        })
    }

    pub fn num_ranks(&self) -> usize {
        self.buffers.len()
    }

    /// Records `error` (the first one wins) and tells every waiting thread to stop.
    pub fn fail(&self, error: EngineError) -> Stop {
        let mut first = self
            .failure
            .first
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        first.get_or_insert(error);
        self.failure.failed.store(true, Ordering::Release);
        Stop
    }

    /// Makes the other threads stop waiting without recording a cause (a panicking thread;
    /// the panic itself reaches the caller).
    pub fn abort(&self) {
        self.failure.failed.store(true, Ordering::Release);
    }

    /// The buffers, for the next call's [`World::reuse`], and the recorded failure, if any
    /// (after a failure the buffers' counters and barrier words are in no known state).
    pub fn into_parts(self) -> (Vec<HostBuffer>, Option<EngineError>) {
        let failure = self
            .failure
            .first
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        (self.buffers, failure)
    }

    /// Waits until `ready()` — spinning, then yielding, then sleeping, so hundreds of rank
    /// threads can share a few cores — and fails the run with a timeout naming `what()`
    /// instead of hanging. Returns at once when another thread has failed.
    pub fn wait(
        &self,
        rank: usize,
        thread: usize,
        mut ready: impl FnMut() -> bool,
        what: impl FnOnce() -> String,
    ) -> Result<(), Stop> {
        let start = Instant::now();
        let mut round = 0u32;
        loop {
            if ready() {
                return Ok(());
            }
            if self.failure.failed.load(Ordering::Acquire) {
                return Err(Stop);
            }
            if start.elapsed() > self.timeout {
                return Err(self.fail(EngineError::Timeout {
                    rank,
                    thread,
                    what: what(),
                    timeout: self.timeout,
                }));
            }
            match round {
                0..64 => std::hint::spin_loop(),
                64..256 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(100)),
            }
            round = round.saturating_add(1);
        }
    }

    /// The address, on rank `on`, of element `first` of `region` (elements of `T`), as rank
    /// `from` computes it through its symmetric view.
    fn element_ptr<T>(
        &self,
        from: usize,
        on: usize,
        region: &Region,
        range: &Range<usize>,
    ) -> *mut T {
        let size = size_of::<T>() as u64;
        assert!(
            region.offset.is_multiple_of(align_of::<T>() as u64)
                && range.start <= range.end
                && range.end as u64 * size <= region.bytes,
            "elements {range:?} of {} bytes are outside region `{}` ({} bytes at {:#x})",
            size,
            region.name,
            region.bytes,
            region.offset
        );
        let view = &self.views[from];
        let local = view.region_ptr(region) + range.start as u64 * size;
        std::ptr::with_exposed_provenance_mut(view.map(local, on as u32) as usize)
    }

    /// A workspace region of rank `on` as atomics (`A` is `AtomicU32` or `AtomicU64`).
    fn atomics<A: WorkspaceAtomic>(&self, from: usize, on: usize, region: &Region) -> &[A] {
        let len = (region.bytes / size_of::<A>() as u64) as usize;
        let ptr = self.element_ptr::<A>(from, on, region, &(0..len));
        // SAFETY: the region lies inside rank `on`'s live, zero-initialized buffer, aligned for
        // `A`; workspace counters are only ever accessed as atomics while the world lives.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    pub fn u32s(&self, from: usize, on: usize, region: &Region) -> &[AtomicU32] {
        self.atomics(from, on, region)
    }

    pub fn u64s(&self, from: usize, on: usize, region: &Region) -> &[AtomicU64] {
        self.atomics(from, on, region)
    }

    /// Elements `range` of `region` on rank `on`, read by rank `from`.
    ///
    /// # Safety
    /// Nobody writes these elements while the slice lives.
    pub unsafe fn read<T: bytemuck::Pod>(
        &self,
        from: usize,
        on: usize,
        region: &Region,
        range: Range<usize>,
    ) -> &[T] {
        let ptr = self.element_ptr::<T>(from, on, region, &range);
        // SAFETY: in bounds and aligned (checked by `element_ptr`), initialized (the buffer
        // starts zeroed and `T` is plain data), not written meanwhile (the caller's promise).
        unsafe { std::slice::from_raw_parts(ptr, range.len()) }
    }

    /// Elements `range` of `region` on rank `on`, written by rank `from`.
    ///
    /// # Safety
    /// Nobody else reads or writes these elements while the slice lives.
    #[allow(clippy::mut_from_ref)] // the buffers are shared memory; exclusivity is the caller's
    pub unsafe fn write<T: bytemuck::Pod>(
        &self,
        from: usize,
        on: usize,
        region: &Region,
        range: Range<usize>,
    ) -> &mut [T] {
        let ptr = self.element_ptr::<T>(from, on, region, &range);
        // SAFETY: as in `read`, plus exclusive access to these elements (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(ptr, range.len()) }
    }
}

/// Held by every rank thread: a panicking thread makes the others stop waiting for it (the
/// panic itself reaches the caller when the scope joins).
pub(super) struct AbortOnPanic<'w, 'l>(pub &'w World<'l>);

impl Drop for AbortOnPanic<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort();
        }
    }
}

/// The atomic types the workspace holds.
trait WorkspaceAtomic {}
impl WorkspaceAtomic for AtomicU32 {}
impl WorkspaceAtomic for AtomicU64 {}

/// One thread of one rank: its place in the rank and its barrier phases.
pub(super) struct RankThread<'w, 'l> {
    pub world: &'w World<'l>,
    pub rank: usize,
    /// Index within the rank; thread 0 leads the cross-rank barrier.
    pub thread: usize,
    threads_per_rank: u64,
    /// Grid barriers this thread has passed.
    grid_phase: u64,
    /// Cross-rank barriers this rank has passed (kept by the leader).
    rank_phase: u64,
}

impl<'w, 'l> RankThread<'w, 'l> {
    /// Thread `thread` of `rank`, its barrier phases taken from where the buffer's words stand:
    /// they only grow, and a call starts with every earlier call's barriers complete.
    pub fn new(world: &'w World<'l>, rank: usize, thread: usize, threads_per_rank: usize) -> Self {
        let layout = world.layout;
        let grid = world.u64s(rank, rank, &layout.grid_barrier)[0].load(Ordering::Acquire);
        let signal =
            world.u64s(rank, rank, &layout.rank_barrier_signals)[rank].load(Ordering::Acquire);
        RankThread {
            world,
            rank,
            thread,
            threads_per_rank: threads_per_rank as u64,
            grid_phase: grid / threads_per_rank as u64,
            rank_phase: signal,
        }
    }

    pub fn is_leader(&self) -> bool {
        self.thread == 0
    }

    /// Waits on behalf of this thread, see [`World::wait`].
    pub fn wait(
        &self,
        ready: impl FnMut() -> bool,
        what: impl FnOnce() -> String,
    ) -> Result<(), Stop> {
        self.world.wait(self.rank, self.thread, ready, what)
    }

    /// The barrier of the rank's threads, on the rank's `grid_barrier` word: the word only
    /// grows, and the n-th barrier is passed when it reaches n × threads per rank, so it needs
    /// no reset and a fast thread's next arrival cannot confuse a slow one.
    pub fn grid_sync(&mut self) -> Result<(), Stop> {
        let word = &self
            .world
            .u64s(self.rank, self.rank, &self.world.layout.grid_barrier)[0];
        word.fetch_add(1, Ordering::AcqRel);
        self.grid_phase += 1;
        let target = self.grid_phase * self.threads_per_rank;
        self.wait(
            || word.load(Ordering::Acquire) >= target,
            || {
                format!(
                    "grid barrier {} ({} of {target} arrivals)",
                    self.grid_phase,
                    word.load(Ordering::Relaxed)
                )
            },
        )
    }

    /// The leader's half of the cross-rank barrier: store this rank's phase into its own slot
    /// of every rank's `rank_barrier_signals` (one writer per word, so plain release stores),
    /// then wait until every rank's slot here has reached it.
    pub fn cross_rank_sync(&mut self) -> Result<(), Stop> {
        let (world, layout) = (self.world, self.world.layout);
        self.rank_phase += 1;
        let phase = self.rank_phase;
        for peer in 0..world.num_ranks() {
            world.u64s(self.rank, peer, &layout.rank_barrier_signals)[self.rank]
                .store(phase, Ordering::Release);
        }
        let signals = world.u64s(self.rank, self.rank, &layout.rank_barrier_signals);
        self.wait(
            || signals.iter().all(|s| s.load(Ordering::Acquire) >= phase),
            || {
                let behind: Vec<usize> = (0..signals.len())
                    .filter(|&r| signals[r].load(Ordering::Relaxed) < phase)
                    .collect();
                format!("cross-rank barrier {phase} (ranks {behind:?} not there)")
            },
        )
    }

    /// Every thread of every rank: the rank's threads meet, the leaders meet, the rank's
    /// threads are released. Whatever any thread wrote before is visible after.
    pub fn global_barrier(&mut self) -> Result<(), Stop> {
        self.grid_sync()?;
        if self.is_leader() {
            self.cross_rank_sync()?;
        }
        self.grid_sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_mem::{BlockMs, SymmParams};

    fn layout(ranks: u32) -> SymmLayout {
        SymmLayout::new(SymmParams {
            num_ranks: ranks,
            max_tokens_per_rank: 4,
            hidden: 128,
            intermediate: 128,
            num_experts: 2 * ranks,
            num_topk: 2,
            act_scale_group: 32,
            block_ms: BlockMs::single(16).unwrap(),
            l1_block_n: 128,
        })
        .unwrap()
    }

    #[test]
    fn a_wait_that_never_ends_times_out_with_an_error() {
        let layout = layout(1);
        let world = World::reuse(
            &layout,
            zeroed_buffers(&layout).unwrap(),
            Duration::from_millis(20),
            |_, _| {},
        )
        .unwrap();
        let start = Instant::now();
        assert!(world.wait(0, 3, || false, || "nothing".into()).is_err());
        assert!(start.elapsed() < Duration::from_secs(5));
        // Once one thread failed, the others stop waiting at once and the first cause stays.
        assert!(world.wait(0, 1, || false, || "other".into()).is_err());
        match world.into_parts().1 {
            Some(EngineError::Timeout {
                rank: 0,
                thread: 3,
                what,
                ..
            }) => assert_eq!(what, "nothing"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn peers_are_reached_at_the_same_offsets() {
        let layout = layout(3);
        let world = World::reuse(
            &layout,
            zeroed_buffers(&layout).unwrap(),
            Duration::from_secs(1),
            |rank, bytes| {
                let x = &layout.x;
                bytes[x.offset as usize..][..x.bytes as usize].fill(rank as u8 + 1);
            },
        )
        .unwrap();
        for from in 0..3 {
            for on in 0..3 {
                // SAFETY: nothing writes during the test.
                let x: &[u8] = unsafe { world.read(from, on, &layout.x, 0..4) };
                assert_eq!(x, [on as u8 + 1; 4]);
            }
        }
    }

    #[test]
    fn barriers_order_every_thread_of_every_rank() {
        let (ranks, threads) = (4, 3);
        let layout = layout(ranks as u32);
        let world = World::reuse(
            &layout,
            zeroed_buffers(&layout).unwrap(),
            Duration::from_secs(30),
            |_, _| {},
        )
        .unwrap();
        let arrived = AtomicU64::new(0);
        std::thread::scope(|s| {
            for rank in 0..ranks {
                for thread in 0..threads {
                    let (world, arrived) = (&world, &arrived);
                    s.spawn(move || {
                        let mut me = RankThread::new(world, rank, thread, threads);
                        for round in 1..=3u64 {
                            arrived.fetch_add(1, Ordering::Relaxed);
                            me.global_barrier().unwrap();
                            let seen = arrived.load(Ordering::Relaxed);
                            assert!(seen >= round * (ranks * threads) as u64, "{seen}");
                            me.global_barrier().unwrap();
                        }
                    });
                }
            }
        });
        assert!(world.into_parts().1.is_none());
    }
}
