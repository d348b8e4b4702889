//! CSI gRPC services (Identity, Controller, Node) over the provisioner.

/// Generated CSI v1 protocol types, servers and clients.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("csi.v1");
}
