//! Pagination for list calls. Lists are sorted by id; a token names the last id returned, so a
//! page boundary survives objects being added or removed between calls.

use crate::error::{Error, Result};

const TOKEN_PREFIX: &str = "after:";

/// One page of results and the token for the next one (empty when done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The entries of this page.
    pub items: Vec<T>,
    /// The token to pass to get the next page; empty when this page is the last.
    pub next_token: String,
}

/// Makes the token that resumes after `id`.
pub fn token_after(id: &str) -> String {
    format!("{TOKEN_PREFIX}{id}")
}

/// Parses a token; an empty token starts from the beginning. Tokens this driver did not issue
/// are refused with [`Error::InvalidToken`] (ABORTED, as CSI asks).
pub fn parse_token(token: &str) -> Result<Option<&str>> {
    if token.is_empty() {
        return Ok(None);
    }
    match token.strip_prefix(TOKEN_PREFIX) {
        Some(id) if !id.is_empty() => Ok(Some(id)),
        _ => Err(Error::InvalidToken(token.to_string())),
    }
}

/// Returns the page of `items` (any order; sorted here by `id`) that follows `token`, with at most
/// `max_entries` entries (0 means no limit).
pub fn paginate<T>(
    mut items: Vec<T>,
    id: impl Fn(&T) -> &str,
    token: &str,
    max_entries: i32,
) -> Result<Page<T>> {
    if max_entries < 0 {
        return Err(Error::InvalidArgument(format!(
            "max_entries must not be negative, got {max_entries}"
        )));
    }
    let after = parse_token(token)?;
    items.sort_by(|a, b| id(a).cmp(id(b)));
    if let Some(after) = after {
        items.retain(|x| id(x) > after);
    }
    let limit = if max_entries == 0 {
        usize::MAX
    } else {
        max_entries as usize
    };
    let more = items.len() > limit;
    items.truncate(limit);
    let next_token = match (more, items.last()) {
        (true, Some(last)) => token_after(id(last)),
        _ => String::new(),
    };
    Ok(Page { items, next_token })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn page(items: &[String], token: &str, max: i32) -> Page<String> {
        paginate(items.to_vec(), |s| s.as_str(), token, max).unwrap()
    }

    #[test]
    fn walks_all_pages_in_order() {
        let all = ids(&["e", "a", "d", "c", "b"]);
        let p1 = page(&all, "", 2);
        assert_eq!(p1.items, ids(&["a", "b"]));
        let p2 = page(&all, &p1.next_token, 2);
        assert_eq!(p2.items, ids(&["c", "d"]));
        let p3 = page(&all, &p2.next_token, 2);
        assert_eq!(p3.items, ids(&["e"]));
        assert!(p3.next_token.is_empty());
    }

    #[test]
    fn zero_means_everything_and_exact_fit_has_no_token() {
        let all = ids(&["a", "b"]);
        assert_eq!(page(&all, "", 0).items.len(), 2);
        assert!(page(&all, "", 2).next_token.is_empty());
    }

    #[test]
    fn survives_additions_and_removals_between_pages() {
        let mut all = ids(&["a", "b", "c", "d"]);
        let p1 = page(&all, "", 2);
        assert_eq!(p1.items, ids(&["a", "b"]));
        // remove the last returned entry and one not yet returned, add one before and one after
        all.retain(|s| s != "b" && s != "c");
        all.push("aa".into());
        all.push("z".into());
        let p2 = page(&all, &p1.next_token, 10);
        assert_eq!(p2.items, ids(&["d", "z"]));
    }

    #[test]
    fn bad_tokens_and_negative_max_are_refused() {
        let all = ids(&["a"]);
        let e = paginate(all.clone(), |s| s.as_str(), "garbage", 1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Aborted);
        let e = paginate(all, |s| s.as_str(), "", -1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
}
