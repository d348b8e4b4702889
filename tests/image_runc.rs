//! The container image of scripts/build-image.sh, built from the test binary: reproducible
//! (a second build gives the same digest and archive bytes), pushable with skopeo, and run for
//! real as root with `runc` from its unpacked layer: `quarry import` as the image's user (107)
//! with no capabilities, no new privileges and a seccomp filter, as the importer pod runs
//! (Pod Security "restricted"); `quarry csi` as root with every capability, as its privileged
//! DaemonSet runs. The container processes' credentials are read from /proc/PID/status.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::nginx::{Nginx, NginxConfig};
use testkit::tls::TestCa;

mod common;
use common::*;

/// The image's non-root user (CDI's importer UID and GID).
const IMAGE_UID: u32 = 107;

/// An image built by the script into a temporary directory.
struct Image {
    dir: tempfile::TempDir,
    /// `sha256:HEX` of the manifest.
    manifest: String,
}

impl Image {
    fn build() -> Image {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-image.sh"))
            .args(["--binary", env!("CARGO_BIN_EXE_quarry"), "--tag", "test"])
            .arg("--out")
            .arg(dir.path())
            .env("SOURCE_DATE_EPOCH", "1700000000")
            // the revision label would otherwise follow the work tree (a commit between two
            // builds is not what this test is about)
            .env("IMAGE_REVISION", "test")
            .output()
            .expect("running scripts/build-image.sh");
        assert!(
            out.status.success(),
            "build-image.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let index = read_json(&dir.path().join("oci/index.json"));
        let manifest = index["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "test"
        );
        Image { dir, manifest }
    }

    fn layout(&self) -> PathBuf {
        self.dir.path().join("oci")
    }

    fn archive(&self) -> PathBuf {
        self.dir.path().join("quarry-oci.tar")
    }

    fn blob(&self, digest: &str) -> PathBuf {
        self.layout()
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    }

    fn manifest(&self) -> Value {
        read_json(&self.blob(&self.manifest))
    }

    /// The image configuration (`config` of the config blob: user, entrypoint, env, labels).
    fn config(&self) -> Value {
        let digest = self.manifest()["config"]["digest"]
            .as_str()
            .unwrap()
            .to_string();
        read_json(&self.blob(&digest))["config"].clone()
    }

    fn layer(&self) -> PathBuf {
        let m = self.manifest();
        assert_eq!(m["layers"].as_array().unwrap().len(), 1, "one layer: {m}");
        self.blob(m["layers"][0]["digest"].as_str().unwrap())
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// `sha256:HEX` of a file.
fn file_digest(path: &Path) -> String {
    testkit::oci::sha256_digest(&fs::read(path).unwrap())
}

/// Paths in a gzip'd tar, in archive order.
fn layer_paths(layer: &Path) -> Vec<String> {
    let out = Command::new("tar").arg("-tzf").arg(layer).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_second_build_gives_the_same_digest_and_the_layer_holds_only_what_the_binaries_need() {
    let a = Image::build();
    let b = Image::build();
    assert_eq!(
        a.manifest, b.manifest,
        "the image digest differs between builds"
    );
    assert_eq!(
        file_digest(&a.archive()),
        file_digest(&b.archive()),
        "the archives differ between builds"
    );
    // every blob the manifest names is in the layout, with its digest
    let m = a.manifest();
    for d in std::iter::once(&m["config"]).chain(m["layers"].as_array().unwrap()) {
        let digest = d["digest"].as_str().unwrap();
        let blob = a.blob(digest);
        assert_eq!(file_digest(&blob), digest);
        assert_eq!(
            fs::metadata(&blob).unwrap().len(),
            d["size"].as_u64().unwrap()
        );
    }

    let config = a.config();
    assert_eq!(config["User"], "107:107");
    assert_eq!(config["Entrypoint"], json!(["/usr/bin/quarry"]));
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.title"], "quarry");
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        labels["org.opencontainers.image.created"],
        "2023-11-14T22:13:20Z"
    );

    // The files: the binary, the build machine's mkfs.xfs, the loader and libraries ldd lists
    // for the two, the account and NSS files, the CA bundle. Nothing else (no shell, no
    // package manager).
    let paths = layer_paths(&a.layer());
    let files: Vec<&str> = paths
        .iter()
        .map(String::as_str)
        .filter(|p| !p.ends_with('/'))
        .collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted, "the layer's entries are in name order");
    let mut expected = vec![
        "etc/group",
        "etc/nsswitch.conf",
        "etc/passwd",
        "etc/ssl/certs/ca-certificates.crt",
        "usr/bin/mkfs.xfs",
        "usr/bin/quarry",
    ];
    let mkfs_xfs = ["/usr/sbin/mkfs.xfs", "/sbin/mkfs.xfs"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("mkfs.xfs (xfsprogs) is installed");
    let mut libs = Vec::new();
    for binary in [env!("CARGO_BIN_EXE_quarry"), mkfs_xfs] {
        let ldd = Command::new("ldd").arg(binary).output().unwrap();
        let ldd = String::from_utf8(ldd.stdout).unwrap();
        let linked: Vec<String> = ldd
            .lines()
            .filter_map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                match words.as_slice() {
                    [_, "=>", path, ..] if path.starts_with('/') => Some(path.to_string()),
                    [path, ..] if path.starts_with('/') => Some(path.to_string()),
                    _ => None,
                }
            })
            .collect();
        assert!(
            linked.iter().any(|l| l.contains("libc.so")),
            "ldd lists libc: {ldd}"
        );
        libs.extend(linked);
    }
    assert!(libs.iter().any(|l| l.contains("libblkid")), "{libs:?}");
    libs.sort();
    libs.dedup();
    expected.extend(libs.iter().map(|l| l.trim_start_matches('/')));
    expected.sort();
    let mut files_sorted = files.clone();
    files_sorted.sort();
    assert_eq!(files_sorted, expected);
}

#[test]
fn skopeo_copies_the_archive_to_a_registry_unchanged() {
    if !testkit::registry::installed() {
        eprintln!("skipping: docker-registry and skopeo are not installed (scripts/setup.sh)");
        return;
    }
    let image = Image::build();
    let registry = testkit::registry::Registry::start(Default::default());
    let dest = format!("127.0.0.1:{}/quarry:test", registry.port());
    let out = Command::new("skopeo")
        .args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}:test", image.archive().display()))
        .arg(format!("docker://{dest}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo copy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the registry holds the manifest under the digest the build printed
    let out = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{dest}"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, fs::read(image.blob(&image.manifest)).unwrap());
}

// ---- runc ----

/// Whether this test can run containers: root and runc installed (else it says why).
fn can_run_containers() -> bool {
    if !nix_is_root() {
        eprintln!("skipping: running containers with runc needs root");
        return false;
    }
    if Command::new("runc").arg("--version").output().is_err() {
        eprintln!("skipping: runc is not installed (Debian package runc; scripts/setup.sh)");
        return false;
    }
    true
}

/// The image built and unpacked into a bundle, and a work directory; `None` (having said why)
/// when this test cannot run containers.
fn bundle_and_workdir() -> Option<(Bundle, tempfile::TempDir)> {
    if !can_run_containers() {
        return None;
    }
    let bundle = Bundle::unpack(&Image::build());
    Some((bundle, tempfile::tempdir().unwrap()))
}

/// An OCI runtime bundle: the image's layer unpacked into `rootfs`, and `config.json`.
struct Bundle {
    dir: tempfile::TempDir,
    config: Value,
}

impl Bundle {
    fn unpack(image: &Image) -> Bundle {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        fs::create_dir(&rootfs).unwrap();
        let st = Command::new("tar")
            .args(["-xzf"])
            .arg(image.layer())
            .arg("-C")
            .arg(&rootfs)
            .args(["--numeric-owner", "--same-permissions"])
            .status()
            .unwrap();
        assert!(st.success(), "unpacking the layer failed");
        Bundle {
            dir,
            config: image.config(),
        }
    }

    /// The image's entrypoint followed by `args`.
    fn command(&self, args: &[&str]) -> Vec<String> {
        let mut cmd: Vec<String> =
            serde_json::from_value(self.config["Entrypoint"].clone()).unwrap();
        cmd.extend(args.iter().map(|a| a.to_string()));
        cmd
    }

    /// The image's default user (`UID:GID`).
    fn user(&self) -> (u32, u32) {
        let user = self.config["User"].as_str().unwrap();
        let (uid, gid) = user.split_once(':').unwrap();
        (uid.parse().unwrap(), gid.parse().unwrap())
    }
}

/// What the container's process runs as.
struct Security {
    uid: u32,
    gid: u32,
    /// Capability names (bounding = effective = permitted).
    caps: Vec<&'static str>,
    no_new_privileges: bool,
    /// Syscalls refused (EPERM) by a seccomp filter, and `clone3` with ENOSYS, like the
    /// container runtimes' default profiles; `None`: no filter.
    seccomp: Option<&'static [&'static str]>,
    /// runc's default masked and read-only /proc and /sys paths (off when privileged).
    masked_paths: bool,
}

/// Syscalls containerd's and Docker's default seccomp profiles (`RuntimeDefault`) refuse to a
/// process without capabilities: mounting, namespaces, kernel modules, keyrings, BPF, tracing.
const RUNTIME_DEFAULT_REFUSED: &[&str] = &[
    "acct",
    "add_key",
    "bpf",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "init_module",
    "kexec_load",
    "keyctl",
    "mount",
    "move_mount",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "swapoff",
    "swapon",
    "umount2",
    "unshare",
    "userfaultfd",
];

/// Linux capability names by number (0..=40), for the privileged container's set.
const CAPS: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// A field of /proc/PID/status (`CapEff`, `Uid`, ...).
fn status_field(pid: i32, field: &str) -> String {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// Privileged: every capability this (root) test process may hand on, i.e. its bounding set.
fn privileged_caps() -> (Vec<&'static str>, u64) {
    let mask = u64::from_str_radix(&status_field(std::process::id() as i32, "CapBnd"), 16).unwrap();
    let caps = CAPS
        .iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1 << bit) != 0)
        .map(|(_, name)| *name)
        .collect();
    (caps, mask & ((1 << CAPS.len()) - 1))
}

