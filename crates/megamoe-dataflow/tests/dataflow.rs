//! The CPU dataflow engine against the reference, bit for bit: 1 to 64 ranks, 0 to 1000 tokens
//! per rank, masked slots, a hot expert, ranks without tokens, both recipes, several thread
//! and block sizes; plans the pools cannot hold and bad L1 outputs are refused with typed
//! errors; random small problems (proptest).

use fp_formats::bf16;
use megamoe::{Config, Problem, Recipe};
use megamoe_dataflow::{self as dataflow, DataflowEngine, DataflowRun, EngineError, EngineOptions};
use megamoe_kernel::protocol::{PipelineShape, ProtocolError};
use megamoe_problems::generate::{self, GenOptions};
use megamoe_problems::reference;
use megamoe_problems::testing::{resplit, tiny_problem};
use moe_sched::RoutingStats;
use proptest::prelude::*;
use rstest::rstest;

fn bits(y: &[bf16]) -> Vec<u16> {
    y.iter().map(|v| v.to_bits()).collect()
}

/// Runs the engine and checks every rank's `y` against the reference, bit for bit.
fn run_and_compare(p: &Problem, options: EngineOptions) -> DataflowRun {
    let want = reference::forward(&p.config, &p.weights, &p.inputs).unwrap();
    let run = dataflow::forward(&p.config, &p.weights, &p.inputs, options).unwrap();
    assert_eq!(run.y.len(), want.len());
    for (rank, (got, want)) in run.y.iter().zip(&want).enumerate() {
        let (got, want) = (bits(got), bits(want));
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert!(
            got.len() == want.len() && first.is_none(),
            "rank {rank}: {} vs {} values, first difference at {first:?}",
            got.len(),
            want.len()
        );
    }
    run
}

/// H = I = 128, two experts per rank (at least four in all), k = 2, clamp 10.
fn small(ranks: usize, tokens: usize, mask_fraction: f64) -> Problem {
    generate::problem(&GenOptions {
        config: Config {
            hidden: 128,
            intermediate: 128,
            num_experts: (2 * ranks).max(4),
            top_k: 2,
            num_ranks: ranks,
            clamp: Some(10.0),
            recipe: Recipe::Mx32,
        },
        tokens,
        seed: 11,
        mask_fraction,
    })
}

#[rstest]
#[case(1, 0)]
#[case(1, 1)]
#[case(1, 7)]
#[case(1, 129)]
#[case(1, 1000)]
#[case(2, 0)]
#[case(2, 1)]
#[case(2, 7)]
#[case(2, 129)]
#[case(2, 1000)]
#[case(4, 0)]
#[case(4, 1)]
#[case(4, 7)]
#[case(4, 129)]
#[case(4, 1000)]
#[case(8, 0)]
#[case(8, 1)]
#[case(8, 7)]
#[case(8, 129)]
#[case(8, 1000)]
#[case(16, 0)]
#[case(16, 1)]
#[case(16, 7)]
#[case(16, 129)]
#[case(16, 1000)]
#[case(64, 0)]
#[case(64, 1)]
#[case(64, 7)]
#[case(64, 129)]
#[case(64, 1000)]
fn ranks_and_token_counts(#[case] ranks: usize, #[case] tokens: usize) {
    run_and_compare(&small(ranks, tokens, 0.1), EngineOptions::default());
}

/// Every expert on one rank, both recipes, clamp on and off, odd thread counts and block
/// sizes; the small blocks give several m-blocks per expert and several waves.
#[rstest]
fn one_rank_holds_every_expert(
    #[values(Recipe::Mx32, Recipe::G128)] recipe: Recipe,
    #[values(None, Some(2.0))] clamp: Option<f32>,
    #[values((1, 1, Some(8)), (3, 2, None), (4, 3, Some(16)))] threads_and_block: (
        usize,
        usize,
        Option<u32>,
    ),
) {
    let (workers, dispatch, block_m) = threads_and_block;
    let p = tiny_problem(1, 40, recipe, clamp, 0.2);
    let run = run_and_compare(
        &p,
        EngineOptions {
            workers_per_rank: workers,
            dispatch_threads_per_rank: dispatch,
            block_m,
            ..EngineOptions::default()
        },
    );
    // mx32 has two L1 n-blocks per expert here, so the wave heuristic cuts the 8 experts into
    // several waves (g128's single n-block makes it take all 8 at once with ≥ 3 workers).
    if recipe == Recipe::Mx32 {
        assert!(
            (run.schedule.num_experts_per_wave as usize) < p.config.experts_per_rank(),
            "one wave only: {:?}",
            run.schedule
        );
    }
}

