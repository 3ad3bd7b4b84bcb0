//! The buffer protocol every MegaMoE backend speaks — the unfused GPU pipeline
//! ([`crate::unfused`]), the fused kernel ([`crate::fused`]) and the CPU dataflow engine
//! (`megamoe-dataflow`):
//!
//! - the [`PipelineShape`] every rank of a world builds alike;
//! - the symmetric buffer: the regions of each rank's buffer that peers write into
//!   ([`PeerLayout`], from [`PipelineShape::peer_layout`], each at a [`PEER_REGION_ALIGN`]-aligned
//!   offset), one rank's addresses of them ([`PeerAddresses`]) and the `#[repr(C)]` table of every
//!   rank's ([`PeerTable`], twin of `mm::unfused::PeerTable` in `cuda/sm90_unfused.cuh`);
//! - the pool plan: a source rank's [`expert_counts`], an owner's [`PoolPlan`] (expert offsets,
//!   multiples of [`POOL_ROW_ALIGN`] rows; inside an expert the rows of source rank 0 first, then
//!   rank 1, …, each in (token, slot) order) and every pair's row ([`routes`]);
//! - the source of a pool row ([`RowMeta`], twin of `mm::unfused::RowMeta`).
//!
//! Capacity is agreed, not negotiated: the shape's pools hold any routing
//! ([`PipelineShape::worst_case_pool_rows`]) unless the caller builds smaller ones, and every rank
//! computes every owner's plan from the same counts, so a plan that overflows an owner's pools is
//! refused ([`PoolPlan::new`]) on every rank alike before any row moves. Host code only: runs and
//! is tested everywhere.

use fp_formats::Recipe;
use symm_mem::MAX_RANKS;

use crate::gemm::{Mma, Route, Routes, TOKEN_TILES};
use crate::transform::BLOCK_K;

/// Expert pools start at multiples of this many rows (the GEMM's scale loads need 16-B alignment).
pub const POOL_ROW_ALIGN: usize = 16;

/// What the protocol refuses, before any row moves.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    /// An owner's plan needs more rows than its pools hold ([`PoolPlan::new`]); every rank
    /// computes every plan, so every rank refuses alike.
    #[error(
        "pool capacity: owner rank {rank} needs {rows} pool rows (experts padded to {POOL_ROW_ALIGN}), \
         its pools hold {capacity}"
    )]
    Capacity {
        rank: usize,
        rows: usize,
        capacity: usize,
    },
    #[error("`topk_idx`[{token}, {slot}] = {value} is not a global expert id in -1..{experts}")]
    Expert {
        token: usize,
        slot: usize,
        value: i64,
        experts: usize,
    },
    /// A shape the kernels cannot serve, or bases that make no peer table.
    #[error("{what}: {detail}")]
    Shape { what: &'static str, detail: String },
}
/// The largest GEMM token tile: g128 scale tables reach this far past the last used row.
const MAX_TILE: usize = TOKEN_TILES[TOKEN_TILES.len() - 1];
/// Alignment of every region of the symmetric buffer ([`PeerLayout`]) and of its base addresses
/// (what `cudaMalloc` guarantees; VMM mappings are aligned to their 2 MiB granularity): more than
/// the glue kernels' 16-byte vector accesses and TMA's 16-byte global address rule need.
pub const PEER_REGION_ALIGN: usize = 256;

/// The shape a [`Pipeline`](crate::unfused::Pipeline) is built for; every rank of a world builds the same one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelineShape {
    pub recipe: Recipe,
    /// Each GEMM's tensor-core route: [`Mma::Bf16`] (exact, either recipe) or [`Mma::Fp8`] (g128);
    /// it sets the format of the pool the GEMM reads.
    pub routes: Routes,
    /// H.
    pub hidden: usize,
    /// I.
    pub intermediate: usize,
    /// E, experts over all ranks.
    pub num_experts: usize,
    pub top_k: usize,
    pub num_ranks: usize,
    /// T_max: tokens per rank and forward.
    pub max_tokens: usize,
    /// Rows of each L1/L2 pool; [`PipelineShape::worst_case_pool_rows`] fits any routing.
    pub pool_rows: usize,
    /// SwiGLU clamp c.
    pub clamp: Option<f32>,
}

