//! Worlds: the ranks of one job, each driving one GPU, and how they allocate the symmetric buffer
//! and meet on the host. One [`World`] per rank, two backends behind it:
//!
//! - **local** ([`World::local`]): one process drives every GPU, one thread per rank (each thread
//!   owns its rank's `World`). Peer access is enabled between all of them, covering the memory pools
//!   cudarc allocates from; each rank's buffer is an ordinary device allocation.
//! - **process** ([`World::from_env`]): one process per GPU on one host, launched like torchrun
//!   ([`ProcessEnv`], or [`spawn_ranks`]). Each rank's buffer is a CUDA VMM allocation exported as a
//!   POSIX fd, passed to the others through the [`Rendezvous`] socket, imported and mapped by each.
//!
//! Either way [`World::alloc_symmetric`] is collective and returns every rank's base address mapped
//! into this process, plus the [`SymmBuffer`] view kernels take. NVLink multicast is never used.

mod env;
mod error;
pub mod frame;
mod launch;
mod local;
mod rendezvous;

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use cuda_rt::cudarc::driver::DevicePtr;
use cuda_rt::{CudaSlice, Gpu, Mapping, SharedMemory};

pub use env::{GPU_VAR, ProcessEnv, TIMEOUT_VAR};
pub use error::WorldError;
pub use frame::{MAX_FDS_PER_FRAME, MAX_PAYLOAD_BYTES};
pub use launch::{RankOutput, TEST_RANK_VAR, is_test_rank, spawn_ranks, spawn_test_ranks};
pub use rendezvous::{Contribution, Rendezvous};

use crate::{MAX_RANKS, SymmBuffer};
use local::LocalGroup;

/// One rank of a world: its number, its GPU, and the host-side collectives every rank must call
/// in the same order ([`Self::all_gather`], [`Self::barrier`], [`Self::alloc_symmetric`]).
#[derive(Debug)]
pub struct World {
    rank: usize,
    num_ranks: usize,
    gpu: Gpu,
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    Local(Arc<LocalGroup>),
    Process(Mutex<Rendezvous>),
}

impl World {
    /// A single-process world over the GPUs `ordinals` (rank r drives `ordinals[r]`), with peer
    /// access enabled between every two of its GPUs. An ordinal may repeat: ranks that share a GPU
    /// each get their own share of its SMs (`Gpu::split`: a green context's stream), their own
    /// symmetric buffer, and reach each other's buffers as plain device memory, so a world of R
    /// ranks runs the whole cross-rank protocol on fewer GPUs, every rank's grids resident at once.
    /// Returns one `World` per rank: move each to its own thread, since collectives block until
    /// every rank has called them.
    pub fn local(ordinals: &[usize]) -> Result<Vec<World>, WorldError> {
        if ordinals.is_empty() || ordinals.len() > MAX_RANKS {
            return Err(WorldError::BadOrdinals(ordinals.to_vec()));
        }
        // Ranks that share a GPU get a share of its SMs each (green contexts), so each rank's
        // persistent grids are resident beside the others'.
        let mut shares: HashMap<usize, std::vec::IntoIter<Gpu>> = HashMap::new();
        for &ordinal in ordinals {
            if let std::collections::hash_map::Entry::Vacant(slot) = shares.entry(ordinal) {
                let ranks = ordinals.iter().filter(|&&o| o == ordinal).count();
                let gpus = if ranks == 1 {
                    vec![Gpu::open(ordinal)?]
                } else {
                    Gpu::split(ordinal, ranks)?
                };
                slot.insert(gpus.into_iter());
            }
        }
        let gpus: Vec<Gpu> = ordinals
            .iter()
            .map(|o| {
                shares
                    .get_mut(o)
                    .and_then(Iterator::next)
                    .expect("a share per rank")
            })
            .collect();
        let mut seen = HashSet::new();
        let distinct: Vec<Gpu> = gpus
            .iter()
            .filter(|gpu| seen.insert(gpu.ordinal()))
            .cloned()
            .collect();
        cuda_rt::enable_peer_access_all(&distinct)?;
        let num_ranks = gpus.len();
        let group = LocalGroup::new(num_ranks, ProcessEnv::DEFAULT_TIMEOUT);
        tracing::info!(?ordinals, "local world");
        Ok(gpus
            .into_iter()
            .enumerate()
            .map(|(rank, gpu)| World {
                rank,
                num_ranks,
                gpu,
                backend: Backend::Local(group.clone()),
            })
            .collect())
    }

