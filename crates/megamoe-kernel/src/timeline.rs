//! What a kernel's CTAs did when, on request (`cuda/timeline.cuh`'s host twin): each CTA of a GEMM,
//! alone or in the fused forward, appends an event per tile — from the producer's hand-out (its
//! first load) to the consumers' end of it (their epilogue, or its hand-over to the epilogue
//! warps), with its SM's cycles meanwhile — to its own run of a device buffer;
//! [`TimelineBuffers::read`] brings them back as a [`Timeline`], with the fused forward's stages
//! (the grid's, from its stage clock), and [`Timeline::overlap`] says how the layers overlap. Off,
//! the kernels pass a null timeline and each record is a branch not taken.

use cuda_rt::Gpu;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use serde::Serialize;

use crate::gemm::GemmError;

/// What an event is (a tile's kind is its timeline descriptor's `tile_kind`: the value here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Count,
    Plan,
    /// Route and dispatch.
    Dispatch,
    L1Tile,
    L2Tile,
    CombineSend,
    CombineReduce,
    /// A tile of a GEMM launched alone.
    Tile,
}

impl EventKind {
    /// Every kind, in the kernel's numbering.
    pub const ALL: [EventKind; 8] = [
        EventKind::Count,
        EventKind::Plan,
        EventKind::Dispatch,
        EventKind::L1Tile,
        EventKind::L2Tile,
        EventKind::CombineSend,
        EventKind::CombineReduce,
        EventKind::Tile,
    ];

    pub fn is_tile(self) -> bool {
        matches!(
            self,
            EventKind::L1Tile | EventKind::L2Tile | EventKind::Tile
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            EventKind::Count => "count",
            EventKind::Plan => "plan",
            EventKind::Dispatch => "dispatch",
            EventKind::L1Tile => "L1",
            EventKind::L2Tile => "L2",
            EventKind::CombineSend => "combine send",
            EventKind::CombineReduce => "combine",
            EventKind::Tile => "tile",
        }
    }
}

/// One event, times in ns from the timeline's first event.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Event {
    pub kind: EventKind,
    /// A tile's CTA and SM; a stage is the whole grid's (between its meetings): none.
    pub cta: Option<u32>,
    pub sm: Option<u32>,
    /// A tile: from its hand-out by the producer (its first load) to the consumers' end of it
    /// (their epilogue, or its hand-over to the epilogue warps).
    pub start_ns: u64,
    pub end_ns: u64,
    /// A tile: its expert (of the rank's), first pool row, rows, first weight row, k128 blocks.
    pub tile: Option<TileEvent>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TileEvent {
    pub expert: u32,
    pub row0: u32,
    pub rows: u32,
    pub n_col: u32,
    pub k_blocks: u32,
    /// Cycles of its SM from start to end (that SM's clock over the tile: [`Event::sm_mhz`]).
    pub sm_cycles: u32,
}

impl Event {
    /// A tile's SM clock over its span (MHz: its SM's cycles over %globaltimer's ns); none for a
    /// stage or a tile too short to time.
    pub fn sm_mhz(&self) -> Option<f64> {
        let tile = self.tile?;
        let ns = self.end_ns - self.start_ns;
        (ns > 0).then(|| f64::from(tile.sm_cycles) * 1e3 / ns as f64)
    }
}

/// Words of one `mm::timeline::Event` (48 B).
const EVENT_WORDS: usize = 6;
/// Words of one `mm::timeline::Timeline` (24 B).
const DESC_WORDS: usize = 3;

/// The device side of a timeline: every CTA's run of events and its cursor, and a descriptor per
/// kind of tile (the fused kernel hands one to each layer). Allocated once, outside any forward.
pub struct TimelineBuffers {
    events: CudaSlice<u64>,
    cursors: CudaSlice<u32>,
    descs: CudaSlice<u64>,
    grid: usize,
    per_cta: usize,
}

