//! What each thread of a rank does, in the GPU pipeline's order: the rank's leader publishes its
//! routes per expert into every rank's counts table; the ranks meet; every thread plans every
//! owner's pools from the table; dispatch threads push their tokens' rows into the owners' L1
//! pools while GEMM workers walk the wave schedule, every block waiting on its own arrival
//! counter or mask; a global barrier; the leader resets the rank's arrival counters for the next
//! call while every thread combines its share of the rank's tokens.

use super::EngineError;
use super::world::{RankThread, Stop};
use fp_formats::{bf16, quant};
use megamoe::config::Config;
use megamoe::problem::{RankInputs, RankWeights};
use megamoe_kernel::Mma;
use megamoe_kernel::pool_order;
use megamoe_kernel::protocol::{PipelineShape, PoolPlan, RowMeta, expert_counts, routes};
use megamoe_problems::reference::{self, Exec};
use moe_sched::{Block, Layer, ScheduleShape, WaveSchedule};
use std::ops::Range;
use std::sync::atomic::Ordering;

/// What every thread of the run shares (read-only).
pub(super) struct Job<'a> {
    pub config: &'a Config,
    /// The protocol's shape: pool rows, T_max, the L1 pool's format.
    pub shape: &'a PipelineShape,
    pub weights: &'a [RankWeights],
    /// Every rank's tokens; a rank's threads read only their own rank's.
    pub inputs: &'a [RankInputs],
    /// Every rank's routes per global expert, as the host counted them when it checked every
    /// owner's plan: what the counts table must hold after the exchange.
    pub counts: &'a [Vec<u32>],
    pub schedule: ScheduleShape,
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
    // After this, every rank's counts row is in every rank's table.
    if me.is_leader() {
        publish_counts(job, me);
        me.cross_rank_sync()?;
    }
    me.grid_sync()?;
    let plans = read_plans(job, me)?;
    match me.thread.checked_sub(job.dispatch_threads) {
        None => dispatch(job, me, &plans, me.thread),
        Some(worker) => gemm(job, me, &plans[me.rank], worker)?,
    }
    // Every combine slot of every rank is written.
    me.global_barrier()?;
    if me.is_leader() {
        reset_arrivals(job, me, &plans[me.rank]);
    }
    combine(job, me, y, first_token);
    Ok(())
}

/// The leader counts the rank's routes per global expert (`uf_count` on the GPU) and writes them
/// as row `rank` of every rank's counts table.
fn publish_counts(job: &Job, me: &RankThread) {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let c = job.config;
    let counts = expert_counts(&job.inputs[r].topk_idx, c.top_k, c.num_experts)
        .expect("the inputs were validated before the run");
    let e = c.num_experts;
    for owner in 0..world.num_ranks() {
        // SAFETY: row `r` of every table is this rank's alone, and nobody reads it before the
        // cross-rank barrier that follows.
        unsafe { world.write::<u32>(r, owner, &layout.peer.counts, r * e..(r + 1) * e) }
            .copy_from_slice(&counts);
    }
}

/// Every owner's plan from this rank's counts table (`uf_plan` on the GPU): every rank computes
/// every plan from the same table, so a plan that overflows is refused by all alike.
fn read_plans(job: &Job, me: &RankThread) -> Result<Vec<PoolPlan>, Stop> {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let (ranks, e) = (world.num_ranks(), job.config.num_experts);
    // SAFETY: every row was written before the cross-rank barrier; nothing writes the table
    // again in this call.
    let table: &[u32] = unsafe { world.read(r, r, &layout.peer.counts, 0..ranks * e) };
    let counts: Vec<Vec<u32>> = table.chunks_exact(e).map(<[u32]>::to_vec).collect();
    debug_assert_eq!(
        counts, job.counts,
        "rank {r}: the exchanged counts differ from the host's"
    );
    (0..ranks)
        .map(|owner| {
            PoolPlan::new(
                &counts,
                owner,
                job.shape.experts_per_rank(),
                job.shape.pool_rows,
            )
        })
        .collect::<Result<_, _>>()
        .map_err(|e| world.fail(e.into()))
}

/// The first row of the L1 block that pool row `row` of `local_expert` lies in: the index of its
/// arrival counter and mask.
fn block_first_row(plan: &PoolPlan, local_expert: usize, row: usize, block_m: usize) -> usize {
    let offset = plan.expert_offset[local_expert] as usize;
    offset + (row - offset) / block_m * block_m
}

