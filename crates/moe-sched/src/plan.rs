//! The per-rank plan of a MegaMoE config: block sizes, waves, and the expected HBM bytes, NVLink
//! bytes and FLOPs of one forward under uniform random routing (each token picks k distinct
//! experts uniformly). The `megamoe plan` CLI prints it, next to the symmetric buffer's size from
//! the buffer protocol.
//!
//! Model, per rank, with P = T·k the expected (token, slot) pairs it receives (= the pairs it
//! sends) and E_hit = E_l·(1 − (1 − k/E)^(R·T)) the local experts that receive any:
//! - weights: E_hit experts' FP4 W1 and W2 plus their UE8M0 scales, 3·H·I·(1/2 + 1/32) bytes each;
//! - dispatch: peers read P rows of x + x_sf here; P pool rows (tokens, scales, and the row's
//!   metadata: source record and top-k weight) are written;
//! - L1: P pool rows read once (n-blocks re-read them from L2 cache), P L2-pool rows written;
//! - L2: P L2-pool rows read; P BF16 rows land in this rank's combine buffer (from peers);
//! - combine: P BF16 rows read, T BF16 rows of y written.
//!
//! Padding rows are not counted. NVLink counts the (R−1)/R share that crosses ranks: pulled rows
//! (tokens, scales, top-k weight) come in, BF16 results go out. FLOPs = 2·P·H·3I.

use std::fmt;

use crate::SchedError;
use crate::heuristics::{
    DEFAULT_BLOCK_N, DEFAULT_NUM_SMS, WaveInputs, choose_block_m, choose_experts_per_wave,
    expected_m_blocks, expected_tokens_per_expert,
};
use crate::wave::ScheduleShape;

/// Bytes of a pool row's metadata: its source rank, token and slot and its top-k weight (the
/// buffer protocol's `RowMeta`).
const ROW_META_BYTES: f64 = 16.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    pub hidden: u32,
    pub intermediate: u32,
    pub num_experts: u32,
    pub num_topk: u32,
    pub num_ranks: u32,
    /// T.
    pub tokens_per_rank: u32,
    pub num_sms: u32,
    /// G, 32 or 128.
    pub act_scale_group: u32,
    /// L2 BLOCK_N, and L1's unless 2G is larger (`heuristics::l1_block_n`).
    pub block_n: u32,
}

impl PlanConfig {
    /// A config with 132 SMs, G = 32 and BLOCK_N = 128.
    pub fn new(
        hidden: u32,
        intermediate: u32,
        num_experts: u32,
        num_topk: u32,
        num_ranks: u32,
        tokens_per_rank: u32,
    ) -> Self {
        Self {
            hidden,
            intermediate,
            num_experts,
            num_topk,
            num_ranks,
            tokens_per_rank,
            num_sms: DEFAULT_NUM_SMS,
            act_scale_group: 32,
            block_n: DEFAULT_BLOCK_N,
        }
    }

    /// L1 BLOCK_N: whole re-quantization groups per L1 block.
    pub fn l1_block_n(&self) -> u32 {
        crate::heuristics::l1_block_n(self.block_n, self.act_scale_group)
    }
}

/// Expected HBM bytes per rank, by phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HbmBytes {
    pub weights: f64,
    pub dispatch: f64,
    pub linear1: f64,
    pub linear2: f64,
    pub combine: f64,
}

impl HbmBytes {
    pub fn total(&self) -> f64 {
        self.weights + self.dispatch + self.linear1 + self.linear2 + self.combine
    }
}

/// Expected NVLink bytes per rank, each direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NvlinkBytes {
    /// Tokens, scales and top-k weights pulled from peers.
    pub pull: f64,
    /// BF16 expert outputs written into peers' combine buffers.
    pub write_back: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub config: PlanConfig,
    /// T·R·k / E.
    pub expected_tokens_per_expert: f64,
    /// P = T·k pairs received per rank.
    pub expected_pairs: f64,
    /// Local experts receiving at least one token.
    pub expected_experts_hit: f64,
    pub schedule: ScheduleShape,
    /// m-blocks of an expert that is hit.
    pub m_blocks_per_expert: u32,
    pub num_waves: u32,
    pub l1_blocks_per_wave: f64,
    pub l2_blocks_per_wave: f64,
    pub hbm: HbmBytes,
    pub nvlink: NvlinkBytes,
    pub flops: f64,
}