/// The kinds of tile a descriptor of [`TimelineBuffers`] stands for, in order.
const DESC_KINDS: [EventKind; 3] = [EventKind::L1Tile, EventKind::L2Tile, EventKind::Tile];

impl TimelineBuffers {
    /// Room for `per_cta` events in each of `grid` CTAs (more are counted, not kept).
    pub fn new(gpu: &Gpu, grid: usize, per_cta: usize) -> Result<Self, GemmError> {
        let mut events = gpu.alloc_zeros::<u64>(grid * per_cta * EVENT_WORDS)?;
        let mut cursors = gpu.alloc_zeros::<u32>(grid)?;
        let stream = gpu.stream();
        let events_addr = events.device_ptr_mut(stream).0;
        let cursors_addr = cursors.device_ptr_mut(stream).0;
        let words: Vec<u64> = DESC_KINDS
            .iter()
            .flat_map(|&kind| {
                [
                    events_addr,
                    cursors_addr,
                    per_cta as u64 | (kind as u64) << 32,
                ]
            })
            .collect();
        let descs = gpu.upload(&words)?;
        Ok(Self {
            events,
            cursors,
            descs,
            grid,
            per_cta,
        })
    }

    /// CTAs it has room for.
    pub fn grid(&self) -> usize {
        self.grid
    }

    /// Queued on `stream`: every CTA's run emptied, for the next launch.
    pub fn clear(&mut self, gpu: &Gpu, stream: &CudaStream) -> Result<(), GemmError> {
        let addr = self.cursors.device_ptr_mut(stream).0;
        // SAFETY: the cursors, `grid` u32 of this GPU.
        unsafe { gpu.memset_raw_on(stream, addr, 4 * self.grid, 0)? };
        Ok(())
    }

    /// The device address of the descriptor a GEMM records its tiles of `kind` through.
    pub(crate) fn desc(&self, stream: &CudaStream, kind: EventKind) -> u64 {
        let index = DESC_KINDS
            .iter()
            .position(|&k| k == kind)
            .expect("a kind of tile");
        self.descs.device_ptr(stream).0 + (8 * DESC_WORDS * index) as u64
    }

    /// The events of the last launch, once its stream is done, with the grid's `stages` (kind,
    /// start, end in ns of the same %globaltimer).
    pub fn read(&self, gpu: &Gpu, stages: &[(EventKind, u64, u64)]) -> Result<Timeline, GemmError> {
        let words = gpu.download(&self.events)?;
        let cursors = gpu.download(&self.cursors)?;
        Ok(Timeline::decode(&words, &cursors, self.per_cta, stages))
    }
}

/// A launch's events, times from its first event.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timeline {
    pub events: Vec<Event>,
    /// Events the CTAs' runs had no room for.
    pub dropped: u64,
}

impl Timeline {
    fn decode(
        words: &[u64],
        cursors: &[u32],
        per_cta: usize,
        stages: &[(EventKind, u64, u64)],
    ) -> Self {
        let mut events: Vec<Event> = stages
            .iter()
            .map(|&(kind, start_ns, end_ns)| Event {
                kind,
                cta: None,
                sm: None,
                start_ns,
                end_ns: end_ns.max(start_ns),
                tile: None,
            })
            .collect();
        let mut dropped = 0;
        for (cta, &n) in cursors.iter().enumerate() {
            let kept = (n as usize).min(per_cta);
            dropped += (n as usize - kept) as u64;
            for i in 0..kept {
                let at = (cta * per_cta + i) * EVENT_WORDS;
                let w = &words[at..at + EVENT_WORDS];
                let lo = |x: u64| x as u32;
                let hi = |x: u64| (x >> 32) as u32;
                let Some(&kind) = EventKind::ALL.get(lo(w[2]) as usize) else {
                    continue; // no kind of ours: not an event
                };
                events.push(Event {
                    kind,
                    cta: Some(cta as u32),
                    sm: Some(hi(w[2])),
                    start_ns: w[0],
                    end_ns: w[1].max(w[0]),
                    tile: Some(TileEvent {
                        expert: lo(w[3]),
                        row0: hi(w[3]),
                        rows: lo(w[4]),
                        n_col: hi(w[4]),
                        k_blocks: lo(w[5]),
                        sm_cycles: hi(w[5]),
                    }),
                });
            }
        }
        let first = events.iter().map(|e| e.start_ns).min().unwrap_or(0);
        for e in &mut events {
            e.start_ns -= first;
            e.end_ns -= first;
        }
        events.sort_by_key(|e| (e.start_ns, e.cta));
        Self { events, dropped }
    }

