//! Errors of the controllers and the local mode, with [`Error::kind`] deciding whether a retry
//! can help.

/// Whether an error is worth retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object's contents are wrong: retrying the same object cannot succeed.
    Invalid,
    /// The API server, the network or local I/O failed: retry with back-off.
    Transient,
}

/// A controller or local-mode failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The custom resource cannot be acted on as written.
    #[error("{0}")]
    InvalidSpec(String),
    /// A DataVolume's claim cannot be completed yet (CDI's ErrClaimNotValid: no StorageClass or
    /// StorageProfile gives the access modes); it may once the cluster changes.
    #[error("{0}")]
    ClaimNotValid(String),
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Loading the kubeconfig or in-cluster configuration failed.
    #[error("no Kubernetes configuration (set KUBECONFIG or run in a pod): {0}")]
    Config(String),
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// Reading or writing local state failed.
    #[error("{context}: {cause}")]
    Io {
        /// What was being done.
        context: String,
        /// Cause, part of the message (no `source()`: it shows whole in conditions).
        cause: std::io::Error,
    },
    /// YAML that cannot be read as the expected object.
    #[error("{context}: {message}")]
    Yaml {
        /// What was being read.
        context: String,
        /// Parser message.
        message: String,
    },
    /// Making or reading a key or certificate failed (the cert controller, upload-server TLS).
    #[error("certificate: {0}")]
    Certificate(String),
    /// This replica stopped leading (leader election): it must stop reconciling.
    #[error("lost the leader election Lease {lease}: {why}")]
    LeaseLost {
        /// The Lease.
        lease: String,
        /// What happened.
        why: String,
    },
    /// The provisioner refused or failed (local mode).
    #[error(transparent)]
    Provisioner(#[from] provisioner::Error),
    /// A DataImportCron's source could not be polled (a `golden::poll::PollError`, boxed so
    /// this crate's error does not name the golden-image controllers').
    #[error(transparent)]
    Poll(Box<dyn std::error::Error + Send + Sync>),
}

/// The network kit's errors: local I/O stays I/O; a bad certificate, key or address is the
/// process's configuration.
impl From<netkit::Error> for Error {
    fn from(e: netkit::Error) -> Self {
        match e {
            netkit::Error::InvalidInput(m) => Error::Config(m),
            netkit::Error::Io { context, cause } => Error::Io { context, cause },
        }
    }
}

impl Error {
    /// Retryable or not.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidSpec(_) | Error::Yaml { .. } | Error::Config(_) => ErrorKind::Invalid,
            Error::Kube(_)
            | Error::Finalizer(_)
            | Error::Io { .. }
            | Error::Certificate(_)
            | Error::ClaimNotValid(_)
            | Error::LeaseLost { .. }
            | Error::Poll(_) => ErrorKind::Transient,
            Error::Provisioner(e) => match e.kind() {
                provisioner::ErrorKind::Aborted | provisioner::ErrorKind::Internal => {
                    ErrorKind::Transient
                }
                _ => ErrorKind::Invalid,
            },
        }
    }

    /// Whether the API server gave no answer (refused, reset, timed out), as opposed to an
    /// answer refusing the request.
    pub fn unreachable(&self) -> bool {
        matches!(
            self,
            Error::Kube(kube::Error::HyperError(_) | kube::Error::Service(_))
        )
    }

    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, cause: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            cause,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidSpec(message.into())
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
