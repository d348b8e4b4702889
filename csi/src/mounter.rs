//! `quarry pool-mount`: HPP's mounter for a storage pool on a PVC (`storagePools[].pvcTemplate`).
//! The pod has the PVC and the pool path's parent directory of the node (Bidirectional); this
//! mounts the PVC onto the pool path, so the driver on the node (which opens such a pool once it
//! is mounted) keeps its volumes on the PVC, and unmounts it when the pod stops. A Filesystem
//! PVC (`--source DIR`, its mount in the pod) is bind-mounted. A Block PVC (`--device PATH`, its
//! device in the pod) is probed ([`probe`]): a blank one is given an XFS filesystem first, as
//! HPP's mounter does (`mkfs.xfs` when `blkid` finds nothing); one holding XFS, ext2/3/4 or
//! btrfs is mounted as it is; anything else is refused and left untouched.

pub mod probe;

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use provisioner::sys::mount;

use crate::Error;
use probe::{Content, Filesystem};

/// `quarry pool-mount`.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct PoolMountArgs {
    #[command(flatten)]
    backing: BackingArgs,
    /// The pool's path as this pod sees the node's (under a Bidirectional hostPath mount).
    #[arg(long, value_name = "DIR")]
    pub target: PathBuf,
}

/// `--source` or `--device`: one of them, given as a [`Backing`].
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
#[group(required = true, multiple = false)]
struct BackingArgs {
    /// The PVC's mount in this pod (a Filesystem PVC): bind-mounted at the target.
    #[arg(long, value_name = "DIR")]
    source: Option<PathBuf>,
    /// The PVC's device in this pod (a Block PVC): made XFS when blank (never when it holds
    /// anything), then mounted at the target.
    #[arg(long, value_name = "PATH")]
    device: Option<PathBuf>,
}

/// What backs a pool: the PVC as this pod has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// A Filesystem PVC's mount.
    Dir(PathBuf),
    /// A Block PVC's device.
    Device(PathBuf),
}

impl PoolMountArgs {
    /// Mount `backing` at `target`.
    pub fn new(backing: Backing, target: PathBuf) -> Self {
        let (source, device) = match backing {
            Backing::Dir(d) => (Some(d), None),
            Backing::Device(d) => (None, Some(d)),
        };
        PoolMountArgs {
            backing: BackingArgs { source, device },
            target,
        }
    }

    /// What backs the pool (clap takes exactly one of `--source` and `--device`).
    pub fn backing(&self) -> Backing {
        match (&self.backing.source, &self.backing.device) {
            (_, Some(device)) => Backing::Device(device.clone()),
            (Some(source), None) => Backing::Dir(source.clone()),
            (None, None) => unreachable!("clap requires --source or --device"),
        }
    }

    /// The arguments as `quarry pool-mount` takes them.
    pub fn to_args(&self) -> Vec<String> {
        let (flag, path) = match self.backing() {
            Backing::Dir(p) => ("--source", p),
            Backing::Device(p) => ("--device", p),
        };
        vec![
            flag.into(),
            path.display().to_string(),
            "--target".into(),
            self.target.display().to_string(),
        ]
    }
}

/// Why a Block PVC's device was not mounted.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The path is no block device.
    #[error("{} is not a block device", device.display())]
    NotBlock {
        /// The device path.
        device: PathBuf,
    },
    /// Reading it failed.
    #[error("reading {}", device.display())]
    Read {
        /// The device path.
        device: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// It holds something a pool is not mounted from; it is left as it is.
    #[error(
        "{} holds {content}, which a storage pool is not mounted from (XFS, ext2/3/4 or btrfs are; \
         a blank device is made XFS); it is left as it is. Only if what it holds may be lost: \
         zero its first and last MiB (or all of it: blkdiscard -z {}) to have it made XFS",
        device.display(),
        device.display()
    )]
    Unsupported {
        /// The device path.
        device: PathBuf,
        /// What the probe found.
        content: Content,
    },
    /// `mkfs.xfs` could not be run.
    #[error("running mkfs.xfs on {} (Debian package xfsprogs)", device.display())]
    MkfsSpawn {
        /// The device path.
        device: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// `mkfs.xfs` failed.
    #[error("mkfs.xfs {} failed ({status}): {output}", device.display())]
    Mkfs {
        /// The device path.
        device: PathBuf,
        /// Its exit status.
        status: ExitStatus,
        /// What it printed on stderr.
        output: String,
    },
    /// `mkfs.xfs` succeeded but the device holds no XFS.
    #[error("mkfs.xfs succeeded but {} holds {found}, not XFS", device.display())]
    NotMade {
        /// The device path.
        device: PathBuf,
        /// What the probe found after it.
        found: Content,
    },
    /// The mount failed.
    #[error("mounting {} ({fstype}) at {}", device.display(), target.display())]
    Mount {
        /// The device path.
        device: PathBuf,
        /// The filesystem type.
        fstype: &'static str,
        /// The pool's path.
        target: PathBuf,
        /// Cause.
        source: io::Error,
    },
}

fn io(context: String) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io { context, source }
}

