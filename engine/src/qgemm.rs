//! Quantised matrix products (Q8_0, Q4_0, Q4_1 weights) on x86-64 CPUs, each weight block read
//! once for a tile of input rows.
//!
//! candle's CPU path for a quantised weight (`k_quants::matmul`) computes every output element
//! with a separate per-block dot product, converting both blocks' f16 scales each time, so a
//! batched decode step of 8 sequences costs nearly 8 single steps (measured on Q8_0: 8 rows gave
//! 1.22× the tokens/s of 1); for Q4_1 its dot product is scalar code (measured: 26 tokens/s where
//! Q8_0 gave 71). Here the input rows are quantised once, as candle quantises them, and every
//! weight block is loaded, unpacked and its scale converted once, then multiplied with up to 8
//! input rows (`ROW_TILE`) that stay in L1. Where the CPU has AVX-512 VNNI, Q4_1 and Q8_0 go
//! to a kernel that puts 16 output columns in the lanes of a register (`x86/lanes.rs`; a
//! batched decode of 8 sequences 1.4× the tokens/s of the pairwise kernel,
//! `x86/wide.rs`, which keeps the columns past the last group of 16); Q4_0 and other CPUs stay
//! on AVX2.
//!
//! The AVX2 kernel's Q8_0 and Q4_0 products are bit-identical to candle's per-block AVX ones
//! (candle's repacked path, taken when k is a multiple of 256, sums in another order); the
//! AVX-512 kernels sum in other orders and agree in all but the last bits. Q4_1's differ from
//! candle's scalar order in the last bits: the AVX2 kernel sums the block's `min · sum(x)` term
//! apart from the scaled dot products, as llama.cpp does, so a block costs one vector FMA instead of a
//! horizontal sum. Since each layer's input is requantised to 8 bits, such last-bit
//! differences can move a rounding step and grow through the layers; [`use_candle_kernels`]
//! turns tb's kernels off to compare the engine with candle's reference model exactly.
//!
//! Every output element is computed by the same sequence of operations whatever the number of
//! rows or where its row falls in a tile, so a sequence's logits do not depend on what it is
//! batched with (one process uses one kernel per format). Used where the CPU has AVX2, FMA and
//! F16C and the weight is an in-memory matrix of one of these types; everything else (other
//! types, Metal, other CPUs) goes to candle.

use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{Module, Result, Tensor};

/// Values per block, in all three formats.
#[cfg(target_arch = "x86_64")]
const QK: usize = 32;

/// Whether tb's kernel runs `dtype` weights on this machine's CPU: where it does, 4-bit weights
/// are best served as stored; where it does not, candle's Q8_0 path beats its scalar Q4_1 one.
pub fn has_cpu_kernel(dtype: GgmlDType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::Format::of(dtype).is_some() && x86::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        false
    }
}

