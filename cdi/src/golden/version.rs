//! The version of a DataImportCron's source, whether it changed since the last import, and the
//! import DataVolume's name.
//!
//! CDI records a version as a digest string (`status.currentImports[].Digest`): a registry
//! manifest's `sha256:...`, or `uid:...` for a PVC source. CDI polls registries only; Quarry also
//! polls HTTP (`ETag`, else `Last-Modified`, else a hash of the first bytes) and S3 (the object's
//! ETag), and records those as `sha256:` of the kind and value, so every digest names its
//! DataVolume the way CDI names them.

use sha2::{Digest, Sha256};

/// CDI's digest prefixes.
const SHA256_PREFIX: &str = "sha256:";
const UID_PREFIX: &str = "uid:";
/// Characters of the digest CDI puts in a DataVolume's name.
const NAME_DIGEST_CHARS: usize = 12;
/// Longest object name (DNS-1123 subdomain).
const MAX_NAME: usize = 253;

/// What identifies one version of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceVersion {
    /// A registry image's manifest digest, `sha256:HEX`.
    RegistryDigest(String),
    /// A PVC source's UID (CDI's `uid:` digest).
    PvcUid(String),
    /// An HTTP `ETag` header, as sent (quotes and `W/` kept).
    HttpEtag(String),
    /// An HTTP `Last-Modified` header, as sent.
    HttpLastModified(String),
    /// SHA-256 (hex) of the first bytes of an HTTP object that sends neither header.
    HttpHeadHash(String),
    /// An S3 object's ETag.
    S3Etag(String),
}

impl SourceVersion {
    /// The best version an HTTP response gives: its ETag, else its Last-Modified, else the hash
    /// of the head bytes read with a ranged GET.
    pub fn from_http(
        etag: Option<&str>,
        last_modified: Option<&str>,
        head: Option<&[u8]>,
    ) -> Option<SourceVersion> {
        fn present(v: Option<&str>) -> Option<&str> {
            v.map(str::trim).filter(|v| !v.is_empty())
        }
        if let Some(e) = present(etag) {
            Some(SourceVersion::HttpEtag(e.into()))
        } else if let Some(m) = present(last_modified) {
            Some(SourceVersion::HttpLastModified(m.into()))
        } else {
            head.map(|b| SourceVersion::HttpHeadHash(hex::encode(Sha256::digest(b))))
        }
    }

    /// The digest recorded in the cron's status (what "changed?" compares).
    pub fn digest(&self) -> String {
        let hashed = |kind: &str, v: &str| {
            format!(
                "{SHA256_PREFIX}{}",
                hex::encode(Sha256::digest(format!("{kind}:{v}")))
            )
        };
        match self {
            SourceVersion::RegistryDigest(d) => d.clone(),
            SourceVersion::PvcUid(uid) => format!("{UID_PREFIX}{uid}"),
            SourceVersion::HttpEtag(v) => hashed("http-etag", v),
            SourceVersion::HttpLastModified(v) => hashed("http-last-modified", v),
            SourceVersion::HttpHeadHash(v) => hashed("http-head-sha256", v),
            SourceVersion::S3Etag(v) => hashed("s3-etag", v),
        }
    }
}

/// Whether a new import is due (CDI's rule): a version is known and differs from the import
/// recorded last (in progress or done).
pub fn needs_import(desired: Option<&str>, current_digest: Option<&str>) -> bool {
    match desired {
        Some(d) if !d.is_empty() => current_digest != Some(d),
        _ => false,
    }
}

/// Why no DataVolume name can be made from a digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Neither `sha256:` nor `uid:`.
    #[error("digest {0:?} has no supported prefix (sha256: or uid:)")]
    Prefix(String),
    /// Fewer than 12 characters after the prefix.
    #[error("digest {0:?} is too short")]
    Short(String),
}

/// The import DataVolume's name as CDI makes it: the managed DataSource's name, a dash and the
/// first 12 characters of the digest, shortened with a hash when longer than 253 characters.
pub fn import_name(data_source: &str, digest: &str) -> Result<String, NameError> {
    let rest = digest
        .strip_prefix(SHA256_PREFIX)
        .or_else(|| digest.strip_prefix(UID_PREFIX))
        .ok_or_else(|| NameError::Prefix(digest.into()))?;
    let suffix = rest
        .get(..NAME_DIGEST_CHARS)
        .ok_or_else(|| NameError::Short(digest.into()))?;
    Ok(resource_name(data_source, suffix))
}

