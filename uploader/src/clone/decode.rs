//! The receiving side of a clone stream: the request body in, the image's bytes out, for the
//! upload server's normal pipeline (which keeps zero runs as holes and applies the target's size
//! rules). Every failure is a corrupt-image error naming what was wrong with the stream.

use std::io::{self, Read};

use super::CloneKind;
use super::tar::ImageReader;

/// Reads the image out of a clone stream's body.
pub fn decode<R: Read + Send + 'static>(kind: CloneKind, body: R) -> Box<dyn Read + Send> {
    let unframed = Snappy(snap::read::FrameDecoder::new(body));
    match kind {
        CloneKind::Blockdevice => Box::new(unframed),
        CloneKind::Filesystem => Box::new(ImageReader::new(unframed)),
    }
}

/// Gives snappy's framing errors the corrupt-image kind (I/O errors from the body pass as they are).
struct Snappy<R: Read>(snap::read::FrameDecoder<R>);

impl<R: Read> Read for Snappy<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| {
            if e.get_ref().is_some_and(|inner| inner.is::<snap::Error>()) {
                importer::Error::Corrupt(format!("clone stream: bad snappy framing: {e}")).into_io()
            } else {
                e
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn framed(data: &[u8]) -> Vec<u8> {
        let mut enc = snap::write::FrameEncoder::new(Vec::new());
        enc.write_all(data).unwrap();
        enc.into_inner().unwrap()
    }

    #[test]
    fn a_block_stream_is_unframed() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        decode(CloneKind::Blockdevice, io::Cursor::new(framed(&data)))
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn a_stream_that_is_not_snappy_is_corrupt() {
        let err = decode(
            CloneKind::Blockdevice,
            io::Cursor::new(b"raw bytes".to_vec()),
        )
        .read_to_end(&mut Vec::new())
        .unwrap_err();
        let inner = importer::Error::from_read(err, "clone stream");
        assert_eq!(inner.kind(), importer::ErrorKind::CorruptImage, "{inner}");
    }
}
