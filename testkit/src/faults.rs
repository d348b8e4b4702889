//! A small HTTP/1.1 fault server of the suite's own: serves one body with scripted misbehaviour.
//!
//! Bound to `127.0.0.1:0`, one std thread accepting and one thread per connection; every response
//! carries `Connection: close`, so each request is its own connection. Request number `i`
//! (counting every request except the configured redirects) is answered according to
//! `script[i]`, or [`FaultConfig::otherwise`] once the script is used up. Every request is
//! recorded (method, target, headers) for assertions. Stopped on drop.
//!
//! ```no_run
//! use testkit::faults::{FaultConfig, FaultServer, Step};
//! let server = FaultServer::start(
//!     FaultConfig::new(vec![7u8; 1 << 20]).script([Step::reset_after(4096), Step::ok()]),
//! );
//! let url = server.url("/disk.img");
//! // ... download url ...
//! assert_eq!(server.requests()[1].header("range"), Some("bytes=4096-"));
//! ```
//!
//! Entity: the body, with `ETag` (default `"v1"`, strong) and `Last-Modified` (a fixed date)
//! unless turned off, and a `Date` of now, as real servers send; a [`Step`] may change the ETag
//! or replace the body from its response on (an entity that changed).
//! Ranges: `Range: bytes=N-` / `bytes=N-M` (one range) answered with 206 and `Content-Range`,
//! unless ranges are off or the step ignores them; `If-Range` is honoured (a mismatch with the
//! current ETag, or Last-Modified, serves 200 and the full body); unsatisfiable ranges get 416.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What happens to the body of one response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Send the whole body as promised.
    None,
    /// Send this many body bytes of this response, then reset the connection (`SO_LINGER 0`).
    ResetAfter(u64),
    /// Send this many body bytes of this response, then close cleanly (a Content-Length lie).
    CloseAfter(u64),
    /// Send all but the last N body bytes of this response, then close cleanly.
    ShortBy(u64),
    /// Send the body and then N more bytes than the Content-Length announced.
    Extra(u64),
    /// Send this many body bytes, then go silent for the duration, then close.
    Stall(u64, Duration),
    /// Send this many body bytes, then one byte per interval (a server that never goes idle).
    Trickle(u64, Duration),
}

/// How one request is answered.
#[derive(Clone, Debug)]
pub struct Step {
    /// Answer with this status and an empty body instead of the entity.
    pub status: Option<u16>,
    /// `Retry-After` (seconds) sent with `status`.
    pub retry_after: Option<u64>,
    pub cut: Cut,
    /// Answer 200 with the full body even when a range was asked for.
    pub ignore_range: bool,
    /// The ETag the entity has for this response (when the server has ETags).
    pub etag: Option<String>,
    /// Answer a range request with a 206 for the range starting here instead of the one asked
    /// for (with an honest Content-Range): a server that gets ranges wrong.
    pub range_from: Option<u64>,
    /// Serve this body from this response on, as if the file was replaced.
    pub body: Option<Arc<Vec<u8>>>,
    /// Wait this long before sending the response headers.
    pub headers_after: Option<Duration>,
}

impl Step {
    /// Serve normally.
    pub fn ok() -> Step {
        Step {
            status: None,
            retry_after: None,
            cut: Cut::None,
            ignore_range: false,
            etag: None,
            range_from: None,
            body: None,
            headers_after: None,
        }
    }
    /// An empty response with this status (404, 500, ...).
    pub fn status(code: u16) -> Step {
        Step {
            status: Some(code),
            ..Step::ok()
        }
    }
    /// 503 with an optional `Retry-After: secs`.
    pub fn unavailable(retry_after: Option<u64>) -> Step {
        Step {
            status: Some(503),
            retry_after,
            ..Step::ok()
        }
    }
    pub fn reset_after(bytes: u64) -> Step {
        Step::ok().cut(Cut::ResetAfter(bytes))
    }
    pub fn close_after(bytes: u64) -> Step {
        Step::ok().cut(Cut::CloseAfter(bytes))
    }
    pub fn short_by(bytes: u64) -> Step {
        Step::ok().cut(Cut::ShortBy(bytes))
    }
    pub fn extra(bytes: u64) -> Step {
        Step::ok().cut(Cut::Extra(bytes))
    }
    pub fn stall_after(bytes: u64, stall: Duration) -> Step {
        Step::ok().cut(Cut::Stall(bytes, stall))
    }
    pub fn cut(mut self, cut: Cut) -> Step {
        self.cut = cut;
        self
    }
    /// Ignore any `Range` header in this request.
    pub fn ignore_range(mut self) -> Step {
        self.ignore_range = true;
        self
    }
    /// Answer range requests with the range starting at `offset` instead.
    pub fn range_from(mut self, offset: u64) -> Step {
        self.range_from = Some(offset);
        self
    }
    /// Give the entity this ETag (e.g. `"\"v2\""`) from this response on, as if it changed.
    pub fn etag(mut self, etag: &str) -> Step {
        self.etag = Some(etag.to_string());
        self
    }
    /// Send nothing for `wait` before the response headers.
    pub fn headers_after(mut self, wait: Duration) -> Step {
        self.headers_after = Some(wait);
        self
    }
    /// Serve `body` from this response on (the ETag, if any, is left as it is).
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Step {
        self.body = Some(Arc::new(body.into()));
        self
    }
}