#[rstest]
fn g128_over_ranks(#[values(2, 8)] ranks: usize) {
    let p = tiny_problem(ranks, 33, Recipe::G128, Some(10.0), 0.25);
    let run = run_and_compare(&p, EngineOptions::default());
    // An L1 block covers 128 channels: a whole g128 group.
    assert_eq!(
        run.schedule.l1_n_blocks as usize,
        p.config.intermediate / 128
    );
}

#[test]
fn masked_slots_and_fully_masked_tokens() {
    let mut p = tiny_problem(4, 24, Recipe::Mx32, Some(10.0), 0.5);
    let k = p.config.top_k;
    p.inputs[2].topk_idx[..3 * k].fill(-1);
    let run = run_and_compare(&p, EngineOptions::default());
    let h = p.config.hidden;
    assert!(run.y[2][..3 * h].iter().all(|v| v.to_bits() == 0));
}

/// Slot 0 of every token goes to one expert: with k = 2 and nothing masked it receives half of
/// all pairs, many m-blocks of one expert on one rank.
#[rstest]
#[case(4, 129, None)]
#[case(8, 300, Some(16))]
fn one_hot_expert_gets_half_the_pairs(
    #[case] ranks: usize,
    #[case] tokens: usize,
    #[case] block_m: Option<u32>,
) {
    let mut p = small(ranks, tokens, 0.0);
    let (k, hot) = (p.config.top_k, 1i64);
    for x in &mut p.inputs {
        for row in x.topk_idx.chunks_exact_mut(k) {
            match row.iter().position(|&e| e == hot) {
                Some(j) => row.swap(0, j),
                None => row[0] = hot,
            }
        }
    }
    let topk: Vec<&[i64]> = p.inputs.iter().map(|x| x.topk_idx.as_slice()).collect();
    let stats = RoutingStats::from_topk(p.config.num_experts as u32, k as u32, &topk).unwrap();
    assert_eq!(
        stats.tokens_per_expert()[hot as usize],
        (ranks * tokens) as u64
    );
    run_and_compare(
        &p,
        EngineOptions {
            block_m,
            ..EngineOptions::default()
        },
    );
}

#[rstest]
#[case(&[0, 50, 0, 30])]
#[case(&[0, 0, 0, 80, 0, 0, 0, 0])]
#[case(&[80, 0])]
fn ranks_without_tokens(#[case] counts: &[usize]) {
    let p = resplit(&tiny_problem(2, 40, Recipe::Mx32, Some(10.0), 0.1), counts);
    run_and_compare(&p, EngineOptions::default());
}

#[test]
fn routings_the_buffer_cannot_hold_are_refused_before_running() {
    let p = tiny_problem(2, 7, Recipe::Mx32, None, 0.0);
    let (w, x) = (&p.weights, &p.inputs);

    // T_max = 4 is too small for 7 tokens per rank.
    let small = DataflowEngine::new(&p.config, 4, EngineOptions::default()).unwrap();
    assert_eq!(
        small.forward(w, x),
        Err(EngineError::TooManyTokens {
            rank: 0,
            tokens: 7,
            max_tokens: 4
        })
    );

    // Pools smaller than the routing's plan: refused with the protocol's capacity error.
    let fits = DataflowEngine::new(&p.config, 7, EngineOptions::default()).unwrap();
    let small_pools = PipelineShape {
        pool_rows: 16,
        ..*fits.shape()
    };
    let err = DataflowEngine::with_shape(&p.config, small_pools, EngineOptions::default())
        .unwrap()
        .forward(w, x)
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Protocol(ProtocolError::Capacity { capacity: 16, .. })
        ),
        "{err}"
    );
    // The plan does not depend on BLOCK_M: the pools that fit serve every block size.
    let options = EngineOptions {
        block_m: Some(32),
        ..EngineOptions::default()
    };
    let run = DataflowEngine::with_shape(&p.config, *fits.shape(), options)
        .unwrap()
        .forward(w, x)
        .unwrap();
    assert_eq!(run.schedule.block_m, 32);

    // A token naming an expert twice takes two pool rows, as on the GPU.
    let mut dup = p.clone();
    dup.inputs[1].topk_idx[..2].copy_from_slice(&[3, 3]);
    let want = reference::forward(&dup.config, &dup.weights, &dup.inputs).unwrap();
    let run = fits.forward(&dup.weights, &dup.inputs).unwrap();
    for (got, want) in run.y.iter().zip(&want) {
        assert_eq!(bits(got), bits(want));
    }

    // A shape of another config is refused when the engine is built.
    let other = Config {
        num_experts: 16,
        ..p.config
    };
    assert_eq!(
        DataflowEngine::with_shape(&other, *fits.shape(), EngineOptions::default()).unwrap_err(),
        EngineError::ShapeMismatch {
            field: "num_experts",
            shape: "8".into(),
            needs: "16".into()
        }
    );
}

