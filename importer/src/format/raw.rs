//! The raw format: the stream is the guest disk, byte for byte.

use std::io::Read;

use crate::error::{Error, Result};
use crate::format::{FormatReader, ImageFormat};
use crate::sink::ExtentSink;

/// Streams a raw image of possibly unknown length.
pub struct RawReader {
    input: Box<dyn Read + Send>,
    length: Option<u64>,
}

impl RawReader {
    /// `length` is the image size when the source states it (an uncompressed file or HTTP body).
    pub fn new(input: Box<dyn Read + Send>, length: Option<u64>) -> Self {
        RawReader { input, length }
    }
}

/// Read size for raw copies: large, so each write is large.
const READ_SIZE: usize = 4 << 20;

impl FormatReader for RawReader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Raw
    }

    fn virtual_size(&self) -> Option<u64> {
        self.length
    }

    fn copy_to(mut self: Box<Self>, sink: &mut dyn ExtentSink) -> Result<u64> {
        let mut buf = vec![0u8; READ_SIZE];
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
