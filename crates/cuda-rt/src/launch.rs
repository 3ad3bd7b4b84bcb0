//! Launching: [`LaunchConfig`] (grid, block, dynamic shared memory, cluster shape, cooperative,
//! programmatic dependent launch), the [`Launch`] argument builder, and [`LaunchArgs`]: arguments
//! assembled once for a launch that repeats ([`Kernel::launch_with`]: no allocation, only the
//! arguments that change rewritten). Every launch goes through `cuLaunchKernelEx`, since cudarc's
//! launch has no cluster attribute. Also the occupancy queries a persistent grid is sized by
//! (`Kernel::max_active_clusters`, `Kernel::max_active_blocks_per_sm`).

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop, sys};

use crate::error::DriverCall;
use crate::{Error, Kernel, Result, TensorMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_smem_bytes: u32,
    /// Thread-block cluster shape (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`); each grid dimension must
    /// be a multiple of it. Kernels compiled with `__cluster_dims__` need none.
    pub cluster: Option<[u32; 3]>,
    /// All blocks co-resident (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`), as grid-wide barriers require.
    pub cooperative: bool,
    /// Programmatic dependent launch (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`): the
    /// kernel may start before the previous kernel on the stream has finished, once every block of
    /// that one has called `launch_dependents()` (cuda_rt.cuh) or exited. The kernel must call
    /// `wait_for_predecessor()` before it touches global memory the previous kernels write or read.
    pub programmatic: bool,
}

impl LaunchConfig {
    pub fn new(grid: [u32; 3], block: [u32; 3]) -> Self {
        Self {
            grid,
            block,
            dynamic_smem_bytes: 0,
            cluster: None,
            cooperative: false,
            programmatic: false,
        }
    }

    /// A 1-D grid of 1-D blocks.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Self::new([blocks, 1, 1], [threads, 1, 1])
    }

    pub fn dynamic_smem(mut self, bytes: u32) -> Self {
        self.dynamic_smem_bytes = bytes;
        self
    }

    pub fn cluster(mut self, shape: [u32; 3]) -> Self {
        self.cluster = Some(shape);
        self
    }

    pub fn cooperative(mut self) -> Self {
        self.cooperative = true;
        self
    }

    /// See [`LaunchConfig::programmatic`].
    pub fn programmatic(mut self, on: bool) -> Self {
        self.programmatic = on;
        self
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(format!(
                "grid {:?} and block {:?} must be non-zero",
                self.grid, self.block
            ));
        }
        let threads: u64 = self.block.iter().map(|&d| u64::from(d)).product();
        if threads > 1024 {
            return Err(format!(
                "block {:?} has {threads} threads, more than 1024",
                self.block
            ));
        }
        if let Some(cluster) = self.cluster {
            let fits = cluster
                .iter()
                .zip(&self.grid)
                .all(|(&c, &g)| c > 0 && g % c == 0);
            if !fits {
                return Err(format!(
                    "grid {:?} is not a multiple of cluster {cluster:?}",
                    self.grid
                ));
            }
        }
        Ok(())
    }
}

/// One kernel parameter's bytes. Every slot is 128 bytes, 128-aligned: big enough for a `CUtensorMap`
/// (passed by value as a `__grid_constant__` parameter) and aligned for anything smaller. The driver
/// copies them at launch, so they only need to stay put during `cuLaunchKernelEx`.
#[repr(C, align(128))]
#[derive(Clone, Copy)]
struct ArgSlot([u8; 128]);

/// Most arguments a kernel takes: its parameters are at most 4 KiB, one slot or more each.
const MAX_ARGS: usize = 4096 / size_of::<ArgSlot>();

/// A kernel's arguments in its parameter order, each in slots of its own, contiguous (a struct
/// over 128 bytes takes several). Assembled once, they launch any number of times
/// ([`Kernel::launch_with`]); an argument is rewritten in place through the index its push
/// returned ([`LaunchArgs::set`]), so a launch that repeats copies only what changes and
/// allocates nothing.
#[derive(Clone, Default)]
pub struct LaunchArgs {
    slots: Vec<ArgSlot>,
    /// Each argument's first slot.
    starts: Vec<usize>,
}

