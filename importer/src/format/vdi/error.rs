//! What the vdi parsers find wrong or refuse, as the format contract ([`FormatFault`]) reports it.

use crate::error::FormatFault;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VdiError {
    #[error("header: {len} bytes, shorter than a VDI header (512)")]
    ShortHeader { len: u64 },
    #[error("header: signature {signature:#010x} is not a VDI's (0xbeda107f)")]
    Signature { signature: u32 },
    #[error("header: version {major}.{minor} is not 1.1, the one qemu reads")]
    Version { major: u32, minor: u32 },
    #[error("header: the {what} offset {offset:#x} is not sector aligned")]
    Misaligned { what: &'static str, offset: u64 },
    #[error("header: sector size {sector_size} is not 512")]
    SectorSize { sector_size: u32 },
    #[error("header: block size {block_size} is not 1 MiB, the one qemu reads")]
    BlockSize { block_size: u32 },
    #[error("header: disk size {size} bytes exceeds the VDI limit of {max} bytes")]
    TooLarge { size: u64, max: u64 },
    #[error(
        "block map at {offset:#x}: {blocks} blocks of 1 MiB do not cover the disk ({size} bytes)"
    )]
    TableTooSmall { offset: u64, blocks: u64, size: u64 },
    #[error("block map at {offset:#x}: {blocks} blocks are more than a VDI can have")]
    TableTooLarge { offset: u64, blocks: u64 },
    #[error(
        "block map at {offset:#x}: {blocks} blocks are more than Quarry maps ({max}); convert \
         with `qemu-img convert -O qcow2` first"
    )]
    TooManyBlocks { offset: u64, blocks: u64, max: u64 },
    #[error(
        "header: the image has a {what} UUID: it is a snapshot or differencing image whose \
         unwritten blocks are in another image; merge it first (VBoxManage clonemedium)"
    )]
    Linked { what: &'static str },
}

impl FormatFault for VdiError {
    const PREFIX: &'static str = "vdi: ";

    fn is_refusal(&self) -> bool {
        matches!(
            self,
            VdiError::Version { .. }
                | VdiError::SectorSize { .. }
                | VdiError::BlockSize { .. }
                | VdiError::TooManyBlocks { .. }
                | VdiError::Linked { .. }
        )
    }

    /// The block map's offset for its faults; the header (at 0) for the rest.
    fn offset(&self) -> Option<u64> {
        match self {
            VdiError::TableTooSmall { offset, .. }
            | VdiError::TableTooLarge { offset, .. }
            | VdiError::TooManyBlocks { offset, .. } => Some(*offset),
            _ => Some(0),
        }
    }
}
