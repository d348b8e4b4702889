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
//! The OVF specification puts the descriptor first (VMware and VirtualBox write it so), but other
//! tools do not always. A local uncompressed file is read by seeking from header to header to
//! find its descriptor wherever it is, then streamed as above. A stream whose descriptor comes
//! later holds the regular members before it (any of them may be the disk): in memory up to
//! `--memory-budget`, then in a spill file beside the target, as a stream's early qcow2 data is;
//! once the descriptor has chosen, the held disk is streamed and the rest dropped.
//!
//! An OVA is recognised by its content: a tar (`ustar` magic) whose first member is a `.ovf`, or
//! another part of an OVF package (a manifest, a certificate, a vmdk, vhd, vhdx, vdi or qcow2
//! disk: the descriptor comes later), or a tar whose source is named `.ova` (compression suffixes
//! looked through): [`crate::format::detect::is_ova`].

pub mod ovf;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;

use crate::archive::sparse::{self, Expand};
use crate::chunks::ChunkReader;
use crate::decode::{BoxRead, Compression};
use crate::error::{Error, Result};
use crate::format::hold::HeldBytes;
use crate::pipe::read_full;
use crate::tarwalk::{self, CHUNK, WalkOut, normalize, tar_error};
use ovf::OvfDisk;

/// Descriptors larger than this are refused (real ones are a few KiB).
const MAX_OVF: u64 = 16 << 20;

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

impl OvaDisk {
    /// Checks the compression layers found on the disk's bytes against its descriptor: a disk
    /// said to be gzip-compressed (`ovf:compression="gzip"`) that is not would otherwise be read
    /// as an image as it is.
    pub fn check_layers(&self, layers: &[Compression], source_name: &str) -> Result<()> {
        if self.disk.compression.as_deref() == Some("gzip")
            && layers.first() != Some(&Compression::Gzip)
        {
            return Err(Error::Corrupt(format!(
                "OVA {source_name}: the descriptor says the disk {} is gzip-compressed \
                 (ovf:compression=\"gzip\"), and its bytes are not gzip",
                self.disk.href
            )));
        }
        Ok(())
    }
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

/// How an OVA is read, besides its stream.
#[derive(Debug, Clone, Default)]
pub struct OvaOptions {
    /// Which disk (the descriptor's first without one).
    pub choice: Option<DiskChoice>,
    /// The OVA as a local uncompressed file: its descriptor is found by seeking, wherever it is.
    pub local: Option<PathBuf>,
    /// Disks that come before the descriptor in a stream are held in this much memory, then in
    /// a spill file in `spill_dir`.
    pub memory_budget: usize,
    pub spill_dir: PathBuf,
}

/// Opens the chosen disk of the OVA `stream` (see the module docs): fails before anything is
/// written when the descriptor is missing or does not name the disk.
pub fn open_disk(
    stream: BoxRead,
    opts: OvaOptions,
    source_name: &str,
) -> Result<(ChunkReader, OvaDisk)> {
    let what = format!("OVA {source_name}");
    let (chosen_tx, chosen_rx) = sync_channel(1);
    let walk_what = what.clone();
    let (chunks, href, size) =
        tarwalk::spawn("OVA", &format!("{what}: the tar walk"), move |out| {
            walk(stream, &opts, out, &chosen_tx, &walk_what)
        })?;
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

type Chosen = (usize, usize, OvfDisk);

/// The descriptor's disks and the one chosen.
struct Plan {
    chosen: Chosen,
    /// The chosen disk's member name, normalized.
    member: String,
}

impl Plan {
    /// The plan the descriptor `xml`, the member `descriptor`, gives.
    fn new(xml: &str, descriptor: &str, choice: Option<&DiskChoice>, what: &str) -> Result<Plan> {
        let disks = ovf::disks(xml).map_err(|e| match e {
            Error::Corrupt(m) => Error::Corrupt(format!("{what}: {m}")),
            Error::Unsupported(m) => Error::Unsupported(format!("{what}: {m}")),
            other => other,
        })?;
        let (index, disk) = choose(&disks, choice)?;
        if let Some(chunk) = &disk.chunk_size {
            return Err(Error::Unsupported(format!(
                "{what}: the disk {} is split into chunks (ovf:chunkSize=\"{chunk}\"), which \
                 Quarry does not join; export the OVA without chunking",
                disk.href
            )));
        }
        match disk.compression.as_deref() {
            None | Some("identity" | "gzip") => {}
            Some(other) => {
                return Err(Error::Unsupported(format!(
                    "{what}: the disk {} is compressed as {other:?} (ovf:compression); only \
                     gzip is defined for OVF",
                    disk.href
                )));
            }
        }
        let member = normalize(disk.href.as_bytes())?;
        if member == descriptor {
            return Err(Error::Corrupt(format!(
                "{what}: the descriptor names itself ({}) as the disk",
                disk.href
            )));
        }
        Ok(Plan {
            chosen: (index, disks.len(), disk),
            member,
        })
    }
}

fn is_descriptor(path: &str) -> bool {
    path.to_ascii_lowercase().ends_with(".ovf")
}

/// Reads the descriptor member `path` (bounded by [`MAX_OVF`]).
fn read_descriptor(entry: &mut dyn Read, size: u64, path: &str, what: &str) -> Result<String> {
    if size > MAX_OVF {
        return Err(Error::Unsupported(format!(
            "{what}: the OVF descriptor {path} is {size} bytes (more than {MAX_OVF})"
        )));
    }
    let mut xml = String::new();
    entry
        .read_to_string(&mut xml)
        .map_err(|e| tar_error(e, what))?;
    Ok(xml)
}

/// The descriptor of the local tar file `path` and its member name, found by seeking from header
/// to header (all of them: a second descriptor is refused).
fn local_descriptor(path: &Path, what: &str) -> Result<Option<(String, String)>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(format!("opening {what}"), e))?;
    let mut archive = tar::Archive::new(file);
    let mut found: Option<(String, String)> = None;
    for entry in archive
        .entries_with_seek()
        .map_err(|e| tar_error(e, what))?
    {
        let mut entry = entry.map_err(|e| tar_error(e, what))?;
        let path = normalize(&entry.path_bytes())?;
        if is_descriptor(&path) {
            if let Some((first, _)) = &found {
                return Err(two_descriptors(what, first, &path));
            }
            let size = entry.size();
            let xml = read_descriptor(&mut entry, size, &path, what)?;
            found = Some((path, xml));
        }
    }
    Ok(found)
}

