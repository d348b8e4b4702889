//! Decoders: compression layers around an image, recognised by their magic bytes.
//!
//! Layers nest (`.qcow2.xz`, `.raw.gz`, `.img.zst`, even gzip inside xz); [`unwrap_layers`] peels
//! them one by one until the stream no longer starts with a known compression magic. xz streams
//! made of several blocks (what `xz -T0` writes) decode on several threads.

use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
    } else if head.starts_with(&XZ_MAGIC) {
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
    let input_failed = Arc::new(AtomicBool::new(false));
    let input: Box<dyn Read + Send + 'a> = Box::new(WatchedInput {
        inner: input,
        failed: input_failed.clone(),
    });
    let decoded: Box<dyn Read + Send + 'a> = match compression {
        Compression::Gzip => Box::new(GzMembers::new(input)),
        Compression::Xz => Box::new(XzStreams::new(input)?),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(input)
                .map_err(|e| Error::io("starting the zstd decoder", e))?,
        ),
    };
    Ok(Box::new(DecoderErrors {
        inner: decoded,
        compression,
        input_failed,
    }))
}

/// The input of a decoder, noting whether reading it failed: an error coming out of the decoder
/// is then the input's (the source's, with its own kind), not the decoder's.
struct WatchedInput<R> {
    inner: R,
    failed: Arc<AtomicBool>,
}

impl<R: Read> Read for WatchedInput<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|_| {
            self.failed.store(true, Ordering::Relaxed);
        })
    }
}

/// Names the decoder's own complaints for what they are: the compressed stream is corrupt (a
/// terminal error), whatever `io::ErrorKind` the decoder library chose (libzstd's are `Other`,
/// which would otherwise read as a retryable local I/O failure).
struct DecoderErrors<R> {
    inner: R,
    compression: Compression,
    input_failed: Arc<AtomicBool>,
}

impl<R: Read> Read for DecoderErrors<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            let from_decoder = !self.input_failed.load(Ordering::Relaxed) && !Error::carried_by(&e);
            if !from_decoder {
                return e;
            }
            let layer = self.compression.as_str();
            let what = if e.kind() == io::ErrorKind::UnexpectedEof {
                format!("{layer} stream: truncated ({e})")
            } else {
                format!("{layer} stream: {e}")
            };
            Error::Corrupt(what).into_io()
        })
    }
}

/// Memory liblzma may use for decoding threads. A block decoded on a thread takes its
/// dictionary, its whole compressed size and its whole uncompressed size: files from `xz -T0`
/// (24 MiB blocks, 8 MiB dictionary) need 32 MiB plus the compressed block, so two blocks that
/// compress to a third or better decode at once, and less compressible ones one at a time (their
/// decoding is fast anyway). Chosen so that a whole import stays under 100 MiB peak RSS.
pub(crate) const XZ_THREADING_MEMORY: u64 = 80 << 20;

/// A multi-threaded xz decoder: blocks of a multi-block file decode in parallel; a single-block
/// file decodes on one thread. Memory is capped: liblzma drops to fewer threads rather than
/// exceed the threading limit. One decoder reads one stream ([`XzStreams`] chains them).
fn xz_stream() -> std::result::Result<liblzma::stream::Stream, liblzma::stream::Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    liblzma::stream::MtStreamBuilder::new()
        .threads(threads)
        .memlimit_threading(XZ_THREADING_MEMORY)
        .memlimit_stop(1 << 30)
        .timeout_ms(0)
        .decoder()
}

/// The xz magic that starts every stream.
const XZ_MAGIC: [u8; 6] = [0xfd, b'7', b'z', b'X', b'Z', 0x00];

/// An xz file as `xz -d` reads it: one or more streams back to back (`cat a.xz b.xz`), each
/// optionally followed by stream padding (NUL bytes), decoded one after the other by the
/// multi-threaded decoder. Anything else after a stream is corruption, never dropped: stopping at
/// the first stream's end would write a short disk and report success.
struct XzStreams<'a> {
    decoder: Option<liblzma::bufread::XzDecoder<XzInput<'a>>>,
}

impl<'a> XzStreams<'a> {
    fn new(input: Box<dyn Read + Send + 'a>) -> Result<Self> {
        let input = XzInput {
            magic_taken: XZ_MAGIC.len(),
            inner: io::BufReader::with_capacity(256 << 10, input),
        };
        Ok(XzStreams {
            decoder: Some(Self::decoder(input)?),
        })
    }

    fn decoder(input: XzInput<'a>) -> Result<liblzma::bufread::XzDecoder<XzInput<'a>>> {
        let stream = xz_stream().map_err(|e| Error::Corrupt(format!("xz decoder: {e}")))?;
        Ok(liblzma::bufread::XzDecoder::new_stream(input, stream))
    }
}

impl Read for XzStreams<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(decoder) = self.decoder.as_mut() else {
                return Ok(0);
            };
            let n = decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // this stream ended: another may follow
            let mut input = self.decoder.take().expect("decoder present").into_inner();
            if input.next_stream()? {
                self.decoder = Some(Self::decoder(input).map_err(Error::into_io)?);
            }
        }
    }
}

