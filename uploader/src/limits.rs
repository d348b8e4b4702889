//! Keeping a listener's connections bounded, so that clients that open connections and then
//! send nothing (a request line that never ends, a keep-alive connection never used again)
//! cannot exhaust the process's descriptors or memory:
//!
//! - A connection with no request in flight is closed by the server: after the header-read
//!   timeout until its first request has arrived, after the keep-alive timeout between requests.
//! - At most `max_connections` are open per listener. At the cap, the connections that have
//!   been idle the longest (a sixteenth of the cap) are closed to make room, so a flood of idle
//!   connections cannot lock out a real client; when every connection is busy, new ones wait in
//!   the kernel's backlog.
//! - A connection the server ends while the client has not closed its side lingers briefly
//!   (the answer and a FIN sent, what still comes read and dropped), so an answer to a request
//!   too large to read is not lost to a reset. Idle and evicted connections close at once.
//! - Once a flood is over, the memory its connections held is given back to the system.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How long a closed connection whose client is still sending is read from (and dropped).
const LINGER_TIME: Duration = Duration::from_secs(2);
/// How much a lingering connection reads at most.
const LINGER_BYTES: usize = 4 << 20;
/// Give memory back once the open connections fall to a quarter of a peak of at least this many.
const TRIM_AFTER_PEAK: usize = 64;
/// How often a listener waiting at its cap looks again for an idle connection to close.
const CAP_RECHECK: Duration = Duration::from_millis(100);

/// A listener's connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a new connection may take to deliver its first request's headers.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight after a request.
    pub keep_alive_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(60),
            max_connections: 1024,
        }
    }
}

/// The open connections of one listener.
pub(crate) struct Registry {
    limits: Limits,
    slots: Arc<Semaphore>,
    counts: Arc<Counts>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
}

/// Open connections now, and the most since memory was last given back.
#[derive(Default)]
struct Counts {
    open: AtomicUsize,
    peak: AtomicUsize,
    /// The cap was reached (and logged) since connections last fell to a quarter of their peak.
    at_cap: AtomicBool,
}

impl Registry {
    pub fn new(limits: Limits) -> Arc<Registry> {
        let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Registry {
            limits,
            slots: Arc::new(Semaphore::new(max)),
            counts: Arc::default(),
            conns: Mutex::default(),
            next_id: AtomicU64::new(0),
        })
    }

    /// A slot for the next connection; at the cap, closes the connections idle the longest and
    /// waits for a slot to free.
    pub async fn slot(&self) -> Slot {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => loop {
                if !self.counts.at_cap.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        max = self.limits.max_connections,
                        "at the connection cap: closing the longest-idle connections to make room"
                    );
                }
                self.evict_idlest();
                tokio::select! {
                    acquired = self.slots.clone().acquire_owned() => {
                        break acquired.expect("the semaphore is never closed");
                    }
                    () = tokio::time::sleep(CAP_RECHECK) => {}
                }
            },
        };
        let open = self.counts.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.counts.peak.fetch_max(open, Ordering::Relaxed);
        Slot {
            _permit: permit,
            counts: self.counts.clone(),
        }
    }

    /// Tracks a new connection until the handle is dropped.
    pub fn register(self: &Arc<Self>) -> ConnHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            state: Mutex::new(State {
                in_flight: 0,
                idle_since: Instant::now(),
                served: false,
            }),
            evict: Notify::new(),
            limits: self.limits,
            abandoned: Default::default(),
            evicted: Default::default(),
        });
        lock(&self.conns).insert(id, conn.clone());
        ConnHandle {
            id,
            conn,
            registry: self.clone(),
        }
    }

    /// Asks the connections with no request in flight that have been idle the longest to close:
    /// a sixteenth of the cap at a time, so that a flood does not cost a scan per connection.
    fn evict_idlest(&self) {
        let conns = lock(&self.conns);
        let mut idle: Vec<_> = conns
            .values()
            .filter(|c| !c.evicted.load(Ordering::Relaxed))
            .filter_map(|c| {
                let s = lock(&c.state);
                (s.in_flight == 0).then_some((s.idle_since, c))
            })
            .collect();
        let batch = (self.limits.max_connections / 16).clamp(1, idle.len().max(1));
        if idle.len() > batch {
            idle.select_nth_unstable_by_key(batch - 1, |(since, _)| *since);
        }
        for (_, conn) in idle.into_iter().take(batch) {
            // Marked, so that the next eviction picks others while these close.
            conn.evicted.store(true, Ordering::Relaxed);
            conn.evict.notify_one();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection's place under the cap, held until its socket is closed.
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    counts: Arc<Counts>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let open = self.counts.open.fetch_sub(1, Ordering::Relaxed) - 1;
        let peak = self.counts.peak.load(Ordering::Relaxed);
        if peak >= TRIM_AFTER_PEAK
            && open <= peak / 4
            && self
                .counts
                .peak
                .compare_exchange(peak, open, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.counts.at_cap.store(false, Ordering::Relaxed);
            give_memory_back();
        }
    }
}

