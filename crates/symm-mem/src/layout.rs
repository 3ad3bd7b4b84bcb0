//! The MegaMoE symmetric buffer layout: which regions exist, where each starts, how large and how
//! aligned it is, and how many pool rows every valid routing can need.
//!
//! Order: the workspace (counters and tables the kernel keeps zero between launches), the inputs
//! the caller copies in, the L1 pool (tokens pulled from peers), the L2 pool (re-quantized SwiGLU
//! output), and the BF16 combine buffer that peers write expert outputs into.

use std::fmt;

use crate::device::TokenSrc;
use crate::{MAX_RANKS, SymmError};

/// Most tokens per rank: keeps `token·k + slot` (the source table's entries) far inside a `u32`.
pub const MAX_TOKENS_PER_RANK: u32 = 1 << 20;

/// Alignment of every region a TMA engine touches; 128 B also keeps unrelated regions off one
/// cache line, which matters for the barrier words that peers hit with atomics.
pub const TMA_ALIGN: u64 = 128;

/// Alignment of plain counter arrays: enough for 16-byte vector loads.
pub const MIN_ALIGN: u64 = 16;

/// A set of BLOCK_M values (multiples of 8 in 8..=512) the pool must serve.
///
/// One buffer is allocated for `T_max` and reused by calls with fewer tokens, whose kernels pick
/// smaller blocks; the padded pool usage is not monotone in BLOCK_M, so the layout is sized for
/// every candidate the kernels may pick. Bit `j` stands for BLOCK_M = 8·(j+1).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockMs(u64);

impl BlockMs {
    pub fn new(block_ms: &[u32]) -> Result<Self, SymmError> {
        let mut bits = 0u64;
        for &bm in block_ms {
            if bm == 0 || !bm.is_multiple_of(8) || bm > 512 {
                return Err(SymmError::BadBlockM(bm));
            }
            bits |= 1 << (bm / 8 - 1);
        }
        if bits == 0 {
            return Err(SymmError::NoBlockM);
        }
        Ok(Self(bits))
    }

    pub fn single(block_m: u32) -> Result<Self, SymmError> {
        Self::new(&[block_m])
    }

    pub fn contains(self, block_m: u32) -> bool {
        block_m.is_multiple_of(8)
            && (8..=512).contains(&block_m)
            && self.0 & (1 << (block_m / 8 - 1)) != 0
    }

    /// The block sizes, ascending.
    pub fn iter(self) -> impl Iterator<Item = u32> {
        (0..64u32)
            .filter(move |j| self.0 & (1 << j) != 0)
            .map(|j| 8 * (j + 1))
    }

    pub fn min(self) -> u32 {
        8 * (self.0.trailing_zeros() + 1)
    }

    pub fn max(self) -> u32 {
        8 * (64 - self.0.leading_zeros())
    }
}

impl fmt::Debug for BlockMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl fmt::Display for BlockMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.iter().map(|bm| bm.to_string()).collect();
        write!(f, "{{{}}}", list.join(","))
    }
}

/// The shape a buffer is laid out for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymmParams {
    /// R, 1..=72.
    pub num_ranks: u32,
    /// T_max: the most tokens any rank brings to one call.
    pub max_tokens_per_rank: u32,
    /// H, a multiple of 128.
    pub hidden: u32,
    /// I, a multiple of 128.
    pub intermediate: u32,
    /// E, a multiple of R; expert e lives on rank e / (E/R).
    pub num_experts: u32,
    /// k, 1..=32.
    pub num_topk: u32,
    /// G: channels per activation scale byte, 32 (`mx32`) or 128 (`g128`).
    pub act_scale_group: u32,
    /// The BLOCK_M values the kernels may use with this buffer.
    pub block_ms: BlockMs,
    /// Width of an L1 output n-block; the L2 arrival mask has one bit per L1 n-block.
    pub l1_block_n: u32,
}

impl SymmParams {
    pub fn validate(&self) -> Result<(), SymmError> {
        let r = self.num_ranks;
        if r == 0 || r as usize > MAX_RANKS {
            return Err(SymmError::BadRankCount(r));
        }
        if self.max_tokens_per_rank == 0 || self.max_tokens_per_rank > MAX_TOKENS_PER_RANK {
            return Err(SymmError::BadTokenCount(self.max_tokens_per_rank));
        }
        for (name, value) in [("hidden", self.hidden), ("intermediate", self.intermediate)] {
            if value == 0 || !value.is_multiple_of(128) {
                return Err(SymmError::NotMultipleOf128 { name, value });
            }
        }
        if self.num_experts == 0 || !self.num_experts.is_multiple_of(r) {
            return Err(SymmError::ExpertsNotDivisible {
                num_experts: self.num_experts,
                num_ranks: r,
            });
        }
        if !(1..=32).contains(&self.num_topk) {
            return Err(SymmError::BadTopk(self.num_topk));
        }
        if self.act_scale_group != 32 && self.act_scale_group != 128 {
            return Err(SymmError::BadScaleGroup(self.act_scale_group));
        }
        let two_i = 2 * self.intermediate;
        let bn = self.l1_block_n;
        if bn == 0 || !bn.is_multiple_of(16) || !two_i.is_multiple_of(bn) {
            return Err(SymmError::BadBlockN { block_n: bn, two_i });
        }
        Ok(())
    }

