//! `symm_buffer.cuh` through NVRTC (no GPU needed, the CUDA toolkit is: see
//! scripts/cuda-toolchain.sh), and on a GPU (ignored by default; `cargo xtask test-gpu`): the bytes
//! of a Rust `SymmBuffer`, read by the kernel as its own struct and mapped onto real allocations
//! standing in for ranks, must land every store in the right buffer.

use cuda_rt::cudarc::driver::DevicePtr;
use cuda_rt::{Arch, Gpu, Jit, KernelSpec, LaunchConfig};
use symm_mem::{CUDA_HEADER, SymmBuffer};

const PROBE: &str = r#"
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
        fields[4] = sizeof(symm_mem::TokenSrc);
    }
}
"#;

fn spec() -> KernelSpec {
    KernelSpec::new("symm-mem/probe", ("symm_probe.cu", PROBE)).header(CUDA_HEADER)
}

fn jit() -> Jit {
    Jit::new().unwrap_or_else(|e| {
        panic!("{e}\nNVRTC tests need the CUDA toolkit: run scripts/cuda-toolchain.sh first")
    })
}

#[test]
fn header_compiles_with_nvrtc_for_every_arch() {
    let jit = jit();
    for arch in Arch::ALL {
        let compiled = jit
            .compile(&spec(), arch)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(
            compiled.cubin.starts_with(b"\x7fELF"),
            "{arch}: not a cubin"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_view_maps_onto_every_rank() {
    let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    let arch = gpu.info().arch().expect("a supported GPU");
    let module = gpu
        .load_module(&jit().compile(&spec(), arch).unwrap().cubin)
        .unwrap();
    let kernel = module.kernel("store_to_every_rank").unwrap();

    // Five allocations on one GPU stand in for five ranks' buffers.
    const RANKS: usize = 5;
    const WORDS: usize = 1024;
    let offset = 4 * 777u64;
    let buffers: Vec<_> = (0..RANKS)
        .map(|_| gpu.alloc_zeros::<u32>(WORDS).unwrap())
        .collect();
    let bases: Vec<u64> = buffers
        .iter()
        .map(|b| b.device_ptr(gpu.stream()).0)
        .collect();
    for rank in [0, 3] {
        let view = SymmBuffer::new(rank, &bases).unwrap();
        let d_view = gpu.upload(bytemuck::bytes_of(&view)).unwrap();
        let mut fields = gpu.alloc_zeros::<u64>(5).unwrap();
        // SAFETY: store_to_every_rank(const SymmBuffer*, u64, u64*): each rank's buffer has WORDS
        // words and offset / 4 < WORDS; fields has 5 entries.
        unsafe {
            kernel
                .launch(gpu.stream(), LaunchConfig::linear(1, 128))
                .ptr(&d_view)
                .scalar(offset)
                .ptr_mut(&mut fields)
                .launch()
                .unwrap();
        }
        gpu.synchronize().unwrap();
        let fields = gpu.download(&fields).unwrap();
        assert_eq!(
            fields,
            [bases[rank as usize], u64::from(rank), RANKS as u64, 592, 8]
        );
        for (r, buffer) in buffers.iter().enumerate() {
            let words = gpu.download(buffer).unwrap();
            assert_eq!(
                words[offset as usize / 4],
                256 * rank + r as u32 + 1,
                "rank {r}'s buffer"
            );
            assert_eq!(
                words.iter().filter(|&&w| w != 0).count(),
                1,
                "one store per buffer"
            );
        }
    }
}
