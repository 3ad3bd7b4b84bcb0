//! Memory shared between processes through CUDA's virtual memory management: a physical allocation
//! that can be exported as a POSIX file descriptor and imported from one in another process
//! ([`SharedMemory`]), mapped into this process's address space with access for chosen devices
//! ([`Mapping`]); and copies and memsets on raw device addresses, for memory that is no cudarc
//! `CudaSlice` (mappings, peers' buffers). NVLink multicast is deliberately not offered.

use std::ffi::c_void;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};

use crate::error::DriverCall;
use crate::{Gpu, Result};

/// Allocation properties: pinned device memory on `gpu`, exportable as a POSIX fd.
fn properties(gpu: &Gpu) -> sys::CUmemAllocationProp {
    // SAFETY: the all-zero bit pattern is valid for this plain C struct; the fields that matter follow.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = device_location(gpu);
    prop
}

fn device_location(gpu: &Gpu) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: gpu.context().cu_device(),
    }
}

/// A physical allocation on one device (`cuMemCreate`), or imported from another process's export.
/// Not addressable until [`SharedMemory::map`]ped; the memory lives while this handle or any mapping
/// of it (in any process) does.
#[derive(Debug)]
pub struct SharedMemory {
    handle: sys::CUmemGenericAllocationHandle,
    bytes: usize,
    /// Keeps the primary context (and so the device's driver state) alive as long as the handle.
    ctx: Arc<CudaContext>,
}

impl SharedMemory {
    /// The size every allocation and mapping on `gpu` is a multiple of (the driver's recommended
    /// granularity; 2 MiB on Hopper).
    pub fn granularity(gpu: &Gpu) -> Result<usize> {
        gpu.context().bind_to_thread().call("cuCtxSetCurrent")?;
        let prop = properties(gpu);
        let mut granularity = 0usize;
        // SAFETY: valid out-pointer and properties.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        }
        .result()
        .call("cuMemGetAllocationGranularity")?;
        Ok(granularity)
    }

    /// Allocates `bytes` (rounded up to [`Self::granularity`]) on `gpu`, exportable as a POSIX fd.
    /// The contents are undefined.
    pub fn create(gpu: &Gpu, bytes: usize) -> Result<Self> {
        let granularity = Self::granularity(gpu)?;
        let bytes = bytes.max(1).next_multiple_of(granularity);
        let prop = properties(gpu);
        let mut handle = 0;
        gpu.count_device_allocation();
        // SAFETY: valid out-pointer and properties; flags must be 0.
        unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) }
            .result()
            .call("cuMemCreate")?;
        tracing::debug!(device = gpu.ordinal(), bytes, "VMM allocation created");
        Ok(Self {
            handle,
            bytes,
            ctx: gpu.context().clone(),
        })
    }

    /// A new file descriptor naming this allocation, to pass to another process (over a Unix socket).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let mut fd: i32 = -1;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the out-parameter is an int.
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut i32).cast::<c_void>(),
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        }
        .result()
        .call("cuMemExportToShareableHandle")?;
        // SAFETY: the driver returned a new descriptor that nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The allocation another process exported as `fd`, `bytes` long (its [`Self::bytes`]). The fd
    /// may be closed afterwards.
    pub fn import_fd(gpu: &Gpu, fd: BorrowedFd<'_>, bytes: usize) -> Result<Self> {
        gpu.context().bind_to_thread().call("cuCtxSetCurrent")?;
        let mut handle = 0;
        // SAFETY: for POSIX_FILE_DESCRIPTOR the OS handle is the descriptor's value cast to a pointer.
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        }
        .result()
        .call("cuMemImportFromShareableHandle")?;
        Ok(Self {
            handle,
            bytes,
            ctx: gpu.context().clone(),
        })
    }

    /// Bytes of the allocation (a multiple of the granularity).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Maps the whole allocation at a fresh address of this process, readable and writable by the
    /// kernels of every device in `access`.
    pub fn map(&self, access: &[&Gpu]) -> Result<Mapping> {
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let mut ptr = 0;
        // SAFETY: valid out-pointer; alignment 0 = the granularity; no fixed address; flags 0.
        unsafe { sys::cuMemAddressReserve(&mut ptr, self.bytes, 0, 0, 0) }
            .result()
            .call("cuMemAddressReserve")?;
        // From here on dropping `mapping` undoes what succeeded.
        let mut mapping = Mapping {
            ptr,
            bytes: self.bytes,
            mapped: false,
            ctx: self.ctx.clone(),
        };
        // SAFETY: a reserved range of exactly the allocation's size; offset and flags 0.
        unsafe { sys::cuMemMap(ptr, self.bytes, 0, self.handle, 0) }
            .result()
            .call("cuMemMap")?;
        mapping.mapped = true;
        let descs: Vec<sys::CUmemAccessDesc> = access
            .iter()
            .map(|gpu| sys::CUmemAccessDesc {
                location: device_location(gpu),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: the mapped range and one descriptor per device.
        unsafe { sys::cuMemSetAccess(ptr, self.bytes, descs.as_ptr(), descs.len()) }
            .result()
            .call("cuMemSetAccess")?;
        Ok(mapping)
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: a handle from cuMemCreate/cuMemImportFromShareableHandle, released once; mappings
        // keep the memory alive on their own.
        if let Err(e) = unsafe { sys::cuMemRelease(self.handle) }.result() {
            tracing::warn!(error = %e, "cuMemRelease failed");
        }
    }
}

/// An address range of this process backed by a [`SharedMemory`]; unmapped and freed on drop. Drop
/// it only when no queued kernel uses the range any more.
#[derive(Debug)]
pub struct Mapping {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    mapped: bool,
    ctx: Arc<CudaContext>,
}

impl Mapping {
    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            tracing::warn!("cannot bind the context to unmap a VMM range");
        }
        // SAFETY: the range this value reserved (and mapped, if `mapped`), undone once.
        unsafe {
            if self.mapped
                && let Err(e) = sys::cuMemUnmap(self.ptr, self.bytes).result()
            {
                tracing::warn!(error = %e, "cuMemUnmap failed");
            }
            if let Err(e) = sys::cuMemAddressFree(self.ptr, self.bytes).result() {
                tracing::warn!(error = %e, "cuMemAddressFree failed");
            }
        }
    }
}

