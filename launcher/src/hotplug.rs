//! Hot-plug and unplug of disks into a running VM, through the launcher's control socket.
//!
//! As KubeVirt does for hotplug volumes: attaching creates the disk's block nodes with
//! `blockdev-add` and its guest device with `device_add` (undoing the nodes if the device is
//! refused); detaching asks the guest to release the device with `device_del`, waits for QEMU's
//! `DEVICE_DELETED` event (the guest acknowledged the ACPI eject), then removes the nodes. Only
//! hot-plugged disks can be detached (the control socket, [`super::control`], keeps track).

use std::time::Duration;

use serde_json::json;

use super::disk;
use super::error::{Error, Result};
use super::qmp::Qmp;
use super::spec::{DiskSpec, validate_disk};

/// How long the guest may take to release a device on `device_del`.
const UNPLUG_TIMEOUT: Duration = Duration::from_secs(30);

/// Adds `d` to the running VM.
pub async fn attach(qmp: &Qmp, d: &DiskSpec) -> Result<()> {
    validate_disk(d)?;
    if d.boot_order.is_some() {
        return Err(Error::InvalidSpec(format!(
            "disk {:?}: a hot-plugged disk has no boot order",
            d.name
        )));
    }
    let d = &disk::resolve(d);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::fake;
    use crate::spec::Bus;
    use serde_json::Value;
    use std::sync::{Arc, Mutex};

    /// Runs `attach` against a fake QMP server that refuses `refuse`; returns the commands seen.
    async fn attach_with(refuse: &'static str) -> (Result<()>, Vec<Value>) {
        let (dir, path, l) = fake::socket();
        let img = dir.path().join("disk.img");
        std::fs::write(&img, [0u8; 4096]).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = log.clone();
        tokio::spawn(fake::server(l, move |cmd| {
            seen.lock().unwrap().push(cmd.clone());
            let id = &cmd["id"];
            let answer = if cmd["execute"] == refuse {
                json!({"error": {"class": "GenericError", "desc": "refused"}, "id": id})
            } else {
                json!({"return": {}, "id": id})
            };
            vec![answer.to_string()]
        }));
        let (qmp, _events) = Qmp::connect(&path).await.unwrap();
        let disk = DiskSpec {
            name: "hot".into(),
            path: img,
            bus: Bus::VirtioBlk,
            readonly: false,
            boot_order: None,
        };
        let result = attach(&qmp, &disk).await;
        let cmds = log.lock().unwrap().clone();
        (result, cmds)
    }

    fn names(cmds: &[Value]) -> Vec<String> {
        cmds.iter()
            .map(|c| match c["arguments"]["node-name"].as_str() {
                Some(node) => format!("{} {node}", c["execute"].as_str().unwrap()),
                None => c["execute"].as_str().unwrap().to_string(),
            })
            .collect()
    }

    #[tokio::test]
    async fn attach_adds_nodes_then_device() {
        let (result, cmds) = attach_with("none").await;
        result.unwrap();
        assert_eq!(
            names(&cmds),
            [
                "blockdev-add file-hot",
                "blockdev-add fmt-hot",
                "device_add"
            ]
        );
        assert_eq!(cmds[2]["arguments"]["drive"], "fmt-hot");
        assert_eq!(cmds[2]["arguments"]["id"], "disk-hot");
    }

    #[tokio::test]
    async fn refused_device_undoes_the_nodes() {
        let (result, cmds) = attach_with("device_add").await;
        let e = result.unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
        assert_eq!(
            names(&cmds),
            [
                "blockdev-add file-hot",
                "blockdev-add fmt-hot",
                "device_add",
                "blockdev-del fmt-hot",
                "blockdev-del file-hot"
            ]
        );
    }

    #[tokio::test]
    async fn hotplugged_disks_have_no_boot_order() {
        let (_dir, path, l) = fake::socket();
        tokio::spawn(fake::server(l, |_| vec![]));
        let (qmp, _events) = Qmp::connect(&path).await.unwrap();
        let disk = DiskSpec {
            name: "hot".into(),
            path: "/nonexistent".into(),
            bus: Bus::VirtioBlk,
            readonly: false,
            boot_order: Some(2),
        };
        let e = attach(&qmp, &disk).await.unwrap_err();
        assert!(e.to_string().contains("boot order"), "{e}");
    }
}
