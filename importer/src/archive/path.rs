//! The names an archive asks for, checked before anything is written: entry paths must stay
//! under the extraction root, and symbolic links must point inside the volume however they are
//! followed.
//!
//! Symbolic link targets are held to a rule that is safe without resolving anything: the target
//! is relative, its `..` components all come first, and there are no more of them than the
//! link's directory is deep. Every link then points to a real directory of the tree (parents are
//! real directories: entries are never written through links, and a directory is never replaced)
//! and from there only descends, through names that are themselves checked links or directories,
//! so no chain of links can climb out, in whatever order the archive creates them. A `..` after
//! a name (`a/../b`) is refused: `a` may be a link, and then `..` is not where it looks.

use super::error::{ArchiveError, Result};

/// An entry path as components under the extraction root (empty: the root itself, `./`).
pub type Parts = Vec<Vec<u8>>;

/// The components of an entry path; absolute paths and `..` are refused, `.` and empty
/// components dropped.
pub fn entry_parts(raw: &[u8], shown: &str) -> Result<Parts> {
    if raw.is_empty() {
        return Err(ArchiveError::refused(shown, "the entry has an empty name"));
    }
    if raw.starts_with(b"/") {
        return Err(ArchiveError::refused(
            shown,
            "absolute paths are not extracted (they point out of the volume)",
        ));
    }
    let mut parts = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                return Err(ArchiveError::refused(
                    shown,
                    "a `..` component leaves the extraction directory (path traversal)",
                ));
            }
            p => parts.push(p.to_vec()),
        }
    }
    Ok(parts)
}

/// Checks the target of a symbolic link created at `link` (its components) against the rule in
/// the module docs.
pub fn check_symlink_target(link: &[Vec<u8>], target: &[u8], shown: &str) -> Result<()> {
    let what = || String::from_utf8_lossy(target).into_owned();
    if target.is_empty() {
        return Err(ArchiveError::refused(
            shown,
            "the symbolic link has an empty target",
        ));
    }
    if target.starts_with(b"/") {
        return Err(ArchiveError::refused(
            shown,
            format!(
                "the symbolic link's absolute target {:?} points out of the volume",
                what()
            ),
        ));
    }
    let depth = link.len().saturating_sub(1);
    let mut ups = 0;
    let mut named = false;
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." if named => {
                return Err(ArchiveError::refused(
                    shown,
                    format!(
                        "the symbolic link's target {:?} has `..` after a name (through a link it could climb out of the volume)",
                        what()
                    ),
                ));
            }
            b".." => ups += 1,
            _ => named = true,
        }
    }
    if ups > depth {
        return Err(ArchiveError::refused(
            shown,
            format!(
                "the symbolic link's target {:?} points out of the volume",
                what()
            ),
        ));
    }
    Ok(())
}

/// Display form of entry components (lossy for names that are not UTF-8).
pub fn display(parts: &[Vec<u8>]) -> String {
    parts
        .iter()
        .map(|p| String::from_utf8_lossy(p))
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn parts(s: &str) -> Parts {
        entry_parts(s.as_bytes(), s).unwrap()
    }

    #[test]
    fn entry_paths_are_normalised_and_escapes_refused() {
        assert_eq!(
            parts("./a//b/./c"),
            [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert!(parts("./").is_empty());
        for bad in ["/etc/passwd", "a/../../x", "..", "a/..", ""] {
            let e = entry_parts(bad.as_bytes(), bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{bad}: {e}");
        }
    }

    #[test]
    fn symlink_targets_stay_inside() {
        let ok = [
            ("l", "x"),
            ("l", "./x/y"),
            ("a/l", "../x"),
            ("a/b/l", "../../x/y"),
            ("a/b/l", ".."),
            ("a/l", "b/c"),
        ];
        for (link, target) in ok {
            check_symlink_target(&parts(link), target.as_bytes(), link)
                .unwrap_or_else(|e| panic!("{link} -> {target}: {e}"));
        }
        let bad = [
            ("l", "/etc/passwd"),
            ("l", ".."),
            ("a/l", "../../x"),
            ("a/l", "b/../../x"),
            ("a/l", "b/.."),
            ("l", ""),
        ];
        for (link, target) in bad {
            let e = check_symlink_target(&parts(link), target.as_bytes(), link).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{link} -> {target}: {e}");
        }
    }
}
