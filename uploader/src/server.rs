//! The upload server: one per volume, as CDI's `cdi-upload-<pvc>` pod. It takes one image over
//! HTTP and streams the request body straight into the importer's single-pass pipeline (no
//! scratch copy, whatever the format), with CDI's endpoints and status codes:
//!
//! | request | answer |
//! |---|---|
//! | `POST /v1beta1/upload` (and `/v1alpha1/`) | 200 once the image is written and synced |
//! | `POST /v1beta1/upload-async` | 200 once every byte is received; writing finishes after |
//! | `POST .../upload-form[-async]` | the same, from the multipart part named `file` |
//! | `HEAD .../upload-async` | 200 (virtctl's probe); see resume below |
//! | `GET /healthz` | 200 `OK` |
//! | another upload while one runs | 503 |
//! | any upload after one succeeded | 409 |
//! | an image that cannot fit the target | 400 |
//! | a corrupt or unsupported image, a wrong checksum | 500 |
//!
//! **Resume.** When a request body breaks off, the pipeline is not torn down: it waits (up to
//! the resume window) with everything received so far, and `HEAD` on an async path answers
//! `Upload-Offset: N` (and `Upload-Length` when known). `HEAD` also tells the state
//! (`Upload-State: idle|busy|held|done`), so a client can wait while the server is still noticing
//! a broken connection instead of sending the image again. A `POST` carrying `Upload-Offset: N`
//! continues the same image from byte `N` (a smaller offset is accepted too: the overlap is
//! skipped). A `POST` without it, as `virtctl` sends when it retries, drops the held upload and
//! starts over, so plain clients keep working. An upload that is not resumed in time is aborted.
//!
//! **Archives.** A server started with `archive` (a `contentType: archive` volume) extracts every
//! upload, a tar optionally compressed, into its target directory ([`importer::archive`]) on any
//! path, CDI's `/v1beta1/upload-archive` (and `/v1alpha1/`) included, where CDI's upload proxy
//! sends archive uploads. A disk-image server answers 400 on the archive paths.
//!
//! **Clone streams.** A `POST` with `x-cdi-content-type: filesystem-clone|blockdevice-clone` is a
//! host-assisted clone as CDI's cloner sends it: the body is decoded by [`crate::clone::decode`]
//! and its image goes through the same pipeline, as raw (no format sniffing).
//!
//! A failed or aborted upload leaves no target that looks complete (the importer writes a
//! hidden partial file and renames it only on success), and the server accepts a new upload.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::{Buf, Bytes};
use futures_util::Stream;
use importer::checksum::Checksum;
use importer::chunks::{ChunkSender, Forward, Forwarded};
use importer::import::ImportRequest;
use importer::progress::Progress;
use importer::source::ChunkSource;
use importer::source::{ByteSource, SourceInfo};
use tokio::sync::watch;

use crate::clone::{CLONE_LENGTH, CONTENT_TYPE_HEADER, CloneKind};
use crate::net::text;
use crate::{ARCHIVE_PATHS, ASYNC_FORM_PATHS, ASYNC_PATHS, SYNC_FORM_PATHS, SYNC_PATHS};
use crate::{UPLOAD_CHECKSUM, UPLOAD_LENGTH, UPLOAD_OFFSET, UPLOAD_STATE};

/// Body chunks in flight between the HTTP side and the pipeline.
const CHANNEL_DEPTH: usize = 32;

/// What the server writes, and how.
#[derive(Debug, Clone)]
pub struct Config {
    pub target: PathBuf,
    pub size: Option<u64>,
    pub filesystem_overhead: Option<f64>,
    pub preallocate: bool,
    /// Uploads are tar archives extracted into the directory `target` (`contentType: archive`).
    pub archive: bool,
    /// How long an interrupted upload is held for a resume.
    pub resume_window: Duration,
    /// A body that delivers nothing for this long counts as interrupted.
    pub idle_timeout: Duration,
}

