//! Quarry's uploader: push a local image into a volume the way CDI's upload path does, so
//! `virtctl image-upload` works unchanged.
//!
//! ```text
//! quarry upload / virtctl ──> upload-proxy ──────────────> upload-server ──> importer pipeline
//!   (Bearer token)            (checks the PS256 token,       (one per volume:   (single pass, no
//!                              routes by its PVC claims)      streams the body)  scratch copy)
//! ```
//!
//! - [`token`]: CDI-compatible upload tokens (JWT, PS256) and RSA key pairs.
//! - [`server`]: the per-volume upload server (CDI's endpoints and status codes, plus resume).
//! - [`proxy`]: the token-checking streaming proxy.
//! - [`client`]: the resumable upload client behind `quarry upload`.
//! - [`clone`]: host-assisted clone streams (CDI's cloner wire format): `quarry clone-source`
//!   and the upload server's decoding of `filesystem-clone` / `blockdevice-clone` bodies.
//! - [`net`]: serving a router over TCP with optional TLS and mutual TLS, HTTP/1.1 and h2.
//! - [`limits`]: bounding a listener's connections (idle timeouts, a cap, lingering close).
//! - [`cli`]: the subcommands' arguments and entry points.

pub mod cli;
pub mod client;
pub mod clone;
pub mod error;
pub mod limits;
pub mod net;
pub mod proxy;
pub mod reload;
pub mod server;

pub use error::{Error, ErrorKind, Result};

/// CDI's upload paths answered synchronously (after the image is written and synced).
pub const SYNC_PATHS: [&str; 2] = ["/v1beta1/upload", "/v1alpha1/upload"];
/// CDI's upload paths answered as soon as every byte is received.
pub const ASYNC_PATHS: [&str; 2] = ["/v1beta1/upload-async", "/v1alpha1/upload-async"];
/// Multipart form variants (the part named `file`).
pub const SYNC_FORM_PATHS: [&str; 2] = ["/v1beta1/upload-form", "/v1alpha1/upload-form"];
pub const ASYNC_FORM_PATHS: [&str; 2] =
    ["/v1beta1/upload-form-async", "/v1alpha1/upload-form-async"];
/// CDI's archive upload paths (its upload proxy sends every upload to a `contentType: archive`
/// volume there): the body is a tar, extracted into the volume; answered synchronously.
pub const ARCHIVE_PATHS: [&str; 2] = ["/v1beta1/upload-archive", "/v1alpha1/upload-archive"];

/// Resume extension: on a request, the offset of the image its body starts at; on a `HEAD`
/// answer, how many bytes of an interrupted upload the server holds.
pub const UPLOAD_OFFSET: &str = "upload-offset";
/// On a `HEAD` answer: the whole image's length, when the interrupted upload announced it.
pub const UPLOAD_LENGTH: &str = "upload-length";
/// On a `HEAD` answer: `idle`, `busy` (a request is receiving or finishing an upload), `held`
/// (an interrupted upload waits for a resume) or `done`.
pub const UPLOAD_STATE: &str = "upload-state";
/// Optional checksum of the image as sent, `ALG:HEX` (md5, sha1, sha256, sha512).
pub const UPLOAD_CHECKSUM: &str = "upload-checksum";

/// Every upload path the server and the proxy answer.
pub fn upload_paths() -> impl Iterator<Item = &'static str> {
    SYNC_PATHS
        .into_iter()
        .chain(ASYNC_PATHS)
        .chain(SYNC_FORM_PATHS)
        .chain(ASYNC_FORM_PATHS)
        .chain(ARCHIVE_PATHS)
}
