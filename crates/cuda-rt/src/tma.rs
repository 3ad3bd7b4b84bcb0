//! TMA descriptors: [`TensorMapDesc`] describes a tiled view of a global tensor, [`TensorMapDesc::validate`]
//! checks it against the rules of `cuTensorMapEncodeTiled` (CUDA 13.0 `cuda.h`) so that a mistake names
//! the field instead of coming back as a bare `CUDA_ERROR_INVALID_VALUE`, and [`TensorMapDesc::encode`]
//! builds the 128-byte [`TensorMap`] that kernels take as a `const __grid_constant__ CUtensorMap`.
//!
//! Dimensions are innermost first, as in CUDA: a row-major `rows × cols` matrix is `dims = [cols, rows]`,
//! `strides = [row pitch in bytes]`.

use cudarc::driver::sys;

use crate::error::DriverCall;
use crate::{Result, device::driver};

pub const MAX_RANK: usize = 5;

/// Element types (the packed 4- and 6-bit types of sm_100 are not wrapped yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TmaDataType {
    U8,
    U16,
    U32,
    I32,
    U64,
    I64,
    F16,
    F32,
    F64,
    BF16,
    F32Ftz,
    TF32,
    TF32Ftz,
}

impl TmaDataType {
    pub fn size_bytes(self) -> u64 {
        use TmaDataType::*;
        match self {
            U8 => 1,
            U16 | F16 | BF16 => 2,
            U32 | I32 | F32 | F32Ftz | TF32 | TF32Ftz => 4,
            U64 | I64 | F64 => 8,
        }
    }

    fn is_float(self) -> bool {
        use TmaDataType::*;
        matches!(self, F16 | F32 | F64 | BF16 | F32Ftz | TF32 | TF32Ftz)
    }

    fn raw(self) -> sys::CUtensorMapDataType {
        use TmaDataType::*;
        use sys::CUtensorMapDataType as D;
        match self {
            U8 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            U16 => D::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            U32 => D::CU_TENSOR_MAP_DATA_TYPE_UINT32,
            I32 => D::CU_TENSOR_MAP_DATA_TYPE_INT32,
            U64 => D::CU_TENSOR_MAP_DATA_TYPE_UINT64,
            I64 => D::CU_TENSOR_MAP_DATA_TYPE_INT64,
            F16 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            F32 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            F64 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
            BF16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            F32Ftz => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ,
            TF32 => D::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
            TF32Ftz => D::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ,
        }
    }
}

/// Shared-memory bank swizzle: 16-byte chunks permuted within a 32/64/128-byte span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Swizzle {
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    /// The span the box's inner dimension must fit in; `None` for no swizzle.
    pub fn span_bytes(self) -> Option<u64> {
        match self {
            Swizzle::None => None,
            Swizzle::B32 => Some(32),
            Swizzle::B64 => Some(64),
            Swizzle::B128 => Some(128),
        }
    }

    fn raw(self) -> sys::CUtensorMapSwizzle {
        use sys::CUtensorMapSwizzle as S;
        match self {
            Swizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
            Swizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// Interleaved layouts such as NC/8HWC8 (16 B) and NC/16HWC16 (32 B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Interleave {
    None,
    B16,
    B32,
}

impl Interleave {
    fn raw(self) -> sys::CUtensorMapInterleave {
        use sys::CUtensorMapInterleave as I;
        match self {
            Interleave::None => I::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Interleave::B16 => I::CU_TENSOR_MAP_INTERLEAVE_16B,
            Interleave::B32 => I::CU_TENSOR_MAP_INTERLEAVE_32B,
        }
    }
}

/// The granularity at which L2 fills from DRAM on TMA loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L2Promotion {
    None,
    B64,
    B128,
    B256,
}

impl L2Promotion {
    fn raw(self) -> sys::CUtensorMapL2promotion {
        use sys::CUtensorMapL2promotion as L;
        match self {
            L2Promotion::None => L::CU_TENSOR_MAP_L2_PROMOTION_NONE,
            L2Promotion::B64 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
            L2Promotion::B128 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            L2Promotion::B256 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        }
    }
}

