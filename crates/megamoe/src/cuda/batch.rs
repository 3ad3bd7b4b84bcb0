//! One rank's batch in device memory, as an engine holds it: `x`, `x_sf`, `topk_idx`,
//! `topk_weights` and `y` sized for at most T (E4M3 or BF16 `x`, i32 or i64 ids), plus a device T
//! for captured graphs — the buffers a
//! [`DeviceIo`] points at ([`CudaRank::forward_device`](super::CudaRank::forward_device)). An
//! engine whose tensors already live on the GPU builds its `DeviceIo` from its own; this is the
//! host-to-host path over the device API (tests, examples, the CLI's needs).

use std::sync::Arc;

use cuda_rt::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DriverError};
use fp_formats::bf16;

use super::{ActivationFormat, CudaError, DeviceIo, IndexWidth};
use crate::{Config, RankInputs};

/// A cudarc call's error as the backend's, named by `call` (for an engine's own stream work next
/// to the handle's: copies, captures, graph launches).
pub fn driver<T>(call: &'static str, r: Result<T, DriverError>) -> Result<T, CudaError> {
    r.map_err(|source| cuda_rt::Error::Driver { call, source }.into())
}

/// Device buffers of one rank's batch of at most `max_tokens` tokens, on one stream's GPU, with
/// `x` and the expert ids in the formats the batch was made for.
pub struct DeviceBatch {
    stream: Arc<CudaStream>,
    hidden: usize,
    max_tokens: usize,
    x_format: ActivationFormat,
    topk_idx_width: IndexWidth,
    /// `[T][H]` E4M3, or BF16 (two bytes a channel).
    x: CudaSlice<u8>,
    x_sf: CudaSlice<u8>,
    /// `[T][k]` i32 or i64.
    topk_idx: CudaSlice<u8>,
    topk_weights: CudaSlice<f32>,
    y: CudaSlice<u16>,
    tokens_dev: CudaSlice<i32>,
    tokens: usize,
}

impl DeviceBatch {
    /// Buffers for `max_tokens` tokens of `config`'s shape, E4M3 `x` with its scales and i32
    /// expert ids, every copy on `stream`.
    pub fn new(
        stream: &Arc<CudaStream>,
        config: &Config,
        max_tokens: usize,
    ) -> Result<Self, CudaError> {
        Self::with_formats(
            stream,
            config,
            max_tokens,
            ActivationFormat::E4m3,
            IndexWidth::I32,
        )
    }

    /// As [`Self::new`], with `x` and the expert ids as an engine holds them: BF16 `x` (the
    /// forward quantizes it), i64 ids.
    pub fn with_formats(
        stream: &Arc<CudaStream>,
        config: &Config,
        max_tokens: usize,
        x_format: ActivationFormat,
        topk_idx_width: IndexWidth,
    ) -> Result<Self, CudaError> {
        let (h, g, k) = (config.hidden, config.act_group(), config.top_k);
        let x_bytes = match x_format {
            ActivationFormat::E4m3 => 1,
            ActivationFormat::Bf16 => 2,
        };
        let id_bytes = match topk_idx_width {
            IndexWidth::I32 => 4,
            IndexWidth::I64 => 8,
        };
        let alloc = |n| driver("cuMemAlloc", stream.alloc_zeros::<u8>(n));
        Ok(Self {
            stream: stream.clone(),
            hidden: h,
            max_tokens,
            x_format,
            topk_idx_width,
            x: alloc(max_tokens * h * x_bytes)?,
            x_sf: alloc(max_tokens * h / g)?,
            topk_idx: alloc(max_tokens * k * id_bytes)?,
            topk_weights: driver("cuMemAlloc", stream.alloc_zeros(max_tokens * k))?,
            y: driver("cuMemAlloc", stream.alloc_zeros(max_tokens * h))?,
            tokens_dev: driver("cuMemAlloc", stream.alloc_zeros(1))?,
            tokens: 0,
        })
    }

    /// Queues the copies of `inputs` (and its T into the device scalar) and poisons y (0xffff:
    /// NaN), on the stream. Refuses more tokens than the buffers hold, and a BF16 batch (its
    /// activations come from [`Self::upload_bf16`]).
    pub fn upload(&mut self, inputs: &RankInputs) -> Result<(), CudaError> {
        if self.x_format != ActivationFormat::E4m3 {
            return Err(CudaError::Batch(
                "E4M3 activations into a batch of BF16 ones".into(),
            ));
        }
        self.upload_routes(inputs)?;
        let s = &self.stream;
        let copy = |r| driver("cuMemcpyHtoDAsync", r);
        copy(s.memcpy_htod(&inputs.x, &mut self.x.slice_mut(..inputs.x.len())))?;
        copy(s.memcpy_htod(&inputs.x_sf, &mut self.x_sf.slice_mut(..inputs.x_sf.len())))
    }

    /// As [`Self::upload`] for a BF16 batch: `x` (BF16 `[T][H]`) and the routes of `inputs`
    /// (whose own `x` and `x_sf` are not read).
    pub fn upload_bf16(&mut self, x: &[bf16], inputs: &RankInputs) -> Result<(), CudaError> {
        if self.x_format != ActivationFormat::Bf16 {
            return Err(CudaError::Batch(
                "BF16 activations into a batch of E4M3 ones".into(),
            ));
        }
        if x.len() != inputs.tokens * self.hidden {
            return Err(CudaError::Batch(format!(
                "{} BF16 values for {} tokens of {} channels",
                x.len(),
                inputs.tokens,
                self.hidden
            )));
        }
        self.upload_routes(inputs)?;
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        driver(
            "cuMemcpyHtoDAsync",
            self.stream
                .memcpy_htod(&bytes, &mut self.x.slice_mut(..bytes.len())),
        )
    }

    /// The copies every upload queues: the expert ids in the batch's width, the weights, T; y
    /// poisoned.
    fn upload_routes(&mut self, inputs: &RankInputs) -> Result<(), CudaError> {
        if inputs.tokens > self.max_tokens {
            return Err(CudaError::Batch(format!(
                "{} tokens into a batch of at most {}",
                inputs.tokens, self.max_tokens
            )));
        }
        let s = &self.stream;
        let ids: Vec<u8> = match self.topk_idx_width {
            IndexWidth::I32 => inputs
                .topk_idx
                .iter()
                .flat_map(|&e| (e as i32).to_le_bytes())
                .collect(),
            IndexWidth::I64 => inputs
                .topk_idx
                .iter()
                .flat_map(|&e| e.to_le_bytes())
                .collect(),
        };
        let copy = |r| driver("cuMemcpyHtoDAsync", r);
        copy(s.memcpy_htod(&ids, &mut self.topk_idx.slice_mut(..ids.len())))?;
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
            x_format: self.x_format,
            topk_idx_width: self.topk_idx_width,
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
