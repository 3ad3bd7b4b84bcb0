// Host build of cuda/symm_buffer.cuh (g++): its static_asserts must hold, and map() must agree
// with the Rust SymmBuffer read from the bytes Rust wrote. Usage: prog VIEW_FILE PTR
// prints the mapped address of PTR for every rank, one hex number a line.
#define __device__
#define __forceinline__ inline
#include "../../cuda/symm_buffer.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    symm_mem::SymmBuffer view;
    FILE* f = std::fopen(argv[1], "rb");
    if (!f || std::fread(&view, sizeof view, 1, f) != 1) return 3;
    std::fclose(f);
    char* ptr = reinterpret_cast<char*>(std::strtoull(argv[2], nullptr, 16));
    std::printf("%u %u\n", view.rank, view.num_ranks);
    for (unsigned int r = 0; r < view.num_ranks; ++r)
        std::printf("%llx\n", (unsigned long long)view.map(ptr, r));
    return 0;
}
