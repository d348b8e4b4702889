//! Copies for snapshots and clones: reflinks (FICLONE) where the filesystem shares extents,
//! sparse copies (SEEK_DATA / SEEK_HOLE, holes preserved) elsewhere.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::meta::CopyMethod;

fn ficlone(src: &File, dst: &File) -> io::Result<()> {
    // SAFETY: FICLONE takes the source fd as its argument.
    if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE as _, src.as_raw_fd()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether files in `dir` can be reflinked (probed with two small temp files).
pub fn reflink_supported(dir: &Path) -> bool {
    let a = dir.join(".reflink-probe-a");
    let b = dir.join(".reflink-probe-b");
    let res = (|| -> io::Result<()> {
        fs::write(&a, vec![0x5au8; 4096])?;
        let src = File::open(&a)?;
        let dst = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&b)?;
        ficlone(&src, &dst)
    })();
    let _ = fs::remove_file(&a);
    let _ = fs::remove_file(&b);
    res.is_ok()
}

/// Copies `src` to the new file `dst` keeping holes: only data extents are read and written.
pub fn copy_file_sparse(src: &File, dst: &File) -> io::Result<()> {
    let len = src.metadata()?.len();
    let fd = src.as_raw_fd();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos: i64 = 0;
    while (pos as u64) < len {
        // SAFETY: lseek on a valid fd.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut off = data as u64;
        while off < hole as u64 {
            let n = ((hole as u64 - off) as usize).min(buf.len());
            src.read_exact_at(&mut buf[..n], off)?;
            if buf[..n].iter().any(|b| *b != 0) {
                dst.write_all_at(&buf[..n], off)?;
            }
            off += n as u64;
        }
        pos = hole;
    }
    dst.set_len(len)?;
    Ok(())
}

fn copy_file(src: &Path, dst: &Path, method: CopyMethod) -> io::Result<()> {
    let s = File::open(src)?;
    let d = OpenOptions::new().write(true).create_new(true).open(dst)?;
    match method {
        CopyMethod::Reflink => ficlone(&s, &d)?,
        CopyMethod::Sparse => copy_file_sparse(&s, &d)?,
    }
    d.sync_all()
}

fn copy_attrs(src_md: &fs::Metadata, dst: &Path) -> io::Result<()> {
    fs::set_permissions(dst, fs::Permissions::from_mode(src_md.mode() & 0o7777))?;
    std::os::unix::fs::lchown(dst, Some(src_md.uid()), Some(src_md.gid()))
}

/// Copies the contents of directory `src` into the existing directory `dst` (files, directories,
/// symlinks; ownership and permissions kept), then applies `src`'s own owner and mode to `dst`.
pub fn copy_tree(src: &Path, dst: &Path, method: CopyMethod) -> io::Result<()> {
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let md = fs::symlink_metadata(&from)?;
        let ft = md.file_type();
        if ft.is_dir() {
            fs::create_dir(&to)?;
            copy_tree(&from, &to, method)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
            std::os::unix::fs::lchown(&to, Some(md.uid()), Some(md.gid()))?;
        } else if ft.is_file() {
            copy_file(&from, &to, method)?;
            copy_attrs(&md, &to)?;
        }
        // sockets, fifos and device nodes are not volume data: skipped
    }
    copy_attrs(&fs::metadata(src)?, dst)?;
    File::open(dst)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_copy_keeps_data_and_holes() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        let f = File::create(&src).unwrap();
        f.set_len(8 << 20).unwrap();
        f.write_all_at(b"hello", 1 << 20).unwrap();
        f.write_all_at(b"tail", (8 << 20) - 4).unwrap();
        drop(f);
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::rename(&src, d.path().join("a/disk.img")).unwrap();
        std::fs::create_dir(d.path().join("a/sub")).unwrap();
        std::os::unix::fs::symlink("disk.img", d.path().join("a/link")).unwrap();
        std::fs::create_dir(d.path().join("b")).unwrap();
        copy_tree(&d.path().join("a"), &d.path().join("b"), CopyMethod::Sparse).unwrap();
        let out = std::fs::read(d.path().join("b/disk.img")).unwrap();
        assert_eq!(out.len(), 8 << 20);
        assert_eq!(&out[1 << 20..(1 << 20) + 5], b"hello");
        assert_eq!(&out[out.len() - 4..], b"tail");
        let md = std::fs::metadata(d.path().join("b/disk.img")).unwrap();
        assert!(
            md.blocks() * 512 < 4 << 20,
            "copy is not sparse: {}",
            md.blocks()
        );
        assert!(d.path().join("b/sub").is_dir());
        assert_eq!(
            std::fs::read_link(d.path().join("b/link")).unwrap(),
            Path::new("disk.img")
        );
    }
}
