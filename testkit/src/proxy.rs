//! A TCP proxy in front of a real server that cuts one download: the first connection whose
//! server-to-client stream passes `cut_after` bytes gets exactly that many, then the connection is
//! dropped (`SO_LINGER 0`, shut down both ways); every other connection is passed through untouched. Small requests
//! (pings, manifests, tokens) never reach the threshold, so the cut lands in the big body, and
//! the client's resumed request goes through. What clients send is recorded. Stopped on drop.
//! [`CutProxy::start_upload`] cuts the client-to-server stream instead (an upload).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::accept::AcceptLoop;
use crate::faults::set_linger_zero;

pub struct CutProxy {
    port: u16,
    cuts: Arc<AtomicUsize>,
    sent: Arc<Mutex<Vec<u8>>>,
    _serving: AcceptLoop,
}

impl CutProxy {
    pub fn start(upstream: SocketAddr, cut_after: u64) -> CutProxy {
        Self::start_stalling(upstream, cut_after, Duration::ZERO)
    }

    /// As [`CutProxy::start`], but the cut connection first goes silent for `stall` (so that
    /// what the client resumes with, a token say, has expired by then).
    pub fn start_stalling(upstream: SocketAddr, cut_after: u64, stall: Duration) -> CutProxy {
        Self::start_with(upstream, cut_after, stall, false)
    }

    /// As [`CutProxy::start`], but the first connection whose client-to-server stream passes
    /// `cut_after` bytes is cut there: the server gets exactly that many.
    pub fn start_upload(upstream: SocketAddr, cut_after: u64) -> CutProxy {
        Self::start_with(upstream, cut_after, Duration::ZERO, true)
    }

    fn start_with(upstream: SocketAddr, cut_after: u64, stall: Duration, upload: bool) -> CutProxy {
        let cut = Cut {
            after: cut_after,
            stall,
            upload,
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cuts = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (c, log) = (cuts.clone(), sent.clone());
        let serving = AcceptLoop::start(listener, move |client| {
            let Ok(server) = TcpStream::connect(upstream) else {
                return;
            };
            let (c, log) = (c.clone(), log.clone());
            std::thread::spawn(move || relay(client, server, cut, &c, &log));
        });
        CutProxy {
            port,
            cuts,
            sent,
            _serving: serving,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many connections were cut (0 or 1).
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }

    /// How many bytes clients sent in all.
    pub fn client_bytes(&self) -> usize {
        self.sent.lock().unwrap().len()
    }

    /// Everything clients sent, as text (request lines and headers, lower-cased).
    pub fn sent(&self) -> String {
        String::from_utf8_lossy(&self.sent.lock().unwrap()).to_lowercase()
    }
}

/// Where and how a connection is cut.
#[derive(Clone, Copy)]
struct Cut {
    after: u64,
    stall: Duration,
    /// Cut the client-to-server stream instead of the server-to-client one.
    upload: bool,
}

fn relay(client: TcpStream, server: TcpStream, cut: Cut, cuts: &AtomicUsize, log: &Mutex<Vec<u8>>) {
    let (c_in, s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let drop_both = || {
        std::thread::sleep(cut.stall);
        set_linger_zero(&client);
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let cut = cut.upload.then_some(cut.after);
            copy(&c_in, &s_out, cut, cuts, Some(log), drop_both);
            let _ = s_out.shutdown(Shutdown::Write);
        });
        let cut_down = (!cut.upload).then_some(cut.after);
        copy(&server, &client, cut_down, cuts, None, drop_both);
        let _ = client.shutdown(Shutdown::Write);
    });
}

/// Copies `from` to `to`; with `cut_after`, the first stream (over all connections) to pass that
/// many bytes gets exactly that many before `drop_both` cuts the connection.
fn copy(
    mut from: &TcpStream,
    mut to: &TcpStream,
    cut_after: Option<u64>,
    cuts: &AtomicUsize,
    log: Option<&Mutex<Vec<u8>>>,
    drop_both: impl Fn(),
) {
    let mut buf = [0u8; 64 << 10];
    let mut passed = 0u64;
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        if let Some(log) = log {
            log.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        if let Some(limit) = cut_after
            && passed + n as u64 > limit
            && cuts
                .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            let keep = (limit - passed) as usize;
            let _ = to.write_all(&buf[..keep]);
            let _ = to.flush();
            drop_both();
            break;
        }
        passed += n as u64;
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}
