//! Worlds. Without a GPU: torchrun's variables, the rendezvous (fake peers as threads, and real
//! processes passing fds), its failures (a rank that never arrives, one that dies, a wrong world
//! size), and the launcher. On a GPU (ignored by default; `cargo xtask test-gpu`): every rank writes a
//! pattern into every peer's buffer through the SymmBuffer view and checks what the others wrote
//! into its own, for the local world (1 and 2 GPUs) and the multi-process one (2 GPUs, this test
//! binary launched twice).

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cuda_rt::{Jit, KernelSpec, LaunchConfig};
use symm_mem::world::{Rendezvous, is_test_rank, spawn_test_ranks};
use symm_mem::{CUDA_HEADER, ProcessEnv, World, WorldError, spawn_ranks};

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

const TORCHRUN: [(&str, &str); 5] = [
    ("RANK", "1"),
    ("WORLD_SIZE", "2"),
    ("LOCAL_RANK", "1"),
    ("MASTER_ADDR", "127.0.0.1"),
    ("MASTER_PORT", "29500"),
];

#[test]
fn process_env_reads_torchrun_variables() {
    let env = ProcessEnv::from_lookup(vars(&TORCHRUN)).unwrap();
    assert_eq!(
        (env.rank, env.world_size, env.local_rank, env.master_port),
        (1, 2, 1, 29500)
    );
    assert_eq!(env.timeout, ProcessEnv::DEFAULT_TIMEOUT);
    assert!(
        env.socket_path()
            .ends_with("megamoe-world-127.0.0.1-29500.sock")
    );
    // What a launcher sets reads back as the same rank.
    let set: Vec<(String, String)> = env
        .vars()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    let pairs: Vec<(&str, &str)> = set.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(ProcessEnv::from_lookup(vars(&pairs)).unwrap(), env);

    let mut no_local = TORCHRUN.to_vec();
    no_local.retain(|(k, _)| *k != "LOCAL_RANK");
    no_local.push(("MEGAMOE_WORLD_TIMEOUT_S", "2.5"));
    no_local.push(("MASTER_ADDR", "node/0:x"));
    let env = ProcessEnv::from_lookup(vars(&no_local)).unwrap();
    assert_eq!(env.local_rank, 1, "LOCAL_RANK defaults to RANK");
    assert_eq!(env.gpu, 1, "the GPU defaults to LOCAL_RANK");
    let mut shared = TORCHRUN.to_vec();
    shared.push(("MEGAMOE_GPU", "0"));
    let env = ProcessEnv::from_lookup(vars(&shared)).unwrap();
    assert_eq!((env.local_rank, env.gpu), (1, 0), "ranks may share a GPU");
    let env = ProcessEnv::from_lookup(vars(&no_local)).unwrap();
    assert_eq!(env.timeout, Duration::from_millis(2500));
    assert!(
        env.socket_path()
            .ends_with("megamoe-world-node_0_x-29500.sock")
    );
}

#[test]
fn process_env_refuses_what_it_cannot_use() {
    let with = |key: &'static str, value: Option<&'static str>| {
        let mut pairs: Vec<(&str, &str)> = TORCHRUN
            .iter()
            .filter(|(k, _)| *k != key)
            .copied()
            .collect();
        if let Some(v) = value {
            pairs.push((key, v));
        }
        ProcessEnv::from_lookup(vars(&pairs)).unwrap_err()
    };
    let cases = [
        (with("RANK", None), "RANK", "not set"),
        (with("MASTER_PORT", None), "MASTER_PORT", "torchrun"),
        (with("RANK", Some("2")), "RANK", "not below WORLD_SIZE"),
        (with("WORLD_SIZE", Some("73")), "WORLD_SIZE", "1..=72"),
        (
            with("WORLD_SIZE", Some("two")),
            "WORLD_SIZE",
            "cannot parse",
        ),
        (
            with("LOCAL_WORLD_SIZE", Some("1")),
            "LOCAL_WORLD_SIZE",
            "one host",
        ),
        (
            with("MASTER_PORT", Some("70000")),
            "MASTER_PORT",
            "cannot parse",
        ),
        (
            with("MEGAMOE_WORLD_TIMEOUT_S", Some("0")),
            "MEGAMOE_WORLD_TIMEOUT_S",
            "positive",
        ),
    ];
    for (err, var, words) in cases {
        let message = err.to_string();
        assert!(
            matches!(&err, WorldError::Env { var: v, .. } if *v == var) && message.contains(words),
            "{var}: {message}"
        );
    }
}

