//! Peer access between GPUs of one process: lets one device's kernels load and store another's memory
//! over NVLink or PCIe.

use crate::error::DriverCall;
use crate::{Error, Gpu, Result};
use cudarc::driver::{DriverError, result, sys};

impl Gpu {
    /// Whether this device's kernels can access `peer`'s memory once enabled.
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        if self.ordinal() == peer.ordinal() {
            return Ok(true);
        }
        let mut can = 0;
        // SAFETY: both device handles come from live contexts; `can` is a valid out-pointer.
        unsafe {
            sys::cuDeviceCanAccessPeer(
                &mut can,
                self.context().cu_device(),
                peer.context().cu_device(),
            )
        }
        .result()
        .call("cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }

    /// Lets this device's kernels access `peer`'s memory: `cuMemAlloc` memory (through the context) and
    /// stream-ordered pool memory, which cudarc's allocations are (through the pool). One direction;
    /// already enabled is fine.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<()> {
        if self.ordinal() == peer.ordinal() {
            return Ok(());
        }
        if !self.can_access_peer(peer)? {
            return Err(Error::PeerAccess {
                from: self.ordinal(),
                to: peer.ordinal(),
            });
        }
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: `peer`'s context is alive; flags must be 0.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.context().cu_ctx(), 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            }
            code => {
                return Err(Error::Driver {
                    call: "cuCtxEnablePeerAccess",
                    source: DriverError(code),
                });
            }
        }
        // cudarc allocates from the device's memory pool (cuMemAllocAsync), and pool memory is not
        // covered by cuCtxEnablePeerAccess: each pool grants access itself. Idempotent.
        if peer.context().has_async_alloc() {
            // SAFETY: a device handle from a live context.
            let pool = unsafe { result::device::get_mem_pool(peer.context().cu_device()) }
                .call("cuDeviceGetMemPool")?;
            let access = sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: self.context().cu_device(),
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: a valid pool and one access descriptor.
            unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }
                .result()
                .call("cuMemPoolSetAccess")?;
        }
        Ok(())
    }
}

/// Enables access in both directions between every pair of `gpus`.
pub fn enable_peer_access_all(gpus: &[Gpu]) -> Result<()> {
    for a in gpus {
        for b in gpus {
            a.enable_peer_access(b)?;
        }
    }
    Ok(())
}
