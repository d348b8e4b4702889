//! The importer's request for a DataVolume's source: what the importer pod's arguments say,
//! built in-process, for local mode and the DataImportCron's polls.

use std::path::{Path, PathBuf};

use importer::cli::ArgsError;
use importer::import::ImportRequest;
use importer::source::SourceSpec;

use super::pvc::Claim;
use super::source::{ImportKind, ImportSource, header};
use kubekit::error::{Error, Result};

fn object_dir(refs_dir: Option<&Path>, what: &str, obj: &str) -> Result<PathBuf> {
    let dir = refs_dir.ok_or_else(|| {
        Error::invalid(format!(
            "the source references {what} {obj:?}: give --secrets-dir DIR with DIR/{obj}/KEY files"
        ))
    })?;
    let d = dir.join(obj);
    if !d.is_dir() {
        return Err(Error::invalid(format!(
            "{what} {obj:?}: {} is not a directory",
            d.display()
        )));
    }
    Ok(d)
}

fn read_key(dir: &Path, key: &str) -> Result<String> {
    let p = dir.join(key);
    std::fs::read_to_string(&p)
        .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
        .map_err(|e| Error::io(format!("reading {}", p.display()), e))
}

/// The import request for a source, with the Secrets and ConfigMaps it references read from
/// `refs_dir` (`<dir>/<name>/<key>`, as Kubernetes mounts them).
pub fn import_request(
    src: &ImportSource,
    target: PathBuf,
    claim: &Claim,
    preallocate: bool,
    refs_dir: Option<&Path>,
    insecure_registries: &[String],
) -> Result<ImportRequest> {
    let mut args = src.import_args(target, claim, insecure_registries);
    // The target is always a file here, whatever the volume mode.
    args.filesystem_overhead = Some(claim.overhead);
    args.preallocate = preallocate && !src.archive;
    if let Some(secret) = &src.secret_ref {
        let dir = object_dir(refs_dir, "Secret", secret)?;
        match src.kind {
            ImportKind::S3 => args.s3_credentials = Some(dir),
            ImportKind::Http | ImportKind::Registry => {
                args.user = Some(read_key(&dir, "accessKeyId")?);
                args.password_file = Some(dir.join("secretKey"));
            }
        }
    }
    for secret in &src.secret_extra_headers {
        let dir = object_dir(refs_dir, "Secret", secret)?;
        for file in files(&dir)? {
            let key = file.file_name().unwrap_or_default().to_string_lossy();
            let line = read_key(&dir, &key)?;
            header(&line)?;
            args.headers.push(line);
        }
    }
    if let Some(cm) = &src.cert_config_map {
        args.ca_certs = files(&object_dir(refs_dir, "ConfigMap", cm)?)?;
    }
    let mut req = args.to_request().map_err(|e| match e {
        ArgsError::PasswordFile { path, source } => {
            Error::io(format!("reading {}", path.display()), source)
        }
        e => Error::invalid(format!("source {}: {}", src.url, netkit::error::chain(&e))),
    })?;
    // As in the importer pod, an S3 source without a Secret is read unsigned: the AWS_*
    // variables of this process are not the DataVolume's.
    if let SourceSpec::S3 { options, .. } = &mut req.source
        && src.secret_ref.is_none()
    {
        options.credentials = None;
    }
    Ok(req)
}

/// The files of a mounted Secret or ConfigMap directory (dot-files, Kubernetes' own, skipped).
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let listing = |e| Error::io(format!("listing {}", dir.display()), e);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        if entry.path().is_file() && !entry.file_name().to_string_lossy().starts_with('.') {
            files.push(entry.path());
        }
    }
    Ok(files)
}
