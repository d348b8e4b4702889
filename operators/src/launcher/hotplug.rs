//! Hot-plug and unplug of disks into a running VM, through the launcher's control socket.
//!
//! As KubeVirt does for hotplug volumes: attaching creates the disk's block nodes with
//! `blockdev-add` and its guest device with `device_add` (undoing the nodes if the device is
//! refused); detaching asks the guest to release the device with `device_del`, waits for QEMU's
//! `DEVICE_DELETED` event (the guest acknowledged the ACPI eject), then removes the nodes. Only
//! hot-plugged disks can be detached.
//!
//! The control socket (`RUN_DIR/control.sock`) speaks one JSON request per line and answers one
//! JSON line: `{"op": "attach", "disk": {"name": .., "path": .., "readonly": .., "bus": ..}}`,
//! `{"op": "detach", "name": ..}` -> `{"ok": true}` or `{"ok": false, "error": ".."}`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Mutex;

use super::disk;
use super::error::{Error, Result};
use super::qmp::Qmp;
use super::spec::{DiskSpec, validate_disk};

/// How long the guest may take to release a device on `device_del`.
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(30);

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ControlRequest {
    Attach { disk: DiskSpec },
    Detach { name: String },
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlResponse {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The listening control socket of one VM.
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    qmp: Arc<Qmp>,
    /// Names of the disks attached through this socket (the only ones that may be detached).
    hotplugged: Arc<Mutex<HashSet<String>>>,
}

impl ControlServer {
    /// Binds the socket at `path` (owner-only permissions come from the 0700 run directory).
    pub fn bind(path: &Path, qmp: Arc<Qmp>) -> Result<Self> {
        let listener = UnixListener::bind(path)
            .map_err(|e| Error::io(format!("cannot listen on {}", path.display()), e))?;
        Ok(ControlServer {
            listener,
            path: path.to_path_buf(),
            qmp,
            hotplugged: Arc::default(),
        })
    }

    /// Serves requests until the task is dropped; each connection gets its own task, requests
    /// are applied one at a time.
    pub async fn serve(self) {
        loop {
            let sock = match self.listener.accept().await {
                Ok((sock, _)) => sock,
                Err(e) => {
                    tracing::warn!(%e, path = %self.path.display(), "control socket accept failed");
                    continue;
                }
            };
            let qmp = self.qmp.clone();
            let hotplugged = self.hotplugged.clone();
            tokio::spawn(async move {
                if let Err(e) = serve_connection(sock, &qmp, &hotplugged).await {
                    tracing::warn!(%e, "control connection failed");
                }
            });
        }
    }
}

async fn serve_connection(
    sock: UnixStream,
    qmp: &Qmp,
    hotplugged: &Mutex<HashSet<String>>,
) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let result = match serde_json::from_str::<ControlRequest>(&line) {
            Ok(req) => {
                // One change at a time: a detach must not race an attach of the same name.
                let mut set = hotplugged.lock().await;
                apply(qmp, &mut set, req).await
            }
            Err(e) => Err(Error::InvalidSpec(format!("bad control request: {e}"))),
        };
        let resp = match result {
            Ok(()) => ControlResponse {
                ok: true,
                error: None,
            },
            Err(e) => ControlResponse {
                ok: false,
                error: Some(e.to_string()),
            },
        };
        let mut out = serde_json::to_string(&resp).expect("response serializes");
        out.push('\n');
        w.write_all(out.as_bytes()).await?;
    }
    Ok(())
}

async fn apply(qmp: &Qmp, hotplugged: &mut HashSet<String>, req: ControlRequest) -> Result<()> {
    match req {
        ControlRequest::Attach { disk } => {
            attach(qmp, &disk).await?;
            hotplugged.insert(disk.name);
            Ok(())
        }
        ControlRequest::Detach { name } => {
            if !hotplugged.contains(&name) {
                return Err(Error::InvalidSpec(format!(
                    "disk {name:?} was not hot-plugged; only hot-plugged disks can be detached"
                )));
            }
            detach(qmp, &name).await?;
            hotplugged.remove(&name);
            Ok(())
        }
    }
}

