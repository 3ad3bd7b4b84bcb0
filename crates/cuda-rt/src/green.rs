//! [`Gpu::split`]: one device as several handles whose streams each run on their own share of the
//! SMs (green contexts). Ranks that share a GPU get a share each, so every rank's persistent grid
//! is resident at once with the others' — a grid that waits for a peer's progress cannot take the
//! SMs that peer needs. Memory and modules stay the primary context's: a kernel loaded once runs on
//! every share's stream (seen on H200, driver 580: CTAs stay on the share's SMs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use crate::error::DriverCall;
use crate::{DeviceInfo, Error, Gpu, Result};

/// One share's green context and stream. Buffers allocated on a share's stream may outlive every
/// handle (cudarc frees them on it), so shares live as long as the process: one set per (device,
/// parts), made on first use and reused by every later split.
struct Share {
    stream: sys::CUstream,
    sm_count: u32,
}

// SAFETY: the handles are driver objects usable from any thread; they are never destroyed.
unsafe impl Send for Share {}
unsafe impl Sync for Share {}

/// Every set of shares made so far, by (device, parts).
type Made = HashMap<(usize, usize), Arc<Vec<Share>>>;

fn shares(ordinal: usize, parts: usize) -> Result<Arc<Vec<Share>>> {
    static MADE: OnceLock<Mutex<Made>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(s) = made.get(&(ordinal, parts)) {
        return Ok(s.clone());
    }
    let s = Arc::new(make_shares(ordinal, parts)?);
    made.insert((ordinal, parts), s.clone());
    Ok(s)
}

fn make_shares(ordinal: usize, parts: usize) -> Result<Vec<Share>> {
    let device = cudarc::driver::result::device::get(ordinal as i32).call("cuDeviceGet")?;
    // SAFETY: a plain C struct, all zeros valid; the driver fills it.
    let mut all: sys::CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: a valid device and one resource to fill.
    unsafe {
        sys::cuDeviceGetDevResource(
            device,
            &mut all,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
    }
    .result()
    .call("cuDeviceGetDevResource")?;
    // SAFETY: reading the SM variant of a resource of type SM.
    let sm = unsafe { all.__bindgen_anon_1.sm };
    // A share's SMs: a multiple of the co-scheduling alignment, at least the smallest partition.
    let align = sm.smCoscheduledAlignment.max(1);
    let per_share = sm.smCount / parts.max(1) as u32 / align * align;
    if parts == 0 || per_share < sm.minSmPartitionSize.max(1) {
        return Err(Error::InvalidLaunch {
            kernel: format!("GPU {ordinal}"),
            reason: format!(
                "{} SMs cannot be split into {parts} shares of at least {} SMs (multiples of {align})",
                sm.smCount, sm.minSmPartitionSize
            ),
        });
    }
    // SAFETY: plain C structs, all zeros valid; the driver fills them.
    let mut groups: Vec<sys::CUdevResource> = vec![unsafe { std::mem::zeroed() }; parts];
    let mut count = parts as u32;
    // SAFETY: room for `parts` groups; no remainder wanted (null).
    unsafe {
        sys::cuDevSmResourceSplitByCount(
            groups.as_mut_ptr(),
            &mut count,
            &all,
            std::ptr::null_mut(),
            0,
            per_share,
        )
    }
    .result()
    .call("cuDevSmResourceSplitByCount")?;
    if count as usize != parts {
        return Err(Error::InvalidLaunch {
            kernel: format!("GPU {ordinal}"),
            reason: format!(
                "the driver split {} SMs into {count} shares of {per_share}, not {parts}",
                sm.smCount
            ),
        });
    }
    groups
        .iter_mut()
        .map(|group: &mut sys::CUdevResource| {
            let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
            // SAFETY: one resource the split produced.
            unsafe { sys::cuDevResourceGenerateDesc(&mut desc, group, 1) }
                .result()
                .call("cuDevResourceGenerateDesc")?;
            let mut green: sys::CUgreenCtx = std::ptr::null_mut();
            // SAFETY: a descriptor of this device's SMs.
            unsafe {
                sys::cuGreenCtxCreate(
                    &mut green,
                    desc,
                    device,
                    sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
                )
            }
            .result()
            .call("cuGreenCtxCreate")?;
            let mut stream: sys::CUstream = std::ptr::null_mut();
            // SAFETY: a live green context; priority 0.
            unsafe {
                sys::cuGreenCtxStreamCreate(
                    &mut stream,
                    green,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                    0,
                )
            }
            .result()
            .call("cuGreenCtxStreamCreate")?;
            // SAFETY: reading the SM variant of a resource of type SM.
            let sm_count = unsafe { group.__bindgen_anon_1.sm.smCount };
            Ok(Share { stream, sm_count })
        })
        .collect()
}

impl Gpu {
    /// `parts` handles on device `ordinal`, each with a stream of its own share of the SMs (an
    /// equal share, a multiple of the device's co-scheduling alignment, the remainder unused) and [`DeviceInfo::sm_count`] saying how
    /// many, so a persistent grid sized from it fits its share. Memory, modules and peer access are
    /// the device's primary context's, as for [`Gpu::open`]. Splitting a device again into as
    /// many parts returns the same shares.
    pub fn split(ordinal: usize, parts: usize) -> Result<Vec<Gpu>> {
        let (info, ctx) = Gpu::primary_context(ordinal)?;
        let shares = shares(ordinal, parts)?;
        Ok(shares
            .iter()
            .map(|share| {
                // SAFETY: the share's stream belongs to a green context of this device and lives
                // as long as the process; all of a handle's work is on it (as for Gpu::open).
                let stream = unsafe { ctx.wrap_borrowed_stream(share.stream) };
                Gpu::from_parts(
                    DeviceInfo {
                        sm_count: share.sm_count,
                        ..info.clone()
                    },
                    ctx.clone(),
                    stream,
                )
            })
            .collect())
    }
}