impl PipelineShape {
    /// The shape with pools that fit any routing of `max_tokens` tokens per rank.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        recipe: Recipe,
        routes: impl Into<Routes>,
        hidden: usize,
        intermediate: usize,
        num_experts: usize,
        top_k: usize,
        num_ranks: usize,
        max_tokens: usize,
        clamp: Option<f32>,
    ) -> Result<Self, ProtocolError> {
        let shape = Self {
            recipe,
            routes: routes.into(),
            hidden,
            intermediate,
            num_experts,
            top_k,
            num_ranks,
            max_tokens,
            pool_rows: 0,
            clamp,
        };
        let shape = Self {
            pool_rows: shape.worst_case_pool_rows(),
            ..shape
        };
        shape.validate()?;
        Ok(shape)
    }

    pub fn experts_per_rank(&self) -> usize {
        self.num_experts / self.num_ranks
    }

    /// Every slot of every rank on one owner, each non-empty expert padded to 16 rows.
    pub fn worst_case_pool_rows(&self) -> usize {
        (self.num_ranks * self.max_tokens * self.top_k
            + self.experts_per_rank() * (POOL_ROW_ALIGN - 1))
            .next_multiple_of(POOL_ROW_ALIGN)
    }

    /// The FP8 route's scale tables' row stride: every GEMM tile reads in bounds.
    pub fn sf_stride(&self) -> usize {
        (self.pool_rows + MAX_TILE).next_multiple_of(POOL_ROW_ALIGN)
    }

    /// Bytes of the scale table of a pool of `k` channels that `mma` reads: FP8 route
    /// `[k/128][sf_stride]` f32 ([`crate::pool_order::scale_column`]); BF16 pools are widened and
    /// have none.
    pub fn sf_bytes(&self, mma: Mma, k: usize) -> usize {
        match mma {
            Mma::Fp8 => 4 * (k / BLOCK_K) * self.sf_stride(),
            Mma::Bf16 => 0,
        }
    }

    /// Bytes per row of a staged row from a peer (large T; the owner finishes it, `Pipeline::l1`):
    /// FP8 pool, its `H/128` scales as the table's floats, padded to 16 bytes (one contiguous
    /// store per row; a store per k128 block straight into the `[H/128][sf_stride]` table was 56
    /// single-byte NVLink stores a row, ≈ 25 % of the dispatch on 2×H200, perf.md v33); BF16 pool,
    /// the E4M3 row and its `H/G` scales padded to 16 (half the NVLink bytes of the widened row).
    /// One rank has no peers: 0.
    pub fn staged_row_bytes(&self) -> usize {
        match self.routes.l1 {
            _ if self.num_ranks == 1 => 0,
            Mma::Fp8 => (4 * (self.hidden / BLOCK_K)).next_multiple_of(16),
            Mma::Bf16 => self.hidden + (self.hidden / self.recipe.group()).next_multiple_of(16),
        }
    }

    /// The regions of one rank's symmetric buffer, in this order, each aligned to
    /// [`PEER_REGION_ALIGN`]: the L1 pool (`[pool_rows][H]` E4M3 or BF16), its scales
    /// ([`Self::sf_bytes`] of H, the GEMM's layout), rows from peers as they send them when staged
    /// (`[pool_rows][staged_row_bytes]`), its [`RowMeta`] `[pool_rows]`, the combine buffer
    /// `[top_k][max_tokens][H]` BF16, the cross-rank barrier's signals `[num_ranks]` u64, and the
    /// routes' counts `[num_ranks][num_experts]` u32 every rank publishes into every buffer.
    pub fn peer_layout(&self) -> PeerLayout {
        let mut end = 0usize;
        let mut region = |bytes: usize| {
            let region = PeerRegion::after(end, bytes);
            end = region.end();
            region
        };
        let l1_act = region(self.pool_rows * self.hidden * self.routes.l1.act_elem());
        let l1_sf = region(self.sf_bytes(self.routes.l1, self.hidden));
        let l1_staged = region(self.pool_rows * self.staged_row_bytes());
        let meta = region(self.pool_rows * size_of::<RowMeta>());
        let combine = region(self.top_k * self.max_tokens * self.hidden * size_of::<u16>());
        let signals = region(self.num_ranks * size_of::<u64>());
        let counts = region(self.num_ranks * self.num_experts * size_of::<u32>());
        PeerLayout {
            l1_act,
            l1_sf,
            l1_staged,
            meta,
            combine,
            signals,
            counts,
            bytes: end.next_multiple_of(PEER_REGION_ALIGN),
        }
    }

    pub fn validate(&self) -> Result<(), ProtocolError> {
        let bad = |detail: String| {
            Err(ProtocolError::Shape {
                what: "pipeline shape",
                detail,
            })
        };
        if !self.routes.supports(self.recipe) {
            return bad(format!(
                "the {} tensor-core route does not compute {}: FP8 promotes once per 128 channels",
                self.routes, self.recipe
            ));
        }
        if self.hidden == 0 || !self.hidden.is_multiple_of(BLOCK_K) {
            return bad(format!(
                "H = {} is not a positive multiple of 128",
                self.hidden
            ));
        }
        if self.intermediate == 0 || !self.intermediate.is_multiple_of(BLOCK_K) {
            return bad(format!(
                "I = {} is not a positive multiple of 128",
                self.intermediate
            ));
        }
        if self.num_ranks == 0
            || self.num_experts == 0
            || !self.num_experts.is_multiple_of(self.num_ranks)
        {
            return bad(format!(
                "E = {} is not a positive multiple of R = {}",
                self.num_experts, self.num_ranks
            ));
        }
        if self.top_k == 0 {
            return bad("top_k = 0".into());
        }
        if !self.pool_rows.is_multiple_of(POOL_ROW_ALIGN) {
            return bad(format!(
                "pool rows {} is not a multiple of {POOL_ROW_ALIGN}",
                self.pool_rows
            ));
        }
        let biggest = self.pool_rows.max(self.max_tokens * self.top_k) as u64
            * (2 * self.intermediate).max(self.hidden) as u64;
        if biggest >= i32::MAX as u64 * 16 || self.sf_stride() >= i32::MAX as usize {
            return bad(format!(
                "{} pool rows × {} channels do not fit the kernels' 32-bit indices",
                self.pool_rows,
                (2 * self.intermediate).max(self.hidden)
            ));
        }
        Ok(())
    }
}