impl Default for Step {
    fn default() -> Self {
        Step::ok()
    }
}

/// What the server serves and how it misbehaves.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    pub body: Arc<Vec<u8>>,
    /// Honour `Range` requests (and announce `Accept-Ranges: bytes`).
    pub ranges: bool,
    /// The entity's ETag, sent as is (quote it: `"\"v1\""`, or `"W/\"v1\""` for a weak one).
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    /// Send the body with `Transfer-Encoding: chunked` instead of `Content-Length`.
    pub chunked: bool,
    /// `(path, location)`: requests for `path` answer `302 Location: location` (not counted in
    /// the script).
    pub redirects: Vec<(String, String)>,
    pub script: Vec<Step>,
    /// How requests after the script are answered (default: normally).
    pub otherwise: Step,
}

impl FaultConfig {
    pub fn new(body: impl Into<Vec<u8>>) -> FaultConfig {
        FaultConfig {
            body: Arc::new(body.into()),
            ranges: true,
            etag: Some("\"v1\"".into()),
            last_modified: Some("Tue, 03 Nov 2026 10:00:00 GMT".into()),
            chunked: false,
            redirects: Vec::new(),
            script: Vec::new(),
            otherwise: Step::ok(),
        }
    }
    pub fn ranges(mut self, on: bool) -> Self {
        self.ranges = on;
        self
    }
    pub fn etag(mut self, etag: Option<&str>) -> Self {
        self.etag = etag.map(str::to_string);
        self
    }
    pub fn last_modified(mut self, date: Option<&str>) -> Self {
        self.last_modified = date.map(str::to_string);
        self
    }
    pub fn chunked(mut self, on: bool) -> Self {
        self.chunked = on;
        self
    }
    pub fn redirect(mut self, path: &str, location: &str) -> Self {
        self.redirects.push((path.into(), location.into()));
        self
    }
    pub fn script(mut self, steps: impl IntoIterator<Item = Step>) -> Self {
        self.script = steps.into_iter().collect();
        self
    }
    pub fn otherwise(mut self, step: Step) -> Self {
        self.otherwise = step;
        self
    }
}

/// One recorded request.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// The request target as sent (a path, or an absolute URL when sent to a proxy).
    pub target: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
}

