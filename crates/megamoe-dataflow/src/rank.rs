//! What each thread of a rank does, in the fused kernel's order: dispatch threads count their
//! tokens' routes, reserve slots and write source indices into the owners' tables; the rank's
//! leader publishes its counts; a global barrier; dispatch threads pull tokens into the L1 pool
//! while GEMM workers walk the wave schedule, every block waiting on its own arrival counter or
//! mask; a global barrier; the leader resets the rank's counters for the next call while every
//! thread combines its share of the rank's tokens.

use super::EngineError;
use super::world::{RankThread, Stop, World};
use fp_formats::bf16;
use megamoe::config::Config;
use megamoe::problem::RankWeights;
use megamoe_problems::reference::{self, Exec};
use moe_sched::{Block, Layer, PoolLayout, ScheduleShape, WaveSchedule, peel_interleave_slot};
use std::ops::Range;
use std::sync::atomic::Ordering;
use symm_mem::{Region, TokenSrc};

/// What every thread of the run shares (read-only).
pub(super) struct Job<'a> {
    pub config: &'a Config,
    pub weights: &'a [RankWeights],
    /// T of every rank.
    pub tokens: &'a [usize],
    /// Pairs per local expert of every owner rank, from the host's routing check: what the
    /// dispatch must reproduce in the buffers.
    pub expected_counts: &'a [Vec<u32>],
    pub shape: ScheduleShape,
    pub dispatch_threads: usize,
    pub workers: usize,
}

/// Part `part` of `parts` near-equal contiguous parts of `0..n`.
pub(super) fn share(n: usize, parts: usize, part: usize) -> Range<usize> {
    n * part / parts..n * (part + 1) / parts
}

/// One thread's whole run; `y` holds its share of the rank's output rows, from `first_token`.
pub(super) fn run(
    job: &Job,
    me: &mut RankThread,
    y: &mut [bf16],
    first_token: usize,
) -> Result<(), Stop> {
    let dispatcher = (me.thread < job.dispatch_threads).then_some(me.thread);
    if let Some(d) = dispatcher {
        send_routes(job, me, d);
    }
    // Every reservation of this rank is in, so its counts are final: publish them, then meet
    // the other ranks. After this, every rank's counts and source indices are in place.
    me.grid_sync()?;
    if me.is_leader() {
        publish_counts(job, me);
        me.cross_rank_sync()?;
    }
    me.grid_sync()?;
    let received = Received::read(job, me)?;
    match dispatcher {
        Some(d) => pull(job, me, &received, d),
        None => gemm(job, me, &received, me.thread - job.dispatch_threads)?,
    }
    // Every combine slot of every rank is written.
    me.global_barrier()?;
    if me.is_leader() {
        reset_counters(me);
    }
    combine(job, me, y, first_token);
    Ok(())
}

/// The end of a call: this rank's send counters, arrival counters and arrival masks back to zero
/// for the next call on the same buffer, as the kernel leaves its workspace. Nothing reads them
/// after the last barrier, and only this rank ever touches them.
fn reset_counters(me: &RankThread) {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    for region in [&layout.send_counts, &layout.l2_arrival_masks] {
        world
            .u64s(r, r, region)
            .iter()
            .for_each(|c| c.store(0, Ordering::Relaxed));
    }
    world
        .u32s(r, r, &layout.l1_arrival_counts)
        .iter()
        .for_each(|c| c.store(0, Ordering::Relaxed));
}

/// Dispatch, first half: count this thread's share of tokens per expert, reserve that many
/// slots on the rank's send counter of each expert, and write `token·k + j` of each valid
/// slot into its owner's `src_token_topk[local expert][this rank][slot]`.
fn send_routes(job: &Job, me: &RankThread, d: usize) {
    let (world, layout) = (me.world, me.world.layout);
    let (r, k, ranks) = (me.rank, job.config.top_k, world.num_ranks());
    let (e_l, t_max) = (
        job.config.experts_per_rank(),
        layout.params.max_tokens_per_rank as usize,
    );
    let tokens = share(job.tokens[r], job.dispatch_threads, d);
    // SAFETY: the inputs are copied in before the run and never written during it.
    let topk: &[i64] =
        unsafe { world.read(r, r, &layout.topk_idx, tokens.start * k..tokens.end * k) };
    let mut next = vec![0u64; job.config.num_experts];
    for &e in topk.iter().filter(|&&e| e >= 0) {
        next[e as usize] += 1;
    }
    let send = world.u64s(r, r, &layout.send_counts);
    for (e, n) in next.iter_mut().enumerate().filter(|(_, n)| **n > 0) {
        *n = send[e].fetch_add(*n, Ordering::Relaxed);
    }
    for (i, &e) in topk.iter().enumerate().filter(|(_, e)| **e >= 0) {
        let e = e as usize;
        let (owner, local) = (e / e_l, e % e_l);
        let entry = (local * ranks + r) * t_max + next[e] as usize;
        next[e] += 1;
        // SAFETY: the reservation above gave this thread the entry alone; the owner reads it
        // only after the global barrier.
        let slot =
            unsafe { world.write::<u32>(r, owner, &layout.src_token_topk, entry..entry + 1) };
        slot[0] = (tokens.start * k + i) as u32;
    }
}