/// Dispatch (`uf_dispatch` on the GPU): this thread's share of the rank's tokens, each pair into
/// its row of the owner's L1 pool — the E4M3 row times its scales as BF16 in the GEMM's channel
/// order, the exact route's pool — with its [`RowMeta`]; then the owner's arrival counter of the
/// row's L1 block counts it.
fn dispatch(job: &Job, me: &RankThread, plans: &[PoolPlan], d: usize) {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let c = job.config;
    let (h, k, g, el) = (c.hidden, c.top_k, c.act_group(), c.experts_per_rank());
    let block_m = job.schedule.block_m as usize;
    let x = &job.inputs[r];
    let rows = routes(&x.topk_idx, r, plans, el);
    let row_bytes = h * size_of::<u16>();
    let (mut values, mut canonical, mut pooled) =
        (vec![0f32; h], vec![0u8; row_bytes], vec![0u8; row_bytes]);
    for t in share(x.tokens, job.dispatch_threads, d) {
        quant::dequantize_act_row(
            &x.x[t * h..(t + 1) * h],
            &x.x_sf[t * h / g..(t + 1) * h / g],
            g,
            &mut values,
        );
        for (bytes, &v) in canonical.chunks_exact_mut(2).zip(&values) {
            let widened = bf16::from_f32(v);
            debug_assert_eq!(widened.to_f32(), v, "the widening is exact");
            bytes.copy_from_slice(&widened.to_bits().to_le_bytes());
        }
        pool_order::permute_row(Mma::Bf16, &canonical, &mut pooled);
        for slot in 0..k {
            let pair = t * k + slot;
            let Ok(row) = usize::try_from(rows[pair]) else {
                continue; // masked
            };
            let e = x.topk_idx[pair] as usize;
            let owner = e / el;
            // SAFETY: `routes` gives every pair of every rank its own row of its owner's plan,
            // and the owner reads it only after the arrival counter below says it is there.
            unsafe {
                world
                    .write::<u8>(
                        r,
                        owner,
                        &layout.peer.l1_act,
                        row * row_bytes..(row + 1) * row_bytes,
                    )
                    .copy_from_slice(&pooled);
                world.write::<RowMeta>(r, owner, &layout.peer.meta, row..row + 1)[0] = RowMeta {
                    rank: r as i32,
                    token: t as i32,
                    slot: slot as i32,
                    weight: x.topk_weights[pair],
                };
            }
            let first = block_first_row(&plans[owner], e % el, row, block_m);
            world.u32s(r, owner, &layout.l1_arrivals)[first].fetch_add(1, Ordering::Release);
        }
    }
}

/// The pool rows of (expert, m-block) in `plan`: the first, and how many.
fn block_rows(plan: &PoolPlan, block: &Block, block_m: usize) -> (usize, usize) {
    let e = block.local_expert as usize;
    let m = block.m_block as usize * block_m;
    let first = plan.expert_offset[e] as usize + m;
    (first, (plan.expert_rows[e] as usize - m).min(block_m))
}

/// A GEMM worker: its blocks of the wave schedule over this rank's plan, in order.
fn gemm(job: &Job, me: &RankThread, plan: &PoolPlan, worker: usize) -> Result<(), Stop> {
    let rows: Vec<u32> = plan.expert_rows.iter().map(|&n| n as u32).collect();
    let schedule = WaveSchedule::new(job.schedule, &rows)
        .expect("the schedule shape was checked before the run");
    for block in schedule.worker(worker as u32, job.workers as u32) {
        match block.layer {
            Layer::L1 => l1_block(job, me, plan, &block)?,
            Layer::L2 => l2_block(job, me, plan, &block)?,
        }
    }
    Ok(())
}

/// L1 block (e, m, n): once its rows have arrived, gate and up of h channels
/// `n·C .. (n+1)·C` (C = I / L1 n-blocks), the SwiGLU epilogue, re-quantization into those
/// columns of the L2 pool, then bit n of the block's arrival mask.
fn l1_block(job: &Job, me: &RankThread, plan: &PoolPlan, block: &Block) -> Result<(), Stop> {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let c = job.config;
    let (h, i, g) = (c.hidden, c.intermediate, c.act_group());
    let (row0, rows) = block_rows(plan, block, job.schedule.block_m as usize);
    let arrived = &world.u32s(r, r, &layout.l1_arrivals)[row0];
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
    // SAFETY: the block's pool rows and their metadata are complete (acquired through the
    // arrival counter) and nothing writes them again in this call.
    let (pool, metas) = unsafe {
        (
            world.read::<u16>(r, r, &layout.peer.l1_act, row0 * h..(row0 + rows) * h),
            world.read::<RowMeta>(r, r, &layout.peer.meta, row0..row0 + rows),
        )
    };
    let mut a = vec![0f64; rows * h];
    for (a_row, pool_row) in a.chunks_exact_mut(h).zip(pool.chunks_exact(h)) {
        for (position, &bits) in pool_row.iter().enumerate() {
            a_row[pool_order::canonical_channel(Mma::Bf16, position)] =
                bf16::from_bits(bits).to_f64();
        }
    }
    let channels = i / job.schedule.l1_n_blocks as usize;
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
    for (m, meta) in metas.iter().enumerate() {
        let row = row0 + m;
        // SAFETY: this block alone writes these columns of its rows, and nobody reads them
        // before its mask bit is set below.
        let (q, sf) = unsafe {
            (
                world.write::<u8>(r, r, &layout.l2_act, row * i + c0..row * i + c0 + channels),
                world.write::<u8>(
                    r,
                    r,
                    &layout.l2_sf,
                    (row * i + c0) / g..(row * i + c0 + channels) / g,
                ),
            )
        };
        if let Err(value) = reference::l1_epilogue_row(c, &acc, m, meta.weight, &mut h_row, q, sf) {
            return Err(world.fail(EngineError::NonFiniteL1 {
                rank: r,
                expert: block.local_expert as usize,
                source_rank: meta.rank as usize,
                token: meta.token as usize,
                slot: meta.slot as usize,
                value,
            }));
        }
    }
    let (words, n) = (layout.mask_words, block.n_block as usize);
    world.u64s(r, r, &layout.l2_arrivals)[row0 * words + n / 64]
        .fetch_or(1 << (n % 64), Ordering::Release);
    Ok(())
}

