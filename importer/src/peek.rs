//! A reader that lets format and compression sniffing look at the first bytes of a stream
//! without consuming them.

use std::io::{self, Read};

/// Wraps a stream, holding its first bytes so they can be inspected and then read again.
pub struct Peeked<R> {
    head: Vec<u8>,
    pos: usize,
    inner: R,
}

impl<R: Read> Peeked<R> {
    /// Reads up to `n` bytes (fewer only at end of stream) from `inner`.
    pub fn new(mut inner: R, n: usize) -> io::Result<Self> {
        let mut head = vec![0u8; n];
        let mut filled = 0;
        while filled < n {
            match inner.read(&mut head[filled..]) {
                Ok(0) => break,
                Ok(got) => filled += got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        head.truncate(filled);
        Ok(Peeked {
            head,
            pos: 0,
            inner,
        })
    }

    /// The first bytes of the stream (all of it when the stream is shorter than asked).
    pub fn head(&self) -> &[u8] {
        &self.head
    }
}

impl<R: Read> Read for Peeked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos < self.head.len() {
            let n = buf.len().min(self.head.len() - self.pos);
            buf[..n].copy_from_slice(&self.head[self.pos..self.pos + n]);
            self.pos += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_is_read_again_before_the_rest() {
        let data: Vec<u8> = (0..100u8).collect();
        let mut p = Peeked::new(&data[..], 10).unwrap();
        assert_eq!(p.head(), &data[..10]);
        let mut all = Vec::new();
        p.read_to_end(&mut all).unwrap();
        assert_eq!(all, data);
    }

    #[test]
    fn short_stream_gives_a_short_head() {
        let p = Peeked::new(&b"abc"[..], 10).unwrap();
        assert_eq!(p.head(), b"abc");
    }
}
