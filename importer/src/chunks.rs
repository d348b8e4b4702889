//! The one adapter between a producer of byte chunks on another thread (an HTTP transfer, a
//! registry's layer walk, an upload's request body, a pipeline stage) and a blocking [`Read`].
//!
//! The producer sends [`Bytes`] into a bounded channel ([`ChunkSender`], from async code or a
//! plain thread) and says how the stream ended: [`ChunkSender::end`] (complete and checked) or
//! [`ChunkSender::fail`]. A producer that goes away without either is an interruption: the
//! reader fails with the message given to [`channel`]. The reader ([`ChunkReader`]) hands out
//! the chunks' bytes as they are, without an intermediate buffer, so the bytes cross exactly one
//! channel between the thread that received them and the one that decodes them.
//!
//! `read` blocks the calling thread (parking it until the next chunk): call it from a plain
//! thread, not from an async task. It does not panic when the caller happens to be inside a
//! runtime (unlike tokio's `blocking_recv`).

use std::io::{self, Read};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Buf, Bytes};
use tokio::sync::mpsc;

use crate::source::{ByteSource, SourceInfo};
use crate::{Error, ErrorKind};

enum Chunk {
    Data(Bytes),
    /// The stream is complete (and, where the producer checks it, of the right length).
    End,
    Failed(Error),
}

/// The producing half. Dropping it without [`ChunkSender::end`] interrupts the stream.
pub struct ChunkSender(mpsc::Sender<Chunk>);

/// The consuming half: a blocking [`Read`] over the chunks.
pub struct ChunkReader {
    rx: mpsc::Receiver<Chunk>,
    current: Bytes,
    state: State,
    /// The error of a stream whose producer went away without ending it.
    interrupted: String,
}

enum State {
    Open,
    Done,
    Failed(ErrorKind, String),
}

/// A channel of at most `depth` chunks in flight; `interrupted` is the message (source
/// unavailable) of a stream whose producer goes away before it ends.
pub fn channel(depth: usize, interrupted: impl Into<String>) -> (ChunkSender, ChunkReader) {
    let (tx, rx) = mpsc::channel(depth.max(1));
    let reader = ChunkReader {
        rx,
        current: Bytes::new(),
        state: State::Open,
        interrupted: interrupted.into(),
    };
    (ChunkSender(tx), reader)
}

impl ChunkSender {
    /// Sends `chunk`, waiting for room; false when the reader is gone.
    pub async fn send(&self, chunk: Bytes) -> bool {
        self.0.send(Chunk::Data(chunk)).await.is_ok()
    }

    /// [`ChunkSender::send`] from a plain thread (not an async task).
    pub fn send_blocking(&self, chunk: Bytes) -> bool {
        block_on(self.send(chunk))
    }

    /// Marks the stream complete.
    pub async fn end(&self) {
        let _ = self.0.send(Chunk::End).await;
    }

    /// Ends the stream with `e`.
    pub async fn fail(&self, e: Error) {
        let _ = self.0.send(Chunk::Failed(e)).await;
    }

    /// [`ChunkSender::end`] or [`ChunkSender::fail`] from a plain thread.
    pub fn finish_blocking(&self, outcome: crate::Result<()>) {
        block_on(async {
            match outcome {
                Ok(()) => self.end().await,
                Err(e) => self.fail(e).await,
            }
        })
    }

    /// Resolves when the reader is gone.
    pub async fn closed(&self) {
        self.0.closed().await
    }
}

impl ChunkReader {
    /// The next chunk (what is left of the current one first); None at the end.
    pub fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            if !self.current.is_empty() {
                return Ok(Some(std::mem::take(&mut self.current)));
            }
            match &self.state {
                State::Open => {}
                State::Done => return Ok(None),
                State::Failed(kind, msg) => {
                    return Err(again(*kind, format!("{msg} (already reported)")).into_io());
                }
            }
            match block_on(self.rx.recv()) {
                Some(Chunk::Data(b)) => self.current = b,
                Some(Chunk::End) => self.state = State::Done,
                Some(Chunk::Failed(e)) => {
                    self.state = State::Failed(e.kind(), e.to_string());
                    return Err(e.into_io());
                }
                None => {
                    let e = Error::SourceUnavailable(self.interrupted.clone());
                    self.state = State::Failed(e.kind(), e.to_string());
                    return Err(e.into_io());
                }
            }
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.current.is_empty() {
            match self.next_chunk()? {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

/// A failure reported once already, of the same kind where a variant carries only a message.
fn again(kind: ErrorKind, msg: String) -> Error {
    match kind {
        ErrorKind::InvalidInput => Error::InvalidInput(msg),
        ErrorKind::Unsupported => Error::Unsupported(msg),
        ErrorKind::CorruptImage => Error::Corrupt(msg),
        ErrorKind::SourceRejected => Error::SourceRejected(msg),
        _ => Error::SourceUnavailable(msg),
    }
}

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

/// Polls `fut` to completion on the calling thread, parking it in between.
fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One hop: the bytes a producer thread sends are the very bytes the reader hands out (the
    /// same allocation, no stage or copy in between), and the end comes through after them.
    #[test]
    fn chunks_cross_one_channel_as_they_were_sent() {
        let (tx, mut rx) = channel(2, "interrupted");
        let sent: Vec<Bytes> = (0..5u8).map(|i| Bytes::from(vec![i; 1000])).collect();
        let addresses: Vec<usize> = sent.iter().map(|b| b.as_ptr() as usize).collect();
        let producer = std::thread::spawn(move || {
            for chunk in sent {
                assert!(tx.send_blocking(chunk));
            }
            tx.finish_blocking(Ok(()));
        });
        let mut got = Vec::new();
        while let Some(chunk) = rx.next_chunk().unwrap() {
            got.push(chunk.as_ptr() as usize);
        }
        producer.join().unwrap();
        assert_eq!(got, addresses);
        assert_eq!(rx.read(&mut [0u8; 8]).unwrap(), 0);
    }

    #[test]
    fn a_producer_gone_without_an_end_is_an_interruption() {
        let (tx, mut rx) = channel(2, "the upload was interrupted");
        std::thread::spawn(move || {
            tx.send_blocking(Bytes::from_static(b"abc"));
        })
        .join()
        .unwrap();
        let mut buf = Vec::new();
        let err = rx.read_to_end(&mut buf).unwrap_err();
        assert_eq!(buf, b"abc");
        let e = Error::from_read(err, "source");
        assert_eq!(e.kind(), ErrorKind::SourceUnavailable);
        assert!(e.to_string().contains("the upload was interrupted"), "{e}");
        let again = rx.read(&mut [0u8; 4]).unwrap_err();
        assert!(again.to_string().contains("already reported"), "{again}");
    }

    #[test]
    fn a_failure_keeps_its_kind() {
        let (tx, mut rx) = channel(1, "x");
        std::thread::spawn(move || {
            tx.finish_blocking(Err(Error::SourceRejected("404".into())));
        });
        let err = Error::from_read(rx.read(&mut [0u8; 4]).unwrap_err(), "source");
        assert_eq!(err.kind(), ErrorKind::SourceRejected);
        let again = Error::from_read(rx.read(&mut [0u8; 4]).unwrap_err(), "source");
        assert_eq!(again.kind(), ErrorKind::SourceRejected);
    }
}