impl Plan {
    pub fn new(config: PlanConfig) -> Result<Self, SchedError> {
        let c = &config;
        if c.num_ranks == 0 || c.num_experts == 0 || !c.num_experts.is_multiple_of(c.num_ranks) {
            return Err(SchedError::Shape(format!(
                "E = {} is not a positive multiple of R = {}",
                c.num_experts, c.num_ranks
            )));
        }
        if c.num_topk == 0 {
            return Err(SchedError::Shape("num_topk = 0".into()));
        }
        if c.intermediate == 0 || !(2 * c.intermediate).is_multiple_of(c.l1_block_n()) {
            return Err(SchedError::Shape(format!(
                "2I = {} is not a positive multiple of L1 BLOCK_N = {}",
                2 * c.intermediate,
                c.l1_block_n()
            )));
        }
        if c.num_sms == 0 {
            return Err(SchedError::Shape("num_sms = 0".into()));
        }
        if !c.hidden.is_multiple_of(c.block_n) {
            return Err(SchedError::Shape(format!(
                "H = {} is not a multiple of BLOCK_N = {}",
                c.hidden, c.block_n
            )));
        }
        let num_local_experts = c.num_experts / c.num_ranks;
        let (h, i, g) = (
            f64::from(c.hidden),
            f64::from(c.intermediate),
            f64::from(c.act_scale_group),
        );
        let (t, k) = (f64::from(c.tokens_per_rank), f64::from(c.num_topk));

        let expected =
            expected_tokens_per_expert(c.tokens_per_rank, c.num_ranks, c.num_topk, c.num_experts);
        let block_m = choose_block_m(expected);
        let l1_n_blocks = 2 * c.intermediate / c.l1_block_n();
        let l2_n_blocks = c.hidden / c.block_n;
        let num_experts_per_wave = choose_experts_per_wave(&WaveInputs {
            num_local_experts,
            expected_tokens_per_expert: expected,
            block_m,
            l1_n_blocks,
            intermediate: c.intermediate,
            num_sms: c.num_sms,
        });
        let schedule = ScheduleShape {
            block_m,
            l1_n_blocks,
            l2_n_blocks,
            num_experts_per_wave,
        };

        let pairs = t * k;
        let miss = (1.0 - (k / f64::from(c.num_experts)).min(1.0)).powf(t * f64::from(c.num_ranks));
        let experts_hit = f64::from(num_local_experts) * (1.0 - miss);
        let m_blocks_per_expert = expected_m_blocks(pairs / experts_hit.max(1e-9), block_m);
        let blocks_per_wave = |n_blocks: u32| {
            f64::from(num_experts_per_wave)
                * (experts_hit / f64::from(num_local_experts))
                * f64::from(m_blocks_per_expert)
                * f64::from(n_blocks)
        };

        let token_row = h + h / g; // E4M3 token + its UE8M0 scales
        let l2_row = i + i / g;
        let pool_row = token_row + ROW_META_BYTES;
        let hbm = HbmBytes {
            weights: experts_hit * 3.0 * h * i * (0.5 + 1.0 / 32.0),
            dispatch: pairs * (token_row + pool_row),
            linear1: pairs * (token_row + l2_row),
            linear2: pairs * (l2_row + 2.0 * h),
            combine: pairs * 2.0 * h + t * 2.0 * h,
        };
        let remote = f64::from(c.num_ranks - 1) / f64::from(c.num_ranks);
        let nvlink = NvlinkBytes {
            pull: remote * pairs * (token_row + 4.0),
            write_back: remote * pairs * 2.0 * h,
        };

        Ok(Self {
            num_waves: num_local_experts.div_ceil(num_experts_per_wave),
            l1_blocks_per_wave: blocks_per_wave(l1_n_blocks),
            l2_blocks_per_wave: blocks_per_wave(l2_n_blocks),
            config,
            expected_tokens_per_expert: expected,
            expected_pairs: pairs,
            expected_experts_hit: experts_hit,
            schedule,
            m_blocks_per_expert,
            hbm,
            nvlink,
            flops: 2.0 * pairs * h * 3.0 * i,
        })
    }
}