/// Valid (token, slot) pairs per global expert of one source rank; masked slots (−1) skipped.
pub fn expert_counts(
    topk_idx: &[i64],
    top_k: usize,
    num_experts: usize,
) -> Result<Vec<u32>, ProtocolError> {
    let mut counts = vec![0u32; num_experts];
    for (i, &e) in topk_idx.iter().enumerate() {
        if e == -1 {
            continue;
        }
        if e < -1 || e >= num_experts as i64 {
            return Err(ProtocolError::Expert {
                token: i / top_k,
                slot: i % top_k,
                value: e,
                experts: num_experts,
            });
        }
        counts[e as usize] += 1;
    }
    Ok(counts)
}

/// One owner rank's pools: where each of its experts starts and how many rows it holds, and where
/// each source rank's rows of each expert start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPlan {
    pub owner: usize,
    /// First row of each local expert (multiples of 16).
    pub expert_offset: Vec<i32>,
    /// Rows of each local expert.
    pub expert_rows: Vec<i32>,
    /// Rows in use, padding included: the end of the last non-empty expert, rounded up to 16.
    pub rows: usize,
    /// `[source rank][local expert]`: first row of that source's pairs of that expert.
    pub source_base: Vec<Vec<i32>>,
    /// Rows whose pairs come from other ranks (staged at large T, `Pipeline::set_plans`).
    pub peer_rows: usize,
}