/// A privileged container (the CSI driver's and the pool mounters' pods): root with every
/// capability, no seccomp filter, nothing masked; and the mask of those capabilities.
fn privileged() -> (Security, u64) {
    let (caps, mask) = privileged_caps();
    let sec = Security {
        uid: 0,
        gid: 0,
        caps,
        no_new_privileges: false,
        seccomp: None,
        masked_paths: false,
    };
    (sec, mask)
}

/// The image's environment, with info logs.
fn info_logs(bundle: &Bundle) -> Value {
    let mut env = bundle.config["Env"].clone();
    env.as_array_mut().unwrap().push(json!("RUST_LOG=info"));
    env
}

fn bind(src: &Path, dst: &str, read_only: bool) -> Value {
    let mut options = vec!["rbind", "nosuid", "nodev"];
    if read_only {
        options.push("ro");
    }
    json!({"destination": dst, "type": "bind", "source": src, "options": options})
}

/// config.json, after `runc spec`'s defaults, with the host's network namespace (the container
/// reaches the test's servers on 127.0.0.1) and a read-only root filesystem.
fn runtime_spec(args: &[String], env: &Value, sec: &Security, mounts: Vec<Value>) -> Value {
    let caps = &sec.caps;
    let mut spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": sec.uid, "gid": sec.gid},
            "args": args,
            "env": env,
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps,
                "inheritable": [], "ambient": []
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": sec.no_new_privileges,
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "quarry",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "bind", "source": "/sys",
             "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]},
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
        },
    });
    spec["mounts"].as_array_mut().unwrap().extend(mounts);
    if sec.masked_paths {
        spec["linux"]["maskedPaths"] = json!([
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/sys/firmware",
            "/proc/scsi"
        ]);
        spec["linux"]["readonlyPaths"] = json!([
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger"
        ]);
    }
    if let Some(refused) = sec.seccomp {
        spec["linux"]["seccomp"] = json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [
                {"names": refused, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM},
                // glibc's pthread_create tries clone3 first and falls back to clone on ENOSYS
                {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS},
            ],
        });
    }
    spec
}

