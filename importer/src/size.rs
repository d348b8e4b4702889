//! Volume sizes: Kubernetes-style quantities (`10Gi`, `500M`, `1073741824`) and the usable space of
//! a filesystem volume once its overhead is set aside, computed as CDI does.

use crate::error::{Error, Result};

/// Parses a byte count: a plain integer, or a number with a binary (Ki..Ei) or decimal (k..E)
/// suffix. Fractions are allowed with a suffix (`1.5Gi`) and rounded up to a whole byte.
pub fn parse_quantity(s: &str) -> Result<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let multiplier: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        other => {
            return Err(Error::InvalidInput(format!(
                "size {s:?} has an unknown suffix {other:?} (use Ki, Mi, Gi, Ti or k, M, G, T)"
            )));
        }
    };
    let bad = || Error::InvalidInput(format!("size {s:?} is not a number of bytes"));
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).ok_or_else(bad);
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bytes = (value * multiplier as f64).ceil();
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
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
    fn quantities() {
        assert_eq!(parse_quantity("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse_quantity("10Gi").unwrap(), 10 << 30);
        assert_eq!(parse_quantity("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse_quantity("2G").unwrap(), 2_000_000_000);
        assert_eq!(parse_quantity("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_quantity(" 4k ").unwrap(), 4000);
    }

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
