//! TLS material that follows its files as kubelet rotates a mounted Secret: servers'
//! identities and client CAs come from [`netkit::tls`] (re-exported here); the upload proxy's
//! client to upload servers ([`ReloadingUpstream`]) is built again the same way.

use std::path::{Path, PathBuf};

use netkit::tls::Reloading;
pub use netkit::tls::{ReloadingClientVerifier, ReloadingIdentity};

use crate::error::Result;

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
