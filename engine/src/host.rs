//! A CPU tensor's values read where they lie: the host kernels (products, SwiGLU, an adapter's
//! A and B) take a slice of the tensor's own storage instead of `to_vec1`'s copy, which ran on
//! the thread the kernels' workers wait for (a batch of 8 copied ~200 KB a block this way).

use candle_core::{CpuStorage, Result, Storage, Tensor};

/// `f` on `t`'s f32 values in row-major order: a slice of its storage when it is a contiguous
/// f32 tensor in host memory, else a copy.
pub(crate) fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    if let (Storage::Cpu(CpuStorage::F32(v)), Some((start, end))) =
        (&*storage, layout.contiguous_offsets())
    {
        return Ok(f(&v[start..end]));
    }
    drop(storage);
    Ok(f(&t.flatten_all()?.to_vec1::<f32>()?))
}
