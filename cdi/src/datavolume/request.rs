//! The importer's request for a DataVolume's source, built in-process for local mode and the
//! DataImportCron's polls: what the importer pod's arguments say, with the Secrets and ConfigMap
//! the source names given as data ([`SourceObjects`]) rather than mounted files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use importer::import::ImportRequest;
use importer::source::gcs::ServiceAccountKey;
use importer::source::s3::Credentials;
use netkit::client::CaBundle;

use super::pvc::Claim;
use super::source::{ImportKind, ImportSource};
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
    // A gcs source's Secret holds a service-account key file, the others' a key pair.
    let gcs_key = match (&src.secret_ref, src.kind) {
        (Some(name), ImportKind::Gcs) => Some(gcs_key(objects.secret(name)?, name)?),
        _ => None,
    };
    let credentials = match &src.secret_ref {
        Some(name) if src.kind != ImportKind::Gcs => {
            let data = objects.secret(name)?;
            Some((
                text(data, name, "accessKeyId")?,
                text(data, name, "secretKey")?,
            ))
        }
        _ => None,
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
        .with_gcs_credentials(gcs_key)
        .with_ca_bundles(bundles))
}

/// The service-account key in a Secret's `credentials.json` (CDI's key).
fn gcs_key(data: &ObjectData, name: &str) -> Result<ServiceAccountKey> {
    let json = data.get("credentials.json").ok_or_else(|| {
        Error::invalid(format!("Secret {name:?} has no key \"credentials.json\""))
    })?;
    ServiceAccountKey::from_json(json, &format!("Secret {name:?} key credentials.json"))
        .map_err(|e| Error::invalid(e.to_string()))
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

#[cfg(test)]
mod tests {
    use importer::source::SourceSpec;
    use testkit::gcs::{CLIENT_EMAIL, Grant, TokenEndpoint};

    use super::*;
    use crate::datavolume::pvc::VolumeMode;
    use crate::datavolume::source::ImportKind;

    fn gcs_request(secret: ObjectData) -> Result<ImportRequest> {
        let src = ImportSource {
            url: "https://storage.googleapis.com/images/disk.qcow2".into(),
            kind: ImportKind::Gcs,
            secret_ref: Some("sa-key".into()),
            ..Default::default()
        };
        let claim = Claim {
            spec: Default::default(),
            size: 1 << 30,
            mode: VolumeMode::Filesystem,
            overhead: 0.06,
        };
        let objects = SourceObjects {
            secrets: [("sa-key".to_string(), secret)].into(),
            ..Default::default()
        };
        import_request(&src, "disk.img".into(), &claim, false, &objects, &[])
    }

    /// Local mode reads a gcs source's key from its Secret's `credentials.json`, in memory.
    #[test]
    fn a_gcs_secret_s_key_file_authorises_the_import() {
        let tokens = TokenEndpoint::start(Grant::Verify { expires_in: 3600 });
        let key = tokens.key_json().into_bytes();
        let req = gcs_request([("credentials.json".to_string(), key)].into()).unwrap();
        let SourceSpec::Gcs { options, .. } = &req.source else {
            panic!("{:?}", req.source)
        };
        let creds = options.credentials.as_ref().unwrap();
        assert_eq!(creds.client_email, CLIENT_EMAIL);
        assert_eq!(req.http.basic_auth, None);

        let e = gcs_request([("accessKeyId".to_string(), b"x".to_vec())].into()).unwrap_err();
        assert!(e.to_string().contains("no key \"credentials.json\""), "{e}");
        let e = gcs_request([("credentials.json".to_string(), b"{}".to_vec())].into()).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("client_email is missing") && text.contains("sa-key"),
            "{text}"
        );
    }
}
