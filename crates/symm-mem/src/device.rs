//! The per-rank view of a symmetric buffer ([`SymmBuffer`], passed by value as a kernel argument),
//! byte for byte as `cuda/symm_buffer.cuh` declares it. Its size and field offsets are asserted
//! here at compile time and repeated as `static_assert`s in the header, so neither side can drift.
//! What lies where in the buffer is its user's business (MegaMoE's regions:
//! `megamoe_kernel::protocol`).

use std::mem::{align_of, offset_of, size_of};

use bytemuck::{Pod, Zeroable};
use static_assertions::const_assert_eq;

use crate::{MAX_RANKS, SymmError};

/// This rank's base address and, for every rank, how far its copy of the buffer lies from ours.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct SymmBuffer {
    /// Device address of this rank's buffer.
    pub base: u64,
    pub rank: u32,
    pub num_ranks: u32,
    /// `base_r − base_self` for every rank r < num_ranks (0 beyond; 0 for self).
    pub rank_offsets: [i64; MAX_RANKS],
}

const_assert_eq!(size_of::<SymmBuffer>(), 592);
const_assert_eq!(align_of::<SymmBuffer>(), 8);
const_assert_eq!(offset_of!(SymmBuffer, base), 0);
const_assert_eq!(offset_of!(SymmBuffer, rank), 8);
const_assert_eq!(offset_of!(SymmBuffer, num_ranks), 12);
const_assert_eq!(offset_of!(SymmBuffer, rank_offsets), 16);

impl SymmBuffer {
    /// The view of rank `rank`, given every rank's base address.
    pub fn new(rank: u32, bases: &[u64]) -> Result<Self, SymmError> {
        let num_ranks = bases.len() as u32;
        if bases.is_empty() || bases.len() > MAX_RANKS {
            return Err(SymmError::BadRankCount(num_ranks));
        }
        if rank >= num_ranks {
            return Err(SymmError::RankOutOfRange { rank, num_ranks });
        }
        let base = bases[rank as usize];
        let mut rank_offsets = [0i64; MAX_RANKS];
        for (offset, &peer_base) in rank_offsets.iter_mut().zip(bases) {
            // Two's-complement difference: exact for any pair of 64-bit addresses.
            *offset = peer_base.wrapping_sub(base) as i64;
        }
        Ok(Self {
            base,
            rank,
            num_ranks,
            rank_offsets,
        })
    }

    /// The address on rank `dst_rank` of what `ptr` addresses in this rank's buffer.
    pub fn map(&self, ptr: u64, dst_rank: u32) -> u64 {
        debug_assert!(
            dst_rank < self.num_ranks,
            "rank {dst_rank} of {}",
            self.num_ranks
        );
        ptr.wrapping_add_signed(self.rank_offsets[dst_rank as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_reaches_the_same_offset_on_every_rank() {
        let bases = [
            0x7f00_0000_0000u64,
            0x7e00_0000_0000,
            0x7f80_0000_0000,
            0x1000,
        ];
        let offset = 0x1234_5678u64;
        for rank in 0..bases.len() as u32 {
            let view = SymmBuffer::new(rank, &bases).unwrap();
            assert_eq!(view.rank_offsets[rank as usize], 0);
            for (dst, &dst_base) in bases.iter().enumerate() {
                assert_eq!(view.map(view.base + offset, dst as u32), dst_base + offset);
            }
        }
    }

    #[test]
    fn refuses_bad_rank_sets() {
        assert_eq!(SymmBuffer::new(0, &[]), Err(SymmError::BadRankCount(0)));
        assert_eq!(
            SymmBuffer::new(2, &[1, 2]),
            Err(SymmError::RankOutOfRange {
                rank: 2,
                num_ranks: 2
            })
        );
        assert_eq!(
            SymmBuffer::new(0, &[0; 73]),
            Err(SymmError::BadRankCount(73))
        );
    }
}
