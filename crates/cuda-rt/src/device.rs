//! Devices: discovery that returns errors instead of panicking, the [`Gpu`] handle (primary context +
//! one stream), and the few memory helpers cudarc's `CudaStream` lacks in checked form.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, HostSlice,
    PinnedHostSlice, ValidAsZeroBits, result, sys,
};

use crate::error::DriverCall;
use crate::{Arch, Error, Result};

/// Loads libcuda and runs `cuInit` once. cudarc panics on the first driver call when libcuda is absent,
/// so every driver entry point of this crate goes through here first.
pub(crate) fn driver() -> Result<()> {
    // `None`: no libcuda; `Some(code)`: cuInit's result.
    static INIT: OnceLock<Option<sys::CUresult>> = OnceLock::new();
    let init = INIT.get_or_init(|| {
        driver_present().then(|| {
            result::init()
                .err()
                .map_or(sys::CUresult::CUDA_SUCCESS, |e| e.0)
        })
    });
    match *init {
        None => Err(Error::NoDriver),
        Some(sys::CUresult::CUDA_SUCCESS) => Ok(()),
        Some(sys::CUresult::CUDA_ERROR_NO_DEVICE) => Err(Error::NoDevice),
        Some(code) => Err(Error::Driver {
            call: "cuInit",
            source: result::DriverError(code),
        }),
    }
}

/// Whether libcuda can be loaded here (no driver call is made).
pub fn driver_present() -> bool {
    // SAFETY: only probes dlopen.
    unsafe { sys::is_culib_present() }
}

/// What the driver says about one device; read without creating a context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    /// Largest shared memory one block may opt into (`cudaFuncAttributeMaxDynamicSharedMemorySize`).
    pub smem_per_block_optin: u32,
    pub l2_bytes: u32,
    pub total_mem_bytes: usize,
    /// `domain:bus:device.function`, as NVML and `nvidia-smi` name the device (the CUDA ordinal
    /// need not be NVML's index).
    pub pci_bus_id: String,
}

impl DeviceInfo {
    /// The compile target for this device, if we have one.
    pub fn arch(&self) -> Option<Arch> {
        Arch::for_compute_capability(self.compute_capability)
    }

    fn query(ordinal: usize) -> Result<Self> {
        let dev = result::device::get(ordinal as i32).call("cuDeviceGet")?;
        let attr = |a: sys::CUdevice_attribute| -> Result<u32> {
            // SAFETY: `dev` is a valid device handle.
            let v =
                unsafe { result::device::get_attribute(dev, a) }.call("cuDeviceGetAttribute")?;
            Ok(v.max(0) as u32)
        };
        use sys::CUdevice_attribute as A;
        Ok(Self {
            ordinal,
            name: result::device::get_name(dev).call("cuDeviceGetName")?,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            smem_per_block_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            // SAFETY: as above.
            total_mem_bytes: unsafe { result::device::total_mem(dev) }.call("cuDeviceTotalMem")?,
            pci_bus_id: pci_bus_id(dev)?,
        })
    }
}