impl PoolPlan {
    /// The plan of `owner` from every source rank's [`expert_counts`] (`counts[src][global e]`);
    /// refused with [`ProtocolError::Capacity`] when it needs more than `capacity` rows.
    pub fn new(
        counts: &[Vec<u32>],
        owner: usize,
        experts_per_rank: usize,
        capacity: usize,
    ) -> Result<Self, ProtocolError> {
        let mut expert_offset = Vec::with_capacity(experts_per_rank);
        let mut expert_rows = Vec::with_capacity(experts_per_rank);
        let mut source_base = vec![Vec::with_capacity(experts_per_rank); counts.len()];
        let mut next = 0usize;
        let mut peer_rows = 0usize;
        for el in 0..experts_per_rank {
            let e = owner * experts_per_rank + el;
            let mut rows = 0usize;
            for (src, c) in counts.iter().enumerate() {
                source_base[src].push((next + rows) as i32);
                rows += c[e] as usize;
                if src != owner {
                    peer_rows += c[e] as usize;
                }
            }
            expert_offset.push(next as i32);
            expert_rows.push(rows as i32);
            next = (next + rows).next_multiple_of(POOL_ROW_ALIGN);
        }
        if next > capacity {
            return Err(ProtocolError::Capacity {
                rank: owner,
                rows: next,
                capacity,
            });
        }
        Ok(Self {
            owner,
            expert_offset,
            expert_rows,
            rows: next,
            source_base,
            peer_rows,
        })
    }

    /// Average rows of the experts that got any (0 when none did): picks the GEMM's token tile.
    pub fn avg_rows_of_hit_experts(&self) -> f64 {
        let hit: Vec<i32> = self
            .expert_rows
            .iter()
            .copied()
            .filter(|&r| r > 0)
            .collect();
        if hit.is_empty() {
            0.0
        } else {
            hit.iter().map(|&r| r as f64).sum::<f64>() / hit.len() as f64
        }
    }
}

/// The destination pool row of every (token, slot) pair of source rank `src` (−1 for masked
/// slots), given every owner's plan (`plans[owner]`). Pairs of one expert take consecutive rows
/// in (token, slot) order.
pub fn routes(
    topk_idx: &[i64],
    src: usize,
    plans: &[PoolPlan],
    experts_per_rank: usize,
) -> Vec<i32> {
    let mut cursor: Vec<Vec<i32>> = plans.iter().map(|p| p.source_base[src].clone()).collect();
    topk_idx
        .iter()
        .map(|&e| {
            if e < 0 {
                return -1;
            }
            let e = e as usize;
            let slot = &mut cursor[e / experts_per_rank][e % experts_per_rank];
            let row = *slot;
            *slot += 1;
            row
        })
        .collect()
}

/// The source of one pool row (`mm::unfused::RowMeta`); `token < 0` marks padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowMeta {
    pub rank: i32,
    pub token: i32,
    pub slot: i32,
    pub weight: f32,
}

const _: () = assert!(size_of::<RowMeta>() == 16);

/// One region of the symmetric buffer: `bytes` bytes from `offset` past the rank's base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerRegion {
    pub offset: usize,
    pub bytes: usize,
}

impl PeerRegion {
    /// `bytes` bytes from the first offset at or past `end` aligned to [`PEER_REGION_ALIGN`]: the
    /// region after one that ends at `end`.
    pub fn after(end: usize, bytes: usize) -> Self {
        Self {
            offset: end.next_multiple_of(PEER_REGION_ALIGN),
            bytes,
        }
    }

    pub fn end(&self) -> usize {
        self.offset + self.bytes
    }
}

/// Where the buffers that peers write into lie in each rank's symmetric buffer (the same on every
/// rank): [`PipelineShape::peer_layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLayout {
    pub l1_act: PeerRegion,
    pub l1_sf: PeerRegion,
    /// Rows from peers as their dispatch writes them when staged (large T: FP8 scales, BF16 E4M3
    /// rows and scales); `Pipeline::l1` moves them into the pool.
    pub l1_staged: PeerRegion,
    pub meta: PeerRegion,
    pub combine: PeerRegion,
    /// `[num_ranks]` u64: slot r holds the epoch of the last barrier rank r entered (`barriers`'
    /// rank_barrier); zero when the pipeline is built, never reset.
    pub signals: PeerRegion,
    /// `[num_ranks][num_experts]` u32: row r holds rank r's routes per global expert, as its
    /// `uf_count` published them (`Pipeline::count_routes`).
    pub counts: PeerRegion,
    /// The buffer's size: every region's end, rounded up to [`PEER_REGION_ALIGN`].
    pub bytes: usize,
}

