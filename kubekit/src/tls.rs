//! TLS serving for the operators' HTTPS endpoints (the HyperConverged webhook, the upload token
//! API): the listener and the rustls setup are [`netkit::tls`]'s; this names the operators'
//! errors for a serving identity that does not load.

use std::path::Path;
use std::sync::Arc;

use rustls::server::ResolvesServerCert;

use crate::error::{Error, Result};

/// The serving identity of PEM files, read again when kubelet swaps them (a rotated Secret).
pub fn identity(cert: &Path, key: &Path) -> Result<Arc<dyn ResolvesServerCert>> {
    let identity = netkit::tls::ReloadingIdentity::new(cert, key).map_err(|e| {
        Error::Config(format!(
            "TLS {}: {}",
            cert.display(),
            netkit::error::chain(&e)
        ))
    })?;
    Ok(Arc::new(identity))
}