/// Returns the free heap memory the closed connections' buffers left behind. glibc keeps freed
/// chunks below the top of its heaps (and up to `M_TRIM_THRESHOLD` at the top) for reuse, which
/// after a flood of connections is most of the peak.
fn give_memory_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory to the system; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
    tracing::debug!("connections closed; free memory returned to the system");
}

/// One connection's state, as its idle timer and the eviction see it.
pub(crate) struct Conn {
    state: Mutex<State>,
    evict: Notify,
    limits: Limits,
    /// The server gave up on the connection: close it at once, no lingering.
    abandoned: AtomicBool,
    /// Asked to close to make room (cleared if a request came in first).
    evicted: AtomicBool,
}

struct State {
    in_flight: usize,
    /// When the last request finished, or the connection was accepted.
    idle_since: Instant,
    /// A request has come in.
    served: bool,
}

/// Why the server closes a connection.
#[derive(Debug)]
pub enum Closing {
    /// No request in flight for this long.
    Idle(Duration),
    /// Room was needed for a new connection at the cap.
    Evicted,
}

impl Conn {
    /// Counts a request in flight until the returned guard (held by its answer's body) drops.
    pub fn busy(self: &Arc<Self>) -> Busy {
        lock(&self.state).in_flight += 1;
        Busy(self.clone())
    }

    /// Resolves when the connection should be closed (no request in flight for too long, or
    /// evicted); it is then closed without lingering.
    pub async fn closing(&self) -> Closing {
        let closing = self.idle_or_evicted().await;
        self.abandoned.store(true, Ordering::Relaxed);
        closing
    }

    async fn idle_or_evicted(&self) -> Closing {
        loop {
            let wake = {
                let s = lock(&self.state);
                let limit = if s.served {
                    self.limits.keep_alive_timeout
                } else {
                    self.limits.header_read_timeout
                };
                if s.in_flight > 0 {
                    // Look again later: a request may finish at any time.
                    Instant::now() + limit
                } else if s.idle_since.elapsed() >= limit {
                    return Closing::Idle(limit);
                } else {
                    s.idle_since + limit
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = self.evict.notified() => {
                    if lock(&self.state).in_flight == 0 {
                        return Closing::Evicted;
                    }
                    self.evicted.store(false, Ordering::Relaxed);
                }
            }
        }
    }
}

/// A request in flight on a connection.
pub(crate) struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.in_flight -= 1;
        s.served = true;
        s.idle_since = Instant::now();
    }
}

/// A registered connection; dropping it unregisters it.
pub(crate) struct ConnHandle {
    id: u64,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl ConnHandle {
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }
}

impl Drop for ConnHandle {
    fn drop(&mut self) {
        lock(&self.registry.conns).remove(&self.id);
    }
}

/// An answer body that keeps its request counted as in flight until it is sent or dropped.
pub(crate) struct Tracked<B> {
    pub body: B,
    pub _busy: Busy,
}

impl<B: http_body::Body<Data = Bytes> + Unpin> http_body::Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// An accepted TCP stream holding its [`Slot`]. Unless the client closed its side or the
/// server gave up on the connection (idle, evicted), dropping it lingers: the answer and a FIN
/// are sent, and what the client still sends is read and dropped for a while. Closing a socket
/// with unread bytes resets the connection, and a client still sending (a request too large to
/// read, a refused body) would meet the reset and never read the answer (a 431, a 400).
pub(crate) struct Linger {
    tcp: Option<TcpStream>,
    slot: Option<Slot>,
    conn: Arc<Conn>,
    /// The client closed its side.
    eof: bool,
}

impl Linger {
    pub fn new(tcp: TcpStream, slot: Slot, conn: Arc<Conn>) -> Linger {
        Linger {
            tcp: Some(tcp),
            slot: Some(slot),
            conn,
            eof: false,
        }
    }

    fn tcp(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        match self.tcp.as_mut() {
            Some(tcp) => Ok(Pin::new(tcp)),
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }
}

impl Drop for Linger {
    fn drop(&mut self) {
        let (Some(mut tcp), Some(slot)) = (self.tcp.take(), self.slot.take()) else {
            return;
        };
        if self.eof || self.conn.abandoned.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let _ = tcp.shutdown().await;
            let mut buf = vec![0u8; 64 << 10];
            let mut read = 0;
            let _ = tokio::time::timeout(LINGER_TIME, async {
                while read < LINGER_BYTES {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => read += n,
                    }
                }
            })
            .await;
            drop(slot);
        });
    }
}

impl AsyncRead for Linger {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = match this.tcp() {
            Ok(tcp) => tcp.poll_read(cx, buf),
            Err(e) => return Poll::Ready(Err(e)),
        };
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() == before {
            this.eof = true;
        }
        read
    }
}

impl AsyncWrite for Linger {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().tcp() {
            Ok(tcp) => tcp.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().tcp() {
            Ok(tcp) => tcp.poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().tcp() {
            Ok(tcp) => tcp.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().tcp() {
            Ok(tcp) => tcp.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}