/// The leader tells every owner how many pairs this rank sends to each of its experts.
fn publish_counts(job: &Job, me: &RankThread) {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let e_l = job.config.experts_per_rank();
    let send = world.u64s(r, r, &layout.send_counts);
    for owner in 0..world.num_ranks() {
        let recv = world.u32s(r, owner, &layout.recv_counts);
        for local in 0..e_l {
            let count = send[owner * e_l + local].load(Ordering::Relaxed);
            recv[r * e_l + local].store(count as u32, Ordering::Relaxed);
        }
    }
}

/// What this rank receives, read from its `recv_counts` after the barrier.
struct Received {
    pool: PoolLayout,
    /// Pairs per local expert.
    tokens: Vec<u32>,
    /// `[E_l][R]`: pairs per local expert from each source rank (what the interleave peels).
    sources: Vec<Vec<u32>>,
}

impl Received {
    fn read(job: &Job, me: &RankThread) -> Result<Self, Stop> {
        let (world, layout, r) = (me.world, me.world.layout, me.rank);
        let (ranks, e_l) = (world.num_ranks(), job.config.experts_per_rank());
        let recv = world.u32s(r, r, &layout.recv_counts);
        let sources: Vec<Vec<u32>> = (0..e_l)
            .map(|l| {
                (0..ranks)
                    .map(|src| recv[src * e_l + l].load(Ordering::Relaxed))
                    .collect()
            })
            .collect();
        let tokens: Vec<u32> = sources.iter().map(|s| s.iter().sum()).collect();
        debug_assert_eq!(
            tokens, job.expected_counts[r],
            "rank {r}: the dispatch's counts differ from the routing's"
        );
        let pool = PoolLayout::new(layout, &tokens, job.shape.block_m)
            .map_err(|source| world.fail(EngineError::Capacity { rank: r, source }))?;
        Ok(Received {
            pool,
            tokens,
            sources,
        })
    }
}

/// Dispatch, second half: slots of all local experts, expert-major, strided over the
/// dispatch threads; slot s of an expert takes the source rank and index that the "peel the
/// minimum remaining" interleave gives it, copies that token's row, scales and top-k weight
/// into pool row `offset + s`, records its source and counts it into its block.
fn pull(job: &Job, me: &RankThread, received: &Received, d: usize) {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let c = job.config;
    let (k, h, hg) = (c.top_k, c.hidden, c.hidden / c.act_group());
    let (ranks, t_max) = (
        world.num_ranks(),
        layout.params.max_tokens_per_rank as usize,
    );
    let pool = &received.pool;
    let arrivals = world.u32s(r, r, &layout.l1_arrival_counts);
    let total: u64 = received.tokens.iter().map(|&t| u64::from(t)).sum();
    let (mut expert, mut expert_start) = (0usize, 0u64);
    for g in (d as u64..total).step_by(job.dispatch_threads) {
        while g >= expert_start + u64::from(received.tokens[expert]) {
            expert_start += u64::from(received.tokens[expert]);
            expert += 1;
        }
        let slot = (g - expert_start) as u32;
        let (src, index) = peel_interleave_slot(&received.sources[expert], slot)
            .expect("a slot below the expert's count has a source");
        let (src, entry) = (
            src as usize,
            (expert * ranks + src as usize) * t_max + index as usize,
        );
        let row = pool.row(expert as u32, slot) as usize;
        // SAFETY: the source rank wrote the entry before the global barrier; nothing writes
        // it, nor the source's inputs, afterwards. The pool row belongs to this slot alone and
        // nobody reads it before the arrival counter below says it is there.
        unsafe {
            let flat =
                world.read::<u32>(r, r, &layout.src_token_topk, entry..entry + 1)[0] as usize;
            let token = flat / k;
            world
                .write::<u8>(r, r, &layout.l1_pool_tokens, row * h..(row + 1) * h)
                .copy_from_slice(world.read(r, src, &layout.x, token * h..(token + 1) * h));
            world
                .write::<u8>(r, r, &layout.l1_pool_scales, row * hg..(row + 1) * hg)
                .copy_from_slice(world.read(r, src, &layout.x_sf, token * hg..(token + 1) * hg));
            world
                .write::<f32>(r, r, &layout.l1_pool_topk_weights, row..row + 1)
                .copy_from_slice(world.read(r, src, &layout.topk_weights, flat..flat + 1));
            world.write::<TokenSrc>(r, r, &layout.token_src, row..row + 1)[0] = TokenSrc {
                token: token as u32,
                rank: src as u16,
                topk: (flat % k) as u16,
            };
        }
        let block = pool.pool_block(expert as u32, slot / pool.block_m());
        arrivals[block as usize].fetch_add(1, Ordering::Release);
    }
}

