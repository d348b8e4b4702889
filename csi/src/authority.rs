//! Accepts any `:authority` on unix sockets.
//!
//! h2 (under tonic) refuses a request whose `:authority` is not a valid URI authority with
//! RST_STREAM PROTOCOL_ERROR, and several gRPC implementations send the socket path there over
//! a unix socket (Python grpcio, grpc-java; Go clients send `localhost`). A local CSI endpoint
//! must not care, so each unix connection passes through this HTTP/2 frame filter: it decodes
//! the client's header blocks (HPACK, keeping the client's dynamic table) and re-encodes them
//! without indexing, with `:authority: localhost` in place of an invalid one. All other frames,
//! and everything the server sends, pass byte for byte.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame a peer may send before the server raises SETTINGS_MAX_FRAME_SIZE; the
/// filter's own frames stay within it.
const MAX_FRAME: usize = 16_384;
/// The protocol's ceiling on a frame's length (24 bits).
const FRAME_LIMIT: usize = (1 << 24) - 1;
/// What the filter holds of one header block before refusing the connection.
const BLOCK_LIMIT: usize = 1 << 20;
/// The authority put in place of one h2 would refuse.
const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// A unix connection seen through the filter: what tonic serves.
#[derive(Debug)]
pub(crate) struct Filtered(DuplexStream);

impl tonic::transport::server::Connected for Filtered {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for Filtered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Filtered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Puts `conn` behind the filter (a task per connection relays both directions).
pub(crate) fn filter(conn: tokio::net::UnixStream) -> Filtered {
    let (ours, theirs) = tokio::io::duplex(64 << 10);
    let (mut from_client, mut to_client) = conn.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(ours);
    tokio::spawn(async move {
        let up = async {
            if let Err(e) = relay_requests(&mut from_client, &mut to_server).await {
                tracing::debug!(error = %e, "unix connection: request stream ended");
            }
            let _ = to_server.shutdown().await;
        };
        let down = async {
            let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
            let _ = to_client.shutdown().await;
        };
        tokio::join!(up, down);
    });
    Filtered(theirs)
}

/// Copies the client's HTTP/2 stream to the server, re-encoding header blocks.
async fn relay_requests<R, W>(from: &mut R, to: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        // not HTTP/2 with prior knowledge: let the server answer it as it does
        return tokio::io::copy(from, to).await.map(|_| ());
    }
    let mut decoder = hpack::Decoder::new();
    // a header block split over HEADERS and CONTINUATION frames: stream, flags, fragments
    let mut pending: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len.min(FRAME_LIMIT)];
        from.read_exact(&mut payload).await?;
        match kind {
            HEADERS => {
                let fragment = header_fragment(&payload, flags)?;
                pending = Some((stream, flags & END_STREAM, fragment.to_vec()));
            }
            CONTINUATION => match pending.as_mut() {
                Some((s, _, block)) if *s == stream => block.extend_from_slice(&payload),
                _ => return Err(protocol("CONTINUATION without HEADERS")),
            },
            _ => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                to.flush().await?;
                continue;
            }
        }
        if pending
            .as_ref()
            .is_some_and(|(_, _, b)| b.len() > BLOCK_LIMIT)
        {
            return Err(protocol("header block too large"));
        }
        if flags & END_HEADERS != 0
            && let Some((stream, end_stream, block)) = pending.take()
        {
            let headers = decoder
                .decode(&block)
                .map_err(|e| protocol(&format!("undecodable header block: {e:?}")))?;
            let block = encode(&headers);
            to.write_all(&frames(stream, end_stream, &block)).await?;
            to.flush().await?;
        }
    }
}

/// The header block fragment of a HEADERS frame's payload (padding and priority removed).
fn header_fragment(payload: &[u8], flags: u8) -> io::Result<&[u8]> {
    let mut p = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = p
            .split_first()
            .ok_or_else(|| protocol("empty padded HEADERS"))?;
        pad = n as usize;
        p = rest;
    }
    if flags & PRIORITY != 0 {
        p = p
            .get(5..)
            .ok_or_else(|| protocol("short HEADERS priority"))?;
    }
    p.get(
        ..p.len()
            .checked_sub(pad)
            .ok_or_else(|| protocol("HEADERS padding too long"))?,
    )
    .ok_or_else(|| protocol("HEADERS padding too long"))
}

