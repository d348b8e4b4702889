//! What a (decoded) stream is, from its first bytes and the source's name: a compression layer,
//! an OVA, or a disk image of a [`ImageFormat`]. Pure: no I/O, nothing but the bytes given.

use crate::decode::{self, Compression};
use crate::format::ImageFormat;
use crate::format::fields;

/// What a stream holds, as its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// A compression layer (to be peeled, then probed again).
    Compressed(Compression),
    /// An OVA: a tar holding an OVF descriptor and its disks.
    Ova,
    /// A disk image (raw when nothing else is recognised).
    Image(ImageFormat),
}

/// Names what a stream starting with `head`, from a source named `name`, holds: compression
/// first (its magic is unambiguous), then an OVA, then the image format ([`detect_named`]).
pub fn probe(head: &[u8], name: &str) -> Content {
    if let Some(compression) = decode::detect(head) {
        Content::Compressed(compression)
    } else if is_ova(head, name) {
        Content::Ova
    } else {
        Content::Image(detect_named(head, name))
    }
}

/// Names the image format from the first bytes of the decoded stream, with the magic numbers
/// qemu's block drivers probe for. Anything unrecognised (including ISO 9660 images) is raw, as
/// for qemu-img.
pub fn detect(head: &[u8]) -> ImageFormat {
    /// cloop's header is a shell script; qemu compares the whole of it.
    const CLOOP_V2: &[u8] =
        b"#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n";
    let le32_at = |at: usize| (head.len() >= at + 4).then(|| fields::le32(head, at));
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

/// What the first block of a tar says of its first member.
#[derive(Debug, PartialEq, Eq)]
enum FirstMember<'a> {
    /// Its name.
    Named(&'a [u8]),
    /// Its name is in an extension header's data, past the first block: a GNU long name (`L`),
    /// a PAX extended header (`x`) that does not show it, or a PAX global header (`g`).
    Hidden,
}

/// The first member of the tar whose first block is `head`, when it is a tar.
fn first_member(head: &[u8]) -> Option<FirstMember<'_>> {
    if head.len() < 512 || &head[257..262] != b"ustar" {
        return None;
    }
    let field = &head[..100];
    let name = &field[..field.iter().position(|&b| b == 0).unwrap_or(100)];
    match head[156] {
        b'L' | b'K' | b'g' => Some(FirstMember::Hidden),
        // GNU tar names a PAX header `DIR/PaxHeaders[.PID]/BASENAME` (cut at 100 bytes), Python
        // `././@PaxHeader`: only a whole base name after a `PaxHeaders` directory tells.
        b'x' => match name.rsplit(|&b| b == b'/').nth(1) {
            Some(dir) if dir.starts_with(b"PaxHeaders") && name.len() < 100 => {
                name.rsplit(|&b| b == b'/').next().map(FirstMember::Named)
            }
            _ => Some(FirstMember::Hidden),
        },
        _ => Some(FirstMember::Named(name)),
    }
}

/// The other parts of an OVF package: a tar that starts with one of them is an OVA whose
/// descriptor comes later (a tar holding a disk image is no raw disk, and a stream has no `.ova`
/// name to go by). A disk stored gzip-compressed keeps its name with `.gz` added.
const PACKAGE_PARTS: [&str; 7] = [".mf", ".cert", ".vmdk", ".vhd", ".vhdx", ".vdi", ".qcow2"];

/// Whether a (decoded) stream starting with `head`, from a source named `name`, is an OVA. A tar
/// whose first member's name is past the first block (a long name) is taken for one: it is no
/// raw disk either, and the walk says so when it holds no descriptor.
pub fn is_ova(head: &[u8], name: &str) -> bool {
    let first = match first_member(head) {
        None => return false,
        Some(FirstMember::Hidden) => return true,
        Some(FirstMember::Named(first)) => first,
    };
    let first = String::from_utf8_lossy(first).to_ascii_lowercase();
    let part = first.strip_suffix(".gz").unwrap_or(&first);
    if first.ends_with(".ovf") || PACKAGE_PARTS.iter().any(|p| part.ends_with(p)) {
        return true;
    }
    let name = name.to_ascii_lowercase();
    let name = name.split(['?', '#']).next().unwrap_or_default();
    let bare = [".gz", ".xz", ".zst"]
        .iter()
        .fold(name, |n, suffix| n.strip_suffix(suffix).unwrap_or(n));
    bare.ends_with(".ova")
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

    #[test]
    fn a_tar_that_starts_with_another_package_part_is_an_ova_whatever_its_name() {
        for first in [
            "disk1.vmdk",
            "VM.MF",
            "vm.cert",
            "d.vhdx",
            "d.qcow2",
            "disk1.vmdk.gz",
        ] {
            let mut head = vec![0u8; 512];
            head[..first.len()].copy_from_slice(first.as_bytes());
            head[257..262].copy_from_slice(b"ustar");
            assert!(is_ova(&head, "-"), "{first}");
        }
        for first in ["disk.img", "notes.txt", "vm.ovf.bak"] {
            let mut head = vec![0u8; 512];
            head[..first.len()].copy_from_slice(first.as_bytes());
            head[257..262].copy_from_slice(b"ustar");
            assert!(!is_ova(&head, "-"), "{first}");
        }
    }

    /// A tar's first block: an extension header of type `kind` named `name`.
    fn extension(kind: u8, name: &str) -> Vec<u8> {
        let mut head = vec![0u8; 512];
        head[..name.len()].copy_from_slice(name.as_bytes());
        head[156] = kind;
        head[257..262].copy_from_slice(b"ustar");
        head
    }

    #[test]
    fn a_long_name_or_pax_header_first_is_looked_through() {
        // GNU long name, Python's PAX header, a global header: the name is further on.
        for (kind, name) in [
            (b'L', "././@LongLink"),
            (b'x', "././@PaxHeader"),
            (b'g', "pax_global_header"),
        ] {
            assert!(is_ova(&extension(kind, name), "-"), "{name}");
        }
        // GNU tar's PAX header shows the base name, when whole.
        assert!(is_ova(&extension(b'x', "./PaxHeaders/vm.ovf"), "-"));
        assert!(is_ova(
            &extension(b'x', "./PaxHeaders.4242/disk1.vmdk"),
            "-"
        ));
        assert!(!is_ova(&extension(b'x', "./PaxHeaders/disk.img"), "-"));
        let cut = format!("./PaxHeaders/{}", "a".repeat(87));
        assert!(is_ova(&extension(b'x', &cut), "-"));
    }

    #[test]
    fn compression_comes_before_anything_else() {
        assert_eq!(
            probe(&[0x1f, 0x8b, 8, 0], "x.ova"),
            Content::Compressed(Compression::Gzip)
        );
        let mut tar = vec![0u8; 512];
        tar[..6].copy_from_slice(b"vm.ovf");
        tar[257..262].copy_from_slice(b"ustar");
        assert_eq!(probe(&tar, "-"), Content::Ova);
        assert_eq!(
            probe(b"QFI\xfb\0\0\0\x03", "x.ova"),
            Content::Image(ImageFormat::Qcow2)
        );
        assert_eq!(
            probe(&[0u8; 512], "x.dmg.gz"),
            Content::Image(ImageFormat::Dmg)
        );
    }
}
