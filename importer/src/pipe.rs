//! Pipeline stages: a thread that reads one stream and hands its bytes, in bounded chunks, to the
//! next stage through the one chunk channel ([`crate::chunks`]). Memory between two stages is at
//! most [`StageBuffers::memory`], whatever the image size: a chunk's buffer goes back to the stage
//! when the reader drops the chunk, so a long import does not churn the allocator. A source whose
//! bytes already come through a channel from a thread of its own gets no stage thread: [`feed`]
//! observes its chunks where the consumer reads them.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use bytes::Bytes;

use crate::chunks::{self, ChunkReader};

/// Chunk size handed between stages.
pub const CHUNK_SIZE: usize = 256 << 10;
/// Chunks in flight between two stages.
pub const DEPTH: usize = 8;

/// How much one stage holds: chunks in flight and their size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageBuffers {
    pub depth: usize,
    pub chunk: usize,
}

impl StageBuffers {
    /// Decouples a reader from a consumer of about the same speed.
    pub const DEFAULT: StageBuffers = StageBuffers {
        depth: DEPTH,
        chunk: CHUNK_SIZE,
    };
    /// For a consumer that buffers its input itself and is far slower than the reader (liblzma
    /// copies whole compressed blocks into its threads' buffers): a few small chunks suffice.
    pub const LEAN: StageBuffers = StageBuffers {
        depth: 2,
        chunk: 64 << 10,
    };

    /// The most the stage holds at once: the chunks in the channel, the one being filled and the
    /// one being read (the stage allocates no more, see [`spawn_with`]).
    pub const fn memory(self) -> usize {
        (self.depth + 2) * self.chunk
    }
}

/// Lowers the calling thread's scheduling priority (nice 10) for CPU-bound helpers (inflating
/// workers): on a machine with fewer cores than runnable threads, the thread that feeds the
/// device then runs as soon as it has work, so the device does not wait behind decoding that can
/// wait. Best effort: a failure changes nothing but the order.
pub fn lower_priority() {
    // SAFETY: gettid and setpriority take no pointers.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// What a stage does with each chunk besides passing it on (hashing, counting progress).
pub trait ChunkObserver: Send + 'static {
    fn observe(&mut self, chunk: &[u8]);
}

impl ChunkObserver for () {
    fn observe(&mut self, _: &[u8]) {}
}

/// A running stage; `finish` joins it and returns its observer.
pub struct Stage<O> {
    kind: StageKind<O>,
}

enum StageKind<O> {
    /// A thread reading its input into chunks ([`spawn`]).
    Thread {
        handle: JoinHandle<io::Result<O>>,
        cancel: Arc<AtomicBool>,
    },
    /// Chunks that another thread already sends ([`feed`]): observed as they are read.
    Fed(Arc<Mutex<Fed<O>>>),
}

struct Fed<O> {
    chunks: ChunkReader,
    observer: Option<O>,
}

impl<O> Stage<O> {
    /// Joins the stage. A stage whose consumer stopped early reads its input to the end first
    /// (so the observer saw every byte) unless [`Stage::cancel`] was called.
    pub fn finish(self) -> io::Result<O>
    where
        O: ChunkObserver,
    {
        match self.kind {
            StageKind::Thread { handle, .. } => handle
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("pipeline stage panicked"))),
            StageKind::Fed(fed) => {
                let mut fed = fed.lock().unwrap_or_else(|p| p.into_inner());
                let Fed { chunks, observer } = &mut *fed;
                let mut observer = observer
                    .take()
                    .ok_or_else(|| io::Error::other("pipeline stage finished twice"))?;
                while let Some(chunk) = chunks.next_chunk()? {
                    observer.observe(&chunk);
                }
                Ok(observer)
            }
        }
    }

    /// Stops the stage at its next chunk, without waiting: its input may be blocked (stdin,
    /// a stalled connection) and the import has already failed.
    pub fn cancel(self) {
        if let StageKind::Thread { cancel, .. } = self.kind {
            cancel.store(true, Ordering::Relaxed);
        }
    }
}

/// The reading end of a [`feed`] stage.
pub struct FedReader<O>(Arc<Mutex<Fed<O>>>);

impl<O: ChunkObserver> Read for FedReader<O> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut fed = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = fed.chunks.read(buf)?;
        if let Some(observer) = fed.observer.as_mut() {
            observer.observe(&buf[..n]);
        }
        Ok(n)
    }
}

