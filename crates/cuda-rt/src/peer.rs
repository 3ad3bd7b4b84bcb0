//! Peer access between GPUs of one process: lets one device's kernels load and store another's memory
//! over NVLink or PCIe.

use crate::error::DriverCall;
use crate::{Error, Gpu, Result};
use cudarc::driver::sys;

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

    /// Maps `peer`'s memory into this device's context. One direction; already enabled is fine.
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
                Ok(())
            }
            code => Err(Error::Driver {
                call: "cuCtxEnablePeerAccess",
                source: cudarc::driver::DriverError(code),
            }),
        }
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
