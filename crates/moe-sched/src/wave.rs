//! The wave scheduler: the order in which persistent workers (one per SM, or per CTA pair) take
//! GEMM blocks.
//!
//! Local experts are cut into waves of `num_experts_per_wave` consecutive experts (the last may
//! be partial). The virtual block list is wave 0's L1 blocks, wave 0's L2 blocks, wave 1's L1
//! blocks, …; within a (wave, layer) segment blocks go expert-major, m-major, n-minor. A block is
//! (local expert, m-block, n-block); L1 has 2I/BLOCK_N n-blocks, L2 has H/BLOCK_N. Worker w of W
//! takes virtual blocks w, w+W, w+2W, …
//!
//! Why it cannot deadlock: an L2 block (e, m, ·) needs every L1 block (e, m, ·), and those sit in
//! the same wave's L1 segment, before the L2 segment. Every block thus depends only on blocks
//! with smaller virtual indices, and each worker runs its blocks in increasing index order. The
//! unfinished block with the smallest index therefore has all dependencies done and all of its
//! worker's earlier blocks done, so it runs: some block always makes progress.
//!
//! Pairs: when W and every n-block count are even, each segment starts at an even index, so
//! workers 2j and 2j+1 always hold (e, m, n) and (e, m, n+1) — a cluster of two can multicast the
//! shared token tile.
//!
//! [`WorkerBlocks`] walks one worker's blocks with a forward-only cursor, exactly as the device
//! twin (`cuda/scheduler.cuh`) does.

use std::ops::Range;

use crate::SchedError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    L1 = 0,
    L2 = 1,
}

/// One GEMM block of the virtual list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    pub layer: Layer,
    pub wave: u32,
    pub local_expert: u32,
    pub m_block: u32,
    pub n_block: u32,
}

/// The sizes the schedule is cut by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleShape {
    pub block_m: u32,
    /// 2I / BLOCK_N.
    pub l1_n_blocks: u32,
    /// H / BLOCK_N.
    pub l2_n_blocks: u32,
    pub num_experts_per_wave: u32,
}

/// The virtual block list of one rank for one routing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaveSchedule {
    shape: ScheduleShape,
    /// ⌈tokens / BLOCK_M⌉ per local expert.
    m_blocks: Vec<u32>,
}

impl WaveSchedule {
    pub fn new(shape: ScheduleShape, tokens_per_local_expert: &[u32]) -> Result<Self, SchedError> {
        let ScheduleShape {
            block_m,
            l1_n_blocks,
            l2_n_blocks,
            num_experts_per_wave,
        } = shape;
        if block_m == 0 || l1_n_blocks == 0 || l2_n_blocks == 0 || num_experts_per_wave == 0 {
            return Err(SchedError::Shape(format!(
                "schedule sizes must be positive: {shape:?}"
            )));
        }
        if tokens_per_local_expert.is_empty() {
            return Err(SchedError::Shape("no local experts".into()));
        }
        let m_blocks = tokens_per_local_expert
            .iter()
            .map(|t| t.div_ceil(block_m))
            .collect();
        Ok(Self { shape, m_blocks })
    }

    pub fn shape(&self) -> ScheduleShape {
        self.shape
    }

    pub fn num_local_experts(&self) -> u32 {
        self.m_blocks.len() as u32
    }

    pub fn num_waves(&self) -> u32 {
        self.num_local_experts()
            .div_ceil(self.shape.num_experts_per_wave)
    }

    /// The local experts of a wave.
    pub fn wave_experts(&self, wave: u32) -> Range<u32> {
        let start = wave * self.shape.num_experts_per_wave;
        start..(start + self.shape.num_experts_per_wave).min(self.num_local_experts())
    }

    pub fn m_blocks(&self, local_expert: u32) -> u32 {
        self.m_blocks[local_expert as usize]
    }

    pub fn n_blocks(&self, layer: Layer) -> u32 {
        match layer {
            Layer::L1 => self.shape.l1_n_blocks,
            Layer::L2 => self.shape.l2_n_blocks,
        }
    }

    /// Blocks of one (wave, layer) segment.
    pub fn segment_blocks(&self, wave: u32, layer: Layer) -> u64 {
        let m: u64 = self
            .wave_experts(wave)
            .map(|e| u64::from(self.m_blocks(e)))
            .sum();
        m * u64::from(self.n_blocks(layer))
    }

    /// Length of the virtual list.
    pub fn num_blocks(&self) -> u64 {
        let m: u64 = self.m_blocks.iter().map(|&m| u64::from(m)).sum();
        m * u64::from(self.shape.l1_n_blocks + self.shape.l2_n_blocks)
    }

