//! `contentType: archive`: a tar (optionally gzip/xz/zstd compressed) from any source the
//! importer reads, extracted into a filesystem volume's directory instead of written as
//! `disk.img`.
//!
//! The source is read and hashed on its own stage and its compression layers peeled as for an
//! image ([`crate::import::read_source`], [`crate::decode`]); the tar is then read as it streams,
//! one entry at a time, with memory bounded by one 256 KiB buffer (and one sparse map). What an
//! entry may do is decided by [`path`] (names and link targets) and [`tree`] (descriptor-relative
//! writes that never follow a link); where the tree goes until it is complete, by [`staging`].
//!
//! Sizes are checked before and during the extraction: an uncompressed tar longer than the
//! usable space is refused before anything is written, and the file data written (holes not
//! counted) may never pass it. The usable space is the requested size minus the filesystem
//! overhead (as for `disk.img`), and never more than the filesystem's free space.

pub mod error;
pub mod path;
pub mod sparse;
pub mod staging;
pub mod tree;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::decode;
use crate::error::{Error, Result};
use crate::import::{DEFAULT_FILESYSTEM_OVERHEAD, ImportRequest, read_source};
use crate::progress::Progress;
use crate::size::usable_space;
use crate::source::ByteSource;
use error::ArchiveError;
use path::entry_parts;
use tree::{Counts, Meta, Tree};

/// What an extraction did, printed by `quarry import --archive --json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArchiveReport {
    pub source: String,
    pub target: String,
    /// Layers from the outside in, e.g. `["gzip", "tar"]`.
    pub format_chain: Vec<String>,
    /// Source bytes read (as downloaded).
    pub source_bytes: u64,
    /// File data bytes written (holes not counted).
    pub bytes_written: u64,
    #[serde(flatten)]
    pub counts: Counts,
    /// Whether the archive's owners (uid/gid) were kept: only as root; otherwise every entry
    /// belongs to the user extracting, as with GNU tar run without root.
    pub owners_kept: bool,
    /// Checksum of the source bytes, `ALG:HEX`, when one was requested.
    pub source_checksum: Option<String>,
    pub duration_seconds: f64,
}

impl ArchiveReport {
    /// The one-line summary `quarry import --archive` prints without `--json`.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        format!(
            "extracted {} ({}) into {}: {} files, {} directories, {} symbolic links, {} hard links, {} data bytes written in {:.2}s{}",
            self.source,
            self.format_chain.join(" > "),
            self.target,
            c.files,
            c.directories,
            c.symlinks,
            c.hard_links,
            self.bytes_written,
            self.duration_seconds,
            if self.owners_kept {
                ""
            } else {
                "; owners not kept (not running as root)"
            }
        )
    }
}

/// Extracts the tar `req.source` names into the directory `req.target`.
pub fn extract(req: &ImportRequest, progress: Arc<Progress>) -> Result<ArchiveReport> {
    let source = req.source.open(&req.http)?;
    extract_source(req, source, progress)
}

/// Extracts a tar from a source the caller opened (an upload's body) into `req.target`.
pub fn extract_from(
    source: Box<dyn ByteSource>,
    req: &ImportRequest<()>,
    progress: Arc<Progress>,
) -> Result<ArchiveReport> {
    extract_source(req, source, progress)
}

fn extract_source<S>(
    req: &ImportRequest<S>,
    source: Box<dyn ByteSource>,
    progress: Arc<Progress>,
) -> Result<ArchiveReport> {
    let started = Instant::now();
    let target = &req.target;
    let limit = capacity(req)?;
    let (raw, mut stages, info) = read_source(req.checksum.as_ref(), source, &progress)?;
    let opened = decode::unwrap_layers(raw).and_then(|(stream, layers)| {
        if let (true, Some(length), Some((available, detail))) =
            (layers.is_empty(), info.length, &limit)
            && length > *available
        {
            return Err(ArchiveError::TooLarge {
                needed: length,
                available: *available,
                target: target.display().to_string(),
                detail: format!("{detail}; the tar archive is {length} bytes"),
            }
            .into());
        }
        let staging = staging::prepare(target)?;
        Ok((stream, layers, staging))
    });
    let (stream, layers, staging) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            stages.cancel();
            return Err(e);
        }
    };
    let extracted = open_root(&staging).and_then(|root| {
        let tree = Tree::new(root, target.display().to_string(), limit, &progress);
        extract_tar(stream, tree)
    });
    let settled = extracted.and_then(|(root, counts, used)| {
        drop(root);
        let (bytes, checksum) = stages.settle(req.checksum.as_ref(), info.length, &info.name)?;
        Ok((counts, used, bytes, checksum))
    });
    let (counts, used, source_bytes, checksum) = match settled {
        Ok(done) => done,
        Err(e) => {
            stages.cancel();
            staging::discard(&staging);
            return Err(e);
        }
    };
    if let Err(e) = staging::commit(target, &staging) {
        staging::discard(&staging);
        return Err(e.into());
    }
    let mut format_chain: Vec<String> = layers.iter().map(|c| c.as_str().to_string()).collect();
    format_chain.push("tar".into());
    Ok(ArchiveReport {
        source: info.name,
        target: target.display().to_string(),
        format_chain,
        source_bytes,
        bytes_written: used,
        counts,
        owners_kept: tree::keeps_owners(),
        source_checksum: checksum.map(|c| c.to_string()),
        duration_seconds: started.elapsed().as_secs_f64(),
    })
}

