#!/usr/bin/env bash
# Sets everything up and runs the main job: builds quarry, makes an example qcow2 disk image
# (compressed with xz, as images are usually published) and imports it into a raw disk.img,
# then checks the result against `qemu-img convert -O raw`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --quiet
quarry=${CARGO_TARGET_DIR:-target}/release/quarry

work=$(mktemp -d /tmp/quarry-example.XXXXXX)
echo "example files in $work"
qemu-img create -q -f qcow2 "$work/example.qcow2" 256M
qemu-io -f qcow2 -c 'write -P 0xab 0 16M' -c 'write -P 0x5a 100M 8M' -c 'write -z 200M 1M' "$work/example.qcow2" >/dev/null
xz -T0 -k "$work/example.qcow2"

"$quarry" import "$work/example.qcow2.xz" "$work/disk.img" --size 1Gi --json
qemu-img convert -O raw "$work/example.qcow2" "$work/reference.raw"
cmp -n "$(stat -c %s "$work/reference.raw")" "$work/disk.img" "$work/reference.raw"
echo "OK: $work/disk.img equals qemu-img's conversion ($(stat -c %s "$work/disk.img") bytes, $(du -k "$work/disk.img" | cut -f1) KiB allocated)"

# The same image as a DataVolume, without a cluster: `quarry apply` creates a volume in a local
# pool, imports into it and records the DataVolume's status; `quarry get dv` shows it.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 "$port" --directory "$work" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
mkdir -p "$work/pool"
cat > "$work/example-dv.yaml" <<YAML
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: example
spec:
  source:
    http:
      url: http://127.0.0.1:$port/example.qcow2.xz
      checksum: sha256:$(sha256sum "$work/example.qcow2.xz" | cut -d' ' -f1)
  storage:
    resources:
      requests:
        storage: 1Gi
YAML
"$quarry" apply -f "$work/example-dv.yaml" --pool "$work/pool" --state-dir "$work/state"
"$quarry" get dv --state-dir "$work/state"
cmp -n "$(stat -c %s "$work/reference.raw")" "$work/pool/default-example/disk.img" "$work/reference.raw"
echo "OK: the DataVolume's disk equals qemu-img's conversion"
