//! The import driver: open the source, peel compression, detect the format, check the image fits,
//! stream it into the target, verify the checksum, and only then commit.
//!
//! Threads: the source is read (and hashed) on one thread, decompression runs on another when
//! there is any, and format parsing plus positional writes on the calling thread; bounded channels
//! sit between them ([`crate::pipe`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::checksum::{Checksum, Hasher};
use crate::decode::{self, Compression};
use crate::error::{Error, Result};
use crate::format::vmdk::StreamedBecause;
use crate::format::{self, Content, FormatReader, ImageFormat, Input, ReaderOptions};
use crate::ova::{self, DiskChoice};
use crate::peek::Peeked;
use crate::pipe::{self, ChunkObserver};
use crate::progress::Progress;
use crate::sink::block::{self, BlockSink, ZeroMode};
use crate::sink::direct::Bounce;
use crate::sink::file::FileSink;
use crate::sink::{Bounded, VolumeSink};
use crate::size::usable_space;
use crate::source::file::open_file;
use crate::source::http::HttpOptions;
use crate::source::{ByteSource, SourceInfo, SourceSpec};

/// CDI's default filesystem overhead for filesystem volumes, as a fraction.
pub const DEFAULT_FILESYSTEM_OVERHEAD: f64 = 0.06;

/// One import, as requested: where its bytes come from, where they go and how.
///
/// `S` is the source: a [`SourceSpec`] the import opens itself ([`import`]), or `()` in the
/// request of a caller that opens the source and hands it over ([`import_from`]: an upload's
/// body, a blank disk's nothing).
#[derive(Debug, Clone)]
pub struct ImportRequest<S = SourceSpec> {
    pub source: S,
    /// A `disk.img` path (created or replaced) or a block device.
    pub target: PathBuf,
    /// Requested volume size in bytes.
    pub size: Option<u64>,
    /// Fraction of a filesystem volume kept free for the filesystem; default 0.06 for file
    /// targets and 0 for block devices.
    pub filesystem_overhead: Option<f64>,
    /// Expected checksum of the source bytes as downloaded (before decompression).
    pub checksum: Option<Checksum>,
    /// Allocate the whole target.
    pub preallocate: bool,
    /// Block devices: skip zeroing because the device is known to read zeroes.
    pub assume_zeroed: bool,
    /// Skip format detection.
    pub format: Option<ImageFormat>,
    pub http: HttpOptions,
    /// Memory a streaming reader may use to hold out-of-order data before spilling to disk.
    pub memory_budget: usize,
    /// An OVA source: the disk to import (the descriptor's first without one).
    pub disk: Option<DiskChoice>,
}

impl<S> ImportRequest<S> {
    pub fn new(source: S, target: impl Into<PathBuf>) -> Self {
        ImportRequest {
            source,
            target: target.into(),
            size: None,
            filesystem_overhead: None,
            checksum: None,
            preallocate: false,
            assume_zeroed: false,
            format: None,
            http: HttpOptions::default(),
            memory_budget: ReaderOptions::default().memory_budget,
            disk: None,
        }
    }
}

/// Credentials and CA certificates given in memory, each where its source takes it: how a
/// caller that holds them (a controller reading Secrets from the API) builds a request without
/// writing them to files for the CLI's options.
impl ImportRequest<SourceSpec> {
    /// `user:password`: a registry's login, or HTTP basic authentication (S3 and GCS sources
    /// take their credentials through [`Self::with_s3_credentials`] and
    /// [`Self::with_gcs_credentials`] instead; they are ignored for them).
    pub fn with_basic_auth(mut self, credentials: Option<(String, String)>) -> Self {
        match &mut self.source {
            SourceSpec::Registry { options, .. } => options.credentials = credentials,
            SourceSpec::S3 { .. } | SourceSpec::Gcs { .. } => {}
            _ => self.http.basic_auth = credentials,
        }
        self
    }