    /// This process's rank of a one-process-per-GPU world, from torchrun's variables
    /// ([`ProcessEnv::from_env`]).
    pub fn from_env() -> Result<World, WorldError> {
        Self::from_process_env(&ProcessEnv::from_env()?)
    }

    /// Meets the other ranks first (a rank whose GPU then fails exits, which its peers see at
    /// once), then opens GPU `env.gpu` (which other ranks' processes may share).
    pub fn from_process_env(env: &ProcessEnv) -> Result<World, WorldError> {
        let rendezvous = Rendezvous::connect(env)?;
        let gpu = Gpu::open(env.gpu)?;
        tracing::info!(
            rank = env.rank,
            world_size = env.world_size,
            gpu = env.gpu,
            "process world"
        );
        Ok(World {
            rank: env.rank,
            num_ranks: env.world_size,
            gpu,
            backend: Backend::Process(Mutex::new(rendezvous)),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn num_ranks(&self) -> usize {
        self.num_ranks
    }

    /// The GPU this rank drives.
    pub fn local_gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Every rank's `bytes` (at most [`MAX_PAYLOAD_BYTES`]), indexed by rank.
    pub fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, WorldError> {
        Ok(self
            .gather("all_gather", bytes, None)?
            .into_iter()
            .map(|c| c.bytes)
            .collect())
    }

    /// Returns once every rank has called it (host threads only: it does not wait for the GPU).
    pub fn barrier(&self) -> Result<(), WorldError> {
        self.gather("barrier", &[], None).map(drop)
    }

    fn gather(
        &self,
        during: &str,
        bytes: &[u8],
        fd: Option<std::os::fd::OwnedFd>,
    ) -> Result<Vec<Contribution>, WorldError> {
        match &self.backend {
            Backend::Local(group) => Ok(group
                .all_gather(self.rank, during, bytes)?
                .iter()
                .map(|b| Contribution {
                    bytes: b.clone(),
                    fds: Vec::new(),
                })
                .collect()),
            Backend::Process(rendezvous) => rendezvous
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .all_gather(during, bytes, fd.into_iter().collect()),
        }
    }

    /// Collective: `bytes` of zeroed device memory on every rank (all ranks must ask for the same
    /// size), each rank's mapped into this process. Zeroing completes before any rank returns.
    pub fn alloc_symmetric(&self, bytes: usize) -> Result<SymmAllocation, WorldError> {
        let during = format!("alloc_symmetric({bytes} B)");
        let (bases, memory) = match &self.backend {
            Backend::Local(_) => {
                let slice = self.gpu.alloc_zeros::<u8>(bytes.max(1))?;
                let base = slice.device_ptr(self.gpu.stream()).0;
                self.gpu.synchronize()?;
                let all = self.gather(&during, &pair(base, bytes as u64), None)?;
                let mut bases = Vec::with_capacity(all.len());
                for (rank, c) in all.iter().enumerate() {
                    bases.push(self.check_pair(&during, rank, &c.bytes, bytes)?);
                }
                (bases, Memory::Device { _slice: slice })
            }
            Backend::Process(_) => {
                let physical = SharedMemory::create(&self.gpu, bytes)?;
                let own = physical.map(&[&self.gpu])?;
                // SAFETY: `own` is this device's mapping of `own.bytes()` bytes, used by nobody yet.
                unsafe { self.gpu.memset_raw(own.ptr(), own.bytes(), 0)? };
                self.gpu.synchronize()?;
                let size = physical.bytes() as u64;
                let fd = physical.export_fd()?;
                let all = self.gather(&during, &pair(size, bytes as u64), Some(fd))?;
                let mut mappings = Vec::with_capacity(all.len());
                let mut own = Some(own);
                for (rank, c) in all.iter().enumerate() {
                    let size = self.check_pair(&during, rank, &c.bytes, bytes)?;
                    let mapping = match (rank == self.rank, c.fds.as_slice()) {
                        (true, _) => own.take().expect("one own rank"),
                        (false, [fd]) => {
                            SharedMemory::import_fd(&self.gpu, fd.as_fd(), size as usize)?
                                .map(&[&self.gpu])?
                        }
                        (false, fds) => {
                            return Err(WorldError::Protocol {
                                rank: self.rank,
                                during,
                                reason: format!("rank {rank} sent {} fds instead of 1", fds.len()),
                            });
                        }
                    };
                    mappings.push(mapping);
                }
                // Every rank has mapped every buffer before any returns.
                self.gather(&during, &[], None)?;
                let bases = mappings.iter().map(Mapping::ptr).collect();
                (
                    bases,
                    Memory::Vmm {
                        _mappings: mappings,
                        _physical: physical,
                    },
                )
            }
        };
        let view = SymmBuffer::new(self.rank as u32, &bases)?;
        tracing::debug!(rank = self.rank, bytes, ?bases, "symmetric buffer");
        Ok(SymmAllocation {
            bytes,
            bases,
            view,
            gpu: self.gpu.clone(),
            memory,
        })
    }

    /// Decodes a (value, requested bytes) pair from `rank` and checks it asked for `bytes`.
    fn check_pair(
        &self,
        during: &str,
        rank: usize,
        payload: &[u8],
        bytes: usize,
    ) -> Result<u64, WorldError> {
        let protocol = |reason| WorldError::Protocol {
            rank: self.rank,
            during: during.into(),
            reason,
        };
        let words: [u8; 16] = payload
            .try_into()
            .map_err(|_| protocol(format!("rank {rank} sent {} bytes, not 16", payload.len())))?;
        let value = u64::from_le_bytes(words[..8].try_into().unwrap());
        let theirs = u64::from_le_bytes(words[8..].try_into().unwrap());
        if theirs != bytes as u64 {
            return Err(protocol(format!(
                "rank {rank} asked for {theirs} bytes, rank {} for {bytes}: every rank must ask \
                 for the same size",
                self.rank
            )));
        }
        Ok(value)
    }
}

fn pair(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

impl Drop for World {
    fn drop(&mut self) {
        if let Backend::Local(group) = &self.backend {
            group.depart(self.rank);
        }
    }
}

/// One rank's share of a symmetric buffer: its own memory, and every rank's base address as this
/// process sees it. Drop it only after a barrier that follows the last kernel (on any rank) that
/// touches it: peers may still be writing into it until then.
#[derive(Debug)]
pub struct SymmAllocation {
    bytes: usize,
    bases: Vec<u64>,
    view: SymmBuffer,
    gpu: Gpu,
    memory: Memory,
}

/// What keeps the memory alive; dropped with the allocation.
#[derive(Debug)]
enum Memory {
    Device {
        _slice: CudaSlice<u8>,
    },
    Vmm {
        // Declared first: unmapped before the physical handle is released.
        _mappings: Vec<Mapping>,
        _physical: SharedMemory,
    },
}

impl SymmAllocation {
    /// Usable bytes per rank (what was asked for).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Every rank's base address in this process, by rank.
    pub fn bases(&self) -> &[u64] {
        &self.bases
    }

    /// This rank's base address.
    pub fn base(&self) -> u64 {
        self.view.base
    }

    /// The device view for kernels.
    pub fn view(&self) -> SymmBuffer {
        self.view
    }

    /// Whether this rank's memory is a VMM allocation (the multi-process backend).
    pub fn is_vmm(&self) -> bool {
        matches!(self.memory, Memory::Vmm { .. })
    }

    fn check(&self, offset: usize, len: usize) -> Result<u64, WorldError> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(WorldError::OutOfBounds {
                offset,
                len,
                bytes: self.bytes,
            });
        }
        Ok(self.base() + offset as u64)
    }

    /// Copies `len` bytes of this rank's buffer from `offset` to the host, after the GPU stream's
    /// earlier work.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>, WorldError> {
        let ptr = self.check(offset, len)?;
        let mut host = vec![0u8; len];
        // SAFETY: in bounds of this rank's live allocation.
        unsafe { self.gpu.read_raw(ptr, &mut host)? };
        Ok(host)
    }

    /// Copies `bytes` into this rank's buffer at `offset`; complete on return.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<(), WorldError> {
        let ptr = self.check(offset, bytes.len())?;
        // SAFETY: in bounds of this rank's live allocation.
        unsafe { self.gpu.write_raw(ptr, bytes)? };
        Ok(())
    }

    /// Sets `len` bytes of this rank's buffer from `offset` to `byte`; complete on return.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), WorldError> {
        let ptr = self.check(offset, len)?;
        // SAFETY: in bounds of this rank's live allocation.
        unsafe { self.gpu.memset_raw(ptr, len, byte)? };
        self.gpu.synchronize()?;
        Ok(())
    }
}
