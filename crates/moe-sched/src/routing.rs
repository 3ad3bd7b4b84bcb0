//! Routing statistics: from every rank's `topk_idx` (i64 `[T, k]`, −1 masked), how many (token,
//! slot) pairs each source rank sends to each global expert, and the views the kernel derives
//! from that (send counts per rank, receive counts [source rank][local expert] per owner rank,
//! tokens per local expert). Validation happens here: expert ids in range, and a token naming an
//! expert at most once, as a top-k does, so an expert receives at most T pairs from a rank.

use crate::SchedError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingStats {
    num_ranks: u32,
    num_experts: u32,
    /// [R][E]: pairs from source rank s to global expert e.
    src_expert_counts: Vec<u32>,
}

impl RoutingStats {
    /// `topk_idx_per_rank[r]` is rank r's `topk_idx`, row-major `[T_r, k]`.
    pub fn from_topk(
        num_experts: u32,
        num_topk: u32,
        topk_idx_per_rank: &[&[i64]],
    ) -> Result<Self, SchedError> {
        let num_ranks = topk_idx_per_rank.len() as u32;
        if num_ranks == 0 || num_experts == 0 || !num_experts.is_multiple_of(num_ranks) {
            return Err(SchedError::Shape(format!(
                "{num_experts} experts over {num_ranks} ranks: need a positive multiple"
            )));
        }
        if num_topk == 0 {
            return Err(SchedError::Shape("num_topk = 0".into()));
        }
        let k = num_topk as usize;
        let e = num_experts as usize;
        let mut src_expert_counts = vec![0u32; num_ranks as usize * e];
        for (rank, topk_idx) in topk_idx_per_rank.iter().enumerate() {
            let rank = rank as u32;
            if !topk_idx.len().is_multiple_of(k) {
                return Err(SchedError::TopkShape {
                    rank,
                    len: topk_idx.len(),
                    num_topk,
                });
            }
            let counts = &mut src_expert_counts[rank as usize * e..][..e];
            for (token, row) in topk_idx.chunks_exact(k).enumerate() {
                let token = token as u32;
                for (slot, &expert) in row.iter().enumerate() {
                    if expert == -1 {
                        continue;
                    }
                    if !(0..i64::from(num_experts)).contains(&expert) {
                        return Err(SchedError::ExpertOutOfRange {
                            rank,
                            token,
                            slot: slot as u32,
                            expert,
                            num_experts,
                        });
                    }
                    if row[..slot].contains(&expert) {
                        return Err(SchedError::DuplicateExpert {
                            rank,
                            token,
                            expert: expert as u32,
                        });
                    }
                    counts[expert as usize] += 1;
                }
            }
        }
        Ok(Self {
            num_ranks,
            num_experts,
            src_expert_counts,
        })
    }

    pub fn num_ranks(&self) -> u32 {
        self.num_ranks
    }

    pub fn num_experts(&self) -> u32 {
        self.num_experts
    }

    pub fn num_local_experts(&self) -> u32 {
        self.num_experts / self.num_ranks
    }

    /// Pairs rank `src` sends to each global expert: `[E]`.
    pub fn send_counts(&self, src: u32) -> &[u32] {
        let e = self.num_experts as usize;
        &self.src_expert_counts[src as usize * e..][..e]
    }

    /// Pairs each global expert receives from all ranks: `[E]`.
    pub fn tokens_per_expert(&self) -> Vec<u64> {
        let mut totals = vec![0u64; self.num_experts as usize];
        for src in 0..self.num_ranks {
            for (total, &count) in totals.iter_mut().zip(self.send_counts(src)) {
                *total += u64::from(count);
            }
        }
        totals
    }

    /// Pairs source rank `src` sends to local expert `local` of rank `owner`.
    pub fn recv_count(&self, owner: u32, src: u32, local: u32) -> u32 {
        self.send_counts(src)[(owner * self.num_local_experts() + local) as usize]
    }

    /// Rank `owner`'s receive counts, `[R][E_l]` row-major: the `recv_counts` region's content.
    pub fn recv_counts(&self, owner: u32) -> Vec<u32> {
        let e_l = self.num_local_experts() as usize;
        (0..self.num_ranks)
            .flat_map(|src| &self.send_counts(src)[owner as usize * e_l..][..e_l])
            .copied()
            .collect()
    }

    /// Per source rank, the pairs local expert `local` of rank `owner` receives: `[R]`, the
    /// counts the interleave peels.
    pub fn source_counts(&self, owner: u32, local: u32) -> Vec<u32> {
        (0..self.num_ranks)
            .map(|src| self.recv_count(owner, src, local))
            .collect()
    }

    /// Pairs each local expert of rank `owner` receives: `[E_l]`.
    pub fn tokens_per_local_expert(&self, owner: u32) -> Vec<u32> {
        (0..self.num_local_experts())
            .map(|local| {
                (0..self.num_ranks)
                    .map(|src| self.recv_count(owner, src, local))
                    .sum()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_two_ranks() {
        // 4 experts on 2 ranks (2 local each), k = 2.
        let rank0: &[i64] = &[0, 3, 2, -1, 3, 2];
        let rank1: &[i64] = &[-1, -1, 1, 0];
        let stats = RoutingStats::from_topk(4, 2, &[rank0, rank1]).unwrap();
        assert_eq!(stats.send_counts(0), [1, 0, 2, 2]);
        assert_eq!(stats.send_counts(1), [1, 1, 0, 0]);
        assert_eq!(stats.tokens_per_expert(), [2, 1, 2, 2]);
        assert_eq!(stats.recv_counts(0), [1, 0, 1, 1]);
        assert_eq!(stats.recv_counts(1), [2, 2, 0, 0]);
        assert_eq!(stats.tokens_per_local_expert(0), [2, 1]);
        assert_eq!(stats.tokens_per_local_expert(1), [2, 2]);
        assert_eq!(stats.source_counts(1, 0), [2, 0]);
    }

    #[test]
    fn refuses_bad_routings() {
        assert!(matches!(
            RoutingStats::from_topk(4, 2, &[&[0, 4]]),
            Err(SchedError::ExpertOutOfRange {
                token: 0,
                slot: 1,
                expert: 4,
                ..
            })
        ));
        assert!(matches!(
            RoutingStats::from_topk(4, 2, &[&[-2, 1]]),
            Err(SchedError::ExpertOutOfRange { expert: -2, .. })
        ));
        assert!(matches!(
            RoutingStats::from_topk(4, 2, &[&[0, 1, 3, 3]]),
            Err(SchedError::DuplicateExpert {
                token: 1,
                expert: 3,
                ..
            })
        ));
        assert!(matches!(
            RoutingStats::from_topk(4, 2, &[&[0, 1, 3]]),
            Err(SchedError::TopkShape { len: 3, .. })
        ));
        assert!(matches!(
            RoutingStats::from_topk(3, 2, &[&[], &[]]),
            Err(SchedError::Shape(_))
        ));
    }
}