    /// An S3 source's keys (None: the request is sent unsigned); other sources ignore them.
    pub fn with_s3_credentials(
        mut self,
        credentials: Option<crate::source::s3::Credentials>,
    ) -> Self {
        if let SourceSpec::S3 { options, .. } = &mut self.source {
            options.credentials = credentials;
        }
        self
    }

    /// A GCS source's service-account key (None: anonymous requests); other sources ignore it.
    pub fn with_gcs_credentials(
        mut self,
        credentials: Option<crate::source::gcs::ServiceAccountKey>,
    ) -> Self {
        if let SourceSpec::Gcs { options, .. } = &mut self.source {
            options.credentials = credentials;
        }
        self
    }

    /// CA certificates (PEM) trusted besides the platform's roots, named for errors.
    pub fn with_ca_bundles(mut self, bundles: Vec<netkit::client::CaBundle>) -> Self {
        self.http.ca_bundles.extend(bundles);
        self
    }
}

/// What an import did, printed by `quarry import --json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImportReport {
    pub source: String,
    pub target: String,
    /// Layers from the outside in, e.g. `["xz", "qcow2"]`.
    pub format_chain: Vec<String>,
    pub format: ImageFormat,
    pub virtual_size: u64,
    /// Size of the result: the virtual size, or the usable size of the requested volume.
    pub target_size: u64,
    /// Source bytes read (as downloaded).
    pub source_bytes: u64,
    /// Guest data bytes handed to the target (zero runs in them are left as holes).
    pub bytes_written: u64,
    /// Checksum of the source bytes, `ALG:HEX`, when one was requested.
    pub source_checksum: Option<String>,
    pub duration_seconds: f64,
}

impl ImportReport {
    /// The one-line summary `quarry import` prints without `--json`.
    pub fn summary(&self) -> String {
        format!(
            "imported {} ({}) into {}: {} bytes virtual, {} data bytes written in {:.2}s",
            self.source,
            self.format_chain.join(" > "),
            self.target,
            self.virtual_size,
            self.bytes_written,
            self.duration_seconds
        )
    }
}

/// Counts and hashes the source bytes as they pass.
struct SourceObserver {
    hasher: Option<Hasher>,
    progress: Arc<Progress>,
    bytes: u64,
}

impl ChunkObserver for SourceObserver {
    fn observe(&mut self, chunk: &[u8]) {
        if let Some(h) = &mut self.hasher {
            h.update(chunk);
        }
        self.bytes += chunk.len() as u64;
        self.progress
            .source_read
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
}

/// What the target can take.
struct Capacity {
    /// Guest bytes that fit.
    limit: Option<u64>,
    /// How `limit` was derived, for error messages.
    detail: String,
    is_block: bool,
}

fn capacity<S>(req: &ImportRequest<S>) -> Result<Capacity> {
    let is_block = block::is_block_device(&req.target);
    let overhead = req.filesystem_overhead.unwrap_or(if is_block {
        0.0
    } else {
        DEFAULT_FILESYSTEM_OVERHEAD
    });
    if !(0.0..1.0).contains(&overhead) {
        return Err(Error::InvalidInput(format!(
            "filesystem overhead {overhead} is not a fraction in [0, 1)"
        )));
    }
    if is_block {
        let device = block::device_size(&req.target)?;
        if let Some(size) = req.size
            && size > device
        {
            return Err(Error::TooSmall {
                needed: size,
                available: device,
                detail: format!(
                    "the requested size exceeds block device {}",
                    req.target.display()
                ),
            });
        }
        let requested = req.size.unwrap_or(device);
        let limit = usable_space_exact(requested, overhead);
        return Ok(Capacity {
            limit: Some(limit),
            detail: format!("block device {} of {device} bytes", req.target.display()),
            is_block,
        });
    }
    Ok(match req.size {
        Some(size) => Capacity {
            limit: Some(usable_space(size, overhead)),
            detail: format!(
                "requested size {size} bytes minus {}% filesystem overhead",
                overhead * 100.0
            ),
            is_block,
        },
        None => Capacity {
            limit: None,
            detail: String::new(),
            is_block,
        },
    })
}

/// Block devices have no filesystem to round for: only an explicit overhead applies.
fn usable_space_exact(size: u64, overhead: f64) -> u64 {
    if overhead == 0.0 {
        size
    } else {
        usable_space(size, overhead)
    }
}

/// A source opened as far as its format: the reader, plus the stages feeding it.
struct Opened {
    reader: Box<dyn FormatReader>,
    chain: Vec<String>,
    format: ImageFormat,
    source_name: String,
    source_length: Option<u64>,
    stages: Stages,
    plan: MemoryPlan,
}

/// How one import spends its memory between its stages, chosen from the compression layers.
///
/// xz decodes on liblzma's own threads, which hold a whole compressed block, a dictionary and a
/// whole decoded block each ([`decode`]'s threading memory): everything around liblzma is kept
/// small so that the import stays under 100 MiB. Other inputs get the full buffers: their
/// decoders are fast enough for the buffers to matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MemoryPlan {
    /// The stage reading (and hashing) the source.
    source: pipe::StageBuffers,
    /// A stage between the decoders and the format reader, so decompression and parsing run on
    /// two threads.
    decode_stage: bool,
    /// The format reader's read size / window ([`ReaderOptions::read_ahead`]).
    read_ahead: usize,
    /// The file sink's `O_DIRECT` writer.
    bounce: Bounce,
}

