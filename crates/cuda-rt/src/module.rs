//! Loaded code: a cubin as a [`Module`], its entry functions as [`Kernel`]s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, sys};
use cudarc::nvrtc::Ptx;

use crate::error::DriverCall;
use crate::launch::{Launch, LaunchConfig};
use crate::{Error, Gpu, Result};

/// A cubin loaded into one device's context (`cuModuleLoadData`).
#[derive(Debug, Clone)]
pub struct Module {
    module: Arc<CudaModule>,
    ctx: Arc<CudaContext>,
    smem_per_block_optin: u32,
}

impl Gpu {
    /// Loads a cubin (from [`crate::Jit::compile`]) built for this device's architecture.
    pub fn load_module(&self, cubin: &[u8]) -> Result<Module> {
        // cuModuleLoadData reads an ELF image; anything else is a caller bug better named here.
        if !cubin.starts_with(b"\x7fELF") {
            return Err(Error::InvalidModule("the image is not an ELF cubin"));
        }
        let module = self
            .context()
            .load_module(Ptx::from_binary(cubin.to_vec()))
            .call("cuModuleLoadData")?;
        Ok(Module {
            module,
            ctx: self.context().clone(),
            smem_per_block_optin: self.info().smem_per_block_optin,
        })
    }
}

impl Module {
    /// The entry function `name` (its symbol: declare kernels `extern "C"` to keep names unmangled).
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        if name.contains('\0') {
            return Err(Error::KernelNotFound(name.to_owned()));
        }
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let func = self.module.load_function(name).map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_NOT_FOUND => Error::KernelNotFound(name.to_owned()),
            _ => Error::Driver {
                call: "cuModuleGetFunction",
                source: e,
            },
        })?;
        use sys::CUfunction_attribute as A;
        let attr = |a| func.get_attribute(a).call("cuFuncGetAttribute");
        let static_smem = attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?.max(0) as u32;
        let dynamic_smem = attr(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?.max(0) as u32;
        Ok(Kernel {
            func,
            name: name.to_owned(),
            ctx: self.ctx.clone(),
            static_smem,
            dynamic_smem_limit: AtomicU32::new(dynamic_smem),
            smem_per_block_optin: self.smem_per_block_optin,
        })
    }
}

/// One entry function, ready to launch.
#[derive(Debug)]
pub struct Kernel {
    func: CudaFunction,
    name: String,
    ctx: Arc<CudaContext>,
    static_smem: u32,
    /// Current `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`; raised on demand by launches.
    dynamic_smem_limit: AtomicU32,
    smem_per_block_optin: u32,
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn function(&self) -> &CudaFunction {
        &self.func
    }

    pub fn num_registers(&self) -> Result<u32> {
        Ok(self.func.num_regs().call("cuFuncGetAttribute")?.max(0) as u32)
    }

    /// Starts a launch on `stream`; add the arguments in the kernel's parameter order.
    pub fn launch<'a>(&'a self, stream: &'a CudaStream, config: LaunchConfig) -> Launch<'a> {
        Launch::new(self, stream, config)
    }

    /// Allows `bytes` of dynamic shared memory, raising the function attribute past the default 48 KiB
    /// when needed; the sum with static shared memory must fit the device's opt-in limit.
    pub fn reserve_dynamic_smem(&self, bytes: u32) -> Result<()> {
        if bytes <= self.dynamic_smem_limit.load(Ordering::Acquire) {
            return Ok(());
        }
        let limit = self.smem_per_block_optin.saturating_sub(self.static_smem);
        if bytes > limit {
            return Err(Error::InvalidLaunch {
                kernel: self.name.clone(),
                reason: format!(
                    "{bytes} B of dynamic shared memory requested; the device allows {limit} B \
                     beside the kernel's {} B of static shared memory",
                    self.static_smem
                ),
            });
        }
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        self.func
            .set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .call("cuFuncSetAttribute")?;
        self.dynamic_smem_limit.fetch_max(bytes, Ordering::AcqRel);
        Ok(())
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub(crate) fn cu_function(&self) -> sys::CUfunction {
        self.func.cu_function()
    }
}