/// A gzip file as `gzip -d` reads it: one or more members back to back (`cat a.gz b.gz`). Data
/// after a member that does not start another one is corruption, named as such (not as a
/// truncated stream, which is what a header cut short would otherwise say).
struct GzMembers<'a> {
    decoder: Option<flate2::bufread::GzDecoder<io::BufReader<Box<dyn Read + Send + 'a>>>>,
    /// The current member follows another one and has not yielded a byte yet.
    following: bool,
}

impl<'a> GzMembers<'a> {
    fn new(input: Box<dyn Read + Send + 'a>) -> Self {
        GzMembers {
            decoder: Some(flate2::bufread::GzDecoder::new(
                io::BufReader::with_capacity(256 << 10, input),
            )),
            following: false,
        }
    }

    fn trailing(detail: &str) -> io::Error {
        Error::Corrupt(format!(
            "gzip: data after the end of the gzip stream ({detail})"
        ))
        .into_io()
    }
}

impl Read for GzMembers<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use io::BufRead;
        loop {
            let Some(decoder) = self.decoder.as_mut() else {
                return Ok(0);
            };
            let n = match decoder.read(buf) {
                Err(e) if self.following && !Error::carried_by(&e) => {
                    return Err(Self::trailing(&format!("not another gzip member: {e}")));
                }
                r => r?,
            };
            if n > 0 || buf.is_empty() {
                self.following = false;
                return Ok(n);
            }
            let mut input = self.decoder.take().expect("decoder present").into_inner();
            match input.fill_buf()?.first() {
                None => return Ok(0),
                Some(0x1f) => {
                    self.decoder = Some(flate2::bufread::GzDecoder::new(input));
                    self.following = true;
                }
                Some(_) => return Err(Self::trailing("not another gzip member")),
            }
        }
    }
}

/// The compressed input of [`XzStreams`]. Between two streams the next one's magic has to be read
/// to be recognised; it is then handed to the next decoder again, ahead of the buffered bytes.
struct XzInput<'a> {
    /// How much of the pending magic the decoder has taken (all of it: nothing pending).
    magic_taken: usize,
    inner: io::BufReader<Box<dyn Read + Send + 'a>>,
}

impl XzInput<'_> {
    /// After a stream's end: skips its padding; Ok(true) when another stream follows (its magic
    /// pending), Ok(false) at the end of the input.
    fn next_stream(&mut self) -> io::Result<bool> {
        use io::BufRead;
        // Stream padding comes in whole 4-byte words (xz's file format, 2.2), as `xz -t` checks.
        let mut padding = 0u64;
        let more = loop {
            let buf = self.inner.fill_buf()?;
            if buf.is_empty() {
                break false;
            }
            let zeroes = buf.iter().take_while(|&&b| b == 0).count();
            if zeroes == 0 {
                break true;
            }
            self.inner.consume(zeroes);
            padding += zeroes as u64;
        };
        if !padding.is_multiple_of(4) {
            return Err(Error::Corrupt(format!(
                "xz: {padding} bytes of stream padding after an xz stream (padding must be a multiple of 4 bytes)"
            ))
            .into_io());
        }
        if !more {
            return Ok(false);
        }
        let mut head = [0u8; XZ_MAGIC.len()];
        let mut got = 0;
        while got < head.len() {
            let buf = self.inner.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            let n = buf.len().min(head.len() - got);
            head[got..got + n].copy_from_slice(&buf[..n]);
            self.inner.consume(n);
            got += n;
        }
        if head != XZ_MAGIC {
            return Err(Error::Corrupt(
                "xz: the data after the end of an xz stream is not another xz stream".into(),
            )
            .into_io());
        }
        self.magic_taken = 0;
        Ok(true)
    }
}

