//! Layout properties over random shapes (regions disjoint, aligned, inside the total), pool
//! capacity against random and adversarial routings (including routings built to reach the
//! bound exactly), parameter refusals, and the DeepSeek preset sizes.

use proptest::prelude::*;
use symm_mem::{BlockMs, ByteSize, SymmError, SymmLayout, SymmParams, pool_capacity};

const CANDIDATES: [u32; 6] = [16, 32, 64, 128, 192, 256];

fn params(r: u32, t: u32, h: u32, i: u32, e: u32, k: u32) -> SymmParams {
    SymmParams {
        num_ranks: r,
        max_tokens_per_rank: t,
        hidden: h,
        intermediate: i,
        num_experts: e,
        num_topk: k,
        act_scale_group: 32,
        block_ms: BlockMs::new(&CANDIDATES).unwrap(),
        l1_block_n: 128,
    }
}

fn shape() -> impl Strategy<Value = SymmParams> {
    (
        1u32..=72,
        1u32..=9000,
        1u32..=64,
        1u32..=32,
        1u32..=64,
        1u32..=32,
        prop::bool::ANY,
        prop::collection::vec(1u32..=64, 1..5),
        prop::sample::select(vec![64u32, 128, 256]),
    )
        .prop_map(|(r, t, h128, i128, e_l, k, g128, bm8, bn)| SymmParams {
            num_ranks: r,
            max_tokens_per_rank: t,
            hidden: 128 * h128,
            intermediate: 128 * i128,
            num_experts: r * e_l,
            num_topk: k,
            act_scale_group: if g128 { 128 } else { 32 },
            block_ms: BlockMs::new(&bm8.iter().map(|b| 8 * b).collect::<Vec<_>>()).unwrap(),
            l1_block_n: bn,
        })
}

/// Tokens per local expert on every owner rank of a routing (`routing[rank][token]` = the
/// token's valid experts).
fn local_counts(p: &SymmParams, routing: &[Vec<Vec<u32>>]) -> Vec<Vec<u32>> {
    let e_l = p.num_local_experts();
    let mut counts = vec![vec![0u32; e_l as usize]; p.num_ranks as usize];
    for tokens in routing {
        for experts in tokens {
            let mut seen = experts.clone();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), experts.len(), "a token names an expert twice");
            assert!(experts.len() <= p.num_topk as usize);
            for &e in experts {
                counts[(e / e_l) as usize][(e % e_l) as usize] += 1;
            }
        }
    }
    counts
}

fn assert_fits(layout: &SymmLayout, routing: &[Vec<Vec<u32>>]) {
    for counts in local_counts(&layout.params, routing) {
        for bm in layout.params.block_ms.iter() {
            let offsets = layout.pool_offsets(&counts, bm).unwrap();
            assert!(offsets.iter().all(|o| o % u64::from(bm) == 0));
            assert!(offsets[offsets.len() - 1] <= layout.pool_capacity_for(bm).unwrap());
        }
    }
}

/// A routing whose rank-0 pool usage with `block_m` is exactly [`pool_capacity`]: min(E_l, N)
/// experts get one token, then further blocks of BLOCK_M tokens go to experts up to R·T each.
/// Item i of the expert-sorted list goes to global token i mod R·T, so no token repeats an expert.
fn worst_case_routing(p: &SymmParams, block_m: u32) -> Vec<Vec<Vec<u32>>> {
    let e_l = p.num_local_experts() as u64;
    let rt = u64::from(p.num_ranks) * u64::from(p.max_tokens_per_rank);
    let pairs = rt * u64::from(p.num_topk).min(e_l);
    let bm = u64::from(block_m);
    let non_empty = e_l.min(pairs);
    let mut counts = vec![1u64; non_empty as usize];
    let mut budget = pairs - non_empty;
    for count in &mut counts {
        while budget >= bm && *count + bm <= rt {
            *count += bm;
            budget -= bm;
        }
    }
    let mut routing = vec![vec![Vec::new(); p.max_tokens_per_rank as usize]; p.num_ranks as usize];
    let mut item = 0u64;
    for (expert, &count) in counts.iter().enumerate() {
        for _ in 0..count {
            let token = item % rt;
            let (rank, t) = (
                token / u64::from(p.max_tokens_per_rank),
                token % u64::from(p.max_tokens_per_rank),
            );
            routing[rank as usize][t as usize].push(expert as u32);
            item += 1;
        }
    }
    routing
}