fn pci_bus_id(dev: sys::CUdevice) -> Result<String> {
    let mut id = [0 as std::ffi::c_char; 32];
    // SAFETY: the driver writes a NUL-terminated string of at most `len` bytes into `id`.
    unsafe { sys::cuDeviceGetPCIBusId(id.as_mut_ptr(), id.len() as i32, dev) }
        .result()
        .call("cuDeviceGetPCIBusId")?;
    // SAFETY: NUL-terminated within `id`, as above.
    Ok(unsafe { std::ffi::CStr::from_ptr(id.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// One device, opened: its primary context and a non-blocking stream for this handle's work. All of
/// a handle's work runs on that one stream, in order, so its buffers carry no cross-stream events
/// (cudarc's event tracking is off: a launch's buffers cost no `cuStreamWaitEvent` /
/// `cuEventRecord` pair each, which made a forward's host side tens of µs slower).
///
/// The handle counts the device allocations made through it ([`Gpu::device_allocations`]; its
/// clones share the count): a caller that must not allocate on a hot path, a forward above all,
/// checks that the count stands still across it.
#[derive(Debug, Clone)]
pub struct Gpu {
    info: DeviceInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Device allocations made through this handle or its clones: [`Gpu::alloc_zeros`],
    /// [`Gpu::upload`], [`crate::SharedMemory::create`].
    device_allocations: Arc<AtomicU64>,
}

impl Gpu {
    /// Number of devices; `Err(NoDriver)` without libcuda.
    pub fn count() -> Result<usize> {
        driver()?;
        let n = result::device::get_count().call("cuDeviceGetCount")?;
        Ok(n.max(0) as usize)
    }

    /// Every device; `Err(NoDriver)` / `Err(NoDevice)` when there is none.
    pub fn list() -> Result<Vec<DeviceInfo>> {
        match Self::count()? {
            0 => Err(Error::NoDevice),
            n => (0..n).map(DeviceInfo::query).collect(),
        }
    }

    /// Opens device `ordinal` (retains its primary context, creates a stream).
    pub fn open(ordinal: usize) -> Result<Self> {
        let (info, ctx) = Self::primary_context(ordinal)?;
        let stream = ctx.new_stream().call("cuStreamCreate")?;
        tracing::debug!(?info, "GPU opened");
        Ok(Self::from_parts(info, ctx, stream))
    }

    /// Device `ordinal`'s description and its primary context, retained, with cudarc's event
    /// tracking off: every handle on it does all its work on its one stream.
    pub(crate) fn primary_context(ordinal: usize) -> Result<(DeviceInfo, Arc<CudaContext>)> {
        let count = Self::count()?;
        if count == 0 {
            return Err(Error::NoDevice);
        }
        if ordinal >= count {
            return Err(Error::InvalidOrdinal { ordinal, count });
        }
        let info = DeviceInfo::query(ordinal)?;
        let ctx = CudaContext::new(ordinal).call("cuDevicePrimaryCtxRetain")?;
        // SAFETY: every buffer of this context object is allocated, used and freed (stream-ordered)
        // on the one stream of the handle it goes to, so there is no cross-stream order for events
        // to keep.
        unsafe { ctx.disable_event_tracking() };
        Ok((info, ctx))
    }

    /// A handle from its parts (a share of the SMs, [`Gpu::split`]).
    pub(crate) fn from_parts(
        info: DeviceInfo,
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
    ) -> Self {
        Self {
            info,
            ctx,
            stream,
            device_allocations: Arc::default(),
        }
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// This handle's stream; the memory helpers below and most launches use it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for this handle's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().call("cuStreamSynchronize")
    }

    /// How many device allocations were asked for through this handle and its clones since it was
    /// opened ([`Gpu::alloc_zeros`], [`Gpu::upload`], [`crate::SharedMemory::create`]; refused ones
    /// too). Memory allocated through cudarc's stream directly is not counted.
    pub fn device_allocations(&self) -> u64 {
        self.device_allocations.load(Ordering::Relaxed)
    }

    /// Counts one device allocation made through this handle.
    pub(crate) fn count_device_allocation(&self) {
        self.device_allocations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.count_device_allocation();
        self.stream.alloc_zeros(len).call("cuMemAllocAsync")
    }

    /// A new device buffer holding `host` (an allocation: [`Gpu::upload_into`] reuses one).
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.count_device_allocation();
        self.stream.clone_htod(host).call("cuMemcpyHtoDAsync")
    }

    /// Copies `host` (a slice, or pinned memory: [`Gpu::alloc_pinned`]) into the first
    /// `host.len()` elements of `dst` (a buffer reused from call to call: no allocation), ordered
    /// on the stream.
    pub fn upload_into<T: DeviceRepr, Src: HostSlice<T> + ?Sized>(
        &self,
        host: &Src,
        dst: &mut CudaSlice<T>,
    ) -> Result<()> {
        let len = host.len();
        if len > dst.len() {
            return Err(Error::CopyTooLong {
                len,
                capacity: dst.len(),
            });
        }
        if len == 0 {
            return Ok(());
        }
        self.stream
            .memcpy_htod(host, &mut dst.slice_mut(0..len))
            .call("cuMemcpyHtoDAsync")
    }

    /// `len` zeros in page-locked, write-combined host memory (for the host to write and the device
    /// to read; host reads of it are slow): a copy from it to the device is queued without the
    /// staging (and the wait) a copy from pageable memory takes. Its `as_mut_slice` waits for the
    /// last copy that read it.
    pub fn alloc_pinned<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<PinnedHostSlice<T>> {
        // SAFETY: the memory is zeroed below, before anyone reads it.
        let mut host = unsafe { self.ctx.alloc_pinned::<T>(len) }.call("cuMemHostAlloc")?;
        let ptr = host.as_mut_ptr().call("cuEventSynchronize")?;
        // SAFETY: `ptr` addresses `len` elements of T we own; all-zero bits are a valid T.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(host)
    }

    /// Copies `src` to the host once the stream's earlier work is done.
    pub fn download<T: DeviceRepr>(&self, src: &impl DevicePtr<T>) -> Result<Vec<T>> {
        let host = self.stream.clone_dtoh(src).call("cuMemcpyDtoHAsync")?;
        self.synchronize()?;
        Ok(host)
    }

    /// Sets every byte of `dst` to `byte` (e.g. 0xFF to poison an output), ordered on the stream.
    pub fn memset<T>(&self, dst: &mut impl DevicePtrMut<T>, byte: u8) -> Result<()> {
        let bytes = dst.num_bytes();
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let (ptr, _record) = dst.device_ptr_mut(&self.stream);
        // SAFETY: `ptr` addresses `bytes` bytes of this context's memory; `_record` orders later users.
        unsafe { sys::cuMemsetD8Async(ptr, byte, bytes, self.stream.cu_stream()) }
            .result()
            .call("cuMemsetD8Async")
    }
}
