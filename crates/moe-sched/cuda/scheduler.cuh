// scheduler.cuh — device twin of crates/moe-sched (wave.rs, interleave.rs, pool.rs).
// The wave scheduler a persistent worker walks, the "peel the minimum remaining" source-rank
// interleave, and BLOCK_M-aligned pool offsets. Same rules, same order as the Rust model; the
// host tests build this file with g++ and compare outputs. No includes: NVRTC compiles it from
// the in-memory include tree.
#pragma once

namespace moe_sched {

enum Layer : unsigned int { kL1 = 0, kL2 = 1 };

struct Block {
    unsigned int layer;  // Layer
    unsigned int wave;
    unsigned int local_expert;
    unsigned int m_block;
    unsigned int n_block;
};

__device__ __forceinline__ unsigned int ceil_div(unsigned int a, unsigned int b) {
    return (a + b - 1) / b;
}

// First pool row of local expert `expert`: the BLOCK_M-padded counts of the experts before it.
__device__ __forceinline__ unsigned long long pool_offset(const unsigned int* tokens_per_local_expert,
                                                          unsigned int expert, unsigned int block_m) {
    unsigned long long offset = 0;
    for (unsigned int e = 0; e < expert; ++e)
        offset += static_cast<unsigned long long>(ceil_div(tokens_per_local_expert[e], block_m)) * block_m;
    return offset;
}

// Source of pool slot `slot` of one expert, given its per-source-rank counts: take the minimum
// remaining count m over ranks with tokens left; the next m * #active slots go round-robin over
// the active ranks in rank order; subtract m; repeat. Returns false past the last slot.
__device__ __forceinline__ bool peel_interleave_slot(const unsigned int* counts, unsigned int num_ranks,
                                                     unsigned int slot, unsigned int& rank,
                                                     unsigned int& index) {
    unsigned long long remaining_slot = slot;
    unsigned int consumed = 0;  // taken from every still-active rank in earlier rounds
    while (true) {
        unsigned int active = 0;
        unsigned int min_remaining = 0xffffffffu;
        for (unsigned int r = 0; r < num_ranks; ++r) {
            if (counts[r] > consumed) {
                ++active;
                min_remaining = counts[r] - consumed < min_remaining ? counts[r] - consumed : min_remaining;
            }
        }
        if (active == 0)
            return false;
        const unsigned long long round_slots = static_cast<unsigned long long>(min_remaining) * active;
        if (remaining_slot < round_slots) {
            unsigned int position = static_cast<unsigned int>(remaining_slot % active);
            for (unsigned int r = 0; r < num_ranks; ++r) {
                if (counts[r] > consumed && position-- == 0) {
                    rank = r;
                    index = consumed + static_cast<unsigned int>(remaining_slot / active);
                    return true;
                }
            }
        }
        remaining_slot -= round_slots;
        consumed += min_remaining;
    }
}

// One persistent worker's walk over the virtual block list: wave 0 L1, wave 0 L2, wave 1 L1, ...;
// expert-major, m-major, n-minor inside a (wave, layer); worker w of W takes blocks w, w+W, ...
// A forward-only cursor over (wave, layer, expert), so the whole walk costs O(E_l + blocks / W).
struct WaveScheduler {
    const unsigned int* tokens_per_local_expert;
    unsigned int num_local_experts;
    unsigned int num_experts_per_wave;
    unsigned int block_m;
    unsigned int l1_n_blocks;
    unsigned int l2_n_blocks;
    unsigned int num_workers;

    unsigned long long next_index;    // virtual index of the next block to hand out
    unsigned int wave;
    unsigned int layer;
    unsigned int expert;
    unsigned long long expert_start;  // virtual index of the first block of (wave, layer, expert)

    __device__ __forceinline__ void init(const unsigned int* tokens, unsigned int num_local_experts_,
                                         unsigned int num_experts_per_wave_, unsigned int block_m_,
                                         unsigned int l1_n_blocks_, unsigned int l2_n_blocks_,
                                         unsigned int worker, unsigned int num_workers_) {
        tokens_per_local_expert = tokens;
        num_local_experts = num_local_experts_;
        num_experts_per_wave = num_experts_per_wave_;
        block_m = block_m_;
        l1_n_blocks = l1_n_blocks_;
        l2_n_blocks = l2_n_blocks_;
        num_workers = num_workers_;
        next_index = worker;
        wave = 0;
        layer = kL1;
        expert = 0;
        expert_start = 0;
    }

    __device__ __forceinline__ unsigned int num_waves() const {
        return ceil_div(num_local_experts, num_experts_per_wave);
    }

    __device__ __forceinline__ unsigned int wave_end(unsigned int w) const {
        const unsigned int end = (w + 1) * num_experts_per_wave;
        return end < num_local_experts ? end : num_local_experts;
    }

    // The next block of this worker; false when the list is exhausted.
    __device__ __forceinline__ bool next(Block& block) {
        const unsigned int waves = num_waves();
        while (wave < waves) {
            const unsigned int n_blocks = layer == kL1 ? l1_n_blocks : l2_n_blocks;
            const unsigned long long blocks =
                static_cast<unsigned long long>(ceil_div(tokens_per_local_expert[expert], block_m)) * n_blocks;
            if (next_index < expert_start + blocks) {
                const unsigned long long within = next_index - expert_start;
                next_index += num_workers;
                block.layer = layer;
                block.wave = wave;
                block.local_expert = expert;
                block.m_block = static_cast<unsigned int>(within / n_blocks);
                block.n_block = static_cast<unsigned int>(within % n_blocks);
                return true;
            }
            // Past this expert's blocks: next expert, else the wave's L2, else the next wave.
            expert_start += blocks;
            if (++expert == wave_end(wave)) {
                if (layer == kL1) {
                    layer = kL2;
                } else {
                    layer = kL1;
                    ++wave;
                }
                expert = wave * num_experts_per_wave;
            }
        }
        return false;
    }
};

}  // namespace moe_sched
