//! End-to-end tests of `quarry import` on local sources: raw and compressed images, stdin, checksums,
//! size checks, preallocation, block devices (loop devices), forced formats and the metrics endpoint.
//! Every output is compared byte for byte with the expected disk.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::*;

#[test]
fn raw_file_is_copied_exactly_and_sparsely() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let target = dir.path().join("disk.img");
    let out = run(&["import", arg(&src), arg(&target), "--json"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
    let report = json(&out);
    assert_eq!(report["virtual_size"], 8 << 20);
    assert_eq!(report["format_chain"], serde_json::json!(["raw"]));
    // The 2.5 MiB of zeroes are holes, not written blocks.
    let allocated = fs::metadata(&target).unwrap().blocks() * 512;
    assert!(allocated <= 6 << 20, "allocated {allocated}");
    no_partial_left(dir.path());
}

#[test]
fn every_compression_is_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    for (name, tool, chain) in [
        ("gz", &["gzip", "-c"][..], "gzip"),
        ("xz", &["xz", "-c", "-T2", "--block-size=1MiB"][..], "xz"),
        ("zst", &["zstd", "-q", "-c"][..], "zstd"),
    ] {
        let compressed = dir.path().join(format!("disk.raw.{name}"));
        compress(tool, &src, &compressed);
        let target = dir.path().join(format!("out-{name}.img"));
        let out = run(&["import", arg(&compressed), arg(&target), "--json"]);
        assert_ok(&out);
        assert_eq!(fs::read(&target).unwrap(), data, "{name}");
        assert_eq!(
            json(&out)["format_chain"],
            serde_json::json!([chain, "raw"]),
            "{name}"
        );
    }
}

#[test]
fn nested_compression_is_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let zst = dir.path().join("disk.raw.zst");
    compress(&["zstd", "-q", "-c"], &src, &zst);
    let gz = dir.path().join("disk.raw.zst.gz");
    compress(&["gzip", "-c"], &zst, &gz);
    let target = dir.path().join("disk.img");
    let out = run(&["import", arg(&gz), arg(&target), "--json"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
    assert_eq!(
        json(&out)["format_chain"],
        serde_json::json!(["gzip", "zstd", "raw"])
    );
}

#[test]
fn concatenated_xz_streams_are_all_imported_and_trailing_garbage_is_refused() {
    // `cat a.xz b.xz` is one valid xz file (xz -d reads every stream): a disk split over two
    // streams must come out whole, not cut at the first stream's end.
    let dir = tempfile::tempdir().unwrap();
    let (_, data) = sample_disk(dir.path());
    let (head, tail) = data.split_at(3 << 20);
    let mut file = Vec::new();
    for (i, part) in [head, tail].into_iter().enumerate() {
        let piece = dir.path().join(format!("part{i}"));
        fs::write(&piece, part).unwrap();
        let xz = dir.path().join(format!("part{i}.xz"));
        compress(&["xz", "-c"], &piece, &xz);
        file.extend(fs::read(&xz).unwrap());
    }
    let joined = dir.path().join("joined.raw.xz");
    fs::write(&joined, &file).unwrap();
    let target = dir.path().join("disk.img");
    let out = run(&["import", arg(&joined), arg(&target), "--json"]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);

    file.extend_from_slice(b"not xz");
    let garbage = dir.path().join("garbage.raw.xz");
    fs::write(&garbage, &file).unwrap();
    let target = dir.path().join("refused.img");
    let out = run(&["import", arg(&garbage), arg(&target)]);
    assert_refused(&out, 12, "not another xz stream", &target);
}

#[test]
fn stdin_is_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let xz = dir.path().join("disk.raw.xz");
    compress(&["xz", "-c", "-T2", "--block-size=1MiB"], &src, &xz);
    let target = dir.path().join("disk.img");
    let out = quarry()
        .args(["import", "-", arg(&target)])
        .stdin(fs::File::open(&xz).unwrap())
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
}

fn sha256_hex(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

#[test]
fn checksum_is_checked_over_the_downloaded_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let gz = dir.path().join("disk.raw.gz");
    compress(&["gzip", "-c"], &src, &gz);
    let target = dir.path().join("disk.img");

    let good = format!("sha256:{}", sha256_hex(&gz));
    let out = run(&[
        "import",
        arg(&gz),
        arg(&target),
        "--checksum",
        &good,
        "--json",
    ]);
    assert_ok(&out);
    assert_eq!(fs::read(&target).unwrap(), data);
    assert_eq!(json(&out)["source_checksum"], good.as_str());

    // The checksum of the decompressed bytes is not the checksum of the download.
    let target2 = dir.path().join("disk2.img");
    let wrong = format!("sha256:{}", sha256_hex(&src));
    let out = run(&[
        "import",
        arg(&gz),
        arg(&target2),
        "--checksum",
        &wrong,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(14), "{out:?}");
    let report = json(&out);
    assert_eq!(report["kind"], "checksum-mismatch");
    assert_eq!(report["retryable"], false);
    assert!(!target2.exists(), "a mismatching import left a target");
    no_partial_left(dir.path());
}

#[test]
fn too_small_fails_before_writing_and_keeps_the_old_target() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = sample_disk(dir.path());
    let target = dir.path().join("disk.img");
    fs::write(&target, b"what the user had").unwrap();
    let out = run(&["import", arg(&src), arg(&target), "--size", "8Mi"]);
    assert_eq!(out.status.code(), Some(13), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 8 MiB minus 6% overhead is 7 MiB usable; the image needs 8 MiB: both sizes are named.
    assert!(
        stderr.contains(&(8u64 << 20).to_string()) && stderr.contains(&(7u64 << 20).to_string()),
        "{stderr}"
    );
    assert_eq!(fs::read(&target).unwrap(), b"what the user had");
    no_partial_left(dir.path());
}

#[test]
fn streamed_raw_of_unknown_size_that_outgrows_the_target_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = sample_disk(dir.path());
    let zst = dir.path().join("disk.raw.zst");
    compress(&["zstd", "-q", "-c"], &src, &zst);
    let target = dir.path().join("disk.img");
    let out = run(&["import", arg(&zst), arg(&target), "--size", "4Mi"]);
    assert_eq!(out.status.code(), Some(13), "{out:?}");
    assert!(!target.exists());
    no_partial_left(dir.path());
}