/// Shapes small enough to route token by token: up to 72 ranks, R·T ≤ 72·24 tokens.
fn small_shape() -> impl Strategy<Value = SymmParams> {
    (
        prop_oneof![1u32..=8, 9u32..=72],
        1u32..=24,
        1u32..=12,
        1u32..=10,
        prop::collection::vec(1u32..=32, 1..4),
    )
        .prop_map(|(r, t, e_l, k, bm8)| SymmParams {
            block_ms: BlockMs::new(&bm8.iter().map(|b| 8 * b).collect::<Vec<_>>()).unwrap(),
            ..params(r, t, 128, 128, r * e_l, k)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn regions_are_disjoint_aligned_and_inside(p in shape()) {
        let layout = SymmLayout::new(p).unwrap();
        let regions = layout.regions();
        let mut end = 0;
        for region in regions {
            prop_assert!(region.align >= 16 && region.align.is_power_of_two());
            prop_assert_eq!(region.offset % region.align, 0, "{} misaligned", region.name);
            prop_assert!(region.offset >= end, "{} overlaps its predecessor", region.name);
            end = region.end();
        }
        prop_assert!(end <= layout.total_bytes);
        prop_assert_eq!(layout.total_bytes % 128, 0);
        prop_assert_eq!(layout.workspace_bytes, layout.token_src.end());
        for tma in [layout.x, layout.x_sf, layout.l1_pool_tokens, layout.l1_pool_scales,
                    layout.l2_pool_tokens, layout.l2_pool_scales, layout.combine] {
            prop_assert!(tma.align >= 128, "{} is read by TMA", tma.name);
        }
        // Sizes follow the shapes.
        let (t, h, i, k) = (u64::from(p.max_tokens_per_rank), u64::from(p.hidden),
                            u64::from(p.intermediate), u64::from(p.num_topk));
        let cap = layout.pool_capacity;
        prop_assert_eq!(layout.x.bytes, t * h);
        prop_assert_eq!(layout.x_sf.bytes, t * h / u64::from(p.act_scale_group));
        prop_assert_eq!(layout.topk_idx.bytes, 8 * t * k);
        prop_assert_eq!(layout.combine.bytes, 2 * k * t * h);
        prop_assert_eq!(layout.l1_pool_tokens.bytes, cap * h);
        prop_assert_eq!(layout.l2_pool_tokens.bytes, cap * i);
        prop_assert_eq!(layout.token_src.bytes, 8 * cap);
        prop_assert_eq!(layout.src_token_topk.bytes,
            4 * u64::from(p.num_experts) * t);
        // The pool and the arrival arrays serve every BLOCK_M of the set.
        for bm in p.block_ms.iter() {
            let cap_bm = layout.pool_capacity_for(bm).unwrap();
            prop_assert!(cap_bm <= cap);
            prop_assert_eq!(cap_bm % u64::from(bm), 0);
            prop_assert!(cap.div_ceil(u64::from(bm)) <= layout.num_pool_blocks);
        }
        prop_assert!(layout.l2_mask_words * 64 >= u64::from(p.l1_n_blocks()));
    }

    #[test]
    fn capacity_never_below_the_classic_bound_minus_one_block(p in shape()) {
        // align(N + E_l·(BM−1), BM) is the textbook bound; ours is exact, at most one block less.
        let e_l = u64::from(p.num_local_experts());
        let n = u64::from(p.num_ranks) * u64::from(p.max_tokens_per_rank)
            * u64::from(p.num_topk).min(e_l);
        for bm in p.block_ms.iter() {
            let bm64 = u64::from(bm);
            let classic = (n + e_l * (bm64 - 1)).next_multiple_of(bm64);
            let ours = pool_capacity(p.num_ranks, p.max_tokens_per_rank, p.num_topk,
                                     p.num_local_experts(), bm);
            prop_assert!(ours <= classic);
            prop_assert!(ours >= n, "every pair needs a row");
        }
    }

    #[test]
    fn random_routings_fit(
        p in small_shape(),
        seed in any::<u64>(),
        density in 0u32..=100,
    ) {
        let layout = SymmLayout::new(p).unwrap();
        let mut state = seed | 1;
        let mut rand = move |n: u32| {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17;
            (state % u64::from(n)) as u32
        };
        let e = p.num_experts;
        let routing: Vec<Vec<Vec<u32>>> = (0..p.num_ranks).map(|_| {
            (0..p.max_tokens_per_rank).map(|_| {
                let mut experts = Vec::new();
                for _ in 0..p.num_topk {
                    let candidate = rand(e);
                    if rand(100) < density && !experts.contains(&candidate) {
                        experts.push(candidate);
                    }
                }
                experts
            }).collect()
        }).collect();
        assert_fits(&layout, &routing);
    }

    #[test]
    fn adversarial_routings_fit(p in small_shape(), spread in any::<u32>()) {
        let layout = SymmLayout::new(p).unwrap();
        let e_l = p.num_local_experts();
        let k_here = p.num_topk.min(e_l);
        let tokens = |pick: &dyn Fn(u32, u32) -> Vec<u32>| -> Vec<Vec<Vec<u32>>> {
            (0..p.num_ranks).map(|r| (0..p.max_tokens_per_rank).map(|t| pick(r, t)).collect()).collect()
        };
        // Every token of every rank names expert 0, the rest of its slots on other experts.
        let one_expert = tokens(&|r, t| {
            let mut experts = vec![0];
            experts.extend((1..p.num_experts).map(|e| (e + r + t) % p.num_experts)
                .filter(|&e| e != 0).take(p.num_topk as usize - 1));
            experts
        });
        assert_fits(&layout, &one_expert);
        // Every token puts all of its slots on rank 0, rotated so the counts differ.
        let one_rank = tokens(&|r, t| {
            (0..k_here).map(|j| (j + r + t + spread % e_l) % e_l).collect()
        });
        assert_fits(&layout, &one_rank);
    }

    #[test]
    fn the_bound_is_reached(p in small_shape()) {
        let layout = SymmLayout::new(p).unwrap();
        for bm in p.block_ms.iter() {
            let routing = worst_case_routing(&p, bm);
            let counts = &local_counts(&p, &routing)[0];
            let offsets = layout.pool_offsets(counts, bm).unwrap();
            prop_assert_eq!(offsets[offsets.len() - 1], layout.pool_capacity_for(bm).unwrap());
        }
    }
}

#[test]
fn overflow_is_refused_naming_the_expert() {
    let p = SymmParams {
        block_ms: BlockMs::single(32).unwrap(),
        ..params(2, 10, 128, 128, 8, 2)
    };
    let layout = SymmLayout::new(p).unwrap();
    // N = 2·10·2 = 40 pairs over 4 local experts, but one expert gets at most R·T = 20 < 32:
    // one block each, 128 rows.
    assert_eq!(layout.pool_capacity, 128);
    assert_eq!(
        layout.pool_offsets(&[20, 20, 0, 0], 32).unwrap(),
        [0, 32, 64, 64, 64]
    );
    // Not a valid routing (an expert above R·T): refused at the first expert past the end.
    let err = layout.pool_offsets(&[64, 40, 1, 1], 32).unwrap_err();
    assert_eq!(
        err,
        SymmError::PoolOverflow {
            local_expert: 2,
            tokens: 1,
            rows_needed: 160,
            capacity: 128,
            block_m: 32
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("local expert 2") && message.contains("160") && message.contains("128")
    );
    assert!(matches!(
        layout.pool_offsets(&[1, 2, 3], 32),
        Err(SymmError::CountsLength { got: 3, .. })
    ));
    assert!(matches!(
        layout.pool_offsets(&[1, 2, 3, 4], 64),
        Err(SymmError::BlockMNotInLayout { block_m: 64, .. })
    ));
}

#[test]
fn bad_parameters_are_named() {
    let good = params(8, 8192, 7168, 3072, 384, 6);
    let refuse = |p: SymmParams| SymmLayout::new(p).unwrap_err();
    assert_eq!(
        refuse(SymmParams {
            num_experts: 385,
            ..good
        }),
        SymmError::ExpertsNotDivisible {
            num_experts: 385,
            num_ranks: 8
        }
    );
    assert_eq!(
        refuse(SymmParams {
            num_ranks: 73,
            num_experts: 73,
            ..good
        }),
        SymmError::BadRankCount(73)
    );
    assert_eq!(
        refuse(SymmParams {
            num_ranks: 0,
            ..good
        }),
        SymmError::BadRankCount(0)
    );
    assert_eq!(
        refuse(SymmParams {
            hidden: 7000,
            ..good
        }),
        SymmError::NotMultipleOf128 {
            name: "hidden",
            value: 7000
        }
    );
    assert_eq!(
        refuse(SymmParams {
            intermediate: 64,
            ..good
        }),
        SymmError::NotMultipleOf128 {
            name: "intermediate",
            value: 64
        }
    );
    assert_eq!(
        refuse(SymmParams {
            num_topk: 33,
            ..good
        }),
        SymmError::BadTopk(33)
    );
    assert_eq!(
        refuse(SymmParams {
            act_scale_group: 64,
            ..good
        }),
        SymmError::BadScaleGroup(64)
    );
    assert_eq!(
        refuse(SymmParams {
            max_tokens_per_rank: 0,
            ..good
        }),
        SymmError::BadTokenCount(0)
    );
    assert_eq!(
        refuse(SymmParams {
            l1_block_n: 80,
            ..good
        }),
        SymmError::BadBlockN {
            block_n: 80,
            two_i: 6144
        }
    );
    assert_eq!(BlockMs::new(&[12]), Err(SymmError::BadBlockM(12)));
    assert_eq!(BlockMs::new(&[]), Err(SymmError::NoBlockM));
    assert!(
        refuse(SymmParams {
            num_experts: 385,
            ..good
        })
        .to_string()
        .contains("385")
    );
}

#[test]
fn block_m_sets() {
    let set = BlockMs::new(&[256, 16, 192, 16]).unwrap();
    assert_eq!(set.iter().collect::<Vec<_>>(), [16, 192, 256]);
    assert_eq!((set.min(), set.max()), (16, 256));
    assert!(set.contains(192) && !set.contains(128) && !set.contains(0) && !set.contains(1000));
    assert_eq!(set.to_string(), "{16,192,256}");
}

/// The DeepSeek MoE shapes at EP8, T_max = 8192, mx32 scales, all BLOCK_M candidates.
fn preset(h: u32, i: u32, e: u32, k: u32) -> SymmLayout {
    SymmLayout::new(params(8, 8192, h, i, e, k)).unwrap()
}

#[test]
fn deepseek_preset_sizes() {
    const GIB: f64 = (1u64 << 30) as f64;
    let v4_pro = preset(7168, 3072, 384, 6);
    let v4_flash = preset(4096, 2048, 256, 6);
    let v3 = preset(7168, 2048, 256, 8);
    // Pool rows: N = 8·8192·k pairs, plus a padding block per local expert, BLOCK_M = 256
    // the largest: 256·(E_l + ⌊(N − E_l)/256⌋).
    assert_eq!(v4_pro.pool_capacity, 256 * (48 + (393_216 - 48) / 256)); // 405 248
    assert_eq!(v4_flash.pool_capacity, 256 * (32 + (393_216 - 32) / 256)); // 401 152
    assert_eq!(v3.pool_capacity, 256 * (32 + (524_288 - 32) / 256)); // 532 224
    for (name, layout, low, high) in [
        ("V4-Pro", &v4_pro, 4.0, 6.0),
        ("V4-Flash", &v4_flash, 2.0, 3.5),
        ("V3", &v3, 5.0, 7.0),
    ] {
        let gib = layout.total_bytes as f64 / GIB;
        println!(
            "{name}: {} per rank\n{layout}\n",
            ByteSize(layout.total_bytes)
        );
        assert!((low..high).contains(&gib), "{name}: {gib:.2} GiB");
        // The L1 token pool dominates: cap·H bytes.
        assert_eq!(
            layout.l1_pool_tokens.bytes,
            layout.pool_capacity * u64::from(layout.params.hidden)
        );
    }
}
