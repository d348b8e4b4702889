//! The driver state, the command-line arguments and the gRPC server on a unix or TCP socket.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use provisioner::Provisioner;
use tonic::transport::Server;

use crate::pb::{
    controller_server::ControllerServer, group_controller_server::GroupControllerServer,
    identity_server::IdentityServer, node_server::NodeServer,
};
use crate::{DRIVER_NAME, Error};

/// `quarry csi`: serve the CSI Identity, Controller and Node services on one socket.
#[derive(clap::Args, Debug, Clone)]
pub struct CsiArgs {
    /// Where to listen: `unix:///path/csi.sock` or `tcp://127.0.0.1:PORT`.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,
    /// This node's id (the Kubernetes node name); also the topology value.
    #[arg(long, env = "NODE_NAME")]
    pub node_id: String,
    /// Storage pools: a JSON list of `{"name","path"[,"quota":"auto|project|btrfs|none"]}`, or `@file`.
    #[arg(long, env = "STORAGE_POOLS")]
    pub pools: String,
    /// CSI driver name.
    #[arg(long, env = "DRIVER_NAME", default_value = DRIVER_NAME)]
    pub driver_name: String,
    /// Maximum number of volumes on this node reported by NodeGetInfo (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub max_volumes_per_node: i64,
}

/// Driver settings.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// CSI driver name.
    pub driver_name: String,
    /// Node id.
    pub node_id: String,
    /// NodeGetInfo's max_volumes_per_node (0 = unset).
    pub max_volumes_per_node: i64,
}

/// The CSI driver: implements all three services over one provisioner.
#[derive(Debug, Clone)]
pub struct Driver {
    pub(crate) config: Arc<DriverConfig>,
    pub(crate) prov: Arc<Provisioner>,
}

impl Driver {
    /// A driver over an opened provisioner.
    pub fn new(config: DriverConfig, prov: Arc<Provisioner>) -> Driver {
        Driver {
            config: Arc::new(config),
            prov,
        }
    }
}

/// A parsed endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix socket path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(String),
}

impl std::str::FromStr for Endpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Endpoint, Error> {
        if let Some(p) = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
        {
            if p.is_empty() {
                return Err(Error::Config(format!("endpoint {s:?} has no path")));
            }
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tcp://") {
            return Ok(Endpoint::Tcp(a.to_string()));
        }
        if s.starts_with('/') {
            return Ok(Endpoint::Unix(PathBuf::from(s)));
        }
        Err(Error::Config(format!(
            "endpoint {s:?} must be unix:///path or tcp://host:port"
        )))
    }
}

/// How long in-flight requests and connected clients may hold up shutdown. Clients normally
/// close their idle connections on GOAWAY at once; a hung one would otherwise keep the driver
/// alive until the kubelet's SIGKILL.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `serve` (a tonic server given `shutdown`) until it stops, or until [`SHUTDOWN_GRACE`]
/// after `shutdown` completed.
async fn bounded<S, F>(
    shutdown: S,
    serve: impl FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> F,
) -> Result<(), Error>
where
    S: Future<Output = ()> + Send + 'static,
    F: Future<Output = Result<(), tonic::transport::Error>>,
{
    let (fired, on_fire) = tokio::sync::oneshot::channel::<()>();
    let served = serve(Box::pin(async move {
        shutdown.await;
        let _ = fired.send(());
    }));
    let deadline = async move {
        match on_fire.await {
            Ok(()) => tokio::time::sleep(SHUTDOWN_GRACE).await,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        r = served => Ok(r?),
        () = deadline => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "clients still connected after the shutdown grace: stopping anyway");
            Ok(())
        }
    }
}

/// Serves the four services on `endpoint` until `shutdown` completes (and then at most
/// [`SHUTDOWN_GRACE`] longer while requests finish).
pub async fn serve(
    driver: Driver,
    endpoint: &Endpoint,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let router = Server::builder()
        .add_service(IdentityServer::new(driver.clone()))
        .add_service(ControllerServer::new(driver.clone()))
        .add_service(GroupControllerServer::new(driver.clone()))
        .add_service(NodeServer::new(driver));
    match endpoint {
        Endpoint::Unix(path) => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::Io {
                    context: format!("create {}", parent.display()),
                    source: e,
                })?;
            }
            match std::fs::remove_file(path) {
                Ok(()) => tracing::info!(socket = %path.display(), "removed stale socket"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::Io {
                        context: format!("remove stale socket {}", path.display()),
                        source: e,
                    });
                }
            }
            let listener = tokio::net::UnixListener::bind(path).map_err(|e| Error::Io {
                context: format!("listen on {}", path.display()),
                source: e,
            })?;
            tracing::info!(endpoint = %path.display(), "CSI server listening");
            // any :authority a local client sends is accepted (see authority.rs)
            let incoming = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                |conn| conn.map(crate::authority::filter),
            );
            let res = bounded(shutdown, |s| {
                router.serve_with_incoming_shutdown(incoming, s)
            })
            .await;
            let _ = std::fs::remove_file(path);
            res?;
        }
        Endpoint::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| Error::Io {
                    context: format!("listen on {addr}"),
                    source: e,
                })?;
            tracing::info!(endpoint = %addr, "CSI server listening");
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            bounded(shutdown, |s| {
                router.serve_with_incoming_shutdown(incoming, s)
            })
            .await?;
        }
    }
    tracing::info!("CSI server stopped");
    Ok(())
}

pub(crate) async fn termination() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

/// `quarry csi`: opens the pools and serves until SIGTERM or SIGINT.
pub async fn run(args: CsiArgs) -> Result<(), Error> {
    if args.node_id.is_empty() {
        return Err(Error::Config("--node-id is required".into()));
    }
    let endpoint: Endpoint = args.endpoint.parse()?;
    let pools = provisioner::parse_pools(&args.pools)?;
    let prov = tokio::task::spawn_blocking(move || Provisioner::open(&pools))
        .await
        .map_err(|e| Error::Config(format!("opening pools panicked: {e}")))??;
    let driver = Driver::new(
        DriverConfig {
            driver_name: args.driver_name,
            node_id: args.node_id,
            max_volumes_per_node: args.max_volumes_per_node,
        },
        Arc::new(prov),
    );
    serve(driver, &endpoint, termination()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            "unix:///csi/csi.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/csi/csi.sock".into())
        );
        assert_eq!(
            "unix:/a.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/a.sock".into())
        );
        assert_eq!(
            "tcp://127.0.0.1:10000".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("127.0.0.1:10000".into())
        );
        assert!("http://x".parse::<Endpoint>().is_err());
        assert!("unix://".parse::<Endpoint>().is_err());
    }
}