/// HPACK for `headers`, every field a literal without indexing (so the server's dynamic table
/// is never used), with an invalid `:authority` replaced.
fn encode(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let value = if name == b":authority" && http::uri::Authority::try_from(&value[..]).is_err()
        {
            LOCAL_AUTHORITY
        } else {
            &value[..]
        };
        out.push(0);
        string(&mut out, name);
        string(&mut out, value);
    }
    out
}

/// An HPACK string literal without Huffman coding: a 7-bit-prefix length, then the bytes.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    let mut n = s.len();
    if n < 0x7f {
        out.push(n as u8);
    } else {
        out.push(0x7f);
        n -= 0x7f;
        while n >= 0x80 {
            out.push((n & 0x7f) as u8 | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(s);
}

/// `block` as a HEADERS frame and as many CONTINUATION frames as [`MAX_FRAME`] needs.
fn frames(stream: u32, end_stream: u8, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + 9 * (block.len() / MAX_FRAME + 1));
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![&[]]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let (kind, mut flags) = if i == 0 {
            (HEADERS, end_stream)
        } else {
            (CONTINUATION, 0)
        };
        if i == last {
            flags |= END_HEADERS;
        }
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

fn protocol(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header block round-trips through the re-encoding, with only a bad authority changed,
    /// and long values and blocks split over CONTINUATION frames.
    #[test]
    fn reencoded_blocks_decode_to_the_same_headers_but_the_authority() {
        let long = vec![b'x'; 40_000];
        let headers = vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":authority".to_vec(), b"/run/csi/csi.sock".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
            (b"x-long".to_vec(), long.clone()),
        ];
        let block = encode(&headers);
        let got = hpack::Decoder::new().decode(&block).unwrap();
        assert_eq!(got[1], (b":authority".to_vec(), b"localhost".to_vec()));
        assert_eq!(got[3].1, long);
        assert_eq!(got.len(), 4);
        let valid = vec![(b":authority".to_vec(), b"example:80".to_vec())];
        assert_eq!(
            hpack::Decoder::new().decode(&encode(&valid)).unwrap(),
            valid
        );

        let f = frames(3, END_STREAM, &block);
        // HEADERS (END_STREAM) then CONTINUATIONs, the last with END_HEADERS
        assert_eq!((f[3], f[4]), (HEADERS, END_STREAM));
        let mut at = 0;
        let mut joined = Vec::new();
        let mut kinds = Vec::new();
        while at < f.len() {
            let len = u32::from_be_bytes([0, f[at], f[at + 1], f[at + 2]]) as usize;
            assert!(len <= MAX_FRAME);
            kinds.push((f[at + 3], f[at + 4] & END_HEADERS != 0));
            joined.extend_from_slice(&f[at + 9..at + 9 + len]);
            at += 9 + len;
        }
        assert_eq!(joined, block);
        assert_eq!(kinds.last(), Some(&(CONTINUATION, true)));
        assert!(kinds[..kinds.len() - 1].iter().all(|(_, end)| !end));
    }

    /// RUSTSEC-2023-0085: hpack 0.3.0's decoder panicked on a dynamic table size update whose
    /// integer is cut short (the block `[0x3f]`); hpack-patched's returns an error, which ends
    /// the connection.
    #[tokio::test]
    async fn a_truncated_table_size_update_ends_the_connection_without_a_panic() {
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&frames(1, END_STREAM, &[0x3f]));
        let mut out = Vec::new();
        let err = relay_requests(&mut &input[..], &mut out).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert_eq!(out, PREFACE);
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        let payload = [2, 0, 0, 0, 1, 16, 0xaa, 0xbb, 0, 0];
        assert_eq!(
            header_fragment(&payload, PADDED | PRIORITY).unwrap(),
            &[0xaa, 0xbb]
        );
        assert!(header_fragment(&[9, 1], PADDED).is_err());
    }
}
