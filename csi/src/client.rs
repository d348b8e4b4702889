//! A gRPC channel to a CSI driver listening on a unix socket (how the kubelet and the sidecars
//! reach it), for tests, benchmarks and tools.

use std::path::Path;

use tonic::transport::{Channel, Endpoint};

/// Connects to the driver serving on the unix socket `sock`.
pub async fn connect_unix(sock: &Path) -> Result<Channel, tonic::transport::Error> {
    let sock = sock.to_path_buf();
    // The URI is required by tonic but unused: the connector below dials the socket.
    Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let sock = sock.clone();
            async move {
                let s = tokio::net::UnixStream::connect(sock).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}
