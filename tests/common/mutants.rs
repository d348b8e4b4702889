//! A seeded mutation campaign against qemu-img: images made by qemu-img (and other writers'
//! layouts) with a header field or table entry set to a boundary or nearby value, a bit flipped
//! or the file cut short, each imported by `quarry import` (from the file, or on standard input)
//! under a time limit. The rule for every mutant: no panic and no hang; a failure exits as a
//! refusal or corruption (11-13) and leaves nothing in the target's directory; exit 0 leaves the
//! target alone and its bytes are `qemu-img convert -O raw`'s. Where qemu-img refuses a mutant
//! quarry imports, the bytes are right only when the change is to a field that holds no guest
//! data ([`Field::inert`]), or to a structure the format keeps a second copy of, which quarry
//! reads instead ([`Campaign::redundant`]), and equal the unmutated image's; anything else fails
//! the test. One
//! difference is let through and counted: a mutant read as a raw disk (its magic cut off or
//! changed) whose length is not a whole number of sectors is the file's bytes to quarry, and
//! those bytes and zeroes to the next sector to qemu-img.
//!
//! Every mutant is drawn from its own generator seeded by (seed, base, number), so a failure names
//! `SEED=... MUTANTS=...` and the mutant, which is also saved to the temporary directory.
//! `SEED=S` and `MUTANTS=N` (per base image) explore further than the suite's fixed run.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{arg, quarry, run_within};
use testkit::qemu::first_difference;

/// The suite's seed when `SEED` is not set.
pub const DEFAULT_SEED: u64 = 0x5eed_0033;

/// How long one import or one qemu-img conversion of a small mutant may take.
const LIMIT: Duration = Duration::from_secs(20);

/// A small seeded generator (xorshift64*): the same mutants on every run.
pub struct Rng(u64);

