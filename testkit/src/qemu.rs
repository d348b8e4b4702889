//! qemu-img / qemu-io helpers: making test images and the reference raw conversion.
//!
//! qemu-img is the reference converter: every format reader's output must equal
//! `qemu-img convert -O raw` byte for byte. These helpers panic with the command's output when a
//! command fails, since a test cannot go on without its images.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `cmd`, panics with its stderr/stdout unless it exits 0, and returns its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (is qemu-utils installed?)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `qemu-img ARGS...`, checked; returns stdout.
pub fn qemu_img<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    run(Command::new("qemu-img").args(args))
}

/// Asserts that the raw disk `raw` holds what qemu reads from `image` (of `format`), with
/// `qemu-img compare` (which reads only where either has data; a size mismatch fails it unless
/// the extra part is zero).
pub fn assert_same_as_qemu(raw: &Path, image: &Path, format: &str) {
    run(Command::new("qemu-img")
        .args(["compare", "-q", "-f", "raw", "-F", format])
        .arg(raw)
        .arg(image));
}

/// `qemu-io -f FORMAT -c CMD... IMAGE`, checked (qemu-io exits 0 even when a command fails, so
/// its output is checked for errors too); returns stdout.
pub fn qemu_io(format: &str, image: &Path, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", format]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = run(c.arg(image));
    let lower = out.to_lowercase();
    assert!(
        !lower.contains("error") && !lower.contains("failed"),
        "qemu-io {cmds:?} on {}: {out}",
        image.display()
    );
    out
}

/// The reference conversion: `qemu-img convert -O raw SRC DST`.
pub fn convert_to_raw(src: &Path, dst: &Path) {
    qemu_img(&[
        "convert".as_ref(),
        "-O".as_ref(),
        "raw".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ]);
}

/// The reference guest disk of `image`: `qemu-img convert -O raw` into `dir/reference.raw`,
/// read back.
pub fn reference_raw(image: &Path, dir: &Path) -> Vec<u8> {
    let raw = dir.join("reference.raw");
    convert_to_raw(image, &raw);
    std::fs::read(&raw).unwrap_or_else(|e| panic!("reading {}: {e}", raw.display()))
}

/// Panics, naming `what` and the first differing byte, unless `got` equals qemu-img's `expected`.
pub fn assert_same(what: &str, got: &[u8], expected: &[u8]) {
    if let Some(at) = first_difference(got, expected) {
        panic!(
            "{what}: differs from qemu-img at byte {at} (got {} bytes, expected {})",
            got.len(),
            expected.len()
        );
    }
}

/// The image's virtual size as qemu-img reports it.
pub fn virtual_size(image: &Path) -> u64 {
    let json = qemu_img(&["info".as_ref(), "--output=json".as_ref(), image.as_os_str()]);
    // The top-level object's field (protocol layers nested under "children" have their own).
    let key = "\n    \"virtual-size\":";
    let at = json
        .find(key)
        .unwrap_or_else(|| panic!("no virtual-size in {json}"));
    json[at + key.len()..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("bad virtual-size in {json}"))
}

/// One image made by `testdata/make-images.sh`.
#[derive(Debug, Clone)]
pub struct TestImage {
    pub path: PathBuf,
    /// "convert" (must equal qemu-img's conversion) or "unsupported" (must be refused).
    pub expect: String,
    /// What the image covers.
    pub what: String,
}

/// The workspace's `testdata/` directory.
pub fn testdata_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata")
}

/// Runs `testdata/make-images.sh DIR` and returns the images it lists.
pub fn make_images(dir: &Path) -> Vec<TestImage> {
    let script = testdata_dir().join("make-images.sh");
    let out = run(Command::new("bash").arg(&script).arg(dir));
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut it = l.splitn(3, ' ');
            let name = it.next().expect("file name");
            TestImage {
                path: dir.join(name),
                expect: it.next().unwrap_or_else(|| panic!("bad line {l:?}")).into(),
                what: it.next().unwrap_or("").into(),
            }
        })
        .collect()
}

/// The first offset where two byte slices differ (a length difference counts at the shorter
/// length), or None when equal.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_difference_finds_content_and_length_differences() {
        assert_eq!(first_difference(b"abc", b"abc"), None);
        assert_eq!(first_difference(b"abc", b"abd"), Some(2));
        assert_eq!(first_difference(b"abc", b"ab"), Some(2));
    }
}
