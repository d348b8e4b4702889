//! The tar framing of a `filesystem-clone` stream, as CDI's cloner makes it with GNU `tar -cS`:
//! GNU format, a sparse file as an old-GNU sparse entry (type `S`: the data extents' map in the
//! header and its extension blocks, then only the data), large numbers in base-256.
//!
//! [`sparse_header`] writes the one entry Quarry sends (`disk.img`); [`ImageReader`] reads the
//! `disk.img` entry out of a whole archive as the logical image (holes as zeroes, which the
//! pipeline turns back into holes). Directories, long names and other members are skipped.

use std::collections::VecDeque;
use std::io::{self, Read};

pub const BLOCK: usize = 512;
/// The file a filesystem volume holds its image in.
pub const IMAGE_NAME: &str = "disk.img";
/// Sparse entries in the header, and in each extension block.
const HEADER_SPARSE: usize = 4;
const EXTENSION_SPARSE: usize = 21;

/// A data extent `(offset, length)` of the image.
pub type Extent = (u64, u64);

/// Writes `value` into a numeric field: NUL-terminated octal when it fits, else GNU base-256.
fn put_number(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    if digits >= 22 || value < 1u64 << (3 * digits) {
        let text = format!("{value:0digits$o}");
        field[..digits].copy_from_slice(text.as_bytes());
        field[digits] = 0;
    } else {
        field.fill(0);
        field[0] = 0x80;
        let bytes = value.to_be_bytes();
        let n = bytes.len().min(field.len() - 1);
        let len = field.len();
        field[len - n..].copy_from_slice(&bytes[bytes.len() - n..]);
    }
}

/// Reads a numeric field (octal with spaces/NULs, or base-256).
fn get_number(field: &[u8]) -> io::Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut value: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            value = value
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(|| corrupt("a base-256 number overflows 64 bits"))?;
        }
        return Ok(value);
    }
    let text: String = field
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as char)
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|_| corrupt(&format!("bad octal number {text:?}")))
}

fn corrupt(why: &str) -> io::Error {
    importer::Error::Corrupt(format!("filesystem-clone tar stream: {why}")).into_io()
}

fn put_sparse(slot: &mut [u8], (offset, len): Extent) {
    put_number(&mut slot[..12], offset);
    put_number(&mut slot[12..24], len);
}

fn set_checksum(block: &mut [u8; BLOCK]) {
    block[148..156].fill(b' ');
    let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
    let text = format!("{sum:06o}\0 ");
    block[148..156].copy_from_slice(text.as_bytes());
}

/// The header blocks of a sparse `disk.img` entry of `size` bytes whose data is `extents`
/// (sorted, disjoint). The entry's data (the extents' bytes, in order) follows, padded to
/// [`BLOCK`], then the archive's end ([`end_of_archive`]).
pub fn sparse_header(size: u64, extents: &[Extent], mode: u32, mtime: u64) -> Vec<u8> {
    let mut map: Vec<Extent> = extents.to_vec();
    // GNU tar ends the map at the file's end, so a trailing hole is not lost.
    if map.last().is_none_or(|&(o, l)| o + l < size) {
        map.push((size, 0));
    }
    let stored: u64 = map.iter().map(|&(_, l)| l).sum();
    let mut header = [0u8; BLOCK];
    header[..IMAGE_NAME.len()].copy_from_slice(IMAGE_NAME.as_bytes());
    put_number(&mut header[100..108], u64::from(mode & 0o7777));
    put_number(&mut header[108..116], 0);
    put_number(&mut header[116..124], 0);
    put_number(&mut header[124..136], stored);
    put_number(&mut header[136..148], mtime);
    header[156] = b'S';
    header[257..265].copy_from_slice(b"ustar  \0");
    let (first, rest) = map.split_at(map.len().min(HEADER_SPARSE));
    for (i, &extent) in first.iter().enumerate() {
        put_sparse(&mut header[386 + i * 24..386 + (i + 1) * 24], extent);
    }
    header[482] = u8::from(!rest.is_empty());
    put_number(&mut header[483..495], size);
    set_checksum(&mut header);
    let mut out = header.to_vec();
    let chunks: Vec<&[Extent]> = rest.chunks(EXTENSION_SPARSE).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let mut ext = [0u8; BLOCK];
        for (j, &extent) in chunk.iter().enumerate() {
            put_sparse(&mut ext[j * 24..(j + 1) * 24], extent);
        }
        ext[504] = u8::from(i + 1 < chunks.len());
        out.extend_from_slice(&ext);
    }
    out
}

/// Zero bytes that pad `len` bytes of entry data to a whole block.
pub fn padding(len: u64) -> usize {
    ((BLOCK as u64 - len % BLOCK as u64) % BLOCK as u64) as usize
}

/// The end of an archive: two zero blocks.
pub fn end_of_archive() -> [u8; 2 * BLOCK] {
    [0u8; 2 * BLOCK]
}

/// One stretch of the logical image still to produce.
#[derive(Debug)]
enum Piece {
    Zeroes(u64),
    /// Bytes to copy from the archive.
    Data(u64),
    /// Archive bytes to drop (padding, skipped members).
    Skip(u64),
}

