//! What the grouped GEMM does with a finished tile ([`Epilogue`]): BF16 rows out (the kernel's
//! `Bf16Out`), or the L1's SwiGLU + clamp + top-k weight + re-quantization straight into the L2
//! pool (`cuda/sm90_swiglu.cuh`), whose device addresses a launch takes as [`SwigluOut`].

use fp_formats::Recipe;

use crate::gemm::Mma;

/// The epilogue a GEMM specialization is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Epilogue {
    /// BF16 `out[pool row][weight row]`.
    #[default]
    Bf16Out,
    /// The L1's SwiGLU into an L2 pool of `recipe`'s activation group in the `pool` route's format
    /// (the L2 GEMM's: E4M3 + scales, or BF16 widened). Its weights are gate/up interleaved
    /// ([`crate::transform::RowOrder::GateUp`]).
    Swiglu { recipe: Recipe, pool: Mma },
}

impl Epilogue {
    /// Whether a tile's outputs need the next weight tile's (a g128 group is 128 channels, two
    /// tiles' worth): the GEMM then walks its tiles in pairs, both in one CTA, and the split tail and
    /// clusters are off.
    pub fn pairs(self) -> bool {
        matches!(
            self,
            Epilogue::Swiglu {
                recipe: Recipe::G128,
                ..
            }
        )
    }

    /// What names it among the specializations ("" for BF16 out).
    pub fn tag(self) -> String {
        match self {
            Epilogue::Bf16Out => String::new(),
            Epilogue::Swiglu { recipe, pool } => format!("/swiglu-{recipe}-{pool}"),
        }
    }

    /// `-DMM_SWIGLU_G` (0: BF16 out) and `-DMM_SWIGLU_FP8_POOL` of the GEMM's entry point.
    pub(crate) fn defines(self) -> [(&'static str, usize); 2] {
        match self {
            Epilogue::Bf16Out => [("MM_SWIGLU_G", 0), ("MM_SWIGLU_FP8_POOL", 0)],
            Epilogue::Swiglu { recipe, pool } => [
                ("MM_SWIGLU_G", recipe.group()),
                ("MM_SWIGLU_FP8_POOL", usize::from(pool == Mma::Fp8)),
            ],
        }
    }
}

/// Floats of one CTA's slot of the SwiGLU epilogue's spill (`kSpillFloats`): the first tile of a
/// pair's h values (64 channels × a unit's tokens, `TilePlan::unit_tokens`).
pub const fn spill_floats(unit_tokens: usize) -> usize {
    64 * unit_tokens
}

/// Words of the SiLU table (`mm::unfused::kSiluTableWords`): the fast SiLU's 4-bit corrections of
/// the BF16 gates that need them, the clamp's silu, the count of gates it cannot correct
/// ([`SILU_MISFITS_WORD`]), two words of padding. The SwiGLU epilogue keeps it whole in shared
/// memory (`Layout::kSiluBytes`).
pub(crate) const SILU_TABLE_WORDS: usize = 1028;
/// The word of that count (`kSiluMisfitsWord`).
pub(crate) const SILU_MISFITS_WORD: usize = 1025;

/// `mm::swiglu::SwigluParams`, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct SwigluParams {
    pub(crate) meta: u64,
    pub(crate) silu: u64,
    pub(crate) l2_act: u64,
    pub(crate) l2_sf: u64,
    pub(crate) spill: u64,
    pub(crate) inter: i32,
    pub(crate) sf_stride: i32,
    pub(crate) has_clamp: i32,
    pub(crate) clamp: f32,
    pub(crate) row_arrivals: u64,
}

const _: () = assert!(size_of::<SwigluParams>() == 64);

/// Where an L1 GEMM with the SwiGLU epilogue reads its rows' top-k weights and writes the L2 pool,
/// as device addresses of its GPU: the pool's rows are the L1 pool's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwigluOut {
    /// `RowMeta` `[pool rows]` (its `weight`).
    pub meta: u64,
    /// The SiLU table: the fast SiLU's corrections, the clamp's silu (`uf_silu_table`).
    pub silu: u64,
    /// The L2 pool: E4M3 or BF16 `[pool rows][I]` in pool channel order, and (E4M3) its scales
    /// `[I/128][sf_stride]` f32 ([`crate::pool_order::scale_column`]).
    pub l2_act: u64,
    pub l2_sf: u64,
    pub intermediate: usize,
    pub sf_stride: usize,
    /// SwiGLU's clamp (None: off).
    pub clamp: Option<f32>,
}

impl SwigluOut {
    /// The kernel's parameters, with `spill` the launch's spill slots (0 where it has none).
    /// `row_arrivals`: the fused forward's counts of stored tiles per 16 pool rows (0: none).
    pub(crate) fn params(&self, spill: u64, row_arrivals: u64) -> SwigluParams {
        SwigluParams {
            meta: self.meta,
            silu: self.silu,
            l2_act: self.l2_act,
            l2_sf: self.l2_sf,
            spill,
            inter: self.intermediate as i32,
            sf_stride: self.sf_stride as i32,
            has_clamp: i32::from(self.clamp.is_some()),
            clamp: self.clamp.unwrap_or(0.0),
            row_arrivals,
        }
    }
}