#[test]
fn requested_size_grows_the_file_to_the_usable_space() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let target = dir.path().join("disk.img");
    let out = run(&[
        "import",
        arg(&src),
        arg(&target),
        "--size",
        "100Mi",
        "--json",
    ]);
    assert_ok(&out);
    // CDI: 100 MiB * 0.94 = 94 MiB usable.
    let content = fs::read(&target).unwrap();
    assert_eq!(content.len(), 94 << 20);
    assert_eq!(&content[..data.len()], &data[..]);
    assert!(content[data.len()..].iter().all(|&b| b == 0));
    assert_eq!(json(&out)["target_size"], 94u64 << 20);
}

#[test]
fn preallocation_allocates_the_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let target = dir.path().join("disk.img");
    assert_ok(&run(&["import", arg(&src), arg(&target), "--preallocate"]));
    assert_eq!(fs::read(&target).unwrap(), data);
    let allocated = fs::metadata(&target).unwrap().blocks() * 512;
    assert!(allocated >= 8 << 20, "allocated {allocated}");
}

#[test]
fn forced_raw_copies_a_qcow2_header_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("looks-like.qcow2");
    let mut data = b"QFI\xfb".to_vec();
    data.resize(64 << 10, 7);
    fs::write(&src, &data).unwrap();
    let target = dir.path().join("disk.img");
    assert_ok(&run(&[
        "import",
        arg(&src),
        arg(&target),
        "--format",
        "raw",
    ]));
    assert_eq!(fs::read(&target).unwrap(), data);
}

#[test]
fn unsupported_formats_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("disk.qed");
    let mut data = b"QED\0".to_vec();
    data.resize(4096, 0);
    fs::write(&src, &data).unwrap();
    let target = dir.path().join("disk.img");
    let out = run(&["import", arg(&src), arg(&target)]);
    assert_eq!(out.status.code(), Some(11), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("qed"));
    assert!(!target.exists());
}

#[test]
fn missing_source_is_invalid_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "import",
        arg(&dir.path().join("nope.img")),
        arg(&dir.path().join("disk.img")),
    ]);
    assert_eq!(out.status.code(), Some(10), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

#[test]
fn metrics_endpoint_reports_progress_while_importing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("disk.img");
    let port = free_port();
    let mut child = quarry()
        .args([
            "import",
            "-",
            arg(&target),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--owner-uid",
            "0f8b1c2d",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&vec![1u8; 4 << 20]).unwrap();
    let body = poll_metrics(port);
    assert!(
        body.contains(r#"kubevirt_cdi_import_progress_total{ownerUID="0f8b1c2d"}"#),
        "{body}"
    );
    drop(stdin);
    assert!(child.wait().unwrap().success());
    assert_eq!(fs::metadata(&target).unwrap().len(), 4 << 20);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn poll_metrics(port: u16) -> String {
    for _ in 0..100 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut body = String::new();
            s.read_to_string(&mut body).unwrap();
            return body;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("metrics endpoint on port {port} never answered");
}

#[test]
fn block_device_target_gets_the_image_and_zeroes_old_data() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let Some(dev) = LoopDevice::new(&dir.path().join("backing"), 16 << 20) else {
        return;
    };
    // Old content everywhere, so skipped zero ranges would show.
    fs::write(&dev.device, vec![0xeeu8; 16 << 20]).unwrap();
    let out = run(&["import", arg(&src), arg(&dev.device), "--json"]);
    assert_ok(&out);
    assert_eq!(read_prefix(&dev.device, data.len()), data);
    // Without --size, a block device offers its whole size (no filesystem overhead).
    let out = run(&["import", arg(&src), arg(&dev.device), "--size", "32Mi"]);
    assert_eq!(out.status.code(), Some(13), "{out:?}");
}

#[test]
fn failed_block_import_leaves_a_zeroed_head() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = sample_disk(dir.path());
    let Some(dev) = LoopDevice::new(&dir.path().join("backing"), 16 << 20) else {
        return;
    };
    fs::write(&dev.device, vec![0xeeu8; 16 << 20]).unwrap();
    let wrong = format!("sha256:{}", "00".repeat(32));
    let out = run(&["import", arg(&src), arg(&dev.device), "--checksum", &wrong]);
    assert_eq!(out.status.code(), Some(14), "{out:?}");
    assert!(
        read_prefix(&dev.device, 1 << 20).iter().all(|&b| b == 0),
        "the head of a failed import must read as zeroes"
    );
}

#[test]
fn no_zero_skips_zeroing_on_a_blank_device() {
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = sample_disk(dir.path());
    let Some(dev) = LoopDevice::new(&dir.path().join("backing"), 16 << 20) else {
        return;
    };
    assert_ok(&run(&["import", arg(&src), arg(&dev.device), "--no-zero"]));
    assert_eq!(read_prefix(&dev.device, data.len()), data);
}
