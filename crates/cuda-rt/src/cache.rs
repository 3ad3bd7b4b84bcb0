//! The on-disk JIT cache. An entry is `<dir>/<key>.cubin` plus `<dir>/<key>.log`, the NVRTC log from
//! which the resource report is parsed again on a hit. Files are written to a temporary name and renamed,
//! log first and cubin last, so a present cubin means a complete entry even with concurrent writers or an
//! interrupted write. Anything unreadable is a miss; a failed write only costs the next compile.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Overrides the cache root; the default is the user cache dir (`~/.cache/megamoe` on Linux).
pub const CACHE_ENV: &str = "MEGAMOE_CACHE";

#[derive(Debug, Clone)]
pub(crate) struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// `$MEGAMOE_CACHE/jit`, else `<user cache dir>/megamoe/jit`; `None` when neither exists.
    pub fn from_env() -> Option<Self> {
        let root = std::env::var_os(CACHE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| dirs::cache_dir().map(|d| d.join("megamoe")))?;
        Some(Self::new(root.join("jit")))
    }

    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn load(&self, key: &str) -> Option<(Vec<u8>, String)> {
        let cubin = std::fs::read(self.dir.join(format!("{key}.cubin"))).ok()?;
        let log = std::fs::read_to_string(self.dir.join(format!("{key}.log"))).ok()?;
        Some((cubin, log))
    }

    pub fn store(&self, key: &str, cubin: &[u8], log: &str) {
        let result = std::fs::create_dir_all(&self.dir)
            .and_then(|()| self.write_atomic(&format!("{key}.log"), log.as_bytes()))
            .and_then(|()| self.write_atomic(&format!("{key}.cubin"), cubin));
        if let Err(e) = result {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot write the JIT cache");
        }
    }

    fn write_atomic(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{name}.{}.{seq}.tmp", std::process::id()));
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        drop(file);
        std::fs::rename(&tmp, self.dir.join(name)).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}