/// The pool rows of (expert, m-block): first row, valid rows, index in the arrival arrays.
fn block_rows(pool: &PoolLayout, block: &Block) -> (usize, usize, usize) {
    let (e, m) = (block.local_expert, block.m_block);
    let first = pool.offset(e) + u64::from(m) * u64::from(pool.block_m());
    (
        first as usize,
        pool.rows_in_block(e, m) as usize,
        pool.pool_block(e, m) as usize,
    )
}

/// A GEMM worker: its blocks of the wave schedule, in order.
fn gemm(job: &Job, me: &RankThread, received: &Received, worker: usize) -> Result<(), Stop> {
    let schedule = WaveSchedule::new(job.shape, &received.tokens)
        .expect("the schedule shape was checked before the run");
    for block in schedule.worker(worker as u32, job.workers as u32) {
        match block.layer {
            Layer::L1 => l1_block(job, me, &received.pool, &block)?,
            Layer::L2 => l2_block(job, me, &received.pool, &block)?,
        }
    }
    Ok(())
}

/// L1 block (e, m, n): once its rows have arrived, gate and up of h channels
/// `n·C .. (n+1)·C` (C = I / L1 n-blocks), the SwiGLU epilogue, re-quantization into those
/// columns of the L2 pool, then bit n of the block's arrival mask.
fn l1_block(job: &Job, me: &RankThread, pool: &PoolLayout, block: &Block) -> Result<(), Stop> {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let c = job.config;
    let (h, i, g) = (c.hidden, c.intermediate, c.act_group());
    let (row0, rows, pb) = block_rows(pool, block);
    let arrived = &world.u32s(r, r, &layout.l1_arrival_counts)[pb];
    me.wait(
        || arrived.load(Ordering::Acquire) as usize == rows,
        || {
            format!(
                "L1 rows of local expert {}, m-block {} ({} of {rows} arrived)",
                block.local_expert,
                block.m_block,
                arrived.load(Ordering::Relaxed)
            )
        },
    )?;
    // SAFETY: the block's pool rows are complete (acquired through the arrival counter) and
    // nothing writes them again.
    let (a, weights) = unsafe {
        (
            pool_acts(
                world,
                r,
                (&layout.l1_pool_tokens, &layout.l1_pool_scales),
                row0..row0 + rows,
                h,
                g,
            ),
            world.read::<f32>(r, r, &layout.l1_pool_topk_weights, row0..row0 + rows),
        )
    };
    let channels = i / job.shape.l1_n_blocks as usize;
    let c0 = block.n_block as usize * channels;
    let acc = reference::l1_acc(
        c,
        &job.weights[r],
        block.local_expert as usize,
        &a,
        c0..c0 + channels,
        Exec::Here,
    );
    let mut h_row = vec![0f32; channels];
    for (row, &weight) in (row0..).zip(weights) {
        // SAFETY: this block alone writes these columns of its rows, and nobody reads them
        // before its mask bit is set below.
        let (q, sf) = unsafe {
            (
                world.write::<u8>(
                    r,
                    r,
                    &layout.l2_pool_tokens,
                    row * i + c0..row * i + c0 + channels,
                ),
                world.write::<u8>(
                    r,
                    r,
                    &layout.l2_pool_scales,
                    (row * i + c0) / g..(row * i + c0 + channels) / g,
                ),
            )
        };
        if let Err(value) =
            reference::l1_epilogue_row(c, &acc, row - row0, weight, &mut h_row, q, sf)
        {
            // SAFETY: written by the dispatch before the rows arrived; never written again.
            let src = unsafe { world.read::<TokenSrc>(r, r, &layout.token_src, row..row + 1)[0] };
            return Err(world.fail(EngineError::NonFiniteL1 {
                rank: r,
                expert: block.local_expert as usize,
                source_rank: src.rank.into(),
                token: src.token as usize,
                slot: src.topk.into(),
                value,
            }));
        }
    }
    let words = layout.l2_mask_words as usize;
    let n = block.n_block as usize;
    world.u64s(r, r, &layout.l2_arrival_masks)[pb * words + n / 64]
        .fetch_or(1 << (n % 64), Ordering::Release);
    Ok(())
}

