//! Parallel decoding of the compressed pieces of a streamed image (qcow2 clusters, streamOptimized
//! vmdk grains).
//!
//! The reading thread copies the compressed bytes of a batch of pieces out of its read window,
//! hands the batch over and reads on; worker threads, one per core, decode batches in parallel;
//! the batches come back in the order they were handed over, for the reading thread to write.
//! So the window is refilled, and decoded pieces written, while every core decodes, and a corrupt
//! piece is reported after everything before it was written, whatever thread decoded it.
//!
//! Memory: at most [`DEPTH`] batches per worker in flight (in all, whichever workers hold them),
//! plus the one being written and two spare.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::error::{Error, Result};

/// Decodes one piece; each worker has its own, kept from piece to piece.
pub trait PieceDecoder: Send + 'static {
    /// Decodes `src` into `dst` (one piece long): the bytes made, or why the piece is corrupt.
    fn decode(&mut self, src: &[u8], dst: &mut [u8]) -> std::result::Result<usize, String>;
}

/// Batches per worker in flight: one being decoded, one waiting, so a worker never waits for the
/// reading thread between batches.
pub const DEPTH: usize = 2;

/// The decoded pieces of a batch, one piece size apart, and how many bytes each made.
pub type Decoded<'a> = (&'a [u8], &'a [usize]);

/// Compressed pieces to decode, each tagged with where it goes, and then what they decoded to.
pub struct Batch<T> {
    input: Vec<u8>,
    /// `input[from..to]` per piece.
    spans: Vec<(usize, usize)>,
    tags: Vec<T>,
    /// Piece `i` decodes into `out[i * piece..]`, `lens[i]` bytes.
    out: Vec<u8>,
    lens: Vec<usize>,
    /// The first piece that failed, and why (the pieces after it are not decoded).
    failed: Option<(usize, String)>,
}

impl<T> Batch<T> {
    fn new() -> Self {
        Batch {
            input: Vec::new(),
            spans: Vec::new(),
            tags: Vec::new(),
            out: Vec::new(),
            lens: Vec::new(),
            failed: None,
        }
    }

    /// Adds a piece: its compressed bytes, zero-padded to `len` (qemu reads past the end of an
    /// image as zeroes, so the last compressed cluster may be cut short).
    pub fn push(&mut self, tag: T, src: &[u8], len: usize) {
        let from = self.input.len();
        self.input.extend_from_slice(src);
        self.input.resize(from + len.max(src.len()), 0);
        self.spans.push((from, self.input.len()));
        self.tags.push(tag);
    }

    pub fn len(&self) -> usize {
        self.tags.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    pub fn tags(&self) -> &[T] {
        &self.tags
    }

    /// The decoded pieces, one piece size apart, and how many bytes each made; or the first piece
    /// that failed and why.
    pub fn decoded(&self) -> std::result::Result<Decoded<'_>, (&T, &str)> {
        match &self.failed {
            Some((i, why)) => Err((&self.tags[*i], why)),
            None => Ok((&self.out, &self.lens)),
        }
    }

    fn clear(&mut self) {
        self.input.clear();
        self.spans.clear();
        self.tags.clear();
        self.lens.clear();
        self.failed = None;
    }

    fn decode(&mut self, decoder: &mut dyn PieceDecoder, piece: usize) {
        let n = self.spans.len();
        // a reused buffer keeps its old bytes: every decoded piece overwrites what it reports
        self.out.resize(n * piece, 0);
        self.lens.resize(n, 0);
        for (i, &(from, to)) in self.spans.iter().enumerate() {
            let dst = &mut self.out[i * piece..(i + 1) * piece];
            match decoder.decode(&self.input[from..to], dst) {
                Ok(made) => self.lens[i] = made,
                Err(why) => {
                    self.failed = Some((i, why));
                    return;
                }
            }
        }
    }
}

/// One worker and its two queues.
struct Lane<T> {
    work: Option<SyncSender<Batch<T>>>,
    done: Receiver<Batch<T>>,
    thread: Option<JoinHandle<()>>,
}

