//! The CUDA twin, built for the host with g++ and fed a few hundred random cases: its wave
//! scheduler, interleave and pool offsets must print exactly what the Rust model computes.
//! Needs g++ (every machine of this project has it).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use moe_sched::{ScheduleShape, WaveSchedule, peel_interleave};

/// xorshift64: reproducible cases without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }

    fn counts(&mut self, len: u32, max: u32) -> Vec<u32> {
        // A third of the entries zero, so empty experts and ranks are common.
        (0..len)
            .map(|_| {
                if self.below(3) == 0 {
                    0
                } else {
                    self.below(max + 1)
                }
            })
            .collect()
    }
}

fn join(values: &[u32]) -> String {
    values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn header_agrees_with_rust() {
    let exe = cuda_rt::testing::build_host_twin(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/twin/scheduler_host.cpp"),
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("moe-sched-twin"),
    );

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut input = String::new();
    let mut expected = String::new();
    for _ in 0..150 {
        let e_l = 1 + rng.below(12);
        let shape = ScheduleShape {
            block_m: 8 * (1 + rng.below(8)),
            l1_n_blocks: 1 + rng.below(6),
            l2_n_blocks: 1 + rng.below(6),
            num_experts_per_wave: 1 + rng.below(e_l + 2),
        };
        let workers = 1 + rng.below(40);
        let tokens = rng.counts(e_l, 200);
        writeln!(
            input,
            "sched {e_l} {} {} {} {} {workers} {}",
            shape.num_experts_per_wave,
            shape.block_m,
            shape.l1_n_blocks,
            shape.l2_n_blocks,
            join(&tokens)
        )
        .unwrap();
        let schedule = WaveSchedule::new(shape, &tokens).unwrap();
        for w in 0..workers {
            writeln!(expected, "worker {w}").unwrap();
            for b in schedule.worker(w, workers) {
                let (layer, wave, e, m, n) =
                    (b.layer as u8, b.wave, b.local_expert, b.m_block, b.n_block);
                writeln!(expected, "{layer} {wave} {e} {m} {n}").unwrap();
            }
        }
        expected.push_str("end\n");

        let num_ranks = 1 + rng.below(72);
        let counts = rng.counts(num_ranks, 30);
        writeln!(input, "peel {num_ranks} {}", join(&counts)).unwrap();
        for (rank, index) in peel_interleave(&counts) {
            writeln!(expected, "{rank} {index}").unwrap();
        }
        expected.push_str("end\n");

        let block_m = shape.block_m;
        writeln!(input, "pool {block_m} {e_l} {}", join(&tokens)).unwrap();
        let mut offset = 0u64;
        for &t in tokens.iter().chain([&0]) {
            writeln!(expected, "{offset}").unwrap();
            offset += u64::from(t.div_ceil(block_m) * block_m);
        }
        expected.push_str("end\n");
    }

    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "twin exited with {}", out.status);
    let got = String::from_utf8(out.stdout).unwrap();
    if got != expected {
        let line = got.lines().zip(expected.lines()).position(|(a, b)| a != b);
        panic!("twin and model differ at output line {line:?}");
    }
}
