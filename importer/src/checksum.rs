//! Source checksums (`--checksum ALG:HEX`), computed over the bytes as downloaded.

use std::fmt;
use std::str::FromStr;

use md5::Digest as _;

use crate::error::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Md5,
    Sha1,
    Sha256,
    Sha512,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Md5 => "md5",
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        }
    }

    fn digest_len(self) -> usize {
        match self {
            Algorithm::Md5 => 16,
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
            Algorithm::Sha512 => 64,
        }
    }

    pub fn hasher(self) -> Hasher {
        match self {
            Algorithm::Md5 => Hasher::Md5(md5::Md5::new()),
            Algorithm::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            Algorithm::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Algorithm::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }
}

/// An expected checksum, as given by the user (`sha256:ab12...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    pub algorithm: Algorithm,
    pub digest: Vec<u8>,
}

impl FromStr for Checksum {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let (alg, hex_digest) = s.split_once(':').ok_or_else(|| {
            Error::InvalidInput(format!("checksum {s:?} is not of the form ALGORITHM:HEX"))
        })?;
        let algorithm = match alg.to_ascii_lowercase().as_str() {
            "md5" => Algorithm::Md5,
            "sha1" => Algorithm::Sha1,
            "sha256" => Algorithm::Sha256,
            "sha512" => Algorithm::Sha512,
            other => {
                return Err(Error::InvalidInput(format!(
                    "checksum algorithm {other:?} is not one of md5, sha1, sha256, sha512"
                )));
            }
        };
        let digest = hex::decode(hex_digest.trim()).map_err(|e| {
            Error::InvalidInput(format!("checksum {hex_digest:?} is not hexadecimal: {e}"))
        })?;
        if digest.len() != algorithm.digest_len() {
            return Err(Error::InvalidInput(format!(
                "a {} checksum has {} hex digits, {hex_digest:?} has {}",
                algorithm.as_str(),
                algorithm.digest_len() * 2,
                hex_digest.trim().len()
            )));
        }
        Ok(Checksum { algorithm, digest })
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}",
            self.algorithm.as_str(),
            hex::encode(&self.digest)
        )
    }
}

/// A running digest of one of the supported algorithms.
pub enum Hasher {
    Md5(md5::Md5),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

impl Hasher {
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Md5(h) => h.update(data),
            Hasher::Sha1(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }

    pub fn finish(self) -> Checksum {
        let (algorithm, digest) = match self {
            Hasher::Md5(h) => (Algorithm::Md5, h.finalize().to_vec()),
            Hasher::Sha1(h) => (Algorithm::Sha1, h.finalize().to_vec()),
            Hasher::Sha256(h) => (Algorithm::Sha256, h.finalize().to_vec()),
            Hasher::Sha512(h) => (Algorithm::Sha512, h.finalize().to_vec()),
        };
        Checksum { algorithm, digest }
    }
}

impl Checksum {
    /// Fails with a checksum-mismatch error unless `actual` equals this expected checksum.
    pub fn verify(&self, actual: &Checksum) -> Result<(), Error> {
        if self == actual {
            Ok(())
        } else {
            Err(Error::ChecksumMismatch {
                algorithm: self.algorithm.as_str(),
                expected: hex::encode(&self.digest),
                actual: hex::encode(&actual.digest),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    const ABC_SHA256: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    const ABC_MD5: &str = "900150983cd24fb0d6963f7d28e17f72";

    fn digest_of(alg: Algorithm, data: &[u8]) -> Checksum {
        let mut h = alg.hasher();
        h.update(data);
        h.finish()
    }

    #[test]
    fn known_vectors() {
        assert_eq!(
            digest_of(Algorithm::Sha256, b"abc").to_string(),
            format!("sha256:{ABC_SHA256}")
        );
        assert_eq!(
            digest_of(Algorithm::Md5, b"abc").to_string(),
            format!("md5:{ABC_MD5}")
        );
        assert_eq!(
            digest_of(Algorithm::Sha1, b"abc").to_string(),
            "sha1:a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert!(
            digest_of(Algorithm::Sha512, b"abc")
                .to_string()
                .starts_with("sha512:ddaf35a193617aba")
        );
    }

    #[test]
    fn parses_and_verifies() {
        let expected: Checksum = format!("SHA256:{}", ABC_SHA256.to_uppercase())
            .parse()
            .unwrap();
        expected
            .verify(&digest_of(Algorithm::Sha256, b"abc"))
            .unwrap();
        let err = expected
            .verify(&digest_of(Algorithm::Sha256, b"abd"))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ChecksumMismatch);
        assert!(err.to_string().contains(ABC_SHA256), "{err}");
    }

    #[test]
    fn refuses_malformed_checksums() {
        for bad in [
            "sha256",
            "crc32:00",
            "sha256:zz",
            "md5:900150983cd24fb0",
            "sha1:",
        ] {
            let err = bad.parse::<Checksum>().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}");
        }
    }
}
