//! A server built by `net::server_config` serves the new certificate, and trusts the new client
//! CA, at the first handshake after the files are swapped the way kubelet swaps a mounted
//! Secret's (a new timestamped directory, then the `..data` symlink renamed over).

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use testkit::tls::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::net::{TlsFiles, load_certs};

/// Swaps `files` (name, source) in as version `version` of the mounted files in `dir`, as
/// kubelet does: a new directory, then the `..data` symlink renamed over.
fn swap_in(dir: &Path, version: &str, files: &[(&str, &Path)]) {
    let v = dir.join(format!("..{version}"));
    std::fs::create_dir(&v).unwrap();
    for (name, source) in files {
        std::fs::copy(source, v.join(name)).unwrap();
    }
    symlink(format!("..{version}"), dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for (name, _) in files {
        if !dir.join(name).exists() {
            symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
    }
}

/// Publishes `ca`'s server certificate, key and CA (the server's files).
fn publish(dir: &Path, version: &str, ca: &TestCa) {
    let (cert, key, ca_pem) = (ca.cert_pem(), ca.key_pem(), ca.ca_pem());
    swap_in(
        dir,
        version,
        &[("tls.crt", &cert), ("tls.key", &key), ("ca.crt", &ca_pem)],
    );
}

/// Publishes a client certificate of `ca` and `ca` itself (the proxy's files).
fn publish_client(dir: &Path, version: &str, ca: &TestCa) {
    let (cert, key) = ca.client_cert("proxy");
    let ca_pem = ca.ca_pem();
    swap_in(
        dir,
        version,
        &[("tls.crt", &cert), ("tls.key", &key), ("ca.crt", &ca_pem)],
    );
}

/// A mutual-TLS server on 127.0.0.1 of the files in `dir`; its port.
async fn serve(dir: &Path) -> u16 {
    let files = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        client_ca: Some(dir.join("ca.crt")),
    };
    let tls = crate::net::server_config(&files).unwrap();
    let listener = crate::net::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "OK" }));
    tokio::spawn(crate::net::serve(
        listener,
        Some(tls),
        router,
        Default::default(),
        std::future::pending(),
    ));
    port
}

/// One HTTPS request as a client of `client_of` (trusting both CAs): the server's certificate,
/// and whether the request was answered.
async fn handshake(port: u16, trust: &[&TestCa], client_of: &TestCa) -> (Vec<u8>, bool) {
    let mut roots = rustls::RootCertStore::empty();
    for ca in trust {
        roots
            .add(load_certs(&ca.ca_pem()).unwrap().remove(0))
            .unwrap();
    }
    let (cert, key) = client_of.client_cert("proxy");
    let key = rustls::pki_types::pem::PemObject::from_pem_file(&key).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(load_certs(&cert).unwrap(), key)
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let answered = async {
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out).await.ok()?;
        out.starts_with(b"HTTP/1.1 200").then_some(())
    };
    (served, answered.await.is_some())
}

#[tokio::test]
async fn a_new_handshake_sees_the_swapped_certificate_and_client_ca() {
    let (old, new) = (TestCa::new(), TestCa::new());
    let dir = tempfile::tempdir().unwrap();
    publish(dir.path(), "2026_01", &old);
    let port = serve(dir.path()).await;
    let der = |ca: &TestCa| load_certs(&ca.cert_pem()).unwrap().remove(0).to_vec();

    let (served, answered) = handshake(port, &[&old, &new], &old).await;
    assert_eq!(served, der(&old));
    assert!(answered);

    publish(dir.path(), "2026_02", &new);
    let (served, answered) = handshake(port, &[&old, &new], &new).await;
    assert_eq!(served, der(&new), "the new certificate is served");
    assert!(answered, "a client of the new CA is accepted");
    let (_, answered) = handshake(port, &[&old, &new], &old).await;
    assert!(!answered, "a client of the old CA is refused");
}

#[tokio::test]
async fn the_proxy_client_follows_its_swapped_ca_bundle_and_client_certificate() {
    let (old, new) = (TestCa::new(), TestCa::new());
    let (server_dir, proxy_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    publish(server_dir.path(), "2026_01", &old);
    publish_client(proxy_dir.path(), "2026_01", &old);
    let port = serve(server_dir.path()).await;
    let p = proxy_dir.path();
    let upstream = super::ReloadingUpstream::new(
        Some(&p.join("ca.crt")),
        Some((&p.join("tls.crt"), &p.join("tls.key"))),
    )
    .unwrap();
    let get = |client: reqwest::Client, port: u16| async move {
        client
            .get(format!("https://localhost:{port}/healthz"))
            // A new connection (and handshake) each time.
            .header("connection", "close")
            .send()
            .await
            .map(|r| r.status().as_u16())
    };
    assert_eq!(get(upstream.get(), port).await.unwrap(), 200);
    let before = upstream.get();

    // Server and proxy both rotated to the new CA. A new upload server (which cannot resume
    // the old TLS sessions): the old client fails, the proxy's current one is built from the
    // new files and succeeds.
    publish(server_dir.path(), "2026_02", &new);
    publish_client(p, "2026_02", &new);
    let port = serve(server_dir.path()).await;
    assert!(
        get(before, port).await.is_err(),
        "the client of the old files is refused"
    );
    assert_eq!(get(upstream.get(), port).await.unwrap(), 200);
}