/// A stage over chunks another thread already sends (an HTTP transfer, an upload's body): no
/// thread and no channel of its own, so the bytes cross one hop from the thread that received
/// them to the consumer. `observer` sees them as the consumer reads them, and the rest when
/// the stage finishes.
pub fn feed<O: ChunkObserver>(chunks: ChunkReader, observer: O) -> (FedReader<O>, Stage<O>) {
    let fed = Arc::new(Mutex::new(Fed {
        chunks,
        observer: Some(observer),
    }));
    (
        FedReader(fed.clone()),
        Stage {
            kind: StageKind::Fed(fed),
        },
    )
}

/// Starts a thread that reads `input` in chunks, shows each to `observer`, and sends it on.
pub fn spawn<R, O>(name: &str, input: R, observer: O) -> (ChunkReader, Stage<O>)
where
    R: Read + Send + 'static,
    O: ChunkObserver,
{
    spawn_with(name, input, observer, StageBuffers::DEFAULT)
}

/// [`spawn`] with the given chunk size and depth. An error reading `input` reaches the reader as
/// the `io::Error` it is (its kind and message say what the input was).
pub fn spawn_with<R, O>(
    name: &str,
    mut input: R,
    mut observer: O,
    buffers: StageBuffers,
) -> (ChunkReader, Stage<O>)
where
    R: Read + Send + 'static,
    O: ChunkObserver,
{
    let StageBuffers { depth, chunk: size } = buffers;
    let (tx, reader) = chunks::channel(
        depth,
        format!("the {name} stage stopped before the end of its input"),
    );
    // Every buffer the stage ever allocates fits in the return channel, so a dropped chunk's
    // buffer always finds its way back, and the stage waits for one instead of allocating anew
    // (fresh buffers freed on another thread fragment the heap into tens of MiB over an import).
    let pool = depth.max(1) + 2;
    let (home, returned) = sync_channel::<Vec<u8>>(pool);
    let cancel = Arc::new(AtomicBool::new(false));
    let stop = cancel.clone();
    let handle = thread::Builder::new()
        .name(format!("quarry-{name}"))
        .spawn(move || {
            // None once the consumer is gone: the stage reads on alone for the observer.
            let mut consumer = Some(tx);
            let mut allocated = 0;
            loop {
                if stop.load(Ordering::Relaxed) {
                    return Err(io::Error::other("stage cancelled"));
                }
                let mut buf = match returned.try_recv() {
                    Ok(buf) => buf,
                    Err(_) if allocated < pool => {
                        allocated += 1;
                        Vec::new()
                    }
                    // All buffers are out: the consumer drops a chunk once it has read it.
                    Err(_) => returned.recv().unwrap_or_default(),
                };
                // A returned buffer is already this long: resizing writes nothing.
                buf.resize(size, 0);
                let n = match read_full(&mut input, &mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let Some(tx) = consumer.take() else {
                            return Err(e);
                        };
                        let copy = io::Error::new(e.kind(), e.to_string());
                        tx.fail_io_blocking(e);
                        return Err(copy);
                    }
                };
                if n == 0 {
                    if let Some(tx) = consumer {
                        tx.finish_blocking(Ok(()));
                    }
                    return Ok(observer);
                }
                observer.observe(&buf[..n]);
                let chunk = Bytes::from_owner(Lent {
                    buf,
                    len: n,
                    home: home.clone(),
                });
                // A chunk the consumer did not take is dropped here, and its buffer comes back.
                if consumer.as_ref().is_some_and(|tx| !tx.send_blocking(chunk)) {
                    consumer = None;
                }
            }
        })
        .expect("spawning a pipeline thread");
    (
        reader,
        Stage {
            kind: StageKind::Thread { handle, cancel },
        },
    )
}

/// A stage's buffer lent out as a chunk: back to the stage when the last [`Bytes`] of it drops.
struct Lent {
    buf: Vec<u8>,
    len: usize,
    home: SyncSender<Vec<u8>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // Fails only once the stage is gone (the buffer is then freed).
        let _ = self.home.try_send(std::mem::take(&mut self.buf));
    }
}

