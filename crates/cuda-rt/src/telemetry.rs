//! The SM clock and board power a GPU runs at while a benchmark times it: NVML (libnvidia-ml,
//! loaded at run time) read on a thread of its own every millisecond between [`Telemetry::start`]
//! and [`Sampling::finish`], the GPU found by the PCI bus id the driver gives ([`DeviceInfo`]: a
//! CUDA ordinal need not be NVML's index). Without NVML (a machine with no NVIDIA driver) there is
//! no reading, and a benchmark goes on without one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Clock;

#[cfg(doc)]
use crate::DeviceInfo;
use crate::Gpu;

/// Between two samples: short against a forward of a few hundred µs to a few ms, long against an
/// NVML query (tens of µs).
const PERIOD: Duration = Duration::from_millis(1);

/// NVML, once loaded.
#[derive(Clone)]
pub struct Telemetry {
    nvml: Arc<Nvml>,
}

/// What a GPU ran at over a sampling: the means of its samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    pub sm_clock_mhz: f64,
    pub power_w: f64,
    pub samples: usize,
}

impl Reading {
    /// The readings of several samplings as one (each weighted by its samples); `None` when they
    /// hold no sample.
    pub fn mean(readings: &[Reading]) -> Option<Reading> {
        let samples: usize = readings.iter().map(|r| r.samples).sum();
        let weighted = |f: fn(&Reading) -> f64| {
            readings
                .iter()
                .map(|r| f(r) * r.samples as f64)
                .sum::<f64>()
                / samples as f64
        };
        (samples > 0).then(|| Reading {
            sm_clock_mhz: weighted(|r| r.sm_clock_mhz),
            power_w: weighted(|r| r.power_w),
            samples,
        })
    }
}

/// Samples being taken of one GPU; dropped unfinished (a point that failed), its thread stops.
pub struct Sampling {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Option<Reading>>>,
}

impl Telemetry {
    /// NVML, or `None` (logged) where it cannot be loaded or initialized.
    pub fn open() -> Option<Self> {
        match Nvml::init() {
            Ok(nvml) => Some(Self {
                nvml: Arc::new(nvml),
            }),
            Err(error) => {
                tracing::info!(%error, "no NVML: no SM clock or power readings");
                None
            }
        }
    }

    /// Starts sampling `gpu`.
    pub fn start(&self, gpu: &Gpu) -> Sampling {
        let stop = Arc::new(AtomicBool::new(false));
        let (nvml, until) = (self.nvml.clone(), stop.clone());
        let id = gpu.info().pci_bus_id.clone();
        let thread = std::thread::spawn(move || {
            let device = nvml
                .device_by_pci_bus_id(id.as_str())
                .inspect_err(|error| tracing::info!(%error, %id, "NVML does not know this GPU"))
                .ok()?;
            let (mut mhz, mut mw, mut samples) = (0u64, 0u64, 0usize);
            // At least one sample, however short the sampling.
            loop {
                if let (Ok(clock), Ok(power)) = (device.clock_info(Clock::SM), device.power_usage())
                {
                    mhz += u64::from(clock);
                    mw += u64::from(power);
                    samples += 1;
                }
                if until.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(PERIOD);
            }
            (samples > 0).then(|| Reading {
                sm_clock_mhz: mhz as f64 / samples as f64,
                power_w: mw as f64 * 1e-3 / samples as f64,
                samples,
            })
        });
        Sampling {
            stop,
            thread: Some(thread),
        }
    }
}

impl Sampling {
    /// Stops sampling: the reading, or `None` when no sample could be taken.
    pub fn finish(mut self) -> Option<Reading> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take()?.join().ok().flatten()
    }
}

impl Drop for Sampling {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Reading;

    #[test]
    fn readings_combine_by_their_samples() {
        let a = Reading {
            sm_clock_mhz: 1980.0,
            power_w: 600.0,
            samples: 3,
        };
        let b = Reading {
            sm_clock_mhz: 1580.0,
            power_w: 700.0,
            samples: 1,
        };
        let m = Reading::mean(&[a, b]).unwrap();
        assert_eq!(m.samples, 4);
        assert!((m.sm_clock_mhz - 1880.0).abs() < 1e-9, "{m:?}");
        assert!((m.power_w - 625.0).abs() < 1e-9, "{m:?}");
        assert_eq!(Reading::mean(&[]), None);
    }
}
