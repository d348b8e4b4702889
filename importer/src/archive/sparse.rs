//! Where a file's data lies: GNU tar's PAX sparse formats (0.0, 0.1 and 1.0, the ones
//! `tar --sparse --format=posix` writes), read from an entry's PAX records and, for 1.0, from the
//! map at the start of its data. Old GNU sparse entries (type `S`) need nothing here: the `tar`
//! crate expands them, and their zero runs become holes like any file's.

use std::io::Read;

use super::error::{ArchiveError, Result};

/// At most this many data regions in one sparse file (16 bytes of memory each).
const MAX_REGIONS: usize = 1 << 20;

/// A file's data regions `(offset, length)`, in order and disjoint, and its full size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub size: u64,
    pub regions: Vec<(u64, u64)>,
}

impl Layout {
    /// A file whose `size` bytes all come from the archive, in order.
    pub fn dense(size: u64) -> Self {
        Layout {
            size,
            regions: vec![(0, size)],
        }
    }

    /// The bytes the regions take from the archive.
    pub fn stored(&self) -> u64 {
        self.regions.iter().map(|r| r.1).sum()
    }

    fn check(self, entry: &str) -> Result<Self> {
        let mut end = 0u64;
        for &(offset, len) in &self.regions {
            let region_end = offset.checked_add(len);
            if offset < end || region_end.is_none_or(|e| e > self.size) {
                return Err(ArchiveError::malformed(
                    entry,
                    format!(
                        "sparse map region at {offset} (+{len}) overlaps another or lies past the file's size {}",
                        self.size
                    ),
                ));
            }
            end = region_end.unwrap_or(end);
        }
        Ok(self)
    }
}

/// A PAX sparse file, as its records describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaxSparse {
    /// The file's real name (`GNU.sparse.name`), when given.
    pub name: Option<Vec<u8>>,
    /// The layout, or `None` for format 1.0, whose map starts the data ([`read_map`]).
    pub layout: Option<Layout>,
    /// The full size.
    pub size: u64,
}

fn number(entry: &str, key: &str, value: &[u8]) -> Result<u64> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            ArchiveError::malformed(
                entry,
                format!(
                    "PAX record {key}={:?} is not a number",
                    String::from_utf8_lossy(value)
                ),
            )
        })
}

fn too_many(entry: &str) -> ArchiveError {
    ArchiveError::malformed(
        entry,
        format!("sparse map with more than {MAX_REGIONS} regions"),
    )
}

/// The sparse description in an entry's PAX records (in archive order), or `None` when the
/// entry is not a PAX sparse file.
pub fn from_pax(records: &[(String, Vec<u8>)], entry: &str) -> Result<Option<PaxSparse>> {
    if !records.iter().any(|(k, _)| k.starts_with("GNU.sparse.")) {
        return Ok(None);
    }
    let mut name = None;
    let (mut major, mut size, mut realsize) = (None, None, None);
    let mut map: Option<Vec<u64>> = None;
    let mut pairs: Vec<u64> = Vec::new();
    for (key, value) in records {
        match key.as_str() {
            "GNU.sparse.name" => name = Some(value.clone()),
            "GNU.sparse.major" => major = Some(number(entry, key, value)?),
            "GNU.sparse.size" => size = Some(number(entry, key, value)?),
            "GNU.sparse.realsize" => realsize = Some(number(entry, key, value)?),
            "GNU.sparse.map" => {
                let text = String::from_utf8_lossy(value);
                let mut numbers = Vec::new();
                for n in text.split(',').filter(|n| !n.is_empty()) {
                    if numbers.len() >= 2 * MAX_REGIONS {
                        return Err(too_many(entry));
                    }
                    numbers.push(number(entry, key, n.as_bytes())?);
                }
                map = Some(numbers);
            }
            "GNU.sparse.offset" | "GNU.sparse.numbytes" => {
                if pairs.len() >= 2 * MAX_REGIONS {
                    return Err(too_many(entry));
                }
                pairs.push(number(entry, key, value)?);
            }
            _ => {}
        }
    }
    let full = realsize.or(size).ok_or_else(|| {
        ArchiveError::malformed(
            entry,
            "PAX sparse file without GNU.sparse.realsize or .size",
        )
    })?;
    let numbers = match (major, map) {
        (Some(1), _) => {
            return Ok(Some(PaxSparse {
                name,
                layout: None,
                size: full,
            }));
        }
        (Some(m), _) if m != 0 => {
            return Err(ArchiveError::refused(
                entry,
                format!("PAX sparse format {m}.x is not supported"),
            ));
        }
        (_, Some(map)) => map,
        (_, None) => pairs,
    };
    if numbers.len() % 2 != 0 {
        return Err(ArchiveError::malformed(
            entry,
            "PAX sparse map has an offset without a length",
        ));
    }
    let layout = Layout {
        size: full,
        regions: numbers.chunks(2).map(|p| (p[0], p[1])).collect(),
    }
    .check(entry)?;
    Ok(Some(PaxSparse {
        name,
        layout: Some(layout),
        size: full,
    }))
}

