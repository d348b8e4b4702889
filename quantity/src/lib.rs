//! Kubernetes-style byte quantities: a plain integer (`1073741824`), or a number with a binary
//! (`Ki`..`Ei`) or decimal (`k`..`E`) suffix (`10Gi`, `500M`, `1.5Gi`).
//!
//! A leaf crate, so that whoever reads a size (the importer, the launcher's VM spec) does not
//! link the image pipeline for it.

/// Why a quantity is not a byte count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("size {input:?} has an unknown suffix {suffix:?} (use Ki, Mi, Gi, Ti or k, M, G, T)")]
    UnknownSuffix { input: String, suffix: String },
    #[error("size {0:?} is not a number of bytes")]
    NotBytes(String),
}

/// Parses a byte count: a plain integer, or a number with a binary (Ki..Ei) or decimal (k..E)
/// suffix. Fractions are allowed with a suffix (`1.5Gi`) and rounded up to a whole byte.
/// Surrounding white space is ignored.
pub fn parse(s: &str) -> Result<u64, Error> {
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
            return Err(Error::UnknownSuffix {
                input: s.to_string(),
                suffix: other.to_string(),
            });
        }
    };
    let bad = || Error::NotBytes(s.to_string());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse("10Gi").unwrap(), 10 << 30);
        assert_eq!(parse("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse("2G").unwrap(), 2_000_000_000);
        assert_eq!(parse("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse(" 4k ").unwrap(), 4000);
    }

    #[test]
    fn bad_quantities_are_refused() {
        for bad in ["", "Gi", "1.2.3Gi", "99999999999Ei"] {
            assert_eq!(parse(bad), Err(Error::NotBytes(bad.to_string())), "{bad:?}");
        }
        assert!(matches!(parse("-1"), Err(Error::UnknownSuffix { .. })));
        assert_eq!(
            parse("10GB").unwrap_err().to_string(),
            "size \"10GB\" has an unknown suffix \"GB\" (use Ki, Mi, Gi, Ti or k, M, G, T)"
        );
    }
}