/// Reads the `disk.img` member of a tar archive as the logical image.
pub struct ImageReader<R> {
    inner: R,
    pieces: VecDeque<Piece>,
    /// The image member was found (a second one is refused).
    found: bool,
    /// The end-of-archive block was read.
    ended: bool,
    /// A long name (`L` member) for the next header.
    long_name: Option<String>,
}

impl<R: Read> ImageReader<R> {
    pub fn new(inner: R) -> Self {
        ImageReader {
            inner,
            pieces: VecDeque::new(),
            found: false,
            ended: false,
            long_name: None,
        }
    }

    fn read_block(&mut self) -> io::Result<[u8; BLOCK]> {
        let mut block = [0u8; BLOCK];
        self.inner.read_exact(&mut block).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                corrupt("the archive ends without its end-of-archive block")
            } else {
                e
            }
        })?;
        Ok(block)
    }

    fn read_vec(&mut self, len: u64) -> io::Result<Vec<u8>> {
        if len > 1 << 20 {
            return Err(corrupt(&format!("a {len}-byte long name")));
        }
        let mut data = vec![0u8; len as usize + padding(len)];
        self.inner.read_exact(&mut data).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                corrupt("the archive ends inside a member")
            } else {
                e
            }
        })?;
        data.truncate(len as usize);
        Ok(data)
    }

    /// Reads headers until the image member's pieces are queued, or the archive ends.
    fn next_member(&mut self) -> io::Result<()> {
        loop {
            let block = self.read_block()?;
            if block.iter().all(|&b| b == 0) {
                self.ended = true;
                if !self.found {
                    return Err(corrupt(&format!("the archive has no {IMAGE_NAME}")));
                }
                // Drain the rest (the second zero block, record padding) so the whole body is read.
                io::copy(&mut self.inner, &mut io::sink())?;
                return Ok(());
            }
            verify_checksum(&block)?;
            let size = get_number(&block[124..136])?;
            let typeflag = block[156];
            let name = match self.long_name.take() {
                Some(long) => long,
                None => header_name(&block),
            };
            match typeflag {
                b'L' => {
                    let data = self.read_vec(size)?;
                    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                    self.long_name = Some(String::from_utf8_lossy(&data[..end]).into_owned());
                }
                b'0' | 0 | b'7' | b'S' if is_image(&name) => {
                    if self.found {
                        return Err(corrupt(&format!("more than one {IMAGE_NAME}")));
                    }
                    self.found = true;
                    if typeflag == b'S' {
                        self.queue_sparse(&block, size)?;
                    } else {
                        self.pieces.push_back(Piece::Data(size));
                        self.pieces.push_back(Piece::Skip(padding(size) as u64));
                    }
                    return Ok(());
                }
                _ => {
                    if matches!(typeflag, b'0' | 0 | b'7' | b'S') {
                        tracing::warn!(member = %name, "skipping a file other than {IMAGE_NAME} in the clone stream");
                    }
                    // GNU sparse members store `size` bytes too; others store none or `size`.
                    let stored = if matches!(typeflag, b'5' | b'1' | b'2' | b'3' | b'4' | b'6') {
                        0
                    } else {
                        size
                    };
                    if typeflag == b'S' && block[482] != 0 {
                        self.sparse_extensions()?;
                    }
                    let skip = stored + padding(stored) as u64;
                    io::copy(&mut (&mut self.inner).take(skip), &mut io::sink())?;
                }
            }
        }
    }

    /// Reads the extension blocks of a sparse header, returning their entries.
    fn sparse_extensions(&mut self) -> io::Result<Vec<Extent>> {
        let mut map = Vec::new();
        loop {
            let ext = self.read_block()?;
            map.extend(sparse_entries(&ext[..EXTENSION_SPARSE * 24])?);
            if ext[504] == 0 {
                return Ok(map);
            }
        }
    }

    fn queue_sparse(&mut self, header: &[u8; BLOCK], stored: u64) -> io::Result<()> {
        let mut map = sparse_entries(&header[386..386 + HEADER_SPARSE * 24])?;
        if header[482] != 0 {
            map.extend(self.sparse_extensions()?);
        }
        let real = get_number(&header[483..495])?;
        let mut pos = 0u64;
        let mut total = 0u64;
        for (offset, len) in map {
            if offset < pos || offset.checked_add(len).is_none_or(|end| end > real) {
                return Err(corrupt(
                    "the sparse map is out of order or past the file's end",
                ));
            }
            if offset > pos {
                self.pieces.push_back(Piece::Zeroes(offset - pos));
            }
            if len > 0 {
                self.pieces.push_back(Piece::Data(len));
            }
            pos = offset + len;
            total += len;
        }
        if total != stored {
            return Err(corrupt(&format!(
                "the sparse map holds {total} bytes but the member stores {stored}"
            )));
        }
        if real > pos {
            self.pieces.push_back(Piece::Zeroes(real - pos));
        }
        self.pieces.push_back(Piece::Skip(padding(stored) as u64));
        Ok(())
    }
}

