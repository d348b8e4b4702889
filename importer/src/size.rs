//! Volume sizes: Kubernetes-style quantities (`10Gi`, `500M`, `1073741824`) and the usable space of
//! a filesystem volume once its overhead is set aside, computed as CDI does.

use crate::error::{Error, Result};

/// Parses a byte count (see [`quantity::parse`]); a bad one is invalid input.
pub fn parse_quantity(s: &str) -> Result<u64> {
    quantity::parse(s).map_err(|e| Error::InvalidInput(e.to_string()))
}

/// CDI's block alignment for usable space.
const ALIGN: u64 = 1 << 20;

/// The bytes of a filesystem volume of `size` bytes an image may use, as CDI's
/// `GetUsableSpace`: `(1 - overhead) * size` rounded up, then down to a whole MiB.
pub fn usable_space(size: u64, overhead: f64) -> u64 {
    let without_overhead = ((1.0 - overhead) * size as f64).ceil() as u64;
    without_overhead / ALIGN * ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_quantities_are_invalid_input() {
        for bad in ["", "Gi", "10GB", "-1", "1.2.3Gi", "99999999999Ei"] {
            let err = parse_quantity(bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn usable_space_matches_cdi() {
        // 1 GiB with CDI's default 5.5% overhead is 967.68 MiB, rounded down to 967 MiB.
        assert_eq!(usable_space(1 << 30, 0.055), 967 << 20);
        assert_eq!(usable_space(10 << 30, 0.0), 10 << 30);
        assert_eq!(usable_space(10 << 30, 0.06), 9625 << 20);
    }
}
