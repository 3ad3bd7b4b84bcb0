//! The JIT: [`KernelSpec`] + [`Arch`] → cubin and resource report, through the disk cache.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cache::DiskCache;
use crate::nvrtc::{self, NvrtcVersion};
use crate::ptxas::{KernelResources, parse_ptxas_log};
use crate::{Arch, Error, Header, KernelSpec, Result, Toolkit};

/// Bump when the meaning of a cache entry changes.
const CACHE_FORMAT: &str = "megamoe-jit-1";

/// Whether [`Jit::compile`] ran NVRTC or found the cubin in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileOutcome {
    Compiled,
    Cached,
}

/// A compiled specialization.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub arch: Arch,
    pub cubin: Vec<u8>,
    /// One entry per `__global__` function, from ptxas.
    pub resources: Vec<KernelResources>,
    /// The NVRTC log: warnings and the ptxas report.
    pub log: String,
    pub outcome: CompileOutcome,
    /// Wall time of this call (compile, or cache lookup).
    pub elapsed: Duration,
    /// The cache key (hex BLAKE3).
    pub key: String,
}

/// NVRTC with a toolkit and a disk cache. Cheap to share: `compile` takes `&self` and is thread-safe.
#[derive(Debug, Clone)]
pub struct Jit {
    toolkit: Toolkit,
    nvrtc: NvrtcVersion,
    cache: Option<DiskCache>,
}

impl Jit {
    /// NVRTC from [`Toolkit::locate`], cache in `$MEGAMOE_CACHE/jit` or `~/.cache/megamoe/jit`.
    pub fn new() -> Result<Self> {
        Self::with_toolkit(Toolkit::locate()?)
    }

    pub fn with_toolkit(toolkit: Toolkit) -> Result<Self> {
        let nvrtc = nvrtc::load(&toolkit)?;
        tracing::debug!(?nvrtc, root = %toolkit.root().display(), "NVRTC loaded");
        Ok(Self {
            toolkit,
            nvrtc,
            cache: DiskCache::from_env(),
        })
    }

    /// Caches in `dir` instead.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = Some(DiskCache::new(dir.into()));
        self
    }

    /// Always runs NVRTC and stores nothing.
    pub fn without_cache(mut self) -> Self {
        self.cache = None;
        self
    }

    pub fn toolkit(&self) -> &Toolkit {
        &self.toolkit
    }

    pub fn nvrtc_version(&self) -> NvrtcVersion {
        self.nvrtc
    }

    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(DiskCache::dir)
    }

    /// The NVRTC options for `spec` on `arch`, as passed.
    pub fn options(&self, spec: &KernelSpec, arch: Arch) -> Vec<String> {
        let mut options = vec![
            format!("--gpu-architecture={}", arch.name()),
            "-std=c++17".to_owned(),
            // Unannotated functions are device functions: headers shared with host code stay simple.
            "-default-device".to_owned(),
            // The resource report that KernelResources is parsed from.
            "--ptxas-options=-v".to_owned(),
        ];
        if spec.line_info {
            options.push("-lineinfo".to_owned());
        }
        for dir in self.toolkit.include_dirs() {
            options.push(format!("--include-path={}", dir.display()));
        }
        for (name, value) in &spec.defines {
            options.push(format!("-D{name}={value}"));
        }
        options
    }

    /// Compiles `spec` for `arch`, or returns the cached cubin of an identical earlier compile.
    pub fn compile(&self, spec: &KernelSpec, arch: Arch) -> Result<Compiled> {
        let start = Instant::now();
        let headers = normalized_headers(spec)?;
        for (name, _) in &spec.defines {
            let ident = name
                .chars()
                .enumerate()
                .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
            if !ident || name.is_empty() {
                return Err(Error::InvalidSpec {
                    kernel: spec.name.clone(),
                    reason: format!("define name `{name}` is not an identifier"),
                });
            }
        }
        let options = self.options(spec, arch);
        let key = self.key(spec.source, &headers, &options);

        if let Some((cubin, log)) = self.cache.as_ref().and_then(|c| c.load(&key)) {
            let elapsed = start.elapsed();
            tracing::debug!(kernel = %spec.name, %arch, ?elapsed, "JIT cache hit");
            return Ok(Compiled {
                arch,
                cubin,
                resources: parse_ptxas_log(&log),
                log,
                outcome: CompileOutcome::Cached,
                elapsed,
                key,
            });
        }

        let out = nvrtc::compile(&spec.name, arch, spec.source, &headers, &options)?;
        if let Some(cache) = &self.cache {
            cache.store(&key, &out.cubin, &out.log);
        }
        let elapsed = start.elapsed();
        tracing::info!(kernel = %spec.name, %arch, ?elapsed, bytes = out.cubin.len(), "NVRTC compiled");
        Ok(Compiled {
            arch,
            resources: parse_ptxas_log(&out.log),
            cubin: out.cubin,
            log: out.log,
            outcome: CompileOutcome::Compiled,
            elapsed,
            key,
        })
    }

    /// BLAKE3 of everything that determines the cubin: the cache format, NVRTC's version, the source, the
    /// headers sorted by name, and the options (they carry the arch, defines and include dirs).
    fn key(&self, source: Header, headers: &[Header], options: &[String]) -> String {
        let mut h = blake3::Hasher::new();
        let mut field = |bytes: &[u8]| {
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(CACHE_FORMAT.as_bytes());
        let v = self.nvrtc;
        field(format!("{}.{}:{}", v.major, v.minor, v.lib_bytes).as_bytes());
        field(source.0.as_bytes());
        field(source.1.as_bytes());
        for (name, text) in headers {
            field(name.as_bytes());
            field(text.as_bytes());
        }
        for option in options {
            field(option.as_bytes());
        }
        h.finalize().to_hex().to_string()
    }
}

/// The headers sorted by name with exact duplicates removed (two layer crates may both pull in a third's
/// header); two different texts under one name are an error.
fn normalized_headers(spec: &KernelSpec) -> Result<Vec<Header>> {
    let mut headers = spec.headers.clone();
    headers.sort();
    headers.dedup();
    if let Some(w) = headers.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::InvalidSpec {
            kernel: spec.name.clone(),
            reason: format!("two different headers are named `{}`", w[0].0),
        });
    }
    Ok(headers)
}
