//! The host-memory world of the dataflow engine: one zeroed allocation per rank laid out by
//! [`EngineLayout`] — the protocol's [`PeerLayout`], then the engine's own regions — typed views
//! of its regions, the failure record, bounded waits, and the two barriers of the kernel.
//!
//! Symmetric pointers are emulated, not faked: every rank holds a [`SymmBuffer`] built from
//! all ranks' base addresses, and reaches a peer's copy of a region by `map`ping its own
//! address of that region, as a GPU thread does over NVLink. Addresses are plain integers, so
//! pointers are rebuilt from them with exposed provenance.
//!
//! Concurrency follows the kernel's protocol instead of Rust's borrow rules: counters and
//! barrier words are only ever touched as atomics, and every plain read or write of a region
//! covers exactly the rows one thread owns at that point of the protocol (after the barrier or
//! the release/acquire counter that hands them over). The `unsafe` region accessors state that
//! contract; their callers say why it holds.

use super::EngineError;
use megamoe_kernel::protocol::{PEER_REGION_ALIGN, PeerLayout, PeerRegion, PipelineShape};
use std::alloc::{self, Layout};
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use symm_mem::SymmBuffer;

/// One rank's symmetric buffer: the protocol's regions at the GPU's offsets, then what the
/// fused GPU kernel has no region for yet, each region [`PEER_REGION_ALIGN`]-aligned. The
/// engine's regions lie in the same allocation so that peers reach them as they reach the
/// protocol's, through the symmetric view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLayout {
    /// The L1 pool, its row metadata, the combine buffer, the cross-rank barrier's signals and
    /// the counts table, as every GPU backend lays them out.
    pub peer: PeerLayout,
    /// u64: the barrier of the rank's threads ([`RankThread::grid_sync`]), never reset.
    pub grid: PeerRegion,
    /// `[pool_rows]` u32: at an L1 block's first row, how many of its rows have arrived; bumped
    /// by the dispatching ranks, reset by the owner at the end of a call.
    pub l1_arrivals: PeerRegion,
    /// `[pool_rows][mask_words]` u64: at an L1 block's first row, a bit per L1 n-block whose
    /// columns are in the L2 pool; reset by the owner at the end of a call.
    pub l2_arrivals: PeerRegion,
    /// u64 words of one L2 arrival mask: ⌈L1 n-blocks / 64⌉.
    pub mask_words: usize,
    /// The L2 pool, E4M3 `[pool_rows][I]` and UE8M0 `[pool_rows][I/G]`: rank-local (the
    /// pipeline's own buffer on the GPU), written by the SwiGLU epilogue of the rank's L1 blocks.
    pub l2_act: PeerRegion,
    pub l2_sf: PeerRegion,
    /// Bytes to allocate per rank.
    pub bytes: usize,
}

impl EngineLayout {
    /// The layout of `shape`, whose L1 blocks split 2I into `l1_n_blocks`.
    pub fn new(shape: &PipelineShape, l1_n_blocks: usize) -> Self {
        let peer = shape.peer_layout();
        let (rows, i, g) = (shape.pool_rows, shape.intermediate, shape.recipe.group());
        let mask_words = l1_n_blocks.div_ceil(64);
        let mut end = peer.bytes;
        let mut region = |bytes: usize| {
            let region = PeerRegion::after(end, bytes);
            end = region.end();
            region
        };
        let grid = region(size_of::<u64>());
        let l1_arrivals = region(rows * size_of::<u32>());
        let l2_arrivals = region(rows * mask_words * size_of::<u64>());
        let l2_act = region(rows * i);
        let l2_sf = region(rows * i / g);
        EngineLayout {
            peer,
            grid,
            l1_arrivals,
            l2_arrivals,
            mask_words,
            l2_act,
            l2_sf,
            bytes: end.next_multiple_of(PEER_REGION_ALIGN),
        }
    }
}

/// One rank's buffer: `bytes` bytes aligned to [`PEER_REGION_ALIGN`], zeroed when allocated.
pub(super) struct HostBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain memory owned by this value; concurrent access goes through
// `World`'s accessors under the protocol described at the top of the module.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    fn zeroed(rank: usize, bytes: usize) -> Result<Self, EngineError> {
        let too_big = || EngineError::OutOfMemory { rank, bytes };
        let layout = Layout::from_size_align(bytes, PEER_REGION_ALIGN).map_err(|_| too_big())?;
        assert!(
            bytes > 0,
            "a symmetric buffer always holds its barrier words"
        );
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).ok_or_else(too_big)?;
        Ok(HostBuffer { ptr, layout })
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
    pub layout: &'l EngineLayout,
    buffers: Vec<HostBuffer>,
    /// `views[r]`: rank r's device view (its base and every peer's offset).
    views: Vec<SymmBuffer>,
    failure: Failure,
    timeout: Duration,
}

/// Zeroed buffers for `num_ranks` ranks of `layout`.
pub(super) fn zeroed_buffers(
    layout: &EngineLayout,
    num_ranks: usize,
) -> Result<Vec<HostBuffer>, EngineError> {
    (0..num_ranks)
        .map(|r| HostBuffer::zeroed(r, layout.bytes))
        .collect()
}