impl PeerLayout {
    /// The regions in buffer order.
    pub fn regions(&self) -> [(&'static str, PeerRegion); 7] {
        [
            ("l1_act", self.l1_act),
            ("l1_sf", self.l1_sf),
            ("l1_staged", self.l1_staged),
            ("meta", self.meta),
            ("combine", self.combine),
            ("signals", self.signals),
            ("counts", self.counts),
        ]
    }

    /// The addresses of the buffer whose base is `base`.
    pub fn addresses(&self, base: u64) -> PeerAddresses {
        let at = |r: PeerRegion| base + r.offset as u64;
        PeerAddresses {
            l1_act: at(self.l1_act),
            l1_sf: at(self.l1_sf),
            l1_staged: at(self.l1_staged),
            meta: at(self.meta),
            combine: at(self.combine),
            signals: at(self.signals),
            counts: at(self.counts),
        }
    }

    /// The glue kernels' [`PeerTable`] from every rank's base (`bases[r]`, as mapped in this
    /// process); refused unless there is one base per rank, each aligned to [`PEER_REGION_ALIGN`].
    pub fn peer_table(&self, bases: &[u64], num_ranks: usize) -> Result<PeerTable, ProtocolError> {
        let bad = |detail: String| ProtocolError::Shape {
            what: "symmetric buffer bases",
            detail,
        };
        if bases.len() != num_ranks || num_ranks > MAX_RANKS {
            return Err(bad(format!(
                "{} bases, the shape has {num_ranks} ranks (at most {MAX_RANKS})",
                bases.len()
            )));
        }
        if let Some((rank, base)) = bases
            .iter()
            .enumerate()
            .find(|(_, b)| !b.is_multiple_of(PEER_REGION_ALIGN as u64))
        {
            return Err(bad(format!(
                "rank {rank}'s base {base:#x} is not aligned to {PEER_REGION_ALIGN} bytes"
            )));
        }
        let mut table = PeerTable::zeroed();
        for (r, &base) in bases.iter().enumerate() {
            let a = self.addresses(base);
            table.l1_act[r] = a.l1_act;
            table.l1_sf[r] = a.l1_sf;
            table.l1_staged[r] = a.l1_staged;
            table.meta[r] = a.meta;
            table.combine[r] = a.combine;
            table.counts[r] = a.counts;
        }
        Ok(table)
    }
}

/// `mm::unfused::PeerTable`: where each rank's regions that peers write into lie, as this process
/// maps them, indexed by rank (0 past the world's ranks). The glue kernels read it from device
/// memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PeerTable {
    pub l1_act: [u64; MAX_RANKS],
    pub l1_sf: [u64; MAX_RANKS],
    pub l1_staged: [u64; MAX_RANKS],
    pub meta: [u64; MAX_RANKS],
    pub combine: [u64; MAX_RANKS],
    pub counts: [u64; MAX_RANKS],
}

impl PeerTable {
    fn zeroed() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}

const _: () = {
    assert!(size_of::<PeerTable>() == 6 * 8 * MAX_RANKS);
    assert!(std::mem::offset_of!(PeerTable, counts) == 5 * 8 * MAX_RANKS);
};

