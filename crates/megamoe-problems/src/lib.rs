//! `megamoe-problems`: the problem toolkit around the facade's in-memory problem, for tests,
//! benchmarks and the CLI: problem directories on disk ([`files`], safetensors), the random
//! problem generator ([`generate`]), the CPU reference of the numeric contract
//! ([`reference`](mod@reference)), the comparison metrics ([`check`]) and the tests' helpers
//! ([`testing`]). Progress is reported through plain callbacks, so no progress bar crosses into a
//! library.

pub mod check;
pub mod files;
pub mod generate;
pub mod reference;
pub mod testing;
