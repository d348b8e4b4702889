//! What the vhd parsers find wrong or refuse, as the format contract ([`FormatFault`]) reports it.

use crate::error::FormatFault;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VpcError {
    #[error("no \"conectix\" footer at offset 0 or in the last 512 bytes ({len} bytes)")]
    NoFooter { len: u64 },
    #[error(
        "footer at {offset:#x}: checksum {stored:#010x} does not match its bytes ({computed:#010x})"
    )]
    FooterChecksum {
        offset: u64,
        stored: u32,
        computed: u32,
    },
    #[error(
        "footer at {offset:#x}: differencing disks (disk type 4) read their unwritten sectors from \
         a parent image; merge it first (`qemu-img convert -O vpc child.vhd merged.vhd`)"
    )]
    Differencing { offset: u64 },
    #[error("footer at {offset:#x}: disk type {disk_type} is not fixed (2) or dynamic (3)")]
    UnknownType { offset: u64, disk_type: u32 },
    #[error(
        "footer at {offset:#x}: a {found} disk's footer cannot be there (fixed disks have theirs \
         only at the end, dynamic disks a copy at offset 0)"
    )]
    MisplacedFooter { offset: u64, found: &'static str },
    #[error("footer at {offset:#x}: {sectors} sectors exceed the VHD limit of 2040 GiB")]
    TooLarge { offset: u64, sectors: u64 },
    #[error("dynamic disk header at {offset:#x}: no \"cxsparse\" magic")]
    NoDynamicHeader { offset: u64 },
    #[error(
        "dynamic disk header at {offset:#x}: block size {block_size} is not a power of two of at least 512"
    )]
    BlockSize { offset: u64, block_size: u32 },
    #[error(
        "BAT at {offset:#x}: {entries} entries of {block_size}-byte blocks do not cover the disk \
         ({size} bytes)"
    )]
    TableTooSmall {
        offset: u64,
        entries: u64,
        block_size: u64,
        size: u64,
    },
    #[error("BAT at {offset:#x}: {entries} entries are more than a VHD can have")]
    TableTooLarge { offset: u64, entries: u64 },
    #[error(
        "BAT at {offset:#x}: {blocks} blocks of {block_size} bytes are more than Quarry maps \
         ({max}); convert with `qemu-img convert -O qcow2` first"
    )]
    TooManyBlocks {
        offset: u64,
        blocks: u64,
        block_size: u64,
        max: u64,
    },
    #[error("fixed disk: the footer states {size} bytes but the image holds {data} bytes of data")]
    FixedSize { size: u64, data: u64 },
}

impl FormatFault for VpcError {
    const PREFIX: &'static str = "vhd: ";

    fn is_refusal(&self) -> bool {
        matches!(
            self,
            VpcError::Differencing { .. } | VpcError::TooManyBlocks { .. }
        )
    }

    fn offset(&self) -> Option<u64> {
        match self {
            VpcError::NoFooter { .. } | VpcError::FixedSize { .. } => None,
            VpcError::FooterChecksum { offset, .. }
            | VpcError::Differencing { offset }
            | VpcError::UnknownType { offset, .. }
            | VpcError::MisplacedFooter { offset, .. }
            | VpcError::TooLarge { offset, .. }
            | VpcError::NoDynamicHeader { offset }
            | VpcError::BlockSize { offset, .. }
            | VpcError::TableTooSmall { offset, .. }
            | VpcError::TableTooLarge { offset, .. }
            | VpcError::TooManyBlocks { offset, .. } => Some(*offset),
        }
    }
}