/// What the extracted files may take: the requested size minus the filesystem overhead, and
/// never more than the free space of the filesystem the target is on.
fn capacity<S>(req: &ImportRequest<S>) -> Result<Option<(u64, String)>> {
    let overhead = req
        .filesystem_overhead
        .unwrap_or(DEFAULT_FILESYSTEM_OVERHEAD);
    if !(0.0..1.0).contains(&overhead) {
        return Err(Error::InvalidInput(format!(
            "filesystem overhead {overhead} is not a fraction in [0, 1)"
        )));
    }
    let requested = req.size.map(|size| {
        (
            usable_space(size, overhead),
            format!(
                "requested size {size} bytes minus {}% filesystem overhead",
                overhead * 100.0
            ),
        )
    });
    let probe = existing_ancestor(&req.target);
    let free = nix::sys::statvfs::statvfs(probe).ok().map(|st| {
        (
            st.blocks_available() * st.fragment_size(),
            format!("the free space of the filesystem at {}", probe.display()),
        )
    });
    Ok(match (requested, free) {
        (Some(r), Some(f)) if f.0 < r.0 => Some(f),
        (Some(r), _) => Some(r),
        (None, f) => f,
    })
}

/// The target, or its nearest existing ancestor (the target directory may not exist yet).
fn existing_ancestor(target: &Path) -> &Path {
    let mut p = target;
    while !p.exists() {
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent,
            _ => return Path::new("."),
        }
    }
    p
}

fn open_root(staging: &Path) -> Result<OwnedFd> {
    std::fs::File::open(staging)
        .map(OwnedFd::from)
        .map_err(|e| Error::io(format!("opening {}", staging.display()), e))
}

/// Reads the tar entry by entry into `tree`; then reads the stream to its end (so a checksum
/// covers every byte).
fn extract_tar(stream: impl Read, mut tree: Tree<'_>) -> Result<(OwnedFd, Counts, u64)> {
    let mut archive = tar::Archive::new(stream);
    let entries = archive
        .entries()
        .map_err(|e| ArchiveError::reading(e, None))?;
    let mut any = false;
    for entry in entries {
        let entry = entry.map_err(|e| ArchiveError::reading(e, None))?;
        any = true;
        extract_entry(entry, &mut tree)?;
    }
    if !any {
        return Err(ArchiveError::NotTar("the archive holds no entries".into()).into());
    }
    let mut rest = archive.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(|e| Error::from_read(e, "archive"))?;
    Ok(tree.finish()?)
}

