//! Serving an axum router: plain TCP or TLS (optionally requiring client certificates signed by
//! a given CA), HTTP/1.1 and h2 on the same port (ALPN under TLS, prior knowledge in clear),
//! with a graceful stop that lets answers in flight finish.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use crate::error::{Error, Result, read_file};

/// How long answers in flight may take after a stop was asked for.
const DRAIN: Duration = Duration::from_secs(30);

/// Certificate files of a TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// `--tls-cert` and `--tls-key` must come together; `--client-ca` needs them.
pub fn tls_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<TlsFiles>> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert,
            key,
            client_ca,
        })),
        (None, None) if client_ca.is_none() => Ok(None),
        (None, None) => Err(Error::InvalidInput(
            "--client-ca needs --tls-cert and --tls-key".into(),
        )),
        _ => Err(Error::InvalidInput(
            "--tls-cert and --tls-key must be given together".into(),
        )),
    }
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

/// The rustls configuration of a TLS listener (ring provider, ALPN h2 + http/1.1).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>> {
    importer::source::http::install_tls_provider();
    let certs = load_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&read_file(&files.key, "TLS key")?).map_err(|e| {
        Error::InvalidInput(format!("no private key in {}: {e}", files.key.display()))
    })?;
    let builder = rustls::ServerConfig::builder();
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in load_certs(ca)? {
                roots.add(cert).map_err(|e| {
                    Error::InvalidInput(format!("bad CA certificate in {}: {e}", ca.display()))
                })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| Error::InvalidInput(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        Error::InvalidInput(format!(
            "certificate {} and key {} do not make a TLS identity: {e}",
            files.cert.display(),
            files.key.display()
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Binds `addr`, with a clear error.
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("listening on {addr}"), e))
}

/// Serves `router` on `listener` until `stop` resolves, then lets answers in flight finish.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    stop: impl Future<Output = ()>,
) -> Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            let served = match acceptor {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => {
                        let conn = builder.serve_connection(TokioIo::new(stream), service);
                        watcher.watch(conn.into_owned()).await
                    }
                    Err(e) => {
                        tracing::info!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                },
                None => {
                    let conn = builder.serve_connection(TokioIo::new(tcp), service);
                    watcher.watch(conn.into_owned()).await
                }
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN:?}; stopping anyway");
    }
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}
