// Host build of cuda/scheduler.cuh (g++), driven by commands on stdin, one per line:
//   sched E_l experts_per_wave block_m l1_n l2_n workers tokens[E_l]  -> each worker's blocks
//   peel R counts[R]                                                  -> every slot's (rank, index)
//   pool block_m E_l tokens[E_l]                                      -> every expert's pool offset
// The Rust test prints the same text from the Rust model and compares.
#define __device__
#define __forceinline__ inline
#include "../../cuda/scheduler.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static std::vector<unsigned int> read_n(unsigned int n) {
    std::vector<unsigned int> v(n);
    for (auto& x : v)
        if (std::scanf("%u", &x) != 1) std::exit(3);
    return v;
}

int main() {
    char command[16];
    while (std::scanf("%15s", command) == 1) {
        if (!std::strcmp(command, "sched")) {
            unsigned int e_l, per_wave, block_m, l1_n, l2_n, workers;
            if (std::scanf("%u %u %u %u %u %u", &e_l, &per_wave, &block_m, &l1_n, &l2_n, &workers) != 6) return 3;
            const auto tokens = read_n(e_l);
            for (unsigned int w = 0; w < workers; ++w) {
                moe_sched::WaveScheduler scheduler;
                scheduler.init(tokens.data(), e_l, per_wave, block_m, l1_n, l2_n, w, workers);
                std::printf("worker %u\n", w);
                moe_sched::Block b;
                while (scheduler.next(b))
                    std::printf("%u %u %u %u %u\n", b.layer, b.wave, b.local_expert, b.m_block, b.n_block);
            }
        } else if (!std::strcmp(command, "peel")) {
            unsigned int num_ranks;
            if (std::scanf("%u", &num_ranks) != 1) return 3;
            const auto counts = read_n(num_ranks);
            unsigned int rank, index;
            for (unsigned int slot = 0; moe_sched::peel_interleave_slot(counts.data(), num_ranks, slot, rank, index); ++slot)
                std::printf("%u %u\n", rank, index);
        } else if (!std::strcmp(command, "pool")) {
            unsigned int block_m, e_l;
            if (std::scanf("%u %u", &block_m, &e_l) != 2) return 3;
            const auto tokens = read_n(e_l);
            for (unsigned int e = 0; e <= e_l; ++e)
                std::printf("%llu\n", moe_sched::pool_offset(tokens.data(), e, block_m));
        } else {
            return 2;
        }
        std::printf("end\n");
    }
    return 0;
}