/// Where [`LaunchArgs::push`] put an argument of type `T`: [`LaunchArgs::set`] rewrites it with
/// another `T`, so it keeps its size.
#[derive(Debug)]
pub struct ArgIndex<T> {
    index: usize,
    arg: PhantomData<fn(T)>,
}

impl<T> Clone for ArgIndex<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ArgIndex<T> {}

impl LaunchArgs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a by-value parameter: integers, floats, raw device addresses (`u64`), `#[repr(C)]`
    /// POD structs (of any size; a kernel's parameters are at most 4 KiB in all).
    pub fn push<T: bytemuck::Pod>(&mut self, value: &T) -> ArgIndex<T> {
        let bytes = bytemuck::bytes_of(value);
        let start = self.slots.len();
        self.slots.resize(
            start + bytes.len().div_ceil(size_of::<ArgSlot>()).max(1),
            ArgSlot([0; 128]),
        );
        self.starts.push(start);
        let index = ArgIndex {
            index: self.starts.len() - 1,
            arg: PhantomData,
        };
        self.set(index, value);
        index
    }

    /// Appends a `const __grid_constant__ CUtensorMap` parameter.
    pub fn push_tensor_map(&mut self, map: &TensorMap) -> ArgIndex<[u8; 128]> {
        self.push(&map.to_bytes())
    }

    /// Rewrites the argument at `index` (of these arguments) with `value`.
    ///
    /// # Panics
    /// When `index` came from other arguments and lies past these.
    pub fn set<T: bytemuck::Pod>(&mut self, index: ArgIndex<T>, value: &T) {
        let start = self.starts[index.index];
        let bytes = bytemuck::bytes_of(value);
        let slots = &mut self.slots[start..start + bytes.len().div_ceil(size_of::<ArgSlot>())];
        for (slot, chunk) in slots.iter_mut().zip(bytes.chunks(size_of::<ArgSlot>())) {
            slot.0[..chunk.len()].copy_from_slice(chunk);
        }
    }

    /// How many arguments there are.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
}

/// A launch being assembled; see [`Kernel::launch`]. Arguments are added in the kernel's parameter order.
/// Device buffers are borrowed until the launch is queued, and cudarc's event tracking orders them
/// against other streams.
#[must_use = "a launch does nothing until `.launch()`"]
pub struct Launch<'a> {
    kernel: &'a Kernel,
    stream: &'a CudaStream,
    config: LaunchConfig,
    args: LaunchArgs,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Launch<'a> {
    pub(crate) fn new(kernel: &'a Kernel, stream: &'a CudaStream, config: LaunchConfig) -> Self {
        Self {
            kernel,
            stream,
            config,
            args: LaunchArgs::new(),
            guards: Vec::new(),
        }
    }

    /// A `const T*` parameter.
    pub fn ptr<T>(mut self, buf: &'a impl DevicePtr<T>) -> Self {
        let (ptr, guard) = buf.device_ptr(self.stream);
        self.guards.push(guard);
        self.scalar(ptr)
    }

    /// A `T*` parameter the kernel writes.
    pub fn ptr_mut<T>(mut self, buf: &'a mut impl DevicePtrMut<T>) -> Self {
        let (ptr, guard) = buf.device_ptr_mut(self.stream);
        self.guards.push(guard);
        self.scalar(ptr)
    }

    /// A by-value parameter: integers, floats, raw device addresses (`u64`), `#[repr(C)]` POD
    /// structs (of any size; a kernel's parameters are at most 4 KiB in all).
    pub fn scalar<T: bytemuck::Pod>(mut self, value: T) -> Self {
        self.args.push(&value);
        self
    }

    /// A `const __grid_constant__ CUtensorMap` parameter.
    pub fn tensor_map(mut self, map: &TensorMap) -> Self {
        self.args.push_tensor_map(map);
        self
    }

    /// Queues the kernel on the stream.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameter list in number, order and type, and the kernel
    /// must stay within the buffers it is given: neither can be checked from the host.
    pub unsafe fn launch(self) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            self.kernel
                .launch_with(self.stream, self.config, &self.args)
        }?;
        // Dropping the guards now records the buffers' use by this launch.
        drop(self.guards);
        Ok(())
    }
}