impl MemoryPlan {
    /// Uncompressed input, or a local file read in place.
    const PLAIN: MemoryPlan = MemoryPlan {
        source: pipe::StageBuffers::DEFAULT,
        decode_stage: false,
        read_ahead: format::READ_AHEAD,
        bounce: Bounce::FULL,
    };

    /// Around liblzma: its output blocks already decouple it from the writer (a decode stage
    /// behind it would only add a copy and memory), and its decoding (~250 MB/s a thread) is far
    /// slower than reading or writing, which small buffers keep up with.
    const LEAN: MemoryPlan = MemoryPlan {
        source: pipe::StageBuffers::LEAN,
        decode_stage: false,
        read_ahead: 256 << 10,
        bounce: Bounce::LEAN,
    };

    /// The most the importer's own buffers between the source and the target hold (an HTTP
    /// source's channel and a qcow2 reader's tables come on top).
    fn buffers(&self) -> usize {
        self.source.memory()
            + if self.decode_stage {
                pipe::StageBuffers::DEFAULT.memory()
            } else {
                0
            }
            + self.read_ahead
            + self.bounce.memory()
    }

    /// The plan for a stream wrapped in `layers` (outermost first).
    fn for_layers(layers: &[Compression]) -> MemoryPlan {
        if layers.contains(&Compression::Xz) {
            MemoryPlan::LEAN
        } else {
            MemoryPlan {
                decode_stage: !layers.is_empty(),
                ..MemoryPlan::PLAIN
            }
        }
    }
}

/// Runs one import to completion, reading the source `req` names. `progress` is updated as it
/// goes.
pub fn import(req: &ImportRequest, progress: Arc<Progress>) -> Result<ImportReport> {
    run(req, progress, |progress| match open_local_file(req)? {
        Some(opened) => Ok(opened),
        None => open_stream(
            req,
            req.source.local_file(),
            req.source.open(&req.http)?,
            progress,
        ),
    })
}

/// Runs one import of a source the caller opened itself (an upload's body) to completion.
pub fn import_from(
    source: Box<dyn ByteSource>,
    req: &ImportRequest<()>,
    progress: Arc<Progress>,
) -> Result<ImportReport> {
    run(req, progress, |progress| {
        open_stream(req, None, source, progress)
    })
}

