//! Decoders: compression layers around an image, recognised by their magic bytes.
//!
//! Layers nest (`.qcow2.xz`, `.raw.gz`, `.img.zst`, even gzip inside xz); [`unwrap_layers`] peels
//! them one by one until the stream no longer starts with a known compression magic. xz streams
//! made of several blocks (what `xz -T0` writes) decode on several threads.

use std::io::{self, Read};

use crate::error::{Error, Result};
use crate::peek::Peeked;

/// How many bytes of a stream sniffing looks at (enough for every magic Quarry knows).
pub const SNIFF_LEN: usize = 512;
/// Nested compression deeper than this is refused: no real image needs it, a hostile one might.
const MAX_LAYERS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Gzip,
    Xz,
    Zstd,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
        }
    }
}

/// Names the compression a stream starts with, if any.
pub fn detect(head: &[u8]) -> Option<Compression> {
    if head.starts_with(&[0x1f, 0x8b]) {
        Some(Compression::Gzip)
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        Some(Compression::Xz)
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(Compression::Zstd)
    } else {
        None
    }
}

pub type BoxRead = Box<dyn Read + Send>;

/// Wraps `input` in a decoder for `compression`.
pub fn decoder<'a>(
    compression: Compression,
    input: Box<dyn Read + Send + 'a>,
) -> Result<Box<dyn Read + Send + 'a>> {
    Ok(match compression {
        // Multi-member files (concatenated gzip) are one stream, as gzip -d treats them.
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(
            io::BufReader::with_capacity(256 << 10, input),
        )),
        Compression::Xz => Box::new(liblzma::read::XzDecoder::new_stream(
            input,
            xz_stream().map_err(|e| Error::Corrupt(format!("xz decoder: {e}")))?,
        )),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(input)
                .map_err(|e| Error::io("starting the zstd decoder", e))?,
        ),
    })
}

/// Memory liblzma may use for decoding threads. Files from `xz -T0` (24 MiB blocks, 8 MiB
/// dictionary) need about 50 MiB a thread; beyond this limit liblzma uses fewer threads.
/// Chosen so that peak RSS of a whole import stays under 100 MiB.
const XZ_THREADING_MEMORY: u64 = 88 << 20;

/// A multi-threaded xz decoder: blocks of a multi-block file decode in parallel; a single-block
/// file decodes on one thread. Memory is capped: liblzma drops to fewer threads rather than
/// exceed the threading limit. (Only the first of concatenated xz streams is read: the
/// multi-threaded builder has no flag for more, and image files are single streams.)
fn xz_stream() -> std::result::Result<liblzma::stream::Stream, liblzma::stream::Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    liblzma::stream::MtStreamBuilder::new()
        .threads(threads)
        .memlimit_threading(XZ_THREADING_MEMORY)
        .memlimit_stop(1 << 30)
        .timeout_ms(0)
        .decoder()
}

/// Peels every compression layer off `input`; returns the decoded stream (its head peeked,
/// not consumed) and the layers found, outermost first.
pub fn unwrap_layers(input: BoxRead) -> Result<(Peeked<BoxRead>, Vec<Compression>)> {
    let mut layers = Vec::new();
    let mut stream = Peeked::new(input, SNIFF_LEN).map_err(|e| Error::from_read(e, "source"))?;
    while let Some(compression) = detect(stream.head()) {
        if layers.len() == MAX_LAYERS {
            return Err(Error::Unsupported(format!(
                "more than {MAX_LAYERS} nested compression layers"
            )));
        }
        layers.push(compression);
        let decoded = decoder(compression, Box::new(stream))?;
        stream = Peeked::new(decoded, SNIFF_LEN)
            .map_err(|e| Error::from_read(e, &format!("{} stream", compression.as_str())))?;
    }
    Ok((stream, layers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn xz(data: &[u8]) -> Vec<u8> {
        let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::encode_all(data, 1).unwrap()
    }

    fn decode_all(input: Vec<u8>) -> (Vec<u8>, Vec<Compression>) {
        let (mut stream, layers) = unwrap_layers(Box::new(io::Cursor::new(input))).unwrap();
        let mut out = Vec::new();
        stream.read_to_end(&mut out).unwrap();
        (out, layers)
    }

    fn sample() -> Vec<u8> {
        (0..300_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect()
    }

    #[test]
    fn plain_data_has_no_layers() {
        let (out, layers) = decode_all(sample());
        assert_eq!(out, sample());
        assert!(layers.is_empty());
    }

    #[test]
    fn each_compression_is_detected_and_decoded() {
        for (compressed, expected) in [
            (gzip(&sample()), Compression::Gzip),
            (xz(&sample()), Compression::Xz),
            (zstd(&sample()), Compression::Zstd),
        ] {
            let (out, layers) = decode_all(compressed);
            assert_eq!(layers, [expected]);
            assert_eq!(out, sample(), "{expected:?}");
        }
    }

    #[test]
    fn nested_layers_are_all_peeled() {
        let (out, layers) = decode_all(gzip(&xz(&zstd(&sample()))));
        assert_eq!(
            layers,
            [Compression::Gzip, Compression::Xz, Compression::Zstd]
        );
        assert_eq!(out, sample());
    }

    #[test]
    fn concatenated_gzip_members_are_one_stream() {
        let mut both = gzip(b"hello ");
        both.extend(gzip(b"world"));
        assert_eq!(decode_all(both).0, b"hello world");
    }

    #[test]
    fn too_deep_nesting_is_refused() {
        let mut data = b"x".to_vec();
        for _ in 0..=MAX_LAYERS {
            data = gzip(&data);
        }
        let err = unwrap_layers(Box::new(io::Cursor::new(data)))
            .err()
            .unwrap();
        assert_eq!(err.kind(), crate::ErrorKind::Unsupported);
    }

    #[test]
    fn truncated_compressed_stream_is_a_corrupt_image() {
        for (name, compressed) in [
            ("gzip", gzip(&sample())),
            ("xz", xz(&sample())),
            ("zstd", zstd(&sample())),
        ] {
            let cut = compressed[..compressed.len() / 2].to_vec();
            let err = match unwrap_layers(Box::new(io::Cursor::new(cut))) {
                Err(e) => e,
                Ok((mut stream, _)) => match stream.read_to_end(&mut Vec::new()) {
                    Ok(n) => panic!("{name}: truncated stream read as {n} bytes without error"),
                    Err(e) => Error::from_read(e, "image"),
                },
            };
            assert_eq!(err.kind(), crate::ErrorKind::CorruptImage, "{err}");
        }
    }
}
