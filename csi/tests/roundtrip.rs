//! Runs the round-trip benchmark's code path (`examples/roundtrip_bench.rs`) with a handful of
//! round trips, so the benchmark cannot rot. Needs root (bind mounts, loop devices).

#[allow(dead_code)]
#[path = "../examples/roundtrip_bench.rs"]
mod bench;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[tokio::test]
async fn filesystem_round_trips() {
    if !is_root() {
        eprintln!("SKIP: bind mounts need root");
        return;
    }
    let r = bench::run(5, false).await.unwrap();
    assert_eq!(r.round_trips.len(), 5);
    assert!(r.calls.iter().all(|c| c.len() == 5));
    assert!(r.volumes_per_second() > 0.0);
    assert!(r.render().contains("filesystem mode: 5 round trips"));
}

#[tokio::test]
async fn block_round_trips() {
    if !(is_root() && std::path::Path::new("/dev/loop-control").exists()) {
        eprintln!("SKIP: loop devices need root and /dev/loop-control");
        return;
    }
    let r = bench::run(3, true).await.unwrap();
    assert_eq!(r.round_trips.len(), 3);
    assert!(r.render().contains("block mode: 3 round trips"));
}