/// Checks the target's capacity, opens the source with `open`, and copies the image over.
fn run<S>(
    req: &ImportRequest<S>,
    progress: Arc<Progress>,
    open: impl FnOnce(&Arc<Progress>) -> Result<Opened>,
) -> Result<ImportReport> {
    let started = Instant::now();
    let capacity = capacity(req)?;
    let opened = open(&progress)?;
    let Opened {
        reader,
        chain,
        format,
        source_name,
        source_length,
        mut stages,
        plan,
    } = opened;

    let virtual_size = reader.virtual_size();
    if let Some(v) = virtual_size {
        progress.virtual_size.store(v, Ordering::Relaxed);
    }
    if let (Some(needed), Some(available)) = (virtual_size, capacity.limit)
        && needed > available
    {
        stages.cancel();
        return Err(Error::TooSmall {
            needed,
            available,
            detail: capacity.detail.clone(),
        });
    }
    let mut sink = match open_sink(req, &capacity, virtual_size, plan.bounce) {
        Ok(sink) => sink,
        Err(e) => {
            stages.cancel();
            return Err(e);
        }
    };
    let copied = reader.copy_to(&mut Bounded {
        inner: sink.as_mut(),
        limit: capacity.limit,
        progress: &progress,
    });
    let virtual_size = match copied {
        Ok(v) => v,
        Err(e) => {
            stages.cancel();
            sink.abort();
            return Err(e);
        }
    };

    // Every guest byte is written; let the source stage read to the end so the checksum covers it.
    let (source_bytes, source_checksum) =
        match stages.settle(req.checksum.as_ref(), source_length, &source_name) {
            Ok(settled) => settled,
            Err(e) => {
                sink.abort();
                return Err(e);
            }
        };

    let target_size = if capacity.is_block {
        virtual_size
    } else {
        match (req.size, capacity.limit) {
            (Some(_), Some(limit)) => limit.max(virtual_size),
            _ => virtual_size,
        }
    };
    sink.commit(target_size)?;
    Ok(ImportReport {
        source: source_name,
        target: req.target.display().to_string(),
        format_chain: chain,
        format,
        virtual_size,
        target_size,
        source_bytes,
        bytes_written: progress.data_written.load(Ordering::Relaxed),
        source_checksum: source_checksum.map(|c| c.to_string()),
        duration_seconds: started.elapsed().as_secs_f64(),
    })
}

/// The threads feeding a format reader (or an archive extraction): the source's and the
/// decoders'.
pub(crate) struct Stages {
    source: Option<pipe::Stage<SourceObserver>>,
    decode: Option<pipe::Stage<()>>,
}

impl Stages {
    fn none() -> Self {
        Stages {
            source: None,
            decode: None,
        }
    }

    /// Stops the stages after a failure.
    pub(crate) fn cancel(&mut self) {
        if let Some(s) = self.decode.take() {
            s.cancel();
        }
        if let Some(s) = self.source.take() {
            s.cancel();
        }
    }

    /// Joins the stages; returns the source bytes read and their checksum (None without stages).
    fn finish(&mut self) -> Result<Option<(u64, Option<Checksum>)>> {
        if let Some(decode) = self.decode.take() {
            let _ = decode.finish();
        }
        let Some(source) = self.source.take() else {
            return Ok(None);
        };
        let observed = source.finish().map_err(|e| Error::from_read(e, "source"))?;
        Ok(Some((observed.bytes, observed.hasher.map(Hasher::finish))))
    }

    /// Once every byte needed is read: lets the source stage read to the end, then checks the
    /// checksum and the length the source announced. Returns the source bytes read and their
    /// checksum.
    pub(crate) fn settle(
        &mut self,
        checksum: Option<&Checksum>,
        source_length: Option<u64>,
        source_name: &str,
    ) -> Result<(u64, Option<Checksum>)> {
        let (source_bytes, source_checksum) =
            self.finish()?.unwrap_or((source_length.unwrap_or(0), None));
        if let (Some(expected), Some(actual)) = (checksum, &source_checksum) {
            expected.verify(actual)?;
        }
        if let Some(length) = source_length
            && source_bytes != length
        {
            return Err(Error::SourceUnavailable(format!(
                "{source_name} announced {length} bytes but {source_bytes} arrived"
            )));
        }
        Ok((source_bytes, source_checksum))
    }
}

