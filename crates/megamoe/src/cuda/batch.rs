//! One rank's batch in device memory, as an engine holds it: `x`, `x_sf`, `topk_idx`,
//! `topk_weights` and `y` sized for a most T, plus a device T for captured graphs — the buffers a
//! [`DeviceIo`] points at ([`CudaRank::forward_device`](super::CudaRank::forward_device)). An
//! engine whose tensors already live on the GPU builds its `DeviceIo` from its own; this is the
//! host-to-host path over the device API (tests, examples, the CLI's needs).

use std::sync::Arc;

use cuda_rt::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DriverError};
use fp_formats::bf16;

use super::{CudaError, DeviceIo};
use crate::{Config, RankInputs};

/// A cudarc call's error as the backend's, named by `call` (for an engine's own stream work next
/// to the handle's: copies, captures, graph launches).
pub fn driver<T>(call: &'static str, r: Result<T, DriverError>) -> Result<T, CudaError> {
    r.map_err(|source| cuda_rt::Error::Driver { call, source }.into())
}

/// Device buffers of one rank's batch of at most `max_tokens` tokens, on one stream's GPU.
pub struct DeviceBatch {
    stream: Arc<CudaStream>,
    hidden: usize,
    max_tokens: usize,
    x: CudaSlice<u8>,
    x_sf: CudaSlice<u8>,
    topk_idx: CudaSlice<i32>,
    topk_weights: CudaSlice<f32>,
    y: CudaSlice<u16>,
    tokens_dev: CudaSlice<i32>,
    tokens: usize,
}

impl DeviceBatch {
    /// Buffers for `max_tokens` tokens of `config`'s shape, every copy on `stream`.
    pub fn new(
        stream: &Arc<CudaStream>,
        config: &Config,
        max_tokens: usize,
    ) -> Result<Self, CudaError> {
        let (h, g, k) = (config.hidden, config.act_group(), config.top_k);
        Ok(Self {
            stream: stream.clone(),
            hidden: h,
            max_tokens,
            x: driver("cuMemAlloc", stream.alloc_zeros(max_tokens * h))?,
            x_sf: driver("cuMemAlloc", stream.alloc_zeros(max_tokens * h / g))?,
            topk_idx: driver("cuMemAlloc", stream.alloc_zeros(max_tokens * k))?,
            topk_weights: driver("cuMemAlloc", stream.alloc_zeros(max_tokens * k))?,
            y: driver("cuMemAlloc", stream.alloc_zeros(max_tokens * h))?,
            tokens_dev: driver("cuMemAlloc", stream.alloc_zeros(1))?,
            tokens: 0,
        })
    }

    /// Queues the copies of `inputs` (and its T into the device scalar) and poisons y (0xffff:
    /// NaN), on the stream. Refuses more tokens than the buffers hold.
    pub fn upload(&mut self, inputs: &RankInputs) -> Result<(), CudaError> {
        if inputs.tokens > self.max_tokens {
            return Err(CudaError::Exchange(format!(
                "{} tokens into a batch of at most {}",
                inputs.tokens, self.max_tokens
            )));
        }
        let s = &self.stream;
        let idx: Vec<i32> = inputs.topk_idx.iter().map(|&e| e as i32).collect();
        let copy = |r| driver("cuMemcpyHtoDAsync", r);
        copy(s.memcpy_htod(&inputs.x, &mut self.x.slice_mut(..inputs.x.len())))?;
        copy(s.memcpy_htod(&inputs.x_sf, &mut self.x_sf.slice_mut(..inputs.x_sf.len())))?;
        copy(s.memcpy_htod(&idx, &mut self.topk_idx.slice_mut(..idx.len())))?;
        let w = &inputs.topk_weights;
        copy(s.memcpy_htod(w, &mut self.topk_weights.slice_mut(..w.len())))?;
        copy(s.memcpy_htod(&[inputs.tokens as i32], &mut self.tokens_dev))?;
        copy(s.memcpy_htod(&vec![0xffffu16; self.y.len()], &mut self.y))?;
        self.tokens = inputs.tokens;
        Ok(())
    }

    /// The forward's arguments: T of the last upload; or, `from_device`, T read from the device
    /// scalar when the kernel starts, up to the buffers' `max_tokens` (for a captured graph).
    pub fn io(&self, from_device: bool) -> DeviceIo {
        let s = &self.stream;
        DeviceIo {
            x: self.x.device_ptr(s).0,
            x_sf: self.x_sf.device_ptr(s).0,
            topk_idx: self.topk_idx.device_ptr(s).0,
            topk_weights: self.topk_weights.device_ptr(s).0,
            y: self.y.device_ptr(s).0,
            tokens: if from_device {
                self.max_tokens
            } else {
                self.tokens
            } as u64,
            tokens_dev: if from_device {
                self.tokens_dev.device_ptr(s).0
            } else {
                0
            },
        }
    }

    /// Sets the device T a captured graph reads (the stream's next copy).
    pub fn set_tokens(&mut self, tokens: i32) -> Result<(), CudaError> {
        driver(
            "cuMemcpyHtoDAsync",
            self.stream.memcpy_htod(&[tokens], &mut self.tokens_dev),
        )
    }

    /// Waits for the stream and downloads y of the last upload's T, `[T][H]`.
    pub fn y(&self) -> Result<Vec<bf16>, CudaError> {
        let y = driver(
            "cuMemcpyDtoH",
            self.stream
                .clone_dtoh(&self.y.slice(..self.tokens * self.hidden)),
        )?;
        Ok(y.into_iter().map(bf16::from_bits).collect())
    }
}