/// How an import ended, as the HTTP side needs it.
type Outcome = std::result::Result<(), (importer::ErrorKind, String)>;

/// One upload in progress: the sending half of the pipeline's source, and its outcome.
struct Session {
    /// The pipeline's source: ended when the body ended cleanly; dropped otherwise, and the
    /// pipeline sees an interrupted upload.
    tx: ChunkSender,
    received: u64,
    total: Option<u64>,
    outcome: watch::Receiver<Option<Outcome>>,
}

impl Session {
    /// Ends the source: cleanly (`complete`) or as an interrupted upload; returns the outcome.
    async fn close(self, complete: bool) -> Outcome {
        if complete {
            self.tx.end().await;
        }
        drop(self.tx);
        let mut outcome = self.outcome;
        match outcome.wait_for(Option::is_some).await {
            Ok(done) => done.clone().expect("waited for Some"),
            Err(_) => Err((
                importer::ErrorKind::Io,
                "the import thread ended without a result".into(),
            )),
        }
    }
}

enum Phase {
    Idle,
    /// A request owns the upload (receiving, finishing or aborting it).
    Busy,
    /// A body broke off; the upload waits for a resume. `generation` tells reapers apart.
    Paused {
        session: Session,
        generation: u64,
    },
    Succeeded,
}

struct App {
    config: Config,
    phase: Mutex<Phase>,
    generation: std::sync::atomic::AtomicU64,
    succeeded: watch::Sender<bool>,
}

/// The upload server's router, and a receiver that turns true once an upload succeeded.
pub fn router(config: Config) -> (Router, watch::Receiver<bool>) {
    let (succeeded, done) = watch::channel(false);
    let app = Arc::new(App {
        config,
        phase: Mutex::new(Phase::Idle),
        generation: Default::default(),
        succeeded,
    });
    let mut r = Router::new().route("/healthz", get(|| async { "OK" }));
    let kinds = [
        (SYNC_PATHS, false, false),
        (ASYNC_PATHS, false, true),
        (SYNC_FORM_PATHS, true, false),
        (ASYNC_FORM_PATHS, true, true),
        (ARCHIVE_PATHS, false, false),
    ];
    for (paths, form, is_async) in kinds {
        for path in paths {
            let archive_path = ARCHIVE_PATHS.contains(&path);
            let mut route = post(move |state: State<Arc<App>>, req: Request| async move {
                if archive_path && !state.config.archive {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "this upload server writes a disk image: archive uploads need a volume with contentType archive",
                    );
                }
                upload(state, req, form, is_async).await
            });
            if is_async {
                route = route.head(probe);
            }
            r = r.route(path, route);
        }
    }
    (r.with_state(app), done)
}

fn lock(app: &App) -> std::sync::MutexGuard<'_, Phase> {
    app.phase.lock().unwrap_or_else(|p| p.into_inner())
}

/// `HEAD` on an async path: 200, plus the resume offset when an upload is held.
async fn probe(State(app): State<Arc<App>>) -> Response {
    let mut headers = HeaderMap::new();
    let state = match &*lock(&app) {
        Phase::Idle => "idle",
        Phase::Busy => "busy",
        Phase::Succeeded => "done",
        Phase::Paused { session, .. } => {
            headers.insert(UPLOAD_OFFSET, HeaderValue::from(session.received));
            if let Some(total) = session.total {
                headers.insert(UPLOAD_LENGTH, HeaderValue::from(total));
            }
            "held"
        }
    };
    headers.insert(UPLOAD_STATE, HeaderValue::from_static(state));
    (StatusCode::OK, headers).into_response()
}

fn header_u64(headers: &HeaderMap, name: &str) -> std::result::Result<Option<u64>, String> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Some)
            .ok_or_else(|| format!("{name} is not a byte count")),
    }
}

/// What a request asks for.
struct Ask {
    offset: Option<u64>,
    /// The body's length (not the image's, for a resumed or form upload).
    body_length: Option<u64>,
    checksum: Option<Checksum>,
    form: bool,
    /// A clone stream's kind, and its image's length when the sender told it.
    clone: Option<(CloneKind, Option<u64>)>,
}

