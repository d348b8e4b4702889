//! TLS material that follows its files as kubelet rotates a mounted Secret: servers'
//! identities and client CAs come from [`netkit::tls`] (re-exported here); the upload proxy's
//! client to upload servers ([`ReloadingUpstream`]) is built again the same way.

use std::path::{Path, PathBuf};

use netkit::tls::Reloading;
pub use netkit::tls::{ReloadingClientVerifier, ReloadingIdentity};

use crate::error::{Error, Result, read_file};
use netkit::error::chain;

/// The upload proxy's client to the upload servers (their CA bundle, the proxy's client
/// certificate), built again when those files change.
#[derive(Debug)]
pub struct ReloadingUpstream(Reloading<reqwest::Client, crate::Error>);

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
            upstream_client(
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

/// How long an idle connection to an upload server is kept for reuse.
const UPSTREAM_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// The client the proxy forwards with: the upload servers' CA, the proxy's client certificate.
pub fn upstream_client(
    upstream_ca: Option<&std::path::Path>,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<reqwest::Client> {
    let opts = netkit::HttpOptions {
        ca_certs: upstream_ca
            .map(|p| vec![p.to_path_buf()])
            .unwrap_or_default(),
        ..Default::default()
    };
    let mut b = netkit::client_builder(&opts)?
        .redirect(reqwest::redirect::Policy::none())
        // Under the upload server's default keep-alive timeout, so the proxy drops an idle
        // connection before the server does instead of racing the server's close with a request.
        .pool_idle_timeout(UPSTREAM_IDLE)
        .user_agent(concat!("quarry-upload-proxy/", env!("CARGO_PKG_VERSION")));
    if let Some((cert, key)) = identity {
        let mut pem = read_file(cert, "client certificate")?;
        pem.push(b'\n');
        pem.extend(read_file(key, "client key")?);
        let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
            Error::InvalidInput(format!(
                "client certificate {} with key {}: {}",
                cert.display(),
                key.display(),
                chain(&e)
            ))
        })?;
        b = b.identity(id);
    }
    b.build()
        .map_err(|e| Error::InvalidInput(format!("configuring the proxy's client: {}", chain(&e))))
}

#[cfg(test)]
mod tests;
