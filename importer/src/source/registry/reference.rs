//! Image references: `docker://HOST[:PORT]/NAME[:TAG|@DIGEST]`, as CDI's `source.registry.url`.

use crate::checksum::{Algorithm, Checksum};
use crate::error::{Error, Result};

/// Docker Hub's registry, for references without a registry host (`docker://alpine`).
pub const DOCKER_HUB: &str = "registry-1.docker.io";

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]` of the registry.
    pub registry: String,
    /// Repository path (`library/alpine`, `kubevirt/fedora-cloud-container-disk-demo`).
    pub repository: String,
    /// Tag, or the digest when pinned (`sha256:...`): what the manifest URL names.
    pub reference: String,
    /// The pinned manifest digest, verified against the manifest's bytes.
    pub digest: Option<Checksum>,
}

impl Reference {
    pub fn parse(spec: &str) -> Result<Reference> {
        let bad = |why: &str| Error::InvalidInput(format!("image reference {spec:?}: {why}"));
        let rest = spec
            .get(..9)
            .filter(|p| p.eq_ignore_ascii_case("docker://"))
            .map(|_| &spec[9..])
            .ok_or_else(|| bad("expected docker://HOST[:PORT]/NAME[:TAG|@DIGEST]"))?;
        let (name, digest) = match rest.split_once('@') {
            Some((n, d)) => (n, Some(parse_digest(d)?)),
            None => (rest, None),
        };
        let (name, tag) = match name.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, Some(t)),
            _ => (name, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            Some(_) => (DOCKER_HUB.to_string(), name.to_string()),
            None => (DOCKER_HUB.to_string(), format!("library/{name}")),
        };
        if repository.is_empty()
            || !repository
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b'/'))
            || repository.split('/').any(str::is_empty)
        {
            return Err(bad(
                "the repository name must be lower-case letters, digits and . _ - / separators",
            ));
        }
        if let Some(t) = tag
            && (t.is_empty()
                || t.len() > 128
                || !t
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
        {
            return Err(bad("invalid tag"));
        }
        let reference = match (&digest, tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.to_string(),
            (None, None) => "latest".to_string(),
        };
        Ok(Reference {
            registry,
            repository,
            reference,
            digest,
        })
    }

    /// `host/name:tag` for messages.
    pub fn display(&self) -> String {
        let sep = if self.digest.is_some() { '@' } else { ':' };
        format!(
            "docker://{}/{}{sep}{}",
            self.registry, self.repository, self.reference
        )
    }
}

/// An OCI digest (`sha256:HEX` or `sha512:HEX`).
pub fn parse_digest(s: &str) -> Result<Checksum> {
    let c: Checksum = s
        .parse()
        .map_err(|e| Error::InvalidInput(format!("digest {s:?}: {e}")))?;
    if !matches!(c.algorithm, Algorithm::Sha256 | Algorithm::Sha512) {
        return Err(Error::Unsupported(format!(
            "digest {s:?}: only sha256 and sha512 digests are supported"
        )));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = Reference::parse("docker://127.0.0.1:5000/vm/disk:v1").unwrap();
        assert_eq!(
            (
                r.registry.as_str(),
                r.repository.as_str(),
                r.reference.as_str()
            ),
            ("127.0.0.1:5000", "vm/disk", "v1")
        );
        let r = Reference::parse("docker://quay.io/containerdisks/fedora").unwrap();
        assert_eq!(r.reference, "latest");
        let r = Reference::parse("docker://alpine").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            (DOCKER_HUB, "library/alpine")
        );
        let d = format!("sha256:{}", "ab".repeat(32));
        let r = Reference::parse(&format!("docker://localhost/x@{d}")).unwrap();
        assert_eq!(r.reference, d);
        assert!(r.digest.is_some());
        assert_eq!(r.display(), format!("docker://localhost/x@{d}"));
        for bad in [
            "http://h/x",
            "docker://h.io/Upper",
            "docker://h.io/x:bad tag",
            "docker://h.io/x@sha256:12",
            "docker://h.io//x",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Reference::parse(&format!("docker://h.io/x@md5:{}", "0".repeat(32)))
                .unwrap_err()
                .kind(),
            crate::ErrorKind::Unsupported
        );
    }
}