/// Adds `d` to the running VM.
pub async fn attach(qmp: &Qmp, d: &DiskSpec) -> Result<()> {
    validate_disk(d)?;
    if d.boot_order.is_some() {
        return Err(Error::InvalidSpec(format!(
            "disk {:?}: a hot-plugged disk has no boot order",
            d.name
        )));
    }
    let io = disk::probe(d)?;
    let [file, format] = disk::blockdev_nodes(d, io);
    qmp.execute("blockdev-add", Some(file)).await?;
    if let Err(e) = qmp.execute("blockdev-add", Some(format)).await {
        del_node(qmp, &disk::file_node(&d.name)).await;
        return Err(e);
    }
    if let Err(e) = qmp.execute("device_add", Some(disk::device(d, io))).await {
        del_node(qmp, &disk::format_node(&d.name)).await;
        del_node(qmp, &disk::file_node(&d.name)).await;
        return Err(e);
    }
    tracing::info!(disk = %d.name, path = %d.path.display(), "disk hot-plugged");
    Ok(())
}

/// Removes hot-plugged disk `name`: the guest must release the device first.
pub async fn detach(qmp: &Qmp, name: &str) -> Result<()> {
    let id = disk::device_id(name);
    let mut events = qmp.subscribe();
    qmp.execute("device_del", Some(json!({ "id": id }))).await?;
    let deleted = async {
        loop {
            match events.recv().await {
                Ok(ev) if ev.name == "DEVICE_DELETED" && ev.data["device"] == id.as_str() => {
                    return Ok(());
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    return Err(Error::QmpProtocol("qemu went away during unplug".into()));
                }
            }
        }
    };
    tokio::time::timeout(UNPLUG_TIMEOUT, deleted)
        .await
        .map_err(|_| {
            Error::Qemu(format!(
                "the guest did not release disk {name:?} within {} s",
                UNPLUG_TIMEOUT.as_secs()
            ))
        })??;
    qmp.execute(
        "blockdev-del",
        Some(json!({ "node-name": disk::format_node(name) })),
    )
    .await?;
    qmp.execute(
        "blockdev-del",
        Some(json!({ "node-name": disk::file_node(name) })),
    )
    .await?;
    tracing::info!(disk = name, "disk unplugged");
    Ok(())
}

/// Best-effort removal of a node while undoing a failed attach.
async fn del_node(qmp: &Qmp, node: &str) {
    if let Err(e) = qmp
        .execute("blockdev-del", Some(json!({ "node-name": node })))
        .await
    {
        tracing::warn!(%e, node, "cannot undo blockdev-add");
    }
}

/// Sends one request to a launcher's control socket and returns its answer as a result.
pub async fn request(socket: &Path, req: &ControlRequest) -> Result<()> {
    let sock = UnixStream::connect(socket).await.map_err(|e| {
        Error::io(
            format!("cannot connect to the control socket {}", socket.display()),
            e,
        )
    })?;
    let (r, mut w) = sock.into_split();
    let mut line = serde_json::to_string(req).expect("request serializes");
    line.push('\n');
    w.write_all(line.as_bytes())
        .await
        .map_err(|e| Error::io("sending the control request", e))?;
    let answer = BufReader::new(r)
        .lines()
        .next_line()
        .await
        .map_err(|e| Error::io("reading the control answer", e))?
        .ok_or_else(|| Error::Qemu("the launcher closed the control socket".into()))?;
    let resp: ControlResponse = serde_json::from_str(&answer)
        .map_err(|e| Error::QmpProtocol(format!("bad control answer {answer:?}: {e}")))?;
    match resp {
        ControlResponse { ok: true, .. } => Ok(()),
        ControlResponse { error, .. } => Err(Error::Refused(
            error.unwrap_or_else(|| "no reason given".into()),
        )),
    }
}
