//! OVA: a tar holding an OVF descriptor and its disks, imported as one of its disks.
//!
//! The disk is chosen by the descriptor, not by the tar order: the first disk of its
//! `<DiskSection>` (through `<References>`), or the one `--disk N|NAME` names (N counts from 1 in
//! that order; NAME is the file's `ovf:href` or the disk's `ovf:diskId`). The OVA is read in one
//! pass, as a containerDisk's layers are: a `quarry-ova` thread walks the tar, reads the
//! descriptor, skips the members before the chosen disk and streams the disk's bytes straight
//! into the import (no scratch copy), then reads the rest of the stream so a checksum covers it.
//! The disk then goes through the pipeline like any source: compression layers (an
//! `ovf:compression="gzip"` file included) and format detection.
//!
//! The descriptor must be the archive's first member, as the OVF specification requires of an
//! OVA (VMware and VirtualBox write it so): an OVA whose descriptor comes later is refused,
//! saying so, rather than held or spilled.
//!
//! An OVA is recognised by its content: a tar (`ustar` magic) whose first member is a `.ovf`, or
//! a tar whose source is named `.ova` (compression suffixes looked through), so that an OVA with
//! its descriptor elsewhere is refused by name instead of imported as a raw disk.

pub mod ovf;

use std::io::Read;
use std::sync::mpsc::sync_channel;

use crate::chunks::{self, ChunkReader};
use crate::decode::BoxRead;
use crate::error::{Error, Result};
use crate::source::registry::layer::normalize;
use crate::source::registry::{WalkOut, tar_error};
use ovf::OvfDisk;

/// Descriptors larger than this are refused (real ones are a few KiB).
const MAX_OVF: u64 = 16 << 20;
/// Chunks in flight between the tar walk and the import.
const DEPTH: usize = 16;

/// Which disk of an OVA to import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskChoice {
    /// The Nth disk in the descriptor's order, from 1.
    Index(usize),
    /// The disk whose file (`ovf:href`) or id (`ovf:diskId`) this is.
    Name(String),
}

impl std::str::FromStr for DiskChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.parse::<usize>() {
            Ok(0) => Err(Error::InvalidInput(
                "--disk counts from 1 (the descriptor's first disk)".into(),
            )),
            Ok(n) => Ok(DiskChoice::Index(n)),
            Err(_) if s.is_empty() => Err(Error::InvalidInput("--disk is empty".into())),
            Err(_) => Ok(DiskChoice::Name(s.to_string())),
        }
    }
}

/// The disk an OVA import reads.
#[derive(Debug, Clone)]
pub struct OvaDisk {
    pub disk: OvfDisk,
    /// Its place in the descriptor's order, from 1, and how many disks there are.
    pub index: usize,
    pub count: usize,
    /// Its size in the archive.
    pub size: u64,
}

/// The name of the first member of the tar whose first block is `head`, when it is a tar.
fn first_member(head: &[u8]) -> Option<&[u8]> {
    if head.len() < 512 || &head[257..262] != b"ustar" {
        return None;
    }
    let name = &head[..100];
    Some(&name[..name.iter().position(|&b| b == 0).unwrap_or(100)])
}

/// Whether a (decoded) stream starting with `head`, from a source named `name`, is an OVA.
pub fn is_ova(head: &[u8], name: &str) -> bool {
    let Some(first) = first_member(head) else {
        return false;
    };
    if String::from_utf8_lossy(first)
        .to_ascii_lowercase()
        .ends_with(".ovf")
    {
        return true;
    }
    let name = name.to_ascii_lowercase();
    let name = name.split(['?', '#']).next().unwrap_or_default();
    let bare = [".gz", ".xz", ".zst"]
        .iter()
        .fold(name, |n, suffix| n.strip_suffix(suffix).unwrap_or(n));
    bare.ends_with(".ova")
}

