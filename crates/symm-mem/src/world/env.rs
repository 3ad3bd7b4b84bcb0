//! [`ProcessEnv`]: who this process is in a world of one process per rank, read from the variables
//! torchrun sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) and the GPU it
//! drives ([`GPU_VAR`], default `LOCAL_RANK`: ranks may share a GPU). Single host only: the ranks
//! meet on a Unix socket whose path is derived from `MASTER_ADDR:MASTER_PORT`.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::WorldError;
use crate::MAX_RANKS;

/// Seconds a collective (and the initial rendezvous) waits for a missing rank; optional.
pub const TIMEOUT_VAR: &str = "MEGAMOE_WORLD_TIMEOUT_S";

/// The GPU ordinal this rank's process drives; optional (default `LOCAL_RANK`). Several ranks may
/// name one GPU.
pub const GPU_VAR: &str = "MEGAMOE_GPU";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEnv {
    pub rank: usize,
    pub world_size: usize,
    /// This process's index on the host (torchrun's `LOCAL_RANK`).
    pub local_rank: usize,
    /// The GPU ordinal this process drives ([`GPU_VAR`], default `local_rank`).
    pub gpu: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// How long a collective waits for a missing rank before failing.
    pub timeout: Duration,
}

impl ProcessEnv {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// From this process's environment.
    pub fn from_env() -> Result<Self, WorldError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Whether this process was started as a rank of a process world: `RANK` and `WORLD_SIZE` are
    /// set (by torchrun, or by [`super::spawn_ranks`]). [`Self::from_env`] checks the rest.
    pub fn present() -> bool {
        ["RANK", "WORLD_SIZE"]
            .iter()
            .all(|var| std::env::var_os(var).is_some())
    }

    /// From any variable source: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` are required;
    /// `LOCAL_RANK` defaults to `RANK`, [`GPU_VAR`] to `LOCAL_RANK`; `LOCAL_WORLD_SIZE`, when set,
    /// must equal `WORLD_SIZE` (one host); [`TIMEOUT_VAR`] defaults to [`Self::DEFAULT_TIMEOUT`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, WorldError> {
        let required = |var: &'static str| {
            get(var).ok_or(WorldError::Env {
                var,
                reason: "not set (launch with torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR and \
                         MASTER_PORT)"
                    .into(),
            })
        };
        let rank: usize = parse("RANK", &required("RANK")?)?;
        let world_size: usize = parse("WORLD_SIZE", &required("WORLD_SIZE")?)?;
        if !(1..=MAX_RANKS).contains(&world_size) {
            return Err(WorldError::Env {
                var: "WORLD_SIZE",
                reason: format!("{world_size} is not in 1..={MAX_RANKS}"),
            });
        }
        if rank >= world_size {
            return Err(WorldError::Env {
                var: "RANK",
                reason: format!("{rank} is not below WORLD_SIZE = {world_size}"),
            });
        }
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => parse("LOCAL_RANK", &v)?,
            None => rank,
        };
        if let Some(v) = get("LOCAL_WORLD_SIZE") {
            let local: usize = parse("LOCAL_WORLD_SIZE", &v)?;
            if local != world_size {
                return Err(WorldError::Env {
                    var: "LOCAL_WORLD_SIZE",
                    reason: format!(
                        "{local} != WORLD_SIZE = {world_size}: this world spans one host only"
                    ),
                });
            }
        }
        let gpu = match get(GPU_VAR) {
            Some(v) => parse(GPU_VAR, &v)?,
            None => local_rank,
        };
        let master_addr = required("MASTER_ADDR")?;
        if master_addr.is_empty() {
            return Err(WorldError::Env {
                var: "MASTER_ADDR",
                reason: "empty".into(),
            });
        }
        let master_port = parse("MASTER_PORT", &required("MASTER_PORT")?)?;
        let timeout = match get(TIMEOUT_VAR) {
            Some(v) => {
                let seconds: f64 = parse(TIMEOUT_VAR, &v)?;
                Duration::try_from_secs_f64(seconds)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or(WorldError::Env {
                        var: TIMEOUT_VAR,
                        reason: format!("{v} is not a positive number of seconds"),
                    })?
            }
            None => Self::DEFAULT_TIMEOUT,
        };
        Ok(Self {
            rank,
            world_size,
            local_rank,
            gpu,
            master_addr,
            master_port,
            timeout,
        })
    }

    /// The rendezvous socket: `$TMPDIR/megamoe-world-<addr>-<port>.sock`, with every character of
    /// the address outside `[A-Za-z0-9.-]` replaced by `_`. Two jobs with the same address and
    /// port collide, as they would on a TCP port.
    pub fn socket_path(&self) -> PathBuf {
        let addr: String = self
            .master_addr
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        std::env::temp_dir().join(format!("megamoe-world-{addr}-{}.sock", self.master_port))
    }

    /// The variables that make a child process this rank (what [`Self::from_env`] reads).
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", self.rank.to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_RANK", self.local_rank.to_string()),
            (GPU_VAR, self.gpu.to_string()),
            ("LOCAL_WORLD_SIZE", self.world_size.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            (TIMEOUT_VAR, self.timeout.as_secs_f64().to_string()),
        ]
    }
}

fn parse<T: FromStr>(var: &'static str, value: &str) -> Result<T, WorldError> {
    value.trim().parse().map_err(|_| WorldError::Env {
        var,
        reason: format!("cannot parse {value:?}"),
    })
}