    /// The whole virtual list, in order.
    pub fn blocks(&self) -> impl Iterator<Item = Block> + '_ {
        (0..self.num_waves()).flat_map(move |wave| {
            [Layer::L1, Layer::L2].into_iter().flat_map(move |layer| {
                self.wave_experts(wave).flat_map(move |local_expert| {
                    let n_blocks = self.n_blocks(layer);
                    (0..self.m_blocks(local_expert)).flat_map(move |m_block| {
                        (0..n_blocks).map(move |n_block| Block {
                            layer,
                            wave,
                            local_expert,
                            m_block,
                            n_block,
                        })
                    })
                })
            })
        })
    }

    /// Worker `worker`'s blocks: virtual indices worker, worker + W, … in order.
    pub fn worker(&self, worker: u32, num_workers: u32) -> WorkerBlocks<'_> {
        assert!(worker < num_workers, "worker {worker} of {num_workers}");
        WorkerBlocks {
            schedule: self,
            num_workers: u64::from(num_workers),
            next_index: u64::from(worker),
            wave: 0,
            layer: Layer::L1,
            expert: 0,
            expert_start: 0,
        }
    }
}

/// One worker's blocks; a forward-only cursor over (wave, layer, expert).
#[derive(Clone, Debug)]
pub struct WorkerBlocks<'a> {
    schedule: &'a WaveSchedule,
    num_workers: u64,
    /// Virtual index of the next block to hand out.
    next_index: u64,
    wave: u32,
    layer: Layer,
    expert: u32,
    /// Virtual index of the first block of (`wave`, `layer`, `expert`).
    expert_start: u64,
}

impl Iterator for WorkerBlocks<'_> {
    type Item = Block;

    fn next(&mut self) -> Option<Block> {
        let s = self.schedule;
        while self.wave < s.num_waves() {
            let n_blocks = s.n_blocks(self.layer);
            let blocks = u64::from(s.m_blocks(self.expert)) * u64::from(n_blocks);
            if self.next_index < self.expert_start + blocks {
                let within = self.next_index - self.expert_start;
                self.next_index += self.num_workers;
                return Some(Block {
                    layer: self.layer,
                    wave: self.wave,
                    local_expert: self.expert,
                    m_block: (within / u64::from(n_blocks)) as u32,
                    n_block: (within % u64::from(n_blocks)) as u32,
                });
            }
            // Past this expert's blocks: next expert, else the wave's L2, else the next wave.
            self.expert_start += blocks;
            self.expert += 1;
            if self.expert == s.wave_experts(self.wave).end {
                if self.layer == Layer::L1 {
                    self.layer = Layer::L2;
                } else {
                    self.layer = Layer::L1;
                    self.wave += 1;
                }
                self.expert = self.wave * s.shape.num_experts_per_wave;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(per_wave: u32) -> ScheduleShape {
        ScheduleShape {
            block_m: 16,
            l1_n_blocks: 2,
            l2_n_blocks: 3,
            num_experts_per_wave: per_wave,
        }
    }

    #[test]
    fn virtual_list_order() {
        // Experts: 17 tokens (2 m-blocks), 0 tokens, 5 tokens (1 m-block); waves of 2.
        let schedule = WaveSchedule::new(shape(2), &[17, 0, 5]).unwrap();
        assert_eq!(schedule.num_waves(), 2);
        assert_eq!(schedule.num_blocks(), 3 * (2 + 3));
        let list: Vec<_> = schedule
            .blocks()
            .map(|b| (b.layer as u8, b.wave, b.local_expert, b.m_block, b.n_block))
            .collect();
        #[rustfmt::skip]
        let expected = [
            (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1),
            (1, 0, 0, 0, 0), (1, 0, 0, 0, 1), (1, 0, 0, 0, 2), (1, 0, 0, 1, 0), (1, 0, 0, 1, 1), (1, 0, 0, 1, 2),
            (0, 1, 2, 0, 0), (0, 1, 2, 0, 1),
            (1, 1, 2, 0, 0), (1, 1, 2, 0, 1), (1, 1, 2, 0, 2),
        ];
        assert_eq!(list, expected);
    }

    #[test]
    fn workers_stride_the_list() {
        let schedule = WaveSchedule::new(shape(2), &[17, 0, 5]).unwrap();
        let list: Vec<_> = schedule.blocks().collect();
        for workers in 1..=20 {
            for w in 0..workers {
                let mine: Vec<_> = schedule.worker(w, workers).collect();
                let expected: Vec<_> = list
                    .iter()
                    .copied()
                    .skip(w as usize)
                    .step_by(workers as usize)
                    .collect();
                assert_eq!(mine, expected, "worker {w} of {workers}");
            }
        }
    }

    #[test]
    fn refuses_zero_sizes() {
        assert!(WaveSchedule::new(shape(0), &[1]).is_err());
        assert!(WaveSchedule::new(shape(1), &[]).is_err());
    }
}
