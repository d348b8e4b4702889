#!/usr/bin/env bash
# Builds Quarry's container image without a Docker daemon, reproducibly: the same binary and
# source commit give the same image digest.
#
#   scripts/build-image.sh [--binary PATH] [--tag TAG] [--out DIR]
#
# --binary  the quarry executable to ship (default: `cargo build --release`, target/release/quarry)
# --tag     the reference name in the layout's index.json (default: the crate version)
# --out     output directory (default: target/image); it receives
#             DIR/oci/             an OCI image layout (skopeo: oci:DIR/oci:TAG)
#             DIR/quarry-oci.tar   the same layout as one archive (skopeo: oci-archive:FILE:TAG)
#
# One layer on an empty base: /usr/bin/quarry; /usr/bin/mkfs.xfs, the build machine's (xfsprogs),
# which `quarry pool-mount` runs on a blank Block PVC, as HPP's mounter does; exactly the shared
# libraries the two link (found with ldd: the dynamic loader, libc, libm, libgcc_s, libblkid,
# libuuid, ...; glibc 2.36's `files` and `dns` NSS modules are inside libc.so.6), /etc/passwd and /etc/group with the non-root user quarry (UID/GID 107,
# CDI's importer user), /etc/nsswitch.conf, Debian's CA bundle and an empty /tmp. The
# entrypoint is /usr/bin/quarry: the component is chosen by the arguments. The default user is
# 107:107; the CSI driver's pod runs as root (see README, "Container image").
#
# Determinism: files are staged with fixed modes, archived by GNU tar in name order with mtime
# SOURCE_DATE_EPOCH (default: the commit time of HEAD) and owner 0:0, compressed with `gzip -n`;
# the JSON documents are written by jq with sorted keys. Needs: GNU tar, gzip, jq, sha256sum, ldd,
# strip (binutils), mkfs.xfs (xfsprogs; MKFS_XFS=PATH names another).
set -euo pipefail
export LC_ALL=C # the glob and sort orders below

die() { echo "build-image: $*" >&2; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
binary="" tag="" out="$root/target/image"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
for tool in tar gzip jq sha256sum ldd strip; do
  command -v "$tool" >/dev/null || die "$tool is required (scripts/setup.sh installs it)"
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -1)
[ -n "$version" ] || die "no version in $root/Cargo.toml"
tag=${tag:-$version}
if [ -z "$binary" ]; then
  (cd "$root" && cargo build --release --locked --bin quarry)
  binary="${CARGO_TARGET_DIR:-$root/target}/release/quarry"
fi
[ -x "$binary" ] || die "$binary is not an executable"
# root's PATH has /usr/sbin, a user's may not
mkfs_xfs=${MKFS_XFS:-$(PATH="$PATH:/usr/sbin:/sbin" command -v mkfs.xfs || true)}
[ -n "$mkfs_xfs" ] && [ -x "$mkfs_xfs" ] ||
  die "mkfs.xfs is required: the image ships it for pool-mount (Debian package xfsprogs; scripts/setup.sh installs it)"

# IMAGE_REVISION overrides the revision label (tests: the digest must not follow the work tree)
revision=${IMAGE_REVISION:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}
# a build from uncommitted changes says so
if [ -z "${IMAGE_REVISION:-}" ] && [ "$revision" != unknown ] && ! git -C "$root" diff --quiet HEAD --; then
  revision="$revision-dirty"
fi
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"/{usr/bin,etc/ssl/certs,tmp}
install -m 0755 "$binary" "$rootfs/usr/bin/quarry"
# Debug info off (a third of the size); the symbol table stays, so backtraces name functions.
strip --strip-debug "$rootfs/usr/bin/quarry"

install -m 0755 "$mkfs_xfs" "$rootfs/usr/bin/mkfs.xfs"

