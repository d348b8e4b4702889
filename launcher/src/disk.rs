//! Disks: the I/O mode probe and the QEMU block graph of one disk.
//!
//! The cache/aio choice follows KubeVirt's virt-launcher: when the volume accepts `O_DIRECT` the
//! page cache is bypassed (`cache.direct`, the guest sees a write-back cache it must flush), and
//! `aio=native` is used for block devices and fully allocated files (where Linux AIO does not
//! block on allocation); otherwise (tmpfs, some FUSE or overlay filesystems) the host page cache is
//! used in write-through mode with `aio=threads`. The same JSON objects serve the `-blockdev` /
//! `-device` command-line arguments and the QMP `blockdev-add` / `device_add` of a hot-plug, so a
//! path with commas or spaces needs no escaping anywhere.

use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use serde_json::{Value, json};

use super::error::{Error, Result};
use super::spec::{Bus, DiskSpec};

/// How QEMU submits I/O for a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aio {
    /// Linux native AIO (needs `O_DIRECT`).
    Native,
    /// A thread pool doing ordinary syscalls.
    Threads,
}

/// The outcome of probing one volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskIo {
    /// The volume is a block device (`host_device` driver) rather than a file.
    pub block_device: bool,
    /// `cache.direct`: open with `O_DIRECT`.
    pub direct: bool,
    pub aio: Aio,
}

/// KubeVirt's rule, given the probe's facts.
pub fn choose_io(block_device: bool, direct_ok: bool, preallocated: bool) -> DiskIo {
    let aio = if direct_ok && (block_device || preallocated) {
        Aio::Native
    } else {
        Aio::Threads
    };
    DiskIo {
        block_device,
        direct: direct_ok,
        aio,
    }
}

/// The disk with its path resolved: a directory (a filesystem volume's mount point) means the
/// `disk.img` inside it, as KubeVirt and CDI lay filesystem volumes out.
pub fn resolve(disk: &DiskSpec) -> DiskSpec {
    let mut d = disk.clone();
    if d.path.is_dir() {
        d.path = d.path.join("disk.img");
    }
    d
}

/// Probes a volume: it must exist and be a regular file or a block device; `O_DIRECT` is tried
/// for real, and a file counts as preallocated when its allocated blocks cover its size.
pub fn probe(disk: &DiskSpec) -> Result<DiskIo> {
    let path = &disk.path;
    let meta = std::fs::metadata(path).map_err(|e| {
        Error::InvalidSpec(format!(
            "disk {:?}: cannot use {}: {e}",
            disk.name,
            path.display()
        ))
    })?;
    let block_device = meta.file_type().is_block_device();
    if !block_device && !meta.is_file() {
        return Err(Error::InvalidSpec(format!(
            "disk {:?}: {} is neither a regular file nor a block device",
            disk.name,
            path.display()
        )));
    }
    let direct_ok = direct_io_works(path).map_err(|e| {
        Error::InvalidSpec(format!(
            "disk {:?}: cannot open {}: {e}",
            disk.name,
            path.display()
        ))
    })?;
    let preallocated = !block_device && meta.blocks() * 512 >= meta.size();
    Ok(choose_io(block_device, direct_ok, preallocated))
}