/// Decimal bytes for traffic ("1.68 GB"), as bandwidths are quoted.
fn gb(bytes: f64) -> String {
    if bytes >= 1e9 {
        format!("{:.2} GB", bytes / 1e9)
    } else {
        format!("{:.2} MB", bytes / 1e6)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let s = &self.schedule;
        let e_l = c.num_experts / c.num_ranks;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, value: String| {
            writeln!(f, "  {name:<20} {value}")
        };
        writeln!(
            f,
            "MegaMoE plan: H={} I={} E={} k={}, EP{}, T={} tokens/rank, G={}, {} SMs (uniform routing)",
            c.hidden,
            c.intermediate,
            c.num_experts,
            c.num_topk,
            c.num_ranks,
            c.tokens_per_rank,
            c.act_scale_group,
            c.num_sms
        )?;
        row(
            f,
            "tokens per expert",
            format!(
                "{:.1} expected; {:.1} of {e_l} local experts hit; {:.0} pairs per rank",
                self.expected_tokens_per_expert, self.expected_experts_hit, self.expected_pairs
            ),
        )?;
        row(
            f,
            "BLOCK_M",
            format!(
                "{} ({} m-block(s) per hit expert)",
                s.block_m, self.m_blocks_per_expert
            ),
        )?;
        row(
            f,
            "BLOCK_N",
            format!(
                "L1 {}: {} n-blocks (2I); L2 {}: {} n-blocks (H)",
                c.l1_block_n(),
                s.l1_n_blocks,
                c.block_n,
                s.l2_n_blocks
            ),
        )?;
        row(
            f,
            "experts per wave",
            format!(
                "{} -> {} wave(s); {:.0} L1 + {:.0} L2 blocks per wave",
                s.num_experts_per_wave,
                self.num_waves,
                self.l1_blocks_per_wave,
                self.l2_blocks_per_wave
            ),
        )?;
        row(
            f,
            "FLOPs per rank",
            format!("{:.3} TFLOP", self.flops / 1e12),
        )?;
        let h = &self.hbm;
        row(f, "HBM per rank", format!("{} total", gb(h.total())))?;
        for (name, bytes) in [
            ("weights (FP4+SF)", h.weights),
            ("dispatch", h.dispatch),
            ("linear1", h.linear1),
            ("linear2", h.linear2),
            ("combine", h.combine),
        ] {
            row(f, &format!("  {name}"), gb(bytes))?;
        }
        write!(
            f,
            "  {:<20} {} pulled in, {} written back",
            "NVLink per rank",
            gb(self.nvlink.pull),
            gb(self.nvlink.write_back)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_pro(tokens: u32) -> Plan {
        Plan::new(PlanConfig::new(7168, 3072, 384, 6, 8, tokens)).unwrap()
    }

    #[test]
    fn v4_pro_t8192() {
        let plan = v4_pro(8192);
        assert_eq!(plan.expected_tokens_per_expert, 1024.0);
        assert_eq!(plan.schedule.block_m, 256);
        assert_eq!(plan.m_blocks_per_expert, 4);
        assert_eq!(
            (plan.schedule.l1_n_blocks, plan.schedule.l2_n_blocks),
            (48, 56)
        );
        assert_eq!(
            (plan.schedule.num_experts_per_wave, plan.num_waves),
            (2, 24)
        );
        assert!((plan.l1_blocks_per_wave - 2.0 * 4.0 * 48.0).abs() < 1e-6);
        // DESIGN §4: 8192 tokens = 6.49 TFLOP per rank; all 48 experts' FP4 weights ≈ 1.68 GB.
        assert!((plan.flops / 1e12 - 6.49).abs() < 0.01, "{}", plan.flops);
        assert!(
            (plan.hbm.weights / 1e9 - 1.68).abs() < 0.01,
            "{}",
            plan.hbm.weights
        );
        assert!((plan.expected_experts_hit - 48.0).abs() < 1e-9);
        // Pulled: 7/8 of 49152 pairs · (7168 + 224 + 4) bytes; written back: 7/8 · 49152 · 14336.
        assert!((plan.nvlink.pull - 0.875 * 49152.0 * 7396.0).abs() < 1.0);
        assert!((plan.nvlink.write_back - 0.875 * 49152.0 * 14336.0).abs() < 1.0);
    }

    #[test]
    fn v4_pro_small_batches_hit_fewer_experts() {
        // T = 8 on EP8: 64 tokens pick 6 of 384: 48·(1 − (1 − 6/384)^64) ≈ 30.48 experts.
        let plan = v4_pro(8);
        assert!(
            (plan.expected_experts_hit - 30.48).abs() < 0.01,
            "{}",
            plan.expected_experts_hit
        );
        assert_eq!(plan.schedule.block_m, 16);
        assert_eq!(plan.m_blocks_per_expert, 1);
        assert!(plan.hbm.weights < 0.65 * v4_pro(8192).hbm.weights);
    }

    #[test]
    fn display_names_the_numbers() {
        let text = v4_pro(8192).to_string();
        for needle in [
            "EP8",
            "BLOCK_M",
            "256",
            "experts per wave",
            "24 wave",
            "6.494 TFLOP",
            "NVLink",
            "1.68 GB",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
    }

    #[test]
    fn refuses_bad_configs() {
        assert!(matches!(
            Plan::new(PlanConfig::new(7168, 3072, 100, 6, 8, 8192)),
            Err(SchedError::Shape(_))
        ));
        assert!(matches!(
            Plan::new(PlanConfig::new(7168, 3072, 384, 0, 8, 8192)),
            Err(SchedError::Shape(_))
        ));
        assert!(matches!(
            Plan::new(PlanConfig {
                num_sms: 0,
                ..PlanConfig::new(7168, 3072, 384, 6, 8, 8)
            }),
            Err(SchedError::Shape(_))
        ));
    }
}
