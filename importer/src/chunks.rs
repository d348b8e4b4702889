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
//! HTTP/1.1 or TLS) gathers them with [`Forward`] (or [`Coalesce`]) before sending them.

use std::io::{self, Read};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

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

/// Batch size of [`Coalesce`] and [`Forward`].
pub const BATCH: usize = 256 << 10;

/// Frames gathered into batches of up to [`BATCH`] bytes. A lone frame is kept as it is and
/// copied only when another joins it, so a stream that hands over one frame at a time costs no
/// copy. A frame that would overflow the batch starts the next one (the gathered bytes become
/// ready to go), and a frame of [`BATCH`] or more is a batch by itself: no batch is larger than
/// the larger of the two.
#[derive(Default)]
struct Batch {
    /// A batch closed by a frame that did not fit into it.
    ready: Option<Bytes>,
    first: Option<Bytes>,
    pending: BytesMut,
}

impl Batch {
    fn gathered(&self) -> usize {
        self.first.as_ref().map_or(self.pending.len(), Bytes::len)
    }

    fn is_empty(&self) -> bool {
        self.ready.is_none() && self.gathered() == 0
    }

    /// Adds `frame`. Take what is full ([`Batch::take_full`]) before pushing again.
    fn push(&mut self, frame: Bytes) {
        debug_assert!(self.ready.is_none(), "a full batch was not taken");
        let gathered = self.gathered();
        if gathered > 0 && gathered + frame.len() > BATCH {
            self.ready = Some(self.take_gathered());
        }
        if let Some(first) = self.first.take() {
            self.pending.reserve(BATCH);
            self.pending.extend_from_slice(&first);
        }
        if self.pending.is_empty() {
            self.first = Some(frame);
        } else {
            self.pending.extend_from_slice(&frame);
        }
    }

    /// A batch that is full (or closed by a frame that did not fit), if any.
    fn take_full(&mut self) -> Option<Bytes> {
        self.ready
            .take()
            .or_else(|| (self.gathered() >= BATCH).then(|| self.take_gathered()))
    }

    /// What is gathered, a batch at a time, full or not.
    fn take(&mut self) -> Option<Bytes> {
        self.ready
            .take()
            .or_else(|| (self.gathered() > 0).then(|| self.take_gathered()))
    }

    fn take_gathered(&mut self) -> Bytes {
        self.first
            .take()
            .unwrap_or_else(|| self.pending.split().freeze())
    }
}

/// Gathers the frames a body stream already has ready (HTTP/1.1 bodies come in frames of a few
/// KiB) into batches (see [`Batch`]), so each hop and the thread reading the chunks handle a few
/// large chunks instead of many small ones. It never waits for more: when the inner stream is not
/// ready, what is gathered goes out at once. Bytes that came before an error or the end are
/// yielded first, the error or end after them.
///
/// Most streams (hyper's bodies among them) hand over one frame per poll, so this batches only
/// where the consumer is slower than the producer's polls; a producer that feeds a
/// [`ChunkSender`] uses [`Forward`], which also gathers the frames arriving while the channel is
/// full.
pub struct Coalesce<S, E> {
    inner: S,
    batch: Batch,
    /// What comes after the gathered bytes: the inner stream's end or error.
    held: Option<Option<Result<Bytes, E>>>,
    finished: bool,
}

