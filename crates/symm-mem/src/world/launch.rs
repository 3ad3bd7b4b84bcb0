//! [`spawn_ranks`]: a small torchrun for one host. Runs one process per rank with the variables
//! [`ProcessEnv::from_env`] reads, waits for all of them (killing any still running at the
//! deadline), and returns what each printed. The multi-process GPU tests launch themselves with it.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{ProcessEnv, WorldError};

/// How one rank's process ended.
#[derive(Debug)]
pub struct RankOutput {
    pub rank: usize,
    /// `None`: still running at the deadline, and killed.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl RankOutput {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// For a [`spawn_test_ranks`] process: it exited 0 and libtest ran exactly its one test (a
    /// name that matches nothing also exits 0).
    pub fn passed_its_test(&self) -> bool {
        self.success() && self.stdout.contains("test result: ok. 1 passed")
    }
}

/// The rank, how it ended, and everything it printed, indented: for assertion messages.
impl std::fmt::Display for RankOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => writeln!(f, "rank {}: {status}", self.rank)?,
            None => writeln!(f, "rank {}: killed at the deadline", self.rank)?,
        }
        for line in self.stdout.lines().chain(self.stderr.lines()) {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

struct Running {
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
    status: Option<ExitStatus>,
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Runs `command(rank)` for every rank of a `world_size`-rank world on this host, with `RANK`,
/// `WORLD_SIZE`, `LOCAL_RANK` (= rank), the GPU (rank / `ranks_per_gpu`, [`super::GPU_VAR`]),
/// `MASTER_ADDR`/`MASTER_PORT` (a port picked for this call) and the collective timeout
/// `collective_timeout` set; kills whatever still runs after `run_timeout`. Every process is
/// waited for, so none outlives the call.
pub fn spawn_ranks(
    world_size: usize,
    ranks_per_gpu: usize,
    collective_timeout: Duration,
    run_timeout: Duration,
    mut command: impl FnMut(usize) -> Command,
) -> Result<Vec<RankOutput>, WorldError> {
    if ranks_per_gpu == 0 {
        return Err(WorldError::Env {
            var: super::GPU_VAR,
            reason: "a world needs at least one rank per GPU".into(),
        });
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // Only names the socket file; a port per call keeps concurrent launches apart.
    let master_port = 20_000 + ((std::process::id() ^ nanos) % 40_000) as u16;
    let deadline = Instant::now() + run_timeout;
    let mut running: Vec<Running> = Vec::with_capacity(world_size);
    for rank in 0..world_size {
        let env = ProcessEnv {
            rank,
            world_size,
            local_rank: rank,
            gpu: rank / ranks_per_gpu,
            master_addr: "127.0.0.1".into(),
            master_port,
            timeout: collective_timeout,
        };
        let mut cmd = command(rank);
        cmd.envs(env.vars())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(source) => {
                for r in &mut running {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
                return Err(WorldError::Spawn { rank, source });
            }
        };
        let stdout = drain(child.stdout.take().expect("piped"));
        let stderr = drain(child.stderr.take().expect("piped"));
        tracing::debug!(rank, pid = child.id(), "rank process started");
        running.push(Running {
            child,
            stdout,
            stderr,
            status: None,
        });
    }
    while running.iter().any(|r| r.status.is_none()) && Instant::now() < deadline {
        for r in running.iter_mut().filter(|r| r.status.is_none()) {
            r.status = r.child.try_wait().ok().flatten();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(running
        .into_iter()
        .enumerate()
        .map(|(rank, mut r)| {
            if r.status.is_none() {
                r.status = r.child.try_wait().ok().flatten();
            }
            if r.status.is_none() {
                tracing::warn!(rank, "rank process still running at the deadline: killed");
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            RankOutput {
                rank,
                status: r.status,
                stdout: r.stdout.join().unwrap_or_default(),
                stderr: r.stderr.join().unwrap_or_default(),
            }
        })
        .collect())
}

/// Set in a test process that [`spawn_test_ranks`] started, to the name of the test it runs.
pub const TEST_RANK_VAR: &str = "SYMM_MEM_TEST_RANK_OF";

/// Runs libtest test `test` of the current test binary as the ranks of a `world_size`-rank world:
/// each process runs only that test (ignored or not) with [`TEST_RANK_VAR`] = `test`, so the test
/// body can tell the ranks ([`is_test_rank`]) from the launcher. See [`spawn_ranks`] for the rest.
pub fn spawn_test_ranks(
    test: &str,
    world_size: usize,
    ranks_per_gpu: usize,
    collective_timeout: Duration,
    run_timeout: Duration,
) -> Result<Vec<RankOutput>, WorldError> {
    let exe = std::env::current_exe().map_err(|source| WorldError::Spawn { rank: 0, source })?;
    spawn_ranks(
        world_size,
        ranks_per_gpu,
        collective_timeout,
        run_timeout,
        |_| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                test,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(TEST_RANK_VAR, test);
            cmd
        },
    )
}

/// Whether this process is a rank that [`spawn_test_ranks`] started for `test`.
pub fn is_test_rank(test: &str) -> bool {
    std::env::var(TEST_RANK_VAR).is_ok_and(|v| v == test)
}