/// A container created with `runc create` (stopped just before it executes its process, with
/// its credentials already set), run by `start`. This test process is a child subreaper, so
/// the container's process becomes its child once `runc create` exits: `wait` reaps it and
/// gets its exit status. Deleted (killed first) on drop.
struct Container {
    runc_root: tempfile::TempDir,
    id: String,
    pid: i32,
    stdout: PathBuf,
    stderr: PathBuf,
    exited: bool,
}

impl Container {
    /// `runc create`; `name` is made unique per test process (runc names its cgroups by it).
    fn create(bundle: &Bundle, spec: &Value, name: &str) -> Container {
        let id = &format!("{name}-{}", std::process::id());
        // Become the subreaper of runc's orphans, so the container's init is our child to wait for.
        assert_eq!(
            // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes integers only and changes nothing but
            // which process inherits this one's orphaned descendants.
            unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) },
            0
        );
        fs::write(
            bundle.dir.path().join("config.json"),
            serde_json::to_vec_pretty(spec).unwrap(),
        )
        .unwrap();
        let runc_root = tempfile::tempdir().unwrap();
        let stdout = bundle.dir.path().join("stdout");
        let stderr = bundle.dir.path().join("stderr");
        // The container keeps runc's stdio: files, so nothing waits on a pipe it holds open.
        let out = Command::new("runc")
            .arg("--root")
            .arg(runc_root.path())
            .args(["create", "--bundle"])
            .arg(bundle.dir.path())
            .arg(id)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&stdout).unwrap())
            .stderr(fs::File::create(&stderr).unwrap())
            .status()
            .unwrap();
        assert!(
            out.success(),
            "runc create failed: {}",
            fs::read_to_string(&stderr).unwrap_or_default()
        );
        let mut c = Container {
            runc_root,
            id: id.to_string(),
            pid: 0,
            stdout,
            stderr,
            exited: false,
        };
        let state: Value = serde_json::from_slice(&c.runc(&["state", id]).stdout).unwrap();
        c.pid = state["pid"].as_i64().unwrap() as i32;
        c
    }

    fn runc(&self, args: &[&str]) -> std::process::Output {
        let out = Command::new("runc")
            .arg("--root")
            .arg(self.runc_root.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "runc {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn start(&self) {
        self.runc(&["start", &self.id]);
    }

    /// The exit code, if the process has exited.
    fn try_wait(&mut self) -> Option<i32> {
        let mut status = 0;
        // SAFETY: `status` is a live c_int that waitpid may write; WNOHANG never blocks. `pid`
        // is the container's init, our child through PR_SET_CHILD_SUBREAPER (see create).
        let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        assert!(
            r >= 0,
            "waitpid {}: {}",
            self.pid,
            std::io::Error::last_os_error()
        );
        if r == 0 {
            return None;
        }
        self.exited = true;
        Some(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            128 + libc::WTERMSIG(status)
        })
    }

    /// Waits for the exit code (panics after `limit`: a hung container).
    fn wait(&mut self, limit: Duration) -> i32 {
        let start = Instant::now();
        loop {
            if let Some(code) = self.try_wait() {
                return code;
            }
            assert!(
                start.elapsed() < limit,
                "the container did not exit within {limit:?}: {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `ready` (a server in the container accepts connections); panics if the
    /// process exits first, or after 30 s.
    fn wait_ready(&mut self, what: &str, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ready() {
            if let Some(code) = self.try_wait() {
                panic!("{what} exited with {code}: {}", self.output());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{what} did not listen within 30 s: {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stdout(&self) -> String {
        fs::read_to_string(&self.stdout).unwrap()
    }

    fn output(&self) -> String {
        format!(
            "stdout: {}\nstderr: {}",
            self.stdout(),
            fs::read_to_string(&self.stderr).unwrap()
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if !self.exited {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(self.runc_root.path())
                .args(["kill", &self.id, "KILL"])
                .output();
            // reap it (not asserting anything: this may run while a test panics)
            for _ in 0..400 {
                let mut status = 0;
                // SAFETY: as in try_wait: waitpid writes only the live `status`.
                if unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } != 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        }
        let _ = Command::new("runc")
            .arg("--root")
            .arg(self.runc_root.path())
            .args(["delete", "--force", &self.id])
            .output();
    }
}

/// The restricted importer: the image's user, no capabilities, no new privileges, a seccomp
/// filter (what the importer pod declares).
fn restricted(bundle: &Bundle) -> Security {
    let (uid, gid) = bundle.user();
    Security {
        uid,
        gid,
        caps: vec![],
        no_new_privileges: true,
        seccomp: Some(RUNTIME_DEFAULT_REFUSED),
        masked_paths: true,
    }
}

/// A volume directory the importer pod's user owns (the kubelet's fsGroup does that in a pod).
fn volume_dir(parent: &Path) -> PathBuf {
    let vol = parent.join("volume");
    fs::create_dir(&vol).unwrap();
    std::os::unix::fs::chown(&vol, Some(IMAGE_UID), Some(IMAGE_UID)).unwrap();
    vol
}

/// A device node runc creates in the container, owned by `uid` (what containerd and CRI-O do
/// for a pod's block volume with `device_ownership_from_security_context`).
fn block_device(dev: &Path, path: &str, uid: u32) -> Value {
    let rdev = fs::metadata(dev).unwrap().rdev();
    json!({"path": path, "type": "b", "major": libc::major(rdev), "minor": libc::minor(rdev),
           "fileMode": 0o660, "uid": uid, "gid": uid})
}

/// Creates a container running `quarry ARGS` as the importer and upload pods run (see
/// [`restricted`]), and checks the process's credentials, set before it executes quarry.
fn create_restricted(
    bundle: &Bundle,
    name: &str,
    args: &[&str],
    mounts: Vec<Value>,
    devices: Vec<Value>,
) -> Container {
    let sec = restricted(bundle);
    assert_eq!((sec.uid, sec.gid), (IMAGE_UID, IMAGE_UID));
    let mut spec = runtime_spec(&bundle.command(args), &bundle.config["Env"], &sec, mounts);
    // the device cgroup lets the container use exactly the devices it is given
    spec["linux"]["resources"]["devices"] = devices
        .iter()
        .map(|d| json!({"allow": true, "type": d["type"], "major": d["major"], "minor": d["minor"], "access": "rwm"}))
        .collect();
    spec["linux"]["devices"] = json!(devices);
    let c = Container::create(bundle, &spec, name);
    assert_eq!(status_field(c.pid, "Uid"), "107\t107\t107\t107");
    assert_eq!(status_field(c.pid, "Gid"), "107\t107\t107\t107");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(c.pid, set), "0000000000000000", "{set}");
    }
    assert_eq!(status_field(c.pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(c.pid, "Seccomp"), "2");
    c
}

/// [`create_restricted`], run to its end: the exit code, stdout, and stdout and stderr.
fn run_restricted(
    bundle: &Bundle,
    name: &str,
    args: &[&str],
    mounts: Vec<Value>,
    devices: Vec<Value>,
) -> (i32, String, String) {
    let mut c = create_restricted(bundle, name, args, mounts, devices);
    c.start();
    let code = c.wait(Duration::from_secs(120));
    (code, c.stdout(), c.output())
}

/// nginx serving `disk.qcow2.xz` (qemu-img's qcow2 of the sample disk) and qemu-img's raw
/// conversion of that qcow2.
fn served_qcow2_xz(work: &Path) -> (Nginx, Vec<u8>) {
    let served = work.join("served");
    fs::create_dir(&served).unwrap();
    let (qcow2, expected) = sample_qcow2(work);
    compress(&["xz", "-c", "-T2"], &qcow2, &served.join("disk.qcow2.xz"));
    let server = Nginx::start(NginxConfig {
        root: served,
        ranges: true,
        ..Default::default()
    });
    (server, expected)
}

/// The host's /etc/hosts, mounted read-only as the kubelet mounts the pod's.
fn etc_hosts() -> Value {
    bind(Path::new("/etc/hosts"), "/etc/hosts", true)
}

#[test]
fn the_importer_runs_unprivileged_and_writes_what_qemu_img_gives() {
    let Some((bundle, work)) = bundle_and_workdir() else {
        return;
    };
    let (server, expected) = served_qcow2_xz(work.path());
    let vol = volume_dir(work.path());
    // By name: the image's NSS (`files`, built into libc) resolves it from /etc/hosts.
    let url = server.url_localhost("/disk.qcow2.xz");
    let (code, stdout, output) = run_restricted(
        &bundle,
        "quarry-import",
        &["import", &url, "/data/disk.img", "--json"],
        vec![bind(&vol, "/data", false), etc_hosts()],
        vec![],
    );
    assert_eq!(code, 0, "{output}");
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["format_chain"], json!(["xz", "qcow2"]));

    let disk = vol.join("disk.img");
    assert!(
        fs::read(&disk).unwrap() == expected,
        "the bytes differ from qemu-img convert's"
    );
    let md = fs::metadata(&disk).unwrap();
    assert_eq!(
        (md.uid(), md.gid()),
        (IMAGE_UID, IMAGE_UID),
        "written as the image's user"
    );
    no_partial_left(&vol);
}

#[test]
fn the_importer_writes_a_block_volume_it_owns_without_capabilities() {
    let Some((bundle, work)) = bundle_and_workdir() else {
        return;
    };
    let (server, expected) = served_qcow2_xz(work.path());
    let Some(dev) = LoopDevice::new(&work.path().join("backing"), 16 << 20) else {
        return;
    };
    // the loop device holds stale bytes: the import must write the zeros of the image too
    fs::write(&dev.device, vec![0xa5u8; 16 << 20]).unwrap();
    let (code, _, output) = run_restricted(
        &bundle,
        "quarry-import-block",
        &[
            "import",
            &server.url("/disk.qcow2.xz"),
            "/dev/cdi-block-volume",
        ],
        vec![],
        vec![block_device(
            &dev.device,
            "/dev/cdi-block-volume",
            IMAGE_UID,
        )],
    );
    assert_eq!(code, 0, "{output}");
    assert!(
        read_prefix(&dev.device, expected.len()) == expected,
        "the device's bytes differ from qemu-img convert's"
    );
}

#[test]
fn the_pool_mounter_makes_a_blank_block_pvc_xfs_with_the_images_mkfs_and_mounts_it() {
    let Some((bundle, work)) = bundle_and_workdir() else {
        return;
    };
    // XFS's smallest filesystem
    let Some(dev) = LoopDevice::new(&work.path().join("backing"), 300 << 20) else {
        return;
    };
    let node = work.path().join("node");
    fs::create_dir(&node).unwrap();
    // The mounter's pod (hco's pool_mount): privileged root, the Block PVC at /dev/data, the
    // node's directory of the pool mounted under /node.
    let args = bundle.command(&[
        "pool-mount",
        "--device",
        "/dev/data",
        "--target",
        "/node/pool",
    ]);
    let (sec, _) = privileged();
    let env = info_logs(&bundle);
    let mut spec = runtime_spec(&args, &env, &sec, vec![bind(&node, "/node", false)]);
    spec["linux"]["resources"]["devices"] = json!([{"allow": true, "access": "rwm"}]);
    spec["linux"]["devices"] = json!([block_device(&dev.device, "/dev/data", 0)]);
    let mut c = Container::create(&bundle, &spec, "quarry-pool-mount");
    c.start();

    // the mount is in the container's mount namespace (runc's mounts do not propagate here)
    let pid = c.pid;
    let mounted = || {
        let info = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
        provisioner::sys::mount::parse_mountinfo(&info)
            .into_iter()
            .find(|m| m.mount_point == Path::new("/node/pool"))
    };
    let start = Instant::now();
    let m = loop {
        if let Some(m) = mounted() {
            break m;
        }
        if let Some(code) = c.try_wait() {
            panic!("the mounter exited with {code}: {}", c.output());
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not mounted within a minute: {}",
            c.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(m.fstype, "xfs", "{}", c.output());
    let blkid = Command::new("blkid")
        .args(["-p", "-s", "TYPE", "-o", "value"])
        .arg(&dev.device)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&blkid.stdout).trim(), "xfs");
    // the pool as the container sees it: the new filesystem, writable
    let pool = PathBuf::from(format!("/proc/{}/root/node/pool", c.pid));
    fs::write(pool.join("volume"), b"data").unwrap();
    assert!(
        !node.join("pool/volume").exists(),
        "on the device, not the node's directory"
    );

    c.runc(&["kill", &c.id, "TERM"]);
    let code = c.wait(Duration::from_secs(20));
    assert_eq!(code, 0, "{}", c.output());
    assert!(
        c.output().contains("storage pool unmounted"),
        "{}",
        c.output()
    );
}

#[test]
fn https_imports_trust_the_images_ca_bundle() {
    let Some((bundle, work)) = bundle_and_workdir() else {
        return;
    };
    let served = work.path().join("served");
    fs::create_dir(&served).unwrap();
    let (_, data) = sample_disk(&served);
    let ca = TestCa::new();
    let server = Nginx::start(NginxConfig {
        root: served,
        ranges: true,
        tls: Some(&ca),
        ..Default::default()
    });
    let vol = volume_dir(work.path());
    let url = server.url_localhost("/disk.raw");
    let args = ["import", url.as_str(), "/data/disk.img"];
    let mounts = || vec![bind(&vol, "/data", false), etc_hosts()];
    // Debian's bundle, as built in: the test CA is unknown (exit 15: TLS)
    let (code, _, output) =
        run_restricted(&bundle, "quarry-https-debian-ca", &args, mounts(), vec![]);
    assert_eq!(code, 15, "{output}");
    assert!(!vol.join("disk.img").exists());
    // the test CA in its place: the same import succeeds, with no --ca-cert
    let mut with_test_ca = mounts();
    with_test_ca.push(bind(
        &ca.ca_pem(),
        "/etc/ssl/certs/ca-certificates.crt",
        true,
    ));
    let (code, _, output) =
        run_restricted(&bundle, "quarry-https-test-ca", &args, with_test_ca, vec![]);
    assert_eq!(code, 0, "{output}");
    assert_eq!(fs::read(vol.join("disk.img")).unwrap(), data);
}

#[tokio::test]
async fn the_csi_driver_runs_privileged_and_answers_probe_on_the_mounted_socket() {
    let Some((bundle, work)) = bundle_and_workdir() else {
        return;
    };
    let sockets = work.path().join("csi");
    let pool = work.path().join("pool");
    fs::create_dir(&sockets).unwrap();
    fs::create_dir(&pool).unwrap();
    let pool_path = "/var/hpvolumes/csi";
    let pools = json!([{"name": "local", "path": pool_path, "quota": "none"}]).to_string();
    let args = bundle.command(&[
        "csi",
        "--endpoint",
        "unix:///csi/csi.sock",
        "--node-id",
        "image-node",
        "--pools",
        &pools,
    ]);
    // The DaemonSet's container: privileged.
    let (sec, cap_mask) = privileged();
    let env = info_logs(&bundle);
    let spec = runtime_spec(
        &args,
        &env,
        &sec,
        vec![bind(&sockets, "/csi", false), bind(&pool, pool_path, false)],
    );
    let mut c = Container::create(&bundle, &spec, "quarry-csi");
    c.start();

    let sock = sockets.join("csi.sock");
    c.wait_ready("quarry csi", || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let channel = csi::connect_unix(&sock)
        .await
        .expect("connecting to quarry csi");
    let probe = csi::pb::identity_client::IdentityClient::new(channel)
        .probe(csi::pb::ProbeRequest {})
        .await
        .expect("Probe")
        .into_inner();
    assert_eq!(probe.ready, Some(true));

    // the running driver: quarry itself, as root with every capability
    let exe = fs::read_link(format!("/proc/{}/exe", c.pid)).unwrap();
    assert!(exe.ends_with("usr/bin/quarry"), "{}", exe.display());
    assert_eq!(status_field(c.pid, "Uid"), "0\t0\t0\t0");
    let cap_eff = u64::from_str_radix(&status_field(c.pid, "CapEff"), 16).unwrap();
    assert_eq!(
        cap_eff, cap_mask,
        "CapEff {cap_eff:x}, expected {cap_mask:x}"
    );
    assert_eq!(status_field(c.pid, "NoNewPrivs"), "0");
    assert_eq!(status_field(c.pid, "Seccomp"), "0");

    // SIGTERM: exits 0 and removes its socket
    c.runc(&["kill", &c.id, "TERM"]);
    let code = c.wait(Duration::from_secs(10));
    assert_eq!(code, 0, "{}", c.output());
    assert!(!sock.exists(), "the socket is removed on exit");
}

#[test]
fn the_upload_server_runs_unprivileged_and_writes_an_upload() {
    let Some((bundle, work)) = bundle_and_workdir() else {
        return;
    };
    let (qcow2, expected) = sample_qcow2(work.path());
    let vol = volume_dir(work.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut c = create_restricted(
        &bundle,
        "quarry-upload",
        &[
            "upload-server",
            "--target",
            "/data/disk.img",
            "--listen",
            &listen,
        ],
        vec![bind(&vol, "/data", false)],
        vec![],
    );
    c.start();
    c.wait_ready("quarry upload-server", || {
        std::net::TcpStream::connect(&listen).is_ok()
    });
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "-X", "POST", "-H", "Expect:"])
        .args(["-H", "Content-Type: application/octet-stream", "-T"])
        .arg(&qcow2)
        .arg(format!("http://{listen}/v1beta1/upload"))
        .output()
        .expect("running curl");
    assert!(
        out.status.success(),
        "upload failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // the upload pod completes after a successful upload
    assert_eq!(c.wait(Duration::from_secs(60)), 0, "{}", c.output());
    let disk = vol.join("disk.img");
    assert!(
        fs::read(&disk).unwrap() == expected,
        "the bytes differ from qemu-img convert's"
    );
    assert_eq!(fs::metadata(&disk).unwrap().uid(), IMAGE_UID);
}
