//! Format readers: turn a decoded image stream into guest extents.
//!
//! [`detect`] names the format from the first bytes; each reader parses its header when it is built
//! (so the virtual size is known before anything is written) and then streams the image into an
//! [`ExtentSink`](crate::sink::ExtentSink).

use std::path::PathBuf;

pub mod blocks;
pub mod cost;
pub(crate) mod fields;
pub(crate) mod hold;
pub mod inflate_pool;
pub mod qcow2;
pub mod raw;
pub mod vdi;
pub mod vhdx;
pub mod vmdk;
pub mod vpc;

pub use crate::error::{FormatError, FormatFault};
use crate::error::Result;
use crate::sink::ExtentSink;

/// The container format of a (decoded) disk image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    Raw,
    Qcow2,
    Vmdk,
    Vhdx,
    Vpc,
    Vdi,
    /// qemu's formats that Quarry recognises only to refuse them by name: writing their bytes out
    /// as raw would give a wrong disk that looks right.
    Qed,
    Parallels,
    Luks,
    Cloop,
    Dmg,
    Bochs,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
            ImageFormat::Vmdk => "vmdk",
            ImageFormat::Vhdx => "vhdx",
            ImageFormat::Vpc => "vpc",
            ImageFormat::Vdi => "vdi",
            ImageFormat::Qed => "qed",
            ImageFormat::Parallels => "parallels",
            ImageFormat::Luks => "luks",
            ImageFormat::Cloop => "cloop",
            ImageFormat::Dmg => "dmg",
            ImageFormat::Bochs => "bochs",
        }
    }
}

/// Tuning shared by all readers.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// Where a streaming reader may spill data that arrives before its place is known
    /// (beside the target, so it never needs space elsewhere).
    pub spill_dir: PathBuf,
    /// How many bytes of such data a reader may hold in memory before spilling.
    pub memory_budget: usize,
    /// How far a streaming reader reads ahead: a raw copy's read size, the qcow2 read window past
    /// its position. Each write is at most this large.
    pub read_ahead: usize,
}

/// The default [`ReaderOptions::read_ahead`]: large, so each write is large.
pub const READ_AHEAD: usize = 2 << 20;

/// Most that readers copying a stream straight to the sink (raw, vhdx payload) read at once:
/// small enough that the bytes are still in the CPU cache when the sink scans them for zeroes
/// and copies them out; the file sink gathers consecutive writes into large ones anyway.
pub const COPY_READ: usize = 256 << 10;

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            spill_dir: std::env::temp_dir(),
            memory_budget: 32 << 20,
            read_ahead: READ_AHEAD,
        }
    }
}

