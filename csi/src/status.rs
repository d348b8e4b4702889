//! The one place where provisioner errors become gRPC statuses.

use provisioner::ErrorKind;
use tonic::{Code, Status};

/// Maps a provisioner error to its deliberate gRPC status.
pub fn to_status(e: provisioner::Error) -> Status {
    let code = match e.kind() {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::Aborted => Code::Aborted,
        ErrorKind::OutOfRange => Code::OutOfRange,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::Unavailable => Code::Unavailable,
    };
    if code == Code::Internal {
        tracing::error!(error = %e, "request failed");
    } else {
        tracing::debug!(error = %e, code = ?code, "request refused");
    }
    Status::new(code, e.to_string())
}

/// Runs blocking provisioner work off the async runtime and maps its error.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, Status>
where
    T: Send + 'static,
    F: FnOnce() -> provisioner::Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(to_status),
        Err(e) => Err(Status::internal(format!("worker failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioner::Error;

    #[test]
    fn every_kind_has_its_code() {
        let cases = [
            (Error::InvalidArgument("x".into()), Code::InvalidArgument),
            (Error::VolumeNotFound("v".into()), Code::NotFound),
            (Error::SnapshotNotFound("s".into()), Code::NotFound),
            (Error::AlreadyExists("x".into()), Code::AlreadyExists),
            (Error::Busy("v".into()), Code::Aborted),
            (Error::InvalidToken("t".into()), Code::Aborted),
            (Error::OutOfRange("x".into()), Code::OutOfRange),
            (Error::NoSpace("x".into()), Code::ResourceExhausted),
            (
                Error::FailedPrecondition("x".into()),
                Code::FailedPrecondition,
            ),
            (
                Error::io("x", std::io::Error::from_raw_os_error(libc_enospc())),
                Code::ResourceExhausted,
            ),
            (
                Error::io("x", std::io::Error::other("boom")),
                Code::Internal,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(to_status(e).code(), code);
        }
    }

    fn libc_enospc() -> i32 {
        28
    }
}