impl Recorded {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

struct Shared {
    cfg: FaultConfig,
    stop: AtomicBool,
    counter: AtomicUsize,
    /// The ETag the entity has now (a step's `etag` changes it for good).
    current_etag: Mutex<Option<String>>,
    /// The body served now (a step's `body` replaces it for good).
    current_body: Mutex<Arc<Vec<u8>>>,
    requests: Mutex<Vec<Recorded>>,
}

/// The running fault server. Stopped on drop.
pub struct FaultServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FaultServer {
    pub fn start(cfg: FaultConfig) -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the fault server");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            current_etag: Mutex::new(cfg.etag.clone()),
            current_body: Mutex::new(cfg.body.clone()),
            cfg,
            stop: AtomicBool::new(false),
            counter: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("fault-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let s = s.clone();
                    let _ =
                        std::thread::Builder::new()
                            .name("fault-conn".into())
                            .spawn(move || {
                                let _ = handle(conn, &s);
                            });
                }
            })
            .expect("spawning the fault server");
        FaultServer {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in arrival order (redirected requests included).
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    pub fn request_count(&self) -> usize {
        self.shared.requests.lock().unwrap().len()
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn handle(conn: TcpStream, s: &Shared) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.set_write_timeout(Some(Duration::from_secs(30)))?;
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(());
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let req = Recorded {
        method,
        target,
        headers,
    };
    s.requests.lock().unwrap().push(req.clone());
    if s.stop.load(Ordering::SeqCst) {
        return Ok(());
    }
    let mut conn = conn;

    let path = req.target.split('?').next().unwrap_or_default();
    let path = match path.find("://") {
        // Absolute form (proxy request): keep the path part.
        Some(i) => path[i + 3..]
            .find('/')
            .map(|j| &path[i + 3 + j..])
            .unwrap_or("/"),
        None => path,
    };
    if let Some((_, loc)) = s.cfg.redirects.iter().find(|(p, _)| p == path) {
        let head = format!(
            "HTTP/1.1 302 Found\r\nLocation: {loc}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        conn.write_all(head.as_bytes())?;
        return Ok(());
    }

    let n = s.counter.fetch_add(1, Ordering::SeqCst);
    let step = s
        .cfg
        .script
        .get(n)
        .cloned()
        .unwrap_or_else(|| s.cfg.otherwise.clone());

    if let Some(wait) = step.headers_after {
        let until = Instant::now() + wait;
        while Instant::now() < until && !s.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if let Some(code) = step.status {
        let mut head = format!("HTTP/1.1 {code} {}\r\n", reason(code));
        if let Some(secs) = step.retry_after {
            head += &format!("Retry-After: {secs}\r\n");
        }
        head += "Content-Length: 0\r\nConnection: close\r\n\r\n";
        conn.write_all(head.as_bytes())?;
        return Ok(());
    }

    let etag = {
        let mut cur = s.current_etag.lock().unwrap();
        if let Some(new) = &step.etag {
            *cur = Some(new.clone());
        }
        cur.clone()
    };
    let body = {
        let mut cur = s.current_body.lock().unwrap();
        if let Some(new) = &step.body {
            *cur = new.clone();
        }
        cur.clone()
    };
    let total = body.len() as u64;

    let mut range = None;
    if s.cfg.ranges
        && !step.ignore_range
        && req.method == "GET"
        && let Some(r) = req.header("range")
    {
        let if_range_ok = match req.header("if-range") {
            None => true,
            Some(v) if v.starts_with('"') || v.starts_with("W/") => {
                // Strong comparison: weak tags never match.
                !v.starts_with("W/") && etag.as_deref() == Some(v)
            }
            Some(v) => s.cfg.last_modified.as_deref() == Some(v),
        };
        if if_range_ok {
            match parse_range(r, total) {
                Some(Ok((a, b))) => {
                    range = Some(match step.range_from {
                        Some(from) if from < total => (from, total),
                        _ => (a, b),
                    })
                }
                Some(Err(())) => {
                    let head = format!(
                        "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{total}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    conn.write_all(head.as_bytes())?;
                    return Ok(());
                }
                None => {}
            }
        }
    }

    let (start, end) = range.unwrap_or((0, total));
    let mut head = if range.is_some() {
        format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{total}\r\n",
            end - 1
        )
    } else {
        "HTTP/1.1 200 OK\r\n".to_string()
    };
    head += "Content-Type: application/octet-stream\r\nConnection: close\r\n";
    if s.cfg.ranges {
        head += "Accept-Ranges: bytes\r\n";
    }
    if let Some(e) = &etag {
        head += &format!("ETag: {e}\r\n");
    }
    if let Some(lm) = &s.cfg.last_modified {
        head += &format!("Last-Modified: {lm}\r\n");
    }
    head += &format!(
        "Date: {}\r\n",
        httpdate::fmt_http_date(std::time::SystemTime::now())
    );
    if s.cfg.chunked {
        head += "Transfer-Encoding: chunked\r\n";
    } else {
        head += &format!("Content-Length: {}\r\n", end - start);
    }
    head += "\r\n";
    conn.write_all(head.as_bytes())?;
    if req.method == "HEAD" {
        return Ok(());
    }

    let part = &body[start as usize..end as usize];
    let len = part.len() as u64;
    let send_n = match &step.cut {
        Cut::None | Cut::Extra(_) => len,
        Cut::ResetAfter(n) | Cut::CloseAfter(n) => (*n).min(len),
        Cut::ShortBy(n) => len.saturating_sub(*n),
        Cut::Stall(n, _) | Cut::Trickle(n, _) => (*n).min(len),
    } as usize;
    let mut data = part[..send_n].to_vec();
    if let Cut::Extra(n) = step.cut {
        data.extend(std::iter::repeat_n(0xEEu8, n as usize));
    }
    write_body(&mut conn, &data, s.cfg.chunked)?;
    match step.cut {
        Cut::None | Cut::Extra(_) => {
            if s.cfg.chunked {
                conn.write_all(b"0\r\n\r\n")?;
            }
            conn.flush()?;
            let _ = conn.shutdown(Shutdown::Write);
        }
        Cut::CloseAfter(_) | Cut::ShortBy(_) => {
            conn.flush()?;
            let _ = conn.shutdown(Shutdown::Write);
        }
        Cut::ResetAfter(_) => {
            conn.flush()?;
            // Give the bytes a moment to reach the peer, then reset.
            std::thread::sleep(Duration::from_millis(50));
            set_linger_zero(&conn);
            drop(conn);
        }
        Cut::Trickle(_, every) => {
            conn.flush()?;
            for &byte in &part[send_n..] {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(every);
                conn.write_all(&[byte])?;
                conn.flush()?;
            }
        }
        Cut::Stall(_, dur) => {
            conn.flush()?;
            let until = Instant::now() + dur;
            while Instant::now() < until && !s.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    Ok(())
}

fn write_body(conn: &mut TcpStream, data: &[u8], chunked: bool) -> std::io::Result<()> {
    for piece in data.chunks(64 * 1024) {
        if chunked {
            conn.write_all(format!("{:x}\r\n", piece.len()).as_bytes())?;
            conn.write_all(piece)?;
            conn.write_all(b"\r\n")?;
        } else {
            conn.write_all(piece)?;
        }
    }
    Ok(())
}

/// `Some(Ok((start, end_exclusive)))`, `Some(Err(()))` when unsatisfiable, `None` when not a
/// single byte range we understand (then the full body is served).
fn parse_range(v: &str, total: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = v.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        let suffix: u64 = b.parse().ok()?;
        if suffix == 0 {
            return Some(Err(()));
        }
        return Some(Ok((total.saturating_sub(suffix), total)));
    }
    let start: u64 = a.parse().ok()?;
    let end = if b.is_empty() {
        total
    } else {
        let last: u64 = b.parse().ok()?;
        if last < start {
            return None;
        }
        (last + 1).min(total)
    };
    if start >= total {
        return Some(Err(()));
    }
    Some(Ok((start, end)))
}

pub(crate) fn set_linger_zero(conn: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket fd we own, with a correctly sized `linger` value.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        410 => "Gone",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn get(server: &FaultServer, extra: &str) -> (String, Result<Vec<u8>, std::io::Error>) {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /x HTTP/1.1\r\nHost: h\r\n{extra}\r\n").unwrap();
        let mut out = Vec::new();
        let r = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        (text, r.map(|_| out))
    }

    #[test]
    fn scripted_steps_ranges_and_recording() {
        let server = FaultServer::start(FaultConfig::new(b"0123456789".to_vec()).script([
            Step::unavailable(Some(3)),
            Step::close_after(4),
            Step::ok(),
            Step::ok().etag("\"v2\""),
        ]));
        let (r, _) = get(&server, "");
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("Retry-After: 3"), "{r}");
        let (r, _) = get(&server, "");
        assert!(r.contains("Content-Length: 10"), "{r}");
        assert!(r.ends_with("\r\n\r\n0123"), "{r}");
        let (r, _) = get(&server, "Range: bytes=4-\r\nIf-Range: \"v1\"\r\n");
        assert!(r.starts_with("HTTP/1.1 206"), "{r}");
        assert!(r.contains("Content-Range: bytes 4-9/10"), "{r}");
        assert!(r.ends_with("456789"), "{r}");
        let (r, _) = get(&server, "Range: bytes=4-\r\nIf-Range: \"v1\"\r\n");
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.contains("ETag: \"v2\""), "{r}");
        let reqs = server.requests();
        assert_eq!(reqs.len(), 4);
        assert_eq!(reqs[2].header("Range"), Some("bytes=4-"));
        assert_eq!(reqs[2].header("if-range"), Some("\"v1\""));
    }

    #[test]
    fn reset_is_a_connection_reset() {
        let server = FaultServer::start(
            FaultConfig::new(vec![1u8; 1 << 20]).otherwise(Step::reset_after(1000)),
        );
        let (_, r) = get(&server, "");
        let err = r.expect_err("a reset must surface as an error");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    }

    #[test]
    fn chunked_and_redirects() {
        let server = FaultServer::start(
            FaultConfig::new(b"abc".to_vec())
                .chunked(true)
                .redirect("/x", "http://elsewhere/"),
        );
        let (r, _) = get(&server, "");
        assert!(r.starts_with("HTTP/1.1 302"), "{r}");
        assert!(r.contains("Location: http://elsewhere/"), "{r}");
        let mut s = TcpStream::connect(server.addr()).unwrap();
        write!(s, "GET /y HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.contains("Transfer-Encoding: chunked"), "{out}");
        assert!(out.ends_with("3\r\nabc\r\n0\r\n\r\n"), "{out}");
    }
}
