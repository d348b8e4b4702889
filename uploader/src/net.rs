//! Serving an axum router: plain TCP or TLS (optionally requiring client certificates signed by
//! a given CA; the TLS setup is [`netkit::tls`]'s), HTTP/1.1 and h2 on the same port (ALPN under TLS, prior knowledge in clear),
//! with a graceful stop that lets answers in flight finish.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use futures_util::Stream;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::error::{Error, Result};
use crate::limits::{Conn, Limits, Linger, Registry, Tracked};

pub use netkit::tls::{TlsFiles, load_certs};

/// How long answers in flight may take after a stop was asked for.
const DRAIN: Duration = Duration::from_secs(30);

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

/// The rustls configuration of a TLS listener of `files` (ring provider, ALPN h2 + http/1.1);
/// the certificate and client CA follow their files ([`netkit::tls`]).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>> {
    Ok(netkit::tls::server_config(
        files,
        netkit::tls::Alpn::H2AndHttp1,
    )?)
}

/// Binds `addr`, with a clear error.
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("listening on {addr}"), e))
}

/// Serves `router` on `listener` until `stop` resolves, then lets answers in flight finish.
/// Connections are bounded by `limits` (see [`crate::limits`]).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) -> Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let registry = Registry::new(limits);
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    tokio::pin!(stop);
    loop {
        let slot = tokio::select! {
            slot = registry.slot() => slot,
            () = &mut stop => break,
        };
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
        let handle = registry.register();
        let tcp = Linger::new(tcp, slot, handle.conn().clone());
        let service = tracked(router.clone(), handle.conn().clone());
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let conn = handle.conn().clone();
            let served = async {
                match acceptor {
                    Some(acceptor) => match acceptor.accept(tcp).await {
                        Ok(stream) => {
                            let conn = builder.serve_connection(TokioIo::new(stream), service);
                            watcher.watch(conn.into_owned()).await
                        }
                        Err(e) => {
                            tracing::info!(%peer, error = %e, "TLS handshake failed");
                            Ok(())
                        }
                    },
                    None => {
                        let conn = builder.serve_connection(TokioIo::new(tcp), service);
                        watcher.watch(conn.into_owned()).await
                    }
                }
            };
            tokio::select! {
                served = served => if let Err(e) = served {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                },
                closing = conn.closing() => {
                    tracing::debug!(%peer, ?closing, "closing a connection with no request in flight");
                }
            }
            drop(handle);
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

/// `router` as a connection's service: each request counts as in flight until its answer's
/// body is sent or dropped.
fn tracked(
    router: Router,
    conn: Arc<Conn>,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future: Send + 'static,
> + Send
+ 'static {
    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        use tower::ServiceExt as _;
        let busy = conn.busy();
        let call = router.clone().oneshot(req);
        async move {
            let resp = call.await?;
            Ok(resp.map(|body| axum::body::Body::new(Tracked { body, _busy: busy })))
        }
    })
}

/// A plain-text answer: CDI's servers answer errors with a message body that says what went wrong.
pub fn text(
    status: axum::http::StatusCode,
    message: impl Into<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    (status, message.into()).into_response()
}

/// How long the rest of a refused body is read (and dropped) so the client sees the answer.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Reads and drops what is left of a refused request's body in the background (for a while).
/// A client still sending would otherwise meet a reset connection, and the reset can make its
/// kernel discard the answer before the client reads it.
pub fn drain<S, E>(mut body: S)
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin + 'static,
{
    use futures_util::StreamExt;
    tokio::spawn(async move {
        let _ = tokio::time::timeout(DRAIN_LIMIT, async {
            while let Some(Ok(_)) = body.next().await {}
        })
        .await;
    });
}

/// A body stream lent to a consumer that may drop it unread (an HTTP client whose connection
/// failed), and taken back afterwards with [`Reclaim::take_back`] to be drained.
pub struct Reclaim<S>(Arc<std::sync::Mutex<Option<S>>>);

impl<S> Reclaim<S> {
    /// The stream to lend, and the handle that takes it back.
    pub fn new(inner: S) -> (Self, Self) {
        let slot = Arc::new(std::sync::Mutex::new(Some(inner)));
        (Reclaim(slot.clone()), Reclaim(slot))
    }

    /// The stream, unless the other handle already took it.
    pub fn take_back(&self) -> Option<S> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl<S: Stream + Unpin> Stream for Reclaim<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.0.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(inner) => Pin::new(inner).poll_next(cx),
            None => Poll::Ready(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn frames(n: usize, size: usize) -> Vec<Result<Bytes, String>> {
        (0..n)
            .map(|i| Ok(Bytes::from(vec![i as u8; size])))
            .collect()
    }

    #[tokio::test]
    async fn a_lent_stream_dropped_unread_is_taken_back_whole() {
        let (lent, back) = Reclaim::new(futures_util::stream::iter(frames(3, 8)));
        let mut lent = lent;
        assert_eq!(
            lent.next().await.unwrap().unwrap(),
            Bytes::from(vec![0u8; 8])
        );
        drop(lent);
        let rest: Vec<_> = back.take_back().expect("still there").collect().await;
        assert_eq!(rest.len(), 2);
        assert!(back.take_back().is_none(), "taken once");
    }
}