    /// E_l = E / R.
    pub fn num_local_experts(&self) -> u32 {
        self.num_experts / self.num_ranks
    }

    /// Number of L1 output n-blocks, 2I / BLOCK_N: the bits of one L2 arrival mask.
    pub fn l1_n_blocks(&self) -> u32 {
        2 * self.intermediate / self.l1_block_n
    }
}

/// The most pool rows one rank can need with block size `block_m`, counting each local expert's
/// tail padding, over every valid routing (each token names an expert at most once).
///
/// Let N = R·T_max·min(k, E_l) (the most (token, slot) pairs a rank can receive: a token has at
/// most min(k, E_l) distinct experts there), C = R·T_max (the most one expert can receive) and
/// c_e the count of local expert e. An expert using b ≥ 1 blocks holds at least (b−1)·BM + 1
/// tokens and at most C, so with `a` experts non-empty and B blocks in all,
/// N ≥ Σ c_e ≥ (B − a)·BM + a and b_e ≤ ⌈C/BM⌉, hence
/// B ≤ a + min(⌊(N − a)/BM⌋, a·(⌈C/BM⌉ − 1)). That is non-decreasing in a, so a = min(E_l, N)
/// gives the bound; and it is reached: give a experts one token each, then spend the remaining
/// pairs BM at a time on further blocks (the routing tests build exactly that). The capacity is
/// BM·B rows, at most one block below the classic align(N + E_l·(BM−1), BM).
pub fn pool_capacity(
    num_ranks: u32,
    max_tokens_per_rank: u32,
    num_topk: u32,
    num_local_experts: u32,
    block_m: u32,
) -> u64 {
    let bm = u64::from(block_m);
    let per_expert = u64::from(num_ranks) * u64::from(max_tokens_per_rank);
    let pairs = per_expert * u64::from(num_topk.min(num_local_experts));
    let non_empty = u64::from(num_local_experts).min(pairs);
    let extra_blocks = ((pairs - non_empty) / bm).min(non_empty * (per_expert.div_ceil(bm) - 1));
    bm * (non_empty + extra_blocks)
}

/// One region of the buffer: `bytes` bytes at `offset` from the base, `offset % align == 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub name: &'static str,
    pub offset: u64,
    pub bytes: u64,
    pub align: u64,
}

impl Region {
    pub fn end(&self) -> u64 {
        self.offset + self.bytes
    }
}

/// Places regions one after another, each at its alignment.
struct Cursor(u64);

impl Cursor {
    fn take(&mut self, name: &'static str, bytes: u64, align: u64) -> Region {
        let offset = self.0.next_multiple_of(align);
        self.0 = offset + bytes;
        Region {
            name,
            offset,
            bytes,
            align,
        }
    }
}

