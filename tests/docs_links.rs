//! Every link in README.md and docs/*.md points somewhere.
//!
//! Markdown links `[text](target)` and reference definitions `[name]: target` are checked, except
//! inside fenced code blocks and inline code, and except `http://`, `https://` and `mailto:`
//! targets (the network is not the suite's to check). A file target must exist, resolved
//! against the linking file's directory (a leading `/` against the repository root). An anchor,
//! `#heading` in the same file or `file.md#heading`, must be the slug of a heading of that file,
//! made as GitHub makes it: the heading's text lowercased, punctuation other than `-` and `_`
//! dropped, each space a `-`, and `-1`, `-2`, ... added to repeats. Anchors into files other than
//! Markdown (`src/main.rs#L10`) are not checked.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

#[test]
fn readme_and_docs_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("reading docs/")
        .map(|entry| entry.expect("reading docs/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    let mut files = vec![root.join("README.md")];
    files.extend(docs);
    let broken = check(root, &files);
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn a_broken_link_is_reported_with_its_file_and_line() {
    let dir = scratch_dir("broken");
    fs::create_dir_all(dir.join("docs")).unwrap();
    fs::write(
        dir.join("README.md"),
        "# Quarry\n\n## The two commands\n\nSee [the import](docs/import.md#sources), \
         [missing](docs/nowhere.md)\nand [a bad anchor](#the-three-commands) or \
         [a good one](#the-two-commands).\n",
    )
    .unwrap();
    fs::write(
        dir.join("docs/import.md"),
        "# Import\n\n## Sources\n\nBack [home](../README.md#quarry), [away](../README.md#nope).\n",
    )
    .unwrap();
    let files = [dir.join("README.md"), dir.join("docs/import.md")];
    let broken = check(&dir, &files);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        broken,
        [
            "README.md:5: [missing](docs/nowhere.md): no file docs/nowhere.md",
            "README.md:6: [a bad anchor](#the-three-commands): README.md has no heading \
             #the-three-commands",
            "docs/import.md:5: [away](../README.md#nope): README.md has no heading #nope",
        ]
    );
}

#[test]
fn code_and_web_links_are_not_checked() {
    let dir = scratch_dir("code");
    let text = "# Title\n\n```sh\n# not a heading [x](fenced.md)\n```\n\n\
                Inline `[x](inline.md)` and ``[y](`double`.md)``, a span\n`over [z](two.md)\nlines`, \
                [web](https://example.org/x.md), [mail](mailto:a@b.c), \
                [rs](README.md#L10-is-fine-in-md-only) [src](docs.rs#L10).\n";
    fs::write(dir.join("README.md"), text).unwrap();
    fs::write(dir.join("docs.rs"), "").unwrap();
    let broken = check(&dir, &[dir.join("README.md")]);
    fs::remove_dir_all(&dir).unwrap();
    // Only the anchor into a Markdown file is checked; the fenced `#` line is no heading.
    assert_eq!(
        broken,
        [
            "README.md:9: [rs](README.md#L10-is-fine-in-md-only): README.md has no heading \
          #L10-is-fine-in-md-only"
        ]
    );
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("`quarry import SOURCE TARGET`"),
        "quarry-import-source-target"
    );
    assert_eq!(
        slug("Registry sources (`docker://`)"),
        "registry-sources-docker"
    );
    assert_eq!(
        slug("CDI's configuration objects"),
        "cdis-configuration-objects"
    );
    assert_eq!(
        slug("Host-assisted clones: `quarry clone-source` and `quarry resize-disk`"),
        "host-assisted-clones-quarry-clone-source-and-quarry-resize-disk"
    );
    assert_eq!(slug("See [the docs](x.md) now"), "see-the-docs-now");
    assert_eq!(slug("a_b  c"), "a_b--c");
    assert_eq!(
        heading_slugs("# A\n## A\nB\n---\n### A\n"),
        ["a", "a-1", "b", "a-2"]
    );
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quarry-docs-links-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Checks the links of `files`; returns one `FILE:LINE: [text](target): why` per broken link,
/// FILE relative to `root`.
fn check(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut slugs: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut broken = Vec::new();
    let shown = |path: &Path| {
        path.strip_prefix(root)
            .unwrap_or(path)
            .display()
            .to_string()
    };
    for file in files {
        let text = fs::read_to_string(file)
            .unwrap_or_else(|err| panic!("reading {}: {err}", file.display()));
        for link in links(&mask_inline_code(&mask_fences(&text))) {
            let target = link.target.as_str();
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target, None),
            };
            let path = percent_decode(path.split('?').next().unwrap_or_default());
            let resolved = if path.is_empty() {
                file.clone()
            } else if let Some(from_root) = path.strip_prefix('/') {
                root.join(from_root)
            } else {
                file.parent().unwrap_or(root).join(&path)
            };
            let why = if target.is_empty() {
                Some("empty target".to_string())
            } else if !resolved.exists() {
                Some(format!("no file {}", shown(&normalise(&resolved))))
            } else if let Some(anchor) =
                anchor.filter(|_| resolved.extension().is_some_and(|e| e == "md"))
            {
                let known = slugs.entry(resolved.clone()).or_insert_with(|| {
                    heading_slugs(&fs::read_to_string(&resolved).unwrap_or_default())
                });
                (!known.iter().any(|s| s == anchor))
                    .then(|| format!("{} has no heading #{anchor}", shown(&normalise(&resolved))))
            } else {
                None
            };
            if let Some(why) = why {
                broken.push(format!(
                    "{}:{}: [{}]({}): {why}",
                    shown(file),
                    link.line,
                    link.text,
                    link.target
                ));
            }
        }
    }
    broken
}