/// Worker threads decoding batches of pieces of `piece` bytes, handed back in order.
pub struct InflatePool<T> {
    lanes: Vec<Lane<T>>,
    /// Pieces in flight per lane: a batch goes to the least loaded lane (batches differ in size,
    /// and taking turns gave one worker the large ones).
    load: Vec<usize>,
    /// The lanes of the batches in flight, oldest first (each lane decodes in order, so the
    /// oldest batch in flight is the next its lane hands back).
    in_flight: VecDeque<usize>,
    spare: Vec<Batch<T>>,
}

impl<T: Send + 'static> InflatePool<T> {
    /// One worker per core (2 to 4), each with the decoder `make` gives, for pieces that decode
    /// to at most `piece` bytes.
    pub fn new<D: PieceDecoder>(piece: usize, make: impl Fn() -> D) -> Result<Self> {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
        let mut lanes = Vec::with_capacity(workers);
        // Room for every batch in flight, so neither side ever waits on a queue.
        let room = workers * DEPTH;
        for i in 0..workers {
            let (work, inbox) = sync_channel::<Batch<T>>(room);
            let (outbox, done) = sync_channel::<Batch<T>>(room);
            let mut decoder = make();
            let thread = std::thread::Builder::new()
                .name(format!("inflate-{i}"))
                .spawn(move || {
                    // The reading thread feeds the device and the workers: it goes first.
                    crate::pipe::lower_priority();
                    for mut batch in inbox {
                        batch.decode(&mut decoder, piece);
                        if outbox.send(batch).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| Error::io("starting a decoding thread", e))?;
            lanes.push(Lane {
                work: Some(work),
                done,
                thread: Some(thread),
            });
        }
        Ok(InflatePool {
            load: vec![0; lanes.len()],
            lanes,
            in_flight: VecDeque::new(),
            spare: Vec::new(),
        })
    }

    /// An empty batch (a returned one's buffers reused).
    pub fn batch(&mut self) -> Batch<T> {
        let mut b = self.spare.pop().unwrap_or_else(Batch::new);
        b.clear();
        b
    }

    /// Gives a written batch's buffers back.
    pub fn recycle(&mut self, batch: Batch<T>) {
        if self.spare.len() < 2 {
            self.spare.push(batch);
        }
    }

    /// Hands `batch` over; when [`DEPTH`] batches per worker are in flight, waits for the oldest
    /// and returns it decoded.
    pub fn submit(&mut self, batch: Batch<T>) -> Result<Option<Batch<T>>> {
        if batch.is_empty() {
            self.recycle(batch);
            return Ok(None);
        }
        let lane = (0..self.lanes.len())
            .min_by_key(|&l| self.load[l])
            .expect("at least two lanes");
        self.load[lane] += batch.len();
        let Some(work) = self.lanes[lane].work.as_ref() else {
            return Err(stopped());
        };
        if work.send(batch).is_err() {
            return Err(stopped());
        }
        self.in_flight.push_back(lane);
        if self.in_flight.len() >= self.lanes.len() * DEPTH {
            return self.next_done();
        }
        Ok(None)
    }

    /// The oldest batch in flight, decoded (waiting for it); None when none is in flight.
    pub fn next_done(&mut self) -> Result<Option<Batch<T>>> {
        let Some(lane) = self.in_flight.pop_front() else {
            return Ok(None);
        };
        let batch = self.lanes[lane].done.recv().map_err(|_| stopped())?;
        self.load[lane] -= batch.len();
        Ok(Some(batch))
    }
}

fn stopped() -> Error {
    Error::io(
        "decoding compressed pieces",
        std::io::Error::other("a decoding thread panicked"),
    )
}

impl<T> Drop for InflatePool<T> {
    fn drop(&mut self) {
        // Closing the work queues ends the workers once they have decoded what is queued.
        for lane in &mut self.lanes {
            drop(lane.work.take());
        }
        for lane in &mut self.lanes {
            // Taking what is left lets a worker finish its queue; its outbox closes as it ends.
            while lane.done.recv().is_ok() {}
            if let Some(t) = lane.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `[n, b]` into n bytes of b; `[0xff, ..]` is corrupt.
    struct Repeat;

    impl PieceDecoder for Repeat {
        fn decode(&mut self, src: &[u8], dst: &mut [u8]) -> std::result::Result<usize, String> {
            match *src {
                [0xff, ..] => Err("marked corrupt".into()),
                [n, b] => {
                    dst[..n as usize].fill(b);
                    Ok(n as usize)
                }
                _ => Err(format!("{} bytes", src.len())),
            }
        }
    }

    fn batch_of(pool: &mut InflatePool<u32>, first: u32, n: u32) -> Batch<u32> {
        let mut b = pool.batch();
        for t in first..first + n {
            b.push(t, &[(t % 16) as u8 + 1, t as u8], 2);
        }
        b
    }

    #[test]
    fn batches_come_back_in_order_and_decoded() {
        let mut pool = InflatePool::new(16, || Repeat).unwrap();
        let mut seen = Vec::new();
        let mut check = |b: &Batch<u32>| {
            let (out, lens) = b.decoded().unwrap();
            for (i, &t) in b.tags().iter().enumerate() {
                assert_eq!(lens[i], (t % 16) as usize + 1);
                assert!(out[i * 16..i * 16 + lens[i]].iter().all(|&x| x == t as u8));
                seen.push(t);
            }
        };
        // batches of 1 to 7 pieces, so lanes take them out of turn
        let mut first = 0;
        for k in 0..50 {
            let n = k * 5 % 7 + 1;
            let b = batch_of(&mut pool, first, n);
            first += n;
            if let Some(done) = pool.submit(b).unwrap() {
                check(&done);
                pool.recycle(done);
            }
        }
        while let Some(done) = pool.next_done().unwrap() {
            check(&done);
        }
        assert_eq!(seen, (0..first).collect::<Vec<_>>());
    }

    #[test]
    fn a_corrupt_piece_is_named_by_its_tag_after_the_batches_before_it() {
        let mut pool = InflatePool::new(16, || Repeat).unwrap();
        let mut good = 0;
        let mut failed = None;
        for k in 0..10u32 {
            let mut b = batch_of(&mut pool, k * 4, 4);
            if k == 6 {
                b.push(999, &[0xff, 0], 2);
                b.push(1000, &[1, 1], 2);
            }
            let done = pool.submit(b).unwrap();
            for d in done.into_iter() {
                match d.decoded() {
                    Ok(_) => good += d.len(),
                    Err((tag, why)) => failed = failed.or(Some((*tag, why.to_string(), good))),
                }
            }
        }
        while let Some(d) = pool.next_done().unwrap() {
            match d.decoded() {
                Ok(_) => good += d.len(),
                Err((tag, why)) => failed = failed.or(Some((*tag, why.to_string(), good))),
            }
        }
        // every batch before the corrupt one came back first
        assert_eq!(failed, Some((999, "marked corrupt".to_string(), 24)));
    }

    #[test]
    fn a_batch_goes_to_the_least_loaded_lane() {
        let mut pool = InflatePool::new(16, || Repeat).unwrap();
        for (first, n) in [(0, 8), (8, 1), (9, 1)] {
            let b = batch_of(&mut pool, first, n);
            assert!(pool.submit(b).unwrap().is_none());
        }
        // taking turns would have put the third batch beside the large one (9 pieces)
        assert_eq!(pool.load.iter().sum::<usize>(), 10);
        assert_eq!(pool.load.iter().max(), Some(&8), "{:?}", pool.load);
        while pool.next_done().unwrap().is_some() {}
        assert!(pool.load.iter().all(|&l| l == 0));
    }

    #[test]
    fn a_short_piece_is_zero_padded() {
        let mut pool = InflatePool::new(8, || Repeat).unwrap();
        let mut b = pool.batch();
        b.push(7, &[3], 2); // [3, 0]: three zero bytes
        assert!(pool.submit(b).unwrap().is_none());
        let d = pool.next_done().unwrap().unwrap();
        let (out, lens) = d.decoded().unwrap();
        assert_eq!((lens, &out[..3]), (&[3usize][..], &[0u8, 0, 0][..]));
    }

    #[test]
    fn dropping_the_pool_with_batches_in_flight_ends_its_threads() {
        let mut pool = InflatePool::new(16, || Repeat).unwrap();
        for k in 0..3 {
            let b = batch_of(&mut pool, k, 1);
            let _ = pool.submit(b).unwrap();
        }
        drop(pool); // joins: a hang here is the failure
    }
}
