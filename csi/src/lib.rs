//! CSI gRPC services (Identity, Controller, Node) over the provisioner (not yet built).
