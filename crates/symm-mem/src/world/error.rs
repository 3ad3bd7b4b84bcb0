//! [`WorldError`]: everything a world can fail with. Every failure names the rank that saw it, and
//! those involving a peer name the peer and the collective it was in.

use std::path::PathBuf;
use std::time::Duration;

use crate::SymmError;

#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error(transparent)]
    Cuda(#[from] cuda_rt::Error),

    #[error(transparent)]
    Symm(#[from] SymmError),

    #[error("environment variable {var}: {reason}")]
    Env { var: &'static str, reason: String },

    #[error("World::local needs 1..={max} GPU ordinals (one per rank), got {0:?}", max = crate::MAX_RANKS)]
    BadOrdinals(Vec<usize>),

    #[error("rank {rank}: {what} ({}): {source}", path.display())]
    Socket {
        rank: usize,
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },

    #[error(
        "rank {rank}: timed out after {waited:.1?} in {during}: rank(s) {missing:?} never arrived \
         (not started, crashed, or stuck)"
    )]
    Timeout {
        rank: usize,
        during: String,
        missing: Vec<usize>,
        waited: Duration,
    },

    #[error(
        "rank {rank}: rank {peer} left during {during} (its process exited or it dropped its World)"
    )]
    PeerLost {
        rank: usize,
        peer: usize,
        during: String,
    },

    #[error("rank {rank}: {during}: {reason}")]
    Protocol {
        rank: usize,
        during: String,
        reason: String,
    },

    /// Another rank gave up on the collective and said why (rank 0 for a multi-process world).
    #[error("rank {rank}: {during} was abandoned: {reason}")]
    Aborted {
        rank: usize,
        during: String,
        reason: String,
    },

    #[error("rank {rank}: the world failed earlier ({reason}); make a new one")]
    Poisoned { rank: usize, reason: String },

    #[error("cannot start rank {rank}'s process: {source}")]
    Spawn { rank: usize, source: std::io::Error },

    #[error("bytes {offset}..{end} are outside the {bytes}-byte symmetric buffer", end = offset + len)]
    OutOfBounds {
        offset: usize,
        len: usize,
        bytes: usize,
    },
}
