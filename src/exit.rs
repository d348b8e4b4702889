//! How a command's failure ends the process: one exit code and one `--json` form per error type,
//! printed by [`fail`] the same way for every subcommand.
//!
//! Exit codes are a contract: `quarry import`'s kinds (10-15 terminal, 20-21 retryable, see
//! [`importer::ErrorKind::exit_code`]) are read back by the DataVolume controller from the
//! importer pod; `quarry launch` exits 2 for a bad spec; everything else exits 1.

use std::process::ExitCode;

/// A command error: its exit code and, for `--json`, its kind.
pub trait CommandError {
    /// The error itself, for its message and causes.
    fn error(&self) -> &(dyn std::error::Error + 'static);

    /// The process exit code.
    fn exit_code(&self) -> u8 {
        1
    }

    /// The kind's stable name and whether retrying may help, for the JSON error line; `None`
    /// prints both as null.
    fn json_kind(&self) -> Option<(&'static str, bool)> {
        None
    }
}

impl CommandError for importer::Error {
    fn error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }

    fn exit_code(&self) -> u8 {
        importer::Error::kind(self).exit_code() as u8
    }

    fn json_kind(&self) -> Option<(&'static str, bool)> {
        let kind = importer::Error::kind(self);
        Some((kind.as_str(), kind.is_retryable()))
    }
}

/// The uploader's subcommands exit 1 whatever failed; `--json` says what.
impl CommandError for uploader::Error {
    fn error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }

    fn json_kind(&self) -> Option<(&'static str, bool)> {
        let kind = uploader::Error::kind(self);
        Some((kind.as_str(), kind.is_retryable()))
    }
}

impl CommandError for launcher::cli::LaunchFailure {
    fn error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }

    fn exit_code(&self) -> u8 {
        launcher::cli::LaunchFailure::exit_code(self)
    }
}

/// Errors of commands that exit 1 whatever failed, and print no JSON.
macro_rules! exits_1 {
    ($($error:ty),*) => {
        $(impl CommandError for $error {
            fn error(&self) -> &(dyn std::error::Error + 'static) {
                self
            }
        })*
    };
}

exits_1!(launcher::Error, kubekit::Error, csi::Error, std::io::Error);

/// `quarry import`'s own option errors exit 1 without a kind; the import's errors keep theirs.
impl CommandError for importer::cli::ArgsError {
    fn error(&self) -> &(dyn std::error::Error + 'static) {
        self
    }

    fn exit_code(&self) -> u8 {
        match self {
            importer::cli::ArgsError::Import(err) => err.exit_code(),
            _ => 1,
        }
    }

    fn json_kind(&self) -> Option<(&'static str, bool)> {
        match self {
            importer::cli::ArgsError::Import(err) => err.json_kind(),
            _ => None,
        }
    }
}

/// Any other error exits 1 without a kind, unless it wraps an import error, which keeps its own.
impl CommandError for anyhow::Error {
    fn error(&self) -> &(dyn std::error::Error + 'static) {
        self.as_ref()
    }

    fn exit_code(&self) -> u8 {
        self.downcast_ref::<importer::Error>()
            .map_or(1, CommandError::exit_code)
    }

    fn json_kind(&self) -> Option<(&'static str, bool)> {
        self.downcast_ref::<importer::Error>()
            .and_then(CommandError::json_kind)
    }
}

/// The command's exit code: its own on success, its error's after [`fail`] otherwise.
pub fn exit<E: CommandError>(result: Result<ExitCode, E>, json: bool) -> ExitCode {
    result.unwrap_or_else(|err| fail(&err, json))
}

/// Prints a command's error on stderr (the message and each cause once), and with `json` as one
/// line `{"error", "kind", "retryable"}` on stdout; returns its exit code.
pub fn fail(err: &dyn CommandError, json: bool) -> ExitCode {
    let chain = importer::error::chain(err.error());
    if json {
        let kind = err.json_kind();
        let line = serde_json::json!({
            "error": chain,
            "kind": kind.map(|(name, _)| name),
            "retryable": kind.map(|(_, retryable)| retryable),
        });
        println!("{line}");
    }
    eprintln!("error: {chain}");
    ExitCode::from(err.exit_code())
}

/// A command that ends when it is done: exit 0, or its error's code.
pub fn done<E: CommandError>(result: Result<(), E>) -> ExitCode {
    exit(result.map(|()| ExitCode::SUCCESS), false)
}

/// A command that ends with a report: with `json`, one JSON line on stdout; else its one-line
/// `summary` on stderr.
pub fn report<R, E>(result: Result<R, E>, json: bool, summary: fn(&R) -> String) -> ExitCode
where
    R: serde::Serialize,
    E: CommandError,
{
    let result = result.map(|report| {
        if json {
            let line = serde_json::to_string(&report).expect("report serialises");
            println!("{line}");
        } else {
            eprintln!("{}", summary(&report));
        }
        ExitCode::SUCCESS
    });
    exit(result, json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_error_keeps_its_code_and_kind_through_anyhow() {
        let err = anyhow::Error::from(importer::Error::Corrupt("bad L2".into()));
        assert_eq!(err.exit_code(), 12);
        assert_eq!(err.json_kind(), Some(("corrupt-image", false)));
        let option = anyhow::anyhow!("--user does not apply to S3 sources");
        assert_eq!((option.exit_code(), option.json_kind()), (1, None));
    }

    #[test]
    fn import_argument_errors_exit_1_and_import_errors_keep_their_code_and_kind() {
        use importer::cli::{ArgsError, ImportArgs};
        let err = ArgsError::from(importer::Error::Corrupt("bad L2".into()));
        assert_eq!(
            (err.exit_code(), err.json_kind()),
            (12, Some(("corrupt-image", false)))
        );
        let mut args = ImportArgs::new("s3://bucket/disk.img", "disk.img");
        args.user = Some("alice".into());
        let option = args.to_request().unwrap_err();
        assert!(matches!(option, ArgsError::Options(_)), "{option}");
        assert_eq!((option.exit_code(), option.json_kind()), (1, None));
        args.password_file = Some("/nonexistent/password".into());
        let read = args.to_request().unwrap_err();
        assert_eq!((read.exit_code(), read.json_kind()), (1, None));
        assert!(
            importer::error::chain(&read)
                .starts_with("reading the password file /nonexistent/password: "),
            "{read}"
        );
    }

    #[test]
    fn uploader_errors_exit_1_and_say_their_kind() {
        let err = uploader::Error::Import(importer::Error::SourceUnavailable("cut".into()));
        assert_eq!(err.exit_code(), 1);
        assert_eq!(err.json_kind(), Some(("source-unavailable", true)));
    }

    #[test]
    fn launch_exits_2_for_a_spec_error_found_before_or_at_boot() {
        let spec = launcher::cli::LaunchFailure::Spec(launcher::Error::InvalidSpec("x".into()));
        let host = launcher::cli::LaunchFailure::Vm {
            code: "InvalidSpec",
            message: "disk missing".into(),
        };
        let failed = launcher::cli::LaunchFailure::Vm {
            code: "GuestPanicked",
            message: "panic".into(),
        };
        let launcher = launcher::cli::LaunchFailure::Launcher(launcher::Error::Qemu("gone".into()));
        let codes: Vec<u8> = [spec, host, failed, launcher]
            .iter()
            .map(CommandError::exit_code)
            .collect();
        assert_eq!(codes, [2, 2, 1, 1]);
    }
}
