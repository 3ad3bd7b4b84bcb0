//! The CUDA twin, built for the host with g++: `symm_buffer.cuh`'s static_asserts must compile,
//! and its `SymmBuffer::map`, fed the bytes of a Rust `SymmBuffer`, must give Rust's addresses.
//! Needs g++ (every machine of this project has it).

use std::path::Path;
use std::process::Command;

use symm_mem::SymmBuffer;

#[test]
fn header_agrees_with_rust() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("symm-mem-twin");
    let exe = cuda_rt::testing::build_host_twin(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/twin/symm_buffer_host.cpp"),
        &dir,
    );

    let bases: Vec<u64> = (0..72u64)
        .map(|r| 0x7f00_0000_0000 - r * 0x1_2345_6000 + (r % 3) * 0x8000_0000_0000)
        .collect();
    for (rank, num_ranks) in [(0u32, 1usize), (3, 8), (71, 72)] {
        let view = SymmBuffer::new(rank, &bases[..num_ranks]).unwrap();
        let view_file = dir.join(format!("view_{rank}_{num_ranks}.bin"));
        std::fs::write(&view_file, bytemuck::bytes_of(&view)).unwrap();
        let ptr = view.base + 0x1234_5670;
        let out = Command::new(&exe)
            .arg(&view_file)
            .arg(format!("{ptr:x}"))
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next().unwrap(), format!("{rank} {num_ranks}"));
        let mapped: Vec<u64> = lines.map(|l| u64::from_str_radix(l, 16).unwrap()).collect();
        let expected: Vec<u64> = (0..num_ranks as u32).map(|r| view.map(ptr, r)).collect();
        assert_eq!(mapped, expected);
        assert_eq!(expected[num_ranks - 1], bases[num_ranks - 1] + 0x1234_5670);
    }
}
