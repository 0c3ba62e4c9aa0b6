//! Element-wise sums on byte slices holding f32, f16 or bf16 (little-endian, as on every Mac and
//! every Linux machine tb runs on). f16/bf16 are added in f32 and rounded once per addition,
//! as MLX does on the CPU.

use half::{bf16, f16};

use super::super::TransportError;
use super::super::wire::DType;

/// `dst[i] += src[i]` for every element; both slices hold the same number of `dtype` elements.
pub fn sum_into(dst: &mut [u8], src: &[u8], dtype: DType) -> Result<(), TransportError> {
    if dst.len() != src.len() || !dst.len().is_multiple_of(dtype.size()) {
        return Err(TransportError::Invalid(format!(
            "sum of {} and {} bytes of {}",
            dst.len(),
            src.len(),
            dtype.name()
        )));
    }
    match dtype {
        DType::F32 => {
            sum_typed::<f32, 4>(dst, src, |a, b| a + b, f32::from_le_bytes, f32::to_le_bytes)
        }
        DType::F16 => sum_typed::<f16, 2>(
            dst,
            src,
            |a, b| f16::from_f32(a.to_f32() + b.to_f32()),
            f16::from_le_bytes,
            f16::to_le_bytes,
        ),
        DType::BF16 => sum_typed::<bf16, 2>(
            dst,
            src,
            |a, b| bf16::from_f32(a.to_f32() + b.to_f32()),
            bf16::from_le_bytes,
            bf16::to_le_bytes,
        ),
        DType::U8 => {
            return Err(TransportError::Unsupported(
                "sum of uint8 (raw bytes) is not defined".into(),
            ));
        }
    }
    Ok(())
}

/// Marker for the plain-old-data element types: every bit pattern is a valid value.
///
/// # Safety
/// Implementors must be `Copy` types without padding for which every bit pattern is valid.
unsafe trait Pod: Copy {}
// SAFETY: f32, f16 and bf16 are 4/2/2-byte types with no padding; all bit patterns are values.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for f16 {}
// SAFETY: as above.
unsafe impl Pod for bf16 {}

fn sum_typed<T: Pod, const N: usize>(
    dst: &mut [u8],
    src: &[u8],
    add: impl Fn(T, T) -> T,
    from: fn([u8; N]) -> T,
    to: fn(T) -> [u8; N],
) {
    // SAFETY: T is Pod (any bit pattern is valid) so reinterpreting aligned bytes is sound;
    // align_to puts misaligned ends in the prefix/suffix, handled byte-wise below.
    let (dp, dm, ds) = unsafe { dst.align_to_mut::<T>() };
    // SAFETY: as above.
    let (sp, sm, ss) = unsafe { src.align_to::<T>() };
    if dp.is_empty() && sp.is_empty() && ds.is_empty() && ss.is_empty() {
        for (d, s) in dm.iter_mut().zip(sm) {
            *d = add(*d, *s);
        }
        return;
    }
    for (d, s) in dst.chunks_exact_mut(N).zip(src.chunks_exact(N)) {
        let mut a = [0u8; N];
        let mut b = [0u8; N];
        a.copy_from_slice(d);
        b.copy_from_slice(s);
        d.copy_from_slice(&to(add(from(a), from(b))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_each_dtype_aligned_or_not() {
        let a: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let mut d = [0u8; 13];
        d[1..].copy_from_slice(&a);
        sum_into(&mut d[1..], &a, DType::F32).unwrap();
        let got: Vec<f32> = d[1..]
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![3.0, -4.0, 6.5]);
        for dt in [DType::F16, DType::BF16] {
            let one = match dt {
                DType::F16 => f16::from_f32(1.5).to_le_bytes(),
                _ => bf16::from_f32(1.5).to_le_bytes(),
            };
            let mut d = one.repeat(5);
            sum_into(&mut d, &one.repeat(5), dt).unwrap();
            let three = match dt {
                DType::F16 => f16::from_f32(3.0).to_le_bytes(),
                _ => bf16::from_f32(3.0).to_le_bytes(),
            };
            assert_eq!(d, three.repeat(5));
        }
        assert!(sum_into(&mut [0u8; 3], &[0u8; 3], DType::F32).is_err());
    }
}
