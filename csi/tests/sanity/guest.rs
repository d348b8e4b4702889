//! The project-quota tests run for real in a guest kernel that has quota support: Debian's
//! cloud kernel (`CONFIG_XFS_QUOTA=y`, `CONFIG_QFMT_V2=m`), booted under qemu TCG from
//! `testkit::guest`. This very test binary, `mkfs.xfs` and `mkfs.ext4` (with their shared
//! libraries) ride in the initramfs; the guest runs the quota tests with [`NO_SKIP_ENV`] set, so
//! a missing piece fails them rather than skipping, and prints their exit status on ttyS0.

use std::path::Path;
use std::time::{Duration, Instant};

use testkit::guest::{Guest, Payload};

use crate::common::*;
use crate::require;

/// The tests the guest runs (libtest names; each must report `ok`).
const GUEST_TESTS: &[&str] = &[
    "xfs::xfs_project_quota_enforces_volume_size",
    "xfs::ext4_project_quota_enforces_volume_size",
    "xfs::project_mode_is_refused_where_project_quotas_only_account",
];

/// Loop devices, XFS (crc32c comes built in) and the quota format of ext4's quota files.
const MODULES: &[&str] = &[
    "drivers/block/loop",
    "lib/libcrc32c",
    "fs/xfs/xfs",
    "fs/quota/quota_tree",
    "fs/quota/quota_v2",
];

/// The boot watchdog: generous (a loaded CI machine), not a timing assertion.
const WATCHDOG: Duration = Duration::from_secs(300);

#[test]
fn project_quotas_are_enforced_in_a_guest_kernel() {
    require!(
        has("qemu-system-x86_64"),
        "qemu-system-x86_64 is missing (scripts/setup.sh installs it)"
    );
    let mkfs = [which("mkfs.xfs"), which("mkfs.ext4")];
    require!(
        mkfs.iter().all(Option::is_some),
        "mkfs.xfs or mkfs.ext4 is missing (scripts/setup.sh installs them)"
    );
    let guest = Guest::get_with(
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("quota-guest"),
        MODULES,
    );
    require!(
        guest.is_some(),
        "the Debian packages for the guest are unavailable (see above)"
    );
    let guest = guest.unwrap();

    let exe = std::env::current_exe().unwrap();
    let mut payload = Payload::default();
    for program in mkfs.iter().flatten().chain([&exe]) {
        payload.program(program).unwrap();
    }
    if Path::new("/etc/mke2fs.conf").exists() {
        payload.host_file(Path::new("/etc/mke2fs.conf")).unwrap();
    }
    // The uptime line tells boot time from test time in the log.
    payload.run(&format!(
        "export PATH=/usr/sbin:/usr/bin:/sbin:/bin {NO_SKIP_ENV}=1 RUST_BACKTRACE=1\n\
         echo \"guest kernel up for $(cut -d' ' -f1 /proc/uptime) s\"\n\
         {} --exact --nocapture --test-threads=1 {}\n",
        exe.display(),
        GUEST_TESTS.join(" ")
    ));
    let dir = tempfile::tempdir().unwrap();
    let initrd = dir.path().join("initrd.cpio");
    payload.initrd(&guest, &initrd).unwrap();

    let started = Instant::now();
    let console = guest
        .boot(&initrd, "run", 512, WATCHDOG)
        .unwrap_or_else(|e| panic!("guest boot failed: {e}"));
    // A figure for the log, not an assertion.
    eprintln!(
        "guest booted, ran {} tests and powered off in {:.1} s",
        GUEST_TESTS.len(),
        started.elapsed().as_secs_f64()
    );
    let status = console
        .lines()
        .find_map(|l| l.trim().strip_prefix("QUARRY-EXIT "))
        .unwrap_or_else(|| panic!("the guest printed no exit status:\n{console}"));
    assert_eq!(status, "0", "the guest's quota tests failed:\n{console}");
    // Every test ran (a renamed one would be filtered out silently) and passed.
    let summary = format!("test result: ok. {} passed; 0 failed", GUEST_TESTS.len());
    assert!(
        console.contains(&summary),
        "not all of {GUEST_TESTS:?} passed in the guest:\n{console}"
    );
    eprintln!("{console}");
}
