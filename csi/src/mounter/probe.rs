//! What a block device holds, told from its first and last bytes the way `blkid` tells it: a
//! filesystem a storage pool can be mounted from (XFS, ext2/3/4, btrfs), the signature of
//! anything else (named as `blkid` names it), data of no known kind, or nothing at all.
//!
//! "Blank" is decided strictly, since a blank device is the only one the mounter formats: every
//! byte of the device's first [`HEAD_LEN`] and last [`TAIL_LEN`] is zero. That covers where
//! every signature `blkid` knows sits (partition tables and LVM, LUKS, md RAID 1.1/1.2 labels in
//! the first sectors; swap within the first 64 KiB; iso9660 at 32 KiB; btrfs and reiserfs at
//! 64 KiB; ZFS labels in the first and last 512 KiB; md RAID 0.90/1.0 and GPT backups at the
//! end), so a device with an unrecognised or damaged signature, or stale data, is never taken
//! for blank: it is reported, and left alone. (`mkfs.xfs`, run without `-f`, also refuses a
//! device where libblkid finds any signature: a second guard.)
//!
//! Pure functions over bytes; the mounter reads them.

use std::fmt;

/// Bytes read from the start of a device.
pub const HEAD_LEN: usize = 1 << 20;
/// Bytes read from the end of a device.
pub const TAIL_LEN: usize = 1 << 20;

/// A filesystem a storage pool can be mounted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filesystem {
    /// XFS.
    Xfs,
    /// ext2: no journal, no feature beyond ext2's.
    Ext2,
    /// ext3: a journal, no feature beyond ext3's.
    Ext3,
    /// ext4: a feature ext3 lacks (extents, 64bit, flex_bg, ...).
    Ext4,
    /// btrfs.
    Btrfs,
}

impl Filesystem {
    /// The name `blkid` prints as its TYPE.
    pub fn name(self) -> &'static str {
        match self {
            Filesystem::Xfs => "xfs",
            Filesystem::Ext2 => "ext2",
            Filesystem::Ext3 => "ext3",
            Filesystem::Ext4 => "ext4",
            Filesystem::Btrfs => "btrfs",
        }
    }

    /// The type to mount it with: the ext4 driver mounts ext2 and ext3 too (kernels built
    /// without a separate ext2 driver register no `ext2` type).
    pub fn mount_type(self) -> &'static str {
        match self {
            Filesystem::Xfs => "xfs",
            Filesystem::Ext2 | Filesystem::Ext3 | Filesystem::Ext4 => "ext4",
            Filesystem::Btrfs => "btrfs",
        }
    }
}

/// What a device holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Zeros at both ends: nothing to lose.
    Blank,
    /// One filesystem a pool can be mounted from, and no other signature.
    Filesystem(Filesystem),
    /// Signatures of anything else, or of a filesystem beside another signature, by `blkid`'s
    /// names (TYPE, or PTTYPE for partition tables).
    Foreign(Vec<&'static str>),
    /// Data, but no signature of a known kind.
    Unknown,
}

impl fmt::Display for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Blank => f.write_str("nothing (blank)"),
            Content::Filesystem(fs) => f.write_str(fs.name()),
            Content::Foreign(kinds) => f.write_str(&kinds.join(" and ")),
            Content::Unknown => f.write_str("data of no known kind"),
        }
    }
}

/// What a device holds, from its first [`HEAD_LEN`] bytes (`head`, all of it if the device is
/// smaller) and its last [`TAIL_LEN`] bytes (`tail`).
pub fn probe(head: &[u8], tail: &[u8]) -> Content {
    let fs = [xfs(head), ext(head), btrfs(head)];
    let mut found: Vec<Kind> = fs.into_iter().flatten().collect();
    found.extend(foreign(head));
    match found.as_slice() {
        [] if is_zero(head) && is_zero(tail) => Content::Blank,
        [] => Content::Unknown,
        [Kind::Fs(fs)] => Content::Filesystem(*fs),
        kinds => Content::Foreign(kinds.iter().map(|k| k.name()).collect()),
    }
}