static CANDLE_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Routes every quantised product and every attention of this process through candle's ops
/// (`true`) or back to tb's where they apply (`false`, the default). For checking the engine's
/// math against candle-transformers' reference model, which sums in candle's order.
pub fn use_candle_kernels(only: bool) {
    CANDLE_ONLY.store(only, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`use_candle_kernels`] routed everything through candle.
pub(crate) fn candle_kernels_only() -> bool {
    CANDLE_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}

/// `W·x` for `x` [.., k] and `W` [n, k]: tb's kernel where it applies, candle's otherwise.
pub(crate) fn forward(w: &QMatMul, x: &Tensor) -> Result<Tensor> {
    let mut out = forward_many(&[w], x)?;
    out.pop()
        .ok_or_else(|| candle_core::Error::Msg("no product".into()))
}

/// `W·x` for each of `ws` and the same `x`. Where tb's kernel takes them all (one format), the
/// input is quantised once and the products share one call of the thread pool: a layer's q, k
/// and v, or gate and up, cost one dispatch instead of three or two. The results are the
/// same as [`forward`]'s, bit for bit.
pub(crate) fn forward_many(ws: &[&QMatMul], x: &Tensor) -> Result<Vec<Tensor>> {
    #[cfg(target_arch = "x86_64")]
    if let Some(out) = x86_products(ws, x)? {
        return Ok(out);
    }
    match ws {
        [w] => Ok(vec![w.forward(x)?]),
        // Not all in one format: each by itself, by tb's kernel where it takes it.
        _ => ws.iter().map(|w| forward(w, x)).collect(),
    }
}

/// The products by tb's x86 kernel, or `None` where it does not take them all.
#[cfg(target_arch = "x86_64")]
fn x86_products(ws: &[&QMatMul], x: &Tensor) -> Result<Option<Vec<Tensor>>> {
    if candle_kernels_only()
        || !x.device().is_cpu()
        || x.dtype() != candle_core::DType::F32
        || !x86::available()
    {
        return Ok(None);
    }
    let Some(k) = x.dims().last().copied().filter(|k| k % QK == 0) else {
        return Ok(None);
    };
    let mut format = None;
    let mut parts = Vec::with_capacity(ws.len());
    for w in ws {
        let QMatMul::QTensor(q) = w else {
            return Ok(None);
        };
        let Some(f) = x86::Format::of(q.dtype()) else {
            return Ok(None);
        };
        let (n, wk) = q.shape().dims2()?;
        if !q.device().is_cpu() || wk != k || format.is_some_and(|g| g != f) {
            return Ok(None);
        }
        format = Some(f);
        parts.push((q.data()?, n));
    }
    let Some(format) = format else {
        return Ok(Some(Vec::new()));
    };
    let parts: Vec<(&[u8], usize)> = parts.iter().map(|(d, n)| (d.as_ref(), *n)).collect();
    x86::matmul_many(format, &parts, k, x, x86::wide::available()).map(Some)
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    const FORMATS: [GgmlDType; 3] = [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1];

    fn weight(n: usize, k: usize, dtype: GgmlDType) -> QMatMul {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1 + (i / k) as f32 * 1e-3)
            .collect();
        let w = Tensor::from_vec(w, (n, k), &Device::Cpu).expect("w");
        QMatMul::from_qtensor(QTensor::quantize(&w, dtype).expect("q")).expect("qmm")
    }

    fn input(rows: usize, k: usize, seed: usize) -> Tensor {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| (((i + seed) * 104729 % 2003) as f32 / 1001.0 - 1.0) * 2.0)
            .collect();
        Tensor::from_vec(x, (1, rows, k), &Device::Cpu).expect("x")
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// The kernels this CPU runs: AVX2 (`false`) and, where the CPU has it, AVX-512 (`true`).
    fn kernels() -> Vec<bool> {
        assert!(
            super::x86::available(),
            "the tests expect AVX2, FMA and F16C"
        );
        std::iter::once(false)
            .chain(super::x86::wide::available().then_some(true))
            .collect()
    }

    /// `W·x` by one of tb's kernels.
    fn product(w: &QMatMul, x: &Tensor, wide: bool) -> Vec<f32> {
        let QMatMul::QTensor(q) = w else {
            panic!("a quantised weight")
        };
        let format = super::x86::Format::of(q.dtype()).expect("a format the kernels take");
        let (n, k) = q.shape().dims2().unwrap();
        values(&super::x86::matmul_with(format, &q.data().unwrap(), n, k, x, wide).unwrap())
    }

    fn assert_close(ours: &[f32], theirs: &[f32], what: &str) {
        assert_eq!(ours.len(), theirs.len(), "{what}");
        let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "{what} element {i}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn equals_candles_product() {
        // k = 576 (SmolLM2's hidden size) is not a multiple of 256, so candle takes its per-block
        // vec_dot path. For Q8_0 and Q4_0 the AVX2 kernel performs the same operations in the
        // same order; for Q4_1 candle's is scalar and sums in another order, and the AVX-512
        // kernels sum in other orders, so there only the last bits agree.
        let (n, k) = (100, 576);
        for dtype in FORMATS {
            let w = weight(n, k, dtype);
            for rows in [1, 3, 8, 13] {
                let x = input(rows, k, rows);
                let theirs = values(&w.forward(&x).expect("candle"));
                assert_eq!(values(&super::forward(&w, &x).unwrap()).len(), theirs.len());
                for wide in kernels() {
                    let ours = product(&w, &x, wide);
                    if dtype == GgmlDType::Q4_1 || wide {
                        assert_close(
                            &ours,
                            &theirs,
                            &format!("{dtype:?} rows {rows} wide {wide}"),
                        );
                    } else {
                        assert_eq!(ours, theirs, "{dtype:?} rows {rows}");
                    }
                }
            }
        }
    }

    #[test]
    fn an_odd_block_count_sums_like_the_zero_padded_even_one() {
        // candle's Q4_1 product takes blocks in pairs, so an odd count (19 blocks, the AVX-512
        // kernel's tail) is checked through the same product padded with a zero block.
        let (n, k, padded) = (40, 608, 640);
        let dense: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1)
            .collect();
        let pad = |v: &[f32], rows: usize| -> Vec<f32> {
            v.chunks_exact(k)
                .take(rows)
                .flat_map(|row| {
                    row.iter()
                        .copied()
                        .chain(std::iter::repeat_n(0.0, padded - k))
                })
                .collect()
        };
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let quantised = |v: Vec<f32>, k: usize| {
                let t = Tensor::from_vec(v, (n, k), &Device::Cpu).unwrap();
                QMatMul::from_qtensor(QTensor::quantize(&t, dtype).unwrap()).unwrap()
            };
            let w = quantised(dense.clone(), k);
            let w_padded = quantised(pad(&dense, n), padded);
            for rows in [1, 8, 9] {
                let x = values(&input(rows, k, 3));
                let x_padded = Tensor::from_vec(pad(&x, rows), (1, rows, padded), &Device::Cpu);
                let theirs = values(&w_padded.forward(&x_padded.unwrap()).unwrap());
                let x = Tensor::from_vec(x, (1, rows, k), &Device::Cpu).unwrap();
                for wide in kernels() {
                    let ours = product(&w, &x, wide);
                    assert_close(
                        &ours,
                        &theirs,
                        &format!("{dtype:?} rows {rows} wide {wide}"),
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
        // 1536 = 48 blocks; 608 = 19, an odd count (the AVX-512 kernel takes blocks in pairs).
        for (dtype, k) in FORMATS.iter().flat_map(|d| [(*d, 1536), (*d, 608)]) {
            let n = 64;
            let w = weight(n, k, dtype);
            let batch = input(11, k, 5);
            for wide in kernels() {
                let together = product(&w, &batch, wide);
                for r in 0..11 {
                    let alone = product(&w, &batch.narrow(1, r, 1).unwrap(), wide);
                    assert_eq!(
                        alone,
                        together[r * n..(r + 1) * n],
                        "{dtype:?} k {k} row {r} wide {wide}"
                    );
                }
            }
        }
    }

    #[test]
    fn several_products_at_once_equal_each_alone() {
        let k = 576;
        let x = input(9, k, 7);
        for dtypes in [
            [GgmlDType::Q4_1; 3],
            [GgmlDType::Q8_0; 3],
            [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4_0],
        ] {
            let ws: Vec<QMatMul> = [100, 33, 40]
                .into_iter()
                .zip(dtypes)
                .map(|(n, dtype)| weight(n, k, dtype))
                .collect();
            let refs: Vec<&QMatMul> = ws.iter().collect();
            let together = super::forward_many(&refs, &x).unwrap();
            assert_eq!(together.len(), 3);
            for (w, y) in ws.iter().zip(&together) {
                let alone = super::forward(w, &x).unwrap();
                assert_eq!(y.dims(), alone.dims(), "{dtypes:?}");
                assert_eq!(values(y), values(&alone), "{dtypes:?}");
            }
        }
    }

    #[test]
    fn the_kernel_covers_the_formats_it_claims() {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            for dtype in FORMATS {
                assert!(super::has_cpu_kernel(dtype), "{dtype:?}");
            }
        }
        assert!(!super::has_cpu_kernel(GgmlDType::Q6K));
    }
}