/// What out-of-bounds elements of a box read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OobFill {
    Zero,
    /// A NaN that makes FMA treat the element as zero; floating-point types only.
    NanRequestZeroFma,
}

impl OobFill {
    fn raw(self) -> sys::CUtensorMapFloatOOBfill {
        use sys::CUtensorMapFloatOOBfill as F;
        match self {
            OobFill::Zero => F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            OobFill::NanRequestZeroFma => F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
        }
    }
}

/// A rule of `cuTensorMapEncodeTiled` that a [`TensorMapDesc`] breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TmaError {
    #[error("rank {rank} is outside 1..={MAX_RANK}")]
    Rank { rank: usize },
    #[error("{field} has {got} entries; rank {rank} needs {expected}")]
    Length {
        field: &'static str,
        rank: usize,
        expected: usize,
        got: usize,
    },
    #[error("interleaved layouts need rank >= 3, got rank {rank}")]
    InterleaveRank { rank: usize },
    #[error("global_address {address:#x} is not {required}-byte aligned")]
    GlobalAddress { address: u64, required: u64 },
    #[error("global_dims[{index}] = {value} is outside 1..=2^32")]
    GlobalDim { index: usize, value: u64 },
    #[error("global_strides[{index}] = {value} is not a multiple of {required} bytes")]
    GlobalStrideAlignment {
        index: usize,
        value: u64,
        required: u64,
    },
    #[error("global_strides[{index}] = {value} is not below 2^40 bytes")]
    GlobalStrideRange { index: usize, value: u64 },
    #[error("box_dims[{index}] = {value} is outside 1..=256")]
    BoxDim { index: usize, value: u32 },
    #[error(
        "the box's inner dimension is {bytes} B (box_dims[0] x element size), not a multiple of 16 B"
    )]
    BoxInnerAlignment { bytes: u64 },
    #[error(
        "the box's inner dimension is {bytes} B (box_dims[0] x element size), wider than the {span} B swizzle span"
    )]
    SwizzleSpan { bytes: u64, span: u64 },
    #[error("element_strides[{index}] = {value} is outside 1..=8")]
    ElementStride { index: usize, value: u32 },
    #[error("interleave 32B requires swizzle 32B, got {swizzle:?}")]
    InterleaveSwizzle { swizzle: Swizzle },
    #[error("oob_fill NanRequestZeroFma needs a floating-point data type, got {data_type:?}")]
    OobFillType { data_type: TmaDataType },
}

/// Everything `cuTensorMapEncodeTiled` takes, innermost dimension first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMapDesc {
    pub data_type: TmaDataType,
    /// Device address of element (0, .., 0).
    pub global_address: u64,
    /// Elements per dimension; `rank` entries.
    pub global_dims: Vec<u64>,
    /// Byte strides of dimensions 1..rank; `rank - 1` entries (dimension 0 is contiguous).
    pub global_strides: Vec<u64>,
    /// Elements per dimension of the box one TMA instruction moves; `rank` entries.
    pub box_dims: Vec<u32>,
    /// Traversal step per dimension; `rank` entries, usually all 1.
    pub element_strides: Vec<u32>,
    pub interleave: Interleave,
    pub swizzle: Swizzle,
    pub l2_promotion: L2Promotion,
    pub oob_fill: OobFill,
}

impl TensorMapDesc {
    /// A view with unit element strides, no interleave, no swizzle, 256 B L2 promotion, zero fill.
    pub fn new(
        data_type: TmaDataType,
        global_address: u64,
        global_dims: &[u64],
        global_strides: &[u64],
        box_dims: &[u32],
    ) -> Self {
        Self {
            data_type,
            global_address,
            global_dims: global_dims.to_vec(),
            global_strides: global_strides.to_vec(),
            box_dims: box_dims.to_vec(),
            element_strides: vec![1; global_dims.len()],
            interleave: Interleave::None,
            swizzle: Swizzle::None,
            l2_promotion: L2Promotion::B256,
            oob_fill: OobFill::Zero,
        }
    }