/// L2 block (e, m, n): once every L1 n-block of its rows is stored, output columns
/// `n·BLOCK_N .. (n+1)·BLOCK_N` of each row, BF16, written into the source rank's combine slot.
fn l2_block(job: &Job, me: &RankThread, pool: &PoolLayout, block: &Block) -> Result<(), Stop> {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let c = job.config;
    let (h, i, g) = (c.hidden, c.intermediate, c.act_group());
    let t_max = layout.params.max_tokens_per_rank as usize;
    let (row0, rows, pb) = block_rows(pool, block);
    let words = layout.l2_mask_words as usize;
    let masks = &world.u64s(r, r, &layout.l2_arrival_masks)[pb * words..(pb + 1) * words];
    let l1_n_blocks = job.shape.l1_n_blocks as usize;
    let full = |w: usize| match l1_n_blocks - 64 * w {
        bits @ 0..64 => (1u64 << bits) - 1,
        _ => u64::MAX,
    };
    me.wait(
        || {
            masks
                .iter()
                .enumerate()
                .all(|(w, m)| m.load(Ordering::Acquire) == full(w))
        },
        || {
            let seen: Vec<String> = masks
                .iter()
                .map(|m| format!("{:#x}", m.load(Ordering::Relaxed)))
                .collect();
            format!(
                "L1 outputs of local expert {}, m-block {} (mask {seen:?} of {l1_n_blocks} n-blocks)",
                block.local_expert, block.m_block
            )
        },
    )?;
    // SAFETY: every L1 block of these rows has stored its columns (acquired through the mask)
    // and the dispatch wrote the sources before that; nothing writes them again.
    let (a, sources) = unsafe {
        (
            pool_acts(
                world,
                r,
                (&layout.l2_pool_tokens, &layout.l2_pool_scales),
                row0..row0 + rows,
                i,
                g,
            ),
            world.read::<TokenSrc>(r, r, &layout.token_src, row0..row0 + rows),
        )
    };
    let cols_per_block = h / job.shape.l2_n_blocks as usize;
    let col0 = block.n_block as usize * cols_per_block;
    let acc = reference::l2_acc(
        c,
        &job.weights[r],
        block.local_expert as usize,
        &a,
        col0..col0 + cols_per_block,
        Exec::Here,
    );
    for (row, src) in sources.iter().enumerate() {
        let start = (usize::from(src.topk) * t_max + src.token as usize) * h + col0;
        // SAFETY: slot (token, j) of the source rank is written only by this pool row's L2
        // blocks, each its own columns, and read only after the final barrier.
        let out = unsafe {
            world.write::<bf16>(
                r,
                src.rank.into(),
                &layout.combine,
                start..start + cols_per_block,
            )
        };
        for (col, o) in out.iter_mut().enumerate() {
            *o = acc.bf16(row, col);
        }
    }
    Ok(())
}

/// Pool rows `rows` of rank `r` (FP8 codes `width` wide and their scales per `g`), dequantized.
///
/// # Safety
/// The rows must be complete and no longer written, as for [`World::read`].
unsafe fn pool_acts(
    world: &World,
    r: usize,
    (tokens, scales): (&Region, &Region),
    rows: Range<usize>,
    width: usize,
    g: usize,
) -> Vec<f64> {
    // SAFETY: forwarded from the caller.
    let (q, sf) = unsafe {
        (
            world.read::<u8>(r, r, tokens, rows.start * width..rows.end * width),
            world.read::<u8>(r, r, scales, rows.start * width / g..rows.end * width / g),
        )
    };
    reference::dequantize_act(q, sf, width, g)
}

/// The combine of this thread's tokens: valid slots in increasing j, f32 sum, BF16.
fn combine(job: &Job, me: &RankThread, y: &mut [bf16], first_token: usize) {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let (h, k) = (job.config.hidden, job.config.top_k);
    let t_max = layout.params.max_tokens_per_rank as usize;
    let tokens = first_token..first_token + y.len() / h;
    // SAFETY: the inputs are never written during the run.
    let topk: &[i64] =
        unsafe { world.read(r, r, &layout.topk_idx, tokens.start * k..tokens.end * k) };
    let mut acc = vec![0f32; h];
    for ((token, y_row), idx) in tokens.zip(y.chunks_exact_mut(h)).zip(topk.chunks_exact(k)) {
        acc.fill(0.0);
        let slots = (0..k).filter(|&j| idx[j] >= 0).map(|j| {
            let start = (j * t_max + token) * h;
            // SAFETY: every combine slot was written before the final barrier; nothing
            // writes after it.
            unsafe { world.read::<bf16>(r, r, &layout.combine, start..start + h) }
        });
        reference::combine_token(slots, bf16::to_f32, &mut acc);
        for (o, &a) in y_row.iter_mut().zip(&acc) {
            *o = bf16::from_f32(a);
        }
    }
}
