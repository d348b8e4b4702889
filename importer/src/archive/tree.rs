//! Writing entries under the extraction root without ever leaving it.
//!
//! Every path is walked from a descriptor of the root, one component at a time, with
//! `O_NOFOLLOW | O_DIRECTORY`: a symbolic link anywhere among an entry's parents refuses the
//! entry (nothing is written through a link, even one pointing inside). Files are created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` after removing what was there (never a directory, so a
//! directory is never replaced), hard links are made only to regular files already extracted,
//! and devices and FIFOs are refused. Regular files are written sparse: zero runs of
//! [`ZERO_BLOCK`](crate::sink::ZERO_BLOCK) bytes, and the holes of sparse entries, are skipped.
//!
//! Ownership is kept when running as root (numeric uid/gid, as `tar --numeric-owner`), and
//! skipped otherwise; modes (all 12 bits) and modification times are kept. Directories get
//! theirs last, deepest first, so a read-only directory can still be filled.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, fstatat, futimens, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, symlinkat, unlinkat};

use super::error::{ArchiveError, Result};
use super::path::{Parts, check_symlink_target, display};
use super::sparse::Layout;
use crate::progress::Progress;
use crate::sink::for_each_run;

/// Bytes read from the archive per write.
const CHUNK: usize = 256 << 10;

/// What an entry keeps besides its data.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
}

/// How many of each kind were written.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Counts {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub hard_links: u64,
}

/// The extraction root and what has been written under it.
pub struct Tree<'a> {
    root: OwnedFd,
    /// Keep uid/gid (running as root).
    chown: bool,
    /// Bytes the files may take in all, and how that was derived (for the error).
    limit: Option<(u64, String)>,
    /// The target as the user named it, for messages.
    target: String,
    used: u64,
    dirs: Vec<(Parts, Meta)>,
    pub counts: Counts,
    progress: &'a Progress,
}

fn errno_io(context: String, e: Errno) -> ArchiveError {
    ArchiveError::io(context, std::io::Error::from(e))
}

impl<'a> Tree<'a> {
    pub fn new(
        root: OwnedFd,
        target: String,
        limit: Option<(u64, String)>,
        progress: &'a Progress,
    ) -> Self {
        Tree {
            root,
            chown: keeps_owners(),
            limit,
            target,
            used: 0,
            dirs: Vec::new(),
            counts: Counts::default(),
            progress,
        }
    }

