//! qcow2 reader: converts a qcow2 image to the guest disk in one sequential pass, no seeking,
//! or, for a local file, by random access on several threads.
//!
//! - [`header`]: pure parse and validation of the header and its extensions;
//! - [`l2`]: pure decoding of L1/L2 entries and compressed cluster descriptors;
//! - [`error`]: what the pure decoders find wrong with an entry;
//! - `geometry`: cluster geometry and what a guest cluster reads of its host cluster;
//! - `extent`: guest data and zero ranges handed to the sink (both converters);
//! - `roles`: host clusters whose role the header fixes (both converters);
//! - `stream`: the single-pass converter (see its docs for the algorithm and memory bounds);
//! - `seek`: the random-access converter for local files (tables first, data in parallel);
//! - `inflate`: deflate and zstd clusters with qemu's acceptance rules.
//!
//! Supported: versions 2 and 3, cluster sizes 512 B to 2 MiB, zero and unallocated clusters,
//! deflate and zstd compressed clusters, extended L2 entries (subclusters), any refcount width,
//! internal snapshots (only the active L1 is converted), virtual sizes that end mid-cluster.
//! Refused ([`Error::Unsupported`](crate::Error::Unsupported)): backing files, external data
//! files, encryption, unknown incompatible features.

use std::io::Read;

use crate::error::{Error, Result};
use crate::format::{FormatReader, ImageFormat, ReaderOptions};
use crate::sink::ExtentSink;

pub mod error;
pub(crate) mod extent;
mod geometry;
pub mod header;
mod inflate;
pub mod l2;
mod roles;
mod seek;
mod stream;

#[cfg(test)]
pub(crate) mod tests;

#[cfg(any(test, feature = "bench"))]
pub use crate::format::cost::InflateCost;
pub use error::{HeaderError, Qcow2Error};
pub use header::{Compression, Header, MAGIC};
pub use stream::Qcow2Stats;

/// A qcow2 image whose header has been read and validated, ready to convert: from a stream in one
/// pass ([`Qcow2Reader::new`]), or from a local file by random access ([`Qcow2Reader::open`]).
pub struct Qcow2Reader {
    header: Header,
    input: Input,
}

/// The random-access reader's name: [`Qcow2Reader::open`] builds one.
pub type Qcow2FileReader = Qcow2Reader;

/// Where the image's bytes come from.
enum Input {
    /// A stream, of which `head` (the header cluster) has been read already.
    Stream {
        head: Vec<u8>,
        reader: Box<dyn Read + Send>,
        opts: ReaderOptions,
    },
    /// A local file of `length` bytes, read at random (see `seek`): tables first, then data read
    /// and inflated on several threads.
    File { file: std::fs::File, length: u64 },
}

/// Reads until `buf` holds `want` bytes or the stream ends.
fn read_up_to(reader: &mut dyn Read, buf: &mut Vec<u8>, want: usize) -> Result<()> {
    let mut at = buf.len();
    if at >= want {
        return Ok(());
    }
    buf.resize(want, 0);
    while at < want {
        match reader.read(&mut buf[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::from_read(e, "qcow2 image")),
        }
    }
    buf.truncate(at);
    Ok(())
}

impl Qcow2Reader {
    /// Reads and validates the header from the start of the stream (reading at most the first
    /// cluster, where the header and its extensions live).
    pub fn new(mut reader: Box<dyn Read + Send>, opts: &ReaderOptions) -> Result<Self> {
        let mut head = Vec::new();
        read_up_to(&mut reader, &mut head, 1 << header::MIN_CLUSTER_BITS)?;
        let want = header::wanted_len(&head);
        read_up_to(&mut reader, &mut head, want)?;
        Ok(Qcow2Reader {
            header: header::parse(&head)?,
            input: Input::Stream {
                head,
                reader,
                opts: opts.clone(),
            },
        })
    }

    /// Reads and validates the header of the image in the local `file` (`length` bytes), to
    /// convert it by random access.
    pub fn open(file: std::fs::File, length: u64) -> Result<Self> {
        Ok(Qcow2Reader {
            header: file_header(&file, length)?,
            input: Input::File { file, length },
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Converts the guest disk into `sink` (every byte of `[0, virtual_size)` exactly once) and
    /// tells what it took.
    pub fn convert(self, sink: &mut dyn ExtentSink) -> Result<Qcow2Stats> {
        match self.input {
            Input::Stream { head, reader, opts } => {
                stream::Stream::new(&self.header, head, reader, &opts, sink).run()
            }
            Input::File { file, length } => seek::convert(&self.header, &file, length, sink),
        }
    }
}

/// Reads and validates the header of the image in the local `file` (`length` bytes).
fn file_header(file: &std::fs::File, length: u64) -> Result<Header> {
    use std::os::unix::fs::FileExt;
    let mut head = vec![0u8; (1usize << header::MIN_CLUSTER_BITS).min(length as usize)];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| Error::from_read(e, "qcow2 image"))?;
    let want = header::wanted_len(&head).min(length as usize);
    if want > head.len() {
        head.resize(want, 0);
        file.read_exact_at(&mut head, 0)
            .map_err(|e| Error::from_read(e, "qcow2 image"))?;
    }
    header::parse(&head)
}

#[cfg(any(test, feature = "bench"))]
/// Inflates every compressed cluster of the qcow2 image in the local `file` (`length` bytes) on
/// one thread, writing nothing, and tells what it cost: the image's decode bound.
pub fn inflate_cost(file: &std::fs::File, length: u64) -> Result<InflateCost> {
    seek::inflate_cost(&file_header(file, length)?, file, length)
}

impl FormatReader for Qcow2Reader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Qcow2
    }

    fn virtual_size(&self) -> Option<u64> {
        Some(self.header.virtual_size)
    }

    fn copy_to(self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64> {
        let size = self.header.virtual_size;
        self.convert(sink)?;
        Ok(size)
    }
}