impl Ask {
    /// Reads the request's headers; the error is a message for a 400.
    fn parse(headers: &HeaderMap, form: bool) -> std::result::Result<Ask, String> {
        let checksum = match headers.get(UPLOAD_CHECKSUM) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|s| s.trim().parse::<Checksum>().ok())
                    .ok_or_else(|| {
                        format!("{UPLOAD_CHECKSUM} is not ALG:HEX (md5, sha1, sha256, sha512)")
                    })?,
            ),
        };
        let clone = headers
            .get(CONTENT_TYPE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(CloneKind::from_header);
        let clone = match clone {
            Some(kind) => Some((kind, header_u64(headers, CLONE_LENGTH)?)),
            None => None,
        };
        Ok(Ask {
            clone,
            offset: header_u64(headers, UPLOAD_OFFSET)?,
            body_length: header_u64(headers, header::CONTENT_LENGTH.as_str())?,
            checksum,
            form,
        })
    }

    /// The image's length, when the request tells it.
    fn image_length(&self) -> Option<u64> {
        if self.form {
            return None; // the body holds multipart framing too
        }
        self.body_length
            .map(|len| len.saturating_add(self.offset.unwrap_or(0)))
    }
}

async fn upload(State(app): State<Arc<App>>, req: Request, form: bool, is_async: bool) -> Response {
    // On its own task: a client that goes away drops this future, but the upload must still be
    // held for a resume (or settled), never left claimed by a request that no longer exists.
    match tokio::spawn(handle(app, req, form, is_async)).await {
        Ok(resp) => resp,
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the upload handler failed: {e}"),
        ),
    }
}

async fn handle(app: Arc<App>, req: Request, form: bool, is_async: bool) -> Response {
    let ask = match Ask::parse(req.headers(), form) {
        Ok(ask) => ask,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    if app.config.archive && ask.clone.is_some() {
        return text(
            StatusCode::BAD_REQUEST,
            "a clone stream cannot fill a volume whose content is an archive",
        );
    }
    let boundary = if form {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        match multer::parse_boundary(content_type) {
            Ok(b) => Some(b),
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("a form upload needs a multipart/form-data body: {e}"),
                );
            }
        }
    } else {
        None
    };
    let mut body = req.into_body().into_data_stream();
    let (mut session, skip) = match begin(&app, &ask).await {
        Ok(started) => started,
        Err(resp) => {
            crate::net::drain(body);
            return resp;
        }
    };
    let pumped = match boundary {
        None => {
            let pumped = pump(&app, &mut session, &mut body, skip).await;
            if matches!(pumped, Pumped::PipelineEnded | Pumped::Refused(_)) {
                crate::net::drain(body);
            }
            pumped
        }
        Some(boundary) => {
            let mut form = multer::Multipart::new(body, boundary);
            let pumped = pump_form(&app, &mut session, &mut form, skip).await;
            if matches!(pumped, Pumped::PipelineEnded | Pumped::Refused(_)) {
                drain_form(form);
            }
            pumped
        }
    };
    finish(&app, session, pumped, is_async).await
}

/// Pumps the form's part named `file`. The image is complete only once the whole form is read
/// and no second `file` part came (answering before the body is read would reset the client's
/// connection).
async fn pump_form(
    app: &App,
    session: &mut Session,
    form: &mut multer::Multipart<'static>,
    skip: u64,
) -> Pumped {
    let mut pumped = None;
    loop {
        let next = match tokio::time::timeout(app.config.idle_timeout, form.next_field()).await {
            Ok(next) => next,
            Err(_) => {
                return Pumped::Interrupted(format!("no bytes for {:?}", app.config.idle_timeout));
            }
        };
        match next {
            Ok(Some(field)) if field.name() == Some("file") => {
                if pumped.is_some() {
                    return Pumped::Refused(
                        "the form has more than one part named \"file\"".into(),
                    );
                }
                match pump(app, session, field, skip).await {
                    Pumped::Complete => pumped = Some(Pumped::Complete),
                    other => return other,
                }
            }
            Ok(Some(field)) => {
                tracing::info!(part = ?field.name(), "ignoring form part");
            }
            Ok(None) => {
                return pumped.unwrap_or_else(|| {
                    Pumped::Refused("the form has no part named \"file\"".into())
                });
            }
            Err(e) if session.received > 0 => return Pumped::Interrupted(e.to_string()),
            Err(e) => return Pumped::Refused(format!("bad multipart body: {e}")),
        }
    }
}