/// `a/b/../c` as `a/c`, so messages name the file meant.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A fence's character and length when `line` opens or closes a fenced code block.
fn fence(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    let mark = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = trimmed.chars().take_while(|c| *c == mark).count();
    (len >= 3).then_some((mark, len))
}

/// `text` with every line of a fenced code block (fences included) blanked: newlines are kept,
/// every other byte becomes a space, so offsets and line numbers stay those of the file.
fn mask_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut open: Option<(char, usize)> = None;
    for line in text.split_inclusive('\n') {
        let blank = match (open, fence(line)) {
            (None, Some(opened)) => {
                open = Some(opened);
                true
            }
            (Some((mark, len)), Some((m, l)))
                if m == mark && l >= len && line.trim().chars().all(|c| c == mark) =>
            {
                open = None;
                true
            }
            (open, _) => open.is_some(),
        };
        if blank {
            // One space per byte, so multi-byte characters keep their length too.
            out.extend(line.bytes().map(|b| if b == b'\n' { '\n' } else { ' ' }));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Blanks inline code spans (a run of backticks up to the next run of the same length, within a
/// paragraph), backticks included, keeping newlines.
fn mask_inline_code(text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|b| **b == b'`').count();
        let mut j = i + run;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'\n' && blank_line_after(&bytes, j) {
                break;
            }
            if bytes[j] == b'`' {
                let len = bytes[j..].iter().take_while(|b| **b == b'`').count();
                if len == run {
                    close = Some(j + len);
                    break;
                }
                j += len;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                for b in &mut bytes[i..end] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = end;
            }
            None => i += run,
        }
    }
    String::from_utf8(bytes).expect("only whole characters are blanked")
}

/// Whether the line after the newline at `newline` is blank (a paragraph ends there).
fn blank_line_after(bytes: &[u8], newline: usize) -> bool {
    bytes[newline + 1..]
        .iter()
        .take_while(|b| **b != b'\n')
        .all(|b| b.is_ascii_whitespace())
}

struct Link {
    line: usize,
    text: String,
    target: String,
}