impl Rng {
    /// The generator of one mutant: its stream depends on nothing but these three numbers.
    pub fn for_mutant(seed: u64, base: usize, n: u64) -> Rng {
        // splitmix64 of the three, so neighbouring mutants do not start alike; never zero.
        let mut z = seed ^ (base as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n.rotate_left(32);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A field of an image's structures, to set to other values.
#[derive(Clone, Debug)]
pub struct Field {
    pub name: String,
    pub at: usize,
    /// 1, 2, 4 or 8 bytes.
    pub width: usize,
    pub big_endian: bool,
    /// The format gives it no part in the guest's bytes (a refcount, a snapshot table, a
    /// timestamp): where qemu-img refuses a change to it, quarry may import the unchanged disk.
    pub inert: bool,
}

impl Field {
    pub fn le(name: impl Into<String>, at: usize, width: usize) -> Field {
        Field {
            name: name.into(),
            at,
            width,
            big_endian: false,
            inert: false,
        }
    }

    pub fn be(name: impl Into<String>, at: usize, width: usize) -> Field {
        Field {
            big_endian: true,
            ..Field::le(name, at, width)
        }
    }

    /// The same field, holding no guest data.
    pub fn inert(self) -> Field {
        Field {
            inert: true,
            ..self
        }
    }

    pub fn read(&self, b: &[u8]) -> u64 {
        let mut v = [0u8; 8];
        let bytes = &b[self.at..self.at + self.width];
        if self.big_endian {
            v[8 - self.width..].copy_from_slice(bytes);
            u64::from_be_bytes(v)
        } else {
            v[..self.width].copy_from_slice(bytes);
            u64::from_le_bytes(v)
        }
    }

    pub fn write(&self, b: &mut [u8], value: u64) {
        let out = &mut b[self.at..self.at + self.width];
        if self.big_endian {
            out.copy_from_slice(&value.to_be_bytes()[8 - self.width..]);
        } else {
            out.copy_from_slice(&value.to_le_bytes()[..self.width]);
        }
    }

    fn mask(&self) -> u64 {
        u64::MAX >> (64 - 8 * self.width)
    }
}

/// The fields `list` names, each (name, offset from `at`, width) in this byte order, named
/// `prefix` then their name.
pub fn fields(
    big_endian: bool,
    prefix: &str,
    at: usize,
    list: &[(&str, usize, usize)],
) -> Vec<Field> {
    list.iter()
        .map(|&(name, off, width)| Field {
            name: format!("{prefix}{name}"),
            at: at + off,
            width,
            big_endian,
            inert: false,
        })
        .collect()
}

/// `count` fields of `width` bytes from `at`, named `NAME[i]` (a table's entries).
pub fn table(
    name: &str,
    at: usize,
    count: usize,
    width: usize,
    big_endian: bool,
) -> impl Iterator<Item = Field> {
    let name = name.to_string();
    (0..count).map(move |i| Field {
        name: format!("{name}[{i}]"),
        at: at + i * width,
        width,
        big_endian,
        inert: false,
    })
}

/// An image to mutate.
pub struct Base {
    pub name: String,
    pub bytes: Vec<u8>,
    pub fields: Vec<Field>,
    /// quarry's `--format` and qemu-img's `-f` (a fixed vhd is raw to both probes); `None`:
    /// both probe.
    pub format: Option<&'static str>,
}

impl Base {
    /// `bytes`, named `name`, its fields found by `fields`; both tools probe its format.
    pub fn new(
        name: impl Into<String>,
        bytes: Vec<u8>,
        fields: impl Fn(&[u8]) -> Vec<Field>,
    ) -> Base {
        Base {
            name: name.into(),
            fields: fields(&bytes),
            bytes,
            format: None,
        }
    }

    /// The image at `path`, named by its file name.
    pub fn read(path: &Path, fields: impl Fn(&[u8]) -> Vec<Field>) -> Base {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        Base::new(name, fs::read(path).unwrap(), fields)
    }
}

/// What was done to a base image.
pub enum Change {
    Field { field: Field, old: u64, new: u64 },
    Flip { at: usize, bit: u8 },
    Cut { len: usize },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Field { field, old, new } => write!(
                f,
                "{} (at {:#x}, {} bytes) {old:#x} -> {new:#x}",
                field.name, field.at, field.width
            ),
            Change::Flip { at, bit } => write!(f, "bit {bit} of byte {at:#x} flipped"),
            Change::Cut { len } => write!(f, "cut to {len} bytes"),
        }
    }
}

/// One mutant of `base`: a field set to another value (6 in 10), a bit flipped (2 in 10: anywhere,
/// or near a field) or the image cut short (2 in 10: anywhere, at a field, or in its last KiB).
/// After a field change or a flip, `reseal` fixes the image's checksums 3 times in 4, so most
/// mutants reach what the checksums guard.
pub fn mutate(base: &Base, rng: &mut Rng, reseal: &dyn Fn(&mut [u8])) -> (Vec<u8>, Change) {
    let mut b = base.bytes.clone();
    let change = match rng.below(10) {
        0..=5 if !base.fields.is_empty() => {
            let field = base.fields[rng.below(base.fields.len())].clone();
            let old = field.read(&b);
            let mask = field.mask();
            let new = match rng.below(11) {
                0 => old.wrapping_add(1),
                1 => old.wrapping_sub(1 + rng.below(128) as u64),
                2 => old.wrapping_add(rng.below(1 << 17) as u64),
                3 => 0,
                4 => mask,
                5 => 1 << (8 * field.width - 1),
                6 => old ^ 1 << rng.below(8 * field.width),
                7 => 1 << rng.below(8 * field.width),
                8 => old.wrapping_mul(2),
                9 => b.len() as u64 >> (9 * rng.below(2)), // the file's length in bytes, sectors
                _ => rng.next(),
            } & mask;
            field.write(&mut b, new);
            Change::Field { field, old, new }
        }
        0..=7 => {
            // Anywhere, or within 64 bytes of a field (in what is mostly metadata).
            let at = match rng.below(2) {
                0 if !base.fields.is_empty() => {
                    let near = base.fields[rng.below(base.fields.len())].at;
                    (near + rng.below(128)).saturating_sub(64).min(b.len() - 1)
                }
                _ => rng.below(b.len()),
            };
            let bit = rng.below(8) as u8;
            b[at] ^= 1 << bit;
            Change::Flip { at, bit }
        }
        _ => {
            let len = match rng.below(4) {
                0 if !base.fields.is_empty() => base.fields[rng.below(base.fields.len())].at,
                1 => b.len().saturating_sub(1 + rng.below(1024)),
                _ => rng.below(b.len()),
            };
            b.truncate(len);
            return (b, Change::Cut { len });
        }
    };
    if rng.below(4) != 0 {
        reseal(&mut b);
    }
    (b, change)
}

/// A campaign: the bases of one format and what is done to their mutants.
pub struct Campaign<'a> {
    /// The mutant's file extension (quarry reads some names), and its name in messages.
    pub ext: &'a str,
    pub bases: Vec<Base>,
    /// Fixes an image's checksums after a change (the format's own), or does nothing.
    pub reseal: &'a dyn Fn(&mut [u8]),
    /// Mutants per base when `MUTANTS` is not set.
    pub mutants: u64,
    /// Byte ranges of structures the format keeps a second copy of elsewhere, with why quarry
    /// may read that copy where qemu-img refuses a damaged first one (a change confined to one
    /// of them that imports the unmutated disk is right: the intact copy describes it).
    pub redundant: &'a [(std::ops::Range<usize>, &'a str)],
}

