//! A source whose bytes come through the [`crate::chunks`] adapter from a producer thread (an
//! HTTP transfer, a registry's layer walk, an upload's body).

use std::io::{self, Read};

use crate::chunks::ChunkReader;
use crate::source::{ByteSource, SourceInfo};

/// A source whose bytes come through the adapter: what is known of it, and its chunks (which the
/// import takes with [`ByteSource::take_chunks`]).
pub struct ChunkSource {
    info: SourceInfo,
    chunks: Option<ChunkReader>,
}

impl ChunkSource {
    pub fn new(info: SourceInfo, chunks: ChunkReader) -> Self {
        ChunkSource {
            info,
            chunks: Some(chunks),
        }
    }
}

impl Read for ChunkSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.chunks.as_mut() {
            Some(chunks) => chunks.read(buf),
            None => Ok(0),
        }
    }
}

impl ByteSource for ChunkSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn take_chunks(&mut self) -> Option<ChunkReader> {
        self.chunks.take()
    }
}