    /// A row-major `rows × cols` matrix with rows `row_pitch` bytes apart, moved in `box_rows × box_cols`
    /// tiles.
    pub fn matrix(
        data_type: TmaDataType,
        global_address: u64,
        [rows, cols]: [u64; 2],
        row_pitch: u64,
        [box_rows, box_cols]: [u32; 2],
    ) -> Self {
        Self::new(
            data_type,
            global_address,
            &[cols, rows],
            &[row_pitch],
            &[box_cols, box_rows],
        )
    }

    pub fn swizzle(mut self, swizzle: Swizzle) -> Self {
        self.swizzle = swizzle;
        self
    }

    pub fn l2_promotion(mut self, l2_promotion: L2Promotion) -> Self {
        self.l2_promotion = l2_promotion;
        self
    }

    pub fn oob_fill(mut self, oob_fill: OobFill) -> Self {
        self.oob_fill = oob_fill;
        self
    }

    pub fn interleave(mut self, interleave: Interleave) -> Self {
        self.interleave = interleave;
        self
    }

    pub fn element_strides(mut self, element_strides: &[u32]) -> Self {
        self.element_strides = element_strides.to_vec();
        self
    }

    pub fn rank(&self) -> usize {
        self.global_dims.len()
    }

    /// Checks every documented requirement of `cuTensorMapEncodeTiled`; the first one broken is returned.
    pub fn validate(&self) -> Result<(), TmaError> {
        let rank = self.rank();
        if !(1..=MAX_RANK).contains(&rank) {
            return Err(TmaError::Rank { rank });
        }
        let lengths = [
            ("global_strides", self.global_strides.len(), rank - 1),
            ("box_dims", self.box_dims.len(), rank),
            ("element_strides", self.element_strides.len(), rank),
        ];
        for (field, got, expected) in lengths {
            if got != expected {
                return Err(TmaError::Length {
                    field,
                    rank,
                    expected,
                    got,
                });
            }
        }
        if self.interleave != Interleave::None && rank < 3 {
            return Err(TmaError::InterleaveRank { rank });
        }
        let align = if self.interleave == Interleave::B32 {
            32
        } else {
            16
        };
        if !self.global_address.is_multiple_of(align) {
            return Err(TmaError::GlobalAddress {
                address: self.global_address,
                required: align,
            });
        }
        for (index, &value) in self.global_dims.iter().enumerate() {
            if value == 0 || value > 1 << 32 {
                return Err(TmaError::GlobalDim { index, value });
            }
        }
        for (index, &value) in self.global_strides.iter().enumerate() {
            if !value.is_multiple_of(align) {
                return Err(TmaError::GlobalStrideAlignment {
                    index,
                    value,
                    required: align,
                });
            }
            if value >= 1 << 40 {
                return Err(TmaError::GlobalStrideRange { index, value });
            }
        }
        for (index, &value) in self.box_dims.iter().enumerate() {
            if value == 0 || value > 256 {
                return Err(TmaError::BoxDim { index, value });
            }
        }
        let inner_bytes = u64::from(self.box_dims[0]) * self.data_type.size_bytes();
        if self.interleave == Interleave::None {
            if !inner_bytes.is_multiple_of(16) {
                return Err(TmaError::BoxInnerAlignment { bytes: inner_bytes });
            }
            if let Some(span) = self.swizzle.span_bytes()
                && inner_bytes > span
            {
                return Err(TmaError::SwizzleSpan {
                    bytes: inner_bytes,
                    span,
                });
            }
        }
        for (index, &value) in self.element_strides.iter().enumerate() {
            if value == 0 || value > 8 {
                return Err(TmaError::ElementStride { index, value });
            }
        }
        if self.interleave == Interleave::B32 && self.swizzle != Swizzle::B32 {
            return Err(TmaError::InterleaveSwizzle {
                swizzle: self.swizzle,
            });
        }
        if self.oob_fill == OobFill::NanRequestZeroFma && !self.data_type.is_float() {
            return Err(TmaError::OobFillType {
                data_type: self.data_type,
            });
        }
        Ok(())
    }

