#!/usr/bin/env bash
# Runs Quarry's whole test suite (unit, integration against real peers: qemu-img, nginx, loop
# devices, ...) after installing what it needs. Root is needed for the loop-device and mount tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if cargo nextest --version >/dev/null 2>&1; then
  profile=()
  [ "${CI:-}" = true ] && profile=(--profile ci)
  cargo nextest run --workspace --no-fail-fast "${profile[@]}" "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
