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
