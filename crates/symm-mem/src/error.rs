//! The errors of this crate's device view: rank sets it cannot describe.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SymmError {
    #[error("num_ranks = {0}: must be in 1..={max}", max = crate::MAX_RANKS)]
    BadRankCount(u32),

    #[error("rank {rank} is out of range for {num_ranks} ranks")]
    RankOutOfRange { rank: u32, num_ranks: u32 },
}
