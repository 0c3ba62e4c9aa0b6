//! Comparing secrets (tokens, keys) without telling, through the time taken, where a guess
//! went wrong: the controllers' token checks and rank 0's API key share it.

/// Whether `a` and `b` are equal, in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_equal_secrets_compare_equal() {
        assert!(constant_time_eq(b"tbsvc-ab", b"tbsvc-ab"));
        for other in [&b"tbsvc-a"[..], b"tbsvc-ac", b"tbsvc-ab0", b""] {
            assert!(!constant_time_eq(other, b"tbsvc-ab"));
        }
    }
}