/// The full layout. All offsets are from the buffer base, identical on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymmLayout {
    pub params: SymmParams,
    /// Pool rows: the largest [`pool_capacity`] over `params.block_ms`.
    pub pool_capacity: u64,
    /// Pool blocks the arrival arrays track: enough for the smallest BLOCK_M.
    pub num_pool_blocks: u64,
    /// u64 words in one L2 arrival mask: ⌈(2I / BLOCK_N) / 64⌉ (1 for every DeepSeek shape).
    pub l2_mask_words: u64,

    // --- workspace: zero at launch, left zero by the kernel ---
    /// u64 phase/count word of the in-rank grid barrier.
    pub grid_barrier: Region,
    /// [R] u64: word s is written by rank s only, so the cross-rank barrier needs no remote atomics.
    pub rank_barrier_signals: Region,
    /// u64: non-zero when a barrier timed out or the kernel refused its input; the host decodes it.
    pub error_word: Region,
    /// [E] u64 per global expert: this rank's send count (tokens reserved by its SMs).
    pub send_counts: Region,
    /// [R][E_l] u32: tokens source rank s sends to each local expert, written by s.
    pub recv_counts: Region,
    /// [pool blocks] u32: tokens arrived in each L1 pool block.
    pub l1_arrival_counts: Region,
    /// [pool blocks][l2_mask_words] u64: bit n set when L1 n-block n of that pool block is stored.
    pub l2_arrival_masks: Region,
    /// [E_l][R][T_max] u32 `token·k + slot`, written by the source rank; T_max per (expert, source)
    /// because a token names an expert at most once, and the source writes before any prefix sum
    /// over ranks exists, so it can only index by its own count.
    pub src_token_topk: Region,
    /// [pool rows] [`TokenSrc`]: where each pool row came from, for the L2 write-back.
    pub token_src: Region,

    // --- inputs, copied in by the caller ---
    /// [T_max][H] E4M3.
    pub x: Region,
    /// [T_max][H/G] UE8M0 bytes.
    pub x_sf: Region,
    /// [T_max][k] i64, −1 = masked.
    pub topk_idx: Region,
    /// [T_max][k] f32.
    pub topk_weights: Region,

    // --- pools, each local expert's rows from a BLOCK_M-aligned offset ---
    /// [pool rows][H] E4M3.
    pub l1_pool_tokens: Region,
    /// [pool rows][H/G] UE8M0; dense rows, so one block's scales are one 16-B-aligned span.
    pub l1_pool_scales: Region,
    /// [pool rows] f32 top-k weight of the row's (token, slot).
    pub l1_pool_topk_weights: Region,
    /// [pool rows][I] E4M3.
    pub l2_pool_tokens: Region,
    /// [pool rows][I/G] UE8M0.
    pub l2_pool_scales: Region,

    /// [k][T_max][H] BF16: slot j of token t, written by the rank owning its expert.
    pub combine: Region,

    /// End of the workspace: bytes [0, workspace_bytes) must be zero before the first launch.
    pub workspace_bytes: u64,
    /// Bytes to allocate per rank.
    pub total_bytes: u64,
}

impl SymmLayout {
    pub fn new(params: SymmParams) -> Result<Self, SymmError> {
        params.validate()?;
        let p = &params;
        let r = u64::from(p.num_ranks);
        let t = u64::from(p.max_tokens_per_rank);
        let h = u64::from(p.hidden);
        let i = u64::from(p.intermediate);
        let e = u64::from(p.num_experts);
        let e_l = u64::from(p.num_local_experts());
        let k = u64::from(p.num_topk);
        let g = u64::from(p.act_scale_group);

        let pool_capacity = p
            .block_ms
            .iter()
            .map(|bm| {
                pool_capacity(
                    p.num_ranks,
                    p.max_tokens_per_rank,
                    p.num_topk,
                    p.num_local_experts(),
                    bm,
                )
            })
            .max()
            .expect("BlockMs is never empty");
        let num_pool_blocks = pool_capacity.div_ceil(u64::from(p.block_ms.min()));
        let l2_mask_words = u64::from(p.l1_n_blocks()).div_ceil(64);
        let cap = pool_capacity;

        let mut c = Cursor(0);
        let grid_barrier = c.take("grid_barrier", 8, TMA_ALIGN);
        let rank_barrier_signals = c.take("rank_barrier_signals", 8 * r, TMA_ALIGN);
        let error_word = c.take("error_word", 8, TMA_ALIGN);
        let send_counts = c.take("send_counts", 8 * e, TMA_ALIGN);
        let recv_counts = c.take("recv_counts", 4 * r * e_l, MIN_ALIGN);
        let l1_arrival_counts = c.take("l1_arrival_counts", 4 * num_pool_blocks, MIN_ALIGN);
        let l2_arrival_masks = c.take(
            "l2_arrival_masks",
            8 * l2_mask_words * num_pool_blocks,
            MIN_ALIGN,
        );
        let src_token_topk = c.take("src_token_topk", 4 * e_l * r * t, MIN_ALIGN);
        let token_src = c.take("token_src", size_of::<TokenSrc>() as u64 * cap, MIN_ALIGN);
        let workspace_bytes = c.0;

        let x = c.take("x", t * h, TMA_ALIGN);
        let x_sf = c.take("x_sf", t * (h / g), TMA_ALIGN);
        let topk_idx = c.take("topk_idx", 8 * t * k, TMA_ALIGN);
        let topk_weights = c.take("topk_weights", 4 * t * k, TMA_ALIGN);

        let l1_pool_tokens = c.take("l1_pool_tokens", cap * h, TMA_ALIGN);
        let l1_pool_scales = c.take("l1_pool_scales", cap * (h / g), TMA_ALIGN);
        let l1_pool_topk_weights = c.take("l1_pool_topk_weights", 4 * cap, TMA_ALIGN);
        let l2_pool_tokens = c.take("l2_pool_tokens", cap * i, TMA_ALIGN);
        let l2_pool_scales = c.take("l2_pool_scales", cap * (i / g), TMA_ALIGN);

        let combine = c.take("combine", 2 * k * t * h, TMA_ALIGN);
        let total_bytes = c.0.next_multiple_of(TMA_ALIGN);

        Ok(Self {
            params,
            pool_capacity,
            num_pool_blocks,
            l2_mask_words,
            grid_barrier,
            rank_barrier_signals,
            error_word,
            send_counts,
            recv_counts,
            l1_arrival_counts,
            l2_arrival_masks,
            src_token_topk,
            token_src,
            x,
            x_sf,
            topk_idx,
            topk_weights,
            l1_pool_tokens,
            l1_pool_scales,
            l1_pool_topk_weights,
            l2_pool_tokens,
            l2_pool_scales,
            combine,
            workspace_bytes,
            total_bytes,
        })
    }