    /// Validates, then encodes with the driver (needs libcuda, not a context).
    pub fn encode(&self) -> Result<TensorMap> {
        self.validate()?;
        driver()?;
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: validate() checked every array length against the rank; `map` is 128-aligned.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                self.data_type.raw(),
                self.rank() as u32,
                self.global_address as *mut std::ffi::c_void,
                self.global_dims.as_ptr(),
                self.global_strides.as_ptr(),
                self.box_dims.as_ptr(),
                self.element_strides.as_ptr(),
                self.interleave.raw(),
                self.swizzle.raw(),
                self.l2_promotion.raw(),
                self.oob_fill.raw(),
            )
        }
        .result()
        .call("cuTensorMapEncodeTiled")?;
        Ok(TensorMap(map))
    }
}

/// An encoded TMA descriptor: 128 opaque bytes, passed to kernels by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMap(sys::CUtensorMap);

impl TensorMap {
    pub fn to_bytes(&self) -> [u8; 128] {
        let mut bytes = [0; 128];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(self.0.opaque) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        bytes
    }

    pub fn as_raw(&self) -> &sys::CUtensorMap {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid 2-D view: 512 × 256 bf16, 64 × 64 boxes of 128 B rows, 128 B swizzle.
    fn good() -> TensorMapDesc {
        TensorMapDesc::matrix(
            TmaDataType::BF16,
            0x7f00_0000_0000,
            [512, 256],
            512,
            [64, 64],
        )
        .swizzle(Swizzle::B128)
    }

    fn err(desc: TensorMapDesc) -> TmaError {
        desc.validate().expect_err("validation should fail")
    }

    #[test]
    fn accepts_a_valid_descriptor() {
        assert_eq!(good().validate(), Ok(()));
        assert_eq!(good().global_dims, vec![256, 512]);
        assert_eq!(good().box_dims, vec![64, 64]);
    }

    #[test]
    fn rank_and_lengths() {
        let mut d = good();
        d.global_dims = vec![];
        assert_eq!(err(d), TmaError::Rank { rank: 0 });
        let d = TensorMapDesc::new(TmaDataType::U8, 0, &[16; 6], &[16; 5], &[16; 6]);
        assert_eq!(err(d), TmaError::Rank { rank: 6 });
        let mut d = good();
        d.global_strides.push(1024);
        assert!(matches!(
            err(d),
            TmaError::Length {
                field: "global_strides",
                expected: 1,
                got: 2,
                ..
            }
        ));
        let mut d = good();
        d.box_dims.pop();
        assert!(matches!(
            err(d),
            TmaError::Length {
                field: "box_dims",
                ..
            }
        ));
        let d = good().element_strides(&[1]);
        assert!(matches!(
            err(d),
            TmaError::Length {
                field: "element_strides",
                ..
            }
        ));
    }

    #[test]
    fn global_address_alignment() {
        let mut d = good();
        d.global_address += 8;
        assert!(matches!(
            err(d),
            TmaError::GlobalAddress { required: 16, .. }
        ));
        // 32 B interleave needs 32 B alignment (and rank >= 3, 32 B swizzle).
        let mut d = TensorMapDesc::new(
            TmaDataType::F16,
            0x1010,
            &[16, 4, 4],
            &[32, 128],
            &[16, 4, 4],
        )
        .interleave(Interleave::B32)
        .swizzle(Swizzle::B32);
        let e = err(d.clone());
        assert!(matches!(e, TmaError::GlobalAddress { required: 32, .. }));
        assert!(e.to_string().contains("global_address 0x1010"), "{e}");
        d.global_address = 0x1020;
        assert_eq!(d.validate(), Ok(()));
    }

    #[test]
    fn global_dims_and_strides() {
        let mut d = good();
        d.global_dims[1] = 0;
        assert_eq!(err(d), TmaError::GlobalDim { index: 1, value: 0 });
        let mut d = good();
        d.global_dims[0] = (1 << 32) + 1;
        assert!(matches!(err(d), TmaError::GlobalDim { index: 0, .. }));
        let mut d = good();
        d.global_strides[0] = 520;
        let e = err(d);
        assert_eq!(
            e,
            TmaError::GlobalStrideAlignment {
                index: 0,
                value: 520,
                required: 16
            }
        );
        assert!(e.to_string().contains("global_strides[0]"));
        let mut d = good();
        d.global_strides[0] = 1 << 40;
        assert!(matches!(
            err(d),
            TmaError::GlobalStrideRange { index: 0, .. }
        ));
    }

    #[test]
    fn box_dims() {
        let mut d = good();
        d.box_dims[1] = 257;
        assert_eq!(
            err(d),
            TmaError::BoxDim {
                index: 1,
                value: 257
            }
        );
        let mut d = good();
        d.box_dims[0] = 0;
        assert!(matches!(err(d), TmaError::BoxDim { index: 0, .. }));
        // 12 bf16 = 24 B: not a multiple of 16.
        let mut d = good();
        d.box_dims[0] = 12;
        assert_eq!(err(d), TmaError::BoxInnerAlignment { bytes: 24 });
    }

    #[test]
    fn swizzle_span() {
        // 128 bf16 = 256 B rows do not fit a 128 B swizzle, but are fine unswizzled.
        let mut d = good();
        d.box_dims[0] = 128;
        assert_eq!(
            err(d.clone()),
            TmaError::SwizzleSpan {
                bytes: 256,
                span: 128
            }
        );
        assert_eq!(d.clone().swizzle(Swizzle::None).validate(), Ok(()));
        d.box_dims[0] = 32;
        assert_eq!(
            err(d.clone().swizzle(Swizzle::B32)),
            TmaError::SwizzleSpan {
                bytes: 64,
                span: 32
            }
        );
        assert_eq!(d.clone().swizzle(Swizzle::B64).validate(), Ok(()));
        let e = err(d.swizzle(Swizzle::B32)).to_string();
        assert!(
            e.contains("box_dims[0]") && e.contains("32 B swizzle"),
            "{e}"
        );
    }

    #[test]
    fn element_strides_interleave_and_fill() {
        let d = good().element_strides(&[1, 9]);
        assert_eq!(err(d), TmaError::ElementStride { index: 1, value: 9 });
        let d = good().interleave(Interleave::B16);
        assert_eq!(err(d), TmaError::InterleaveRank { rank: 2 });
        let d = TensorMapDesc::new(
            TmaDataType::F16,
            0x1000,
            &[16, 4, 4],
            &[32, 128],
            &[16, 4, 4],
        )
        .interleave(Interleave::B32)
        .swizzle(Swizzle::B64);
        assert_eq!(
            err(d),
            TmaError::InterleaveSwizzle {
                swizzle: Swizzle::B64
            }
        );
        let d = TensorMapDesc::matrix(TmaDataType::U8, 0x1000, [64, 64], 64, [16, 16])
            .oob_fill(OobFill::NanRequestZeroFma);
        assert_eq!(
            err(d.clone()),
            TmaError::OobFillType {
                data_type: TmaDataType::U8
            }
        );
        assert_eq!(d.oob_fill(OobFill::Zero).validate(), Ok(()));
    }

    #[test]
    fn encode_checks_before_touching_the_driver() {
        // Works on any machine: validation fails first, so no driver call is made.
        let mut d = good();
        d.box_dims[0] = 300;
        assert!(matches!(
            d.encode(),
            Err(crate::Error::Tma(TmaError::BoxDim { index: 0, .. }))
        ));
    }
}
