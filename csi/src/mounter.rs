//! `quarry pool-mount`: HPP's mounter for a storage pool on a PVC (`storagePools[].pvcTemplate`).
//! The pod mounts the PVC and the pool path's parent directory of the node (Bidirectional); this
//! bind-mounts the PVC onto the pool path, so the driver on the node (which opens such a pool
//! once it is mounted) keeps its volumes on the PVC, and unmounts it when the pod stops.

use std::path::PathBuf;

use provisioner::sys::mount;

use crate::Error;

/// `quarry pool-mount`.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct PoolMountArgs {
    /// The PVC's mount in this pod.
    #[arg(long, value_name = "DIR")]
    pub source: PathBuf,
    /// The pool's path as this pod sees the node's (under a Bidirectional hostPath mount).
    #[arg(long, value_name = "DIR")]
    pub target: PathBuf,
}

impl PoolMountArgs {
    /// The arguments as `quarry pool-mount` takes them.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--source".into(),
            self.source.display().to_string(),
            "--target".into(),
            self.target.display().to_string(),
        ]
    }
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { context, source }
}

/// Mounts `source` at `target` until SIGTERM or SIGINT, then unmounts it. A mount left at
/// `target` by an earlier pod that did not stop cleanly is replaced.
pub async fn run(args: PoolMountArgs) -> Result<(), Error> {
    let (source, target) = (&args.source, &args.target);
    std::fs::create_dir_all(target).map_err(io(format!("creating {}", target.display())))?;
    let mounted = mount::is_mount_point(target)
        .map_err(io(format!("reading the mounts of {}", target.display())))?;
    if mounted {
        tracing::warn!(target = %target.display(), "replacing a mount left by an earlier mounter");
        mount::unmount(target).map_err(io(format!("unmounting {}", target.display())))?;
    }
    let flags = mount::bind_flags(&[]).map_err(Error::Config)?;
    mount::bind(source, target, flags).map_err(io(format!(
        "mounting {} at {}",
        source.display(),
        target.display()
    )))?;
    tracing::info!(source = %source.display(), target = %target.display(), "storage pool mounted");
    crate::server::termination().await;
    mount::unmount(target).map_err(io(format!("unmounting {}", target.display())))?;
    tracing::info!(target = %target.display(), "storage pool unmounted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: PoolMountArgs,
        }
        let args = PoolMountArgs {
            source: "/source".into(),
            target: "/node/var/hpvolumes/fast".into(),
        };
        let parsed = <Cli as clap::Parser>::try_parse_from(
            std::iter::once("pool-mount".to_string()).chain(args.to_args()),
        )
        .unwrap();
        assert_eq!(parsed.args, args);
    }
}
