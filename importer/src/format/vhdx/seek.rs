//! The random-access converter, for VHDX images in local files.
//!
//! The header section and the metadata are read when the image is opened; the conversion reads
//! the whole BAT, checks every data block (out of the reserved regions, inside the file, not
//! overlapping another) before writing anything, then walks the disk in guest order: zero
//! blocks become holes, data blocks are read in runs (contiguous blocks merged) on a reader
//! thread while the calling thread writes the previous run.
//!
//! Memory: the BAT, one plan entry per run, and [`IN_FLIGHT`] buffers of up to [`RUN_MAX`].

use crate::format::fields::le64;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use super::VhdxStats;
use super::bat::{Geometry, Payload};
use super::error::VhdxError;
use super::header::{self, HEAD_LEN, Layout};
use super::metadata::{self, Metadata, TABLE_LEN};
use crate::error::{Error, Result};
use crate::sink::ExtentSink;

/// Longest data run read at once: the sink gathers consecutive runs into its own large writes,
/// so larger reads would only take memory (whole 32 MiB blocks took the import to 100 MiB).
const RUN_MAX: u64 = 2 << 20;
/// Runs read ahead of the writer.
const IN_FLIGHT: usize = 4;

/// An opened image: its layout and metadata, read.
pub(super) struct Opened {
    file: File,
    length: u64,
    layout: Layout,
    pub metadata: Metadata,
    pub geometry: Geometry,
    bat_len: u64,
}

/// Reads `len` bytes at `offset` of the image, which must lie inside it.
fn read_at(file: &File, length: u64, offset: u64, len: u64, what: &'static str) -> Result<Vec<u8>> {
    if offset.checked_add(len).is_none_or(|end| end > length) {
        return Err(VhdxError::Truncated {
            what,
            offset,
            len,
            end: length,
        }
        .into());
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| Error::from_read(e, "vhdx image"))?;
    Ok(buf)
}

/// What the conversion does, in guest order.
enum Step {
    Zero { guest: u64, len: u64 },
    Data { guest: u64, host: u64, len: u64 },
}

impl Opened {
    pub fn open(file: File, length: u64) -> Result<Opened> {
        let head_len = (HEAD_LEN as u64).min(length);
        let head = read_at(&file, length, 0, head_len, "the header section")?;
        let layout = header::parse(&head)?;
        let table = read_at(
            &file,
            length,
            layout.metadata.offset,
            TABLE_LEN as u64,
            "the metadata table",
        )?;
        let items = metadata::parse_table(&table, layout.metadata)?;
        let mut bytes = Vec::with_capacity(4);
        for r in &items.ranges {
            bytes.push(read_at(&file, length, r.offset, r.len, "a metadata item")?);
        }
        let metadata = Metadata::parse(&items, [&bytes[0], &bytes[1], &bytes[2], &bytes[3]])?;
        let geometry = Geometry::of(&metadata);
        let bat_len = geometry.check_bat_region(&layout, &metadata)?;
        Ok(Opened {
            file,
            length,
            layout,
            metadata,
            geometry,
            bat_len,
        })
    }

