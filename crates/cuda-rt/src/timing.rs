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

/// An event that records time (cudarc's default flags disable timing).
fn timing_event(gpu: &Gpu) -> Result<CudaEvent> {
    gpu.context()
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .call("cuEventCreate")
}

impl GpuTimer {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Self {
            start: timing_event(gpu)?,
            stop: timing_event(gpu)?,
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

/// Events recorded at marks along one stream, for the device time between consecutive marks
/// (stage times of a pipeline without a synchronize per stage).
#[derive(Debug)]
pub struct EventTrail {
    events: Vec<CudaEvent>,
    recorded: usize,
}

impl EventTrail {
    /// Room for `marks` marks.
    pub fn new(gpu: &Gpu, marks: usize) -> Result<Self> {
        let events = (0..marks)
            .map(|_| timing_event(gpu))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            events,
            recorded: 0,
        })
    }

    /// Forgets the marks of the last round.
    pub fn clear(&mut self) {
        self.recorded = 0;
    }

    /// Records the next mark on `stream`; returns its index. Panics past the capacity.
    pub fn mark(&mut self, stream: &CudaStream) -> Result<usize> {
        let i = self.recorded;
        assert!(
            i < self.events.len(),
            "EventTrail holds {} marks",
            self.events.len()
        );
        self.events[i].record(stream).call("cuEventRecord")?;
        self.recorded += 1;
        Ok(i)
    }

    /// Milliseconds from mark `from` to mark `to`; waits for `to` to complete.
    pub fn between_ms(&self, from: usize, to: usize) -> Result<f32> {
        assert!(
            from < self.recorded && to < self.recorded,
            "marks {from}, {to} of {} recorded",
            self.recorded
        );
        self.events[from]
            .elapsed_ms(&self.events[to])
            .call("cuEventElapsedTime")
    }
}