/// Reads format 1.0's map from the start of the entry's data: a count, then offset and length
/// pairs, one decimal number a line, padded to a 512-byte block. Returns the layout and the
/// bytes the map took. Read a block at a time: the map fills whole blocks.
pub fn read_map(data: &mut dyn Read, size: u64, entry: &str) -> Result<(Layout, u64)> {
    let mut block = [0u8; 512];
    let (mut at, mut blocks) = (block.len(), 0u64);
    let mut line = || -> Result<u64> {
        let mut digits = Vec::new();
        loop {
            if at == block.len() {
                data.read_exact(&mut block)
                    .map_err(|e| ArchiveError::reading(e, Some(entry)))?;
                (at, blocks) = (0, blocks + 1);
            }
            let byte = block[at];
            at += 1;
            match byte {
                b'\n' => break,
                b'0'..=b'9' if digits.len() < 20 => digits.push(byte),
                _ => {
                    return Err(ArchiveError::malformed(
                        entry,
                        "the PAX sparse map (format 1.0) is not decimal numbers a line",
                    ));
                }
            }
        }
        number(entry, "sparse map", &digits)
    };
    let count = line()?;
    if count > MAX_REGIONS as u64 {
        return Err(too_many(entry));
    }
    let mut regions = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let offset = line()?;
        let len = line()?;
        regions.push((offset, len));
    }
    let layout = Layout { size, regions }.check(entry)?;
    Ok((layout, blocks * 512))
}

/// An entry's PAX records, in archive order.
pub fn pax_records<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<Vec<(String, Vec<u8>)>> {
    match entry.pax_extensions() {
        Ok(Some(pax)) => Ok(pax
            .filter_map(|r| r.ok())
            .filter_map(|r| Some((r.key().ok()?.to_string(), r.value_bytes().to_vec())))
            .collect()),
        Ok(None) => Ok(Vec::new()),
        Err(e) => Err(ArchiveError::reading(e, None)),
    }
}

/// The layout of an entry whose data (`stored` bytes, `data`) starts here: dense, or the PAX
/// sparse file `sparse` describes (format 1.0's map read from the data, which then holds the
/// regions' bytes).
pub fn layout(
    data: &mut dyn Read,
    stored: u64,
    sparse: Option<PaxSparse>,
    entry: &str,
) -> Result<Layout> {
    let layout = match sparse {
        None => return Ok(Layout::dense(stored)),
        Some(PaxSparse {
            layout: Some(layout),
            ..
        }) => layout,
        Some(s) => {
            let (layout, map_bytes) = read_map(data, s.size, entry)?;
            if map_bytes + layout.stored() != stored {
                return Err(ArchiveError::malformed(
                    entry,
                    format!(
                        "its sparse map lists {} data bytes but the entry stores {}",
                        layout.stored(),
                        stored.saturating_sub(map_bytes)
                    ),
                ));
            }
            layout
        }
    };
    if layout.stored() > stored {
        return Err(ArchiveError::malformed(
            entry,
            "its sparse map lists more data than the entry stores",
        ));
    }
    Ok(layout)
}

/// A sparse file's whole bytes, read from its stored regions: zeroes between them.
pub struct Expand<R> {
    data: R,
    layout: Layout,
    /// The next region, and the file offset read up to.
    next: usize,
    pos: u64,
}