    /// The SM clocks of the tiles of `kind` over their spans (MHz): whether the SMs ran at
    /// their burst clock through the forward, or ramped up or throttled in it.
    pub fn sm_mhz(&self, kind: EventKind) -> Percentiles {
        let mut mhz: Vec<f64> = self
            .events
            .iter()
            .filter(|e| e.kind == kind)
            .filter_map(Event::sm_mhz)
            .collect();
        mhz.sort_by(f64::total_cmp);
        Percentiles::of(&mhz)
    }

    /// The end of the last event.
    pub fn span_ns(&self) -> u64 {
        self.events.iter().map(|e| e.end_ns).max().unwrap_or(0)
    }

    /// How the layers overlap. A tile's rows arrive when the stage or tiles that write them end:
    /// an L1 tile's when the dispatch ends, an L2 tile's when the last L1 tile of its expert over
    /// any of its rows ends; the delay to its first load is its start (the hand-out) after that.
    pub fn overlap(&self) -> Overlap {
        let of = |kind| self.events.iter().filter(move |e| e.kind == kind);
        let dispatch_end = of(EventKind::Dispatch).map(|e| e.end_ns).max();
        let l1_end = of(EventKind::L1Tile).map(|e| e.end_ns).max();
        let l2: Vec<&Event> = of(EventKind::L2Tile).collect();
        let l2_before_l1_ends = match l1_end {
            Some(end) if !l2.is_empty() => {
                l2.iter().filter(|e| e.start_ns < end).count() as f64 / l2.len() as f64
            }
            _ => 0.0,
        };
        let l1_arrival = |_: &TileEvent| dispatch_end;
        let l2_arrival = |t: &TileEvent| {
            of(EventKind::L1Tile)
                .filter(|e| {
                    e.tile.is_some_and(|l1| {
                        l1.expert == t.expert
                            && l1.row0 < t.row0 + t.rows
                            && t.row0 < l1.row0 + l1.rows
                    })
                })
                .map(|e| e.end_ns)
                .max()
        };
        let delays = |kind, arrival: &dyn Fn(&TileEvent) -> Option<u64>| {
            let mut d: Vec<f64> = of(kind)
                .filter_map(|e| {
                    let at = arrival(e.tile.as_ref()?)?;
                    Some((e.start_ns as f64 - at as f64) * 1e-3)
                })
                .collect();
            d.sort_by(f64::total_cmp);
            Percentiles::of(&d)
        };
        Overlap {
            l2_before_l1_ends,
            l1_arrival_to_load_us: delays(EventKind::L1Tile, &l1_arrival),
            l2_arrival_to_load_us: delays(EventKind::L2Tile, &l2_arrival),
        }
    }
}

/// What a timeline shows of the layers' overlap (the fused kernel runs no waves yet: a layer is
/// one wave).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Overlap {
    /// Share of the L2 tiles that start before the last L1 tile ends.
    pub l2_before_l1_ends: f64,
    /// From a tile's rows' arrival to its hand-out (µs; negative: handed out before, waiting).
    pub l1_arrival_to_load_us: Percentiles,
    pub l2_arrival_to_load_us: Percentiles,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