/// A format without checksums to fix.
fn no_reseal(_: &mut [u8]) {}

impl<'a> Campaign<'a> {
    /// The bases of the format of extension `ext`, 100 mutants each, no checksums, no copies.
    pub fn new(ext: &'a str, bases: Vec<Base>) -> Campaign<'a> {
        Campaign {
            ext,
            bases,
            reseal: &no_reseal,
            mutants: 100,
            redundant: &[],
        }
    }
}

/// What a campaign's mutants came to.
#[derive(Default, Debug)]
pub struct Tally {
    /// Imported, equal to qemu-img's conversion.
    pub same: u64,
    /// Refused (exit 11-13), nothing left.
    pub refused: u64,
    /// Imported where qemu-img refuses: a change to an inert field, the unchanged disk's bytes.
    pub inert: u64,
    /// Imported where qemu-img refuses: a change to one copy of a redundant structure, the
    /// unchanged disk's bytes.
    pub redundant: u64,
    /// Read as a raw disk of an odd length: qemu-img's bytes up to that length, where qemu-img
    /// adds zeroes to a whole sector.
    pub raw_tail: u64,
    /// Imported, not compared (qemu-img is not installed).
    pub unchecked: u64,
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| {
            let v = v.trim();
            match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => v.parse().ok(),
            }
        })
        .unwrap_or(default)
}

/// Whether qemu-img runs here; says so once when not.
pub fn qemu_img_installed() -> bool {
    let ok = Command::new("qemu-img")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "qemu-img is not installed: the mutants' bytes are not compared with its conversion \
             (panics, hangs, exit codes and leftovers still are)"
        );
    }
    ok
}

/// `qemu-img convert -O raw` of `image` into `raw` (as `format` when given), or why it refused.
fn qemu_raw(image: &Path, format: Option<&str>, raw: &Path) -> Result<(), String> {
    let mut cmd = Command::new("qemu-img");
    cmd.arg("convert");
    if let Some(f) = format {
        cmd.args(["-f", f]);
    }
    cmd.args(["-O", "raw"]).arg(image).arg(raw);
    match run_within(&mut cmd, LIMIT) {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => {
            let _ = fs::remove_file(raw);
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
        Err(_) => {
            let _ = fs::remove_file(raw);
            Err(format!("qemu-img did not finish within {LIMIT:?}"))
        }
    }
}

/// The next offset from `at` where `file` holds data (SEEK_DATA), or None where only a hole
/// follows.
fn next_data(file: &fs::File, at: u64) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on a descriptor this function borrows for the call's length.
    let r = unsafe { libc::lseek(file.as_raw_fd(), at as libc::off_t, libc::SEEK_DATA) };
    (r >= 0).then_some(r as u64)
}