/// Copies and memsets on raw device addresses, ordered on this handle's stream.
impl Gpu {
    /// Sets `bytes` bytes at `ptr` to `byte`.
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` must be device memory this device may write, not in use by other work.
    pub unsafe fn memset_raw(&self, ptr: u64, bytes: usize, byte: u8) -> Result<()> {
        // SAFETY: the caller's contract; the stream is this GPU's.
        unsafe { self.memset_raw_on(self.stream(), ptr, bytes, byte) }
    }

    /// [`Gpu::memset_raw`] ordered on `stream` (a stream of this GPU's context, e.g. a caller's
    /// that is being captured into a graph).
    ///
    /// # Safety
    /// As [`Gpu::memset_raw`], and `stream` must belong to this GPU's context.
    pub unsafe fn memset_raw_on(
        &self,
        stream: &cudarc::driver::CudaStream,
        ptr: u64,
        bytes: usize,
        byte: u8,
    ) -> Result<()> {
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemsetD8Async(ptr, byte, bytes, stream.cu_stream()) }
            .result()
            .call("cuMemsetD8Async")
    }

    /// Copies `src` to device address `dst` once the stream's earlier work is done; returns when the
    /// copy is complete.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` must be device memory this device may write.
    pub unsafe fn write_raw(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the caller's contract for `dst`; `src` outlives the copy because we wait for it.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst,
                src.as_ptr().cast(),
                src.len(),
                self.stream().cu_stream(),
            )
        }
        .result()
        .call("cuMemcpyHtoDAsync")?;
        self.synchronize()
    }

    /// Copies device memory at `src` into `dst` once the stream's earlier work is done.
    ///
    /// # Safety
    /// `[src, src + dst.len())` must be device memory this device may read.
    pub unsafe fn read_raw(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the caller's contract for `src`; `dst` outlives the copy because we wait for it.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.as_mut_ptr().cast(),
                src,
                dst.len(),
                self.stream().cu_stream(),
            )
        }
        .result()
        .call("cuMemcpyDtoHAsync")?;
        self.synchronize()
    }

    /// Queues a copy engine transfer of `bytes` from `src` on `src_gpu` to `dst` on this device
    /// (`cuMemcpyPeerAsync`, over NVLink where there is one).
    ///
    /// # Safety
    /// `[src, src + bytes)` must be `src_gpu`'s memory and `[dst, dst + bytes)` this device's, neither
    /// in use by other work until the stream reaches the copy.
    pub unsafe fn copy_peer_raw(
        &self,
        dst: u64,
        src_gpu: &Gpu,
        src: u64,
        bytes: usize,
    ) -> Result<()> {
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the caller's contract; both contexts are alive.
        unsafe {
            sys::cuMemcpyPeerAsync(
                dst,
                self.context().cu_ctx(),
                src,
                src_gpu.context().cu_ctx(),
                bytes,
                self.stream().cu_stream(),
            )
        }
        .result()
        .call("cuMemcpyPeerAsync")
    }
}
