//! Decompression of compressed clusters, with qemu's acceptance rules (`qcow2-threads.c`):
//! a cluster is good when its bytes fill the whole output cluster without a decoder error;
//! whatever follows in the (sector-rounded) input is ignored.
//!
//! Not libdeflate, though it inflated whole clusters 1.3x faster here (vmdk grains 1.5x,
//! 2026-11-28): it accepts invalid deflate that zlib refuses (literal/length symbols 286 and 287
//! decode as length 258, a code of one codeword is completed), so a cluster with one flipped bit
//! could import where qemu-img refuses it; a vmdk grain's adler-32 does not catch it either, as
//! the flip from symbol 285 to 286 leaves the output unchanged.

use flate2::{Decompress, FlushDecompress};
use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};

use super::header::Compression;
use crate::format::inflate_pool::PieceDecoder;

/// Largest zstd window accepted (8 MiB): qemu's frames never need more than a cluster (2 MiB at
/// most), and the window is what a hostile frame could make the decoder allocate.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// One decoder per thread, kept from cluster to cluster: a fresh one per cluster allocated its
/// state and window each time, and those short-lived allocations, interleaved with longer-lived
/// ones, fragmented the heap by tens of MiB over an import.
pub(crate) struct Inflater {
    kind: Compression,
    deflate: Option<Decompress>,
    zstd: Option<Decoder<'static>>,
}

impl Inflater {
    pub fn new(kind: Compression) -> Inflater {
        Inflater {
            kind,
            deflate: None,
            zstd: None,
        }
    }

    /// Decompresses `src` into all of `dst`.
    pub fn inflate(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        match self.kind {
            Compression::Deflate => {
                // Raw deflate. qemu asks for a 4 KiB window (inflateInit2(&strm, -12)), but a
                // cluster is inflated in one call into one buffer, where back-references reach
                // into the output itself and the window never comes into play: the default
                // window decodes exactly the same, and only it can be reset without reallocating.
                let d = match &mut self.deflate {
                    Some(d) => {
                        d.reset(false);
                        d
                    }
                    None => self.deflate.insert(Decompress::new(false)),
                };
                let r = inflate_deflate(d, src, dst);
                if r.is_err() {
                    self.deflate = None;
                }
                r
            }
            Compression::Zstd => {
                if self.zstd.is_none() {
                    let mut d = Decoder::new().map_err(|e| format!("zstd: {e}"))?;
                    d.set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))
                        .map_err(|e| format!("zstd: {e}"))?;
                    self.zstd = Some(d);
                }
                let d = self.zstd.as_mut().expect("just set");
                let r = inflate_zstd(d, src, dst);
                if r.is_err() {
                    // A decoder that failed mid-frame is rebuilt for the next cluster.
                    self.zstd = None;
                }
                r
            }
        }
    }
}

