//! Memory admission: before the nodelet starts work it checks that the memory already promised
//! to running work plus the new request stays within what this machine may allocate. Unified
//! memory is shared by CPU and GPU, so one overcommitted model can stall every job on the Mac.

/// Whether `requested` bytes fit next to the `used` reservations within `allocatable` bytes.
/// Overflowing sums never fit.
pub fn fits(allocatable: u64, used: &[u64], requested: u64) -> bool {
    used.iter()
        .try_fold(requested, |total, &bytes| total.checked_add(bytes))
        .is_some_and(|total| total <= allocatable)
}

#[cfg(test)]
mod tests {
    use super::fits;

    #[test]
    fn fits_within_allocatable() {
        assert!(fits(100, &[], 100));
        assert!(fits(100, &[30, 20], 50));
        assert!(!fits(100, &[30, 20], 51));
        assert!(!fits(0, &[], 1));
        assert!(fits(0, &[], 0));
    }

    #[test]
    fn overflow_never_fits() {
        assert!(!fits(u64::MAX, &[u64::MAX], 1));
        assert!(!fits(u64::MAX, &[u64::MAX / 2 + 1, u64::MAX / 2 + 1], 0));
    }
}