/// The non-empty entries of a run of 24-byte sparse slots (an all-zero slot ends the list).
fn sparse_entries(slots: &[u8]) -> io::Result<Vec<Extent>> {
    let mut out = Vec::new();
    for slot in slots.chunks_exact(24) {
        if slot.iter().all(|&b| b == 0) {
            break;
        }
        out.push((get_number(&slot[..12])?, get_number(&slot[12..])?));
    }
    Ok(out)
}

fn header_name(block: &[u8; BLOCK]) -> String {
    let field = |range: std::ops::Range<usize>| {
        let f = &block[range];
        let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
        String::from_utf8_lossy(&f[..end]).into_owned()
    };
    let name = field(0..100);
    // POSIX ustar splits long names into a prefix (not in old-GNU headers, whose bytes there differ).
    if &block[257..263] == b"ustar\0" {
        let prefix = field(345..500);
        if !prefix.is_empty() {
            return format!("{prefix}/{name}");
        }
    }
    name
}

fn is_image(name: &str) -> bool {
    name.trim_start_matches("./") == IMAGE_NAME
}

fn verify_checksum(block: &[u8; BLOCK]) -> io::Result<()> {
    let stored = get_number(&block[148..156])?;
    let sum: u64 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                u64::from(b' ')
            } else {
                u64::from(b)
            }
        })
        .sum();
    if stored != sum {
        return Err(corrupt(
            "a header's checksum does not match (not a tar stream?)",
        ));
    }
    Ok(())
}

impl<R: Read> Read for ImageReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.pieces.front_mut() {
                None if self.ended => return Ok(0),
                None => self.next_member()?,
                Some(Piece::Zeroes(0) | Piece::Data(0) | Piece::Skip(0)) => {
                    self.pieces.pop_front();
                }
                Some(Piece::Zeroes(n)) => {
                    let k = buf.len().min(usize::try_from(*n).unwrap_or(usize::MAX));
                    buf[..k].fill(0);
                    *n -= k as u64;
                    return Ok(k);
                }
                Some(Piece::Data(n)) => {
                    let k = buf.len().min(usize::try_from(*n).unwrap_or(usize::MAX));
                    let got = self.inner.read(&mut buf[..k])?;
                    if got == 0 {
                        return Err(corrupt("the archive ends inside the image's data"));
                    }
                    *n -= got as u64;
                    return Ok(got);
                }
                Some(Piece::Skip(n)) => {
                    let skip = *n;
                    let got = io::copy(&mut (&mut self.inner).take(skip), &mut io::sink())?;
                    if got < skip {
                        return Err(corrupt("the archive ends inside a member's padding"));
                    }
                    self.pieces.pop_front();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole archive holding one sparse image built from `(offset, bytes)` extents.
    fn archive(size: u64, data: &[(u64, Vec<u8>)]) -> Vec<u8> {
        let extents: Vec<Extent> = data.iter().map(|(o, d)| (*o, d.len() as u64)).collect();
        let mut out = sparse_header(size, &extents, 0o644, 0);
        let mut stored = 0u64;
        for (_, d) in data {
            out.extend_from_slice(d);
            stored += d.len() as u64;
        }
        out.resize(out.len() + padding(stored), 0);
        out.extend_from_slice(&end_of_archive());
        out
    }

    #[test]
    fn numbers_round_trip_in_octal_and_base_256() {
        for value in [0u64, 7, 0o77777777777, 1 << 33, 40 << 30, u64::MAX >> 1] {
            let mut field = [0u8; 12];
            put_number(&mut field, value);
            assert_eq!(get_number(&field).unwrap(), value);
        }
        let mut field = [0u8; 12];
        put_number(&mut field, 1 << 33);
        assert_eq!(field[0], 0x80, "8 GiB needs base-256 in a 12-byte field");
    }

    #[test]
    fn a_sparse_image_reads_back_with_its_holes_as_zeroes() {
        // More extents than the header holds, so extension blocks are written and read.
        let data: Vec<(u64, Vec<u8>)> = (0..30u64)
            .map(|i| (i * 8192 + 100, vec![i as u8 + 1; 700]))
            .collect();
        let size = 30 * 8192 + 5000;
        let mut image = Vec::new();
        ImageReader::new(&archive(size, &data)[..])
            .read_to_end(&mut image)
            .unwrap();
        let mut expected = vec![0u8; size as usize];
        for (o, d) in &data {
            expected[*o as usize..*o as usize + d.len()].copy_from_slice(d);
        }
        assert_eq!(image, expected);
    }

    #[test]
    fn an_archive_without_the_image_or_cut_short_is_corrupt() {
        let err = ImageReader::new(&[0u8; 1024][..])
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("no disk.img"), "{err}");
        let whole = archive(10_000, &[(0, vec![1; 3000])]);
        let err = ImageReader::new(&whole[..1500])
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("ends inside"), "{err}");
        let err = ImageReader::new(&b"not a tar stream at all"[..])
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(err.to_string().contains("end-of-archive"), "{err}");
    }
}
