//! The one factory of format readers: it names the image's format (the requested one, or what
//! the image's first bytes say, [`detect`](mod@detect)) and opens that format's reader on the image, by
//! random access when the image is an uncompressed local file, as a stream otherwise. Parsing
//! stays in each format's pure decoders; what is opened on what is decided here only.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::format::detect;
use crate::format::qcow2::Qcow2Reader;
use crate::format::raw::{RawReader, SparseFileReader};
use crate::format::vdi::VdiReader;
use crate::format::vhdx::VhdxReader;
use crate::format::vmdk::{StreamedBecause, VmdkReader};
use crate::format::vpc::VpcReader;
use crate::format::{COPY_READ, FormatReader, ImageFormat, ReaderOptions};

/// Where an image's bytes are.
pub enum Input {
    /// An uncompressed local regular file of `length` bytes: readers that can seek read its
    /// tables first and its data by extents (raw) or in parallel, as `qemu-img convert` does; a
    /// vmdk descriptor finds its extent files beside `path`.
    File {
        path: PathBuf,
        file: File,
        length: u64,
    },
    /// The decoded image as a stream. `length` is its exact length when known (no compression
    /// between the source and the image); `because` says why a vmdk descriptor, readable only as
    /// a local file, arrived as a stream.
    Stream {
        stream: Box<dyn Read + Send>,
        length: Option<u64>,
        because: StreamedBecause,
    },
}

/// Opens the image in `input`, whose first bytes are `head` and whose source is named `name`:
/// of the `requested` format, else of the one [`detect::detect_named`] names. Formats Quarry
/// only recognises (qed, LUKS, ...) are refused by name.
pub fn open(
    input: Input,
    head: &[u8],
    name: &str,
    requested: Option<ImageFormat>,
    opts: &ReaderOptions,
) -> Result<Box<dyn FormatReader>> {
    let format = requested.unwrap_or_else(|| detect::detect_named(head, name));
    Ok(match input {
        Input::File { path, file, length } => match format {
            ImageFormat::Raw => Box::new(SparseFileReader::new(file, length)),
            ImageFormat::Qcow2 => Box::new(Qcow2Reader::open(file, length)?),
            ImageFormat::Vpc => Box::new(VpcReader::open(file, length)?),
            ImageFormat::Vdi => Box::new(VdiReader::open(file, length)?),
            ImageFormat::Vhdx => Box::new(VhdxReader::open(file, length)?),
            ImageFormat::Vmdk => Box::new(VmdkReader::open(&path, file, length)?),
            other => return Err(refused(other)),
        },
        Input::Stream {
            stream,
            length,
            because,
        } => match format {
            ImageFormat::Raw => Box::new(RawReader::new(
                stream,
                length,
                opts.read_ahead.min(COPY_READ),
            )),
            ImageFormat::Qcow2 => Box::new(Qcow2Reader::new(stream, opts)?),
            ImageFormat::Vpc => Box::new(VpcReader::new(stream, opts)?),
            ImageFormat::Vdi => Box::new(VdiReader::new(stream, opts)?),
            ImageFormat::Vhdx => Box::new(VhdxReader::new(stream, opts)?),
            ImageFormat::Vmdk => Box::new(VmdkReader::streamed(stream, opts, because)?),
            other => return Err(refused(other)),
        },
    })
}

/// Whether `format` has a reader (the others are recognised only to be refused by name).
pub fn is_readable(format: ImageFormat) -> bool {
    matches!(
        format,
        ImageFormat::Raw
            | ImageFormat::Qcow2
            | ImageFormat::Vpc
            | ImageFormat::Vdi
            | ImageFormat::Vhdx
            | ImageFormat::Vmdk
    )
}

/// Why an image of a format Quarry has no reader for is refused.
fn refused(format: ImageFormat) -> Error {
    if format == ImageFormat::Luks {
        return Error::Unsupported(
            "the image is LUKS-encrypted (luks): Quarry does not decrypt images; decrypt it \
             with `qemu-img convert -O qcow2 --object secret,...` first"
                .into(),
        );
    }
    Error::Unsupported(format!(
        "{} images are not supported; convert with `qemu-img convert -O qcow2` first",
        format.as_str()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn stream(bytes: &'static [u8]) -> Input {
        Input::Stream {
            stream: Box::new(bytes),
            length: Some(bytes.len() as u64),
            because: StreamedBecause::Remote,
        }
    }

    #[test]
    fn the_requested_format_wins_over_the_magic() {
        let head = b"QFI\xfb\0\0\0\x03";
        let opts = ReaderOptions::default();
        let reader = open(stream(head), head, "x", Some(ImageFormat::Raw), &opts).unwrap();
        assert_eq!(reader.format(), ImageFormat::Raw);
        assert_eq!(reader.virtual_size(), Some(8));
    }

    #[test]
    fn formats_without_a_reader_are_refused_by_name() {
        let opts = ReaderOptions::default();
        for (head, name, needle) in [
            (&b"QED\0\0\0\x01\0"[..], "x", "qed images are not supported"),
            (&b"LUKS\xba\xbe\0\x01"[..], "x", "LUKS-encrypted"),
            (&[0u8; 16][..], "mac.dmg", "dmg images are not supported"),
        ] {
            let e = open(stream(head), head, name, None, &opts).err().unwrap();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains(needle), "{e}");
            assert!(!is_readable(detect::detect_named(head, name)));
        }
    }
}