impl<'l> World<'l> {
    /// A world on `buffers`, one per rank: fresh ones ([`zeroed_buffers`]) or those of an earlier
    /// call that ended cleanly ([`World::into_parts`]), whose counters were reset at that call's
    /// end and whose barrier words have settled, as a GPU kernel finds its symmetric buffer at
    /// the next launch.
    pub fn new(
        layout: &'l EngineLayout,
        buffers: Vec<HostBuffer>,
        timeout: Duration,
    ) -> Result<Self, EngineError> {
        assert!(
            buffers.iter().all(|b| b.layout.size() == layout.bytes),
            "buffers of another layout"
        );
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

    /// The address, on rank `on`, of the first of elements `range` of `region` (elements of `T`),
    /// as rank `from` computes it through its symmetric view.
    fn element_ptr<T>(
        &self,
        from: usize,
        on: usize,
        region: &PeerRegion,
        range: &Range<usize>,
    ) -> *mut T {
        let size = size_of::<T>();
        assert!(
            region.offset.is_multiple_of(align_of::<T>())
                && range.start <= range.end
                && range.end * size <= region.bytes,
            "elements {range:?} of {size} bytes are outside the region of {} bytes at {:#x}",
            region.bytes,
            region.offset
        );
        let view = &self.views[from];
        let local = view.base + (region.offset + range.start * size) as u64;
        std::ptr::with_exposed_provenance_mut(view.map(local, on as u32) as usize)
    }

    /// A region of rank `on` as atomics (`A` is `AtomicU32` or `AtomicU64`).
    fn atomics<A: CounterAtomic>(&self, from: usize, on: usize, region: &PeerRegion) -> &[A] {
        let len = region.bytes / size_of::<A>();
        let ptr = self.element_ptr::<A>(from, on, region, &(0..len));
        // SAFETY: the region lies inside rank `on`'s live, zero-initialized buffer, aligned for
        // `A`; counter regions are only ever accessed as atomics while the world lives.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    pub fn u32s(&self, from: usize, on: usize, region: &PeerRegion) -> &[AtomicU32] {
        self.atomics(from, on, region)
    }

    pub fn u64s(&self, from: usize, on: usize, region: &PeerRegion) -> &[AtomicU64] {
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
        region: &PeerRegion,
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
        region: &PeerRegion,
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

/// The atomic types of the counter regions.
trait CounterAtomic {}
impl CounterAtomic for AtomicU32 {}
impl CounterAtomic for AtomicU64 {}

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
        let grid = world.u64s(rank, rank, &layout.grid)[0].load(Ordering::Acquire);
        let signal = world.u64s(rank, rank, &layout.peer.signals)[rank].load(Ordering::Acquire);
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

    /// The barrier of the rank's threads, on the rank's `grid` word: the word only
    /// grows, and the n-th barrier is passed when it reaches n × threads per rank, so it needs
    /// no reset and a fast thread's next arrival cannot confuse a slow one.
    pub fn grid_sync(&mut self) -> Result<(), Stop> {
        let word = &self
            .world
            .u64s(self.rank, self.rank, &self.world.layout.grid)[0];
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
    /// of every rank's `signals` (one writer per word, so plain release stores),
    /// then wait until every rank's slot here has reached it.
    pub fn cross_rank_sync(&mut self) -> Result<(), Stop> {
        let (world, layout) = (self.world, self.world.layout);
        self.rank_phase += 1;
        let phase = self.rank_phase;
        for peer in 0..world.num_ranks() {
            world.u64s(self.rank, peer, &layout.peer.signals)[self.rank]
                .store(phase, Ordering::Release);
        }
        let signals = world.u64s(self.rank, self.rank, &layout.peer.signals);
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
    use megamoe_kernel::Routes;
    use megamoe_kernel::protocol::PipelineShape;

    fn layout(ranks: usize) -> EngineLayout {
        let shape = PipelineShape::new(
            fp_formats::Recipe::Mx32,
            Routes::EXACT,
            128,
            128,
            2 * ranks,
            2,
            ranks,
            4,
            None,
        )
        .unwrap();
        EngineLayout::new(&shape, 2)
    }

    fn world(layout: &EngineLayout, ranks: usize, timeout: Duration) -> World<'_> {
        World::new(layout, zeroed_buffers(layout, ranks).unwrap(), timeout).unwrap()
    }

    #[test]
    fn engine_regions_follow_the_protocols() {
        let layout = layout(3);
        let regions = [
            layout.grid,
            layout.l1_arrivals,
            layout.l2_arrivals,
            layout.l2_act,
            layout.l2_sf,
        ];
        let mut end = layout.peer.bytes;
        for region in regions {
            assert!(region.offset >= end && region.offset.is_multiple_of(PEER_REGION_ALIGN));
            end = region.end();
        }
        assert!(layout.bytes >= end && layout.bytes.is_multiple_of(PEER_REGION_ALIGN));
    }

    #[test]
    fn a_wait_that_never_ends_times_out_with_an_error() {
        let layout = layout(1);
        let world = world(&layout, 1, Duration::from_millis(20));
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
        let world = world(&layout, 3, Duration::from_secs(1));
        let pool = &layout.peer.l1_act;
        for rank in 0..3 {
            // SAFETY: one thread, nothing else reads or writes during the test.
            unsafe { world.write::<u8>(rank, rank, pool, 0..4) }.fill(rank as u8 + 1);
        }
        for from in 0..3 {
            for on in 0..3 {
                // SAFETY: nothing writes while the slice lives.
                let x: &[u8] = unsafe { world.read(from, on, pool, 0..4) };
                assert_eq!(x, [on as u8 + 1; 4]);
            }
        }
    }

    #[test]
    fn barriers_order_every_thread_of_every_rank() {
        let (ranks, threads) = (4, 3);
        let layout = layout(ranks);
        let world = world(&layout, ranks, Duration::from_secs(30));
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