#[test]
fn local_world_refuses_bad_ordinal_sets_before_touching_a_gpu() {
    // No rank, or more than MAX_RANKS. (A repeated ordinal is ranks sharing a GPU: allowed, run by
    // megamoe's `ranks_sharing_one_gpu_every_route`.)
    for ordinals in [&[][..], &[0; 73]] {
        let err = World::local(ordinals).unwrap_err();
        assert!(matches!(err, WorldError::BadOrdinals(_)), "{err}");
    }
}

/// A socket path of its own for each test.
fn socket_path(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    std::env::temp_dir().join(format!(
        "symm-mem-{tag}-{}-{nanos}.sock",
        std::process::id()
    ))
}

/// A file that holds `text`, as an fd (what a rank hands its peers in place of a VMM export).
fn fd_with(text: &str) -> OwnedFd {
    let path = std::env::temp_dir().join(format!(
        "symm-mem-fd-{}-{text}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file.into()
}

/// Reads at offset 0: every copy of a passed fd shares one file position, so no seek-and-read.
fn read_fd(fd: OwnedFd) -> String {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0u8; 256];
    let n = std::fs::File::from(fd).read_at(&mut bytes, 0).unwrap();
    String::from_utf8(bytes[..n].to_vec()).unwrap()
}

/// One rank of the exchange below: 50 all-gathers of bytes and one fd each, then barriers.
fn exchange_rounds(rendezvous: &mut Rendezvous) {
    let (rank, size) = (rendezvous.rank(), rendezvous.size());
    for round in 0..50 {
        let text = format!("rank{rank}round{round}");
        let all = rendezvous
            .all_gather("test exchange", text.as_bytes(), vec![fd_with(&text)])
            .unwrap();
        assert_eq!(all.len(), size);
        for (r, mut c) in all.into_iter().enumerate() {
            let want = format!("rank{r}round{round}");
            assert_eq!(c.bytes, want.as_bytes());
            assert_eq!(c.fds.len(), 1);
            assert_eq!(
                read_fd(c.fds.pop().unwrap()),
                want,
                "rank {rank} reading rank {r}'s fd"
            );
        }
    }
    for _ in 0..100 {
        rendezvous.barrier("test barrier").unwrap();
    }
}

#[test]
fn rendezvous_relays_bytes_and_fds_between_threads() {
    let path = socket_path("threads");
    std::thread::scope(|s| {
        for rank in (0..4).rev() {
            let path = &path;
            s.spawn(move || {
                let mut rv =
                    Rendezvous::connect_at(path, rank, 4, Duration::from_secs(20)).unwrap();
                exchange_rounds(&mut rv);
            });
        }
    });
    assert!(
        !path.exists(),
        "rank 0 removes the socket once everyone is in"
    );
    // A world of one needs no socket at all.
    let mut alone =
        Rendezvous::connect_at(&socket_path("alone"), 0, 1, Duration::from_secs(1)).unwrap();
    exchange_rounds(&mut alone);
}

#[test]
fn rendezvous_relays_fds_between_processes() {
    const TEST: &str = "rendezvous_relays_fds_between_processes";
    if is_test_rank(TEST) {
        let mut rv = Rendezvous::connect(&ProcessEnv::from_env().unwrap()).unwrap();
        exchange_rounds(&mut rv);
        return;
    }
    let outputs =
        spawn_test_ranks(TEST, 3, 1, Duration::from_secs(20), Duration::from_secs(60)).unwrap();
    for output in &outputs {
        assert!(output.passed_its_test(), "{output}");
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_within_the_timeout() {
    let path = socket_path("missing");
    let timeout = Duration::from_millis(300);
    // Rank 2 of 3 never starts.
    let start = Instant::now();
    let (hub, spoke) = std::thread::scope(|s| {
        let hub = s.spawn(|| Rendezvous::connect_at(&path, 0, 3, timeout).unwrap_err());
        let spoke = s.spawn(|| Rendezvous::connect_at(&path, 1, 3, timeout).unwrap_err());
        (hub.join().unwrap(), spoke.join().unwrap())
    });
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(
        matches!(&hub, WorldError::Timeout { rank: 0, missing, .. } if *missing == [2]),
        "{hub}"
    );
    // Rank 1 hears it from rank 0.
    let message = spoke.to_string();
    assert!(
        matches!(spoke, WorldError::Aborted { rank: 1, .. }) && message.contains("[2]"),
        "{message}"
    );

    // Nobody listening at all.
    let err = Rendezvous::connect_at(&socket_path("nobody"), 1, 2, timeout).unwrap_err();
    assert!(
        matches!(&err, WorldError::Timeout { missing, .. } if *missing == [0]),
        "{err}"
    );
}

#[test]
fn a_rank_that_leaves_fails_the_others_at_once_and_poisons_the_world() {
    let path = socket_path("leaver");
    let timeout = Duration::from_secs(30);
    let start = Instant::now();
    let errors = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                let path = &path;
                s.spawn(move || {
                    let mut rv = Rendezvous::connect_at(path, rank, 3, timeout).unwrap();
                    rv.barrier("first").unwrap();
                    if rank == 2 {
                        return None; // drops its end: like a process that exits
                    }
                    let err = rv.barrier("second").unwrap_err();
                    let again = rv.barrier("third").unwrap_err();
                    assert!(matches!(again, WorldError::Poisoned { .. }), "{again}");
                    Some(err)
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "no waiting for the timeout"
    );
    assert!(
        matches!(
            &errors[0],
            Some(WorldError::PeerLost {
                rank: 0,
                peer: 2,
                ..
            })
        ),
        "{errors:?}"
    );
    assert!(
        matches!(&errors[1], Some(WorldError::Aborted { rank: 1, .. })),
        "{errors:?}"
    );
}

#[test]
fn ranks_of_different_world_sizes_are_refused() {
    let path = socket_path("sizes");
    let timeout = Duration::from_secs(10);
    let (hub, spoke) = std::thread::scope(|s| {
        let hub = s.spawn(|| Rendezvous::connect_at(&path, 0, 2, timeout).unwrap_err());
        let spoke = s.spawn(|| Rendezvous::connect_at(&path, 1, 3, timeout).unwrap_err());
        (hub.join().unwrap(), spoke.join().unwrap())
    });
    assert!(
        matches!(hub, WorldError::Protocol { .. }) && hub.to_string().contains("world of Some(3)"),
        "{hub}"
    );
    assert!(matches!(spoke, WorldError::Aborted { .. }), "{spoke}");
}

#[test]
fn spawn_ranks_sets_the_variables_and_kills_stragglers() {
    // Two ranks per GPU: ranks 0 and 1 on GPU 0, rank 2 on GPU 1.
    let outputs = spawn_ranks(3, 2, Duration::from_secs(7), Duration::from_secs(20), |rank| {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo $RANK $WORLD_SIZE $LOCAL_RANK $MEGAMOE_GPU $MASTER_ADDR $MEGAMOE_WORLD_TIMEOUT_S; \
             echo err >&2",
        ]);
        cmd.env("UNUSED", rank.to_string());
        cmd
    })
    .unwrap();
    for (rank, output) in outputs.iter().enumerate() {
        assert!(output.success(), "{output}");
        assert_eq!(
            output.stdout,
            format!("{rank} 3 {rank} {} 127.0.0.1 7\n", rank / 2)
        );
        assert_eq!(output.stderr, "err\n");
    }
    let start = Instant::now();
    let outputs = spawn_ranks(
        2,
        1,
        Duration::from_secs(1),
        Duration::from_millis(300),
        |rank| {
            let mut cmd = Command::new("sleep");
            cmd.arg(if rank == 0 { "0" } else { "30" });
            cmd
        },
    )
    .unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(outputs[0].success());
    assert!(outputs[1].status.is_none(), "{}", outputs[1]);
    assert!(!outputs[1].passed_its_test());
}

// ---------------------------------------------------------------------------------------------
// On a GPU.

const SCATTER: &str = r#"
#include "symm_buffer.cuh"

// Rank `me` writes word i of its slice [me] of every rank's region: value(me, dst, i).
__device__ unsigned int value(unsigned int src, unsigned int dst, unsigned int i) {
    return src * 0x01000193u + dst * 0x9E3779B9u + i * 2654435761u + 1u;
}

extern "C" __global__ void scatter(const symm_mem::SymmBuffer* view_in_memory, unsigned int words) {
    const symm_mem::SymmBuffer view = *view_in_memory;
    unsigned int* mine = view.at<unsigned int>(0) + view.rank * words;
    for (unsigned int dst = 0; dst < view.num_ranks; ++dst) {
        unsigned int* theirs = view.map(mine, dst);
        for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
            theirs[i] = value(view.rank, dst, i);
    }
}
"#;

fn value(src: u32, dst: u32, i: u32) -> u32 {
    src.wrapping_mul(0x0100_0193)
        .wrapping_add(dst.wrapping_mul(0x9E37_79B9))
        .wrapping_add(i.wrapping_mul(2_654_435_761))
        .wrapping_add(1)
}

/// Words each rank writes into each rank's buffer.
const WORDS: u32 = 1 << 20;

/// One rank's part: allocate, scatter into every rank, barrier, check what everyone wrote here.
fn scatter_and_check(world: &World) {
    let (rank, n) = (world.rank(), world.num_ranks());
    let gpu = world.local_gpu();
    let names = world.all_gather(format!("rank {rank}").as_bytes()).unwrap();
    assert_eq!(names.len(), n);
    assert!(
        names
            .iter()
            .enumerate()
            .all(|(r, b)| *b == format!("rank {r}").as_bytes())
    );

    let bytes = n * WORDS as usize * 4;
    let alloc = world.alloc_symmetric(bytes).unwrap();
    assert_eq!(alloc.bytes(), bytes);
    assert_eq!(alloc.bases().len(), n);
    assert_eq!(alloc.view().rank as usize, rank);
    assert_eq!(alloc.base(), alloc.bases()[rank]);
    assert!(
        alloc.read(0, bytes).unwrap().iter().all(|&b| b == 0),
        "zeroed"
    );

    let arch = gpu.info().arch().expect("a supported GPU");
    let spec = KernelSpec::new("symm-mem/scatter", ("scatter.cu", SCATTER)).header(CUDA_HEADER);
    let compiled = Jit::new().unwrap().compile(&spec, arch).unwrap();
    let module = gpu.load_module(&compiled.cubin).unwrap();
    let kernel = module.kernel("scatter").unwrap();
    let view = alloc.view();
    let d_view = gpu.upload(bytemuck::bytes_of(&view)).unwrap();
    // SAFETY: scatter(const SymmBuffer*, unsigned): every rank's buffer holds n slices of WORDS words.
    unsafe {
        kernel
            .launch(gpu.stream(), LaunchConfig::linear(264, 256))
            .ptr(&d_view)
            .scalar(WORDS)
            .launch()
            .unwrap();
    }
    gpu.synchronize().unwrap();
    world.barrier().unwrap();
    let words: Vec<u32> = alloc
        .read(0, bytes)
        .unwrap()
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    for src in 0..n {
        for i in 0..WORDS {
            let got = words[src * WORDS as usize + i as usize];
            assert_eq!(
                got,
                value(src as u32, rank as u32, i),
                "rank {rank}: slice of rank {src}, word {i}"
            );
        }
    }
    // Nobody frees while a peer may still read.
    world.barrier().unwrap();
    eprintln!(
        "rank {rank}: {n} ranks, {} MiB each checked (VMM: {})",
        bytes >> 20,
        alloc.is_vmm()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn local_world_of_one_gpu_allocates_and_round_trips() {
    let world = World::local(&[0]).unwrap().pop().unwrap();
    assert_eq!((world.rank(), world.num_ranks()), (0, 1));
    scatter_and_check(&world);
    let alloc = world.alloc_symmetric(4096).unwrap();
    alloc.write(100, b"hello").unwrap();
    assert_eq!(alloc.read(98, 9).unwrap(), b"\0\0hello\0\0");
    alloc.fill(101, 3, b'x').unwrap();
    assert_eq!(alloc.read(100, 5).unwrap(), b"hxxxo");
    assert!(matches!(
        alloc.read(4000, 97),
        Err(WorldError::OutOfBounds { .. })
    ));
    assert!(matches!(
        alloc.write(usize::MAX, b"x"),
        Err(WorldError::OutOfBounds { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn local_world_ranks_see_each_others_writes() {
    if !cuda_rt::testing::gpus_or_skip(2) {
        return;
    }
    let worlds = World::local(&[0, 1]).unwrap();
    std::thread::scope(|s| {
        for world in worlds {
            s.spawn(move || scatter_and_check(&world));
        }
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn process_world_ranks_see_each_others_writes() {
    const TEST: &str = "process_world_ranks_see_each_others_writes";
    if is_test_rank(TEST) {
        let world = World::from_env().unwrap();
        scatter_and_check(&world);
        let mismatch = world
            .alloc_symmetric(4096 * (world.rank() + 1))
            .unwrap_err();
        assert!(mismatch.to_string().contains("same size"), "{mismatch}");
        return;
    }
    if !cuda_rt::testing::gpus_or_skip(2) {
        return;
    }
    let outputs = spawn_test_ranks(
        TEST,
        2,
        1,
        Duration::from_secs(30),
        Duration::from_secs(120),
    )
    .unwrap();
    for output in &outputs {
        eprint!("{output}");
        assert!(output.passed_its_test(), "{output}");
    }
}