# The loader and every library the binaries link, at the paths the loader looks them up by.
# ldd prints "name => /path (addr)" for libraries and "/path (addr)" for the loader.
linked() {
  local found
  found=$(ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
  [ -n "$found" ] || die "ldd found no libraries in $1 (a static binary needs no build script)"
  grep -q 'ld-linux' <<<"$found" || die "ldd found no dynamic loader for $1"
  echo "$found"
}
libs=$({ linked "$binary" && linked "$mkfs_xfs"; } | sort -u)
for lib in $libs; do
  mkdir -p "$rootfs$(dirname "$lib")"
  install -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
done

printf 'root:x:0:0:root:/root:/sbin/nologin\nquarry:x:107:107:quarry:/nonexistent:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nquarry:x:107:\n' >"$rootfs/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || die "$ca is missing (Debian package ca-certificates)"
install -m 0644 "$ca" "$rootfs$ca"
chmod 0644 "$rootfs"/etc/{passwd,group,nsswitch.conf}
find "$rootfs" -type d -exec chmod 0755 {} +
chmod 1777 "$rootfs/tmp"

# The layer, then the blobs: config, manifest, and the index that names the manifest by tag.
layout="$out/oci"
rm -rf "$layout" "$out/quarry-oci.tar"
mkdir -p "$layout/blobs/sha256"
(cd "$rootfs" && tar --create --format=ustar --sort=name --mtime="@$epoch" --owner=0 --group=0 \
  --numeric-owner --no-acls --no-xattrs --no-selinux -- *) >"$work/layer.tar"
gzip -n -6 <"$work/layer.tar" >"$work/layer.tar.gz"

# put FILE: stores it as a blob and prints its digest (sha256:HEX)
put() {
  local hex
  hex=$(sha256sum "$1" | cut -d' ' -f1)
  cp "$1" "$layout/blobs/sha256/$hex"
  echo "sha256:$hex"
}
size() { stat -c %s "$1"; }

diff_id="sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
layer=$(put "$work/layer.tar.gz")
jq -n -S -c --arg created "$created" --arg diff "$diff_id" --arg version "$version" \
  --arg revision "$revision" '{
    architecture: "amd64",
    os: "linux",
    created: $created,
    config: {
      User: "107:107",
      Entrypoint: ["/usr/bin/quarry"],
      Cmd: ["--help"],
      Env: ["PATH=/usr/bin"],
      WorkingDir: "/",
      Labels: {
        "org.opencontainers.image.title": "quarry",
        "org.opencontainers.image.description": "VM disk import, upload, controllers and hostpath CSI driver for KubeVirt-style clusters: one binary, the component is chosen by the command line",
        "org.opencontainers.image.version": $version,
        "org.opencontainers.image.revision": $revision,
        "org.opencontainers.image.created": $created,
        "org.opencontainers.image.licenses": "Apache-2.0"
      }
    },
    rootfs: {type: "layers", diff_ids: [$diff]},
    history: [{created: $created, created_by: "scripts/build-image.sh"}]
  }' >"$work/config.json"
config=$(put "$work/config.json")
jq -n -S -c --arg config "$config" --argjson config_size "$(size "$work/config.json")" \
  --arg layer "$layer" --argjson layer_size "$(size "$work/layer.tar.gz")" '{
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $config, size: $config_size},
    layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $layer, size: $layer_size}]
  }' >"$work/manifest.json"
manifest=$(put "$work/manifest.json")
jq -n -S -c --arg manifest "$manifest" --argjson size "$(size "$work/manifest.json")" --arg tag "$tag" '{
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: [{
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      digest: $manifest,
      size: $size,
      platform: {architecture: "amd64", os: "linux"},
      annotations: {"org.opencontainers.image.ref.name": $tag}
    }]
  }' >"$layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"

# The archive: the layout as one tar (what skopeo's oci-archive transport reads), as
# deterministic as the layer.
(cd "$layout" && tar --create --format=ustar --sort=name --mtime="@$epoch" --owner=0 --group=0 \
  --numeric-owner --mode=u=rwX,go=rX --no-acls --no-xattrs --no-selinux index.json oci-layout blobs) \
  >"$out/quarry-oci.tar"

echo "image $manifest tag $tag"
echo "layout $layout"
echo "archive $out/quarry-oci.tar"
echo "layer $(size "$work/layer.tar.gz") bytes compressed, $(size "$work/layer.tar") bytes unpacked"