/// One signature found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fs(Filesystem),
    Other(&'static str),
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fs(fs) => fs.name(),
            Kind::Other(name) => name,
        }
    }
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// `len` bytes at `at`, if `b` holds them.
fn bytes(b: &[u8], at: usize, len: usize) -> Option<&[u8]> {
    b.get(at..at.checked_add(len)?)
}

fn has(b: &[u8], at: usize, magic: &[u8]) -> bool {
    bytes(b, at, magic.len()) == Some(magic)
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes(b, at, 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes(b, at, 4)?.try_into().ok()?))
}

fn le16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes(b, at, 2)?.try_into().ok()?))
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes(b, at, 4)?.try_into().ok()?))
}

/// XFS: "XFSB" at 0, with the geometry `blkid` checks (block and sector sizes powers of two in
/// range, some allocation groups); a magic with a damaged superblock is no XFS.
fn xfs(b: &[u8]) -> Option<Kind> {
    if !has(b, 0, b"XFSB") {
        return None;
    }
    let block = be32(b, 4)?;
    let agcount = be32(b, 88)?;
    let sector = be16(b, 102)?;
    let ok = block.is_power_of_two()
        && (512..=65536).contains(&block)
        && sector.is_power_of_two()
        && (512..=32768).contains(&sector)
        && agcount > 0;
    ok.then_some(Kind::Fs(Filesystem::Xfs))
}

/// The ext2/3/4 superblock at 1024 (magic 0xEF53 at 1080), told apart by its features as
/// `blkid` does: an external journal is `jbd`; a feature ext3 lacks (or the test-filesystem
/// flag) makes ext4; else a journal makes ext3; else ext2.
fn ext(b: &[u8]) -> Option<Kind> {
    const SB: usize = 1024;
    if le16(b, SB + 56)? != 0xEF53 {
        return None;
    }
    // a block size above 64 KiB is no ext superblock
    if le32(b, SB + 24)? > 6 {
        return None;
    }
    let compat = le32(b, SB + 0x5C)?;
    let incompat = le32(b, SB + 0x60)?;
    let ro_compat = le32(b, SB + 0x64)?;
    let flags = le32(b, SB + 0x160)?;
    const HAS_JOURNAL: u32 = 0x4;
    const JOURNAL_DEV: u32 = 0x8;
    const TEST_FILESYS: u32 = 0x4;
    // sparse_super, large_file, btree_dir
    const EXT3_RO_COMPAT: u32 = 0x1 | 0x2 | 0x4;
    // filetype, needs_recovery, meta_bg
    const EXT3_INCOMPAT: u32 = 0x2 | 0x4 | 0x10;
    let fs = if incompat & JOURNAL_DEV != 0 {
        return Some(Kind::Other("jbd"));
    } else if ro_compat & !EXT3_RO_COMPAT != 0
        || incompat & !EXT3_INCOMPAT != 0
        || flags & TEST_FILESYS != 0
    {
        Filesystem::Ext4
    } else if compat & HAS_JOURNAL != 0 {
        Filesystem::Ext3
    } else {
        Filesystem::Ext2
    };
    Some(Kind::Fs(fs))
}

/// btrfs: "_BHRfS_M" in the primary superblock at 64 KiB.
fn btrfs(b: &[u8]) -> Option<Kind> {
    has(b, 65536 + 64, b"_BHRfS_M").then_some(Kind::Fs(Filesystem::Btrfs))
}