/// Mounts the pool's PVC at `target` until SIGTERM or SIGINT, then unmounts it. A mount left at
/// `target` by an earlier pod that did not stop cleanly is replaced.
pub async fn run(args: PoolMountArgs) -> Result<(), Error> {
    let target = &args.target;
    std::fs::create_dir_all(target).map_err(io(format!("creating {}", target.display())))?;
    let mounted = mount::is_mount_point(target)
        .map_err(io(format!("reading the mounts of {}", target.display())))?;
    if mounted {
        tracing::warn!(target = %target.display(), "replacing a mount left by an earlier mounter");
        mount::unmount(target).map_err(io(format!("unmounting {}", target.display())))?;
    }
    match args.backing() {
        Backing::Dir(source) => {
            let flags = mount::bind_flags(&[]).map_err(Error::Config)?;
            mount::bind(&source, target, flags).map_err(io(format!(
                "mounting {} at {}",
                source.display(),
                target.display()
            )))?;
            tracing::info!(source = %source.display(), target = %target.display(), "storage pool mounted");
        }
        Backing::Device(device) => {
            let fs = prepare(&device)?;
            mount::filesystem(&device, target, fs.mount_type()).map_err(|source| {
                DeviceError::Mount {
                    device: device.clone(),
                    fstype: fs.mount_type(),
                    target: target.clone(),
                    source,
                }
            })?;
            tracing::info!(device = %device.display(), fstype = fs.name(), target = %target.display(), "storage pool mounted");
        }
    }
    crate::server::termination().await;
    mount::unmount(target).map_err(io(format!("unmounting {}", target.display())))?;
    tracing::info!(target = %target.display(), "storage pool unmounted");
    Ok(())
}

/// The filesystem on `device`, made (XFS) if the device is blank; an error, touching nothing,
/// if it holds anything else.
pub fn prepare(device: &Path) -> Result<Filesystem, DeviceError> {
    let meta = std::fs::metadata(device).map_err(|source| DeviceError::Read {
        device: device.into(),
        source,
    })?;
    if !meta.file_type().is_block_device() {
        return Err(DeviceError::NotBlock {
            device: device.into(),
        });
    }
    match read_content(device)? {
        Content::Filesystem(fs) => Ok(fs),
        Content::Blank => {
            mkfs_xfs(device)?;
            match read_content(device)? {
                Content::Filesystem(Filesystem::Xfs) => Ok(Filesystem::Xfs),
                found => Err(DeviceError::NotMade {
                    device: device.into(),
                    found,
                }),
            }
        }
        content => Err(DeviceError::Unsupported {
            device: device.into(),
            content,
        }),
    }
}

/// The first [`probe::HEAD_LEN`] and last [`probe::TAIL_LEN`] bytes of `path` (a device or a
/// file; fewer where it is smaller).
pub fn read_ends(path: &Path) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let f = File::open(path)?;
    // a block device's metadata says 0 bytes: its end is where seeking to the end lands
    let size = io::Seek::seek(&mut &f, io::SeekFrom::End(0))?;
    let read = |at: u64, len: usize| -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, at)?;
        Ok(buf)
    };
    let head = read(0, size.min(probe::HEAD_LEN as u64) as usize)?;
    let tail_len = size.min(probe::TAIL_LEN as u64);
    let tail = read(size - tail_len, tail_len as usize)?;
    Ok((head, tail))
}

fn read_content(device: &Path) -> Result<Content, DeviceError> {
    let (head, tail) = read_ends(device).map_err(|source| DeviceError::Read {
        device: device.into(),
        source,
    })?;
    Ok(probe::probe(&head, &tail))
}

/// `mkfs.xfs DEVICE`, as HPP's mounter runs it: without `-f`, so it also refuses a device where
/// libblkid finds any signature.
fn mkfs_xfs(device: &Path) -> Result<(), DeviceError> {
    tracing::info!(device = %device.display(), "the device is blank: making an XFS filesystem on it");
    let out = Command::new("mkfs.xfs")
        .arg(device)
        .output()
        .map_err(|source| DeviceError::MkfsSpawn {
            device: device.into(),
            source,
        })?;
    if !out.status.success() {
        return Err(DeviceError::Mkfs {
            device: device.into(),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: PoolMountArgs,
    }

    fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<PoolMountArgs, clap::Error> {
        let argv = std::iter::once("pool-mount".to_string()).chain(args);
        <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.args)
    }

    #[test]
    fn arguments_round_trip() {
        for backing in [
            Backing::Dir("/source".into()),
            Backing::Device("/dev/data".into()),
        ] {
            let args = PoolMountArgs::new(backing.clone(), "/node/var/hpvolumes/fast".into());
            let parsed = parse(args.to_args()).unwrap();
            assert_eq!(parsed, args);
            assert_eq!(parsed.backing(), backing);
        }
    }

    #[test]
    fn exactly_one_of_source_and_device() {
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let both = parse(s(&["--source", "/s", "--device", "/d", "--target", "/t"]));
        assert!(
            both.unwrap_err()
                .to_string()
                .contains("cannot be used with")
        );
        let neither = parse(s(&["--target", "/t"]));
        assert!(neither.is_err());
    }

    #[test]
    fn a_file_is_no_device_and_nothing_is_written_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk");
        std::fs::write(&file, vec![0u8; 4096]).unwrap();
        let e = prepare(&file).unwrap_err();
        assert!(matches!(e, DeviceError::NotBlock { .. }), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), vec![0u8; 4096]);
    }
}
