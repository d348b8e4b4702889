//! TLS material that follows its files (servers' identities and client CAs, the upload proxy's
//! client to upload servers): kubelet replaces the files of a mounted Secret when the
//! cert controller rotates it, and a server must serve the new certificate (and trust the new
//! client CA bundle) without a restart. Each handshake compares the files' metadata (device,
//! inode, size, modification time; through the symlinks kubelet swaps) with what was loaded,
//! and reads them again when they differ. A file caught half-written keeps the old material in
//! use, and is read again at the next handshake.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::error::{Error, Result, read_file};
use crate::net::load_certs;

/// What identifies one version of a set of files.
type Stamp = Vec<(u64, u64, u64, i64, i64)>;

fn stamp(paths: &[&Path]) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
        })
        .collect()
}

/// How a value is made from its files.
type Load<T> = Box<dyn Fn(&[PathBuf]) -> Result<T> + Send + Sync>;

/// A value loaded from files, loaded again when they change.
struct Reloading<T> {
    paths: Vec<PathBuf>,
    load: Load<T>,
    current: Mutex<(Option<Stamp>, Arc<T>)>,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("paths", &self.paths)
            .finish()
    }
}

impl<T> Reloading<T> {
    fn new(paths: Vec<PathBuf>, load: Load<T>) -> Result<Self> {
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let before = stamp(&refs);
        let value = load(&paths)?;
        Ok(Reloading {
            paths,
            load,
            current: Mutex::new((before, Arc::new(value))),
        })
    }

    fn get(&self) -> Arc<T> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let refs: Vec<&Path> = self.paths.iter().map(PathBuf::as_path).collect();
        let now = stamp(&refs);
        if now.is_some() && now != current.0 {
            match (self.load)(&self.paths) {
                Ok(v) => {
                    tracing::info!(files = ?self.paths, "TLS files changed; reloaded");
                    *current = (now, Arc::new(v));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "TLS files changed but do not load; keeping the old")
                }
            }
        }
        current.1.clone()
    }
}

fn load_identity(paths: &[PathBuf]) -> Result<CertifiedKey> {
    let (cert, key) = (&paths[0], &paths[1]);
    let certs = load_certs(cert)?;
    let der = PrivateKeyDer::from_pem_slice(&read_file(key, "TLS key")?)
        .map_err(|e| Error::InvalidInput(format!("no private key in {}: {e}", key.display())))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(certs, der, &provider).map_err(|e| {
        Error::InvalidInput(format!(
            "certificate {} and key {} do not make a TLS identity: {e}",
            cert.display(),
            key.display()
        ))
    })
}

/// A serving identity (certificate chain and key, PEM files) that follows its files.
#[derive(Debug)]
pub struct ReloadingIdentity(Reloading<CertifiedKey>);

impl ReloadingIdentity {
    /// Loads `cert` and `key` (an error when they do not make an identity now).
    pub fn new(cert: &Path, key: &Path) -> Result<Self> {
        Reloading::new(vec![cert.into(), key.into()], Box::new(load_identity))
            .map(ReloadingIdentity)
    }
}

impl ResolvesServerCert for ReloadingIdentity {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get())
    }
}

fn load_verifier(paths: &[PathBuf]) -> Result<Arc<dyn ClientCertVerifier>> {
    let ca = &paths[0];
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots.add(cert).map_err(|e| {
            Error::InvalidInput(format!("bad CA certificate in {}: {e}", ca.display()))
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| Error::InvalidInput(format!("client CA {}: {e}", ca.display())))
}

/// Client certificates required and verified against a CA bundle file that follows its file.
/// It sends no CA names in its certificate request (a client with one certificate sends it).
#[derive(Debug)]
pub struct ReloadingClientVerifier(Reloading<Arc<dyn ClientCertVerifier>>);

impl ReloadingClientVerifier {
    /// Loads the CA bundle `ca` (an error when it holds no usable CA now).
    pub fn new(ca: &Path) -> Result<Self> {
        Reloading::new(vec![ca.into()], Box::new(load_verifier)).map(ReloadingClientVerifier)
    }
}

impl ClientCertVerifier for ReloadingClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        self.0
            .get()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.get().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.get().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.get().supported_verify_schemes()
    }
}

/// The upload proxy's client to the upload servers (their CA bundle, the proxy's client
/// certificate), built again when those files change.
#[derive(Debug)]
pub struct ReloadingUpstream(Reloading<reqwest::Client>);

impl ReloadingUpstream {
    /// Builds the client (an error when the files do not make one now).
    pub fn new(ca: Option<&Path>, identity: Option<(&Path, &Path)>) -> Result<Self> {
        let ca = ca.map(Path::to_path_buf);
        let identity = identity.map(|(c, k)| (c.to_path_buf(), k.to_path_buf()));
        let mut paths: Vec<PathBuf> = ca.iter().cloned().collect();
        if let Some((c, k)) = &identity {
            paths.extend([c.clone(), k.clone()]);
        }
        let load = move |_: &[PathBuf]| {
            crate::proxy::upstream_client(
                ca.as_deref(),
                identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
            )
        };
        Reloading::new(paths, Box::new(load)).map(ReloadingUpstream)
    }

    /// The current client (cheap: a reference-counted handle).
    pub fn get(&self) -> reqwest::Client {
        (*self.0.get()).clone()
    }
}

#[cfg(test)]
mod tests;
