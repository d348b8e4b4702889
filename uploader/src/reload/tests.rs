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

/// Publishes `ca`'s server certificate, key and CA as version `version` of the mounted files.
fn publish(dir: &Path, version: &str, ca: &TestCa) {
    let v = dir.join(format!("..{version}"));
    std::fs::create_dir(&v).unwrap();
    std::fs::copy(ca.cert_pem(), v.join("tls.crt")).unwrap();
    std::fs::copy(ca.key_pem(), v.join("tls.key")).unwrap();
    std::fs::copy(ca.ca_pem(), v.join("ca.crt")).unwrap();
    symlink(format!("..{version}"), dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        if !dir.join(f).exists() {
            symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
    }
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
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        client_ca: Some(dir.path().join("ca.crt")),
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
