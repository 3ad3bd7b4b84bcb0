//! Timing GPU work with CUDA events: the time between two points of a stream, measured on the device.

use cudarc::driver::{CudaEvent, CudaStream, sys};

use crate::error::DriverCall;
use crate::{Gpu, Result};

/// A start/stop event pair. Record `start`, queue work, record `stop`, then read `elapsed_ms`.
#[derive(Debug)]
pub struct GpuTimer {
    start: CudaEvent,
    stop: CudaEvent,
}

impl GpuTimer {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        // cudarc's default flags disable timing.
        let event = || {
            gpu.context()
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .call("cuEventCreate")
        };
        Ok(Self {
            start: event()?,
            stop: event()?,
        })
    }

    pub fn start(&self, stream: &CudaStream) -> Result<()> {
        self.start.record(stream).call("cuEventRecord")
    }

    pub fn stop(&self, stream: &CudaStream) -> Result<()> {
        self.stop.record(stream).call("cuEventRecord")
    }

    /// Milliseconds from `start` to `stop`; waits for `stop` to complete.
    pub fn elapsed_ms(&self) -> Result<f32> {
        self.start.elapsed_ms(&self.stop).call("cuEventElapsedTime")
    }
}
