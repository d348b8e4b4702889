//! Garbage collection of a DataImportCron's imports, as CDI orders it: the imports (PVCs
//! labelled with the cron's name) sorted by their last-use annotation, newest first; the first
//! `importsToKeep` stay, the rest go, oldest first. The import the DataSource points at and the
//! one in progress are never deleted.

use k8s_openapi::jiff::Timestamp;

use api::golden::GarbageCollect;

/// The annotation CDI stamps on an import when the cron (re)uses it, RFC 3339.
pub const LAST_USE_ANNOTATION: &str = "cdi.kubevirt.io/storage.import.lastUseTime";

/// One import of the cron, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import<'a> {
    /// The PVC's (and DataVolume's) name.
    pub name: &'a str,
    /// Its [`LAST_USE_ANNOTATION`], if set and readable.
    pub last_use: Option<Timestamp>,
}

impl<'a> Import<'a> {
    /// An import with its annotation as written (unreadable counts as never used).
    pub fn new(name: &'a str, last_use: Option<&str>) -> Self {
        Import {
            name,
            last_use: last_use.and_then(|t| t.parse().ok()),
        }
    }
}

/// The imports to delete, oldest first. `protected` are the names never deleted (the
/// DataSource's current PVC, the import in progress).
pub fn to_delete<'a>(
    imports: &[Import<'a>],
    keep: usize,
    policy: GarbageCollect,
    protected: &[&str],
) -> Vec<&'a str> {
    if policy == GarbageCollect::Never || imports.len() <= keep {
        return Vec::new();
    }
    let mut sorted: Vec<&Import<'a>> = imports.iter().collect();
    // Newest first; never-used last; ties by name so the order is stable.
    sorted.sort_by(|a, b| b.last_use.cmp(&a.last_use).then(a.name.cmp(b.name)));
    let mut out: Vec<&'a str> = sorted[keep..]
        .iter()
        .map(|i| i.name)
        .filter(|n| !protected.contains(n))
        .collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn imports() -> Vec<Import<'static>> {
        vec![
            Import::new("f-3", Some("2024-05-03T00:00:00Z")),
            Import::new("f-1", Some("2024-05-01T00:00:00Z")),
            Import::new("f-5", Some("2024-05-05T00:00:00.5Z")),
            Import::new("f-2", Some("2024-05-02T00:00:00Z")),
            Import::new("f-4", Some("2024-05-04T00:00:00Z")),
        ]
    }

    #[test]
    fn the_oldest_beyond_imports_to_keep_go_oldest_first() {
        assert_eq!(
            to_delete(&imports(), 3, GarbageCollect::Outdated, &[]),
            ["f-1", "f-2"]
        );
    }

    #[test]
    fn nothing_goes_within_imports_to_keep() {
        assert!(to_delete(&imports(), 5, GarbageCollect::Outdated, &[]).is_empty());
    }

    #[test]
    fn never_keeps_everything() {
        assert!(to_delete(&imports(), 1, GarbageCollect::Never, &[]).is_empty());
    }

    #[test]
    fn the_current_import_is_never_deleted_even_when_oldest() {
        assert_eq!(
            to_delete(&imports(), 2, GarbageCollect::Outdated, &["f-1"]),
            ["f-2", "f-3"]
        );
    }

    #[test]
    fn imports_never_used_count_as_oldest() {
        let mut list = imports();
        list.push(Import::new("f-unlabelled", None));
        list.push(Import::new("f-garbled", Some("yesterday")));
        assert_eq!(
            to_delete(&list, 5, GarbageCollect::Outdated, &[]),
            ["f-unlabelled", "f-garbled"]
        );
    }

    #[test]
    fn zero_to_keep_deletes_all_but_the_protected() {
        assert_eq!(
            to_delete(&imports(), 0, GarbageCollect::Outdated, &["f-5"]),
            ["f-1", "f-2", "f-3", "f-4"]
        );
    }
}
