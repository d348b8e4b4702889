//! TLS for Quarry's servers and clients: the one crypto provider (ring), PEM certificates,
//! serving identities and client CA bundles that follow their files, the rustls server
//! configuration built from them, and `TlsListener` (feature `serve`), an axum listener that completes the
//! handshake (bounded in time) before a connection is served.
//!
//! # Files that rotate
//!
//! Kubelet replaces the files of a mounted Secret when the cert controller rotates it, and a
//! server must serve the new certificate (and trust the new client CA bundle) without a restart.
//! Each handshake compares the files' metadata (device, inode, size, modification time; through
//! the symlinks kubelet swaps) with what was loaded, and reads them again when they differ. A
//! file caught half-written keeps the old material in use, and is read again at the next
//! handshake.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};
#[cfg(feature = "serve")]
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::error::{Error, Result, read_file};

/// Installs rustls' ring crypto provider as the process default, once. Safe to call often; an
/// already installed provider is kept.
pub fn install_tls_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The crypto provider of every Quarry TLS endpoint (ring, the project's one provider).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_file(path, "certificates")?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::InvalidInput(format!("bad PEM in {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::InvalidInput(format!(
            "no PEM certificate in {}",
            path.display()
        )));
    }
    Ok(certs)
}

/// Certificate files of a TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// The protocols a TLS listener offers through ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// None: the client speaks HTTP/1.1.
    None,
    /// `h2` and `http/1.1`, for a server that speaks both.
    H2AndHttp1,
}

impl Alpn {
    fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::None => Vec::new(),
            Alpn::H2AndHttp1 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// A rustls server configuration: the serving identity `identity`, client certificates checked
/// by `clients` (None: not asked for), the protocols of `alpn`.
pub fn server_config_with(
    identity: Arc<dyn ResolvesServerCert>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
    alpn: Alpn,
) -> Result<rustls::ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::InvalidInput(format!("TLS protocol versions: {e}")))?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(identity);
    config.alpn_protocols = alpn.protocols();
    Ok(config)
}

/// The rustls configuration of a listener of `files`: the certificate and client CA follow
/// their files.
pub fn server_config(files: &TlsFiles, alpn: Alpn) -> Result<Arc<rustls::ServerConfig>> {
    install_tls_provider();
    let identity = Arc::new(ReloadingIdentity::new(&files.cert, &files.key)?);
    let clients = match &files.client_ca {
        Some(ca) => {
            Some(Arc::new(ReloadingClientVerifier::new(ca)?) as Arc<dyn ClientCertVerifier>)
        }
        None => None,
    };
    server_config_with(identity, clients, alpn).map(Arc::new)
}

/// A TLS listener for axum: TCP accept, then the TLS handshake (at most 10 s).
#[cfg(feature = "serve")]
pub struct TlsListener {
    pub tcp: tokio::net::TcpListener,
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// What is served, for the logs.
    pub what: &'static str,
}

/// How long a client may take over its handshake before [`TlsListener`] drops it.
#[cfg(feature = "serve")]
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

#[cfg(feature = "serve")]
impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.tcp.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "{} accept failed", self.what);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let handshake = tokio::time::timeout(HANDSHAKE_LIMIT, self.acceptor.accept(stream));
            match handshake.await {
                Ok(Ok(tls)) => return (tls, addr),
                Ok(Err(e)) => {
                    tracing::debug!(%addr, error = %e, "{} TLS handshake failed", self.what)
                }
                Err(_) => tracing::debug!(%addr, "{} TLS handshake timed out", self.what),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// What identifies one version of a set of files.
type Stamp = Vec<(u64, u64, u64, i64, i64)>;

fn stamp(paths: &[PathBuf]) -> Option<Stamp> {
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
pub type Load<T, E> = Box<dyn Fn(&[PathBuf]) -> std::result::Result<T, E> + Send + Sync>;

/// A value loaded from files, loaded again when they change (see the module docs).
pub struct Reloading<T, E = Error> {
    paths: Vec<PathBuf>,
    load: Load<T, E>,
    current: Mutex<(Option<Stamp>, Arc<T>)>,
}

impl<T, E> std::fmt::Debug for Reloading<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("paths", &self.paths)
            .finish()
    }
}

impl<T, E: std::fmt::Display> Reloading<T, E> {
    /// Loads the value from `paths` now (an error when they do not make one).
    pub fn new(paths: Vec<PathBuf>, load: Load<T, E>) -> std::result::Result<Self, E> {
        let before = stamp(&paths);
        let value = load(&paths)?;
        Ok(Reloading {
            paths,
            load,
            current: Mutex::new((before, Arc::new(value))),
        })
    }

    /// The value of the files as they are now (the old one when they changed but do not load).
    pub fn get(&self) -> Arc<T> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let now = stamp(&self.paths);
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
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_do_not_make_an_identity_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a pem").unwrap();
        let err = ReloadingIdentity::new(&junk, &junk).unwrap_err();
        assert!(err.to_string().contains("junk.pem"), "{err}");
        let files = TlsFiles {
            cert: junk.clone(),
            key: junk.clone(),
            client_ca: None,
        };
        assert!(server_config(&files, Alpn::None).is_err());
    }

    #[test]
    fn a_changed_file_is_loaded_again_and_a_broken_one_keeps_the_old_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("value");
        std::fs::write(&path, "one").unwrap();
        let load: Load<String, Error> = Box::new(|paths| {
            let text = std::fs::read_to_string(&paths[0]).map_err(|e| Error::io("reading", e))?;
            if text.is_empty() {
                return Err(Error::InvalidInput("empty".into()));
            }
            Ok(text)
        });
        let value = Reloading::new(vec![path.clone()], load).unwrap();
        assert_eq!(*value.get(), "one");
        std::fs::write(&path, "two, longer").unwrap();
        assert_eq!(*value.get(), "two, longer");
        std::fs::write(&path, "").unwrap();
        assert_eq!(*value.get(), "two, longer");
    }

    #[test]
    fn a_server_config_of_a_test_ca_offers_the_asked_protocols() {
        let ca = testkit::tls::TestCa::new();
        let files = TlsFiles {
            cert: ca.cert_pem(),
            key: ca.key_pem(),
            client_ca: Some(ca.ca_pem()),
        };
        let config = server_config(&files, Alpn::H2AndHttp1).unwrap();
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let plain = server_config(&files, Alpn::None).unwrap();
        assert!(plain.alpn_protocols.is_empty());
    }
}
