//! Reads individual tensors of a GGUF file onto a device (only the ones a shard needs), checks
//! their quantization is one tb-engine runs, optionally requantises Q4_0/Q4_1 matrices to Q8_0,
//! and counts the bytes held in memory.
//!
//! ## Requantisation (Q4_x -> Q8_0): measurement and default
//!
//! candle 0.11 has no SIMD dot product for Q4_1 (`BlockQ4_1::vec_dot` falls back to the scalar
//! `vec_dot_unopt` on both AVX and NEON), while Q8_0 has AVX and NEON kernels. Measured with
//! `tb-enginebench` (SmolLM2-135M-Instruct Q4_1, 2 threads): with candle's products, Q4_1 as
//! stored decoded 26.4 tokens/s against 70.8 requantised to Q8_0, so requantising paid for its
//! 1.5x memory. tb's own x86-64 kernel ([`crate::qgemm`]) runs Q4_0 and Q4_1 as stored faster
//! than Q8_0 (97.1 against 74.1 tokens/s, 2026-12-05): fewer bytes per weight to read.
//! [`Requantize::Auto`] therefore requantises only where tb has no kernel for the stored type
//! on the shard's device (other CPUs, Metal). Requantisation happens on the CPU at load
//! (dequantize -> quantize to Q8_0), then the tensor is placed on the shard's device.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Tensor};
use candle_transformers::quantized_nn::RmsNorm;

use crate::error::{EngineError, Result};
use crate::gguf::GgufIndex;

/// Whether Q4_0/Q4_1 weight matrices are requantised to Q8_0 at load (see the module doc for
/// the measurements behind [`Requantize::Auto`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Requantize {
    /// Only where tb has no kernel for the stored type on the shard's device.
    #[default]
    Auto,
    /// Always (more memory; what candle's own products run fastest on).
    Always,
    /// Never: the weights run as stored.
    Never,
}

fn supported(dtype: GgmlDType) -> bool {
    !matches!(dtype, GgmlDType::Q8_1 | GgmlDType::Q8K)
}

/// Reads tensors of one GGUF file.
pub(crate) struct TensorReader<'a> {
    index: &'a GgufIndex,
    reader: BufReader<File>,
    device: Device,
    requantize: Requantize,
    bytes: u64,
}

impl<'a> TensorReader<'a> {
    pub(crate) fn new(
        index: &'a GgufIndex,
        path: &Path,
        device: &Device,
        requantize: Requantize,
    ) -> Result<Self> {
        let file = File::open(path).map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            index,
            reader: BufReader::new(file),
            device: device.clone(),
            requantize,
            bytes: 0,
        })
    }

    /// Bytes of the weights read so far, as held in memory.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.index.tensor(name).is_some()
    }

    /// Reads one tensor as stored.
    pub(crate) fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        let entry = self
            .index
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor {
                name: name.to_string(),
            })?;
        self.index.check_in_file(entry)?;
        let dtype = self
            .index
            .ggml_dtype(name)
            .ok_or_else(|| EngineError::MissingTensor {
                name: name.to_string(),
            })?;
        if !supported(dtype) {
            return Err(EngineError::UnsupportedQuantization {
                tensor: name.to_string(),
                dtype: entry.dtype.clone(),
            });
        }
        let t = self
            .index
            .content()
            .tensor(&mut self.reader, name, &self.device)
            .map_err(|e| match e {
                candle_core::Error::Io(source) => EngineError::Io {
                    path: self.index.path().to_path_buf(),
                    source,
                },
                other => EngineError::NotGguf {
                    path: self.index.path().to_path_buf(),
                    detail: format!("tensor {name}: {other}"),
                },
            })?;
        Ok(t)
    }

    fn count(&mut self, t: &QTensor) {
        self.bytes += t.storage_size_in_bytes() as u64;
    }

    /// A weight matrix for matmul (requantised to Q8_0 when asked and stored as Q4_0/Q4_1).
    pub(crate) fn matrix(&mut self, name: &str) -> Result<QMatMul> {
        let t = Arc::new(self.qtensor(name)?);
        let t = self.maybe_requantize(t)?;
        self.count(&t);
        Ok(QMatMul::from_arc(t)?)
    }

    /// Part of a weight matrix for a tensor-parallel rank (see [`crate::tp`]): some of its rows
    /// (output features) or input columns, cut from the tensor as stored and then requantised
    /// like [`Self::matrix`]; only the part is counted.
    pub(crate) fn matrix_part(&mut self, name: &str, part: &crate::tp::Part) -> Result<QMatMul> {
        let whole = self.qtensor(name)?;
        let t = Arc::new(crate::tp::slice_matrix(name, &whole, part, &self.device)?);
        drop(whole);
        let t = self.maybe_requantize(t)?;
        self.count(&t);
        Ok(QMatMul::from_arc(t)?)
    }

    /// Elements `range` of an optional f32 vector (a bias), dequantised; only those are counted.
    pub(crate) fn optional_vector_part(
        &mut self,
        name: &str,
        range: std::ops::Range<usize>,
    ) -> Result<Option<Tensor>> {
        if !self.has(name) {
            return Ok(None);
        }
        let t = self.qtensor(name)?.dequantize(&self.device)?;
        let t = t.narrow(0, range.start, range.len())?.force_contiguous()?;
        self.bytes += (range.len() * 4) as u64;
        Ok(Some(t))
    }

    /// A tensor kept as stored (embedding table, possibly shared with a tied output head).
    pub(crate) fn shared(&mut self, name: &str) -> Result<Arc<QTensor>> {
        let t = Arc::new(self.qtensor(name)?);
        self.count(&t);
        Ok(t)
    }

    /// A matmul over a tensor obtained from [`Self::shared`] (not counted again).
    pub(crate) fn matrix_from_shared(&mut self, t: &Arc<QTensor>) -> Result<QMatMul> {
        let r = self.maybe_requantize(t.clone())?;
        if !Arc::ptr_eq(&r, t) {
            self.count(&r);
        }
        Ok(QMatMul::from_arc(r)?)
    }

    fn maybe_requantize(&self, t: Arc<QTensor>) -> Result<Arc<QTensor>> {
        let wanted = match self.requantize {
            Requantize::Always => true,
            Requantize::Never => false,
            Requantize::Auto => !(self.device.is_cpu() && crate::qgemm::has_cpu_kernel(t.dtype())),
        };
        if wanted && matches!(t.dtype(), GgmlDType::Q4_0 | GgmlDType::Q4_1) {
            let f = t.dequantize(&Device::Cpu)?;
            return Ok(Arc::new(QTensor::quantize_onto(
                &f,
                GgmlDType::Q8_0,
                &self.device,
            )?));
        }
        Ok(t)
    }

    /// An RMSNorm weight.
    pub(crate) fn norm(&mut self, name: &str, eps: f64) -> Result<RmsNorm> {
        let t = self.qtensor(name)?;
        self.bytes += (t.shape().elem_count() * 4) as u64;
        Ok(RmsNorm::from_qtensor(t, eps)?)
    }

    /// An optional f32 vector (bias), dequantised.
    pub(crate) fn optional_vector(&mut self, name: &str) -> Result<Option<Tensor>> {
        if !self.has(name) {
            return Ok(None);
        }
        let t = self.qtensor(name)?;
        self.bytes += (t.shape().elem_count() * 4) as u64;
        Ok(Some(t.dequantize(&self.device)?))
    }
}