/// Reads until `buf` is full or the stream ends.
pub(crate) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(u64);
    impl ChunkObserver for Count {
        fn observe(&mut self, chunk: &[u8]) {
            self.0 += chunk.len() as u64;
        }
    }

    #[test]
    fn passes_every_byte_in_order() {
        let data: Vec<u8> = (0..3 * CHUNK_SIZE + 17).map(|i| (i % 251) as u8).collect();
        let (mut rx, stage) = spawn("t", io::Cursor::new(data.clone()), Count(0));
        let mut out = Vec::new();
        rx.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
        assert_eq!(stage.finish().unwrap().0, data.len() as u64);
    }

    #[test]
    fn a_lean_stage_passes_every_byte_in_order() {
        let data: Vec<u8> = (0..5 * StageBuffers::LEAN.chunk + 3)
            .map(|i| (i % 253) as u8)
            .collect();
        let (mut rx, stage) = spawn_with(
            "t",
            io::Cursor::new(data.clone()),
            Count(0),
            StageBuffers::LEAN,
        );
        let mut out = Vec::new();
        rx.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
        assert_eq!(stage.finish().unwrap().0, data.len() as u64);
    }

    #[test]
    fn observer_sees_everything_even_when_the_consumer_stops_early() {
        let data = vec![7u8; 10 * CHUNK_SIZE];
        let (mut rx, stage) = spawn("t", io::Cursor::new(data), Count(0));
        let mut first = [0u8; 10];
        rx.read_exact(&mut first).unwrap();
        drop(rx);
        assert_eq!(stage.finish().unwrap().0, 10 * CHUNK_SIZE as u64);
    }

    #[test]
    fn a_long_stream_reuses_the_stage_s_chunks() {
        struct Buffers(std::collections::HashSet<usize>);
        impl ChunkObserver for Buffers {
            fn observe(&mut self, chunk: &[u8]) {
                self.0.insert(chunk.as_ptr() as usize);
            }
        }
        let geometry = StageBuffers {
            depth: 2,
            chunk: 4096,
        };
        let data: Vec<u8> = (0..200 * geometry.chunk + 5)
            .map(|i| (i % 241) as u8)
            .collect();
        let (mut rx, stage) = spawn_with(
            "t",
            io::Cursor::new(data.clone()),
            Buffers(Default::default()),
            geometry,
        );
        // a consumer slower than the stage, reading less than a chunk at a time
        let mut out = Vec::new();
        let mut piece = [0u8; 1000];
        loop {
            let n = rx.read(&mut piece).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&piece[..n]);
        }
        assert!(out == data);
        let buffers = stage.finish().unwrap().0.len();
        assert!(buffers <= geometry.depth + 2, "{buffers} chunks allocated");
    }

    #[test]
    fn a_fed_stage_observes_every_byte_without_a_thread_of_its_own() {
        let (tx, chunks) = crate::chunks::channel(2, "cut");
        let producer = thread::spawn(move || {
            for i in 0..10u8 {
                assert!(tx.send_blocking(bytes::Bytes::from(vec![i; 4096])));
            }
            tx.finish_blocking(Ok(()));
        });
        let (mut rx, stage) = feed(chunks, Count(0));
        let mut first = [0u8; 5000];
        rx.read_exact(&mut first).unwrap();
        assert_eq!(&first[4096..], &[1u8; 904][..]);
        drop(rx);
        // The consumer stopped early: finishing reads the rest for the observer.
        assert_eq!(stage.finish().unwrap().0, 10 * 4096);
        producer.join().unwrap();
    }

    /// A stage that dies mid-stream (its input panicked) leaves the consumer an error, never what
    /// would pass for the end of the stream.
    #[test]
    fn a_stage_that_dies_is_no_clean_end() {
        struct Dies(u32);
        impl Read for Dies {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.0 += 1;
                assert!(self.0 <= 3, "the input died");
                buf[0] = 1;
                Ok(1)
            }
        }
        let small = StageBuffers { depth: 2, chunk: 2 };
        let (mut rx, stage) = spawn_with("t", Dies(0), (), small);
        let mut out = Vec::new();
        let err = crate::Error::from_read(rx.read_to_end(&mut out).unwrap_err(), "x");
        assert_eq!(err.kind(), crate::ErrorKind::SourceUnavailable, "{err}");
        assert!(err.to_string().contains("the t stage stopped"), "{err}");
        assert_eq!(out, [1, 1]);
        assert!(stage.finish().is_err());
    }

    #[test]
    fn errors_reach_the_consumer() {
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::ConnectionReset, "boom"))
            }
        }
        let (mut rx, stage) = spawn("t", Failing, ());
        let err = rx.read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert!(stage.finish().is_err());
    }
}