impl<R: Read> Expand<R> {
    pub fn new(data: R, layout: Layout) -> Self {
        Expand {
            data,
            layout,
            next: 0,
            pos: 0,
        }
    }
}

impl<R: Read> Read for Expand<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while let Some(&(offset, len)) = self.layout.regions.get(self.next)
            && self.pos >= offset + len
        {
            self.next += 1;
        }
        let (start, end) = match self.layout.regions.get(self.next) {
            Some(&(offset, len)) => (offset, offset + len),
            None => (self.layout.size, self.layout.size),
        };
        if self.pos < start {
            // A hole.
            let n = (start - self.pos).min(out.len() as u64) as usize;
            out[..n].fill(0);
            self.pos += n as u64;
            return Ok(n);
        }
        let want = (end - self.pos).min(out.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.data.read(&mut out[..want])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(list: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn plain_entries_are_not_sparse() {
        assert_eq!(from_pax(&records(&[("path", "a")]), "a").unwrap(), None);
    }

    #[test]
    fn formats_0_0_and_0_1_list_their_regions_in_records() {
        let v01 = records(&[
            ("GNU.sparse.size", "10000"),
            ("GNU.sparse.map", "0,512,8192,100"),
            ("GNU.sparse.name", "dir/f"),
        ]);
        let s = from_pax(&v01, "x").unwrap().unwrap();
        assert_eq!(s.name.as_deref(), Some(&b"dir/f"[..]));
        assert_eq!(s.layout.unwrap().regions, [(0, 512), (8192, 100)]);
        let v00 = records(&[
            ("GNU.sparse.size", "10000"),
            ("GNU.sparse.offset", "4096"),
            ("GNU.sparse.numbytes", "10"),
        ]);
        assert_eq!(
            from_pax(&v00, "x")
                .unwrap()
                .unwrap()
                .layout
                .unwrap()
                .regions,
            [(4096, 10)]
        );
    }

    #[test]
    fn format_1_0_reads_its_map_from_the_data() {
        let v10 = records(&[
            ("GNU.sparse.major", "1"),
            ("GNU.sparse.minor", "0"),
            ("GNU.sparse.realsize", "1048576"),
        ]);
        let s = from_pax(&v10, "x").unwrap().unwrap();
        assert_eq!((s.layout, s.size), (None, 1048576));
        let mut data = b"2\n0\n4096\n1044480\n4096\n".to_vec();
        data.resize(512, 0);
        data.extend_from_slice(b"DATA");
        let mut r = &data[..];
        let (layout, used) = read_map(&mut r, s.size, "x").unwrap();
        assert_eq!(used, 512);
        assert_eq!(layout.regions, [(0, 4096), (1044480, 4096)]);
        assert_eq!(r, b"DATA");
    }

    #[test]
    fn a_sparse_file_reads_whole_with_zeroes_between_its_regions() {
        let layout = Layout {
            size: 20,
            regions: vec![(0, 2), (5, 3), (19, 1)],
        };
        let mut whole = Vec::new();
        Expand::new(&b"abcdez"[..], layout.clone())
            .read_to_end(&mut whole)
            .unwrap();
        assert_eq!(whole, b"ab\0\0\0cde\0\0\0\0\0\0\0\0\0\0\0z");
        let e = Expand::new(&b"abc"[..], layout).read_to_end(&mut whole);
        assert_eq!(e.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn bad_maps_are_malformed() {
        let overlapping = records(&[("GNU.sparse.size", "100"), ("GNU.sparse.map", "0,50,40,10")]);
        let past_end = records(&[("GNU.sparse.size", "100"), ("GNU.sparse.map", "90,20")]);
        let odd = records(&[("GNU.sparse.size", "100"), ("GNU.sparse.map", "0")]);
        let no_size = records(&[("GNU.sparse.map", "0,1")]);
        for r in [overlapping, past_end, odd, no_size] {
            let e = from_pax(&r, "x").unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::CorruptImage, "{e}");
        }
        let mut r = &b"99999999999\n"[..];
        assert!(read_map(&mut r, 1, "x").is_err());
        let mut r = &b"1\n0\nxyz\n"[..];
        assert!(read_map(&mut r, 1, "x").is_err());
    }
}