/// L2 block (e, m, n): once every L1 n-block of its rows is stored, output columns
/// `n·BLOCK_N .. (n+1)·BLOCK_N` of each row, BF16, written into the source rank's combine slot.
fn l2_block(job: &Job, me: &RankThread, plan: &PoolPlan, block: &Block) -> Result<(), Stop> {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let c = job.config;
    let (h, i, g) = (c.hidden, c.intermediate, c.act_group());
    let t_max = job.shape.max_tokens;
    let (row0, rows) = block_rows(plan, block, job.schedule.block_m as usize);
    let words = layout.mask_words;
    let masks = &world.u64s(r, r, &layout.l2_arrivals)[row0 * words..(row0 + 1) * words];
    let l1_n_blocks = job.schedule.l1_n_blocks as usize;
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
    // and the dispatch wrote the metadata before that; nothing writes them again in this call.
    let (a, metas) = unsafe {
        let (q, sf) = (
            world.read::<u8>(r, r, &layout.l2_act, row0 * i..(row0 + rows) * i),
            world.read::<u8>(r, r, &layout.l2_sf, row0 * i / g..(row0 + rows) * i / g),
        );
        (
            reference::dequantize_act(q, sf, i, g),
            world.read::<RowMeta>(r, r, &layout.peer.meta, row0..row0 + rows),
        )
    };
    let cols_per_block = h / job.schedule.l2_n_blocks as usize;
    let col0 = block.n_block as usize * cols_per_block;
    let acc = reference::l2_acc(
        c,
        &job.weights[r],
        block.local_expert as usize,
        &a,
        col0..col0 + cols_per_block,
        Exec::Here,
    );
    for (row, meta) in metas.iter().enumerate() {
        let start = (meta.slot as usize * t_max + meta.token as usize) * h + col0;
        // SAFETY: slot (token, j) of the source rank is written only by this pool row's L2
        // blocks, each its own columns, and read only after the final barrier.
        let out = unsafe {
            world.write::<bf16>(
                r,
                meta.rank as usize,
                &layout.peer.combine,
                start..start + cols_per_block,
            )
        };
        for (col, o) in out.iter_mut().enumerate() {
            *o = acc.bf16(row, col);
        }
    }
    Ok(())
}

/// The end of a call: the arrival counters and masks of this rank's blocks back to zero for the
/// next call on the same buffer. Peers bumped the counters before the final barrier, and nothing
/// touches them after it until the next call's dispatch.
fn reset_arrivals(job: &Job, me: &RankThread, plan: &PoolPlan) {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let (block_m, words) = (job.schedule.block_m as usize, layout.mask_words);
    let (counters, masks) = (
        world.u32s(r, r, &layout.l1_arrivals),
        world.u64s(r, r, &layout.l2_arrivals),
    );
    for (&offset, &rows) in plan.expert_offset.iter().zip(&plan.expert_rows) {
        let (offset, rows) = (offset as usize, rows as usize);
        for first in (offset..offset + rows).step_by(block_m) {
            counters[first].store(0, Ordering::Relaxed);
            masks[first * words..(first + 1) * words]
                .iter()
                .for_each(|m| m.store(0, Ordering::Relaxed));
        }
    }
}

/// The combine of this thread's tokens: valid slots in increasing j, f32 sum, BF16.
fn combine(job: &Job, me: &RankThread, y: &mut [bf16], first_token: usize) {
    let (world, layout, r) = (me.world, me.world.layout, me.rank);
    let (h, k) = (job.config.hidden, job.config.top_k);
    let t_max = job.shape.max_tokens;
    let tokens = first_token..first_token + y.len() / h;
    let topk = &job.inputs[r].topk_idx[tokens.start * k..tokens.end * k];
    let mut acc = vec![0f32; h];
    for ((token, y_row), idx) in tokens.zip(y.chunks_exact_mut(h)).zip(topk.chunks_exact(k)) {
        acc.fill(0.0);
        let slots = reference::valid_slots(idx).map(|j| {
            let start = (j * t_max + token) * h;
            // SAFETY: every combine slot was written before the final barrier; nothing
            // writes after it.
            unsafe { world.read::<bf16>(r, r, &layout.peer.combine, start..start + h) }
        });
        reference::combine_token(slots, bf16::to_f32, &mut acc);
        for (o, &a) in y_row.iter_mut().zip(&acc) {
            *o = bf16::from_f32(a);
        }
    }
}