impl<S, E> Coalesce<S, E> {
    pub fn new(inner: S) -> Self {
        Coalesce {
            inner,
            batch: Batch::default(),
            held: None,
            finished: false,
        }
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
        if let Some(full) = this.batch.take_full() {
            return Poll::Ready(Some(Ok(full)));
        }
        if let Some(held) = this.held.take() {
            if let Some(rest) = this.batch.take() {
                this.held = Some(held);
                return Poll::Ready(Some(Ok(rest)));
            }
            this.finished = held.is_none();
            return Poll::Ready(held);
        }
        if this.finished {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    this.batch.push(frame);
                    if let Some(full) = this.batch.take_full() {
                        return Poll::Ready(Some(Ok(full)));
                    }
                }
                Poll::Ready(last) => match this.batch.take() {
                    Some(rest) => {
                        this.held = Some(last);
                        return Poll::Ready(Some(Ok(rest)));
                    }
                    None => {
                        this.finished = last.is_none();
                        return Poll::Ready(last);
                    }
                },
                Poll::Pending => {
                    return match this.batch.take() {
                        Some(rest) => Poll::Ready(Some(Ok(rest))),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }
}

/// What [`Forward::next`] found.
#[derive(Debug)]
pub enum Forwarded<E> {
    /// A frame: the caller checks it and hands what it keeps to [`Forward::push`].
    Frame(Bytes),
    /// The stream ended; everything pushed has been sent.
    End,
    /// The stream failed; everything pushed before has been sent.
    Failed(E),
    /// No frame came within the idle timeout, and nothing pushed waits to be sent.
    Idle,
    /// The reader is gone.
    Closed,
}

/// Moves a body's frames into a [`ChunkSender`] in batches (see [`Batch`]). While a batch waits
/// for room in the channel, the frames that arrive in the meantime join it, so a consumer that
/// falls behind gets a few large chunks rather than a queue of small ones (hyper hands a body
/// over one frame at a time: frames are seldom ready together, but they pile up while the
/// channel is full). Memory stays bounded: a full batch waits for room before more is read.
///
/// The caller's loop: [`Forward::next`], check the frame (offsets, digests, limits), then
/// [`Forward::push`]. Everything pushed has been sent when `next` reports the end or a failure;
/// a caller that gives up for a reason of its own and wants the bytes delivered calls
/// [`Forward::flush`].
pub struct Forward<S> {
    frames: S,
    batch: Batch,
    network_wait: Duration,
}

impl<S, E> Forward<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    pub fn new(frames: S) -> Self {
        Forward {
            frames,
            batch: Batch::default(),
            network_wait: Duration::ZERO,
        }
    }

    /// Total time spent waiting for frames with nothing to send (time blocked on a full channel
    /// is not counted: a slow consumer is not the producer's fault).
    pub fn network_wait(&self) -> Duration {
        self.network_wait
    }

    /// Adds a checked frame to the batch.
    pub fn push(&mut self, frame: Bytes) {
        if !frame.is_empty() {
            self.batch.push(frame);
        }
    }

    /// Sends everything pushed; false when the reader is gone.
    pub async fn flush(&mut self, tx: &ChunkSender) -> bool {
        while let Some(batch) = self.batch.take() {
            if !tx.send(batch).await {
                return false;
            }
        }
        true
    }

    /// The next frame, sending the batch as soon as the channel has room. Waits at most `idle`
    /// for a frame when nothing is left to send.
    pub async fn next(&mut self, tx: &ChunkSender, idle: Duration) -> Forwarded<E> {
        loop {
            if let Some(full) = self.batch.take_full() {
                if !tx.send(full).await {
                    return Forwarded::Closed;
                }
                continue;
            }
            let item = if self.batch.is_empty() {
                let asked = tokio::time::Instant::now();
                let next = tokio::select! {
                    _ = tx.closed() => return Forwarded::Closed,
                    next = tokio::time::timeout(idle, self.frames.next()) => next,
                };
                self.network_wait += asked.elapsed();
                match next {
                    Ok(item) => item,
                    Err(_) => return Forwarded::Idle,
                }
            } else {
                // Frames first: those already there join the batch before it goes.
                tokio::select! {
                    biased;
                    item = self.frames.next() => item,
                    permit = tx.0.reserve() => match permit {
                        Ok(permit) => {
                            if let Some(batch) = self.batch.take() {
                                permit.send(Chunk::Data(batch));
                            }
                            continue;
                        }
                        Err(_) => return Forwarded::Closed,
                    },
                }
            };
            return match item {
                Some(Ok(frame)) => Forwarded::Frame(frame),
                last => {
                    if !self.flush(tx).await {
                        return Forwarded::Closed;
                    }
                    match last {
                        Some(Err(e)) => Forwarded::Failed(e),
                        _ => Forwarded::End,
                    }
                }
            };
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

    /// Drives a [`Forward`] the way a body pump does, ending the chunk stream as the frames did.
    fn forward_all(
        frames: impl Stream<Item = Result<Bytes, String>> + Unpin + Send + 'static,
        tx: ChunkSender,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut fwd = Forward::new(frames);
            loop {
                match fwd.next(&tx, Duration::from_secs(60)).await {
                    Forwarded::Frame(frame) => fwd.push(frame),
                    Forwarded::End => return tx.end().await,
                    Forwarded::Failed(e) => return tx.fail(Error::SourceUnavailable(e)).await,
                    other => panic!("{other:?}"),
                }
            }
        })
    }

    fn read_all(mut rx: ChunkReader) -> (Vec<Bytes>, Option<io::Error>) {
        let mut chunks = Vec::new();
        loop {
            match rx.next_chunk() {
                Ok(Some(chunk)) => chunks.push(chunk),
                Ok(None) => return (chunks, None),
                Err(e) => return (chunks, Some(e)),
            }
        }
    }

    /// Frames that come one at a time (as hyper hands a body over) while the channel is full
    /// join one batch: the reader, once it reads, gets two chunks for ten frames.
    #[tokio::test]
    async fn frames_arriving_while_the_channel_is_full_go_out_as_one_chunk() {
        let (tx, rx) = channel(1, "interrupted");
        let (frame_tx, frame_rx) = tokio::sync::mpsc::channel::<Result<Bytes, String>>(1);
        let forwarder = forward_all(tokio_stream_like(frame_rx), tx);
        let sent: Vec<Bytes> = (0..10u8).map(|i| Bytes::from(vec![i; 4096])).collect();
        for frame in &sent {
            frame_tx.send(Ok(frame.clone())).await.unwrap();
            // One frame at a time: the next is sent only once the forwarder has taken this one.
            while frame_tx.capacity() < frame_tx.max_capacity() {
                tokio::task::yield_now().await;
            }
        }
        drop(frame_tx);
        let (chunks, failure) = tokio::task::spawn_blocking(move || read_all(rx))
            .await
            .unwrap();
        forwarder.abort();
        assert!(failure.is_none(), "{failure:?}");
        let sizes: Vec<usize> = chunks.iter().map(Bytes::len).collect();
        assert_eq!(sizes, [4096, 9 * 4096]);
        assert_eq!(chunks.concat(), sent.concat());
        assert_eq!(
            chunks[0].as_ptr(),
            sent[0].as_ptr(),
            "a lone frame is not copied"
        );
    }

    /// A failing body's bytes are all sent before its failure, so a resume starts after them.
    #[tokio::test]
    async fn bytes_pushed_before_a_failure_reach_the_reader() {
        let (tx, rx) = channel(1, "interrupted");
        let reader = tokio::task::spawn_blocking(move || read_all(rx));
        let mut input = frames(3, 1000);
        input.push(Err("connection reset".to_string()));
        let forwarder = forward_all(futures_util::stream::iter(input), tx);
        let (chunks, failure) = reader.await.unwrap();
        forwarder.abort();
        assert_eq!(chunks.concat().len(), 3000);
        let e = Error::from_read(
            failure.expect("the failure comes after the bytes"),
            "source",
        );
        assert!(e.to_string().contains("connection reset"), "{e}");
    }

    /// A full batch waits for room before more frames are read: with the reader stalled, the
    /// forwarder holds at most the channel's chunks and one batch.
    #[tokio::test]
    async fn a_stalled_reader_stops_the_reading_of_frames() {
        let (tx, rx) = channel(1, "interrupted");
        let pulled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = pulled.clone();
        let endless = futures_util::stream::repeat_with(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok::<_, String>(Bytes::from(vec![1u8; 64 << 10]))
        });
        let forwarder = forward_all(endless, tx);
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
        let per_batch = BATCH / (64 << 10);
        // One batch in the channel's slot, one full batch waiting for room, nothing more.
        assert_eq!(
            pulled.load(std::sync::atomic::Ordering::Relaxed),
            2 * per_batch
        );
        forwarder.abort();
        drop(rx);
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
        assert!(!Error::carried_by(&err));
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
