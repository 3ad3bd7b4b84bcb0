//! Block-size and wave-size heuristics: which BLOCK_M a call uses, and how many local experts
//! one wave holds. Both look only at the *expected* load (T·R·k/E tokens per expert under uniform
//! routing), never at the actual routing, so the kernel can be specialized before dispatch runs.
//!
//! BLOCK_M: the smallest candidate ≥ expected + 2·√expected, the largest candidate when none is.
//! Per-expert counts are roughly Poisson around the mean, so mean + 2σ keeps a typical expert in
//! one m-block while small calls do not pay 256-row tiles; large calls get the widest WGMMA N
//! (256), which is also the fastest FP4-decode variant on Hopper (DESIGN §1).
//!
//! Experts per wave (E_w), with m = ⌈⌈expected⌉ / BLOCK_M⌉ and L1 blocks per expert
//! b = m·(2I / BLOCK_N):
//! 1. expected < 1 token per expert: one wave of everything (nothing to pipeline).
//! 2. fill: E_min = ⌈2·SMs / b⌉, so a wave's L1 part is at least two rounds of the persistent
//!    workers: a worker reaching the wave's L2 part finds its L1 dependencies taken a full round
//!    earlier (its wait is bounded by about one block), and experts lighter than expected still
//!    leave ≥ SMs blocks.
//! 3. bound: E_max = the most experts whose L2-pool activations (m·BLOCK_M·I bytes each) fit in
//!    [`L2_CACHE_BUDGET_BYTES`], so L2 reads its input from cache, not HBM, and the first combine
//!    writes start early. When E_min ≥ E_max, filling the SMs wins: E_min.
//! 4. otherwise the size in [E_min, min(E_max, 2·E_min)] whose last wave is fullest
//!    ((E_l mod E_w)/E_w, 1 when it divides), ties to the smaller (earlier L2 start).

/// BLOCK_M values the kernels are built for (tokens per m-block, the WGMMA N of swap-AB tiles).
pub const BLOCK_M_CANDIDATES: [u32; 6] = [16, 32, 64, 128, 192, 256];

/// Width of an n-block in both layers: 2I/128 L1 n-blocks, H/128 L2 n-blocks.
pub const DEFAULT_BLOCK_N: u32 = 128;

/// L1 BLOCK_N (accumulator rows of 2I per block) for activation scale group `g`: an L1 block
/// covers BLOCK_N/2 channels of h, and its epilogue must own whole re-quantization groups, so
/// BLOCK_N ≥ 2G (256 for g128).
pub const fn l1_block_n(block_n: u32, g: u32) -> u32 {
    if 2 * g > block_n { 2 * g } else { block_n }
}

/// SMs of an H100/H200 SXM.
pub const DEFAULT_NUM_SMS: u32 = 132;

/// Half of a Hopper L2 cache (50 MiB): room for one wave's L1 output next to weight traffic.
pub const L2_CACHE_BUDGET_BYTES: u64 = 24 << 20;

/// Mean (token, slot) pairs per expert under uniform routing: T·R·k / E.
pub fn expected_tokens_per_expert(
    tokens_per_rank: u32,
    num_ranks: u32,
    num_topk: u32,
    num_experts: u32,
) -> f64 {
    f64::from(tokens_per_rank) * f64::from(num_ranks) * f64::from(num_topk) / f64::from(num_experts)
}

/// Rows a block should cover so that most experts fit in one: the mean plus two standard
/// deviations of a Poisson-like load, `mean + 2·√mean`.
pub fn covering_rows(expected_tokens_per_expert: f64) -> f64 {
    expected_tokens_per_expert + 2.0 * expected_tokens_per_expert.max(0.0).sqrt()
}

/// BLOCK_M for an expected load, see the module comment.
pub fn choose_block_m(expected_tokens_per_expert: f64) -> u32 {
    let target = covering_rows(expected_tokens_per_expert);
    BLOCK_M_CANDIDATES
        .into_iter()
        .find(|&bm| f64::from(bm) >= target)
        .unwrap_or(BLOCK_M_CANDIDATES[BLOCK_M_CANDIDATES.len() - 1])
}

/// m-blocks of an expert with the expected load (at least one).
pub fn expected_m_blocks(expected_tokens_per_expert: f64, block_m: u32) -> u32 {
    (expected_tokens_per_expert.ceil() as u32)
        .div_ceil(block_m)
        .max(1)
}

/// What the wave-size choice looks at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WaveInputs {
    pub num_local_experts: u32,
    pub expected_tokens_per_expert: f64,
    pub block_m: u32,
    /// 2I / BLOCK_N.
    pub l1_n_blocks: u32,
    /// I, for the L2-pool bytes of a wave.
    pub intermediate: u32,
    pub num_sms: u32,
}

