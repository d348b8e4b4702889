//! A forward-only read window over the image: both converters look at the bytes at the current
//! position, consume them and skip ahead, never back. The window holds at most what was asked
//! for plus one read size.

use std::io::{self, Read};

use crate::error::{Error, Result};

pub(super) struct Window {
    reader: Box<dyn Read + Send>,
    buf: Vec<u8>,
    /// `buf[start..end]` are the bytes from `pos` on.
    start: usize,
    end: usize,
    pos: u64,
    eof: bool,
    /// How much one read asks for at least.
    read_size: usize,
}

impl Window {
    /// A window at offset 0 of a stream of which `head` has been read already.
    pub fn new(head: Vec<u8>, reader: Box<dyn Read + Send>, read_size: usize) -> Window {
        let end = head.len();
        Window {
            reader,
            buf: head,
            start: 0,
            end,
            pos: 0,
            eof: false,
            read_size: read_size.max(4096),
        }
    }

    /// The stream offset of the next byte.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The next `n` bytes (fewer only where the stream ends), without consuming them.
    pub fn peek(&mut self, n: usize) -> Result<&[u8]> {
        if self.end - self.start < n && !self.eof {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            let want = n.max(self.read_size);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            while self.end < n && !self.eof {
                match self.reader.read(&mut self.buf[self.end..]) {
                    Ok(0) => self.eof = true,
                    Ok(got) => self.end += got,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::from_read(e, "vmdk image")),
                }
            }
        }
        let n = n.min(self.end - self.start);
        Ok(&self.buf[self.start..self.start + n])
    }

    /// Moves past `n` bytes (or to the end of the stream).
    pub fn consume(&mut self, n: u64) -> Result<()> {
        self.skip_to(self.pos.saturating_add(n))?;
        Ok(())
    }

    /// Moves forward to offset `to`; false when the stream ends before it.
    pub fn skip_to(&mut self, to: u64) -> Result<bool> {
        debug_assert!(to >= self.pos, "the window only moves forward");
        while self.pos < to {
            let have = (self.end - self.start) as u64;
            if have == 0 {
                let want = (to - self.pos).min(self.read_size as u64) as usize;
                if self.peek(want)?.is_empty() {
                    return Ok(false);
                }
                continue;
            }
            let n = have.min(to - self.pos);
            self.start += n as usize;
            self.pos += n;
        }
        Ok(true)
    }
}