impl Kernel {
    /// Queues the kernel on `stream` with `args` (assembled once, e.g. by a caller that launches
    /// the same kernel on the same buffers again and again): no allocation, nothing copied but
    /// what the driver copies. Device buffers in `args` are raw addresses: ordering them against
    /// other streams is the caller's.
    ///
    /// # Safety
    /// As [`Launch::launch`]: `args` must match the kernel's parameter list in number, order and
    /// type, and the kernel must stay within the buffers it is given.
    pub unsafe fn launch_with(
        &self,
        stream: &CudaStream,
        config: LaunchConfig,
        args: &LaunchArgs,
    ) -> Result<()> {
        config
            .check()
            .and_then(|()| {
                if args.len() > MAX_ARGS {
                    Err(format!(
                        "{} arguments; a kernel's 4 KiB of parameters hold at most {MAX_ARGS}",
                        args.len()
                    ))
                } else {
                    Ok(())
                }
            })
            .map_err(|reason| Error::InvalidLaunch {
                kernel: self.name().to_owned(),
                reason,
            })?;
        self.reserve_dynamic_smem(config.dynamic_smem_bytes)?;
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;

        let mut attrs = config.attributes();
        let launch_config = config.driver(stream.cu_stream(), attrs.as_mut_slice());
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (param, &start) in params.iter_mut().zip(&args.starts) {
            *param = args.slots[start..].as_ptr().cast_mut().cast();
        }
        // SAFETY: the config, attributes and parameter slots outlive the call, which copies them; the
        // parameter list itself is the caller's contract.
        unsafe {
            sys::cuLaunchKernelEx(
                &launch_config,
                self.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .call("cuLaunchKernelEx")
    }
}

/// A launch's attributes (cluster, cooperative, programmatic: at most one each), held in place.
struct Attributes {
    list: [sys::CUlaunchAttribute; 3],
    len: usize,
}

impl Attributes {
    fn push(&mut self, attribute: sys::CUlaunchAttribute) {
        self.list[self.len] = attribute;
        self.len += 1;
    }

    #[cfg(test)]
    fn as_slice(&self) -> &[sys::CUlaunchAttribute] {
        &self.list[..self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [sys::CUlaunchAttribute] {
        &mut self.list[..self.len]
    }
}

impl LaunchConfig {
    /// The cluster, cooperative and programmatic attributes of a driver launch config.
    fn attributes(&self) -> Attributes {
        use sys::CUlaunchAttributeID as Id;
        // Unused entries are never passed (`as_slice`).
        let unused = attribute(Id::CU_LAUNCH_ATTRIBUTE_IGNORE, |_| {});
        let mut attrs = Attributes {
            list: [unused; 3],
            len: 0,
        };
        if let Some([x, y, z]) = self.cluster {
            attrs.push(attribute(Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, |v| {
                v.clusterDim.x = x;
                v.clusterDim.y = y;
                v.clusterDim.z = z;
            }));
        }
        if self.cooperative {
            attrs.push(attribute(Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, |v| {
                v.cooperative = 1;
            }));
        }
        if self.programmatic {
            attrs.push(attribute(
                Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                |v| v.programmaticStreamSerializationAllowed = 1,
            ));
        }
        attrs
    }

    /// The driver's launch config; `attrs` must outlive its use.
    fn driver(
        &self,
        stream: sys::CUstream,
        attrs: &mut [sys::CUlaunchAttribute],
    ) -> sys::CUlaunchConfig {
        let [gx, gy, gz] = self.grid;
        let [bx, by, bz] = self.block;
        sys::CUlaunchConfig {
            gridDimX: gx,
            gridDimY: gy,
            gridDimZ: gz,
            blockDimX: bx,
            blockDimY: by,
            blockDimZ: bz,
            sharedMemBytes: self.dynamic_smem_bytes,
            hStream: stream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        }
    }
}

impl Kernel {
    /// How many clusters of `config`'s shape (block, dynamic shared memory, cluster) can be
    /// resident on the device at once (`cuOccupancyMaxActiveClusters`): a persistent kernel's grid.
    /// SMs whose GPC has no room for a whole cluster stay out, so this can be less than the SM
    /// count over the cluster size.
    pub fn max_active_clusters(&self, config: &LaunchConfig) -> Result<u32> {
        self.reserve_dynamic_smem(config.dynamic_smem_bytes)?;
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        let mut attrs = config.attributes();
        let driver = config.driver(std::ptr::null_mut(), attrs.as_mut_slice());
        let mut clusters = 0i32;
        // SAFETY: the config and its attributes outlive the call, which only reads them.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, self.cu_function(), &driver) }
            .result()
            .call("cuOccupancyMaxActiveClusters")?;
        Ok(clusters.max(0) as u32)
    }

    /// How many blocks of `threads` threads and `dynamic_smem_bytes` of dynamic shared memory can
    /// be resident on one SM at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub fn max_active_blocks_per_sm(&self, threads: u32, dynamic_smem_bytes: u32) -> Result<u32> {
        self.reserve_dynamic_smem(dynamic_smem_bytes)?;
        self.context().bind_to_thread().call("cuCtxSetCurrent")?;
        let mut blocks = 0i32;
        // SAFETY: a loaded function and plain numbers.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                self.cu_function(),
                threads as i32,
                dynamic_smem_bytes as usize,
            )
        }
        .result()
        .call("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        Ok(blocks.max(0) as u32)
    }
}

/// A launch attribute whose value `set` writes into an all-zero union (the field of `id`).
fn attribute(
    id: sys::CUlaunchAttributeID,
    set: impl FnOnce(&mut sys::CUlaunchAttributeValue),
) -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero attribute value is valid for every field of the union.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    set(&mut value);
    sys::CUlaunchAttribute {
        id,
        pad: [0; 4],
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_follow_the_config() {
        let ids = |c: LaunchConfig| -> Vec<sys::CUlaunchAttributeID> {
            c.attributes().as_slice().iter().map(|a| a.id).collect()
        };
        assert!(ids(LaunchConfig::linear(4, 32)).is_empty());
        assert!(ids(LaunchConfig::linear(4, 32).programmatic(false)).is_empty());
        assert_eq!(
            ids(LaunchConfig::linear(4, 32)
                .cluster([2, 1, 1])
                .cooperative()
                .programmatic(true)),
            [
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            ]
        );
        let programmatic = LaunchConfig::linear(4, 32)
            .programmatic(true)
            .attributes()
            .as_slice()[0];
        // SAFETY: the attribute was built with this union field.
        assert_eq!(
            unsafe { programmatic.value.programmaticStreamSerializationAllowed },
            1
        );
    }

    #[test]
    fn arguments_are_rewritten_in_place() {
        #[repr(C)]
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        struct Wide([u64; 20]);
        let mut args = LaunchArgs::new();
        let first = args.push(&7u32);
        let wide = args.push(&Wide([1; 20]));
        args.push(&9u64);
        // 4 B in one slot, 160 B in two, 8 B in one.
        assert_eq!(
            (args.len(), args.slots.len(), &args.starts[..]),
            (3, 4, &[0, 1, 3][..])
        );
        args.set(wide, &Wide([2; 20]));
        args.set(first, &8u32);
        let slot_words = |slot: usize| -> Vec<u64> {
            bytemuck::cast_slice::<u8, u64>(&args.slots[slot].0).to_vec()
        };
        assert_eq!(slot_words(0)[0], 8);
        assert!(slot_words(1).iter().all(|&w| w == 2));
        assert_eq!(slot_words(2)[..4], [2; 4]);
        assert!(
            slot_words(2)[4..].iter().all(|&w| w == 0),
            "past the value: zeros"
        );
        assert_eq!(slot_words(3)[0], 9);
    }
}
