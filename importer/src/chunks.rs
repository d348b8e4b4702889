//! The one adapter between a producer of byte chunks on another thread (an HTTP transfer, a
//! registry's layer walk, an upload's request body, a pipeline stage) and a blocking [`Read`].
//!
//! The producer sends [`Bytes`] into a bounded channel ([`ChunkSender`], from async code or a
//! plain thread) and says how the stream ended: [`ChunkSender::end`] (complete and checked),
//! [`ChunkSender::fail`], or [`ChunkSender::fail_io_blocking`] (a pipeline stage's input failed:
//! the reader returns that `io::Error` as it is). A producer that goes away without either is an
//! interruption: the reader fails with the message given to [`channel`]. The reader
//! ([`ChunkReader`]) hands out the chunks' bytes as they are, without an intermediate buffer, so
//! the bytes cross exactly one channel between the thread that received them and the one that
//! decodes them.
//!
//! `read` blocks the calling thread (parking it until the next chunk): call it from a plain
//! thread, not from an async task. It does not panic when the caller happens to be inside a
//! runtime (unlike tokio's `blocking_recv`).
//!
//! Every chunk costs the reader a wake-up: a producer of network frames (a few KiB each over
//! HTTP/1.1 or TLS) batches the frames it already has with [`Coalesce`] before sending them.

use std::io::{self, Read};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::Stream;
use tokio::sync::mpsc;

use crate::source::{ByteSource, SourceInfo};
use crate::{Error, ErrorKind};

enum Chunk {
    Data(Bytes),
    /// The stream is complete (and, where the producer checks it, of the right length).
    End,
    /// A [`crate::Error`] carried inside (see [`Error::into_io`]), or a stage input's own error.
    Failed(io::Error),
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
    Failed(Reported),
}

/// A failure the reader returned once, repeated (of the same kind) on later reads.
enum Reported {
    Quarry(ErrorKind, String),
    Io(io::ErrorKind, String),
}

impl Reported {
    fn of(e: &io::Error) -> Self {
        match e.get_ref().and_then(|inner| inner.downcast_ref::<Error>()) {
            Some(inner) => Reported::Quarry(inner.kind(), inner.to_string()),
            None => Reported::Io(e.kind(), e.to_string()),
        }
    }

    fn again(&self) -> io::Error {
        match self {
            Reported::Quarry(kind, msg) => {
                again(*kind, format!("{msg} (already reported)")).into_io()
            }
            Reported::Io(kind, msg) => io::Error::new(*kind, format!("{msg} (already reported)")),
        }
    }
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
        let _ = self.0.send(Chunk::Failed(e.into_io())).await;
    }

    /// Ends the stream with `e` as it is, from a plain thread: a pipeline stage's input failed,
    /// and the consumer classifies the error as if it had read that input itself.
    pub fn fail_io_blocking(&self, e: io::Error) {
        let _ = block_on(self.0.send(Chunk::Failed(e)));
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
                State::Failed(reported) => return Err(reported.again()),
            }
            let failure = match block_on(self.rx.recv()) {
                Some(Chunk::Data(b)) => {
                    self.current = b;
                    continue;
                }
                Some(Chunk::End) => {
                    self.state = State::Done;
                    continue;
                }
                Some(Chunk::Failed(e)) => e,
                None => Error::SourceUnavailable(self.interrupted.clone()).into_io(),
            };
            self.state = State::Failed(Reported::of(&failure));
            return Err(failure);
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

/// Batch size of [`Coalesce`].
pub const BATCH: usize = 256 << 10;

/// Gathers the frames a body stream already has ready (HTTP/1.1 bodies come in frames of a few
/// KiB) into batches of up to [`BATCH`] bytes, so each hop and the thread reading the chunks
/// handle a few large chunks instead of many small ones. It never waits for more: when the inner
/// stream is not ready, what is gathered goes out at once. A batch never grows past [`BATCH`]
/// (a frame that would overflow it starts the next one), and a frame of [`BATCH`] or more passes
/// as it is, so no chunk is larger than the larger of the two. Bytes that came before an error
/// or the end are yielded first, the error or end after them.
pub struct Coalesce<S, E> {
    inner: S,
    /// A lone frame, kept as it is: it is copied into `pending` only if another joins it, so a
    /// stream that hands over one frame at a time costs no copy.
    first: Option<Bytes>,
    pending: BytesMut,
    /// What comes after the gathered bytes: the inner stream's end or error, or a frame too large
    /// to join them.
    held: Option<Option<Result<Bytes, E>>>,
    finished: bool,
}

impl<S, E> Coalesce<S, E> {
    pub fn new(inner: S) -> Self {
        Coalesce {
            inner,
            first: None,
            pending: BytesMut::new(),
            held: None,
            finished: false,
        }
    }

    fn gathered(&self) -> usize {
        self.first.as_ref().map_or(self.pending.len(), Bytes::len)
    }

    /// The gathered bytes as one chunk.
    fn take(&mut self) -> Bytes {
        self.first
            .take()
            .unwrap_or_else(|| self.pending.split().freeze())
    }
}