/// Signatures of what a pool is never mounted from, by `blkid`'s names.
fn foreign(b: &[u8]) -> Vec<Kind> {
    // (name, offset, magic)
    const MAGICS: &[(&str, usize, &[u8])] = &[
        ("crypto_LUKS", 0, b"LUKS\xba\xbe"),
        ("linux_raid_member", 0, b"\xfc\x4e\x2b\xa9"),
        ("linux_raid_member", 4096, b"\xfc\x4e\x2b\xa9"),
        ("squashfs", 0, b"hsqs"),
        ("ntfs", 3, b"NTFS    "),
        ("exfat", 3, b"EXFAT   "),
        ("f2fs", 1024, b"\x10\x20\xf5\xf2"),
        ("iso9660", 32769, b"CD001"),
        ("reiserfs", 65536 + 52, b"ReIsEr"),
        ("gpt", 512, b"EFI PART"),
        ("gpt", 4096, b"EFI PART"),
    ];
    let mut names: Vec<&'static str> = MAGICS
        .iter()
        .filter(|(_, at, magic)| has(b, *at, magic))
        .map(|(name, ..)| *name)
        .collect();
    // LVM's label in one of the first four sectors
    if (0..4).any(|s| has(b, s * 512, b"LABELONE") && has(b, s * 512 + 24, b"LVM2 001")) {
        names.push("LVM2_member");
    }
    // swap's signature ends its first page, whichever the page size
    let page_sizes = [4096, 8192, 16384, 32768, 65536];
    let swap = |m: &[u8]| page_sizes.iter().any(|p| has(b, p - 10, m));
    if swap(b"SWAPSPACE2") || swap(b"SWAP-SPACE") {
        names.push("swap");
    }
    // a boot sector: FAT's, else an MBR partition table (a GPT's protective MBR is the GPT's,
    // NTFS's and exFAT's boot sectors are theirs)
    if has(b, 510, b"\x55\xaa") {
        let fat = has(b, 54, b"FAT1") || has(b, 82, b"FAT32   ");
        let boot_flags = (0..4).all(|i| matches!(b[446 + 16 * i], 0x00 | 0x80));
        if fat {
            names.push("vfat");
        } else if boot_flags && !names.iter().any(|n| matches!(*n, "gpt" | "ntfs" | "exfat")) {
            names.push("dos");
        }
    }
    names.dedup();
    names.into_iter().map(Kind::Other).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(len: usize, at: usize, magic: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[at..at + magic.len()].copy_from_slice(magic);
        b
    }

    #[test]
    fn zeros_are_blank_and_one_byte_anywhere_is_not() {
        let zeros = vec![0u8; HEAD_LEN];
        assert_eq!(probe(&zeros, &zeros), Content::Blank);
        assert_eq!(probe(&[], &[]), Content::Blank, "an empty device");
        for at in [0, 511, 4095, 65600, HEAD_LEN - 1] {
            let head = with(HEAD_LEN, at, b"\x01");
            assert_eq!(probe(&head, &zeros), Content::Unknown, "a byte at {at}");
        }
        let tail = with(TAIL_LEN, TAIL_LEN - 1, b"\x01");
        assert_eq!(probe(&zeros, &tail), Content::Unknown, "a byte at the end");
    }

    #[test]
    fn a_magic_without_its_superblock_is_no_filesystem() {
        let zeros = vec![0u8; TAIL_LEN];
        // XFS's magic with no geometry after it
        let xfs = with(HEAD_LEN, 0, b"XFSB");
        assert_eq!(probe(&xfs, &zeros), Content::Unknown);
        // ext's magic with a block size no ext has
        let mut ext = with(HEAD_LEN, 1080, &0xEF53u16.to_le_bytes());
        ext[1048] = 7;
        assert_eq!(probe(&ext, &zeros), Content::Unknown);
        // a head cut before the superblock's fields
        assert_eq!(probe(&xfs[..8], &zeros), Content::Unknown);
        assert_eq!(probe(&ext[..1082], &zeros), Content::Unknown);
    }

    #[test]
    fn other_signatures_are_named_as_blkid_names_them() {
        let zeros = vec![0u8; TAIL_LEN];
        for (at, magic, name) in [
            (0, &b"LUKS\xba\xbe"[..], "crypto_LUKS"),
            (4086, b"SWAPSPACE2", "swap"),
            (65526, b"SWAPSPACE2", "swap"),
            (32769, b"CD001", "iso9660"),
            (4096, b"\xfc\x4e\x2b\xa9", "linux_raid_member"),
            (510, b"\x55\xaa", "dos"),
        ] {
            let head = with(HEAD_LEN, at, magic);
            assert_eq!(probe(&head, &zeros), Content::Foreign(vec![name]), "{name}");
        }
        let mut lvm = with(HEAD_LEN, 512, b"LABELONE");
        lvm[512 + 24..512 + 32].copy_from_slice(b"LVM2 001");
        assert_eq!(probe(&lvm, &zeros), Content::Foreign(vec!["LVM2_member"]));
        // a GPT's protective MBR is the GPT's
        let mut gpt = with(HEAD_LEN, 512, b"EFI PART");
        gpt[510..512].copy_from_slice(b"\x55\xaa");
        assert_eq!(probe(&gpt, &zeros), Content::Foreign(vec!["gpt"]));
        // a FAT boot sector is vfat, not a partition table
        let mut fat = with(HEAD_LEN, 82, b"FAT32   ");
        fat[510..512].copy_from_slice(b"\x55\xaa");
        assert_eq!(probe(&fat, &zeros), Content::Foreign(vec!["vfat"]));
    }

    #[test]
    fn a_filesystem_beside_another_signature_is_not_mounted() {
        let zeros = vec![0u8; TAIL_LEN];
        let mut head = with(HEAD_LEN, 65600, b"_BHRfS_M");
        assert_eq!(probe(&head, &zeros), Content::Filesystem(Filesystem::Btrfs));
        head[4086..4096].copy_from_slice(b"SWAPSPACE2");
        let c = probe(&head, &zeros);
        assert_eq!(c, Content::Foreign(vec!["btrfs", "swap"]));
        assert_eq!(c.to_string(), "btrfs and swap");
    }

    #[test]
    fn ext_features_tell_ext2_ext3_ext4_and_an_external_journal_apart() {
        let zeros = vec![0u8; TAIL_LEN];
        let ext = |compat: u32, incompat: u32, ro_compat: u32| {
            let mut b = with(HEAD_LEN, 1080, &0xEF53u16.to_le_bytes());
            b[1024 + 0x5C..][..4].copy_from_slice(&compat.to_le_bytes());
            b[1024 + 0x60..][..4].copy_from_slice(&incompat.to_le_bytes());
            b[1024 + 0x64..][..4].copy_from_slice(&ro_compat.to_le_bytes());
            probe(&b, &zeros)
        };
        let fs = |f| Content::Filesystem(f);
        assert_eq!(ext(0, 0x2, 0x3), fs(Filesystem::Ext2));
        assert_eq!(ext(0x4, 0x2, 0x3), fs(Filesystem::Ext3));
        // extents
        assert_eq!(ext(0x4, 0x2 | 0x40, 0x3), fs(Filesystem::Ext4));
        // huge_file, a read-only-compatible feature ext3 lacks, without a journal
        assert_eq!(ext(0, 0x2, 0x8), fs(Filesystem::Ext4));
        assert_eq!(ext(0, 0x8, 0), Content::Foreign(vec!["jbd"]));
        assert_eq!(Filesystem::Ext2.mount_type(), "ext4");
    }

    // ---- real images: made by the mkfs tools into files, probed, and checked against blkid ----

    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// Where `cmd` is (root's PATH has the sbin directories, a user's may not).
    fn tool(cmd: &str) -> Option<PathBuf> {
        ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(cmd))
            .find(|p| p.exists())
    }

    /// A sparse file of `mib` MiB in `dir`, `mkfs` (a command and its arguments before the file)
    /// run on it; None (having said why) where the tool is missing.
    fn image(dir: &Path, mkfs: &[&str], mib: u64) -> Option<PathBuf> {
        let Some(exe) = tool(mkfs[0]) else {
            eprintln!("SKIP {}: {} is not installed", module_path!(), mkfs[0]);
            return None;
        };
        let file = dir.join(mkfs[0]);
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(mib << 20))
            .unwrap();
        let out = Command::new(exe)
            .args(&mkfs[1..])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{mkfs:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(file)
    }

    /// `blkid -p`'s TYPE and PTTYPE of a file ("" where it finds nothing).
    fn blkid(file: &Path) -> String {
        let exe = tool("blkid").expect("blkid (util-linux) is installed");
        let out = Command::new(exe)
            .args(["-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "value"])
            .arg(file)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn probe_file(file: &Path) -> Content {
        let (head, tail) = crate::mounter::read_ends(file).unwrap();
        probe(&head, &tail)
    }

    #[test]
    fn real_filesystems_are_found_as_blkid_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&[&str], Content); 6] = [
            (&["mkfs.xfs", "-q"], Content::Filesystem(Filesystem::Xfs)),
            (
                &["mkfs.ext4", "-q", "-F"],
                Content::Filesystem(Filesystem::Ext4),
            ),
            (
                &["mkfs.ext3", "-q", "-F"],
                Content::Filesystem(Filesystem::Ext3),
            ),
            (
                &["mkfs.ext2", "-q", "-F"],
                Content::Filesystem(Filesystem::Ext2),
            ),
            (
                &["mkfs.btrfs", "-q", "-f"],
                Content::Filesystem(Filesystem::Btrfs),
            ),
            (&["mkswap", "-q"], Content::Foreign(vec!["swap"])),
        ];
        for (mkfs, want) in cases {
            let Some(file) = image(dir.path(), mkfs, 300) else {
                continue;
            };
            let got = probe_file(&file);
            assert_eq!(got, want, "{mkfs:?}");
            assert_eq!(blkid(&file), got.to_string(), "blkid agrees on {mkfs:?}");
        }
    }

    #[test]
    fn a_blank_file_is_blank_and_blkid_finds_nothing_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("blank");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(300 << 20))
            .unwrap();
        assert_eq!(probe_file(&file), Content::Blank);
        assert_eq!(blkid(&file), "");
        // smaller than what is read from either end
        let small = dir.path().join("small");
        std::fs::write(&small, vec![0u8; 5000]).unwrap();
        assert_eq!(probe_file(&small), Content::Blank);
        // stale data near the end, where no signature is probed: not blank, and no filesystem
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"old data", (300 << 20) - 4096).unwrap();
        assert_eq!(probe_file(&file), Content::Unknown);
        assert_eq!(blkid(&file), "");
    }

    #[test]
    fn a_damaged_or_cut_real_superblock_is_never_taken_for_blank() {
        let dir = tempfile::tempdir().unwrap();
        let Some(xfs) = image(dir.path(), &["mkfs.xfs", "-q"], 300) else {
            return;
        };
        let (head, tail) = crate::mounter::read_ends(&xfs).unwrap();
        let mut h = head.clone();
        h[0] = b'Y'; // the magic
        assert_eq!(probe(&h, &tail), Content::Unknown);
        let mut h = head.clone();
        h[4..8].copy_from_slice(&3000u32.to_be_bytes()); // a block size no XFS has
        assert_eq!(probe(&h, &tail), Content::Unknown);
        for cut in [0, 4, 100, 512] {
            let got = probe(&head[..cut], &tail);
            assert!(got != Content::Blank || cut == 0, "cut at {cut}: {got}");
        }
        // the whole superblock sector zeroed: the rest of the filesystem is still there
        let mut h = head.clone();
        h[..512].fill(0);
        assert_eq!(probe(&h, &tail), Content::Unknown);

        let Some(ext4) = image(dir.path(), &["mkfs.ext4", "-q", "-F"], 64) else {
            return;
        };
        let (head, tail) = crate::mounter::read_ends(&ext4).unwrap();
        let mut h = head.clone();
        h[1080] ^= 0xff;
        assert_eq!(probe(&h, &tail), Content::Unknown);
        assert_eq!(
            probe(&head[..1100], &tail),
            Content::Unknown,
            "cut in the superblock"
        );
        // a byte flipped in each place of the superblock never makes it blank
        for at in (1024..2048).step_by(7) {
            let mut h = head.clone();
            h[at] ^= 0x55;
            assert_ne!(probe(&h, &tail), Content::Blank, "flipped at {at}");
        }
    }
}