/// OpenShift's `naming.GetName(base, suffix, 253)`, which CDI names objects with: `base-suffix`
/// when it fits, else the base cut short, an FNV-1a hash of the base and the suffix.
fn resource_name(base: &str, suffix: &str) -> String {
    let name = format!("{base}-{suffix}");
    if name.len() <= MAX_NAME {
        return name;
    }
    // `-` + 8 hex + `-`.
    match MAX_NAME.checked_sub(10 + suffix.len()) {
        Some(keep) => format!("{}-{}-{suffix}", cut(base, keep), fnv32a(base)),
        None => {
            let short = format!("{}-{}", cut(base, MAX_NAME - 9), fnv32a(&name));
            cut(&short, MAX_NAME).to_string()
        }
    }
}

/// The first `n` bytes of a name (object names are ASCII; stop early at a char boundary).
fn cut(s: &str, n: usize) -> &str {
    let mut n = n.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

fn fnv32a(s: &str) -> String {
    format!("{:08x}", fnv1a(s))
}

/// 32-bit FNV-1a of `s`: stable across processes and releases (the std hasher is not).
pub(crate) fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5, |h: u32, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:3d8e5b5ff4b1c8f2a0e4d6c9b7a5e3f1d2c4b6a8e0f2d4c6b8a0e2f4d6c8b0a2";

    #[test]
    fn http_prefers_etag_then_last_modified_then_the_head_hash() {
        let date = "Wed, 01 May 2024 10:00:00 GMT";
        let lm = Some(date);
        assert_eq!(
            SourceVersion::from_http(Some("\"abc\""), lm, Some(b"x")),
            Some(SourceVersion::HttpEtag("\"abc\"".into()))
        );
        assert_eq!(
            SourceVersion::from_http(Some(" "), lm, Some(b"x")),
            Some(SourceVersion::HttpLastModified(date.into()))
        );
        assert_eq!(
            SourceVersion::from_http(None, None, Some(b"")),
            Some(SourceVersion::HttpHeadHash(
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into()
            ))
        );
        assert_eq!(SourceVersion::from_http(None, None, None), None);
    }

    #[test]
    fn registry_and_pvc_digests_are_cdis() {
        assert_eq!(
            SourceVersion::RegistryDigest(DIGEST.into()).digest(),
            DIGEST
        );
        assert_eq!(
            SourceVersion::PvcUid("1234-5678".into()).digest(),
            "uid:1234-5678"
        );
    }

    #[test]
    fn http_and_s3_digests_differ_by_kind_and_value_and_name_a_volume() {
        let etag = SourceVersion::HttpEtag("\"v1\"".into()).digest();
        assert!(etag.starts_with("sha256:") && etag.len() == 7 + 64);
        assert_ne!(etag, SourceVersion::S3Etag("\"v1\"".into()).digest());
        assert_ne!(etag, SourceVersion::HttpEtag("\"v2\"".into()).digest());
        assert_eq!(etag, SourceVersion::HttpEtag("\"v1\"".into()).digest());
        assert!(import_name("fedora", &etag).is_ok());
    }

    #[test]
    fn an_import_is_due_only_when_a_known_version_differs() {
        assert!(needs_import(Some(DIGEST), None));
        assert!(needs_import(Some(DIGEST), Some("sha256:other")));
        assert!(!needs_import(Some(DIGEST), Some(DIGEST)));
        assert!(!needs_import(None, Some(DIGEST)));
        assert!(!needs_import(Some(""), None));
    }

    #[test]
    fn the_import_is_named_from_the_data_source_and_twelve_digest_characters() {
        assert_eq!(
            import_name("fedora", DIGEST).unwrap(),
            "fedora-3d8e5b5ff4b1"
        );
        assert_eq!(
            import_name("rhel9", "uid:0a1b2c3d-4e5f-6789").unwrap(),
            "rhel9-0a1b2c3d-4e5"
        );
    }

    #[test]
    fn digests_without_a_known_prefix_or_too_short_are_refused() {
        assert_eq!(
            import_name("f", "md5:0123456789abcdef"),
            Err(NameError::Prefix("md5:0123456789abcdef".into()))
        );
        assert_eq!(
            import_name("f", "sha256:0123"),
            Err(NameError::Short("sha256:0123".into()))
        );
    }

    #[test]
    fn a_long_data_source_name_is_shortened_with_a_hash_as_openshift_does() {
        let base = "a".repeat(250);
        let name = import_name(&base, DIGEST).unwrap();
        assert_eq!(name.len(), 253);
        assert!(name.starts_with(&"a".repeat(231)));
        assert!(name.ends_with(&format!("-{}-3d8e5b5ff4b1", fnv32a(&base))));
        // FNV-1a of "a" is e40c292c.
        assert_eq!(fnv32a("a"), "e40c292c");
    }
}
