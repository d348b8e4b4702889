//! Host-assisted clone streams, on the wire as CDI's cloner sends them, so a CDI clone source
//! can feed Quarry's upload server and `quarry clone-source` can feed CDI's:
//!
//! - `POST` to the target's upload path (`/v1beta1/upload`, CDI's `UPLOAD_URL`), with the header
//!   `x-cdi-content-type: filesystem-clone` or `blockdevice-clone`;
//! - the body is the snappy framing format (stream identifier, chunks with CRC-32C);
//! - inside it, `filesystem-clone` carries a GNU tar of the volume's files (`disk.img` as a
//!   sparse member: holes are not sent), `blockdevice-clone` the device's raw bytes (zero runs
//!   travel as snappy-compressed zeroes, about 1/20 of their size).
//!
//! Quarry adds two optional request headers that CDI's server ignores: [`CLONE_LENGTH`] (the
//! image's length, checked at the end) and the upload server's `upload-checksum` (sha256 of the
//! image, checked by the pipeline), so a clone between Quarry's two ends is verified end to end.
//!
//! [`decode`] turns a received body into the image's bytes for the normal import pipeline;
//! [`source`] is the sending side (`quarry clone-source`).

pub mod decode;
pub mod source;
pub mod tar;

/// The header CDI's cloner names the stream's content type in.
pub const CONTENT_TYPE_HEADER: &str = "x-cdi-content-type";
/// Quarry's extension: the cloned image's length in bytes.
pub const CLONE_LENGTH: &str = "x-quarry-clone-length";

/// What a clone stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CloneKind {
    /// A filesystem volume's files as a tar (`disk.img`, sparse).
    #[value(name = "filesystem-clone")]
    Filesystem,
    /// A block device's raw bytes.
    #[value(name = "blockdevice-clone")]
    Blockdevice,
}

impl CloneKind {
    /// CDI's content type value.
    pub fn as_str(self) -> &'static str {
        match self {
            CloneKind::Filesystem => "filesystem-clone",
            CloneKind::Blockdevice => "blockdevice-clone",
        }
    }

    /// The kind named by an `x-cdi-content-type` value; `None` for anything else (CDI treats
    /// other values as a plain upload).
    pub fn from_header(value: &str) -> Option<CloneKind> {
        match value.trim() {
            "filesystem-clone" => Some(CloneKind::Filesystem),
            "blockdevice-clone" => Some(CloneKind::Blockdevice),
            _ => None,
        }
    }
}
