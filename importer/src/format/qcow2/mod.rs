//! qcow2 reader: placeholder until the streaming reader lands.

use std::io::Read;

use crate::error::{Error, Result};
use crate::format::{FormatReader, ImageFormat, ReaderOptions};
use crate::sink::ExtentSink;

pub const MAGIC: [u8; 4] = *b"QFI\xfb";

pub struct Qcow2Reader;

impl Qcow2Reader {
    pub fn new(_reader: Box<dyn Read + Send>, _opts: &ReaderOptions) -> Result<Self> {
        Err(Error::Unsupported("qcow2 reader not built yet".into()))
    }
}

impl FormatReader for Qcow2Reader {
    fn format(&self) -> ImageFormat {
        ImageFormat::Qcow2
    }
    fn virtual_size(&self) -> Option<u64> {
        None
    }
    fn copy_to(self: Box<Self>, _sink: &mut dyn ExtentSink) -> Result<u64> {
        unreachable!()
    }
}
