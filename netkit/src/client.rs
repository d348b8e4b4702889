//! The HTTP client factory: one configuration (trusted CAs, insecure mode, redirects that drop
//! credentials across hosts, timeouts, user agent) for every HTTP client Quarry makes: the
//! importer's sources, the upload client and the upload proxy's client to upload servers.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Client;

use crate::error::{Error, Result, chain};
use crate::tls::install_tls_provider;

/// How a client connects, and how hard a transfer tries (the importer's HTTP source reads the
/// retry fields; the client factory reads the connection ones). `Debug` redacts the password
/// and the header values.
#[derive(Clone)]
pub struct HttpOptions {
    /// Extra trusted CA certificates (PEM files, each may hold several). They are trusted in
    /// addition to the platform's roots.
    pub ca_certs: Vec<PathBuf>,
    /// Extra trusted CA certificates given in memory (a ConfigMap's keys read from the API).
    pub ca_bundles: Vec<CaBundle>,
    /// Skip TLS certificate verification entirely.
    pub insecure: bool,
    /// Extra request headers (CDI `extraHeaders` / `secretExtraHeaders`).
    pub headers: Vec<(String, String)>,
    /// HTTP basic authentication `(user, password)`.
    pub basic_auth: Option<(String, String)>,
    /// Time allowed for the TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// No response headers (counted from the request, connecting included), or no body byte, for
    /// this long fails the attempt.
    pub idle_timeout: Duration,
    /// A body slower than this many bytes per second over a whole `idle_timeout` fails the
    /// attempt (a server trickling a byte now and then never goes idle); 0 turns it off.
    pub min_rate: u64,
    /// Retries of one transfer in a row without progress.
    pub max_retries: u32,
    /// First back-off between attempts; doubles on each retry, capped at 30 s.
    pub retry_backoff: Duration,
    /// Chunks buffered between the network task and the reader.
    pub chunk_depth: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            ca_certs: Vec::new(),
            ca_bundles: Vec::new(),
            insecure: false,
            headers: Vec::new(),
            basic_auth: None,
            connect_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            min_rate: 1024,
            max_retries: 5,
            retry_backoff: Duration::from_secs(1),
            chunk_depth: 2,
        }
    }
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(k, _)| format!("{k}: <redacted>"))
            .collect();
        f.debug_struct("HttpOptions")
            .field("ca_certs", &self.ca_certs)
            .field(
                "ca_bundles",
                &self.ca_bundles.iter().map(|b| &b.name).collect::<Vec<_>>(),
            )
            .field("insecure", &self.insecure)
            .field("headers", &headers)
            .field(
                "basic_auth",
                &self.basic_auth.as_ref().map(|(u, _)| (u, "<redacted>")),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("min_rate", &self.min_rate)
            .field("max_retries", &self.max_retries)
            .field("retry_backoff", &self.retry_backoff)
            .field("chunk_depth", &self.chunk_depth)
            .finish()
    }
}

/// PEM CA certificates held in memory, named for errors (`ConfigMap ns/name key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaBundle {
    pub name: String,
    pub pem: Vec<u8>,
}

/// Redirects followed at most.
pub const MAX_REDIRECTS: usize = 10;

/// The HTTP client every source uses: TLS roots plus `opts.ca_certs`, `insecure`, redirects
/// (credentials dropped across hosts), timeouts.
pub fn build_client(opts: &HttpOptions) -> Result<Client> {
    client_builder(opts)?
        .build()
        .map_err(|e| Error::InvalidInput(format!("configuring the HTTP client: {}", chain(&e))))
}

/// [`build_client`]'s configuration, for callers that add to it (a client certificate, say).
pub fn client_builder(opts: &HttpOptions) -> Result<reqwest::ClientBuilder> {
    install_tls_provider();
    let mut b = Client::builder()
        .connect_timeout(opts.connect_timeout)
        .redirect(reqwest::redirect::Policy::limited(MAX_REDIRECTS))
        .referer(false)
        .tcp_keepalive(Duration::from_secs(30))
        .user_agent(concat!("quarry-importer/", env!("CARGO_PKG_VERSION")));
    if opts.insecure {
        b = b.tls_danger_accept_invalid_certs(true);
    }
    let mut certs = Vec::new();
    let mut add = |name: &str, pem: &[u8]| {
        let found = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| Error::InvalidInput(format!("bad CA certificate file {name}: {e}")))?;
        if found.is_empty() {
            return Err(Error::InvalidInput(format!("no PEM certificate in {name}")));
        }
        certs.extend(found);
        Ok(())
    };
    for path in &opts.ca_certs {
        let pem = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading CA certificates {}", path.display()), e))?;
        add(&path.display().to_string(), &pem)?;
    }
    for bundle in &opts.ca_bundles {
        add(&bundle.name, &bundle.pem)?;
    }
    if !certs.is_empty() {
        b = b.tls_certs_merge(certs);
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_secrets() {
        let o = HttpOptions {
            basic_auth: Some(("alice".into(), "s3cret".into())),
            headers: vec![("Authorization".into(), "Bearer tok".into())],
            ..HttpOptions::default()
        };
        let d = format!("{o:?}");
        assert!(d.contains("alice") && d.contains("Authorization"), "{d}");
        assert!(!d.contains("s3cret") && !d.contains("tok"), "{d}");
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let opts = HttpOptions {
            ca_certs: vec![junk],
            ..HttpOptions::default()
        };
        let err = client_builder(&opts).unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
        assert!(err.to_string().contains("junk.pem"), "{err}");
    }

    #[test]
    fn ca_bundles_in_memory_are_trusted_and_a_bad_one_is_refused_by_name() {
        let ca = testkit::tls::TestCa::new();
        let good = CaBundle {
            name: "ConfigMap vms/ca key ca.crt".into(),
            pem: std::fs::read(ca.ca_pem()).unwrap(),
        };
        let opts = HttpOptions {
            ca_bundles: vec![good.clone()],
            ..HttpOptions::default()
        };
        assert!(client_builder(&opts).is_ok());
        let bad = CaBundle {
            name: "ConfigMap vms/ca key junk".into(),
            pem: b"not a certificate".to_vec(),
        };
        let opts = HttpOptions {
            ca_bundles: vec![good, bad],
            ..HttpOptions::default()
        };
        let err = client_builder(&opts).unwrap_err();
        assert!(err.to_string().contains("key junk"), "{err}");
    }
}