impl Read for XzInput<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use io::BufRead;
        let n = {
            let data = self.fill_buf()?;
            let n = data.len().min(buf.len());
            buf[..n].copy_from_slice(&data[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl io::BufRead for XzInput<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.magic_taken < XZ_MAGIC.len() {
            return Ok(&XZ_MAGIC[self.magic_taken..]);
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        if self.magic_taken < XZ_MAGIC.len() {
            self.magic_taken += amount;
        } else {
            self.inner.consume(amount);
        }
    }
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
    fn concatenated_xz_streams_with_padding_are_one_stream() {
        let data = sample();
        let (a, b) = data.split_at(data.len() / 3);
        let mut file = xz(a);
        file.extend_from_slice(&[0; 8]); // stream padding
        file.extend(xz(b));
        file.extend_from_slice(&[0; 4]);
        let (out, layers) = decode_all(file);
        assert_eq!(layers, vec![Compression::Xz]);
        assert_eq!(out, data);
    }

    #[test]
    fn data_after_an_xz_stream_is_a_corrupt_image() {
        for tail in [&b"garbage!"[..], &XZ_MAGIC[..3], &[0, 0, 0, 0, 1][..]] {
            let mut file = xz(&sample());
            file.extend_from_slice(tail);
            let (mut stream, _) = unwrap_layers(Box::new(io::Cursor::new(file))).unwrap();
            let err = match stream.read_to_end(&mut Vec::new()) {
                Ok(n) => panic!("{tail:?}: read {n} bytes without error"),
                Err(e) => Error::from_read(e, "image"),
            };
            assert_eq!(
                err.kind(),
                crate::ErrorKind::CorruptImage,
                "{tail:?}: {err}"
            );
        }
    }

    #[test]
    fn xz_stream_padding_must_be_whole_words() {
        for pad in 1..=9usize {
            let mut file = xz(&sample());
            file.extend(std::iter::repeat_n(0u8, pad));
            let decoded = (|| {
                let (mut stream, _) = unwrap_layers(Box::new(io::Cursor::new(file)))?;
                let mut out = Vec::new();
                stream
                    .read_to_end(&mut out)
                    .map_err(|e| Error::from_read(e, "image"))?;
                Ok::<_, Error>(out)
            })();
            if pad % 4 == 0 {
                assert_eq!(decoded.unwrap(), sample(), "{pad} bytes of padding");
            } else {
                let err = decoded.unwrap_err();
                assert_eq!(err.kind(), crate::ErrorKind::CorruptImage, "{pad}: {err}");
                assert!(err.to_string().contains("multiple of 4"), "{pad}: {err}");
            }
        }
    }

    #[test]
    fn data_after_a_gzip_stream_is_named_as_such() {
        for tail in [&b"garbage!"[..], b"\x1f", b"\x1fgarbage", b"\0\0\0\0"] {
            let mut file = gzip(&sample());
            file.extend_from_slice(tail);
            let err = read_error(Box::new(io::Cursor::new(file)));
            assert_eq!(
                err.kind(),
                crate::ErrorKind::CorruptImage,
                "{tail:?}: {err}"
            );
            assert!(
                err.to_string()
                    .contains("data after the end of the gzip stream"),
                "{tail:?}: {err}"
            );
        }
    }

    #[test]
    fn concatenated_zstd_frames_are_one_stream() {
        let data = sample();
        let (a, b) = data.split_at(data.len() / 2);
        let mut file = zstd(a);
        file.extend(zstd(b));
        assert_eq!(decode_all(file).0, data);
    }

    /// The error of decoding `input` to its end (opening counts: it reads the decoded head).
    fn read_error(input: Box<dyn Read + Send>) -> Error {
        let (mut stream, _) = match unwrap_layers(input) {
            Ok(opened) => opened,
            Err(e) => return e,
        };
        match stream.read_to_end(&mut Vec::new()) {
            Ok(n) => panic!("read {n} bytes without error"),
            Err(e) => Error::from_read(e, "image"),
        }
    }

    #[test]
    fn garbage_after_any_compressed_stream_is_a_corrupt_image() {
        for (name, mut file) in [
            ("gzip", gzip(&sample())),
            ("xz", xz(&sample())),
            ("zstd", zstd(&sample())),
        ] {
            file.extend_from_slice(b"garbage!");
            let err = read_error(Box::new(io::Cursor::new(file)));
            assert_eq!(err.kind(), crate::ErrorKind::CorruptImage, "{name}: {err}");
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
    }

    /// Yields `data`, then fails with `error` instead of ending.
    struct FailingAfter {
        data: io::Cursor<Vec<u8>>,
        error: Option<io::Error>,
    }

    impl Read for FailingAfter {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.data.read(buf)? {
                0 => Err(self
                    .error
                    .take()
                    .unwrap_or_else(|| io::Error::other("again"))),
                n => Ok(n),
            }
        }
    }

    #[test]
    fn a_failing_source_keeps_its_own_error_kind_through_a_decoder() {
        for (name, file) in [
            ("gzip", gzip(&sample())),
            ("xz", xz(&sample())),
            ("zstd", zstd(&sample())),
        ] {
            let half = file[..file.len() / 2].to_vec();
            let unavailable = FailingAfter {
                data: io::Cursor::new(half.clone()),
                error: Some(Error::SourceUnavailable("connection reset".into()).into_io()),
            };
            let err = read_error(Box::new(unavailable));
            assert_eq!(
                err.kind(),
                crate::ErrorKind::SourceUnavailable,
                "{name}: {err}"
            );
            let local = FailingAfter {
                data: io::Cursor::new(half),
                error: Some(io::Error::other("EIO")),
            };
            let err = read_error(Box::new(local));
            assert_eq!(err.kind(), crate::ErrorKind::Io, "{name}: {err}");
        }
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
