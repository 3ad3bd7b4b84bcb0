//! Pool addressing for one routing: where each local expert's rows start in the L1/L2 pools
//! (BLOCK_M-aligned, tail padding counted, capacity checked by `symm-mem`), which pool block an
//! (expert, m-block) is, and how many valid rows its arrival counter waits for.

use symm_mem::SymmLayout;

use crate::SchedError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolLayout {
    block_m: u32,
    tokens: Vec<u32>,
    /// [E_l + 1] row offsets; the last is the padded rows used.
    offsets: Vec<u64>,
}

impl PoolLayout {
    /// Refuses a routing whose padded rows exceed the layout's pool.
    pub fn new(
        layout: &SymmLayout,
        tokens_per_local_expert: &[u32],
        block_m: u32,
    ) -> Result<Self, SchedError> {
        let offsets = layout.pool_offsets(tokens_per_local_expert, block_m)?;
        Ok(Self {
            block_m,
            tokens: tokens_per_local_expert.to_vec(),
            offsets,
        })
    }

    pub fn block_m(&self) -> u32 {
        self.block_m
    }

    pub fn tokens(&self, local_expert: u32) -> u32 {
        self.tokens[local_expert as usize]
    }

    /// First pool row of a local expert (a multiple of BLOCK_M).
    pub fn offset(&self, local_expert: u32) -> u64 {
        self.offsets[local_expert as usize]
    }

    /// Padded rows in use.
    pub fn used_rows(&self) -> u64 {
        self.offsets[self.offsets.len() - 1]
    }

    /// Pool row of slot `slot` of a local expert.
    pub fn row(&self, local_expert: u32, slot: u32) -> u64 {
        debug_assert!(slot < self.tokens(local_expert));
        self.offset(local_expert) + u64::from(slot)
    }

    pub fn m_blocks(&self, local_expert: u32) -> u32 {
        self.tokens(local_expert).div_ceil(self.block_m)
    }

    /// Index of (expert, m-block) in the arrival arrays.
    pub fn pool_block(&self, local_expert: u32, m_block: u32) -> u64 {
        debug_assert!(m_block < self.m_blocks(local_expert));
        self.offset(local_expert) / u64::from(self.block_m) + u64::from(m_block)
    }

    /// Valid rows of a pool block: what its L1 arrival counter reaches when the block is complete.
    pub fn rows_in_block(&self, local_expert: u32, m_block: u32) -> u32 {
        let tokens = self.tokens(local_expert);
        debug_assert!(m_block < self.m_blocks(local_expert));
        (tokens - m_block * self.block_m).min(self.block_m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_mem::{BlockMs, SymmError, SymmParams};

    fn layout() -> SymmLayout {
        SymmLayout::new(SymmParams {
            num_ranks: 2,
            max_tokens_per_rank: 64,
            hidden: 256,
            intermediate: 128,
            num_experts: 8,
            num_topk: 2,
            act_scale_group: 32,
            block_ms: BlockMs::new(&[16, 32]).unwrap(),
            l1_block_n: 128,
        })
        .unwrap()
    }

    #[test]
    fn offsets_blocks_and_rows() {
        let pool = PoolLayout::new(&layout(), &[33, 0, 16, 1], 16).unwrap();
        assert_eq!(
            (0..4).map(|e| pool.offset(e)).collect::<Vec<_>>(),
            [0, 48, 48, 64]
        );
        assert_eq!(pool.used_rows(), 80);
        assert_eq!(
            (0..4).map(|e| pool.m_blocks(e)).collect::<Vec<_>>(),
            [3, 0, 1, 1]
        );
        assert_eq!(pool.pool_block(0, 2), 2);
        assert_eq!(pool.pool_block(2, 0), 3);
        assert_eq!(pool.pool_block(3, 0), 4);
        assert_eq!(
            [pool.rows_in_block(0, 0), pool.rows_in_block(0, 2)],
            [16, 1]
        );
        assert_eq!(pool.row(3, 0), 64);
    }

    #[test]
    fn overflow_names_the_expert() {
        // Capacity with BLOCK_M 32: N = 128·2 = 256 pairs, 4 experts, ≤ 128 each → 32·(4 + 7).
        let layout = layout();
        assert_eq!(layout.pool_capacity_for(32).unwrap(), 352);
        let err = PoolLayout::new(&layout, &[128, 128, 128, 1], 32).unwrap_err();
        assert!(matches!(
            err,
            SchedError::Symm(SymmError::PoolOverflow {
                local_expert: 2,
                rows_needed: 384,
                ..
            })
        ));
    }
}