    /// Reads and checks the whole BAT, and plans the conversion.
    fn plan(&self) -> Result<Vec<Step>> {
        let g = self.geometry;
        let bat = read_at(
            &self.file,
            self.length,
            self.layout.bat.offset,
            self.bat_len,
            "the BAT",
        )?;
        let mut steps: Vec<Step> = Vec::new();
        // (host, BAT index, block) of every data block, to find overlapping ones.
        let mut data = Vec::new();
        for index in 0..g.bat_entries {
            let Some(block) = g.block_of_entry(index) else {
                continue;
            };
            let len = g.guest_len(block);
            if len == 0 {
                continue;
            }
            let guest = block * g.block_size;
            let entry = le64(&bat, (index * 8) as usize);
            match g.payload(&self.layout, index, block, entry)? {
                Payload::Zero => match steps.last_mut() {
                    Some(Step::Zero { guest: s, len: l }) if *s + *l == guest => *l += len,
                    _ => steps.push(Step::Zero { guest, len }),
                },
                Payload::Data(host) => {
                    if host + len > self.length {
                        return Err(VhdxError::Truncated {
                            what: "a payload block",
                            offset: host,
                            len,
                            end: self.length,
                        }
                        .into());
                    }
                    data.push((host, index, block));
                    // In runs of at most RUN_MAX: a block (32 MiB by default) is split too.
                    let mut at = 0;
                    while at < len {
                        let (guest, host) = (guest + at, host + at);
                        let piece = (len - at).min(RUN_MAX);
                        match steps.last_mut() {
                            Some(Step::Data {
                                guest: sg,
                                host: sh,
                                len: l,
                            }) if *sg + *l == guest
                                && *sh + *l == host
                                && *l + piece <= RUN_MAX =>
                            {
                                *l += piece
                            }
                            _ => steps.push(Step::Data {
                                guest,
                                host,
                                len: piece,
                            }),
                        }
                        at += piece;
                    }
                }
            }
        }
        data.sort_unstable();
        for w in data.windows(2) {
            let ((a, ai, _), (b, bi, bb)) = (w[0], w[1]);
            if b < a + g.block_size {
                return Err(g
                    .payloads_overlap(&self.layout, (bi, bb, b), (ai, a))
                    .into());
            }
        }
        Ok(steps)
    }

    pub fn convert(self, sink: &mut dyn ExtentSink) -> Result<VhdxStats> {
        let steps = self.plan()?;
        let (tx, rx) = sync_channel::<Result<(u64, Vec<u8>)>>(IN_FLIGHT);
        // A fixed set of buffers goes round: one being read, the queue, one being written.
        let buffers = IN_FLIGHT + 2;
        let (spare_tx, spare_rx) = sync_channel::<Vec<u8>>(buffers);
        for _ in 0..buffers {
            let _ = spare_tx.send(Vec::with_capacity(RUN_MAX as usize));
        }
        let file = &self.file;
        let data_read = std::thread::scope(|s| {
            let runs = steps.iter().filter_map(|st| match *st {
                Step::Data { guest, host, len } => Some((guest, host, len)),
                Step::Zero { .. } => None,
            });
            s.spawn(move || {
                for (guest, host, len) in runs {
                    // (the writer is gone when no buffer comes back)
                    let Ok(mut buf) = spare_rx.recv() else { return };
                    buf.resize(len as usize, 0);
                    let r = file
                        .read_exact_at(&mut buf, host)
                        .map(|()| (guest, buf))
                        .map_err(|e| Error::from_read(e, "vhdx image"));
                    if tx.send(r).is_err() {
                        return;
                    }
                }
            });
            // The receiver is dropped when this returns, which stops the reader after an error.
            write(&steps, rx, &spare_tx, sink)
        })?;
        Ok(VhdxStats {
            bytes_read: self.bat_len + data_read,
            held_bytes: 0,
            spilled_bytes: 0,
        })
    }
}

/// Writes the steps in order, the data runs as the reader delivers them; returns the data bytes.
fn write(
    steps: &[Step],
    runs: Receiver<Result<(u64, Vec<u8>)>>,
    spare: &SyncSender<Vec<u8>>,
    sink: &mut dyn ExtentSink,
) -> Result<u64> {
    let mut data = 0;
    for st in steps {
        match *st {
            Step::Zero { guest, len } => sink.write_zeroes(guest, len)?,
            Step::Data { .. } => {
                let (guest, buf) = runs.recv().map_err(|_| {
                    Error::io(
                        "vhdx conversion",
                        std::io::Error::other("the reader stopped"),
                    )
                })??;
                sink.write_data(guest, &buf)?;
                data += buf.len() as u64;
                let _ = spare.send(buf);
            }
        }
    }
    Ok(data)
}