/// Opens `path` with `O_DIRECT`: `EINVAL` means the filesystem refuses it, any other error is real.
fn direct_io_works(path: &Path) -> std::io::Result<bool> {
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The protocol node's name for disk `name`.
pub fn file_node(name: &str) -> String {
    format!("file-{name}")
}

/// The format (raw) node's name, the one the guest device uses.
pub fn format_node(name: &str) -> String {
    format!("fmt-{name}")
}

/// The guest device's id.
pub fn device_id(name: &str) -> String {
    format!("disk-{name}")
}

/// The id of the VM's virtio-scsi controller.
pub const SCSI_CONTROLLER: &str = "scsi0";

/// The two block nodes of a disk: the protocol node (file or host_device) and the raw format node
/// on top of it, in the order they must be created.
pub fn blockdev_nodes(disk: &DiskSpec, io: DiskIo) -> [Value; 2] {
    let cache = json!({ "direct": io.direct, "no-flush": false });
    let file = json!({
        "driver": if io.block_device { "host_device" } else { "file" },
        "filename": disk.path,
        "node-name": file_node(&disk.name),
        "cache": cache,
        "aio": match io.aio { Aio::Native => "native", Aio::Threads => "threads" },
        "discard": "unmap",
        "read-only": disk.readonly,
    });
    let format = json!({
        "driver": "raw",
        "file": file_node(&disk.name),
        "node-name": format_node(&disk.name),
        "cache": cache,
        "discard": "unmap",
        "read-only": disk.readonly,
    });
    [file, format]
}

/// The guest device of a disk. Write-back towards the guest when the host cache is bypassed (the
/// guest must flush), write-through when the host page cache is used.
pub fn device(disk: &DiskSpec, io: DiskIo) -> Value {
    let mut dev = match disk.bus {
        Bus::VirtioBlk => json!({ "driver": "virtio-blk-pci" }),
        Bus::VirtioScsi => json!({ "driver": "scsi-hd", "bus": format!("{SCSI_CONTROLLER}.0") }),
    };
    dev["id"] = json!(device_id(&disk.name));
    dev["drive"] = json!(format_node(&disk.name));
    dev["write-cache"] = json!(if io.direct { "on" } else { "off" });
    if let Some(order) = disk.boot_order {
        dev["bootindex"] = json!(order);
    }
    dev
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn disk(path: PathBuf) -> DiskSpec {
        DiskSpec {
            name: "root".into(),
            path,
            bus: Bus::VirtioBlk,
            readonly: false,
            boot_order: None,
        }
    }

    #[test]
    fn kubevirt_rule() {
        assert_eq!(choose_io(true, true, false).aio, Aio::Native);
        assert_eq!(choose_io(false, true, true).aio, Aio::Native);
        assert_eq!(
            choose_io(false, true, false).aio,
            Aio::Threads,
            "sparse file"
        );
        let no_direct = choose_io(true, false, true);
        assert_eq!((no_direct.direct, no_direct.aio), (false, Aio::Threads));
    }

    #[test]
    fn probes_sparse_and_preallocated_files() {
        // The source tree lives on a filesystem that takes O_DIRECT (ext4 or xfs); /tmp may be tmpfs.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let sparse = dir.path().join("sparse.img");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
        let io = probe(&disk(sparse)).unwrap();
        assert_eq!(
            (io.block_device, io.direct, io.aio),
            (false, true, Aio::Threads)
        );

        let full = dir.path().join("full.img");
        std::fs::write(&full, vec![1u8; 1 << 20]).unwrap();
        let io = probe(&disk(full)).unwrap();
        assert_eq!((io.direct, io.aio), (true, Aio::Native));
    }

    #[test]
    fn probes_a_filesystem_without_o_direct() {
        // procfs refuses O_DIRECT with EINVAL (as tmpfs did before Linux 6.6) and its files are
        // regular files, so it exercises the fallback without a special mount.
        let io = probe(&disk(PathBuf::from("/proc/version"))).unwrap();
        assert_eq!((io.direct, io.aio), (false, Aio::Threads));
    }

    #[test]
    fn a_volume_directory_means_its_disk_img() {
        let dir = tempfile::tempdir().unwrap();
        let d = resolve(&disk(dir.path().to_path_buf()));
        assert_eq!(d.path, dir.path().join("disk.img"));
        let file = dir.path().join("x.img");
        assert_eq!(resolve(&disk(file.clone())).path, file);
    }

    #[test]
    fn probe_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let e = probe(&disk(dir.path().join("missing"))).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        let e = probe(&disk(dir.path().to_path_buf())).unwrap_err();
        assert!(e.to_string().contains("neither a regular file"), "{e}");
    }

    #[test]
    fn block_graph_json() {
        let mut d = disk(PathBuf::from("/vol/a, b/disk.img"));
        d.readonly = true;
        d.boot_order = Some(1);
        let io = choose_io(false, true, true);
        let [file, fmt] = blockdev_nodes(&d, io);
        assert_eq!(
            file,
            json!({"driver": "file", "filename": "/vol/a, b/disk.img", "node-name": "file-root",
                   "cache": {"direct": true, "no-flush": false}, "aio": "native",
                   "discard": "unmap", "read-only": true})
        );
        assert_eq!(fmt["file"], "file-root");
        assert_eq!(fmt["node-name"], "fmt-root");
        let dev = device(&d, io);
        assert_eq!(
            dev,
            json!({"driver": "virtio-blk-pci", "id": "disk-root", "drive": "fmt-root",
                   "write-cache": "on", "bootindex": 1})
        );
        d.bus = Bus::VirtioScsi;
        let dev = device(&d, choose_io(true, false, false));
        assert_eq!(dev["driver"], "scsi-hd");
        assert_eq!(dev["bus"], "scsi0.0");
        assert_eq!(dev["write-cache"], "off");
        let [file, _] = blockdev_nodes(&d, choose_io(true, false, false));
        assert_eq!(file["driver"], "host_device");
        assert_eq!(file["aio"], "threads");
    }
}