/// Reads and drops the rest of a refused form in the background, as [`crate::net::drain`].
fn drain_form(form: multer::Multipart<'static>) {
    let parts = futures_util::stream::unfold(form, |mut form| async move {
        match form.next_field().await {
            Ok(Some(_)) => Some((Ok::<_, multer::Error>(Bytes::new()), form)),
            _ => None,
        }
    });
    crate::net::drain(Box::pin(parts));
}

/// Claims the upload for this request: a fresh one, or the held one when the request resumes
/// it. Returns the session and how many leading body bytes the server already has.
async fn begin(app: &Arc<App>, ask: &Ask) -> std::result::Result<(Session, u64), Response> {
    let held = {
        let mut phase = lock(app);
        match std::mem::replace(&mut *phase, Phase::Busy) {
            Phase::Idle => None,
            Phase::Busy => {
                return Err(text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "another upload is in progress",
                ));
            }
            Phase::Succeeded => {
                *phase = Phase::Succeeded;
                return Err(text(
                    StatusCode::CONFLICT,
                    "an upload already succeeded: the volume is complete",
                ));
            }
            Phase::Paused { session, .. } => Some(session),
        }
    };
    match (held, ask.offset) {
        (Some(session), Some(offset)) => {
            let have = session.received;
            let consistent = match (session.total, ask.image_length()) {
                (Some(total), Some(length)) => total == length,
                _ => true,
            };
            if offset > have {
                *lock(app) = pause(app, session);
                return Err(offset_refusal(have, "the server holds fewer bytes"));
            }
            if !consistent {
                let total = session.total.unwrap_or(0);
                *lock(app) = pause(app, session);
                return Err(text(
                    StatusCode::BAD_REQUEST,
                    format!("the resumed body does not end at the image's length {total}"),
                ));
            }
            tracing::info!(offset, have, "resuming the upload");
            Ok((session, have - offset))
        }
        (None, Some(offset)) if offset > 0 => {
            *lock(app) = Phase::Idle;
            Err(offset_refusal(0, "no interrupted upload is held"))
        }
        (held, _) => {
            if let Some(session) = held {
                tracing::info!(
                    held = session.received,
                    "a new upload replaces the interrupted one"
                );
                let _ = session.close(false).await;
            }
            Ok((start(app, ask), 0))
        }
    }
}

/// 416 with the offset the client should continue from.
fn offset_refusal(offset: u64, why: &str) -> Response {
    let mut resp = text(
        StatusCode::RANGE_NOT_SATISFIABLE,
        format!("cannot resume there: {why}; continue from byte {offset}"),
    );
    resp.headers_mut()
        .insert(UPLOAD_OFFSET, HeaderValue::from(offset));
    resp
}

