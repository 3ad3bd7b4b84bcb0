//! Properties of the scheduling model over random inputs: the interleave is a permutation that
//! keeps each rank's order; every block is scheduled exactly once; L1 dependencies of every L2
//! block precede it in the virtual list, and a simulated run by W waiting workers never deadlocks;
//! CTA pairs share (expert, m-block); routing statistics count every valid pair once, by source.

use std::collections::{HashMap, HashSet};

use moe_sched::{
    Block, Layer, RoutingStats, ScheduleShape, WaveSchedule, peel_interleave, peel_interleave_slot,
};
use proptest::prelude::*;

fn schedule_case() -> impl Strategy<Value = (ScheduleShape, Vec<u32>)> {
    (
        prop::collection::vec(prop_oneof![Just(0u32), 0u32..300], 1..10),
        prop::sample::select(vec![8u32, 16, 32, 64, 128]),
        1u32..6,
        1u32..6,
        1u32..12,
    )
        .prop_map(
            |(tokens, block_m, l1_n_blocks, l2_n_blocks, num_experts_per_wave)| {
                let shape = ScheduleShape {
                    block_m,
                    l1_n_blocks,
                    l2_n_blocks,
                    num_experts_per_wave,
                };
                (shape, tokens)
            },
        )
}

/// Virtual index of every block.
fn positions(schedule: &WaveSchedule) -> HashMap<Block, usize> {
    schedule.blocks().enumerate().map(|(i, b)| (b, i)).collect()
}

/// The L1 blocks an L2 block waits for: every n-block of its (expert, m-block).
fn l1_dependencies(schedule: &WaveSchedule, block: &Block) -> Vec<Block> {
    (0..schedule.n_blocks(Layer::L1))
        .map(|n_block| Block {
            layer: Layer::L1,
            n_block,
            ..*block
        })
        .collect()
}

