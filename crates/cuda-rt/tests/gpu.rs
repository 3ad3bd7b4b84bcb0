//! cuda-rt on a real GPU: every launch kind, TMA, peer access, timing. Ignored by default; run with
//! `cargo xtask test-gpu` or from `cargo xtask gpu-bundle`. Without a GPU they fail, they do not skip.

use cuda_rt::cudarc::driver::{DevicePtr, DevicePtrMut};
use cuda_rt::{
    Arch, CudaSlice, Error, Gpu, GpuTimer, Jit, LaunchArgs, LaunchConfig, Module, TensorMapDesc,
    TmaDataType, enable_peer_access_all, selftest,
};

fn gpu(ordinal: usize) -> Gpu {
    Gpu::open(ordinal).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

/// The selftest kernels, compiled for `gpu` and loaded.
fn selftest_module(gpu: &Gpu) -> Module {
    let arch = gpu.info().arch().unwrap_or_else(|| {
        panic!(
            "no target for {:?} (compute capability {:?})",
            gpu.info().name,
            gpu.info().compute_capability
        )
    });
    let compiled = Jit::new()
        .unwrap()
        .compile(&selftest::kernels()[0], arch)
        .unwrap();
    gpu.load_module(&compiled.cubin).unwrap()
}

/// Deterministic f32s in [-1, 1) (SplitMix64).
fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A device buffer of `n` elements with every byte 0xFF (NaN for f32), so unwritten outputs show.
fn poisoned<T: cuda_rt::cudarc::driver::DeviceRepr + cuda_rt::cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    n: usize,
) -> CudaSlice<T> {
    let mut buf = gpu.alloc_zeros::<T>(n).unwrap();
    gpu.memset(&mut buf, 0xFF).unwrap();
    buf
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn open_reports_device_properties() {
    let devices = Gpu::list().unwrap();
    let gpu = gpu(0);
    let info = gpu.info();
    eprintln!("{devices:#?}");
    assert_eq!(info, &devices[0]);
    assert!(!info.name.is_empty());
    assert!(info.sm_count > 0 && info.l2_bytes > 0 && info.total_mem_bytes > 0);
    assert!(info.smem_per_block_optin >= 48 * 1024);
    assert!(info.compute_capability >= (9, 0), "{info:?}");
    assert!(info.arch().is_some());
    assert!(matches!(
        Gpu::open(devices.len()),
        Err(Error::InvalidOrdinal { .. })
    ));
}

/// Arguments assembled once launch again with one rewritten in place (`Kernel::launch_with`),
/// each launch computing with the values it was given.
#[test]
#[ignore = "needs a CUDA GPU"]
fn prepared_arguments_launch_again_with_one_rewritten() {
    let gpu = gpu(0);
    let module = selftest_module(&gpu);
    let saxpy = module.kernel("saxpy").unwrap();
    let n = 1000;
    let (x, y) = (random_f32(n, 3), random_f32(n, 4));
    let (dx, dy) = (gpu.upload(&x).unwrap(), gpu.upload(&y).unwrap());
    let mut outs = [poisoned::<f32>(&gpu, n), poisoned::<f32>(&gpu, n)];
    let stream = gpu.stream();
    let mut args = LaunchArgs::new();
    let a_arg = args.push(&0f32);
    args.push(&dx.device_ptr(stream).0);
    args.push(&dy.device_ptr(stream).0);
    let out_arg = args.push(&0u64);
    args.push(&(n as i32));
    let config = LaunchConfig::linear((n as u32).div_ceil(256), 256);
    for (a, out) in [0.5f32, -2.0].into_iter().zip(&mut outs) {
        args.set(a_arg, &a);
        args.set(out_arg, &out.device_ptr_mut(stream).0);
        // SAFETY: saxpy(float, const float*, const float*, float*, int) over n elements of
        // buffers that live until the download below.
        unsafe { saxpy.launch_with(stream, config, &args).unwrap() };
    }
    for (a, out) in [0.5f32, -2.0].into_iter().zip(&outs) {
        let out = gpu.download(out).unwrap();
        for i in 0..n {
            assert_eq!(
                out[i].to_bits(),
                a.mul_add(x[i], y[i]).to_bits(),
                "a = {a}, element {i}"
            );
        }
    }
}

/// Every device allocation through a handle is counted, its clones' too; copies into a buffer,
/// memsets and downloads are not allocations.
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_allocations_are_counted() {
    let gpu = gpu(0);
    let before = gpu.device_allocations();
    let mut a = gpu.alloc_zeros::<u32>(16).unwrap();
    let b = gpu.clone().upload(&[1u32; 16]).unwrap();
    assert_eq!(gpu.device_allocations(), before + 2);
    gpu.upload_into(&[2u32; 8], &mut a).unwrap();
    gpu.memset(&mut a, 0).unwrap();
    gpu.download(&b).unwrap();
    assert_eq!(gpu.device_allocations(), before + 2);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn saxpy_matches_the_host_and_writes_every_element() {
    let gpu = gpu(0);
    let module = selftest_module(&gpu);
    let saxpy = module.kernel("saxpy").unwrap();
    let n = (1 << 20) + 3;
    let (a, x, y) = (1.5f32, random_f32(n, 1), random_f32(n, 2));
    let (dx, dy) = (gpu.upload(&x).unwrap(), gpu.upload(&y).unwrap());
    let mut out = poisoned::<f32>(&gpu, n);
    let timer = GpuTimer::new(&gpu).unwrap();
    timer.start(gpu.stream()).unwrap();
    // SAFETY: saxpy(float, const float*, const float*, float*, int) over n elements.
    unsafe {
        saxpy
            .launch(
                gpu.stream(),
                LaunchConfig::linear((n as u32).div_ceil(256), 256),
            )
            .scalar(a)
            .ptr(&dx)
            .ptr(&dy)
            .ptr_mut(&mut out)
            .scalar(n as i32)
            .launch()
            .unwrap();
    }
    timer.stop(gpu.stream()).unwrap();
    let ms = timer.elapsed_ms().unwrap();
    assert!(ms > 0.0 && ms < 1000.0, "{ms} ms");
    let out = gpu.download(&out).unwrap();
    for i in 0..n {
        // NVRTC contracts a * x + y into one FMA.
        assert_eq!(
            out[i].to_bits(),
            a.mul_add(x[i], y[i]).to_bits(),
            "element {i}"
        );
    }
    assert!(saxpy.num_registers().unwrap() > 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cooperative_launch_runs_all_blocks_at_once() {
    let gpu = gpu(0);
    let module = selftest_module(&gpu);
    let kernel = module.kernel("grid_barrier").unwrap();
    let blocks = gpu.info().sm_count;
    let mut counter = gpu.alloc_zeros::<u32>(1).unwrap();
    let mut out = poisoned::<u32>(&gpu, blocks as usize);
    // SAFETY: grid_barrier(unsigned*, unsigned*) with one output per block.
    unsafe {
        kernel
            .launch(gpu.stream(), LaunchConfig::linear(blocks, 32).cooperative())
            .ptr_mut(&mut counter)
            .ptr_mut(&mut out)
            .launch()
            .unwrap();
    }
    assert!(gpu.download(&out).unwrap().iter().all(|&v| v == blocks));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn split_shares_run_waiting_grids_side_by_side_on_their_own_sms() {
    let whole = gpu(0).info().clone();
    for parts in [2usize, 4] {
        let shares = Gpu::split(0, parts).unwrap();
        assert_eq!(shares.len(), parts);
        let per_share = shares[0].info().sm_count;
        assert!(
            shares.iter().all(|g| g.info().sm_count == per_share)
                && per_share > 0
                && per_share as usize * parts <= whole.sm_count as usize,
            "{parts} shares of {per_share} SMs on {} SMs",
            whole.sm_count
        );
        // The same shares again (they live as long as the process).
        assert_eq!(Gpu::split(0, parts).unwrap()[0].info().sm_count, per_share);
        // One module of the device's context serves every share.
        let module = selftest_module(&shares[0]);
        let kernel = module.kernel("smid_rendezvous").unwrap();
        // One block per SM: most of an SM's shared memory each.
        let smem = whole.smem_per_block_optin - 1024;
        kernel.reserve_dynamic_smem(smem).unwrap();
        // Grid s waits for grid s + 1 (the last for the first): every grid must be resident.
        let started = shares[0].alloc_zeros::<u32>(parts).unwrap();
        let base = started.device_ptr(shares[0].stream()).0;
        let mut sms: Vec<CudaSlice<u32>> = shares
            .iter()
            .map(|g| poisoned::<u32>(g, per_share as usize))
            .collect();
        // The counters are zeroed on share 0's stream; the other shares' grids read them.
        shares[0].synchronize().unwrap();
        for (s, (share, sm)) in shares.iter().zip(&mut sms).enumerate() {
            let mine = base + 4 * s as u64;
            let theirs = base + 4 * ((s + 1) % parts) as u64;
            // SAFETY: smid_rendezvous(sm[blocks], mine, theirs, expected, timeout_ns); the counters
            // are two words of `started`, which outlives the launches (synchronized below).
            unsafe {
                kernel
                    .launch(
                        share.stream(),
                        LaunchConfig::linear(per_share, 32).dynamic_smem(smem),
                    )
                    .ptr_mut(sm)
                    .scalar(mine)
                    .scalar(theirs)
                    .scalar(per_share)
                    .scalar(2_000_000_000u64)
                    .launch()
                    .unwrap();
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (s, (share, sm)) in shares.iter().zip(&sms).enumerate() {
            share.synchronize().unwrap();
            let ids = share.download(sm).unwrap();
            assert!(
                ids.iter().all(|&id| id != u32::MAX),
                "{parts} shares: share {s}'s grid waited in vain: not resident with share {}'s",
                (s + 1) % parts
            );
            let distinct: std::collections::HashSet<u32> = ids.iter().copied().collect();
            assert_eq!(
                distinct.len(),
                per_share as usize,
                "share {s}: one block per SM"
            );
            assert!(
                distinct.iter().all(|id| seen.insert(*id)),
                "{parts} shares: share {s}'s SMs overlap another share's: {ids:?}"
            );
        }
        drop(started);
        eprintln!("{parts} shares of {per_share} SMs: grids resident side by side on disjoint SMs");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cluster_launch_forms_clusters_of_two() {
    let gpu = gpu(0);
    let module = selftest_module(&gpu);
    let kernel = module.kernel("cluster_ranks").unwrap();
    let blocks = 16u32;
    let mut out = poisoned::<u32>(&gpu, blocks as usize);
    // SAFETY: cluster_ranks(unsigned*) with one output per block.
    unsafe {
        kernel
            .launch(
                gpu.stream(),
                LaunchConfig::linear(blocks, 64).cluster([2, 1, 1]),
            )
            .ptr_mut(&mut out)
            .launch()
            .unwrap();
    }
    let out = gpu.download(&out).unwrap();
    for (b, &v) in out.iter().enumerate() {
        let rank = b as u32 % 2;
        assert_eq!(v, rank | 2 << 8 | (rank ^ 1) << 16, "block {b}: {v:#x}");
    }
    // A grid that does not divide into clusters is refused before the driver sees it.
    let bad = unsafe {
        kernel
            .launch(gpu.stream(), LaunchConfig::linear(3, 64).cluster([2, 1, 1]))
            .ptr_mut(&mut gpu.alloc_zeros::<u32>(4).unwrap())
            .launch()
    };
    assert!(matches!(bad, Err(Error::InvalidLaunch { .. })), "{bad:?}");
    // Resident clusters: blocks that fill an SM's shared memory pair up over two SMs at most.
    let sms = gpu.info().sm_count;
    let whole_sm = LaunchConfig::linear(2, 64)
        .dynamic_smem(200 * 1024)
        .cluster([2, 1, 1]);
    let clusters = kernel.max_active_clusters(&whole_sm).unwrap();
    assert!(
        clusters >= sms / 4 && clusters <= sms / 2,
        "{clusters} clusters of two on {sms} SMs"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn dynamic_shared_memory_above_48_kib() {
    let gpu = gpu(0);
    let module = selftest_module(&gpu);
    let kernel = module.kernel("smem_reverse").unwrap();
    let bytes = 200 * 1024;
    assert!(gpu.info().smem_per_block_optin >= bytes);
    let words = bytes / 4;
    let mut out = poisoned::<u32>(&gpu, words as usize);
    // SAFETY: smem_reverse(unsigned*, unsigned) with `words` words of dynamic shared memory.
    unsafe {
        kernel
            .launch(
                gpu.stream(),
                LaunchConfig::linear(1, 256).dynamic_smem(bytes),
            )
            .ptr_mut(&mut out)
            .scalar(words)
            .launch()
            .unwrap();
    }
    let out = gpu.download(&out).unwrap();
    for (i, &v) in out.iter().enumerate() {
        assert_eq!(
            v,
            (words - 1 - i as u32).wrapping_mul(2654435761),
            "word {i}"
        );
    }
    let too_much = gpu.info().smem_per_block_optin + 1;
    let err = unsafe {
        kernel
            .launch(
                gpu.stream(),
                LaunchConfig::linear(1, 256).dynamic_smem(too_much),
            )
            .ptr_mut(&mut gpu.alloc_zeros::<u32>(1).unwrap())
            .scalar(0u32)
            .launch()
    };
    assert!(matches!(err, Err(Error::InvalidLaunch { .. })), "{err:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tma_loads_tiles_and_zero_fills_past_the_edge() {
    let gpu = gpu(0);
    let module = selftest_module(&gpu);
    let kernel = module.kernel("tma_load_2d").unwrap();
    let [box_rows, box_cols] = selftest::TMA_BOX;
    // 100 rows: the last tile hangs 12 rows past the matrix.
    let (rows, cols) = (100u32, 3 * box_cols);
    let host = random_f32((rows * cols) as usize, 3);
    let matrix = gpu.upload(&host).unwrap();
    let address = {
        use cuda_rt::cudarc::driver::DevicePtr;
        let (ptr, _sync) = matrix.device_ptr(gpu.stream());
        ptr
    };
    let map = TensorMapDesc::matrix(
        TmaDataType::F32,
        address,
        [u64::from(rows), u64::from(cols)],
        u64::from(cols) * 4,
        [box_rows, box_cols],
    )
    .encode()
    .unwrap();
    let tiles = [cols / box_cols, rows.div_ceil(box_rows)];
    let padded_rows = tiles[1] * box_rows;
    let mut out = poisoned::<f32>(&gpu, (padded_rows * cols) as usize);
    // SAFETY: tma_load_2d(CUtensorMap, float*) writing whole tiles of a padded_rows × cols matrix.
    unsafe {
        kernel
            .launch(
                gpu.stream(),
                LaunchConfig::new([tiles[0], tiles[1], 1], [128, 1, 1]),
            )
            .tensor_map(&map)
            .ptr_mut(&mut out)
            .launch()
            .unwrap();
    }
    let out = gpu.download(&out).unwrap();
    for r in 0..padded_rows {
        for c in 0..cols {
            let got = out[(r * cols + c) as usize];
            let want = if r < rows {
                host[(r * cols + c) as usize]
            } else {
                0.0
            };
            assert_eq!(got.to_bits(), want.to_bits(), "row {r} col {c}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn peer_access_lets_one_gpu_read_another() {
    if !cuda_rt::testing::gpus_or_skip(2) {
        return;
    }
    let gpus = [gpu(0), gpu(1)];
    if !gpus[0].can_access_peer(&gpus[1]).unwrap() {
        eprintln!("SKIP: GPU 0 cannot access GPU 1");
        return;
    }
    enable_peer_access_all(&gpus).unwrap();
    // Enabling again is not an error.
    enable_peer_access_all(&gpus).unwrap();

    // saxpy on GPU 0 with x living on GPU 1, passed as a raw peer address.
    let n = 4096;
    let (x, y) = (random_f32(n, 4), random_f32(n, 5));
    let x1 = gpus[1].upload(&x).unwrap();
    gpus[1].synchronize().unwrap();
    let x1_address = {
        use cuda_rt::cudarc::driver::DevicePtr;
        let (ptr, _sync) = x1.device_ptr(gpus[1].stream());
        ptr
    };
    let module = selftest_module(&gpus[0]);
    let saxpy = module.kernel("saxpy").unwrap();
    let y0 = gpus[0].upload(&y).unwrap();
    let mut out = poisoned::<f32>(&gpus[0], n);
    // SAFETY: as in the saxpy test; x is GPU 1's buffer, mapped into GPU 0 by peer access.
    unsafe {
        saxpy
            .launch(
                gpus[0].stream(),
                LaunchConfig::linear((n as u32).div_ceil(256), 256),
            )
            .scalar(2.0f32)
            .scalar(x1_address)
            .ptr(&y0)
            .ptr_mut(&mut out)
            .scalar(n as i32)
            .launch()
            .unwrap();
    }
    let out = gpus[0].download(&out).unwrap();
    for i in 0..n {
        assert_eq!(
            out[i].to_bits(),
            2.0f32.mul_add(x[i], y[i]).to_bits(),
            "element {i}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cubin_for_another_arch_is_refused_by_the_driver() {
    let gpu = gpu(0);
    let other = match gpu.info().arch() {
        Some(Arch::Sm90a) => Arch::Sm100a,
        _ => Arch::Sm90a,
    };
    let compiled = Jit::new()
        .unwrap()
        .compile(&selftest::kernels()[0], other)
        .unwrap();
    let err = gpu.load_module(&compiled.cubin).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Driver {
                call: "cuModuleLoadData",
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        gpu.load_module(b"not a cubin"),
        Err(Error::InvalidModule(_))
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vmm_memory_exports_imports_and_maps_twice() {
    use cuda_rt::SharedMemory;
    let gpu = gpu(0);
    let granularity = SharedMemory::granularity(&gpu).unwrap();
    assert!(granularity.is_power_of_two(), "{granularity}");
    let memory = SharedMemory::create(&gpu, granularity + 1).unwrap();
    assert_eq!(memory.bytes(), 2 * granularity);
    let first = memory.map(&[&gpu]).unwrap();
    let pattern: Vec<u8> = (0..memory.bytes()).map(|i| (i * 7 % 251) as u8).collect();
    // SAFETY: every access below stays inside a live mapping of memory.bytes() bytes.
    unsafe { gpu.write_raw(first.ptr(), &pattern).unwrap() };

    // What another process would do with the fd: import it and map it at a second address.
    let fd = memory.export_fd().unwrap();
    let imported =
        SharedMemory::import_fd(&gpu, std::os::fd::AsFd::as_fd(&fd), memory.bytes()).unwrap();
    drop(fd);
    let second = imported.map(&[&gpu]).unwrap();
    assert_ne!(second.ptr(), first.ptr());
    let mut back = vec![0u8; memory.bytes()];
    unsafe { gpu.read_raw(second.ptr(), &mut back).unwrap() };
    assert!(
        back == pattern,
        "the second mapping sees the first one's bytes"
    );

    // memset through one mapping, a copy-engine copy between the two, read through the first.
    unsafe {
        gpu.memset_raw(second.ptr() + 4096, 4096, 0xAB).unwrap();
        gpu.copy_peer_raw(first.ptr(), &gpu, second.ptr() + 4096, 16)
            .unwrap();
        gpu.read_raw(first.ptr(), &mut back[..32]).unwrap();
    }
    assert_eq!(&back[..16], &[0xAB; 16]);
    assert_eq!(&back[16..32], &pattern[16..32]);
    // The memory outlives both handles while a mapping remains.
    drop((memory, imported, first));
    unsafe { gpu.read_raw(second.ptr() + 4096, &mut back[..4]).unwrap() };
    assert_eq!(&back[..4], &[0xAB; 4]);
}