/// The pool's workers inflate whole clusters: a piece is good only when it fills its cluster.
impl PieceDecoder for Inflater {
    fn decode(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, String> {
        self.inflate(src, dst).map(|()| dst.len())
    }
}

fn inflate_deflate(d: &mut Decompress, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    match d.decompress(src, dst, FlushDecompress::Finish) {
        Ok(_) if d.total_out() == dst.len() as u64 => Ok(()),
        Ok(_) => Err(format!(
            "deflate data ends after {} of {} bytes",
            d.total_out(),
            dst.len()
        )),
        Err(e) => Err(format!("deflate: {e}")),
    }
}

fn inflate_zstd(d: &mut Decoder<'static>, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    d.reinit().map_err(|e| format!("zstd: {e}"))?;
    let want = dst.len();
    let mut input = InBuffer::around(src);
    let mut output = OutBuffer::around(dst);
    let mut last = 0;
    // Like qemu: several frames may fill the cluster; stop once it is full.
    while output.pos() < want {
        let (in_before, out_before) = (input.pos(), output.pos());
        last = d
            .run(&mut input, &mut output)
            .map_err(|e| format!("zstd: {e}"))?;
        if input.pos() <= in_before && output.pos() <= out_before {
            return Err(format!(
                "zstd data ends after {} of {want} bytes",
                output.pos()
            ));
        }
    }
    if last > 0 {
        return Err("zstd frame is longer than a cluster".into());
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use flate2::{Compress, Compression as Level, FlushCompress};

    /// Raw deflate with a 4 KiB window, as qemu writes compressed clusters.
    pub(crate) fn deflate(data: &[u8]) -> Vec<u8> {
        let mut c = Compress::new_with_window_bits(Level::default(), false, 12);
        let mut out = Vec::with_capacity(data.len() + 1024);
        c.compress_vec(data, &mut out, FlushCompress::Finish)
            .unwrap();
        out
    }

    pub(crate) fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::bulk::compress(data, 3).unwrap()
    }

    fn sample(n: usize) -> Vec<u8> {
        (0..n).map(|i| ((i * 31) % 251) as u8).collect()
    }

    #[test]
    fn deflate_round_trip_ignores_trailing_bytes() {
        let data = sample(65536);
        let mut src = deflate(&data);
        src.extend_from_slice(&[0xee; 300]);
        let mut out = vec![0; 65536];
        Inflater::new(Compression::Deflate)
            .inflate(&src, &mut out)
            .unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn deflate_short_output_is_an_error() {
        let src = deflate(&sample(1000));
        let mut out = vec![0; 4096];
        let e = Inflater::new(Compression::Deflate)
            .inflate(&src, &mut out)
            .unwrap_err();
        assert!(e.contains("1000 of 4096"), "{e}");
    }

    #[test]
    fn deflate_garbage_and_empty_input_are_errors() {
        let mut out = vec![0; 4096];
        let mut i = Inflater::new(Compression::Deflate);
        assert!(i.inflate(&[0xff; 64], &mut out).is_err());
        assert!(i.inflate(&[], &mut out).is_err());
    }

    #[test]
    fn deflate_longer_stream_is_cut_at_the_cluster() {
        // qemu accepts a stream that would inflate to more than a cluster (Z_BUF_ERROR with a
        // full output buffer).
        let data = sample(8192);
        let src = deflate(&data);
        let mut out = vec![0; 4096];
        Inflater::new(Compression::Deflate)
            .inflate(&src, &mut out)
            .unwrap();
        assert_eq!(out, data[..4096]);
    }

    #[test]
    fn one_deflate_decoder_serves_cluster_after_cluster_and_after_errors() {
        let mut i = Inflater::new(Compression::Deflate);
        for round in 0..4 {
            let data = sample(4096 + round * 1000);
            let mut out = vec![0; data.len()];
            i.inflate(&deflate(&data), &mut out).unwrap();
            assert_eq!(out, data, "round {round}");
            // a corrupt cluster fails alone; the next one decodes
            assert!(i.inflate(&[0xff; 64], &mut out).is_err());
            let short = deflate(&data[..1000]);
            let e = i.inflate(&short, &mut out).unwrap_err();
            assert!(e.contains("1000 of"), "round {round}: {e}");
        }
    }

    #[test]
    fn zstd_round_trip_ignores_trailing_bytes() {
        let data = sample(65536);
        let mut src = zstd(&data);
        src.extend_from_slice(&[0; 511]);
        let mut out = vec![0; 65536];
        let mut i = Inflater::new(Compression::Zstd);
        i.inflate(&src, &mut out).unwrap();
        assert_eq!(out, data);
        // The decoder is reused for the next cluster.
        out.fill(0);
        i.inflate(&src, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn zstd_several_frames_fill_one_cluster() {
        let data = sample(8192);
        let mut src = zstd(&data[..3000]);
        src.extend(zstd(&data[3000..]));
        let mut out = vec![0; 8192];
        Inflater::new(Compression::Zstd)
            .inflate(&src, &mut out)
            .unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn zstd_errors() {
        let mut i = Inflater::new(Compression::Zstd);
        let mut out = vec![0; 4096];
        let short = zstd(&sample(1000));
        assert!(
            i.inflate(&short, &mut out)
                .unwrap_err()
                .contains("ends after")
        );
        let long = zstd(&sample(8192));
        assert!(i.inflate(&long, &mut out).unwrap_err().contains("longer"));
        assert!(i.inflate(&[0xff; 64], &mut out).is_err());
        assert!(i.inflate(&[], &mut out).is_err());
        // And it still works after errors.
        let ok = zstd(&sample(4096));
        i.inflate(&ok, &mut out).unwrap();
        assert_eq!(out, sample(4096));
    }
}
