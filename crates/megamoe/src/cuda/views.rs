//! The engine's forward over cudarc views — the safe layer above
//! [`CudaRank::forward_device`](super::CudaRank::forward_device) (raw addresses) and
//! [`CudaRank::forward_device_raw`](super::CudaRank::forward_device_raw) (and a raw stream):
//! every tensor's length is checked against T and the rank's shape and its GPU against the
//! rank's before anything is queued, and the views' own stream tracking is honoured (cudarc's
//! `DevicePtr`: a write on another stream is waited for, the forward's reads and its write of y
//! are recorded), so the call needs no `unsafe`.

use std::sync::Arc;

use cuda_rt::cudarc::driver::{
    CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice,
};

use super::{ActivationFormat, CudaError, CudaRank, DeviceIo, IndexWidth};
use crate::Config;
use crate::problem::input_shapes;

/// An engine's activations on the device.
pub enum ActivationsView<'a> {
    /// E4M3 `[T][H]` and its UE8M0 scales `[T][H/G]`, quantized by the engine.
    E4m3 {
        x: CudaView<'a, u8>,
        x_sf: CudaView<'a, u8>,
    },
    /// BF16 `[T][H]` (its bits), quantized by the kernel as the host quantizer does.
    Bf16 { x: CudaView<'a, u16> },
}

/// An engine's expert ids `[T][k]` on the device (−1: a masked slot).
pub enum IdsView<'a> {
    I32(CudaView<'a, i32>),
    I64(CudaView<'a, i64>),
}

impl IdsView<'_> {
    fn len(&self) -> usize {
        match self {
            IdsView::I32(v) => v.len(),
            IdsView::I64(v) => v.len(),
        }
    }
    fn stream(&self) -> &Arc<CudaStream> {
        match self {
            IdsView::I32(v) => v.stream(),
            IdsView::I64(v) => v.stream(),
        }
    }
}

/// How many tokens the forward takes.
pub enum TokenCount<'a> {
    /// T, known on the host.
    Host(usize),
    /// T read by the kernel from a device i32 when it starts, at most `max` (the tensors hold
    /// `max` tokens): one captured CUDA graph serves every T up to it.
    Device { t: CudaView<'a, i32>, max: usize },
}

/// One rank's inputs as an engine holds them on its GPU.
pub struct InputViews<'a> {
    pub activations: ActivationsView<'a>,
    pub topk_idx: IdsView<'a>,
    /// `[T][k]`.
    pub topk_weights: CudaView<'a, f32>,
    pub tokens: TokenCount<'a>,
}