/// Runs W workers, each taking its blocks in order and waiting for an L2 block's L1
/// dependencies; block durations are pseudo-random. Returns the finish time, or None when no
/// worker can move (deadlock).
fn simulate(schedule: &WaveSchedule, num_workers: u32, seed: u64) -> Option<u64> {
    let mut queues: Vec<Vec<Block>> = (0..num_workers)
        .map(|w| schedule.worker(w, num_workers).collect())
        .collect();
    for queue in &mut queues {
        queue.reverse(); // pop() from the front of the worker's order
    }
    let mut finished: HashMap<Block, u64> = HashMap::new();
    let mut running: Vec<Option<(u64, Block)>> = vec![None; num_workers as usize];
    let mut state = seed | 1;
    let mut now = 0u64;
    loop {
        for (queue, slot) in queues.iter_mut().zip(&mut running) {
            if slot.is_some() {
                continue;
            }
            let Some(&next) = queue.last() else { continue };
            let ready = next.layer == Layer::L1
                || l1_dependencies(schedule, &next)
                    .iter()
                    .all(|dep| finished.get(dep).is_some_and(|&t| t <= now));
            if ready {
                queue.pop();
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *slot = Some((now + 1 + state % 9, next));
            }
        }
        let Some(end) = running.iter().flatten().map(|&(t, _)| t).min() else {
            return queues.iter().all(Vec::is_empty).then_some(now);
        };
        now = end;
        for slot in &mut running {
            if let Some((t, block)) = *slot
                && t == now
            {
                assert!(finished.insert(block, t).is_none(), "{block:?} ran twice");
                *slot = None;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn interleave_is_an_order_preserving_permutation(
        counts in prop::collection::vec(prop_oneof![Just(0u32), 0u32..40], 0..72),
    ) {
        let order: Vec<(u32, u32)> = peel_interleave(&counts).collect();
        prop_assert_eq!(order.len() as u64, counts.iter().map(|&c| u64::from(c)).sum::<u64>());
        let mut next_index = vec![0u32; counts.len()];
        for &(rank, index) in &order {
            // Each rank's indices come in increasing order, 0, 1, 2, …: together with the
            // length this makes the order a permutation of all (rank, index) pairs.
            prop_assert_eq!(index, next_index[rank as usize]);
            next_index[rank as usize] += 1;
        }
        prop_assert_eq!(&next_index, &counts);
        for (slot, &expected) in order.iter().enumerate() {
            prop_assert_eq!(peel_interleave_slot(&counts, slot as u32), Some(expected));
        }
        prop_assert_eq!(peel_interleave_slot(&counts, order.len() as u32), None);
    }

    #[test]
    fn interleave_rounds_cover_all_active_ranks(
        counts in prop::collection::vec(1u32..20, 1..16),
    ) {
        // The first min·R slots visit every rank round-robin: no peer waits behind another.
        let order: Vec<(u32, u32)> = peel_interleave(&counts).collect();
        let min = *counts.iter().min().unwrap() as usize;
        let r = counts.len();
        for (slot, &(rank, index)) in order.iter().take(min * r).enumerate() {
            prop_assert_eq!((rank as usize, index as usize), (slot % r, slot / r));
        }
    }

    #[test]
    fn every_block_is_scheduled_once_per_layer(
        (shape, tokens) in schedule_case(),
        num_workers in 1u32..40,
    ) {
        let schedule = WaveSchedule::new(shape, &tokens).unwrap();
        let mut seen: HashSet<Block> = HashSet::new();
        for w in 0..num_workers {
            for block in schedule.worker(w, num_workers) {
                prop_assert!(seen.insert(block), "{:?} scheduled twice", block);
                prop_assert!(schedule.wave_experts(block.wave).contains(&block.local_expert));
                prop_assert!(block.m_block < tokens[block.local_expert as usize].div_ceil(shape.block_m));
                prop_assert!(block.n_block < schedule.n_blocks(block.layer));
            }
        }
        for layer in [Layer::L1, Layer::L2] {
            let expected: u64 = tokens.iter().map(|&t| u64::from(t.div_ceil(shape.block_m))).sum::<u64>()
                * u64::from(schedule.n_blocks(layer));
            let got = seen.iter().filter(|b| b.layer == layer).count() as u64;
            prop_assert_eq!(got, expected);
        }
        prop_assert_eq!(seen.len() as u64, schedule.num_blocks());
    }

    #[test]
    fn dependencies_precede_and_waiting_workers_never_deadlock(
        (shape, tokens) in schedule_case(),
        num_workers in 1u32..40,
        seed in any::<u64>(),
    ) {
        let schedule = WaveSchedule::new(shape, &tokens).unwrap();
        let position = positions(&schedule);
        // Structural proof obligation: each L2 block's L1 dependencies come earlier in the
        // global virtual list (same wave, L1 segment first). With every worker walking the list
        // in increasing order, that rules out a cycle of waits.
        for block in schedule.blocks().filter(|b| b.layer == Layer::L2) {
            for dep in l1_dependencies(&schedule, &block) {
                prop_assert!(position[&dep] < position[&block], "{:?} before {:?}", block, dep);
            }
        }
        // And a run with random block times finishes.
        prop_assert!(simulate(&schedule, num_workers, seed).is_some(), "deadlock");
    }

    #[test]
    fn even_workers_get_n_pairs(
        (shape, tokens) in schedule_case(),
        half_workers in 1u32..20,
    ) {
        let shape = ScheduleShape {
            l1_n_blocks: 2 * shape.l1_n_blocks,
            l2_n_blocks: 2 * shape.l2_n_blocks,
            ..shape
        };
        let schedule = WaveSchedule::new(shape, &tokens).unwrap();
        let num_workers = 2 * half_workers;
        for pair in 0..half_workers {
            let even: Vec<Block> = schedule.worker(2 * pair, num_workers).collect();
            let odd: Vec<Block> = schedule.worker(2 * pair + 1, num_workers).collect();
            prop_assert_eq!(even.len(), odd.len());
            for (a, b) in even.iter().zip(&odd) {
                prop_assert_eq!(*b, Block { n_block: a.n_block + 1, ..*a });
                prop_assert_eq!(a.n_block % 2, 0);
            }
        }
    }

    #[test]
    fn routing_stats_count_every_pair_by_source(
        num_ranks in 1u32..6,
        local_experts in 1u32..8,
        num_topk in 1u32..8,
        tokens_per_rank in 1u32..48,
        skew in 0u32..4,
        seed in any::<u64>(),
    ) {
        let num_experts = num_ranks * local_experts;
        let mut state = seed | 1;
        let mut rand = move |n: u32| {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17;
            (state % u64::from(n)) as u32
        };
        // Each token names up to k distinct experts; `skew` narrows the choice towards the
        // first few experts (all on rank 0) to build hot experts and hot ranks.
        let routing: Vec<Vec<i64>> = (0..num_ranks).map(|_| {
            let mut topk = Vec::new();
            for _ in 0..tokens_per_rank {
                let mut row: Vec<i64> = Vec::new();
                for _ in 0..num_topk {
                    let range = (num_experts >> skew).max(1);
                    let e = i64::from(rand(range));
                    row.push(if row.contains(&e) || rand(8) == 0 { -1 } else { e });
                }
                topk.extend(row);
            }
            topk
        }).collect();
        let routing: Vec<&[i64]> = routing.iter().map(Vec::as_slice).collect();
        let stats = RoutingStats::from_topk(num_experts, num_topk, &routing).unwrap();
        let valid = routing.iter().flat_map(|r| r.iter()).filter(|&&e| e >= 0).count() as u64;
        prop_assert_eq!(stats.tokens_per_expert().iter().sum::<u64>(), valid);

        for owner in 0..num_ranks {
            let tokens = stats.tokens_per_local_expert(owner);
            for local in 0..local_experts {
                let sources = stats.source_counts(owner, local);
                // A token names an expert at most once: at most T pairs from each rank.
                prop_assert!(sources.iter().all(|&c| c <= tokens_per_rank));
                prop_assert_eq!(sources.iter().sum::<u32>(), tokens[local as usize]);
                prop_assert_eq!(peel_interleave(&sources).count() as u32, tokens[local as usize]);
            }
        }
    }
}