/// The fast path for an uncompressed image in a local regular file with no checksum to compute
/// (a checksum needs every byte in order): raw images are read by their data extents only,
/// qcow2 and vhdx images by random access, tables first, as `qemu-img convert` does.
fn open_local_file(req: &ImportRequest) -> Result<Option<Opened>> {
    let Some(path) = req.source.local_file() else {
        return Ok(None);
    };
    if req.checksum.is_some()
        || req.disk.is_some()
        || !req.format.is_none_or(format::open::is_readable)
    {
        return Ok(None);
    }
    let (file, info) = open_file(path)?;
    let Some(length) = info.length else {
        return Ok(None); // a pipe or device: stream it
    };
    let head = Peeked::new(&file, decode::SNIFF_LEN)
        .map_err(|e| Error::from_read(e, "source"))?
        .head()
        .to_vec();
    if !matches!(format::probe(&head, &info.name), Content::Image(_)) {
        // compressed: stream it through the decoders, which detect its format; an OVA: stream
        // its disk out of the tar
        return Ok(None);
    }
    let plan = MemoryPlan::PLAIN;
    let input = Input::File {
        path: path.to_path_buf(),
        file,
        length,
    };
    let reader = format::open(
        input,
        &head,
        &info.name,
        req.format,
        &reader_options(req, &plan),
    )?;
    let format = reader.format();
    Ok(Some(Opened {
        source_length: Some(length),
        reader,
        chain: vec![format.as_str().to_string()],
        format,
        source_name: info.name,
        stages: Stages::none(),
        plan,
    }))
}

/// Opens the source as a stream: a reading (and hashing) stage, compression layers peeled on a
/// decoding stage, and the format reader on top. `local_file` is the source's path when it is a
/// local file read as a stream (compressed, or an OVA).
fn open_stream<S>(
    req: &ImportRequest<S>,
    local_file: Option<&Path>,
    source: Box<dyn ByteSource>,
    progress: &Arc<Progress>,
) -> Result<Opened> {
    let (raw_stream, mut stages, info) = read_source(req.checksum.as_ref(), source, progress)?;
    match open_layers(req, local_file, &info, raw_stream, &mut stages) {
        Ok((reader, mut chain, format, plan)) => {
            chain.push(format.as_str().to_string());
            Ok(Opened {
                reader,
                chain,
                format,
                source_name: info.name,
                source_length: info.length,
                stages,
                plan,
            })
        }
        Err(e) => {
            stages.cancel();
            Err(e)
        }
    }
}

/// Reads a source on a stage of its own, counted into `progress` and hashed for `checksum`:
/// returns the stream of its bytes as stored, the stage, and what is known of the source.
pub(crate) fn read_source(
    checksum: Option<&Checksum>,
    mut source: Box<dyn ByteSource>,
    progress: &Arc<Progress>,
) -> Result<(decode::BoxRead, Stages, SourceInfo)> {
    let info = source.info().clone();
    progress
        .source_length
        .store(info.length.unwrap_or(0), Ordering::Relaxed);
    let observer = SourceObserver {
        hasher: checksum.map(|c| c.algorithm.hasher()),
        progress: progress.clone(),
        bytes: 0,
    };
    let (raw_stream, source_stage): (decode::BoxRead, _) = match source.take_chunks() {
        // Bytes that already come through a channel from their own thread are read from it.
        Some(chunks) => {
            let (reader, stage) = pipe::feed(chunks, observer);
            (Box::new(reader), stage)
        }
        None => {
            // The source stage is sized before it starts, so by the outermost layer, the only one
            // its first bytes show (the stage still hashes them: they are read again from the
            // peek).
            let head = Peeked::new(source as decode::BoxRead, decode::SNIFF_LEN)
                .map_err(|e| Error::from_read(e, "source"))?;
            let outer: Vec<Compression> = decode::detect(head.head()).into_iter().collect();
            let (reader, stage) = pipe::spawn_with(
                "source",
                head,
                observer,
                MemoryPlan::for_layers(&outer).source,
            );
            (Box::new(reader), stage)
        }
    };
    let stages = Stages {
        source: Some(source_stage),
        decode: None,
    };
    Ok((raw_stream, stages, info))
}

