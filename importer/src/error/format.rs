//! The one contract between a disk image format's typed errors and the importer's [`Error`].
//!
//! Each format's parsers report what they find wrong as a typed error of their own ([`VdiError`],
//! [`VpcError`], [`VhdxError`], [`VmdkError`], [`Qcow2Error`]) that names the structure and, where
//! it has one, its offset. A typed error plugs in by implementing [`FormatFault`]: whether the
//! image is refused by design ([`ErrorKind::Unsupported`], exit 11) or contradicts its format
//! ([`ErrorKind::CorruptImage`], exit 12), and where. It then becomes an [`Error`] with `?`, as a
//! [`FormatError`] that keeps it whole (see [`FormatError::fault`]) with its offset.
//!
//! [`VdiError`]: crate::format::vdi::VdiError
//! [`VpcError`]: crate::format::vpc::VpcError
//! [`VhdxError`]: crate::format::vhdx::VhdxError
//! [`VmdkError`]: crate::format::vmdk::VmdkError
//! [`Qcow2Error`]: crate::format::qcow2::Qcow2Error

use std::fmt;

use super::{Error, ErrorKind};

/// What a format's typed error tells of itself.
pub trait FormatFault: std::error::Error + Send + Sync + 'static {
    /// How messages name the format, written before the fault's own text (`"vhd: "`); empty
    /// when the fault's text names the format itself.
    const PREFIX: &'static str;

    /// True for a well-formed image Quarry refuses by design, false for one that contradicts
    /// its format.
    fn is_refusal(&self) -> bool;

    /// Where in the image the faulty structure is, when the fault has a place.
    fn offset(&self) -> Option<u64>;
}

/// A format's typed fault as the importer reports it. The message is the fault's (after the
/// format's name), shown once: the fault is kept for callers that look into it
/// ([`FormatError::fault`]), not chained as a `source()` that printers would repeat.
#[derive(Debug)]
pub struct FormatError {
    prefix: &'static str,
    refusal: bool,
    offset: Option<u64>,
    fault: Box<dyn std::error::Error + Send + Sync>,
}

impl FormatError {
    pub fn new<F: FormatFault>(fault: F) -> Self {
        FormatError {
            prefix: F::PREFIX,
            refusal: fault.is_refusal(),
            offset: fault.offset(),
            fault: Box::new(fault),
        }
    }

    /// Unsupported for a refusal, corrupt otherwise: both terminal.
    pub fn kind(&self) -> ErrorKind {
        if self.refusal {
            ErrorKind::Unsupported
        } else {
            ErrorKind::CorruptImage
        }
    }

    /// Where in the image the faulty structure is, when the fault says.
    pub fn offset(&self) -> Option<u64> {
        self.offset
    }

    /// The typed fault, when it is an `F`.
    pub fn fault<F: FormatFault>(&self) -> Option<&F> {
        self.fault.downcast_ref()
    }
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.prefix, self.fault)
    }
}

impl std::error::Error for FormatError {}

impl<F: FormatFault> From<F> for Error {
    fn from(fault: F) -> Error {
        Error::Format(FormatError::new(fault))
    }
}
