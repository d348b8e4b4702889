//! A Prometheus `/metrics` endpoint: bind, route, serve, either on the caller's tokio runtime
//! ([`serve`], the controllers) or on a thread of its own ([`serve_on_thread`], the importer,
//! which has no runtime of its own). What the metrics say is the caller's: it passes a function
//! that renders the text.

use std::net::SocketAddr;

use crate::error::{Error, Result};

/// The content type of the OpenMetrics text format (what CDI's importer answers).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A router answering `GET /metrics` with `render()`, as `content_type` (None: axum's
/// `text/plain; charset=utf-8`).
pub fn router<F>(content_type: Option<&'static str>, render: F) -> axum::Router
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    use axum::response::IntoResponse;
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = render();
            async move {
                match content_type {
                    Some(ct) => ([(axum::http::header::CONTENT_TYPE, ct)], body).into_response(),
                    None => body.into_response(),
                }
            }
        }),
    )
}

/// Binds a TCP listener for `what`; returns it with the bound address (port 0 resolved).
pub async fn bind(addr: SocketAddr, what: &str) -> Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("binding the {what} address {addr}"), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::io(format!("reading the {what} address"), e))?;
    Ok((listener, bound))
}

/// Serves `app` on `addr` in a task of the current runtime until it stops; returns the bound
/// address.
pub async fn serve(addr: SocketAddr, app: axum::Router) -> Result<SocketAddr> {
    let (listener, bound) = bind(addr, "metrics").await?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(bound)
}

/// Serves `app` on `addr` from a background thread (with a runtime of its own) for the life of
/// the process; returns the bound address. It binds before returning, so a port in use fails
/// here.
pub fn serve_on_thread(addr: SocketAddr, app: axum::Router) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| Error::InvalidInput(format!("cannot listen on {addr} for metrics: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("metrics listener", e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::io("metrics listener", e))?;
    crate::thread_with_runtime("quarry-metrics", move |runtime| {
        let runtime = match runtime {
            Ok(rt) => rt,
            Err(e) => return tracing::error!(error = %e, "no runtime for the metrics server"),
        };
        runtime.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    if let Err(e) = axum::serve(listener, app).await {
                        tracing::error!(error = %e, "metrics server stopped");
                    }
                }
                Err(e) => tracing::error!(error = %e, "metrics listener"),
            }
        });
    })
    .map_err(|e| Error::io("starting the metrics thread", e))?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn a_thread_serves_the_rendered_text_with_its_content_type() {
        let app = router(Some(OPENMETRICS), || "m_total 1\n".to_string());
        let addr = serve_on_thread("127.0.0.1:0".parse().unwrap(), app).unwrap();
        let answer = get(addr, "/metrics");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains(OPENMETRICS), "{answer}");
        assert!(answer.ends_with("m_total 1\n"), "{answer}");
        assert!(get(addr, "/other").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_port_in_use_fails_at_once() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve_on_thread(addr, router(None, String::new)).unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }

    #[tokio::test]
    async fn the_runtime_server_answers_plain_text() {
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            router(None, || "x 2\n".to_string()),
        )
        .await
        .unwrap();
        let answer = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
            .await
            .unwrap();
        assert!(answer.contains("text/plain"), "{answer}");
        assert!(answer.ends_with("x 2\n"), "{answer}");
    }
}
