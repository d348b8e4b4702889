//! Storage pool configuration, HPP style: a JSON list of `{name, path, ...}` given inline or as
//! `@file`. Unknown fields are ignored so HPP's own pool documents are accepted as they are.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How a pool enforces volume sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaMode {
    /// Project quotas if the pool filesystem has them enabled, else btrfs qgroups if the pool is
    /// on btrfs with quotas enabled, otherwise none.
    #[default]
    Auto,
    /// Project quotas are required: the pool fails to open without them.
    Project,
    /// Btrfs qgroups: each volume a subvolume with a qgroup limit (quotas are enabled on the
    /// filesystem if they are off); the pool fails to open on other filesystems.
    Btrfs,
    /// Sizes are recorded but not enforced on filesystem volumes.
    None,
}

/// One storage pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolConfig {
    /// Pool name, selected by the StorageClass parameter `storagePool`.
    pub name: String,
    /// Directory holding the pool's volumes (one directory per volume).
    pub path: PathBuf,
    /// Size enforcement mode.
    #[serde(default)]
    pub quota: QuotaMode,
    /// The path is a mount point another pod makes (HPP's mounter of a `pvcTemplate` pool): the
    /// pool opens once it is mounted, and is used only while it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mounted: bool,
}

/// Parses a pool list from JSON text, or from a file when the argument starts with `@`.
pub fn parse_pools(arg: &str) -> Result<Vec<PoolConfig>> {
    let text = match arg.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| Error::Config(format!("cannot read pool file {file}: {e}")))?,
        None => arg.to_string(),
    };
    let pools: Vec<PoolConfig> = serde_json::from_str(&text)
        .map_err(|e| Error::Config(format!("pools must be a JSON list of {{name, path}}: {e}")))?;
    validate(&pools)?;
    Ok(pools)
}

/// Checks names and paths: at least one pool, unique non-empty names, absolute distinct paths.
pub fn validate(pools: &[PoolConfig]) -> Result<()> {
    if pools.is_empty() {
        return Err(Error::Config(
            "at least one storage pool is required".into(),
        ));
    }
    for (i, p) in pools.iter().enumerate() {
        if p.name.is_empty() {
            return Err(Error::Config(format!("pool #{i} has an empty name")));
        }
        if !p.path.is_absolute() {
            return Err(Error::Config(format!(
                "pool {} path {} is not absolute",
                p.name,
                p.path.display()
            )));
        }
        for q in &pools[..i] {
            if q.name == p.name {
                return Err(Error::Config(format!("pool name {} is used twice", p.name)));
            }
            if q.path == p.path {
                return Err(Error::Config(format!(
                    "pools {} and {} share the path {}",
                    q.name,
                    p.name,
                    p.path.display()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hpp_style_json_with_extra_fields() {
        let p = parse_pools(
            r#"[{"name":"fast","path":"/var/fast","pvcTemplate":{}},{"name":"slow","path":"/s","quota":"none"}]"#,
        )
        .unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].quota, QuotaMode::Auto);
        assert_eq!(p[1].quota, QuotaMode::None);
    }

    #[test]
    fn parses_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pools.json");
        std::fs::write(&f, r#"[{"name":"a","path":"/a","quota":"project"}]"#).unwrap();
        let p = parse_pools(&format!("@{}", f.display())).unwrap();
        assert_eq!(p[0].quota, QuotaMode::Project);
    }

    #[test]
    fn rejects_bad_lists() {
        for bad in [
            "[]",
            "{}",
            r#"[{"name":"","path":"/a"}]"#,
            r#"[{"name":"a","path":"rel"}]"#,
            r#"[{"name":"a","path":"/a"},{"name":"a","path":"/b"}]"#,
            r#"[{"name":"a","path":"/a"},{"name":"b","path":"/a"}]"#,
            r#"[{"name":"a","path":"/a","quota":"xfs"}]"#,
        ] {
            assert!(parse_pools(bad).is_err(), "{bad} should be refused");
        }
    }
}
