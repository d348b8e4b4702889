//! TLS serving for the operators' HTTPS endpoints (the HyperConverged webhook, the upload token
//! API): the serving identity from PEM files (followed when they change), and an axum listener that completes the handshake
//! (bounded in time) before a connection is served.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::ResolvesServerCert;

use crate::error::{Error, Result};

/// A TLS listener for axum: TCP accept, then the TLS handshake (at most 10 s).
pub(crate) struct TlsListener {
    pub tcp: tokio::net::TcpListener,
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// What is served, for the logs.
    pub what: &'static str,
}

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
            let handshake =
                tokio::time::timeout(Duration::from_secs(10), self.acceptor.accept(stream));
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

/// The serving identity of PEM files, read again when kubelet swaps them (a rotated Secret).
pub(crate) fn identity(cert: &Path, key: &Path) -> Result<Arc<dyn ResolvesServerCert>> {
    let identity = uploader::reload::ReloadingIdentity::new(cert, key).map_err(|e| {
        Error::Config(format!(
            "TLS {}: {}",
            cert.display(),
            importer::error::chain(&e)
        ))
    })?;
    Ok(Arc::new(identity))
}

/// The crypto provider of every operators TLS endpoint (ring, the project's one provider).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