/// Experts per wave, see the module comment. Always in 1..=E_l.
pub fn choose_experts_per_wave(inputs: &WaveInputs) -> u32 {
    let e_l = inputs.num_local_experts.max(1);
    if inputs.expected_tokens_per_expert < 1.0 {
        return e_l;
    }
    let m_blocks = expected_m_blocks(inputs.expected_tokens_per_expert, inputs.block_m);
    let l1_blocks_per_expert = u64::from(m_blocks) * u64::from(inputs.l1_n_blocks.max(1));
    let min = (2 * u64::from(inputs.num_sms))
        .div_ceil(l1_blocks_per_expert)
        .clamp(1, u64::from(e_l));
    let wave_bytes_per_expert =
        u64::from(m_blocks) * u64::from(inputs.block_m) * u64::from(inputs.intermediate);
    let max = (L2_CACHE_BUDGET_BYTES / wave_bytes_per_expert.max(1)).clamp(1, u64::from(e_l));
    if min >= max {
        return min as u32;
    }
    let e_l = u64::from(e_l);
    // Fullness of the last wave as a fraction num/den; compare by cross-multiplication.
    let tail = |size: u64| match e_l % size {
        0 => (1, 1),
        rest => (rest, size),
    };
    let mut best = min;
    for size in min + 1..=max.min(2 * min) {
        let (bn, bd) = tail(best);
        let (n, d) = tail(size);
        if n * bd > bn * d {
            best = size;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l1_blocks_hold_whole_requantization_groups() {
        assert_eq!(l1_block_n(DEFAULT_BLOCK_N, 32), 128);
        assert_eq!(l1_block_n(DEFAULT_BLOCK_N, 128), 256);
        assert_eq!(l1_block_n(512, 128), 512);
    }

    #[test]
    fn block_m_follows_mean_plus_two_sigma() {
        assert_eq!(choose_block_m(0.0), 16);
        assert_eq!(choose_block_m(1.0), 16);
        assert_eq!(choose_block_m(8.0), 16); // 13.7
        assert_eq!(choose_block_m(16.0), 32); // 24
        assert_eq!(choose_block_m(32.0), 64); // 43.3
        assert_eq!(choose_block_m(64.0), 128); // 80
        assert_eq!(choose_block_m(128.0), 192); // 150.6
        assert_eq!(choose_block_m(192.0), 256); // 219.7
        assert_eq!(choose_block_m(1024.0), 256);
    }

    fn v4_pro_ep8(tokens: u32) -> WaveInputs {
        let expected = expected_tokens_per_expert(tokens, 8, 6, 384);
        WaveInputs {
            num_local_experts: 48,
            expected_tokens_per_expert: expected,
            block_m: choose_block_m(expected),
            l1_n_blocks: 2 * 3072 / 128,
            intermediate: 3072,
            num_sms: 132,
        }
    }

    #[test]
    fn v4_pro_waves() {
        // T = 8192: 1024 tokens/expert, BLOCK_M 256, 4·48 = 192 L1 blocks per expert:
        // ⌈264/192⌉ = 2 experts fill two rounds, and 2 divides 48.
        assert_eq!(choose_experts_per_wave(&v4_pro_ep8(8192)), 2);
        // T = 128: 16 tokens/expert, one 32-row block, 48 L1 blocks per expert: ⌈264/48⌉ = 6.
        assert_eq!(choose_experts_per_wave(&v4_pro_ep8(128)), 6);
        // T = 8: one token per expert, still 48 L1 blocks per expert.
        assert_eq!(choose_experts_per_wave(&v4_pro_ep8(8)), 6);
        // T = 1: 1/8 token per expert: everything in one wave.
        assert_eq!(choose_experts_per_wave(&v4_pro_ep8(1)), 48);
    }

    #[test]
    fn wave_size_prefers_a_full_last_wave() {
        // 10 experts, min 3 (⌈2·12/8⌉): sizes 3..=6 leave tails 1/3, 2/4, 0 → 5 divides 10.
        let inputs = WaveInputs {
            num_local_experts: 10,
            expected_tokens_per_expert: 16.0,
            block_m: 32,
            l1_n_blocks: 8,
            intermediate: 128,
            num_sms: 12,
        };
        assert_eq!(choose_experts_per_wave(&inputs), 5);
    }

    #[test]
    fn filling_the_sms_beats_the_cache_bound() {
        // Huge activations: the cache bound allows 1 expert, filling 132 SMs needs more.
        let inputs = WaveInputs {
            num_local_experts: 32,
            expected_tokens_per_expert: 40000.0,
            block_m: 256,
            l1_n_blocks: 1,
            intermediate: 8192,
            num_sms: 132,
        };
        let m_blocks = 40000u64.div_ceil(256);
        assert_eq!(
            u64::from(choose_experts_per_wave(&inputs)),
            (264u64).div_ceil(m_blocks)
        );
    }
}
