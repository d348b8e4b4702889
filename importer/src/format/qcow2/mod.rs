//! qcow2 reader: converts a qcow2 image to the guest disk in one sequential pass, no seeking,
//! or, for a local file, by random access on several threads.
//!
//! - [`header`]: pure parse and validation of the header and its extensions;
//! - [`l2`]: pure decoding of L1/L2 entries and compressed cluster descriptors;
//! - `stream`: the single-pass converter (see its docs for the algorithm and memory bounds);
//! - `seek`: the random-access converter for local files (tables first, data in parallel);
//! - `hold`: bytes that arrive before their role is known (memory, then a spill file);
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

pub mod header;
mod hold;
mod inflate;
pub mod l2;
mod roles;
mod seek;
mod stream;

#[cfg(test)]
mod tests;

pub use header::{Compression, Header, MAGIC};
pub use stream::Qcow2Stats;

/// A qcow2 image whose header has been read and validated, ready to stream.
pub struct Qcow2Reader {
    header: Header,
    head: Vec<u8>,
    reader: Box<dyn Read + Send>,
    opts: ReaderOptions,
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
        let header = header::parse(&head)?;
        Ok(Qcow2Reader {
            header,
            head,
            reader,
            opts: opts.clone(),
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Streams the guest disk into `sink` (every byte of `[0, virtual_size)` exactly once) and
    /// tells what it took.
    pub fn convert(self, sink: &mut dyn ExtentSink) -> Result<Qcow2Stats> {
        stream::Stream::new(&self.header, self.head, self.reader, &self.opts, sink).run()
    }
}

/// A qcow2 image in a local file, converted by random access (see `seek`): tables first, then
/// data read and inflated on several threads.
pub struct Qcow2FileReader {
    header: Header,
    file: std::fs::File,
    length: u64,
}

impl Qcow2FileReader {
    /// Reads and validates the header of the image in `file` (`length` bytes).
    pub fn open(file: std::fs::File, length: u64) -> Result<Self> {
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
        Ok(Qcow2FileReader {
            header: header::parse(&head)?,
            file,
            length,
        })
    }

    /// Converts the guest disk into `sink` and tells what it took.
    pub fn convert(self, sink: &mut dyn ExtentSink) -> Result<Qcow2Stats> {
        seek::convert(&self.header, &self.file, self.length, sink)
    }
}

impl FormatReader for Qcow2FileReader {
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
