//! A walk through a tar stream (a registry image's layers, an OVA) on a thread of its own, that
//! finds one member (the disk) and streams its bytes into the import through one bounded channel
//! ([`crate::chunks`]): what the walks share, apart from what each looks for.

use std::io::{self, Read};
use std::sync::mpsc::{SyncSender, sync_channel};

use bytes::Bytes;

use crate::chunks::{self, ChunkReader, ChunkSender};
use crate::error::{Error, Result};
use crate::pipe::read_full;

/// Bytes read from the tar per chunk.
pub(crate) const CHUNK: usize = 128 << 10;
/// Chunks in flight between the walk and the import.
const DEPTH: usize = 16;

/// Where a tar walk sends what it finds: the disk's path and size once (or why it found none),
/// then the disk's bytes.
pub(crate) struct WalkOut {
    found: SyncSender<Result<(String, u64)>>,
    announced: bool,
    chunks: ChunkSender,
}

impl WalkOut {
    fn announce(&mut self, path: String, size: u64) -> bool {
        self.announced = true;
        self.found.send(Ok((path, size))).is_ok()
    }

    /// Announces the disk `path` of `size` bytes, then sends its bytes, read from `file`.
    pub(crate) fn stream_file(
        &mut self,
        path: String,
        size: u64,
        file: &mut dyn Read,
        what: &str,
    ) -> Result<()> {
        let gone = || Error::SourceUnavailable(format!("{what}: the import stopped reading"));
        if !self.announce(path, size) {
            return Err(gone());
        }
        loop {
            let mut buf = vec![0u8; CHUNK];
            let n = read_full(&mut &mut *file, &mut buf).map_err(|e| tar_error(e, what))?;
            if n == 0 {
                return Ok(());
            }
            buf.truncate(n);
            if !self.chunks.send_blocking(Bytes::from(buf)) {
                return Err(gone());
            }
        }
    }

    /// Ends the walk: the error goes where the opener or the reader will see it.
    fn finish(self, outcome: Result<()>) {
        match outcome {
            Err(e) if !self.announced => {
                let _ = self.found.send(Err(e));
            }
            outcome => self.chunks.finish_blocking(outcome),
        }
    }
}

/// Runs `walk` on a `quarry-WHO` thread and waits for it to find the disk: returns the disk's
/// bytes as they come, its member path and size. `walk_name` names the walk in messages
/// (`"IMAGE: the layer walk"`); a walk that ends without finding the disk fails here, before
/// anything is written.
pub(crate) fn spawn(
    who: &str,
    walk_name: &str,
    walk: impl FnOnce(&mut WalkOut) -> Result<()> + Send + 'static,
) -> Result<(ChunkReader, String, u64)> {
    let (chunk_tx, chunks) = chunks::channel(
        DEPTH,
        format!("{walk_name} ended before the disk was complete"),
    );
    let (found_tx, found_rx) = sync_channel(1);
    std::thread::Builder::new()
        .name(format!("quarry-{}", who.to_ascii_lowercase()))
        .spawn(move || {
            let mut out = WalkOut {
                found: found_tx,
                announced: false,
                chunks: chunk_tx,
            };
            let outcome = walk(&mut out);
            out.finish(outcome);
        })
        .map_err(|e| Error::io(format!("spawning the {who} thread"), e))?;
    match found_rx.recv() {
        Ok(Ok((path, size))) => Ok((chunks, path, size)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::SourceUnavailable(format!(
            "{walk_name} ended without an answer"
        ))),
    }
}

/// Errors out of the tar reader (layers, OVAs): its own complaints about the archive (plain
/// `Other` errors with a message) are a bad archive; ours (HTTP, digest, a spill file read back)
/// and the system's keep their kind, so a local read failure is not called corruption.
pub(crate) fn tar_error(e: io::Error, what: &str) -> Error {
    if !Error::carried_by(&e) && e.raw_os_error().is_none() && e.kind() == io::ErrorKind::Other {
        return Error::Corrupt(format!("{what}: not a valid tar archive: {e}"));
    }
    Error::from_read(e, what)
}

/// A member path made relative and normalised (`./disk/x` -> `disk/x`); `..` refused.
pub fn normalize(raw: &[u8]) -> Result<String> {
    let s = std::str::from_utf8(raw).map_err(|_| {
        Error::Corrupt(format!(
            "layer entry name {:?} is not UTF-8",
            String::from_utf8_lossy(raw)
        ))
    })?;
    let mut parts = Vec::new();
    for part in s.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(Error::Corrupt(format!(
                    "layer entry {s:?} escapes the image root (path traversal refused)"
                )));
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traversal_is_refused_and_paths_normalised() {
        assert_eq!(normalize(b"./disk//x.img").unwrap(), "disk/x.img");
        assert_eq!(normalize(b"/disk/x").unwrap(), "disk/x");
        let e = normalize(b"disk/../../etc/passwd").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::CorruptImage);
        assert!(e.to_string().contains("traversal"), "{e}");
    }
}
