//! The "peel the minimum remaining" interleave: the order in which an expert's pool slots take
//! tokens from the source ranks, so that consecutive pulls hit many NVLink peers at once instead
//! of draining one rank's list before the next.
//!
//! Rule: over the ranks that still have tokens, take the minimum remaining count m; the next
//! m·#active slots go round-robin over the active ranks in rank order; subtract m; repeat.
//! [`peel_interleave`] streams the order; [`peel_interleave_slot`] finds one slot's source
//! directly, which is what a dispatch warp owning slot s needs (the device twin mirrors it).

/// The (source rank, index in that rank's list) of pool slot `slot`, or `None` past the end.
/// At most one peel round per distinct count, each O(R).
pub fn peel_interleave_slot(counts: &[u32], slot: u32) -> Option<(u32, u32)> {
    let mut slot = u64::from(slot);
    let mut consumed = 0u32; // taken from every still-active rank in earlier rounds
    loop {
        let mut active = 0u64;
        let mut min_remaining = u32::MAX;
        for &count in counts {
            if count > consumed {
                active += 1;
                min_remaining = min_remaining.min(count - consumed);
            }
        }
        if active == 0 {
            return None;
        }
        let round_slots = u64::from(min_remaining) * active;
        if slot < round_slots {
            let position = (slot % active) as usize;
            let (rank, _) = counts
                .iter()
                .enumerate()
                .filter(|&(_, &count)| count > consumed)
                .nth(position)
                .expect("position < active");
            return Some((rank as u32, consumed + (slot / active) as u32));
        }
        slot -= round_slots;
        consumed += min_remaining;
    }
}

/// The whole interleave of `counts` (tokens per source rank), slot by slot.
pub fn peel_interleave(counts: &[u32]) -> PeelInterleave<'_> {
    PeelInterleave {
        counts,
        consumed: 0,
        active: Vec::new(),
        round_len: 0,
        position: 0,
    }
}

/// Iterator of (source rank, index in that rank's list), see [`peel_interleave`].
#[derive(Clone, Debug)]
pub struct PeelInterleave<'a> {
    counts: &'a [u32],
    /// Taken from every active rank in finished rounds.
    consumed: u32,
    /// Ranks of the current round, ascending.
    active: Vec<u32>,
    /// Slots of the current round: min remaining × active ranks.
    round_len: u64,
    position: u64,
}

impl Iterator for PeelInterleave<'_> {
    type Item = (u32, u32);

    fn next(&mut self) -> Option<(u32, u32)> {
        if self.position == self.round_len {
            // Start the next round: whoever still has tokens beyond what rounds took.
            if let Some(min_before) = self.active.iter().map(|&r| self.counts[r as usize]).min() {
                self.consumed = min_before;
            }
            let consumed = self.consumed;
            self.active = (0..self.counts.len() as u32)
                .filter(|&r| self.counts[r as usize] > consumed)
                .collect();
            let min_remaining = self
                .active
                .iter()
                .map(|&r| self.counts[r as usize] - consumed)
                .min()?;
            self.round_len = u64::from(min_remaining) * self.active.len() as u64;
            self.position = 0;
        }
        let active = self.active.len() as u64;
        let rank = self.active[(self.position % active) as usize];
        let index = self.consumed + (self.position / active) as u32;
        self.position += 1;
        Some((rank, index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's example: an expert receives 5, 3, 9, 2 tokens from ranks 0..4. Worked by hand:
    /// round 1, min 2 over ranks {0,1,2,3}: 8 slots, remaining 3,1,7,0;
    /// round 2, min 1 over {0,1,2}: 3 slots, remaining 2,0,6,0;
    /// round 3, min 2 over {0,2}: 4 slots, remaining 0,0,4,0;
    /// round 4, min 4 over {2}: 4 slots. 8 + 3 + 4 + 4 = 19 = 5 + 3 + 9 + 2.
    /// (The seed's prose says "2, 0, 5, 0" after round 2 and "3 left" at the end; 9 − 2 − 1 = 6,
    /// so by its own rule rank 2 has 6 after round 2 and 4 in the last round.)
    const SEED_COUNTS: [u32; 4] = [5, 3, 9, 2];
    const SEED_ORDER: [(u32, u32); 19] = [
        (0, 0),
        (1, 0),
        (2, 0),
        (3, 0),
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 1),
        (0, 2),
        (1, 2),
        (2, 2),
        (0, 3),
        (2, 3),
        (0, 4),
        (2, 4),
        (2, 5),
        (2, 6),
        (2, 7),
        (2, 8),
    ];

    #[test]
    fn seed_example_streamed() {
        let order: Vec<_> = peel_interleave(&SEED_COUNTS).collect();
        assert_eq!(order, SEED_ORDER);
    }

    #[test]
    fn seed_example_by_slot() {
        for (slot, &expected) in SEED_ORDER.iter().enumerate() {
            assert_eq!(
                peel_interleave_slot(&SEED_COUNTS, slot as u32),
                Some(expected)
            );
        }
        assert_eq!(peel_interleave_slot(&SEED_COUNTS, 19), None);
    }

    #[test]
    fn empty_and_single_rank() {
        assert_eq!(peel_interleave(&[]).count(), 0);
        assert_eq!(peel_interleave(&[0, 0]).count(), 0);
        assert_eq!(peel_interleave_slot(&[0, 0], 0), None);
        let order: Vec<_> = peel_interleave(&[0, 3, 0]).collect();
        assert_eq!(order, [(1, 0), (1, 1), (1, 2)]);
    }

    #[test]
    fn equal_counts_are_plain_round_robin() {
        let order: Vec<_> = peel_interleave(&[2, 2, 2]).collect();
        assert_eq!(order, [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]);
    }
}
