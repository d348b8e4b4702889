//! How an extraction becomes visible only when complete.
//!
//! CDI extracts in place, so a failed import leaves a half-written tree that looks like a
//! volume's content. Quarry extracts into a hidden staging directory on the volume itself
//! (`DIR/.quarry-archive-partial`, so the space is the volume's and the final move is a
//! rename), then syncs the filesystem and moves the top-level entries into `DIR`:
//!
//! 1. the names to move are written to a journal (`DIR/.quarry-archive-commit`) and synced;
//! 2. each top-level entry is renamed into `DIR`;
//! 3. the journal is removed, then the (empty) staging directory.
//!
//! A failure before step 1 removes the staging directory and leaves `DIR` as it was. A crash
//! during steps 1-3 leaves the journal: the next attempt ([`prepare`]) removes the entries it
//! names and the staging directory before starting over, so a tree that lacks some of its
//! entries is never taken for a finished one. The target must be empty apart from `lost+found`
//! (an archive is extracted into a fresh volume, as CDI's importer is).

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::error::{ArchiveError, Result};

/// The staging directory's name in the target.
pub const STAGING: &str = ".quarry-archive-partial";
/// The commit journal's name in the target.
pub const JOURNAL: &str = ".quarry-archive-commit";
/// The one entry a fresh filesystem volume may already hold.
const LOST_FOUND: &str = "lost+found";

fn io(context: String) -> impl FnOnce(std::io::Error) -> ArchiveError {
    move |e| ArchiveError::io(context, e)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing directory {}", dir.display())))
}

/// Removes a file, link or whole directory (never following links); gone already is fine.
fn remove(path: &Path) -> Result<()> {
    let removed = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).or_else(|e| {
            // Without root, read-only directories the archive made must be opened up first.
            if e.kind() != std::io::ErrorKind::PermissionDenied {
                return Err(e);
            }
            make_writable(path)?;
            std::fs::remove_dir_all(path)
        }),
        Ok(_) => std::fs::remove_file(path),
    };
    removed.map_err(io(format!("removing {}", path.display())))
}

/// Gives the owner full access to every directory under `dir` (links not followed).
fn make_writable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::symlink_metadata(dir)?.permissions().mode();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o700))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            make_writable(&entry.path())?;
        }
    }
    Ok(())
}

fn target_error(dir: &Path, why: impl Into<String>) -> ArchiveError {
    ArchiveError::Target {
        target: dir.display().to_string(),
        why: why.into(),
    }
}

/// Rolls back an interrupted earlier attempt, checks that `dir` (created if missing) is an
/// empty directory apart from `lost+found`, and creates the staging directory in it.
pub fn prepare(dir: &Path) -> Result<PathBuf> {
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    if !std::fs::metadata(dir)
        .map_err(io(format!("inspecting {}", dir.display())))?
        .is_dir()
    {
        return Err(target_error(
            dir,
            "an archive is extracted into a directory, and this is not one",
        ));
    }
    roll_back(dir)?;
    let staging = dir.join(STAGING);
    remove(&staging)?;
    let listing = io(format!("listing {}", dir.display()));
    for entry in std::fs::read_dir(dir).map_err(listing)? {
        let name = entry
            .map_err(io(format!("listing {}", dir.display())))?
            .file_name();
        if name != LOST_FOUND {
            return Err(target_error(
                dir,
                format!(
                    "the directory is not empty (it holds {:?}): an archive is extracted into an empty volume",
                    name
                ),
            ));
        }
    }
    std::fs::create_dir(&staging).map_err(io(format!("creating {}", staging.display())))?;
    Ok(staging)
}

/// Renames `from` to `to`. Moving a directory to another parent updates its `..`, which needs
/// write permission on it: a read-only directory is made writable for the rename, then given its
/// mode back.
fn move_entry(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(from)?;
    let mode = meta.permissions().mode();
    let read_only_dir = meta.is_dir() && mode & 0o200 == 0;
    if read_only_dir {
        std::fs::set_permissions(from, std::fs::Permissions::from_mode(mode | 0o200))?;
    }
    std::fs::rename(from, to)?;
    if read_only_dir {
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Undoes an interrupted commit: removes the entries the journal names, then the journal.
fn roll_back(dir: &Path) -> Result<()> {
    let journal = dir.join(JOURNAL);
    match std::fs::read(&journal) {
        Ok(names) => {
            tracing::warn!(dir = %dir.display(), "rolling back an interrupted archive commit");
            for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
                if name.contains(&b'/') || name == b"." || name == b".." {
                    return Err(target_error(
                        dir,
                        format!(
                            "{JOURNAL} names {:?}, not an entry of the directory",
                            String::from_utf8_lossy(name)
                        ),
                    ));
                }
                remove(&dir.join(std::ffi::OsStr::from_bytes(name)))?;
            }
            remove(&journal)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(ArchiveError::io(
                format!("reading {}", journal.display()),
                e,
            ));
        }
    }
    Ok(())
}

/// Gives up: removes the staging directory and everything in it.
pub fn discard(staging: &Path) {
    if let Err(e) = remove(staging) {
        tracing::warn!(error = %e, "could not remove the staging directory");
    }
}

/// Moves the staged tree into `dir` (see the module docs); the filesystem is synced first.
pub fn commit(dir: &Path, staging: &Path) -> Result<()> {
    let staged =
        std::fs::File::open(staging).map_err(io(format!("opening {}", staging.display())))?;
    nix::unistd::syncfs(&staged).map_err(|e| {
        ArchiveError::io(
            format!("syncing the filesystem of {}", dir.display()),
            std::io::Error::from(e),
        )
    })?;
    let mut names = Vec::new();
    for entry in std::fs::read_dir(staging).map_err(io(format!("listing {}", staging.display())))? {
        let entry = entry.map_err(io(format!("listing {}", staging.display())))?;
        let name = entry.file_name();
        let existing = dir.join(&name);
        if std::fs::symlink_metadata(&existing).is_ok() {
            // Only lost+found can be there: an empty lost+found of the archive's is dropped.
            let empty_dir = std::fs::read_dir(entry.path()).is_ok_and(|mut d| d.next().is_none());
            if name == LOST_FOUND && empty_dir {
                continue;
            }
            return Err(target_error(
                dir,
                format!("the archive's {name:?} is already in the directory"),
            ));
        }
        names.push(name);
    }
    let journal = dir.join(JOURNAL);
    let mut list = Vec::new();
    for n in &names {
        list.extend_from_slice(n.as_bytes());
        list.push(0);
    }
    let mut file =
        std::fs::File::create(&journal).map_err(io(format!("creating {}", journal.display())))?;
    file.write_all(&list)
        .and_then(|()| file.sync_all())
        .map_err(io(format!("writing {}", journal.display())))?;
    sync_dir(dir)?;
    for name in &names {
        if let Err(e) = move_entry(&staging.join(name), &dir.join(name)) {
            let _ = roll_back(dir);
            return Err(ArchiveError::io(
                format!(
                    "moving {} into {}",
                    Path::new(name).display(),
                    dir.display()
                ),
                e,
            ));
        }
    }
    sync_dir(dir)?;
    std::fs::remove_file(&journal).map_err(io(format!("removing {}", journal.display())))?;
    remove(staging)?;
    sync_dir(dir)
}