fn two_descriptors(what: &str, first: &str, second: &str) -> Error {
    Error::Corrupt(format!(
        "{what}: two OVF descriptors ({first} and {second}); an OVA holds one"
    ))
}

/// A member's name (a PAX sparse file's real one), size and bytes: a PAX sparse file (what GNU
/// tar's `--sparse --format=posix` writes for a disk with holes) reads whole, zeroes in its holes,
/// as an extracted archive's would.
fn member<'e, R: Read>(
    entry: &'e mut tar::Entry<'_, R>,
) -> Result<(String, u64, Box<dyn Read + 'e>)> {
    let records = sparse::pax_records(entry)?;
    let header_name = entry.path_bytes().into_owned();
    let shown = String::from_utf8_lossy(&header_name).into_owned();
    let Some(pax) = sparse::from_pax(&records, &shown)? else {
        let size = entry.size();
        return Ok((normalize(&header_name)?, size, Box::new(entry)));
    };
    let path = normalize(pax.name.as_deref().unwrap_or(&header_name))?;
    let stored = entry.size();
    let layout = sparse::layout(entry, stored, Some(pax), &shown)?;
    let size = layout.size;
    Ok((path, size, Box::new(Expand::new(entry, layout))))
}

fn two_members(what: &str, name: &str) -> Error {
    Error::Corrupt(format!(
        "{what}: two members named {name}, the disk the descriptor names; which one is meant is ambiguous"
    ))
}

fn no_descriptor(what: &str) -> Error {
    Error::Corrupt(format!(
        "{what}: the archive holds no OVF descriptor (.ovf member)"
    ))
}

/// The members a stream passes before its descriptor: each regular file is held (memory, then
/// a spill file), as any of them may be the disk the descriptor names.
struct Early {
    hold: HeldBytes,
    /// Each member's name, place in the hold and size.
    members: Vec<(String, u64, u64)>,
    end: u64,
}

