//! `megamoe`: the MegaMoE facade: problem configs and presets
//! ([`config`]), the in-memory problem ([`problem`]), problem files ([`files`]), the random
//! problem generator ([`generate`]), the CPU reference of the numeric contract ([`reference`](mod@reference)),
//! the CPU dataflow engine that runs the fused kernel's buffer protocol and scheduler on host
//! threads ([`dataflow`]), the CUDA backend (the unfused GPU pipeline on local GPUs, a rank per GPU as a thread or a process, [`cuda`]) and its benchmark ([`bench`](mod@bench)),
//! the comparison metrics ([`check`]). The `megamoe` CLI drives them.

pub mod bench;
pub mod check;
pub mod config;
pub mod cuda;
pub mod dataflow;
pub mod files;
pub mod generate;
pub mod problem;
pub mod reference;

pub use config::{Config, ConfigError};
pub use fp_formats::Recipe;
pub use problem::{DenseInputs, DenseWeights, Problem, ProblemError, RankInputs, RankWeights};
