//! `symm_buffer.cuh` on a GPU (ignored by default; `cargo xtask test-gpu`; `cargo xtask kernels` compiles the
//! probe for every target): the bytes
//! of a Rust `SymmBuffer`, read by the kernel as its own struct and mapped onto real allocations
//! standing in for ranks, must land every store in the right buffer.

use cuda_rt::cudarc::driver::DevicePtr;
use cuda_rt::{KernelSpec, LaunchConfig};
use symm_mem::{CUDA_HEADER, SymmBuffer};

fn spec() -> KernelSpec {
    KernelSpec::new("symm-mem/probe", symm_mem::PROBE_SOURCE).header(CUDA_HEADER)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_view_maps_onto_every_rank() {
    let (gpu, module) = cuda_rt::testing::gpu_with_module(&spec());
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
        let mut fields = gpu.alloc_zeros::<u64>(4).unwrap();
        // SAFETY: store_to_every_rank(const SymmBuffer*, u64, u64*): each rank's buffer has WORDS
        // words and offset / 4 < WORDS; fields has 4 entries.
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
            [bases[rank as usize], u64::from(rank), RANKS as u64, 592]
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
