//! The hold: image bytes that passed before anything said what they are.
//!
//! Segments are keyed by host offset and never overlap. They live in memory up to a byte budget;
//! past it, new segments go to an anonymous (already unlinked) temp file in the spill directory.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::error::{Error, Result};

enum Seg {
    Mem(Vec<u8>),
    Spilled { at: u64, len: u64 },
}

impl Seg {
    fn len(&self) -> u64 {
        match self {
            Seg::Mem(v) => v.len() as u64,
            Seg::Spilled { len, .. } => *len,
        }
    }
}

pub(crate) struct HeldBytes {
    budget: usize,
    in_memory: usize,
    segs: BTreeMap<u64, Seg>,
    spill_dir: PathBuf,
    spill: Option<File>,
    spill_len: u64,
    /// Total bytes ever written to the spill file (for tests and logs).
    pub spilled_bytes: u64,
    /// Total bytes ever held.
    pub held_bytes: u64,
}

impl HeldBytes {
    pub fn new(budget: usize, spill_dir: PathBuf) -> HeldBytes {
        HeldBytes {
            budget,
            in_memory: 0,
            segs: BTreeMap::new(),
            spill_dir,
            spill: None,
            spill_len: 0,
            spilled_bytes: 0,
            held_bytes: 0,
        }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Holds `data` as the image bytes at `host` (which must not be held already).
    pub fn add(&mut self, host: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        debug_assert!(
            self.segs
                .range(..host + data.len() as u64)
                .next_back()
                .is_none_or(|(s, seg)| s + seg.len() <= host),
            "hold segments overlap"
        );
        self.held_bytes += data.len() as u64;
        if self.in_memory + data.len() <= self.budget {
            self.in_memory += data.len();
            self.segs.insert(host, Seg::Mem(data.to_vec()));
            return Ok(());
        }
        let file = match &mut self.spill {
            Some(f) => f,
            none => none.insert(tempfile::tempfile_in(&self.spill_dir).map_err(|e| {
                Error::io(
                    format!("creating a spill file in {}", self.spill_dir.display()),
                    e,
                )
            })?),
        };
        file.write_all_at(data, self.spill_len)
            .map_err(|e| Error::io("writing the spill file", e))?;
        let at = self.spill_len;
        self.spill_len += data.len() as u64;
        self.spilled_bytes += data.len() as u64;
        self.segs.insert(
            host,
            Seg::Spilled {
                at,
                len: data.len() as u64,
            },
        );
        Ok(())
    }

    /// Copies the held bytes `[host, host + len)` into `out` (replacing its contents). Returns
    /// false, leaving `out` unspecified, when any of them is not held.
    pub fn read(&self, host: u64, len: u64, out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        let end = match host.checked_add(len) {
            Some(e) => e,
            None => return Ok(false),
        };
        let mut at = host;
        while at < end {
            let Some((&start, seg)) = self.segs.range(..=at).next_back() else {
                return Ok(false);
            };
            let seg_end = start + seg.len();
            if seg_end <= at {
                return Ok(false);
            }
            let from = at - start;
            let to = seg_end.min(end) - start;
            match seg {
                Seg::Mem(v) => out.extend_from_slice(&v[from as usize..to as usize]),
                Seg::Spilled { at: file_at, .. } => {
                    let n = out.len();
                    out.resize(n + (to - from) as usize, 0);
                    self.spill
                        .as_ref()
                        .expect("spilled segments have a file")
                        .read_exact_at(&mut out[n..], file_at + from)
                        .map_err(|e| Error::io("reading the spill file", e))?;
                }
            }
            at = start + to;
        }
        Ok(true)
    }

    /// Forgets the held bytes in `[start, end)`.
    pub fn release(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let keys: Vec<u64> = match self.segs.range(..start).next_back() {
            Some((&s, seg)) if s + seg.len() > start => Some(s),
            _ => None,
        }
        .into_iter()
        .chain(self.segs.range(start..end).map(|(&s, _)| s))
        .collect();
        for s in keys {
            let seg = self.segs.remove(&s).expect("key just listed");
            let seg_end = s + seg.len();
            // Keep [s, start) and [end, seg_end).
            let keep_left = start.saturating_sub(s).min(seg.len());
            let keep_right_from = end.clamp(s, seg_end) - s;
            match seg {
                Seg::Mem(v) => {
                    self.in_memory -= v.len();
                    if keep_right_from < v.len() as u64 {
                        let right = v[keep_right_from as usize..].to_vec();
                        self.in_memory += right.len();
                        self.segs.insert(s + keep_right_from, Seg::Mem(right));
                    }
                    if keep_left > 0 {
                        let mut left = v;
                        left.truncate(keep_left as usize);
                        left.shrink_to_fit();
                        self.in_memory += left.len();
                        self.segs.insert(s, Seg::Mem(left));
                    }
                }
                Seg::Spilled { at, len } => {
                    if keep_right_from < len {
                        self.segs.insert(
                            s + keep_right_from,
                            Seg::Spilled {
                                at: at + keep_right_from,
                                len: len - keep_right_from,
                            },
                        );
                    }
                    if keep_left > 0 {
                        self.segs.insert(s, Seg::Spilled { at, len: keep_left });
                    }
                }
            }
        }
    }

    /// Forgets everything (and closes, so deletes, the spill file).
    pub fn clear(&mut self) {
        self.segs.clear();
        self.in_memory = 0;
        self.spill = None;
        self.spill_len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn reads_back_across_memory_and_spilled_segments() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = HeldBytes::new(100, dir.path().into());
        let a = bytes(80, 1);
        let b = bytes(80, 2);
        h.add(1000, &a).unwrap();
        h.add(1080, &b).unwrap(); // over budget: spilled
        assert_eq!(h.spilled_bytes, 80);
        let mut out = Vec::new();
        assert!(h.read(1040, 80, &mut out).unwrap());
        assert_eq!(&out[..40], &a[40..]);
        assert_eq!(&out[40..], &b[..40]);
        assert!(!h.read(990, 20, &mut out).unwrap());
        assert!(!h.read(1150, 20, &mut out).unwrap());
        assert!(!h.read(u64::MAX - 5, 20, &mut out).unwrap());
    }

    #[test]
    fn release_trims_and_splits_segments() {
        let dir = tempfile::tempdir().unwrap();
        for budget in [0, 1 << 20] {
            let mut h = HeldBytes::new(budget, dir.path().into());
            let a = bytes(100, 3);
            h.add(0, &a).unwrap();
            h.release(10, 20);
            let mut out = Vec::new();
            assert!(h.read(0, 10, &mut out).unwrap());
            assert_eq!(out, &a[..10]);
            assert!(h.read(20, 80, &mut out).unwrap());
            assert_eq!(out, &a[20..]);
            assert!(!h.read(5, 10, &mut out).unwrap());
            h.release(0, 100);
            assert!(h.is_empty());
            assert_eq!(h.in_memory, 0);
        }
    }

    #[test]
    fn memory_is_reused_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = HeldBytes::new(100, dir.path().into());
        h.add(0, &bytes(100, 0)).unwrap();
        h.release(0, 100);
        h.add(100, &bytes(100, 0)).unwrap();
        assert_eq!(h.spilled_bytes, 0);
    }
}