/// The addresses of one rank's buffers that peers write into, as this process maps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddresses {
    pub l1_act: u64,
    pub l1_sf: u64,
    pub l1_staged: u64,
    pub meta: u64,
    pub combine: u64,
    pub signals: u64,
    pub counts: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_skip_masked_slots_and_refuse_bad_ids() {
        let idx = [0, -1, 3, 3, 1, -1];
        assert_eq!(expert_counts(&idx, 2, 4).unwrap(), vec![1, 1, 0, 2]);
        let err = expert_counts(&[0, 4], 2, 4).unwrap_err();
        assert!(
            matches!(
                err,
                ProtocolError::Expert {
                    token: 0,
                    slot: 1,
                    value: 4,
                    experts: 4
                }
            ),
            "{err}"
        );
        assert!(matches!(
            expert_counts(&[-2], 1, 4),
            Err(ProtocolError::Expert { value: -2, .. })
        ));
    }

    #[test]
    fn pool_plan_pads_experts_to_16_and_orders_sources() {
        // 2 ranks, 4 experts (2 per rank). Source 0: e0 ×3, e1 ×17, e3 ×1; source 1: e0 ×2, e3 ×16.
        let counts = vec![vec![3, 17, 0, 1], vec![2, 0, 0, 16]];
        let p0 = PoolPlan::new(&counts, 0, 2, 1024).unwrap();
        assert_eq!(p0.expert_offset, vec![0, 16]);
        assert_eq!(p0.expert_rows, vec![5, 17]);
        assert_eq!(p0.rows, 48);
        assert_eq!(p0.source_base, vec![vec![0, 16], vec![3, 33]]);
        assert_eq!(p0.peer_rows, 2, "source 1's e0 pairs");
        let p1 = PoolPlan::new(&counts, 1, 2, 1024).unwrap();
        assert_eq!(p1.expert_offset, vec![0, 0]);
        assert_eq!(p1.expert_rows, vec![0, 17]);
        assert_eq!(p1.rows, 32);
        assert_eq!(p1.source_base, vec![vec![0, 0], vec![0, 1]]);
        assert_eq!(p1.peer_rows, 1, "source 0's e3 pair");
        assert!((p1.avg_rows_of_hit_experts() - 17.0).abs() < 1e-12);
        assert_eq!(
            PoolPlan::new(&[vec![0, 0, 0, 0]], 0, 4, 0).unwrap().rows,
            0,
            "no rows, no padding"
        );
    }

    #[test]
    fn capacity_overflow_is_a_typed_error() {
        let err = PoolPlan::new(&[vec![20, 1]], 0, 2, 32).unwrap_err();
        assert!(
            matches!(
                err,
                ProtocolError::Capacity {
                    rank: 0,
                    rows: 48,
                    capacity: 32
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn routes_are_consecutive_per_expert_in_token_slot_order() {
        // Source 1 of 2 ranks, 4 experts, k = 2.
        let idx0 = [1i64, 0, 3, -1];
        let idx1 = [0i64, 3, 0, 2, -1, 3];
        let counts = vec![
            expert_counts(&idx0, 2, 4).unwrap(),
            expert_counts(&idx1, 2, 4).unwrap(),
        ];
        let plans: Vec<PoolPlan> = (0..2)
            .map(|o| PoolPlan::new(&counts, o, 2, 1024).unwrap())
            .collect();
        // Owner 0: e0 = [src0 ×1, src1 ×2] rows 0..3; e1 = [src0 ×1] row 16.
        // Owner 1: e2 = [src1 ×1] row 0; e3 = [src0 ×1, src1 ×2] rows 16..19.
        assert_eq!(routes(&idx0, 0, &plans, 2), vec![16, 0, 16, -1]);
        assert_eq!(routes(&idx1, 1, &plans, 2), vec![1, 17, 2, 0, -1, 18]);
    }

    #[test]
    fn every_pair_gets_a_distinct_row_inside_its_expert() {
        let (r, el, k, t) = (3usize, 5usize, 4usize, 37usize);
        let e = r * el;
        let idx: Vec<Vec<i64>> = (0..r)
            .map(|s| {
                (0..t * k)
                    .map(|i| {
                        let v = (i * 7 + s * 13) % (e + 3);
                        if v >= e { -1 } else { v as i64 }
                    })
                    .collect()
            })
            .collect();
        let counts: Vec<Vec<u32>> = idx
            .iter()
            .map(|x| expert_counts(x, k, e).unwrap())
            .collect();
        let cap = PipelineShape::new(Recipe::Mx32, Mma::Bf16, 128, 128, e, k, r, t, None)
            .unwrap()
            .pool_rows;
        let plans: Vec<PoolPlan> = (0..r)
            .map(|o| PoolPlan::new(&counts, o, el, cap).unwrap())
            .collect();
        let mut seen = vec![vec![false; cap]; r];
        for (s, x) in idx.iter().enumerate() {
            for (&ex, &row) in x.iter().zip(&routes(x, s, &plans, el)) {
                if ex < 0 {
                    assert_eq!(row, -1);
                    continue;
                }
                let (o, l) = (ex as usize / el, ex as usize % el);
                let p = &plans[o];
                let (off, n) = (p.expert_offset[l], p.expert_rows[l]);
                assert!(row >= off && row < off + n, "row {row} outside expert {ex}");
                assert!(!seen[o][row as usize], "row {row} of owner {o} twice");
                seen[o][row as usize] = true;
            }
        }
        for (o, p) in plans.iter().enumerate() {
            let used = seen[o].iter().filter(|&&b| b).count();
            assert_eq!(used as i32, p.expert_rows.iter().sum::<i32>());
            assert!(p.expert_offset.iter().all(|&off| off % 16 == 0));
            assert!(p.rows <= cap);
        }
    }

    /// The pools of [`PipelineShape::new`] hold the routings that fill one owner: every slot of
    /// every rank on one expert, or spread so that every expert pads its most.
    #[test]
    fn worst_case_pools_hold_every_routing() {
        for (r, el, k, t) in [(1, 1, 1, 1), (3, 5, 4, 37), (8, 48, 6, 64), (2, 7, 3, 0)] {
            let e = r * el;
            let cap = PipelineShape::new(Recipe::Mx32, Mma::Bf16, 128, 128, e, k, r, t, None)
                .unwrap()
                .pool_rows;
            let pairs = (t * k) as u32;
            // Every pair of every rank on owner 0's first expert, duplicates in a token included.
            let mut one_expert = vec![0u32; e];
            one_expert[0] = pairs;
            // Owner 0's experts take one pair each, the rest go to its last one: every expert
            // pads, the last by 15 rows at most.
            let mut spread = vec![0u32; e];
            let each = pairs.min(el as u32);
            spread[..each as usize].fill(1);
            spread[el - 1] += pairs - each;
            for counts in [one_expert, spread] {
                let plan = PoolPlan::new(&vec![counts; r], 0, el, cap).unwrap();
                assert!(plan.rows <= cap, "{r} ranks, {el} experts each: {plan:?}");
            }
        }
    }

    #[test]
    fn shapes_are_validated() {
        let ok =
            PipelineShape::new(Recipe::G128, Mma::Fp8, 256, 128, 8, 2, 2, 7, Some(10.0)).unwrap();
        assert_eq!(ok.pool_rows, (2 * 7 * 2 + 4 * 15usize).next_multiple_of(16));
        assert_eq!(ok.sf_stride() % 16, 0);
        assert!(ok.sf_stride() >= ok.pool_rows + MAX_TILE);
        assert!(PipelineShape::new(Recipe::G128, Mma::Fp8, 200, 128, 8, 2, 2, 7, None).is_err());
        assert!(PipelineShape::new(Recipe::G128, Mma::Fp8, 256, 128, 9, 2, 2, 7, None).is_err());
        assert!(PipelineShape::new(Recipe::G128, Mma::Fp8, 256, 128, 8, 0, 2, 7, None).is_err());
        // FP8 promotes once per 128 channels: it cannot compute mx32.
        assert!(PipelineShape::new(Recipe::Mx32, Mma::Fp8, 256, 128, 8, 2, 2, 7, None).is_err());
        // An FP8 L2 needs the L2 pool's scales per 128 channels as well.
        let err = PipelineShape::new(Recipe::Mx32, Routes::EXACT_L1, 256, 128, 8, 2, 2, 7, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bf16-fp8") && err.contains("mx32"), "{err}");
        assert!(PipelineShape::new(Recipe::G128, Mma::Bf16, 256, 128, 8, 2, 2, 7, None).is_ok());
        // T = 0 still has valid (empty) pools.
        let empty =
            PipelineShape::new(Recipe::Mx32, Mma::Bf16, 256, 128, 8, 2, 1, 0, None).unwrap();
        assert_eq!(empty.pool_rows, 128);
    }

    /// Shapes of every kind: every route, T = 0, pools smaller than the worst case, odd sizes.
    fn layout_shapes() -> Vec<PipelineShape> {
        let mut shapes = Vec::new();
        for (recipe, mma) in [
            (Recipe::G128, Routes::both(Mma::Fp8)),
            (Recipe::G128, Routes::EXACT_L1),
            (Recipe::G128, Routes::EXACT),
            (Recipe::Mx32, Routes::EXACT),
        ] {
            for (h, i, e, k, r, t) in [
                (256, 128, 8, 2, 2, 7),
                (128, 128, 4, 1, 1, 0),
                (384, 256, 6, 3, 3, 1),
                (7168, 3072, 384, 6, 8, 8192),
                (4096, 2048, 16, 6, 2, 7),
            ] {
                shapes.push(PipelineShape::new(recipe, mma, h, i, e, k, r, t, Some(10.0)).unwrap());
            }
            let mut small = PipelineShape::new(recipe, mma, 256, 128, 8, 2, 2, 32, None).unwrap();
            small.pool_rows = 16;
            shapes.push(small);
        }
        shapes
    }

    #[test]
    fn peer_layout_regions_are_aligned_disjoint_and_sized() {
        for s in layout_shapes() {
            let layout = s.peer_layout();
            let regions = layout.regions();
            let (h, rows) = (s.hidden, s.pool_rows);
            let want = [
                rows * h * s.routes.l1.act_elem(),
                match s.routes.l1 {
                    Mma::Fp8 => 4 * (h / 128) * s.sf_stride(),
                    Mma::Bf16 => 0,
                },
                match s.routes.l1 {
                    _ if s.num_ranks == 1 => 0,
                    Mma::Fp8 => rows * (4 * (h / 128)).next_multiple_of(16),
                    Mma::Bf16 => rows * (h + (h / s.recipe.group()).next_multiple_of(16)),
                },
                rows * 16,
                s.top_k * s.max_tokens * h * 2,
                s.num_ranks * 8,
                s.num_ranks * s.num_experts * 4,
            ];
            let mut end = 0;
            for ((name, region), want) in regions.iter().zip(want) {
                assert_eq!(region.bytes, want, "{s:?}: {name} size");
                assert_eq!(region.offset % PEER_REGION_ALIGN, 0, "{s:?}: {name} offset");
                assert!(
                    region.offset >= end,
                    "{s:?}: {name} overlaps the region before it"
                );
                assert!(
                    region.offset - end < PEER_REGION_ALIGN,
                    "{s:?}: {name}: more padding than alignment needs"
                );
                end = region.end();
            }
            assert_eq!(layout.bytes % PEER_REGION_ALIGN, 0, "{s:?}");
            assert!(
                layout.bytes >= end && layout.bytes - end < PEER_REGION_ALIGN,
                "{s:?}"
            );
        }
    }

    #[test]
    fn peer_table_follows_from_the_bases() {
        let s = PipelineShape::new(Recipe::G128, Mma::Fp8, 256, 128, 12, 2, 3, 7, None).unwrap();
        let layout = s.peer_layout();
        let bases = [0x7f00_0000_0000u64, 0x10_0000, 0x7e00_0020_0000];
        let table = layout.peer_table(&bases, 3).unwrap();
        for (r, &base) in bases.iter().enumerate() {
            let a = layout.addresses(base);
            assert_eq!(a.l1_act, base, "the L1 pool starts the buffer");
            assert_eq!(
                [
                    table.l1_act[r],
                    table.l1_sf[r],
                    table.l1_staged[r],
                    table.meta[r],
                    table.combine[r],
                    table.counts[r]
                ],
                [a.l1_act, a.l1_sf, a.l1_staged, a.meta, a.combine, a.counts]
            );
            assert_eq!(a.combine, base + layout.combine.offset as u64);
            assert_eq!(a.counts, base + layout.counts.offset as u64);
        }
        // Past the world's ranks the table is empty.
        assert!(
            table.l1_act[3..]
                .iter()
                .chain(&table.counts[3..])
                .all(|&a| a == 0)
        );
        let refused = [
            layout.peer_table(&bases[..2], 3).unwrap_err(),
            layout.peer_table(&[0, 0x100, 0x1080], 3).unwrap_err(),
        ];
        for err in &refused {
            assert!(matches!(err, ProtocolError::Shape { .. }), "{err}");
        }
        assert!(refused[0].to_string().contains("2 bases"), "{}", refused[0]);
        assert!(
            refused[1].to_string().contains("rank 2's base 0x1080"),
            "{}",
            refused[1]
        );
    }
}
