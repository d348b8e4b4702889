//! What the vdi parsers find wrong, and how it maps into the crate error: refusals by design are
//! [`Error::Unsupported`] (exit 11), contradictions of the format [`Error::Corrupt`] (exit 12).

use crate::error::Error;

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

impl VdiError {
    /// True for images refused by design rather than found wrong.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            VdiError::Version { .. }
                | VdiError::SectorSize { .. }
                | VdiError::BlockSize { .. }
                | VdiError::TooManyBlocks { .. }
                | VdiError::Linked { .. }
        )
    }
}

impl From<VdiError> for Error {
    fn from(e: VdiError) -> Error {
        if e.is_unsupported() {
            Error::Unsupported(format!("vdi: {e}"))
        } else {
            Error::Corrupt(format!("vdi: {e}"))
        }
    }
}
