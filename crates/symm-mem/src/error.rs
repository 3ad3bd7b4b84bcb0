//! The errors of this crate: parameters the layout refuses, and routings that do not fit the pool.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SymmError {
    #[error("num_ranks = {0}: must be in 1..={max}", max = crate::MAX_RANKS)]
    BadRankCount(u32),

    #[error("rank {rank} is out of range for {num_ranks} ranks")]
    RankOutOfRange { rank: u32, num_ranks: u32 },

    #[error("num_experts = {num_experts} is not a positive multiple of num_ranks = {num_ranks}")]
    ExpertsNotDivisible { num_experts: u32, num_ranks: u32 },

    #[error("{name} = {value} is not a positive multiple of 128")]
    NotMultipleOf128 { name: &'static str, value: u32 },

    #[error("num_topk = {0}: must be in 1..=32 (the combine keeps one mask bit per slot)")]
    BadTopk(u32),

    #[error("activation scale group G = {0}: must be 32 or 128")]
    BadScaleGroup(u32),

    #[error("max_tokens_per_rank = {0}: must be in 1..={max}", max = crate::layout::MAX_TOKENS_PER_RANK)]
    BadTokenCount(u32),

    #[error("BLOCK_M = {0}: must be a multiple of 8 in 8..=512")]
    BadBlockM(u32),

    #[error("the layout has no BLOCK_M at all; give at least one")]
    NoBlockM,

    #[error("BLOCK_M = {block_m} is not one the layout was sized for ({available})")]
    BlockMNotInLayout { block_m: u32, available: String },

    #[error("L1 BLOCK_N = {block_n} must be a positive multiple of 16 dividing 2·I = {two_i}")]
    BadBlockN { block_n: u32, two_i: u32 },

    #[error(
        "got {got} token counts for {num_local_experts} local experts (one count per local expert)"
    )]
    CountsLength { got: usize, num_local_experts: u32 },

    #[error(
        "routing overflows the pool: local expert {local_expert} ({tokens} tokens) ends at padded \
         row {rows_needed} with BLOCK_M = {block_m}, but the pool holds {capacity} rows"
    )]
    PoolOverflow {
        local_expert: u32,
        tokens: u32,
        rows_needed: u64,
        capacity: u64,
        block_m: u32,
    },
}