    /// Every region, in address order.
    pub fn regions(&self) -> [Region; 19] {
        [
            self.grid_barrier,
            self.rank_barrier_signals,
            self.error_word,
            self.send_counts,
            self.recv_counts,
            self.l1_arrival_counts,
            self.l2_arrival_masks,
            self.src_token_topk,
            self.token_src,
            self.x,
            self.x_sf,
            self.topk_idx,
            self.topk_weights,
            self.l1_pool_tokens,
            self.l1_pool_scales,
            self.l1_pool_topk_weights,
            self.l2_pool_tokens,
            self.l2_pool_scales,
            self.combine,
        ]
    }

    fn check_block_m(&self, block_m: u32) -> Result<(), SymmError> {
        if self.params.block_ms.contains(block_m) {
            Ok(())
        } else {
            Err(SymmError::BlockMNotInLayout {
                block_m,
                available: self.params.block_ms.to_string(),
            })
        }
    }

    /// [`pool_capacity`] of this shape for one of its block sizes.
    pub fn pool_capacity_for(&self, block_m: u32) -> Result<u64, SymmError> {
        self.check_block_m(block_m)?;
        let p = &self.params;
        Ok(pool_capacity(
            p.num_ranks,
            p.max_tokens_per_rank,
            p.num_topk,
            p.num_local_experts(),
            block_m,
        ))
    }

    /// Pool row offsets of the local experts: `offsets[e]` is where expert e's rows start (a
    /// multiple of `block_m`), `offsets[E_l]` the padded rows used. Refuses a routing whose padded
    /// rows exceed the pool, naming the first expert that does not fit.
    pub fn pool_offsets(
        &self,
        tokens_per_local_expert: &[u32],
        block_m: u32,
    ) -> Result<Vec<u64>, SymmError> {
        self.check_block_m(block_m)?;
        let num_local_experts = self.params.num_local_experts();
        if tokens_per_local_expert.len() != num_local_experts as usize {
            return Err(SymmError::CountsLength {
                got: tokens_per_local_expert.len(),
                num_local_experts,
            });
        }
        let mut offsets = Vec::with_capacity(tokens_per_local_expert.len() + 1);
        let mut end = 0u64;
        offsets.push(end);
        for (expert, &tokens) in tokens_per_local_expert.iter().enumerate() {
            end += u64::from(tokens).next_multiple_of(u64::from(block_m));
            if end > self.pool_capacity {
                return Err(SymmError::PoolOverflow {
                    local_expert: expert as u32,
                    tokens,
                    rows_needed: end,
                    capacity: self.pool_capacity,
                    block_m,
                });
            }
            offsets.push(end);
        }
        Ok(offsets)
    }
}

/// A byte count printed in binary units ("4.71 GiB").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.2} {}", UNITS[unit])
        }
    }
}

impl fmt::Display for SymmLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.params;
        writeln!(
            f,
            "symmetric buffer: R={} T_max={} H={} I={} E={} ({}/rank) k={} G={} BLOCK_M∈{} BLOCK_N(L1)={}",
            p.num_ranks,
            p.max_tokens_per_rank,
            p.hidden,
            p.intermediate,
            p.num_experts,
            p.num_local_experts(),
            p.num_topk,
            p.act_scale_group,
            p.block_ms,
            p.l1_block_n,
        )?;
        writeln!(
            f,
            "pool: {} rows, {} blocks tracked, {} mask word(s) per block",
            self.pool_capacity, self.num_pool_blocks, self.l2_mask_words
        )?;
        writeln!(
            f,
            "{:<22} {:>14} {:>12} {:>6}",
            "region", "offset", "size", "align"
        )?;
        for region in self.regions() {
            writeln!(
                f,
                "{:<22} {:>#14x} {:>12} {:>6}",
                region.name,
                region.offset,
                ByteSize(region.bytes).to_string(),
                region.align
            )?;
        }
        writeln!(
            f,
            "{:<22} {:>14} {:>12}",
            "workspace",
            "",
            ByteSize(self.workspace_bytes).to_string()
        )?;
        write!(
            f,
            "{:<22} {:>14} {:>12}",
            "total",
            "",
            ByteSize(self.total_bytes).to_string()
        )
    }
}
