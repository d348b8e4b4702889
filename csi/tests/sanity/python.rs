//! The driver with a second gRPC implementation: a Python grpcio client whose stubs are made at
//! test time (grpcio-tools) from the driver's own proto. grpcio sends its own `:authority` over
//! unix sockets (not `localhost`, as Go clients do); every call must still be served.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use crate::require;

fn python_grpc() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .map_err(|e| format!("python3 cannot run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "python grpc is unavailable (scripts/setup.sh installs grpcio and grpcio-tools): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_client_calls_every_service() {
    let usable = python_grpc();
    require!(usable.is_ok(), usable.unwrap_err());
    let s = Server::start().await;
    let _c = Cleanup(s.dir.path().to_path_buf());
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let stubs = s.dir.path().join("stubs");
    std::fs::create_dir(&stubs).unwrap();
    let out = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&proto)
        .arg(format!("--python_out={}", stubs.display()))
        .arg(format!("--grpc_python_out={}", stubs.display()))
        .arg(proto.join("csi.proto"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "grpc_tools.protoc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/client.py");
    let (sock, work) = (s.sock.clone(), s.dir.path().to_path_buf());
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(client)
            .arg(&stubs)
            .arg(&sock)
            .arg(&work)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(got["driver"], csi::DRIVER_NAME);
    assert_eq!(got["ready"], true);
    assert_eq!(got["created"], serde_json::json!(["py-vol", MIB]));
    assert_eq!(got["listed"], serde_json::json!(["py-vol"]));
    assert_eq!(got["node_id"], NODE);
    assert!(got["controller_capabilities"].as_u64().unwrap() >= 5);
    assert!(got["node_capabilities"].as_u64().unwrap() >= 3);
    assert_eq!(got["deleted"], true);
    if is_root() {
        assert_eq!(got["published"], true);
        assert_eq!(
            std::fs::read(s.pool_path(0).join("py-vol/hello")).ok(),
            None,
            "deleted with the volume"
        );
    }
    assert!(s.prov.find_volume("py-vol").unwrap().is_none());
}