/// The reader, the layers around the image from the outside in (`["xz", "ova", "gzip"]`), its
/// format and the memory plan.
type OpenedLayers = (Box<dyn FormatReader>, Vec<String>, ImageFormat, MemoryPlan);

fn open_layers<S>(
    req: &ImportRequest<S>,
    local_file: Option<&Path>,
    info: &SourceInfo,
    raw_stream: decode::BoxRead,
    stages: &mut Stages,
) -> Result<OpenedLayers> {
    let mut source_length = info.length;
    let (mut decoded, mut layers) = decode::unwrap_layers(raw_stream)?;
    let mut chain: Vec<String> = layers.iter().map(|c| c.as_str().to_string()).collect();
    let mut name = info.name.clone();
    let in_ova = req.format.is_none() && format::probe(decoded.head(), &info.name) == Content::Ova;
    // Why a vmdk descriptor (readable only as a local file) arrived as a stream.
    let descriptor_because = match layers.first() {
        _ if in_ova => StreamedBecause::InOva,
        Some(layer) => StreamedBecause::Compressed(layer.as_str()),
        None if local_file.is_some() && info.length.is_some() && req.checksum.is_some() => {
            StreamedBecause::Checksum
        }
        None => StreamedBecause::Remote,
    };
    if in_ova {
        let opts = ova::OvaOptions {
            choice: req.disk.clone(),
            local: local_file
                .filter(|path| layers.is_empty() && path.is_file())
                .map(Path::to_path_buf),
            memory_budget: req.memory_budget,
            spill_dir: spill_dir(req),
        };
        let (disk, chosen) = ova::open_disk(Box::new(decoded), opts, &info.name)?;
        let (inner, inner_layers) = decode::unwrap_layers(Box::new(disk))?;
        chosen.check_layers(&inner_layers, &info.name)?;
        chain.push("ova".into());
        chain.extend(inner_layers.iter().map(|c| c.as_str().to_string()));
        source_length = inner_layers.is_empty().then_some(chosen.size);
        layers.extend(inner_layers);
        (decoded, name) = (inner, chosen.disk.href);
    } else if req.disk.is_some() {
        return Err(Error::InvalidInput(
            "--disk picks a disk of an OVA, and the source is not one".into(),
        ));
    }
    let head = decoded.head().to_vec();
    let plan = MemoryPlan::for_layers(&layers);
    tracing::debug!(?plan, buffers = plan.buffers(), ?layers, "memory plan");
    let stream: Box<dyn std::io::Read + Send> = if plan.decode_stage {
        let (reader, stage) = pipe::spawn("decode", decoded, ());
        stages.decode = Some(stage);
        Box::new(reader)
    } else {
        Box::new(decoded)
    };
    let input = Input::Stream {
        stream,
        length: source_length.filter(|_| layers.is_empty()),
        because: descriptor_because,
    };
    let reader = format::open(input, &head, &name, req.format, &reader_options(req, &plan))?;
    let format = reader.format();
    Ok((reader, chain, format, plan))
}