/// Picks the disk `choice` names (the first without one).
pub fn choose(disks: &[OvfDisk], choice: Option<&DiskChoice>) -> Result<(usize, OvfDisk)> {
    let listed = || {
        disks
            .iter()
            .enumerate()
            .map(|(i, d)| format!("{} {} ({})", i + 1, d.href, d.id))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let found = match choice {
        None => Some(0),
        Some(DiskChoice::Index(n)) => (*n <= disks.len()).then(|| n - 1),
        Some(DiskChoice::Name(name)) => disks.iter().position(|d| &d.href == name || &d.id == name),
    };
    match found {
        Some(i) => Ok((i + 1, disks[i].clone())),
        None => Err(Error::InvalidInput(format!(
            "--disk {}: the OVA's disks are {}",
            match choice {
                Some(DiskChoice::Index(n)) => n.to_string(),
                Some(DiskChoice::Name(n)) => n.clone(),
                None => String::new(),
            },
            listed()
        ))),
    }
}

/// Opens the chosen disk of the OVA `stream` (see the module docs): fails before anything is
/// written when the descriptor is missing, not first, or does not name the disk.
pub fn open_disk(
    stream: BoxRead,
    choice: Option<DiskChoice>,
    source_name: &str,
) -> Result<(ChunkReader, OvaDisk)> {
    let what = format!("OVA {source_name}");
    let (chunk_tx, chunks) = chunks::channel(
        DEPTH,
        format!("{what}: the tar walk ended before the disk was complete"),
    );
    let (found_tx, found_rx) = sync_channel(1);
    let (chosen_tx, chosen_rx) = sync_channel(1);
    let thread_what = what.clone();
    std::thread::Builder::new()
        .name("quarry-ova".into())
        .spawn(move || {
            let mut out = WalkOut::new(found_tx, chunk_tx);
            let outcome = walk(stream, choice.as_ref(), &mut out, &chosen_tx, &thread_what);
            out.finish(outcome);
        })
        .map_err(|e| Error::io("spawning the OVA thread", e))?;
    match found_rx.recv() {
        Ok(Ok((href, size))) => {
            let (index, count, disk) = chosen_rx.recv().map_err(|_| {
                Error::SourceUnavailable(format!("{what}: the tar walk ended without an answer"))
            })?;
            tracing::info!(ova = %source_name, disk = %href, index, count, size, "importing the OVA's disk");
            Ok((
                chunks,
                OvaDisk {
                    disk,
                    index,
                    count,
                    size,
                },
            ))
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::SourceUnavailable(format!(
            "{what}: the tar walk ended without an answer"
        ))),
    }
}

type Chosen = (usize, usize, OvfDisk);

fn walk(
    stream: BoxRead,
    choice: Option<&DiskChoice>,
    out: &mut WalkOut,
    chosen_tx: &std::sync::mpsc::SyncSender<Chosen>,
    what: &str,
) -> Result<()> {
    let mut archive = tar::Archive::new(stream);
    {
        let mut entries = archive.entries().map_err(|e| tar_error(e, what))?;
        let first = entries
            .next()
            .ok_or_else(|| Error::Corrupt(format!("{what}: an empty tar")))?;
        let mut first = first.map_err(|e| tar_error(e, what))?;
        let path = normalize(&first.path_bytes())?;
        if !path.to_ascii_lowercase().ends_with(".ovf") {
            return Err(Error::Unsupported(format!(
                "{what}: its first member is {path}, not the OVF descriptor: an OVA is read in one \
                 pass and needs its .ovf first (as the OVF specification requires); repack it with \
                 the .ovf first"
            )));
        }
        if first.size() > MAX_OVF {
            return Err(Error::Unsupported(format!(
                "{what}: the OVF descriptor {path} is {} bytes (more than {MAX_OVF})",
                first.size()
            )));
        }
        let mut xml = String::new();
        first
            .read_to_string(&mut xml)
            .map_err(|e| tar_error(e, what))?;
        let disks = ovf::disks(&xml).map_err(|e| match e {
            Error::Corrupt(m) => Error::Corrupt(format!("{what}: {m}")),
            Error::Unsupported(m) => Error::Unsupported(format!("{what}: {m}")),
            other => other,
        })?;
        let (index, disk) = choose(&disks, choice)?;
        let mut streamed = false;
        for entry in entries {
            let mut entry = entry.map_err(|e| tar_error(e, what))?;
            let path = normalize(&entry.path_bytes())?;
            if streamed || path != normalize(disk.href.as_bytes())? {
                continue;
            }
            let kind = entry.header().entry_type();
            if !(kind.is_file() || kind.is_gnu_sparse() || kind.is_contiguous()) {
                return Err(Error::Unsupported(format!(
                    "{what}: the disk {path} is not a regular file ({kind:?})"
                )));
            }
            let _ = chosen_tx.send((index, disks.len(), disk.clone()));
            out.stream_file(path, entry.size(), &mut entry, what)?;
            streamed = true;
        }
        if !streamed {
            return Err(Error::Corrupt(format!(
                "{what}: the descriptor's disk {} is not in the archive",
                disk.href
            )));
        }
    }
    let mut rest = archive.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(|e| tar_error(e, what))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(id: &str, href: &str) -> OvfDisk {
        OvfDisk {
            id: id.into(),
            href: href.into(),
            compression: None,
        }
    }

    #[test]
    fn a_disk_is_chosen_by_number_or_name() {
        let disks = [disk("d1", "a.vmdk"), disk("d2", "b.vmdk")];
        assert_eq!(choose(&disks, None).unwrap().1.href, "a.vmdk");
        let two = "2".parse::<DiskChoice>().unwrap();
        assert_eq!(choose(&disks, Some(&two)).unwrap(), (2, disks[1].clone()));
        let by_href = "b.vmdk".parse().unwrap();
        assert_eq!(choose(&disks, Some(&by_href)).unwrap().0, 2);
        let by_id = "d1".parse().unwrap();
        assert_eq!(choose(&disks, Some(&by_id)).unwrap().0, 1);
        let e = choose(&disks, Some(&DiskChoice::Index(3))).unwrap_err();
        assert!(
            e.to_string().contains("1 a.vmdk (d1), 2 b.vmdk (d2)"),
            "{e}"
        );
        assert!("0".parse::<DiskChoice>().is_err());
    }

    #[test]
    fn an_ova_is_known_by_its_first_member() {
        let mut head = vec![0u8; 512];
        head[..6].copy_from_slice(b"vm.ovf");
        head[257..262].copy_from_slice(b"ustar");
        assert!(is_ova(&head, "x"));
        head[..6].copy_from_slice(b"vm.txt");
        assert!(!is_ova(&head, "x.tar"));
        assert!(is_ova(&head, "http://h/export.OVA.gz?sig=1"));
        assert!(!is_ova(&[0u8; 512], "x.ova"));
    }
}
