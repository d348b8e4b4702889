//! The launcher's control socket: hot-plug, unplug, pause and resume of the running VM.
//!
//! `RUN_DIR/control.sock` (owner-only, inside the 0700 run directory) takes one JSON request per
//! line and answers each with one JSON line:
//! `{"op": "attach", "disk": {"name": .., "path": .., "readonly": .., "bus": ..}}`,
//! `{"op": "detach", "name": ..}`, `{"op": "pause"}`, `{"op": "resume"}` ->
//! `{"ok": true}` or `{"ok": false, "error": ".."}`. `quarry vmctl` is its client. Requests are applied one at a time.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Mutex;

use super::error::{Error, Result};
use super::hotplug::{attach, detach};
use super::qmp::Qmp;
use super::spec::DiskSpec;

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ControlRequest {
    Attach {
        disk: DiskSpec,
    },
    Detach {
        name: String,
    },
    /// Pause the guest's vCPUs (QMP `stop`); the VM reports Paused.
    Pause,
    /// Continue a paused guest (QMP `cont`); the VM reports Running.
    Resume,
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
    /// Names of the spec's disks (attached at boot: neither attachable again nor detachable).
    spec_disks: Arc<HashSet<String>>,
}

impl ControlServer {
    /// Binds the socket at `path`, owner-only, for a VM booted with the disks `spec_disks`.
    pub fn bind(path: &Path, qmp: Arc<Qmp>, spec_disks: HashSet<String>) -> Result<Self> {
        let listener = UnixListener::bind(path)
            .map_err(|e| Error::io(format!("cannot listen on {}", path.display()), e))?;
        // Owner only, even when the run directory was not created (0700) by the launcher.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("cannot restrict {}", path.display()), e))?;
        Ok(ControlServer {
            listener,
            path: path.to_path_buf(),
            qmp,
            hotplugged: Arc::default(),
            spec_disks: Arc::new(spec_disks),
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
            let spec_disks = self.spec_disks.clone();
            tokio::spawn(async move {
                if let Err(e) = serve_connection(sock, &qmp, &hotplugged, &spec_disks).await {
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
    spec_disks: &HashSet<String>,
) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let result = match serde_json::from_str::<ControlRequest>(&line) {
            Ok(req) => {
                // One change at a time: a detach must not race an attach of the same name.
                let mut set = hotplugged.lock().await;
                apply(qmp, &mut set, spec_disks, req).await
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
                // the client says "the launcher refused the request" itself
                error: Some(match e {
                    Error::Refused(why) => why,
                    e => e.to_string(),
                }),
            },
        };
        let mut out = serde_json::to_string(&resp).expect("response serializes");
        out.push('\n');
        w.write_all(out.as_bytes()).await?;
    }
    Ok(())
}

async fn apply(
    qmp: &Qmp,
    hotplugged: &mut HashSet<String>,
    spec_disks: &HashSet<String>,
    req: ControlRequest,
) -> Result<()> {
    match req {
        ControlRequest::Attach { disk } => {
            // refused here, not by qemu ("Duplicate nodes with node-name=...")
            if spec_disks.contains(&disk.name) {
                return Err(Error::Refused(format!(
                    "disk {:?} is a disk of the VM's spec: attach under another name",
                    disk.name
                )));
            }
            if hotplugged.contains(&disk.name) {
                return Err(Error::Refused(format!(
                    "disk {:?} is already hot-plugged: detach it first, or attach under another name",
                    disk.name
                )));
            }
            attach(qmp, &disk).await?;
            hotplugged.insert(disk.name);
            Ok(())
        }
        ControlRequest::Detach { name } => {
            if !hotplugged.contains(&name) {
                let what = if spec_disks.contains(&name) {
                    "is a disk of the VM's spec, not hot-plugged"
                } else {
                    "is not a disk of this VM"
                };
                return Err(Error::Refused(format!(
                    "disk {name:?} {what}: only hot-plugged disks can be detached"
                )));
            }
            detach(qmp, &name).await?;
            hotplugged.remove(&name);
            Ok(())
        }
        ControlRequest::Pause => qmp.execute("stop", None).await.map(drop),
        ControlRequest::Resume => qmp.execute("cont", None).await.map(drop),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::fake;
    use crate::spec::DiskSpec;

    /// A second attach of a name (hot-plugged or of the spec) and a detach of a disk that was
    /// never hot-plugged are refused with what is wrong, before qemu is asked anything.
    #[tokio::test]
    async fn duplicate_attach_and_unknown_detach_are_refused_before_qemu() {
        let (_d, path, l) = fake::socket();
        tokio::spawn(fake::server(l, |cmd| {
            panic!("qemu was asked {cmd}");
        }));
        let (qmp, _events) = Qmp::connect(&path).await.unwrap();
        let mut set = HashSet::from(["extra".to_string()]);
        let spec = HashSet::from(["boot".to_string()]);
        let disk = |name: &str| -> DiskSpec {
            serde_json::from_value(serde_json::json!({"name": name, "path": "/dev/null"})).unwrap()
        };
        let detach = |name: &str| ControlRequest::Detach { name: name.into() };
        let refusals = [
            (
                ControlRequest::Attach {
                    disk: disk("extra"),
                },
                r#""extra" is already hot-plugged"#,
            ),
            (
                ControlRequest::Attach { disk: disk("boot") },
                r#""boot" is a disk of the VM's spec"#,
            ),
            (
                detach("boot"),
                r#""boot" is a disk of the VM's spec, not hot-plugged"#,
            ),
            (detach("nope"), r#""nope" is not a disk of this VM"#),
        ];
        for (req, want) in refusals {
            let e = apply(&qmp, &mut set, &spec, req).await.unwrap_err();
            assert!(matches!(e, Error::Refused(_)), "{e:?}");
            let msg = e.to_string();
            assert!(msg.contains(want), "{msg}");
            assert!(!msg.contains("invalid VM spec"), "{msg}");
        }
        assert_eq!(set, HashSet::from(["extra".to_string()]));
    }
}
