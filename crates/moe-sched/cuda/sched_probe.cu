// sched_probe.cu -- kernels the GPU tests of `moe-sched` run its device twin with (compiled by
// `cargo xtask kernels` for every target).
#include "scheduler.cuh"

// One worker per thread; worker w writes its blocks as 5 words each to out[w * max_blocks * 5 ..]
// and its block count to num_blocks[w].
extern "C" __global__ void walk(const unsigned int* tokens, unsigned int num_local_experts,
                                unsigned int num_experts_per_wave, unsigned int block_m,
                                unsigned int l1_n_blocks, unsigned int l2_n_blocks,
                                unsigned int max_blocks, unsigned int* out, unsigned int* num_blocks) {
    const unsigned int worker = blockIdx.x * blockDim.x + threadIdx.x;
    moe_sched::WaveScheduler scheduler;
    scheduler.init(tokens, num_local_experts, num_experts_per_wave, block_m, l1_n_blocks, l2_n_blocks,
                   worker, gridDim.x * blockDim.x);
    moe_sched::Block block;
    unsigned int n = 0;
    while (scheduler.next(block)) {
        if (n < max_blocks) {
            unsigned int* o = out + (static_cast<unsigned long long>(worker) * max_blocks + n) * 5;
            o[0] = block.layer;
            o[1] = block.wave;
            o[2] = block.local_expert;
            o[3] = block.m_block;
            o[4] = block.n_block;
        }
        ++n;
    }
    num_blocks[worker] = n;
}

// Thread s finds slot s's source; past the end it writes ~0.
extern "C" __global__ void peel(const unsigned int* counts, unsigned int num_ranks, unsigned int num_slots,
                                unsigned int* out) {
    const unsigned int slot = blockIdx.x * blockDim.x + threadIdx.x;
    if (slot >= num_slots) return;
    unsigned int rank = ~0u, index = ~0u;
    moe_sched::peel_interleave_slot(counts, num_ranks, slot, rank, index);
    out[2 * slot] = rank;
    out[2 * slot + 1] = index;
}

extern "C" __global__ void offsets(const unsigned int* tokens, unsigned int num_local_experts,
                                   unsigned int block_m, unsigned long long* out) {
    const unsigned int expert = threadIdx.x;
    if (expert <= num_local_experts) out[expert] = moe_sched::pool_offset(tokens, expert, block_m);
}