/// The first offset where the files `a` and `b` differ (a length difference counts at the
/// shorter length), or None when they are equal: read a piece at a time, past the holes both
/// have (a mutant may state a disk of gigabytes that holds a few blocks of data).
fn first_file_difference(a: &Path, b: &Path) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let (fa, fb) = (fs::File::open(a).unwrap(), fs::File::open(b).unwrap());
    let (la, lb) = (fa.metadata().unwrap().len(), fb.metadata().unwrap().len());
    let len = la.min(lb);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0;
    while at < len {
        let Some(start) = [next_data(&fa, at), next_data(&fb, at)]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        if start >= len {
            break;
        }
        let n = ((len - start) as usize).min(ba.len());
        fa.read_exact_at(&mut ba[..n], start).unwrap();
        fb.read_exact_at(&mut bb[..n], start).unwrap();
        if let Some(d) = first_difference(&ba[..n], &bb[..n]) {
            return Some(start + d as u64);
        }
        at = start + n as u64;
    }
    (la != lb).then_some(len)
}

/// How one mutant came out.
enum Outcome {
    Same,
    Refused,
    Inert,
    Redundant,
    RawTail,
    Unchecked,
}

/// True when `expected` is `got` with zeroes to the next whole sector (`differs`: where they
/// first differ): qemu reads a file of another length as a raw disk of whole sectors, quarry as
/// the file's own bytes (a mutant cut before its format's magic, or whose magic is changed, is a
/// raw disk to both).
fn sector_padded(got: &Path, expected: &Path, differs: u64) -> bool {
    let len = fs::metadata(got).unwrap().len();
    if len.is_multiple_of(512)
        || differs != len
        || fs::metadata(expected).unwrap().len() != len.next_multiple_of(512)
    {
        return false;
    }
    let tail = fs::read(expected).unwrap();
    tail[len as usize..].iter().all(|&b| b == 0)
}

/// Where one campaign runs its mutants.
struct Bench<'a> {
    path: PathBuf,
    out_dir: PathBuf,
    target: PathBuf,
    raw: PathBuf,
    format: Option<&'a str>,
    redundant: &'a [(std::ops::Range<usize>, &'a str)],
}

impl Bench<'_> {
    /// True when `change` touched only bytes of one of the redundant structures.
    fn within_a_copy(&self, change: &Change) -> bool {
        let touched = match change {
            Change::Field { field, .. } => field.at..field.at + field.width,
            Change::Flip { at, .. } => *at..at + 1,
            Change::Cut { .. } => return false,
        };
        self.redundant
            .iter()
            .any(|(r, _)| r.start <= touched.start && touched.end <= r.end)
    }

    /// Imports the mutant at `path` and checks it against the rule; `original` is qemu-img's
    /// conversion of its base (None: qemu-img is not installed).
    fn check(
        &self,
        stdin: bool,
        change: &Change,
        original: Option<&Path>,
    ) -> Result<Outcome, String> {
        fs::create_dir_all(&self.out_dir).unwrap();
        let mut cmd = quarry();
        cmd.arg("import")
            .arg(if stdin { "-" } else { arg(&self.path) })
            .arg(&self.target);
        if let Some(f) = self.format {
            cmd.args(["--format", f]);
        }
        cmd.stdin(match stdin {
            true => Stdio::from(fs::File::open(&self.path).unwrap()),
            false => Stdio::null(),
        });
        let out = run_within(&mut cmd, LIMIT).map_err(|out| {
            format!(
                "quarry did not finish within {LIMIT:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("panicked") || out.status.code().is_none_or(|c| c == 101) {
            return Err(format!("quarry crashed ({}): {stderr}", out.status));
        }
        let left: Vec<PathBuf> = fs::read_dir(&self.out_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| *p != self.target || !out.status.success())
            .collect();
        for p in &left {
            let _ = fs::remove_file(p);
        }
        if !left.is_empty() {
            return Err(format!("exit {}, left behind: {left:?}", out.status));
        }
        if !out.status.success() {
            let code = out.status.code().unwrap();
            if !(11..=13).contains(&code) {
                return Err(format!(
                    "exit {code}, not a refusal or corruption: {stderr}"
                ));
            }
            return Ok(Outcome::Refused);
        }
        let outcome = self.compare(change, original);
        let _ = fs::remove_file(&self.raw);
        fs::remove_file(&self.target).unwrap();
        outcome
    }

    /// Compares the imported target with qemu-img's conversion of the mutant, or, where qemu-img
    /// refuses it, with `original` (qemu-img's conversion of the base, a file).
    fn compare(&self, change: &Change, original: Option<&Path>) -> Result<Outcome, String> {
        let Some(original) = original else {
            return Ok(Outcome::Unchecked);
        };
        let len = fs::metadata(&self.target).unwrap().len();
        match qemu_raw(&self.path, self.format, &self.raw) {
            Ok(()) => match first_file_difference(&self.target, &self.raw) {
                None => Ok(Outcome::Same),
                Some(at) if sector_padded(&self.target, &self.raw, at) => Ok(Outcome::RawTail),
                Some(at) => Err(format!(
                    "imported (exit 0), differs from qemu-img at byte {at} ({len} bytes, \
                     qemu-img {})",
                    fs::metadata(&self.raw).unwrap().len()
                )),
            },
            Err(why) => {
                let unchanged = first_file_difference(&self.target, original).is_none();
                match change {
                    Change::Field { field, .. } if field.inert && unchanged => Ok(Outcome::Inert),
                    _ if unchanged && self.within_a_copy(change) => Ok(Outcome::Redundant),
                    _ => Err(format!(
                        "imported (exit 0, {len} bytes{}), qemu-img refuses it: {why}",
                        if unchanged {
                            ", the unmutated image's"
                        } else {
                            ""
                        }
                    )),
                }
            }
        }
    }
}

/// Where the mutants, targets and conversions go: memory (/dev/shm) where there is one, since
/// every mutant is a few MiB written three times and read back.
fn work_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::tempdir_in(shm).or_else(|_| tempfile::tempdir()),
        false => tempfile::tempdir(),
    }
    .unwrap()
}