/// Inputs and L1 weights at their largest finite values, so that every L1 sum overflows (without
/// a clamp, the run must fail on the non-finite L1 output).
fn overflow_l1(p: &mut Problem) {
    for x in &mut p.inputs {
        x.x.fill(0x7e); // 448
        x.x_sf.fill(127 + 100);
    }
    for w in &mut p.weights {
        w.w1.fill(0x77); // 6, 6
        w.w1_sf.fill(127 + 20);
    }
}

/// One engine, one set of buffers, many calls, as the kernel's symmetric buffer serves call after
/// call: every call copies its inputs in and must find the counters reset and the barrier words
/// settled by the call before — different token counts, ranks without tokens, a hot expert, and
/// a call that fails (its buffers are dropped, the next call gets fresh ones). One rank and four.
#[rstest]
fn one_engine_serves_many_calls(#[values(1, 4)] ranks: usize) {
    // No clamp, so that overflowing L1 sums reach the check that fails a call.
    let plain = |tokens: usize, mask: f64| {
        let mut p = small(ranks, tokens, mask);
        p.config.clamp = None;
        p
    };
    let engine = DataflowEngine::new(&plain(1, 0.0).config, 129, EngineOptions::default()).unwrap();
    let check = |p: &Problem| {
        let want = reference::forward(&p.config, &p.weights, &p.inputs).unwrap();
        let run = engine.forward(&p.weights, &p.inputs).unwrap();
        for (rank, (got, want)) in run.y.iter().zip(&want).enumerate() {
            assert_eq!(bits(got), bits(want), "rank {rank}");
        }
    };
    let full = plain(129, 0.1);
    check(&full);
    check(&plain(7, 0.3));
    check(&full);
    let mut empty_ranks = plain(40, 0.1);
    for x in (0..ranks).step_by(2) {
        empty_ranks.inputs[x] = megamoe::RankInputs {
            tokens: 0,
            x: Vec::new(),
            x_sf: Vec::new(),
            topk_idx: Vec::new(),
            topk_weights: Vec::new(),
        };
    }
    check(&empty_ranks);
    let mut hot = plain(100, 0.0);
    let (hot_expert, other) = (
        hot.config.num_experts as i64 - 3,
        hot.config.num_experts as i64 - 2,
    );
    for x in &mut hot.inputs {
        for t in 0..x.tokens {
            x.topk_idx[t * 2] = hot_expert;
            if x.topk_idx[t * 2 + 1] == hot_expert {
                x.topk_idx[t * 2 + 1] = other;
            }
        }
    }
    check(&hot);
    // Sums that overflow fail the call; the next one still matches the reference.
    let mut bad = plain(9, 0.0);
    overflow_l1(&mut bad);
    let err = engine.forward(&bad.weights, &bad.inputs).unwrap_err();
    assert!(matches!(err, EngineError::NonFiniteL1 { .. }), "{err}");
    check(&full);
    check(&plain(1, 0.0));
}

/// An L1 output without a scale fails the run with an error naming the pair, and the threads
/// waiting for that block stop instead of hanging.
#[test]
fn non_finite_l1_output_fails_the_run() {
    let mut p = tiny_problem(2, 3, Recipe::Mx32, None, 0.0);
    overflow_l1(&mut p);
    p.validate().unwrap(); // every value is finite; only the sums overflow
    let err =
        dataflow::forward(&p.config, &p.weights, &p.inputs, EngineOptions::default()).unwrap_err();
    assert!(matches!(err, EngineError::NonFiniteL1 { .. }), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn random_small_problems_match_the_reference(
        ranks_log2 in 0u32..3,
        local_experts in 1usize..4,
        top_k in 1usize..5,
        tokens in 0usize..24,
        g128 in any::<bool>(),
        clamp in prop::option::of(0.5f32..8.0),
        mask_fraction in 0.0f64..0.5,
        seed in any::<u64>(),
        workers in 1usize..4,
        dispatch in 1usize..3,
        block_m in prop::option::of(prop::sample::select(vec![8u32, 16, 32])),
    ) {
        let ranks = 1usize << ranks_log2;
        let num_experts = ranks * local_experts;
        let config = Config {
            hidden: 256,
            intermediate: 128,
            num_experts,
            top_k: top_k.min(num_experts),
            num_ranks: ranks,
            clamp,
            recipe: if g128 { Recipe::G128 } else { Recipe::Mx32 },
        };
        let p = generate::problem(&GenOptions { config, tokens, seed, mask_fraction });
        run_and_compare(&p, EngineOptions {
            workers_per_rank: workers,
            dispatch_threads_per_rank: dispatch,
            block_m,
            ..EngineOptions::default()
        });
    }
}
