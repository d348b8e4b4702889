//! Local-mode storage of DataSources and DataImportCrons (and removal of import DataVolumes):
//! one YAML file per object, `<state dir>/<plural>/<namespace>/<name>.yaml`, the layout of the
//! local DataVolume store, so `quarry get` reads them all the same way.

use std::marker::PhantomData;
use std::path::PathBuf;

use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use kubekit::error::{Error, Result};

/// Objects of kind `K` under a state directory.
#[derive(Debug, Clone)]
pub struct ObjectStore<K> {
    dir: PathBuf,
    kind: PhantomData<K>,
}

impl<K> ObjectStore<K>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    /// The store of `K` in the state directory `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        ObjectStore {
            dir: state_dir.into().join(K::plural(&()).as_ref()),
            kind: PhantomData,
        }
    }

    fn path(&self, ns: &str, name: &str) -> PathBuf {
        self.dir.join(ns).join(format!("{name}.yaml"))
    }

    /// Writes `obj` atomically (a reader never sees half a file).
    pub fn save(&self, obj: &K) -> Result<()> {
        let ns = obj.namespace().unwrap_or_else(|| "default".into());
        let path = self.path(&ns, &obj.name_any());
        let dir = path.parent().expect("a state file has a directory");
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let yaml = |e: String| Error::Yaml {
            context: format!("writing {}", path.display()),
            message: e,
        };
        let v = serde_json::to_value(obj).map_err(|e| yaml(e.to_string()))?;
        let text = serde_saphyr::to_string(&v).map_err(|e| yaml(e.to_string()))?;
        let tmp = path.with_extension("yaml.tmp");
        std::fs::write(&tmp, text)
            .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| Error::io(format!("renaming {}", tmp.display()), e))
    }

    /// Reads one object; None when there is none of that name.
    pub fn get(&self, ns: &str, name: &str) -> Result<Option<K>> {
        let path = self.path(ns, name);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_saphyr::from_str(&text)
                .map(Some)
                .map_err(|e| Error::Yaml {
                    context: path.display().to_string(),
                    message: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// The names of a namespace's objects, sorted.
    pub fn names(&self, ns: &str) -> Result<Vec<String>> {
        let dir = self.dir.join(ns);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".yaml")
                    .map(String::from)
            })
            .collect();
        names.sort();
        Ok(names)
    }

    /// Every object of a namespace, by name.
    pub fn list(&self, ns: &str) -> Result<Vec<K>> {
        let mut out = Vec::new();
        for n in self.names(ns)? {
            out.extend(self.get(ns, &n)?);
        }
        Ok(out)
    }

    /// Removes one object; a missing one counts as removed.
    pub fn delete(&self, ns: &str, name: &str) -> Result<()> {
        let path = self.path(ns, name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
        }
    }
}