fn open_sink<S>(
    req: &ImportRequest<S>,
    capacity: &Capacity,
    virtual_size: Option<u64>,
    bounce: Bounce,
) -> Result<Box<dyn VolumeSink>> {
    let mut sink: Box<dyn VolumeSink> = if capacity.is_block {
        Box::new(BlockSink::open(
            &req.target,
            if req.assume_zeroed {
                ZeroMode::AssumeZeroed
            } else {
                ZeroMode::Explicit
            },
        )?)
    } else {
        Box::new(FileSink::create(&req.target, req.preallocate, bounce)?)
    };
    if let Some(size) = virtual_size
        && let Err(e) = sink.expect_size(size)
    {
        sink.abort();
        return Err(e);
    }
    Ok(sink)
}

/// The readers' options for `req` under `plan`.
fn reader_options<S>(req: &ImportRequest<S>, plan: &MemoryPlan) -> ReaderOptions {
    ReaderOptions {
        spill_dir: spill_dir(req),
        memory_budget: req.memory_budget,
        read_ahead: plan.read_ahead,
    }
}

/// Spill files live beside a file target (on the volume being filled), or in the temp directory
/// for block devices.
fn spill_dir<S>(req: &ImportRequest<S>) -> PathBuf {
    match req.target.parent() {
        Some(p) if !p.as_os_str().is_empty() && !block::is_block_device(&req.target) => {
            p.to_path_buf()
        }
        Some(p) if p.as_os_str().is_empty() => PathBuf::from("."),
        _ => std::env::temp_dir(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request that names no source imports the one handed over: a blank disk is nothing,
    /// imported into a volume of the usable size.
    #[test]
    fn a_request_without_a_source_imports_the_one_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.img");
        let mut req = ImportRequest::new((), &target);
        req.size = Some(1 << 20);
        let blank = Box::new(crate::source::Blank::default());
        let report = import_from(blank, &req, Arc::new(Progress::default())).unwrap();
        assert_eq!((report.source.as_str(), report.source_bytes), ("blank", 0));
        let usable = usable_space(1 << 20, DEFAULT_FILESYSTEM_OVERHEAD);
        assert_eq!(std::fs::metadata(&target).unwrap().len(), usable);
    }

    #[test]
    fn xz_anywhere_makes_the_plan_lean() {
        for layers in [
            &[Compression::Xz][..],
            &[Compression::Xz, Compression::Gzip],
            &[Compression::Gzip, Compression::Xz],
        ] {
            let plan = MemoryPlan::for_layers(layers);
            assert_eq!(plan.source, pipe::StageBuffers::LEAN, "{layers:?}");
            assert_eq!(plan.bounce, Bounce::LEAN, "{layers:?}");
            assert!(!plan.decode_stage, "{layers:?}");
        }
    }

    #[test]
    fn other_compression_decodes_on_its_own_stage() {
        for layers in [
            &[Compression::Gzip][..],
            &[Compression::Zstd, Compression::Gzip],
        ] {
            let plan = MemoryPlan::for_layers(layers);
            assert!(plan.decode_stage, "{layers:?}");
            assert_eq!(plan.source, pipe::StageBuffers::DEFAULT);
            assert_eq!(plan.bounce, Bounce::FULL);
        }
        assert_eq!(MemoryPlan::for_layers(&[]), MemoryPlan::PLAIN);
    }

    #[test]
    fn the_lean_plan_leaves_liblzma_room_under_100_mib() {
        // liblzma takes up to its threading memory (80 MiB), the binary's code ~14 MiB of
        // resident pages: the buffers around them, an HTTP source's channel included, must stay
        // within a few MiB.
        let lean = MemoryPlan::for_layers(&[Compression::Xz]);
        let http = HttpOptions::default().chunk_depth * crate::source::http::LARGEST_CHUNK;
        let around = lean.buffers() + http;
        assert!(around <= 2 << 20, "{} KiB around liblzma", around >> 10);
        assert!(decode::XZ_THREADING_MEMORY + (around as u64) + (14 << 20) < 98 << 20);
        assert!(MemoryPlan::PLAIN.buffers() > 4 * lean.buffers());
    }
}
