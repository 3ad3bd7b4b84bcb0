//! The errors of this crate: malformed routings and shapes.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SchedError {
    #[error("bad shape: {0}")]
    Shape(String),

    #[error("rank {rank}: topk_idx has {len} entries, not a multiple of k = {num_topk}")]
    TopkShape {
        rank: u32,
        len: usize,
        num_topk: u32,
    },

    #[error(
        "rank {rank}, token {token}, slot {slot}: expert {expert} is outside 0..{num_experts} \
         (-1 masks a slot)"
    )]
    ExpertOutOfRange {
        rank: u32,
        token: u32,
        slot: u32,
        expert: i64,
        num_experts: u32,
    },

    #[error("rank {rank}, token {token}: expert {expert} is named twice")]
    DuplicateExpert { rank: u32, token: u32, expert: u32 },
}
