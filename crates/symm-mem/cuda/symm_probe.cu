// symm_probe.cu -- kernels the GPU tests of `symm-mem` run its device twin with (compiled by
// `cargo xtask kernels` for every target).
#include "symm_buffer.cuh"

// Thread r stores 256·rank + r + 1 at `offset` in rank r's buffer, reached from this rank's pointer; thread 0
// also reports the fields and the struct size as the kernel sees them. The view comes through global
// memory: cuda-rt's launcher passes at most 128 bytes by value.
extern "C" __global__ void store_to_every_rank(const symm_mem::SymmBuffer* view_in_memory,
                                               unsigned long long offset, unsigned long long* fields) {
    const symm_mem::SymmBuffer view = *view_in_memory;
    const unsigned int r = threadIdx.x;
    if (r < view.num_ranks)
        *view.map(view.at<unsigned int>(offset), r) = 256 * view.rank + r + 1;
    if (r == 0) {
        fields[0] = view.base;
        fields[1] = view.rank;
        fields[2] = view.num_ranks;
        fields[3] = sizeof(symm_mem::SymmBuffer);
    }
}