impl<S, E> Stream for Coalesce<S, E>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(held) = this.held.take() {
            this.finished = held.is_none();
            return Poll::Ready(held);
        }
        if this.finished {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) if this.gathered() == 0 => {
                    if chunk.len() >= BATCH {
                        return Poll::Ready(Some(Ok(chunk)));
                    }
                    this.first = Some(chunk);
                }
                Poll::Ready(Some(Ok(chunk))) if this.gathered() + chunk.len() > BATCH => {
                    let full = this.take();
                    if chunk.len() >= BATCH {
                        this.held = Some(Some(Ok(chunk)));
                    } else {
                        this.first = Some(chunk);
                    }
                    return Poll::Ready(Some(Ok(full)));
                }
                Poll::Ready(Some(Ok(chunk))) => {
                    if let Some(first) = this.first.take() {
                        this.pending.reserve(BATCH);
                        this.pending.extend_from_slice(&first);
                    }
                    this.pending.extend_from_slice(&chunk);
                    if this.pending.len() == BATCH {
                        return Poll::Ready(Some(Ok(this.take())));
                    }
                }
                Poll::Ready(last) if this.gathered() == 0 => {
                    this.finished = last.is_none();
                    return Poll::Ready(last);
                }
                Poll::Ready(last) => {
                    this.held = Some(last);
                    return Poll::Ready(Some(Ok(this.take())));
                }
                Poll::Pending if this.gathered() == 0 => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Some(Ok(this.take()))),
            }
        }
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
    use futures_util::StreamExt;

    use super::*;

    fn frames(n: usize, size: usize) -> Vec<Result<Bytes, String>> {
        (0..n)
            .map(|i| Ok(Bytes::from(vec![i as u8; size])))
            .collect()
    }

    fn tokio_stream_like<T>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl Stream<Item = T> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }

    #[tokio::test]
    async fn ready_frames_are_batched_and_keep_their_order() {
        let input = frames(200, 4096);
        let expected: Vec<u8> = input.iter().flat_map(|f| f.clone().unwrap()).collect();
        let out: Vec<_> = Coalesce::new(futures_util::stream::iter(input))
            .collect()
            .await;
        assert!(out.iter().all(|b| b.as_ref().unwrap().len() <= BATCH));
        assert_eq!(out.len(), (200 * 4096_usize).div_ceil(BATCH));
        let bytes: Vec<u8> = out.into_iter().flat_map(|b| b.unwrap()).collect();
        assert_eq!(bytes, expected);
    }

    /// A frame with nothing ready to join it goes out as it came: the same bytes, not a copy.
    #[tokio::test]
    async fn a_lone_frame_passes_uncopied() {
        let frame = Bytes::from(vec![7u8; 4096]);
        let input: Vec<Result<Bytes, String>> = vec![Ok(frame.clone())];
        let out: Vec<_> = Coalesce::new(futures_util::stream::iter(input))
            .collect()
            .await;
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ref().unwrap().as_ptr(), frame.as_ptr());
    }

    #[tokio::test]
    async fn bytes_before_an_error_come_out_before_it() {
        let mut input = frames(3, 1000);
        input.push(Err("reset".to_string()));
        input.extend(frames(1, 10));
        let out: Vec<_> = Coalesce::new(futures_util::stream::iter(input))
            .collect()
            .await;
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0].as_ref().unwrap().len(), 3000);
        assert_eq!(out[1].as_ref().unwrap_err(), "reset");
        assert_eq!(out[2].as_ref().unwrap().len(), 10);
    }

    /// A batch never outgrows [`BATCH`]: a frame that would overflow it starts the next batch,
    /// and a frame of a batch's size or more passes as it is (the same bytes, not a copy).
    #[tokio::test]
    async fn no_batch_outgrows_the_larger_of_a_batch_and_a_frame() {
        let big = Bytes::from(vec![9u8; BATCH + 5]);
        let big_at = big.as_ptr();
        let mut input = frames(3, 100 << 10);
        input.push(Ok(Bytes::from_static(b"0123456789")));
        input.push(Ok(big));
        let sent: Vec<u8> = input.iter().flat_map(|f| f.clone().unwrap()).collect();
        let out: Vec<Bytes> = Coalesce::new(futures_util::stream::iter(input))
            .map(Result::unwrap)
            .collect()
            .await;
        let sizes: Vec<usize> = out.iter().map(Bytes::len).collect();
        assert_eq!(sizes, [200 << 10, (100 << 10) + 10, BATCH + 5]);
        assert_eq!(out[2].as_ptr(), big_at);
        assert_eq!(out.concat(), sent);
    }

    #[tokio::test]
    async fn nothing_waits_for_a_full_batch() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, String>>(4);
        let mut s = Coalesce::new(tokio_stream_like(rx));
        tx.send(Ok(Bytes::from_static(b"abc"))).await.unwrap();
        let first = s.next().await.unwrap().unwrap();
        assert_eq!(&first[..], b"abc");
        drop(tx);
        assert!(s.next().await.is_none());
        assert!(s.next().await.is_none());
    }

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

    /// A pipeline stage's input error reaches the reader unchanged (its kind and message are
    /// what the user sees); a later read repeats its kind.
    #[test]
    fn an_io_failure_reaches_the_reader_as_it_is() {
        let (tx, mut rx) = channel(1, "x");
        std::thread::spawn(move || {
            tx.fail_io_blocking(io::Error::new(io::ErrorKind::InvalidData, "bad deflate"));
        });
        let err = rx.read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(err.to_string(), "bad deflate");
        assert!(err.get_ref().is_none_or(|inner| !inner.is::<Error>()));
        let again = rx.read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::InvalidData);
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