/// The links of `masked` (code already blanked): inline `[text](target "title")` and reference
/// definitions `[name]: target` at the start of a line.
fn links(masked: &str) -> Vec<Link> {
    let bytes = masked.as_bytes();
    let line_of = |at: usize| 1 + bytes[..at].iter().filter(|b| **b == b'\n').count();
    let mut opens: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => {
                i += 2;
                continue;
            }
            b'\n' if blank_line_after(bytes, i) => opens.clear(),
            b'[' => opens.push(i),
            b']' => {
                if let Some(start) = opens.pop() {
                    let text = masked[start + 1..i]
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ");
                    if bytes.get(i + 1) == Some(&b'(') {
                        if let Some((target, end)) = destination(masked, i + 2) {
                            out.push(Link {
                                line: line_of(i + 2),
                                text,
                                target,
                            });
                            i = end;
                            continue;
                        }
                    } else if bytes.get(i + 1) == Some(&b':')
                        && masked[..start]
                            .rsplit('\n')
                            .next()
                            .is_some_and(|before| before.trim().is_empty())
                    {
                        let rest = masked[i + 2..].split('\n').next().unwrap_or_default();
                        if let Some(target) = rest.split_whitespace().next() {
                            out.push(Link {
                                line: line_of(i),
                                text,
                                target: target.trim_matches(['<', '>']).to_string(),
                            });
                        }
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The destination of an inline link whose `(` ends just before `from`, and the offset after
/// its `)`; `None` when no `)` closes it on the same line.
fn destination(masked: &str, from: usize) -> Option<(String, usize)> {
    let rest = &masked[from..];
    let line = rest.split('\n').next().unwrap_or_default();
    let trimmed = line.trim_start();
    let skipped = line.len() - trimmed.len();
    if let Some(angled) = trimmed.strip_prefix('<') {
        let end = angled.find('>')?;
        let close = angled[end..].find(')')?;
        return Some((
            angled[..end].to_string(),
            from + skipped + 1 + end + close + 1,
        ));
    }
    let mut depth = 0usize;
    for (at, c) in trimmed.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                return Some((trimmed[..at].to_string(), from + skipped + at + 1));
            }
            ')' => depth -= 1,
            c if c.is_whitespace() => {
                // A title follows: the link ends at the next `)`.
                let close = trimmed[at..].find(')')?;
                return Some((trimmed[..at].to_string(), from + skipped + at + close + 1));
            }
            _ => {}
        }
    }
    None
}

/// The anchors GitHub makes for the headings of `text` (ATX `#` headings and setext underlined
/// ones, outside fenced code), repeats numbered `-1`, `-2`, ...
fn heading_slugs(text: &str) -> Vec<String> {
    let masked = mask_fences(text);
    let lines: Vec<&str> = masked.lines().collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let heading = if line.len() - trimmed.len() <= 3 && trimmed.starts_with('#') {
            let level = trimmed.chars().take_while(|c| *c == '#').count();
            let rest = &trimmed[level..];
            (level <= 6 && (rest.is_empty() || rest.starts_with([' ', '\t'])))
                .then(|| rest.trim().trim_end_matches('#').trim_end())
        } else {
            let underline = lines.get(n + 1).map(|l| l.trim()).unwrap_or_default();
            let setext = !underline.is_empty()
                && (underline.chars().all(|c| c == '=') || underline.chars().all(|c| c == '-'));
            (setext
                && !trimmed.is_empty()
                && !trimmed.starts_with(['|', '-', '*', '>'])
                && !trimmed.chars().all(|c| c == '=' || c == '-'))
            .then(|| line.trim())
        };
        if let Some(heading) = heading {
            let base = slug(heading);
            let count = seen.entry(base.clone()).or_insert(0);
            out.push(if *count == 0 {
                base
            } else {
                format!("{base}-{count}")
            });
            *count += 1;
        }
    }
    out
}

/// GitHub's anchor for a heading: link targets dropped (`[text](url)` counts as `text`), then
/// letters, digits, `-` and `_` kept (lowercased), spaces made `-`, everything else dropped.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        let Some(close) = rest[at..].find(')') else {
            break;
        };
        text.push_str(&rest[..at]);
        rest = &rest[at + close + 1..];
    }
    text.push_str(rest);
    text.chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}
