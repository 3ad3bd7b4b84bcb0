//! [`Gpu::split`]: one device as several handles whose streams each run on their own share of the
//! SMs (green contexts). Ranks that share a GPU get a share each, so every rank's persistent grid
//! is resident at once with the others' — a grid that waits for a peer's progress cannot take the
//! SMs that peer needs. Memory and modules stay the primary context's: a kernel loaded once runs on
//! every share's stream (seen on H200, driver 580: CTAs stay on the share's SMs).
//!
//! Disjoint SMs alone do not let the shares' grids run side by side: the driver feeds every stream
//! of the process through `CUDA_DEVICE_MAX_CONNECTIONS` hardware work queues (8 unless set before
//! CUDA starts, 32 at most), and streams that share a queue start their work in order — `cuda.h`
//! warns that green contexts get no forward-progress guarantee from their SMs for this reason. A
//! rank whose grid waits for a peer's, queued behind it, would wait out its timeout. So a split
//! is refused when the shares' streams could not each have a queue of their own.

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

/// The most hardware work queues the driver gives a process, and what it gives unless asked.
pub const MAX_CONNECTIONS: usize = 32;
const DEFAULT_CONNECTIONS: usize = 8;

/// Streams a share makes: its green context's default stream (which `cuGreenCtxCreate` requires)
/// and the one its handle runs on.
const STREAMS_PER_SHARE: usize = 2;

/// The hardware work queues the driver gives a process's streams: `CUDA_DEVICE_MAX_CONNECTIONS`
/// as the driver reads it when CUDA starts (`DEFAULT_CONNECTIONS`, 8, when unset; 1 to
/// [`MAX_CONNECTIONS`]).
pub fn device_connections() -> usize {
    static CONNECTIONS: OnceLock<usize> = OnceLock::new();
    *CONNECTIONS.get_or_init(|| {
        connections_from(std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok().as_deref())
    })
}

/// Asks the driver for the most hardware work queues it gives ([`MAX_CONNECTIONS`])
/// unless the variable is set already: for programs that split a GPU between ranks
/// ([`Gpu::split`]). The driver reads it when CUDA starts, so this comes first.
///
/// # Safety
///
/// It changes the process's environment, so, as for [`std::env::set_var`], no other thread may
/// run at the time: call it at the start of `main`.
pub unsafe fn ask_for_every_connection() {
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // SAFETY: the caller runs no other thread (this function's contract).
        unsafe { std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", MAX_CONNECTIONS.to_string()) };
    }
}

fn connections_from(value: Option<&str>) -> usize {
    value
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(DEFAULT_CONNECTIONS, |n| n.clamp(1, MAX_CONNECTIONS))
}

/// Refuses `parts` more shares of device `ordinal` when, with the `made` streams of its earlier
/// splits, their streams outnumber the `connections`.
fn check_connections(ordinal: usize, parts: usize, made: usize, connections: usize) -> Result<()> {
    let needed = made + STREAMS_PER_SHARE * parts;
    if needed > connections {
        return Err(Error::TooFewConnections {
            ordinal,
            parts,
            needed,
            connections,
        });
    }
    Ok(())
}

fn shares(ordinal: usize, parts: usize) -> Result<Arc<Vec<Share>>> {
    static MADE: OnceLock<Mutex<Made>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(s) = made.get(&(ordinal, parts)) {
        return Ok(s.clone());
    }
    let made_streams = made
        .iter()
        .filter(|((o, _), _)| *o == ordinal)
        .map(|(_, s)| STREAMS_PER_SHARE * s.len())
        .sum();
    check_connections(ordinal, parts, made_streams, device_connections())?;
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
    /// many parts returns the same shares. Refused ([`Error::TooFewConnections`]) when the shares'
    /// streams, with those of the device's earlier splits, outnumber [`device_connections`].
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_the_drivers_reading_of_the_variable() {
        assert_eq!(connections_from(None), 8);
        assert_eq!(connections_from(Some("32")), 32);
        assert_eq!(connections_from(Some(" 16 ")), 16);
        assert_eq!(connections_from(Some("64")), 32);
        assert_eq!(connections_from(Some("0")), 1);
        assert_eq!(connections_from(Some("many")), 8);
    }

    #[test]
    fn a_split_needs_a_queue_for_every_stream_of_the_device() {
        // The default 8 queues: two ranks, or four alone; not four after two.
        assert!(check_connections(0, 2, 0, 8).is_ok());
        assert!(check_connections(0, 4, 0, 8).is_ok());
        let err = check_connections(0, 4, 4, 8).unwrap_err();
        assert!(
            matches!(
                err,
                Error::TooFewConnections {
                    ordinal: 0,
                    parts: 4,
                    needed: 12,
                    connections: 8
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("CUDA_DEVICE_MAX_CONNECTIONS"),
            "{err}"
        );
        // 32 queues: the worlds of 2, 4 and 8 ranks of one process.
        assert!(check_connections(0, 8, 12, 32).is_ok());
        assert!(check_connections(0, 16, 12, 32).is_err());
    }
}
