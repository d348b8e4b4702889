//! The text descriptor: a file of its own (monolithicFlat, twoGbMaxExtentSparse/Flat, vmfs) or
//! embedded in a sparse extent. A pure parse of its text, following qemu's
//! `vmdk_open_desc_file` / `vmdk_parse_extents`.
//!
//! Refused: descriptors with a parent (`parentCID` other than `ffffffff`, or a
//! `parentFileNameHint`: ESXi snapshots and deltas), createTypes other than the flat and split
//! ones, extent types other than FLAT, VMFS and SPARSE, and extent files outside the
//! descriptor's directory. `changeTrackPath` (changed block tracking) is ignored: it does not
//! change the disk.

use super::error::VmdkError;

/// createTypes read from a descriptor file (qemu's list, minus the ones with parents).
const LOCAL_CREATE_TYPES: [&str; 4] = [
    "monolithicFlat",
    "vmfs",
    "twoGbMaxExtentFlat",
    "twoGbMaxExtentSparse",
];

/// A parsed descriptor: its `key=value` settings and its extent lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    settings: Vec<(String, String)>,
    extent_lines: Vec<String>,
}

/// How an extent stores its part of the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentKind {
    /// The guest bytes as they are, from `offset` sectors into the file.
    Flat { offset: u64 },
    /// A hosted sparse extent file (`KDMV`).
    Sparse,
}

/// One extent line: `RW SECTORS TYPE "FILE" [OFFSET]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    pub sectors: u64,
    pub kind: ExtentKind,
    pub file: String,
}

impl Descriptor {
    /// Parses descriptor text (up to its first NUL byte). Never fails: what the lines mean is
    /// checked by [`Descriptor::check_parent`] and [`Descriptor::extents`].
    pub fn parse(bytes: &[u8]) -> Descriptor {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text = String::from_utf8_lossy(&bytes[..end]);
        let mut d = Descriptor::default();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let first = line.split_whitespace().next().unwrap_or("");
            if matches!(first, "RW" | "RDONLY" | "NOACCESS") {
                d.extent_lines.push(line.to_string());
            } else if let Some((key, value)) = line.split_once('=') {
                let value = value.trim();
                let value = value
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(value);
                d.settings.push((key.trim().to_string(), value.to_string()));
            }
        }
        d
    }

    /// The value of setting `key` (the first one).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Refuses a disk that depends on a parent disk.
    pub fn check_parent(&self) -> Result<(), VmdkError> {
        if let Some(cid) = self.get("parentCID")
            && !cid.eq_ignore_ascii_case("ffffffff")
        {
            return Err(VmdkError::HasParent(format!("parentCID={cid}")));
        }
        if let Some(hint) = self.get("parentFileNameHint") {
            return Err(VmdkError::HasParent(format!("parentFileNameHint={hint:?}")));
        }
        Ok(())
    }

    /// The createType, checked to be one read from a local descriptor file.
    pub fn create_type(&self) -> Result<&str, VmdkError> {
        let ct = self
            .get("createType")
            .ok_or_else(|| VmdkError::BadDescriptor("no createType".into()))?;
        if LOCAL_CREATE_TYPES.contains(&ct) {
            Ok(ct)
        } else {
            Err(VmdkError::UnsupportedCreateType(ct.to_string()))
        }
    }

    /// The extents, in guest order. Like qemu, lines whose access is not `RW` are skipped.
    pub fn extents(&self) -> Result<Vec<Extent>, VmdkError> {
        let mut out = Vec::new();
        for (index, line) in self.extent_lines.iter().enumerate() {
            let refuse = |why: &str| VmdkError::UnsupportedExtent {
                index,
                line: line.clone(),
                why: why.to_string(),
            };
            let bad = |why: &str| VmdkError::BadDescriptor(format!("extent line {line:?}: {why}"));
            let (head, rest) = line
                .split_once('"')
                .ok_or_else(|| bad("no quoted file name"))?;
            let (file, tail) = rest
                .split_once('"')
                .ok_or_else(|| bad("unterminated file name"))?;
            let words: Vec<&str> = head.split_whitespace().collect();
            let [access, sectors, kind] = words[..] else {
                return Err(bad("expected ACCESS SECTORS TYPE \"FILE\""));
            };
            if access != "RW" {
                continue;
            }
            let sectors: u64 = sectors
                .parse()
                .ok()
                .filter(|&s| s > 0 && s <= (i64::MAX as u64) / 512)
                .ok_or_else(|| bad("bad sector count"))?;
            let offset = match tail.split_whitespace().collect::<Vec<_>>()[..] {
                [] => None,
                // The extent must end inside a file qemu can address.
                [o] => Some(
                    o.parse::<u64>()
                        .ok()
                        .filter(|&o| o <= (i64::MAX as u64) / 512 - sectors)
                        .ok_or_else(|| bad("bad offset"))?,
                ),
                _ => return Err(bad("trailing words")),
            };
            let kind = match (kind, offset) {
                ("FLAT", Some(offset)) => ExtentKind::Flat { offset },
                ("FLAT", None) => return Err(bad("a FLAT extent needs an offset")),
                ("VMFS", None) => ExtentKind::Flat { offset: 0 },
                ("SPARSE", None) => ExtentKind::Sparse,
                ("VMFS" | "SPARSE", Some(_)) => return Err(bad("unexpected offset")),
                ("VMFSSPARSE", _) => {
                    return Err(refuse("ESX 3 sparse (COWD) extents are not supported"));
                }
                ("SESPARSE", _) => {
                    return Err(refuse(
                        "ESXi seSparse extents (snapshots) are not supported",
                    ));
                }
                (other, _) => {
                    return Err(refuse(&format!("extent type {other} is not supported")));
                }
            };
            let path = std::path::Path::new(file);
            if file.is_empty()
                || path.is_absolute()
                || path
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(refuse("the extent file must lie beside the descriptor"));
            }
            out.push(Extent {
                sectors,
                kind,
                file: file.to_string(),
            });
        }
        if out.is_empty() {
            return Err(VmdkError::BadDescriptor("no RW extents".into()));
        }
        Ok(out)
    }
}