/// Starts the import pipeline on its own thread, fed from a channel.
fn start(app: &Arc<App>, ask: &Ask) -> Session {
    let (tx, chunks) =
        importer::chunks::channel(CHANNEL_DEPTH, "the upload was interrupted and not resumed");
    let total = ask.image_length();
    // The import reads the body's chunks straight from this channel.
    let info = SourceInfo {
        name: "upload".into(),
        length: total,
    };
    let source = ChunkSource::new(info, chunks);
    let cfg = &app.config;
    let source: Box<dyn ByteSource> = match ask.clone {
        None => Box::new(source),
        Some((kind, length)) => Box::new(CloneSource {
            info: SourceInfo {
                name: format!("{} stream", kind.as_str()),
                length,
            },
            image: crate::clone::decode::decode(kind, source),
        }),
    };
    // The request names no source: the body is handed over.
    let mut req = ImportRequest::new((), &cfg.target);
    if ask.clone.is_some() {
        // A clone carries a volume's raw bytes, whatever they start with.
        req.format = Some(importer::format::ImageFormat::Raw);
    }
    req.size = cfg.size;
    req.filesystem_overhead = cfg.filesystem_overhead;
    req.preallocate = cfg.preallocate;
    req.checksum = ask.checksum.clone();
    let (done, outcome) = watch::channel(None);
    let archive = cfg.archive;
    std::thread::Builder::new()
        .name("upload-import".into())
        .spawn(move || {
            let progress = Arc::new(Progress::default());
            let result = if archive {
                importer::archive::extract_from(source, &req, progress).map(|r| r.summary())
            } else {
                importer::import::import_from(source, &req, progress).map(|r| r.summary())
            };
            match &result {
                Ok(summary) => tracing::info!("upload written: {summary}"),
                Err(e) => tracing::warn!(error = %e, "upload failed"),
            }
            let _ = done.send(Some(
                result.map(drop).map_err(|e| (e.kind(), e.to_string())),
            ));
        })
        .expect("spawning the import thread");
    Session {
        tx,
        received: 0,
        total,
        outcome,
    }
}

/// How pumping a body ended.
enum Pumped {
    /// The body ended cleanly.
    Complete,
    /// The body broke off (or went silent): hold the upload for a resume.
    Interrupted(String),
    /// The pipeline stopped taking bytes: it failed.
    PipelineEnded,
    /// The request is wrong; abort the upload.
    Refused(String),
}

async fn pump<E: std::fmt::Display + Unpin>(
    app: &App,
    session: &mut Session,
    body: impl Stream<Item = std::result::Result<Bytes, E>> + Unpin,
    mut skip: u64,
) -> Pumped {
    // One wake-up of the pipeline thread per batch, not per HTTP frame.
    let mut body = Forward::new(body);
    loop {
        let mut chunk = match body.next(&session.tx, app.config.idle_timeout).await {
            Forwarded::Frame(chunk) => chunk,
            Forwarded::End => return Pumped::Complete,
            Forwarded::Failed(e) => return Pumped::Interrupted(e.to_string()),
            Forwarded::Closed => return Pumped::PipelineEnded,
            Forwarded::Idle => {
                return Pumped::Interrupted(format!("no bytes for {:?}", app.config.idle_timeout));
            }
        };
        if skip > 0 {
            let n = chunk.len().min(usize::try_from(skip).unwrap_or(usize::MAX));
            chunk.advance(n);
            skip -= n as u64;
        }
        if chunk.is_empty() {
            continue;
        }
        let len = chunk.len() as u64;
        if let Some(total) = session.total
            && session.received + len > total
        {
            return Pumped::Refused(format!(
                "the body holds more than the announced {total} bytes"
            ));
        }
        body.push(chunk);
        session.received += len;
    }
}