/// Runs the campaign; panics after the last mutant if any broke the rule, naming for each the
/// seed, the base, the mutant's number and change, and where the mutant was saved.
pub fn run(campaign: Campaign) -> Tally {
    let work = work_dir();
    let dir = work.path();
    let seed = env("SEED", DEFAULT_SEED);
    let count = env("MUTANTS", campaign.mutants);
    let qemu = qemu_img_installed();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for (b, base) in campaign.bases.iter().enumerate() {
        let bench = Bench {
            path: dir.join(format!("mutant.{}", campaign.ext)),
            out_dir: dir.join("out"),
            target: dir.join("out").join("disk.img"),
            raw: dir.join("qemu.raw"),
            format: base.format,
            redundant: campaign.redundant,
        };
        let original = dir.join("original.raw");
        let original = qemu.then(|| {
            fs::write(&bench.path, &base.bytes).unwrap();
            qemu_raw(&bench.path, base.format, &original)
                .unwrap_or_else(|e| panic!("{}: qemu-img refuses the base: {e}", base.name));
            original
        });
        for n in 0..count {
            let mut rng = Rng::for_mutant(seed, b, n);
            let (bytes, change) = mutate(base, &mut rng, campaign.reseal);
            let stdin = rng.below(2) == 1;
            fs::write(&bench.path, &bytes).unwrap();
            match bench.check(stdin, &change, original.as_deref()) {
                Ok(Outcome::Same) => tally.same += 1,
                Ok(Outcome::Refused) => tally.refused += 1,
                Ok(Outcome::Inert) => tally.inert += 1,
                Ok(Outcome::Redundant) => tally.redundant += 1,
                Ok(Outcome::RawTail) => tally.raw_tail += 1,
                Ok(Outcome::Unchecked) => tally.unchecked += 1,
                Err(why) => {
                    let saved = std::env::temp_dir()
                        .join(format!("quarry-mutant-{seed:x}-{b}-{n}.{}", campaign.ext));
                    fs::write(&saved, &bytes).unwrap();
                    failures.push(format!(
                        "{} mutant {n} of {} ({change}, {}): {why} (saved as {})",
                        campaign.ext,
                        base.name,
                        if stdin { "on stdin" } else { "from the file" },
                        saved.display()
                    ));
                }
            }
        }
    }
    eprintln!(
        "{} (SEED={seed:#x}, {count} a base): {tally:?}",
        campaign.ext
    );
    assert!(
        failures.is_empty(),
        "SEED={seed:#x} MUTANTS={count}: {} of the mutants broke the rule:\n{}",
        failures.len(),
        failures.join("\n")
    );
    tally
}