/// The elements each tensor of a forward of `tokens` tokens (or a device T of at most that many)
/// needs: `(tensor, elements)`, in the order [`InputViews`] names them, y last.
fn needed_elements(
    config: &Config,
    tokens: usize,
    x_format: ActivationFormat,
) -> Vec<(&'static str, usize)> {
    // The canonical inputs' shapes (y is x's); BF16 x has as many elements as E4M3 x, and no scales.
    let elements = |(name, shape): (&'static str, Vec<usize>)| (name, shape.iter().product());
    let [x, x_sf, topk_idx, topk_weights] = input_shapes(config, tokens).map(elements);
    let mut needed = vec![x];
    if x_format == ActivationFormat::E4m3 {
        needed.push(x_sf);
    }
    needed.extend([topk_idx, topk_weights, ("y", x.1)]);
    needed
}

/// The first tensor shorter than a forward of `tokens` tokens needs: `lens` are the tensors'
/// `(name, elements)` in [`needed_elements`]' order.
fn check_lengths(
    config: &Config,
    tokens: usize,
    x_format: ActivationFormat,
    lens: &[(&'static str, usize)],
) -> Result<(), CudaError> {
    for (&(tensor, needed), &(_, len)) in needed_elements(config, tokens, x_format).iter().zip(lens)
    {
        if len < needed {
            return Err(CudaError::DeviceTensorLength {
                tensor,
                len,
                tokens,
                needed,
            });
        }
    }
    Ok(())
}

impl CudaRank {
    /// Collective, queued on `stream` (the caller's, on this rank's GPU): the fused forward of
    /// `inputs` into `y` (BF16 bits `[T][H]`), as [`Self::forward_device`] — no allocation, no
    /// copy, no host synchronization, capturable — with every view's length checked against T
    /// (or the device T's bound) and the rank's shape, and its GPU against the rank's, before
    /// anything is queued. After `stream` is done, [`Self::check_device_forward`].
    pub fn forward_views(
        &mut self,
        stream: &Arc<CudaStream>,
        inputs: &InputViews<'_>,
        y: &mut CudaViewMut<'_, u16>,
    ) -> Result<(), CudaError> {
        let (tokens, tokens_dev) = match &inputs.tokens {
            TokenCount::Host(t) => (*t, None),
            TokenCount::Device { t, max } => (*max, Some(t)),
        };
        // Every tensor as (name, elements, stream), in `needed_elements`' order.
        let mut tensors: Vec<(&'static str, usize, &Arc<CudaStream>)> = Vec::with_capacity(5);
        let x_format = match &inputs.activations {
            ActivationsView::E4m3 { x, x_sf } => {
                tensors.extend([
                    ("x", x.len(), x.stream()),
                    ("x_sf", x_sf.len(), x_sf.stream()),
                ]);
                ActivationFormat::E4m3
            }
            ActivationsView::Bf16 { x } => {
                tensors.push(("x", x.len(), x.stream()));
                ActivationFormat::Bf16
            }
        };
        let topk_idx_width = match &inputs.topk_idx {
            IdsView::I32(_) => IndexWidth::I32,
            IdsView::I64(_) => IndexWidth::I64,
        };
        tensors.extend([
            ("topk_idx", inputs.topk_idx.len(), inputs.topk_idx.stream()),
            (
                "topk_weights",
                inputs.topk_weights.len(),
                inputs.topk_weights.stream(),
            ),
            ("y", y.len(), y.stream()),
        ]);
        let lens: Vec<_> = tensors.iter().map(|&(name, len, _)| (name, len)).collect();
        check_lengths(&self.config, tokens, x_format, &lens)?;
        if let Some(t) = tokens_dev
            && t.is_empty()
        {
            return Err(CudaError::DeviceTensorLength {
                tensor: "tokens",
                len: 0,
                tokens,
                needed: 1,
            });
        }

        let ordinal = self.world.local_gpu().ordinal();
        let mut streams: Vec<_> = tensors.iter().map(|&(name, _, s)| (name, s)).collect();
        streams.extend(tokens_dev.map(|t| ("tokens", t.stream())));
        streams.push(("stream", stream));
        if let Some(&(tensor, s)) = streams
            .iter()
            .find(|(_, s)| s.context().ordinal() != ordinal)
        {
            return Err(CudaError::DeviceTensorGpu {
                tensor,
                gpu: s.context().ordinal(),
                rank_gpu: ordinal,
            });
        }

        // The guards record the forward's reads (and y's write) on `stream` when they drop,
        // after the launch is queued.
        let (x, x_sf, _x_guards) = match &inputs.activations {
            ActivationsView::E4m3 { x, x_sf } => {
                let (x, gx) = x.device_ptr(stream);
                let (sf, gsf) = x_sf.device_ptr(stream);
                (x, sf, (gx, Some(gsf)))
            }
            ActivationsView::Bf16 { x } => {
                let (x, gx) = x.device_ptr(stream);
                (x, 0, (gx, None))
            }
        };
        let (topk_idx, _ids_guard) = match &inputs.topk_idx {
            IdsView::I32(v) => v.device_ptr(stream),
            IdsView::I64(v) => v.device_ptr(stream),
        };
        let (topk_weights, _w_guard) = inputs.topk_weights.device_ptr(stream);
        let (tokens_ptr, _t_guard) = match tokens_dev {
            Some(t) => {
                let (p, g) = t.device_ptr(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let (y_ptr, _y_guard) = y.device_ptr_mut(stream);
        let io = DeviceIo {
            x,
            x_sf,
            topk_idx,
            topk_weights,
            y: y_ptr,
            tokens: tokens as u64,
            tokens_dev: tokens_ptr,
            x_format,
            topk_idx_width,
        };
        // SAFETY: every address is a live view on this rank's GPU (checked) holding at least
        // what a forward of `tokens` tokens reads or writes (checked), borrowed for this call;
        // the views' stream tracking orders other streams' work on them around the forward and
        // delays their release until it is done.
        unsafe { self.forward_device(stream, &io) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each tensor is measured against what T needs, E4M3 scales only with E4M3 activations,
    /// and the first short one is named with both counts.
    #[test]
    fn a_view_shorter_than_t_needs_is_refused_by_name() {
        let config = Config::tiny();
        let (h, g, k) = (config.hidden, config.act_group(), config.top_k);
        let t = 7;
        let e4m3 = [
            ("x", t * h),
            ("x_sf", t * h / g),
            ("topk_idx", t * k),
            ("topk_weights", t * k),
            ("y", t * h),
        ];
        assert!(check_lengths(&config, t, ActivationFormat::E4m3, &e4m3).is_ok());
        let mut short = e4m3;
        short[3].1 -= 1;
        match check_lengths(&config, t, ActivationFormat::E4m3, &short) {
            Err(CudaError::DeviceTensorLength {
                tensor,
                len,
                tokens,
                needed,
            }) => assert_eq!(
                (tensor, len, tokens, needed),
                ("topk_weights", t * k - 1, t, t * k)
            ),
            other => panic!("a short topk_weights gave {other:?}"),
        }
        // BF16 activations: no scales among the tensors.
        let bf16: Vec<_> = e4m3.iter().copied().filter(|(n, _)| *n != "x_sf").collect();
        assert!(check_lengths(&config, t, ActivationFormat::Bf16, &bf16).is_ok());
        let mut short_y = bf16.clone();
        short_y[3].1 = 0;
        assert!(matches!(
            check_lengths(&config, t, ActivationFormat::Bf16, &short_y),
            Err(CudaError::DeviceTensorLength { tensor: "y", .. })
        ));
        // Longer views serve fewer tokens.
        assert!(check_lengths(&config, 3, ActivationFormat::E4m3, &e4m3).is_ok());
    }
}