impl Percentiles {
    /// Of sorted values.
    fn of(sorted: &[f64]) -> Self {
        if sorted.is_empty() {
            return Self::default();
        }
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        Self {
            count: sorted.len(),
            p10: at(0.1),
            p50: at(0.5),
            p90: at(0.9),
            max: at(1.0),
        }
    }
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = |p: &Percentiles| {
            format!(
                "p10 {:.1} p50 {:.1} p90 {:.1} max {:.1} us ({} tiles)",
                p.p10, p.p50, p.p90, p.max, p.count
            )
        };
        write!(
            f,
            "L2 tiles starting before the last L1 tile ends: {:.1} %; arrival to first load: L1 {}, L2 {}",
            100.0 * self.l2_before_l1_ends,
            p(&self.l1_arrival_to_load_us),
            p(&self.l2_arrival_to_load_us)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(kind: EventKind, sm: u32, start: u64, end: u64, t: [u32; 6]) -> [u64; EVENT_WORDS] {
        let pack = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
        [
            start,
            end,
            pack(kind as u32, sm),
            pack(t[0], t[1]),
            pack(t[2], t[3]),
            pack(t[4], t[5]),
        ]
    }

    #[test]
    fn decodes_events_and_measures_the_overlap() {
        let base = 7_000_000_000u64;
        let per_cta = 2;
        let mut w = vec![0u64; 2 * per_cta * EVENT_WORDS];
        let mut put = |cta: usize, i: usize, e: [u64; EVENT_WORDS]| {
            let at = (cta * per_cta + i) * EVENT_WORDS;
            w[at..at + EVENT_WORDS].copy_from_slice(&e);
        };
        // L1 tiles of expert 1, rows 0..128 and 128..200; an L2 tile over rows 0..128 starting
        // 3 µs after the first L1 tile ends, before the second one ends.
        put(
            0,
            0,
            tile(
                EventKind::L1Tile,
                7,
                base + 2_000,
                base + 9_000,
                [1, 0, 128, 0, 56, 10_500],
            ),
        );
        put(
            0,
            1,
            tile(
                EventKind::L1Tile,
                7,
                base + 9_000,
                base + 16_000,
                [1, 128, 72, 0, 56, 13_860],
            ),
        );
        put(
            1,
            0,
            tile(
                EventKind::L2Tile,
                9,
                base + 12_000,
                base + 20_000,
                [1, 0, 128, 128, 24, 15_840],
            ),
        );
        let stages = [(EventKind::Dispatch, base, base + 1_000)];
        // CTA 0 appended a third tile its run of two had no room for.
        let t = Timeline::decode(&w, &[3, 1], per_cta, &stages);
        assert_eq!(t.dropped, 1);
        assert_eq!(t.events.len(), 4);
        assert_eq!(t.events[0].kind, EventKind::Dispatch);
        assert_eq!((t.events[0].start_ns, t.events[0].sm), (0, None));
        let l1 = t.events[1];
        assert_eq!((l1.cta, l1.sm, l1.start_ns), (Some(0), Some(7), 2_000));
        assert_eq!(l1.tile.unwrap().k_blocks, 56);
        assert_eq!(t.events[3].tile.unwrap().n_col, 128);
        let o = t.overlap();
        assert_eq!(o.l2_before_l1_ends, 1.0);
        assert_eq!(
            o.l1_arrival_to_load_us.p50, 8.0,
            "the median of 1 and 8 µs after dispatch"
        );
        assert_eq!(o.l2_arrival_to_load_us.p50, 3.0);
        assert_eq!(t.span_ns(), 20_000);
        // 7 µs at 1500 and 1980 MHz (the L1's), 8 µs at 1980 MHz (the L2's); stages have none.
        assert_eq!(l1.sm_mhz(), Some(1500.0));
        assert_eq!(t.events[0].sm_mhz(), None);
        let l1_mhz = t.sm_mhz(EventKind::L1Tile);
        assert_eq!((l1_mhz.count, l1_mhz.p10, l1_mhz.max), (2, 1500.0, 1980.0));
        assert_eq!(t.sm_mhz(EventKind::L2Tile).p50, 1980.0);
    }
}
