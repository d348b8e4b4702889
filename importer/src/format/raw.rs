//! The raw format: the stream is the guest disk, byte for byte.

use std::io::Read;

use crate::error::{Error, Result};
use crate::format::{FormatReader, ImageFormat, READ_AHEAD};
use crate::sink::ExtentSink;

/// Streams a raw image of possibly unknown length.
pub struct RawReader {
    input: Box<dyn Read + Send>,
    length: Option<u64>,
    read_size: usize,
}

impl RawReader {
    /// `length` is the image size when the source states it (an uncompressed file or HTTP body);
    /// `read_size` how much each read (and so each write) takes at most.
    pub fn new(input: Box<dyn Read + Send>, length: Option<u64>, read_size: usize) -> Self {
        RawReader {
            input,
            length,
            read_size: read_size.max(1),
        }
    }
}

impl FormatReader for RawReader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Raw
    }

    fn virtual_size(&self) -> Option<u64> {
        self.length
    }

    fn copy_to(mut self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64> {
        let mut buf = vec![0u8; self.read_size];
        let mut offset = 0u64;
        loop {
            let mut filled = 0;
            while filled < buf.len() {
                match self.input.read(&mut buf[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::from_read(e, "raw image")),
                }
            }
            if filled == 0 {
                break;
            }
            sink.write_data(offset, &buf[..filled])?;
            offset += filled as u64;
            if filled < buf.len() {
                break;
            }
        }
        if let Some(expected) = self.length
            && expected != offset
        {
            return Err(Error::Corrupt(format!(
                "raw image: expected {expected} bytes, the stream had {offset}"
            )));
        }
        Ok(offset)
    }
}

/// Copies a raw image from a local regular file, reading only its data extents
/// (`SEEK_DATA`/`SEEK_HOLE`): holes are reported as zeroes without being read, as qemu-img does.
/// Bytes past the end of the file read as zeroes, as qemu reads them.
pub struct SparseFileReader {
    file: std::fs::File,
    /// Where the disk starts in the file.
    start: u64,
    length: u64,
}

impl SparseFileReader {
    /// `length` is the file's size, as its caller already read it, or the size of the disk at
    /// its start (a fixed vhd, whose footer follows).
    pub fn new(file: std::fs::File, length: u64) -> Self {
        SparseFileReader::at(file, 0, length)
    }

    /// The disk of `length` bytes that starts `start` bytes into `file` (a vmdk flat extent with
    /// an offset).
    pub fn at(file: std::fs::File, start: u64, length: u64) -> Self {
        SparseFileReader {
            file,
            start,
            length,
        }
    }

    /// The next data extent at or after disk offset `pos`, as disk offsets `(start, end)`; None
    /// when only a hole is left.
    fn next_data(&self, pos: u64) -> Result<Option<(u64, u64)>> {
        use nix::unistd::{Whence, lseek};
        let file_pos = i64::try_from(self.start + pos).map_err(|_| {
            Error::Corrupt(format!(
                "raw image: offset {} is out of range",
                self.start + pos
            ))
        })?;
        let start = match lseek(&self.file, file_pos, Whence::SeekData) {
            // Data past `length` (a fixed vhd's footer) is not the disk's.
            Ok(s) if s as u64 >= self.start + self.length => return Ok(None),
            Ok(s) => s as u64 - self.start,
            Err(nix::errno::Errno::ENXIO) => return Ok(None),
            // Filesystems without SEEK_DATA: treat the rest as data.
            Err(nix::errno::Errno::EINVAL) => return Ok(Some((pos, self.length))),
            Err(e) => return Err(Error::io("seeking data in the source", e.into())),
        };
        let end = match lseek(&self.file, (self.start + start) as i64, Whence::SeekHole) {
            Ok(e) => e as u64 - self.start,
            Err(e) => return Err(Error::io("seeking a hole in the source", e.into())),
        };
        Ok(Some((start, end.min(self.length))))
    }
}

impl FormatReader for SparseFileReader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Raw
    }

    fn virtual_size(&self) -> Option<u64> {
        Some(self.length)
    }

    fn copy_to(self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; READ_AHEAD];
        let mut pos = 0u64;
        while pos < self.length {
            let Some((start, end)) = self.next_data(pos)? else {
                break;
            };
            if start > pos {
                sink.write_zeroes(pos, start - pos)?;
            }
            let mut offset = start;
            while offset < end {
                let want = (end - offset).min(READ_AHEAD as u64) as usize;
                self.file
                    .read_exact_at(&mut buf[..want], self.start + offset)
                    .map_err(|e| Error::from_read(e, "raw image"))?;
                sink.write_data(offset, &buf[..want])?;
                offset += want as u64;
            }
            pos = end;
        }
        if pos < self.length {
            sink.write_zeroes(pos, self.length - pos)?;
        }
        Ok(self.length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    /// Records extents and checks every byte is reported exactly once.
    #[derive(Default)]
    struct Recorder {
        bytes: Vec<u8>,
        seen: Vec<bool>,
        zero_bytes: u64,
    }

    impl Recorder {
        fn mark(&mut self, offset: u64, len: usize) {
            let end = offset as usize + len;
            if self.seen.len() < end {
                self.seen.resize(end, false);
                self.bytes.resize(end, 0);
            }
            for s in &mut self.seen[offset as usize..end] {
                assert!(!*s, "byte reported twice");
                *s = true;
            }
        }
    }

    impl ExtentSink for Recorder {
        fn write_data(&mut self, offset: u64, data: &[u8]) -> Result<()> {
            self.mark(offset, data.len());
            self.bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
            self.mark(offset, len as usize);
            self.zero_bytes += len;
            Ok(())
        }
    }

    #[test]
    fn sparse_file_holes_are_zeroes_and_data_is_exact() {
        let mut f = tempfile::tempfile().unwrap();
        f.seek(SeekFrom::Start(3 << 20)).unwrap();
        f.write_all(&[9u8; 70_000]).unwrap();
        f.set_len(16 << 20).unwrap();
        let mut sink = Recorder::default();
        let n = Box::new(SparseFileReader::new(f, 16 << 20))
            .copy_to(&mut sink)
            .unwrap();
        assert_eq!(n, 16 << 20);
        assert!(sink.seen.iter().all(|&s| s), "every byte reported");
        let mut expected = vec![0u8; 16 << 20];
        expected[3 << 20..(3 << 20) + 70_000].fill(9);
        assert_eq!(sink.bytes, expected);
        // The filesystem's holes (at least the first 3 MiB) were not read.
        assert!(sink.zero_bytes >= 3 << 20, "{}", sink.zero_bytes);
    }

    #[test]
    fn stream_length_must_match_the_stated_length() {
        let reader = RawReader::new(
            Box::new(std::io::Cursor::new(vec![1u8; 100])),
            Some(200),
            READ_AHEAD,
        );
        let err = Box::new(reader)
            .copy_to(&mut Recorder::default())
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::CorruptImage);
    }
}