async fn finish(app: &Arc<App>, session: Session, pumped: Pumped, is_async: bool) -> Response {
    let pumped = match pumped {
        Pumped::Complete if session.total.is_some_and(|t| session.received < t) => {
            Pumped::Interrupted(format!(
                "the body ended after {} of {} bytes",
                session.received,
                session.total.unwrap_or(0)
            ))
        }
        other => other,
    };
    match pumped {
        Pumped::Complete if is_async => {
            let app = app.clone();
            tokio::spawn(async move {
                let outcome = session.close(true).await;
                settle(&app, &outcome);
            });
            StatusCode::OK.into_response()
        }
        Pumped::Complete => {
            let outcome = session.close(true).await;
            settle(app, &outcome);
            answer(&outcome)
        }
        Pumped::PipelineEnded => {
            let outcome = session.close(false).await;
            settle(app, &outcome);
            answer(&outcome)
        }
        Pumped::Refused(why) => {
            let _ = session.close(false).await;
            *lock(app) = Phase::Idle;
            text(StatusCode::BAD_REQUEST, why)
        }
        Pumped::Interrupted(why) => {
            let received = session.received;
            tracing::warn!(received, cause = %why, "upload interrupted; holding it for a resume");
            *lock(app) = pause(app, session);
            let mut resp = text(
                StatusCode::BAD_REQUEST,
                format!(
                    "upload interrupted after {received} bytes ({why}); resume with {UPLOAD_OFFSET}"
                ),
            );
            resp.headers_mut()
                .insert(UPLOAD_OFFSET, HeaderValue::from(received));
            resp
        }
    }
}

/// Holds `session` for a resume, and arms its reaper.
fn pause(app: &Arc<App>, session: Session) -> Phase {
    let generation = app.generation.fetch_add(1, Ordering::SeqCst) + 1;
    let reaper = app.clone();
    tokio::spawn(async move {
        tokio::time::sleep(reaper.config.resume_window).await;
        let held = {
            let mut phase = lock(&reaper);
            match std::mem::replace(&mut *phase, Phase::Busy) {
                Phase::Paused {
                    session,
                    generation: g,
                } if g == generation => Some(session),
                other => {
                    *phase = other;
                    None
                }
            }
        };
        if let Some(session) = held {
            tracing::warn!(
                received = session.received,
                "no resume within {:?}: aborting the upload",
                reaper.config.resume_window
            );
            let _ = session.close(false).await;
            *lock(&reaper) = Phase::Idle;
        }
    });
    Phase::Paused {
        session,
        generation,
    }
}

/// Records how the upload ended: success is final, a failure frees the server for a new try.
fn settle(app: &App, outcome: &Outcome) {
    let succeeded = outcome.is_ok();
    *lock(app) = if succeeded {
        Phase::Succeeded
    } else {
        Phase::Idle
    };
    if succeeded {
        let _ = app.succeeded.send(true);
    }
}

/// CDI's status codes: 400 when the image cannot fit (or the request is wrong), 500 otherwise.
fn answer(outcome: &Outcome) -> Response {
    match outcome {
        Ok(_) => StatusCode::OK.into_response(),
        Err((kind, message)) => {
            let status = match kind {
                importer::ErrorKind::TooSmall | importer::ErrorKind::InvalidInput => {
                    StatusCode::BAD_REQUEST
                }
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            text(status, format!("Saving stream failed: {message}"))
        }
    }
}

/// The pipeline's view of a clone stream: the image decoded from the body.
struct CloneSource {
    info: SourceInfo,
    image: Box<dyn Read + Send>,
}

impl Read for CloneSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.image.read(buf)
    }
}

impl ByteSource for CloneSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }
}

/// Runs the server until an upload succeeds (unless `keep_serving`) or SIGTERM.
pub async fn run(
    config: Config,
    listen: std::net::SocketAddr,
    tls: Option<crate::net::TlsFiles>,
    limits: crate::limits::Limits,
    keep_serving: bool,
) -> crate::Result<()> {
    let tls = tls.as_ref().map(crate::net::server_config).transpose()?;
    let listener = crate::net::bind(listen).await?;
    tracing::info!(addr = %listener.local_addr().map_err(|e| crate::Error::io("listener", e))?, target = %config.target.display(), "upload server listening");
    let (router, mut succeeded) = router(config);
    let stop = async move {
        let done = async {
            if keep_serving {
                std::future::pending::<()>().await;
            }
            let _ = succeeded.wait_for(|s| *s).await;
        };
        tokio::select! {
            () = done => tracing::info!("upload complete; stopping"),
            () = netkit::runtime::terminated() => tracing::info!("terminated"),
        }
    };
    crate::net::serve(listener, tls, router, limits, stop).await
}
