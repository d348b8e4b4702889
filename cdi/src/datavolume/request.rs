//! The importer's request for a DataVolume's source, built in-process for local mode and the
//! DataImportCron's polls: what the importer pod's arguments say, with the Secrets and ConfigMap
//! the source names given as data ([`SourceObjects`]) rather than mounted files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use importer::import::ImportRequest;
use importer::source::s3::Credentials;
use netkit::client::CaBundle;

use super::pvc::Claim;
use super::source::ImportSource;
use kubekit::error::{Error, Result};

/// An object's data, key by key.
pub type ObjectData = BTreeMap<String, Vec<u8>>;

/// The Secrets and ConfigMap an import source names, by name: read from the API (the cron's
/// polls) or from a directory laid out as Kubernetes mounts them (local mode's `--secrets-dir`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SourceObjects {
    pub secrets: BTreeMap<String, ObjectData>,
    pub config_maps: BTreeMap<String, ObjectData>,
}

impl SourceObjects {
    /// The objects `src` names, read from `dir/NAME/KEY` files (dot-files, Kubernetes' own,
    /// skipped); None when the source names none.
    pub fn from_dir(src: &ImportSource, dir: Option<&Path>) -> Result<Self> {
        let mut out = SourceObjects::default();
        for name in src.secret_ref.iter().chain(&src.secret_extra_headers) {
            let data = read_dir(dir, "Secret", name)?;
            out.secrets.insert(name.clone(), data);
        }
        if let Some(name) = &src.cert_config_map {
            let data = read_dir(dir, "ConfigMap", name)?;
            out.config_maps.insert(name.clone(), data);
        }
        Ok(out)
    }

    fn secret(&self, name: &str) -> Result<&ObjectData> {
        self.secrets
            .get(name)
            .ok_or_else(|| Error::invalid(format!("the source's Secret {name:?} was not read")))
    }
}

/// A Secret's value as text, its line end dropped (as a mounted file's is read).
fn text(data: &ObjectData, object: &str, key: &str) -> Result<String> {
    let value = data
        .get(key)
        .ok_or_else(|| Error::invalid(format!("Secret {object:?} has no key {key:?}")))?;
    let text = String::from_utf8(value.clone())
        .map_err(|_| Error::invalid(format!("Secret {object:?} key {key:?} is not text")))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

/// The import request for a source, with the credentials, header lines and CA certificates of
/// the objects it names taken from `objects`.
pub fn import_request(
    src: &ImportSource,
    target: PathBuf,
    claim: &Claim,
    preallocate: bool,
    objects: &SourceObjects,
    insecure_registries: &[String],
) -> Result<ImportRequest> {
    let mut args = src.import_args(target, claim, insecure_registries);
    // The target is always a file here, whatever the volume mode.
    args.filesystem_overhead = Some(claim.overhead);
    args.preallocate = preallocate && !src.archive;
    for name in &src.secret_extra_headers {
        for key in objects.secret(name)?.keys() {
            args.headers.push(text(objects.secret(name)?, name, key)?);
        }
    }
    let req = args
        .to_request()
        .map_err(|e| Error::invalid(format!("source {}: {}", src.url, netkit::error::chain(&e))))?;
    let mut bundles = Vec::new();
    if let Some(name) = &src.cert_config_map {
        let data = objects.config_maps.get(name).ok_or_else(|| {
            Error::invalid(format!("the source's ConfigMap {name:?} was not read"))
        })?;
        bundles.extend(data.iter().map(|(key, pem)| CaBundle {
            name: format!("ConfigMap {name} key {key}"),
            pem: pem.clone(),
        }));
    }
    let credentials = match &src.secret_ref {
        Some(name) => {
            let data = objects.secret(name)?;
            Some((
                text(data, name, "accessKeyId")?,
                text(data, name, "secretKey")?,
            ))
        }
        None => None,
    };
    // As in the importer pod, an S3 source without a Secret is read unsigned: the AWS_*
    // variables of this process are not the DataVolume's.
    let s3_keys = credentials.clone().map(|(id, secret)| Credentials {
        access_key_id: id.trim().to_string(),
        secret_access_key: secret.trim().to_string(),
        session_token: None,
    });
    Ok(req
        .with_basic_auth(credentials)
        .with_s3_credentials(s3_keys)
        .with_ca_bundles(bundles))
}

/// The files of `dir/name`, a Secret or ConfigMap as Kubernetes mounts it.
fn read_dir(dir: Option<&Path>, what: &str, name: &str) -> Result<ObjectData> {
    let dir = dir.ok_or_else(|| {
        Error::invalid(format!(
            "the source references {what} {name:?}: give --secrets-dir DIR with DIR/{name}/KEY files"
        ))
    })?;
    let d = dir.join(name);
    if !d.is_dir() {
        return Err(Error::invalid(format!(
            "{what} {name:?}: {} is not a directory",
            d.display()
        )));
    }
    let listing = |e| Error::io(format!("listing {}", d.display()), e);
    let mut data = ObjectData::new();
    for entry in std::fs::read_dir(&d).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        let key = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_file() && !key.starts_with('.') {
            let value = std::fs::read(entry.path())
                .map_err(|e| Error::io(format!("reading {}", entry.path().display()), e))?;
            data.insert(key, value);
        }
    }
    Ok(data)
}