    /// Bytes of file data written.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Opens the directory holding `parts`' last component, creating missing parents (as tar
    /// does, mode 0755) when `create`.
    fn parent(&self, parts: &[Vec<u8>], shown: &str, create: bool) -> Result<OwnedFd> {
        let dup = |fd: &OwnedFd| {
            fd.try_clone().map_err(|e| {
                ArchiveError::io(format!("duplicating the descriptor of {}", self.target), e)
            })
        };
        let mut dir = dup(&self.root)?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        for (i, name) in parts[..parts.len().saturating_sub(1)].iter().enumerate() {
            let next = match openat(&dir, name.as_slice(), flags, Mode::empty()) {
                Err(Errno::ENOENT) if create => {
                    match mkdirat(&dir, name.as_slice(), Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => {
                            return Err(errno_io(
                                format!("creating directory {}", display(&parts[..=i])),
                                e,
                            ));
                        }
                    }
                    openat(&dir, name.as_slice(), flags, Mode::empty())
                }
                other => other,
            };
            dir = match next {
                Ok(fd) => fd,
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    let link = fstatat(&dir, name.as_slice(), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| {
                            SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK
                        });
                    let why = if link {
                        format!(
                            "it would be written through the symbolic link {}",
                            display(&parts[..=i])
                        )
                    } else {
                        format!("its parent {} is not a directory", display(&parts[..=i]))
                    };
                    return Err(ArchiveError::refused(shown, why));
                }
                Err(Errno::ENOENT) => {
                    return Err(ArchiveError::malformed(
                        shown,
                        format!("{} does not exist in the archive", display(&parts[..=i])),
                    ));
                }
                Err(e) => {
                    return Err(errno_io(
                        format!("opening directory {}", display(&parts[..=i])),
                        e,
                    ));
                }
            };
        }
        Ok(dir)
    }

    /// Removes what is at `name` so a new entry can take its place; a directory stays (and
    /// `Ok(true)` says so) for a directory entry, and refuses any other.
    fn clear(&self, dir: &OwnedFd, name: &[u8], shown: &str, for_dir: bool) -> Result<bool> {
        let st = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(errno_io(format!("inspecting {shown}"), e)),
            Ok(st) => st,
        };
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            if for_dir {
                return Ok(true);
            }
            return Err(ArchiveError::refused(
                shown,
                "it would replace a directory the archive created",
            ));
        }
        unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| errno_io(format!("replacing {shown}"), e))?;
        Ok(false)
    }

    /// Ownership, mode and time of an open file or directory.
    fn apply(&self, fd: impl AsFd + Copy, meta: &Meta, shown: &str) -> Result<()> {
        if self.chown {
            fchown(
                fd,
                Some(Uid::from_raw(meta.uid as u32)),
                Some(Gid::from_raw(meta.gid as u32)),
            )
            .map_err(|e| errno_io(format!("setting the owner of {shown}"), e))?;
        }
        nix::sys::stat::fchmod(fd, Mode::from_bits_truncate((meta.mode & 0o7777) as _))
            .map_err(|e| errno_io(format!("setting the mode of {shown}"), e))?;
        let t = mtime(meta);
        futimens(fd, &t, &t).map_err(|e| errno_io(format!("setting the time of {shown}"), e))
    }

    fn last(parts: &[Vec<u8>]) -> &[u8] {
        parts.last().map(Vec::as_slice).unwrap_or(b".")
    }

    /// A directory; its mode, owner and time are applied by [`Tree::finish`].
    pub fn directory(&mut self, parts: Parts, meta: Meta, shown: &str) -> Result<()> {
        let dir = self.parent(&parts, shown, true)?;
        let name = Self::last(&parts);
        if !self.clear(&dir, name, shown, true)? {
            mkdirat(&dir, name, Mode::from_bits_truncate(0o700))
                .map_err(|e| errno_io(format!("creating directory {shown}"), e))?;
        }
        self.counts.directories += 1;
        self.dirs.push((parts, meta));
        Ok(())
    }

    /// A regular file laid out as `layout` says, its stored bytes read from `data`.
    pub fn file(
        &mut self,
        parts: &[Vec<u8>],
        meta: Meta,
        layout: &Layout,
        data: &mut dyn Read,
        shown: &str,
    ) -> Result<()> {
        let dir = self.parent(parts, shown, true)?;
        let name = Self::last(parts);
        self.clear(&dir, name, shown, false)?;
        let fd = openat(
            &dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| errno_io(format!("creating {shown}"), e))?;
        let file = File::from(fd);
        // Sized first: a file larger than the filesystem takes is refused before its data.
        file.set_len(layout.size).map_err(|e| {
            if e.raw_os_error() != Some(libc::EFBIG) {
                return ArchiveError::io(format!("sizing {shown}"), e);
            }
            ArchiveError::TooLarge {
                needed: layout.size,
                available: self.limit.as_ref().map_or(0, |l| l.0),
                target: self.target.clone(),
                detail: format!(
                    "{shown} is {} bytes, more than its filesystem takes in one file",
                    layout.size
                ),
            }
        })?;
        let mut buf = vec![0u8; CHUNK];
        for &(offset, len) in &layout.regions {
            let mut done = 0u64;
            while done < len {
                let want = (len - done).min(CHUNK as u64) as usize;
                data.read_exact(&mut buf[..want])
                    .map_err(|e| ArchiveError::reading(e, Some(shown)))?;
                self.write(&file, offset + done, &buf[..want], shown)?;
                done += want as u64;
                self.progress
                    .written
                    .fetch_add(want as u64, Ordering::Relaxed);
            }
        }
        self.apply(&file, &meta, shown)?;
        self.counts.files += 1;
        Ok(())
    }

    /// Writes the non-zero runs of `data` at `offset`, within the volume's limit.
    fn write(&mut self, file: &File, offset: u64, data: &[u8], shown: &str) -> Result<()> {
        let mut outcome = Ok(());
        let _ = for_each_run(data, |start, end, zero| {
            if zero || outcome.is_err() {
                return Ok(());
            }
            let len = (end - start) as u64;
            if let Some((limit, detail)) = &self.limit
                && self.used + len > *limit
            {
                outcome = Err(ArchiveError::TooLarge {
                    needed: self.used + len,
                    available: *limit,
                    target: self.target.clone(),
                    detail: format!("{detail}; reached while writing {shown}"),
                });
                return Ok(());
            }
            outcome = file
                .write_all_at(&data[start..end], offset + start as u64)
                .map_err(|e| ArchiveError::io(format!("writing {shown}"), e));
            self.used += len;
            self.progress.data_written.fetch_add(len, Ordering::Relaxed);
            Ok(())
        });
        outcome
    }

    /// A symbolic link to `target`, checked to point inside the volume.
    pub fn symlink(
        &mut self,
        parts: &[Vec<u8>],
        target: &[u8],
        meta: Meta,
        shown: &str,
    ) -> Result<()> {
        check_symlink_target(parts, target, shown)?;
        let dir = self.parent(parts, shown, true)?;
        let name = Self::last(parts);
        self.clear(&dir, name, shown, false)?;
        symlinkat(target, &dir, name)
            .map_err(|e| errno_io(format!("creating symbolic link {shown}"), e))?;
        if self.chown {
            fchownat(
                &dir,
                name,
                Some(Uid::from_raw(meta.uid as u32)),
                Some(Gid::from_raw(meta.gid as u32)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| errno_io(format!("setting the owner of {shown}"), e))?;
        }
        let t = mtime(&meta);
        utimensat(&dir, name, &t, &t, UtimensatFlags::NoFollowSymlink)
            .map_err(|e| errno_io(format!("setting the time of {shown}"), e))?;
        self.counts.symlinks += 1;
        Ok(())
    }

    /// A hard link to `source`, a regular file this archive already extracted.
    pub fn hard_link(&mut self, parts: &[Vec<u8>], source: &[Vec<u8>], shown: &str) -> Result<()> {
        if source.is_empty() {
            return Err(ArchiveError::refused(
                shown,
                "a hard link to the extraction directory itself",
            ));
        }
        let from_dir = self.parent(source, shown, false)?;
        let from = Self::last(source);
        let what = display(source);
        match fstatat(&from_dir, from, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG => {}
            Ok(_) => {
                return Err(ArchiveError::refused(
                    shown,
                    format!("a hard link to {what}, which is not a regular file"),
                ));
            }
            Err(Errno::ENOENT) => {
                return Err(ArchiveError::malformed(
                    shown,
                    format!("a hard link to {what}, which the archive has not extracted"),
                ));
            }
            Err(e) => return Err(errno_io(format!("inspecting {what}"), e)),
        }
        let dir = self.parent(parts, shown, true)?;
        let name = Self::last(parts);
        if parts == source {
            return Ok(()); // a link to itself: it is already there
        }
        self.clear(&dir, name, shown, false)?;
        linkat(&from_dir, from, &dir, name, AtFlags::empty())
            .map_err(|e| errno_io(format!("linking {shown} to {what}"), e))?;
        self.counts.hard_links += 1;
        Ok(())
    }

    /// Applies the directories' modes, owners and times, deepest first; returns the root.
    pub fn finish(mut self) -> Result<(OwnedFd, Counts, u64)> {
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by_key(|(parts, _)| std::cmp::Reverse(parts.len()));
        for (parts, meta) in &dirs {
            let shown = display(parts);
            let parent = self.parent(parts, &shown, false)?;
            let fd = openat(
                &parent,
                Self::last(parts),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| errno_io(format!("opening directory {shown}"), e))?;
            self.apply(&fd, meta, &shown)?;
        }
        Ok((self.root, self.counts, self.used))
    }
}

/// Whether entries get the archive's owners: only root may give files away.
pub fn keeps_owners() -> bool {
    nix::unistd::geteuid().is_root()
}

fn mtime(meta: &Meta) -> TimeSpec {
    TimeSpec::new(i64::try_from(meta.mtime).unwrap_or(i64::MAX) as _, 0)
}