/// A parsed image, ready to stream its guest disk into a sink.
pub trait FormatReader: Send {
    fn format(&self) -> ImageFormat;
    /// The guest disk size, when the format states it up front (None for a raw stream of unknown length).
    fn virtual_size(&self) -> Option<u64>;
    /// Streams the whole guest disk into `sink`; returns the virtual size.
    fn copy_to(self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64>;
}

/// Names the image format from the first bytes of the decoded stream, with the magic numbers
/// qemu's block drivers probe for. Anything unrecognised (including ISO 9660 images) is raw, as
/// for qemu-img.
pub fn detect(head: &[u8]) -> ImageFormat {
    /// cloop's header is a shell script; qemu compares the whole of it.
    const CLOOP_V2: &[u8] =
        b"#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n";
    let le32_at = |at: usize| {
        head.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if head.starts_with(b"QFI\xfb") {
        ImageFormat::Qcow2
    } else if head.starts_with(b"KDMV")
        || head.starts_with(b"COWD")
        || head.starts_with(b"# Disk DescriptorFile")
    {
        ImageFormat::Vmdk
    } else if head.starts_with(b"vhdxfile") {
        ImageFormat::Vhdx
    } else if head.starts_with(b"conectix") {
        ImageFormat::Vpc
    } else if le32_at(0x40) == Some(0xbeda_107f) {
        ImageFormat::Vdi
    } else if head.starts_with(b"QED\0") {
        ImageFormat::Qed
    } else if (head.starts_with(b"WithoutFreeSpace") || head.starts_with(b"WithouFreSpacExt"))
        && le32_at(16) == Some(2)
    {
        ImageFormat::Parallels
    } else if head.starts_with(b"LUKS\xba\xbe") {
        ImageFormat::Luks
    } else if head.starts_with(CLOOP_V2) {
        ImageFormat::Cloop
    } else if head.starts_with(b"Bochs Virtual HD Image\0")
        && head.get(32..40) == Some(b"Redolog\0")
        && head.get(48..56) == Some(b"Growing\0")
        && matches!(le32_at(64), Some(0x0001_0000 | 0x0002_0000))
    {
        ImageFormat::Bochs
    } else {
        ImageFormat::Raw
    }
}

/// [`detect`], and then the source's name for the one format qemu probes by name alone: an Apple
/// disk image (`.dmg`, its `koly` trailer is at the end, out of a stream's reach). Compression
/// suffixes are looked through (`x.dmg.gz`).
pub fn detect_named(head: &[u8], name: &str) -> ImageFormat {
    let format = detect(head);
    if format != ImageFormat::Raw {
        return format;
    }
    let mut name = name.to_ascii_lowercase();
    while let Some(stem) = [".gz", ".xz", ".zst", ".gzip"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext))
    {
        name = stem.to_string();
    }
    if name.ends_with(".dmg") {
        ImageFormat::Dmg
    } else if name.ends_with("-ctk.vmdk") {
        // A changeTracking file (no magic of its own): the vmdk reader refuses it by name.
        ImageFormat::Vmdk
    } else {
        format
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qcow2_magic() {
        assert_eq!(detect(b"QFI\xfb\0\0\0\x03"), ImageFormat::Qcow2);
    }

    #[test]
    fn other_formats_are_named() {
        assert_eq!(detect(b"KDMV\x01\0\0\0"), ImageFormat::Vmdk);
        assert_eq!(detect(b"vhdxfile"), ImageFormat::Vhdx);
        assert_eq!(detect(b"conectix\0\0"), ImageFormat::Vpc);
        let mut vdi = vec![0u8; 0x50];
        vdi[0x40..0x44].copy_from_slice(&0xbeda107fu32.to_le_bytes());
        assert_eq!(detect(&vdi), ImageFormat::Vdi);
    }

    /// One head per format qemu probes and Quarry refuses, built as qemu's probe reads it.
    fn refused_heads() -> Vec<(ImageFormat, Vec<u8>)> {
        let with = |mut head: Vec<u8>, at: usize, bytes: &[u8]| {
            if head.len() < at + bytes.len() {
                head.resize(at + bytes.len(), 0);
            }
            head[at..at + bytes.len()].copy_from_slice(bytes);
            head
        };
        let parallels = with(b"WithoutFreeSpace".to_vec(), 16, &2u32.to_le_bytes());
        let parallels_ext = with(b"WithouFreSpacExt".to_vec(), 16, &2u32.to_le_bytes());
        let bochs = with(
            with(
                with(b"Bochs Virtual HD Image\0".to_vec(), 32, b"Redolog\0"),
                48,
                b"Growing\0",
            ),
            64,
            &0x0002_0000u32.to_le_bytes(),
        );
        let cloop = b"#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n"
            .to_vec();
        vec![
            (ImageFormat::Qed, b"QED\0\0\0\x01\0".to_vec()),
            (ImageFormat::Parallels, parallels),
            (ImageFormat::Parallels, parallels_ext),
            (ImageFormat::Luks, b"LUKS\xba\xbe\0\x01".to_vec()),
            (ImageFormat::Cloop, cloop),
            (ImageFormat::Bochs, bochs),
            (ImageFormat::Vmdk, b"COWD\x01\0\0\0".to_vec()),
        ]
    }

    #[test]
    fn every_format_qemu_probes_is_named() {
        for (format, head) in refused_heads() {
            assert_eq!(detect(&head), format, "{head:?}");
        }
    }

    #[test]
    fn a_probe_needs_its_whole_signature() {
        // qemu checks the version field too: a Parallels magic with version 3, or a Bochs header
        // of another type, is no such image.
        for (format, mut head) in refused_heads() {
            match format {
                ImageFormat::Parallels => head[16] = 3,
                ImageFormat::Bochs => head[32] = b'X',
                ImageFormat::Cloop => head.truncate(head.len() - 1),
                _ => continue,
            }
            assert_eq!(detect(&head), ImageFormat::Raw, "{format:?}");
        }
    }

    #[test]
    fn dmg_is_named_by_its_file_name_only() {
        let head = [0u8; 512];
        assert_eq!(detect_named(&head, "macos.dmg"), ImageFormat::Dmg);
        assert_eq!(detect_named(&head, "MacOS.DMG.gz"), ImageFormat::Dmg);
        assert_eq!(detect_named(&head, "x.dmg.zst.xz"), ImageFormat::Dmg);
        assert_eq!(detect_named(&head, "dmg.img"), ImageFormat::Raw);
        // Magic wins over the name.
        assert_eq!(
            detect_named(b"QFI\xfb\0\0\0\x03", "x.dmg"),
            ImageFormat::Qcow2
        );
    }

    #[test]
    fn unknown_and_short_heads_are_raw() {
        assert_eq!(detect(b""), ImageFormat::Raw);
        assert_eq!(detect(b"QFI"), ImageFormat::Raw);
        assert_eq!(detect(&[0u8; 512]), ImageFormat::Raw);
        let mut iso = vec![0u8; 512];
        iso[1..6].copy_from_slice(b"CD001");
        assert_eq!(detect(&iso), ImageFormat::Raw);
    }
}

#[cfg(test)]
mod fault_tests {
    use crate::error::{Error, ErrorKind};
    use crate::format::vpc::VpcError;

    #[test]
    fn a_fault_keeps_its_type_offset_and_kind() {
        let e = Error::from(VpcError::NoDynamicHeader { offset: 0x200 });
        assert_eq!(e.kind(), ErrorKind::CorruptImage);
        assert_eq!(
            e.to_string(),
            "corrupt image: vhd: dynamic disk header at 0x200: no \"cxsparse\" magic"
        );
        let Error::Format(f) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(f.offset(), Some(0x200));
        assert_eq!(
            f.fault::<VpcError>(),
            Some(&VpcError::NoDynamicHeader { offset: 0x200 })
        );
        assert!(std::error::Error::source(&e).is_none());
        let refused = Error::from(VpcError::Differencing { offset: 0 });
        assert_eq!(refused.kind(), ErrorKind::Unsupported);
        assert!(refused.to_string().starts_with("unsupported image: vhd: "));
    }
}