fn extract_entry<R: Read>(
    mut entry: tar::Entry<'_, R>,
    tree: &mut Tree<'_>,
) -> Result<(), ArchiveError> {
    let records = sparse::pax_records(&mut entry)?;
    let header_name = entry.path_bytes().into_owned();
    let shown_header = String::from_utf8_lossy(&header_name).into_owned();
    let pax_sparse = sparse::from_pax(&records, &shown_header)?;
    let name = pax_sparse
        .as_ref()
        .and_then(|s| s.name.clone())
        .unwrap_or(header_name);
    let shown = String::from_utf8_lossy(&name).into_owned();
    let header = entry.header();
    let kind = header.entry_type();
    let bad = |what: &str, e: std::io::Error| {
        ArchiveError::malformed(&shown, format!("bad {what} field: {e}"))
    };
    let meta = Meta {
        mode: header.mode().map_err(|e| bad("mode", e))?,
        uid: header.uid().map_err(|e| bad("uid", e))?,
        gid: header.gid().map_err(|e| bad("gid", e))?,
        mtime: header.mtime().map_err(|e| bad("mtime", e))?,
    };
    use tar::EntryType as T;
    if matches!(kind, T::XGlobalHeader) {
        return Ok(());
    }
    let parts = entry_parts(&name, &shown)?;
    // The commit's own names in the target: an entry of theirs would be replaced or removed by
    // the commit (the journal) or clash with the staging directory.
    if let Some(top) = parts.first()
        && [staging::JOURNAL, staging::STAGING].contains(&&*String::from_utf8_lossy(top))
    {
        return Err(ArchiveError::refused(
            &shown,
            "a top-level name Quarry's extraction uses for itself",
        ));
    }
    match kind {
        T::Regular | T::Continuous | T::GNUSparse => {
            if parts.is_empty() {
                return Err(ArchiveError::refused(
                    &shown,
                    "a file in place of the extraction directory",
                ));
            }
            let size = entry.size();
            let layout = sparse::layout(&mut entry, size, pax_sparse, &shown)?;
            tree.file(&parts, meta, &layout, &mut entry, &shown)
        }
        T::Directory => {
            if parts.is_empty() {
                return Ok(()); // `./`: the extraction directory itself
            }
            tree.directory(parts, meta, &shown)
        }
        T::Symlink => {
            let target = entry
                .link_name_bytes()
                .map(|t| t.into_owned())
                .unwrap_or_default();
            tree.symlink(&parts, &target, meta, &shown)
        }
        T::Link => {
            let target = entry
                .link_name_bytes()
                .map(|t| t.into_owned())
                .unwrap_or_default();
            let source = entry_parts(&target, &shown)?;
            tree.hard_link(&parts, &source, &shown)
        }
        T::Char | T::Block => Err(ArchiveError::refused(
            &shown,
            "device files are not extracted",
        )),
        T::Fifo => Err(ArchiveError::refused(&shown, "FIFOs are not extracted")),
        other => Err(ArchiveError::refused(
            &shown,
            format!(
                "entries of type {:?} are not extracted",
                other.as_byte() as char
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::source::SourceSpec;

    /// A tar of `(name, type, data or link target)` entries.
    fn tar_of(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o640);
            h.set_mtime(1_700_000_000);
            h.set_uid(0);
            h.set_gid(0);
            if kind.is_symlink() || kind.is_hard_link() {
                h.set_size(0);
                b.append_link(&mut h, name, std::str::from_utf8(data).unwrap())
                    .unwrap();
            } else {
                h.set_size(data.len() as u64);
                h.set_cksum();
                // Names are written raw: `append_data` would refuse `..` itself.
                h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
                h.set_cksum();
                b.append(&h, *data).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    fn extract_bytes(tar: &[u8]) -> (tempfile::TempDir, Result<ArchiveReport>) {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("in.tar");
        std::fs::write(&source, tar).unwrap();
        let req = ImportRequest::new(SourceSpec::File(source), dir.path().join("t"));
        let result = extract(&req, Arc::new(Progress::default()));
        (dir, result)
    }

    #[test]
    fn files_directories_and_links_are_extracted() {
        use tar::EntryType as T;
        let tar = tar_of(&[
            ("d/", T::Directory, b""),
            ("d/f", T::Regular, b"hello"),
            ("d/l", T::Symlink, b"f"),
            ("h", T::Link, b"d/f"),
        ]);
        let (dir, result) = extract_bytes(&tar);
        let report = result.unwrap();
        assert_eq!((report.counts.files, report.counts.directories), (1, 1));
        assert_eq!((report.counts.symlinks, report.counts.hard_links), (1, 1));
        let t = dir.path().join("t");
        assert_eq!(std::fs::read(t.join("d/l")).unwrap(), b"hello");
        assert_eq!(std::fs::read(t.join("h")).unwrap(), b"hello");
        assert!(!t.join(staging::STAGING).exists());
    }

    #[test]
    fn writing_through_a_link_is_refused_and_leaves_nothing() {
        use tar::EntryType as T;
        let tar = tar_of(&[
            ("d/", T::Directory, b""),
            ("l", T::Symlink, b"d"),
            ("l/x", T::Regular, b"x"),
        ]);
        let (dir, result) = extract_bytes(&tar);
        let e = result.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("through the symbolic link l"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path().join("t")).unwrap().count(), 0);
    }

    #[test]
    fn the_commit_s_own_names_at_the_top_are_refused() {
        use tar::EntryType as T;
        for name in [staging::JOURNAL, "./.quarry-archive-partial/f"] {
            let tar = tar_of(&[("a", T::Regular, b"a"), (name, T::Regular, b"x")]);
            let (dir, result) = extract_bytes(&tar);
            let e = result.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{name}: {e}");
            assert_eq!(std::fs::read_dir(dir.path().join("t")).unwrap().count(), 0);
        }
        // Deeper down, the names are the archive's.
        let tar = tar_of(&[("d/.quarry-archive-commit", T::Regular, b"x")]);
        let (dir, result) = extract_bytes(&tar);
        assert_eq!(result.unwrap().counts.files, 1);
        let kept = dir.path().join("t/d").join(staging::JOURNAL);
        assert_eq!(std::fs::read(kept).unwrap(), b"x");
    }

    #[test]
    fn a_sparse_file_larger_than_the_filesystem_takes_is_too_large() {
        const SIZE: u64 = 1 << 62;
        let probe = tempfile::tempfile().unwrap();
        if probe.set_len(SIZE).is_ok() {
            return; // this filesystem takes it
        }
        let mut b = tar::Builder::new(Vec::new());
        let size = SIZE.to_string();
        b.append_pax_extensions([
            ("GNU.sparse.size", size.as_bytes()),
            ("GNU.sparse.map", b"0,1".as_slice()),
        ])
        .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, "big", &b"x"[..]).unwrap();
        let (dir, result) = extract_bytes(&b.into_inner().unwrap());
        let e = result.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TooSmall, "{e}");
        assert!(e.to_string().contains("in one file"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path().join("t")).unwrap().count(), 0);
    }

    #[test]
    fn traversal_is_refused() {
        let tar = tar_of(&[("../x", tar::EntryType::Regular, b"x")]);
        let (dir, result) = extract_bytes(&tar);
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Unsupported);
        assert!(!dir.path().join("x").exists());
    }
}