impl Early {
    fn hold(&mut self, path: String, entry: &mut dyn Read, what: &str) -> Result<()> {
        let start = self.end;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = read_full(&mut &mut *entry, &mut buf).map_err(|e| tar_error(e, what))?;
            if n == 0 {
                break;
            }
            self.hold.add(self.end, &buf[..n])?;
            self.end += n as u64;
        }
        self.members.push((path, start, self.end - start));
        Ok(())
    }
}

/// Reads `[at, end)` back out of a hold.
struct HeldReader<'a> {
    hold: &'a HeldBytes,
    at: u64,
    end: u64,
    buf: Vec<u8>,
}

impl Read for HeldReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.end - self.at).min(out.len() as u64);
        if n == 0 {
            return Ok(0);
        }
        let held = self
            .hold
            .read(self.at, n, &mut self.buf)
            .map_err(Error::into_io)?;
        if !held {
            let missing = std::io::Error::other("a held member is missing from the hold");
            return Err(Error::io("reading an OVA member back", missing).into_io());
        }
        out[..n as usize].copy_from_slice(&self.buf);
        self.at += n;
        Ok(n as usize)
    }
}

fn walk(
    stream: BoxRead,
    opts: &OvaOptions,
    out: &mut WalkOut,
    chosen_tx: &std::sync::mpsc::SyncSender<Chosen>,
    what: &str,
) -> Result<()> {
    let choice = opts.choice.as_ref();
    let mut plan = match &opts.local {
        Some(path) => {
            let (name, xml) = local_descriptor(path, what)?.ok_or_else(|| no_descriptor(what))?;
            Some(Plan::new(&xml, &name, choice, what)?)
        }
        None => None,
    };
    let mut descriptor: Option<String> = None;
    let mut early = Early {
        hold: HeldBytes::new(opts.memory_budget, opts.spill_dir.clone()),
        members: Vec::new(),
        end: 0,
    };
    let mut streamed = false;
    let mut archive = tar::Archive::new(stream);
    for entry in archive.entries().map_err(|e| tar_error(e, what))? {
        let mut entry = entry.map_err(|e| tar_error(e, what))?;
        let kind = entry.header().entry_type();
        let regular = kind.is_file() || kind.is_gnu_sparse() || kind.is_contiguous();
        let (path, size, mut data) = member(&mut entry)?;
        if is_descriptor(&path) {
            if let Some(first) = &descriptor {
                return Err(two_descriptors(what, first, &path));
            }
            descriptor = Some(path.clone());
        }
        let Some(p) = &plan else {
            if is_descriptor(&path) {
                let xml = read_descriptor(&mut data, size, &path, what)?;
                let p = Plan::new(&xml, &path, choice, what)?;
                let mut held = early.members.iter().filter(|m| m.0 == p.member);
                if let Some((_, at, size)) = held.next() {
                    if held.next().is_some() {
                        return Err(two_members(what, &p.member));
                    }
                    tracing::info!(
                        held = early.hold.held_bytes,
                        spilled = early.hold.spilled_bytes,
                        "the OVA's descriptor came after its disk: streaming the held disk"
                    );
                    let _ = chosen_tx.send(p.chosen.clone());
                    let mut held = HeldReader {
                        hold: &early.hold,
                        at: *at,
                        end: at + size,
                        buf: Vec::new(),
                    };
                    out.stream_file(p.member.clone(), *size, &mut held, what)?;
                    streamed = true;
                }
                early.hold.clear();
                early.members.clear();
                plan = Some(p);
            } else if regular {
                early.hold(path, &mut data, what)?;
            }
            continue;
        };
        if path != p.member {
            continue;
        }
        if streamed {
            return Err(two_members(what, &path));
        }
        if !regular {
            return Err(Error::Unsupported(format!(
                "{what}: the disk {path} is not a regular file ({kind:?})"
            )));
        }
        let _ = chosen_tx.send(p.chosen.clone());
        out.stream_file(path, size, &mut data, what)?;
        streamed = true;
    }
    let Some(p) = plan else {
        return Err(no_descriptor(what));
    };
    if !streamed {
        return Err(Error::Corrupt(format!(
            "{what}: the descriptor's disk {} is not in the archive",
            p.chosen.2.href
        )));
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
            chunk_size: None,
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
}
