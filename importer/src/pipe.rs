//! Pipeline stages: a thread that reads one stream and hands its bytes, in bounded chunks, to the
//! next stage through a bounded channel. Memory between two stages is at most
//! [`StageBuffers::memory`], whatever the image size: the reader hands each emptied chunk back to the
//! stage for reuse, so a long import does not churn the allocator. A source whose bytes already
//! come through a channel from a thread of its own ([`crate::chunks`]) gets no stage thread:
//! [`feed`] observes its chunks where the consumer reads them.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use crate::chunks::ChunkReader;

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

type Chunk = io::Result<Vec<u8>>;

/// The receiving end of a stage: a blocking [`Read`].
pub struct ChannelReader {
    rx: Receiver<Chunk>,
    /// Emptied chunks go back to the stage for reuse.
    recycle: SyncSender<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
    done: bool,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    let used = std::mem::replace(&mut self.current, chunk);
                    if used.capacity() > 0 {
                        let _ = self.recycle.try_send(used);
                    }
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                // The stage ended without an error: end of stream.
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
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
pub fn spawn<R, O>(name: &str, input: R, observer: O) -> (ChannelReader, Stage<O>)
where
    R: Read + Send + 'static,
    O: ChunkObserver,
{
    spawn_with(name, input, observer, StageBuffers::DEFAULT)
}

/// [`spawn`] with the given chunk size and depth.
pub fn spawn_with<R, O>(
    name: &str,
    mut input: R,
    mut observer: O,
    buffers: StageBuffers,
) -> (ChannelReader, Stage<O>)
where
    R: Read + Send + 'static,
    O: ChunkObserver,
{
    let StageBuffers { depth, chunk: size } = buffers;
    let (tx, rx) = sync_channel::<Chunk>(depth.max(1));
    // Every chunk the stage ever allocates fits in the recycling channel, so the consumer never
    // has to drop one, and the stage waits for one to come back instead of allocating anew
    // (fresh chunks freed on another thread fragment the heap into tens of MiB over an import).
    let pool = depth.max(1) + 2;
    let (recycle, recycled) = sync_channel::<Vec<u8>>(pool);
    let cancel = Arc::new(AtomicBool::new(false));
    let stop = cancel.clone();
    let handle = thread::Builder::new()
        .name(format!("quarry-{name}"))
        .spawn(move || {
            let mut tx: Option<SyncSender<Chunk>> = Some(tx);
            let mut allocated = 0;
            // Once the consumer is gone, one chunk serves for the rest of the input.
            let mut spare: Option<Vec<u8>> = None;
            loop {
                if stop.load(Ordering::Relaxed) {
                    return Err(io::Error::other("stage cancelled"));
                }
                let mut chunk = match spare.take().map_or_else(|| recycled.try_recv(), Ok) {
                    Ok(chunk) => chunk,
                    Err(_) if allocated < pool => {
                        allocated += 1;
                        Vec::new()
                    }
                    // All chunks are out: the consumer hands one back once it has read it, or
                    // is gone (then the stage reads on alone for the observer).
                    Err(_) => recycled.recv().unwrap_or_default(),
                };
                chunk.resize(size, 0);
                let n = match read_full(&mut input, &mut chunk) {
                    Ok(n) => n,
                    Err(e) => {
                        let copy = io::Error::new(e.kind(), e.to_string());
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(Err(e));
                            return Err(copy);
                        }
                        return Err(e);
                    }
                };
                if n == 0 {
                    return Ok(observer);
                }
                chunk.truncate(n);
                observer.observe(&chunk);
                match &tx {
                    Some(sender) => {
                        if let Err(returned) = sender.send(Ok(chunk)) {
                            // The consumer is done: keep reading so the observer sees every byte.
                            tx = None;
                            spare = returned.0.ok();
                        }
                    }
                    None => spare = Some(chunk),
                }
            }
        })
        .expect("spawning a pipeline thread");
    let reader = ChannelReader {
        rx,
        recycle,
        current: Vec::new(),
        pos: 0,
        done: false,
    };
    (
        reader,
        Stage {
            kind: StageKind::Thread { handle, cancel },
        },
    )
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
