//! `megamoe`: the MegaMoE facade: problem configs and presets ([`config`]), the in-memory
//! problem with its validation ([`problem`]) and the handle that runs it, the CUDA backend (the
//! unfused GPU pipeline or the fused kernel on local GPUs, a rank per GPU or several sharing one,
//! as threads or processes, [`cuda`]). What
//! an application needs and nothing else: the problem files, the generator, the CPU reference
//! (`megamoe-problems`), the CPU dataflow engine (`megamoe-dataflow`), the benchmark
//! (`megamoe-bench`) and the `megamoe` CLI (`megamoe-cli`) are crates of their own.
//!
//! From a Rust application, a rank per local GPU (threads; [`cuda::run_process`] does the same
//! as one process of a torchrun-style world; [`cuda::Placement::one_gpu`] puts every rank on one
//! GPU, for tests of the cross-rank protocol):
//!
//! ```no_run
//! use megamoe::cuda::{CudaRank, Placement, run_local};
//! use megamoe::{Config, Mma, RankInputs, RankWeights};
//! # fn my_weights(rank: usize) -> RankWeights { unimplemented!() }
//! # fn my_tokens(rank: usize) -> RankInputs { unimplemented!() }
//! let config = Config::deepseek_v4_pro().with_ranks(2);
//! let ys = run_local(Placement::one_gpu_per_rank(config.num_ranks), |world| {
//!     let r = world.rank();
//!     // Weights are transformed and uploaded once; pools sized for 8192 tokens per rank.
//!     let mut rank = CudaRank::new(world.clone(), &config, 8192, Mma::Bf16, &my_weights(r))?;
//!     let (y, _stage_times) = rank.forward(&my_tokens(r))?; // BF16 [T][H]
//!     Ok(y)
//! })?;
//! # Ok::<(), megamoe::cuda::CudaError>(())
//! ```

pub mod config;
pub mod cuda;
pub mod problem;

pub use config::{Config, ConfigError};
pub use fp_formats::Recipe;
pub use megamoe_kernel::Mma;
pub use problem::{DenseInputs, DenseWeights, Problem, ProblemError, RankInputs, RankWeights};
