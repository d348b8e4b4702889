#!/usr/bin/env bash
# Makes small qcow2 test images with qemu-img / qemu-io (10.x) in OUTDIR.
#
# Usage: testdata/make-images.sh OUTDIR
#
# Prints one line per image: "FILE EXPECT WHAT", where EXPECT is "convert" (the reader must
# produce exactly what `qemu-img convert -O raw` produces) or "unsupported" (the reader must
# refuse it with an unsupported-image error naming the problem).
#
# Images (each a few MiB at most on disk):
#   default.qcow2      v3, 64 KiB clusters: data, zero clusters ("write -z", plain and
#                      allocated), unallocated clusters, a partial-cluster write
#   v2.qcow2           compat=0.10 (version 2 header, no zero clusters)
#   c512.qcow2         512-byte clusters (many L2 tables)
#   c2m.qcow2          2 MiB clusters
#   deflate.qcow2      compressed clusters, deflate (qemu-img convert -c)
#   zstd.qcow2         compressed clusters, zstd (compression_type=zstd)
#   extl2.qcow2        extended L2 entries, subcluster writes and subcluster zeroes
#   extl2-zstd.qcow2   extended L2 entries with zstd-compressed clusters
#   refcount1.qcow2    refcount_bits=1
#   refcount64.qcow2   refcount_bits=64
#   snapshot.qcow2     internal snapshot, then overwrites and new data after it (copied L2
#                      tables land after the data they map: exercises the hold)
#   resized.qcow2      1 KiB clusters, resized from 1 MiB to 16 MiB + 512 B: the L1 table grew
#                      and moved after the L2 tables and data; virtual size not a multiple of the
#                      cluster size; data written after the resize too
#   odd-size.qcow2     64 KiB clusters, virtual size 3 MiB + 1536 B, data in the partial last cluster
#   dirty.qcow2        the dirty bit set (lazy refcounts, killed mid-write style): still readable
#   backing.qcow2      refused: backing file (default.qcow2)
#   luks.qcow2         refused: LUKS encryption
#   datafile.qcow2     refused: external data file (datafile.raw)
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
out=$1
mkdir -p "$out"
cd "$out"

q() { qemu-img "$@" >/dev/null; }
# qemu-io exits 0 even when a command fails, so its output is checked for errors too.
io() {
    local img=$1 o
    shift
    local args=()
    for c in "$@"; do args+=(-c "$c"); done
    if ! o=$(qemu-io -f qcow2 "${args[@]}" "$img" 2>&1) || grep -qiE 'error|failed|invalid' <<<"$o"; then
        echo "qemu-io failed on $img: $o" >&2
        exit 1
    fi
}
emit() { echo "$1 $2 $3"; }

rm -f ./*.qcow2 ./*.raw

# default: data, zeroes, unallocated, partial cluster.
q create -f qcow2 default.qcow2 8M
io default.qcow2 \
    'write -P 0xab 0 64k' \
    'write -P 0xcd 192k 100k' \
    'write -P 0x11 1M 128k' \
    'write -z 1M 64k' \
    'write -z 3M 128k' \
    'write -P 0x5e 5243392 4k' \
    'write -P 0x77 8323072 64k'
emit default.qcow2 convert "v3 64k: data, zero (plain+allocated), unallocated, partial write"

q create -f qcow2 -o compat=0.10 v2.qcow2 4M
io v2.qcow2 'write -P 0x21 0 200k' 'write -P 0x22 2M 64k' 'write -z 2M 32k'
emit v2.qcow2 convert "v2 (compat=0.10)"

q create -f qcow2 -o cluster_size=512 c512.qcow2 2M
io c512.qcow2 'write -P 0x31 0 40k' 'write -P 0x32 700k 3k' 'write -z 10k 2k' 'write -P 0x33 2096128 1k'
emit c512.qcow2 convert "512-byte clusters"

q create -f qcow2 -o cluster_size=2M c2m.qcow2 6M
io c2m.qcow2 'write -P 0x41 0 100k' 'write -P 0x42 4198400 8k' 'write -z 2M 2M'
emit c2m.qcow2 convert "2 MiB clusters"

# A raw source with incompressible, compressible and zero parts for convert -c.
q create -f raw src.raw 4M
qemu-io -f raw -c 'write -P 0x51 0 512k' -c 'write -P 0x52 1048676 300k' src.raw >/dev/null
head -c 700k /dev/urandom | dd of=src.raw bs=1k seek=2048 conv=notrunc status=none
q convert -c -O qcow2 src.raw deflate.qcow2
emit deflate.qcow2 convert "compressed clusters, deflate"
q convert -c -O qcow2 -o compression_type=zstd src.raw zstd.qcow2
emit zstd.qcow2 convert "compressed clusters, zstd"

q create -f qcow2 -o extended_l2=on extl2.qcow2 4M
io extl2.qcow2 \
    'write -P 0x61 0 2k' \
    'write -P 0x62 6k 2k' \
    'write -P 0x63 64k 64k' \
    'write -z 80k 4k' \
    'write -P 0x64 1083392 3k' \
    'write -z 2M 64k'
emit extl2.qcow2 convert "extended L2 entries, subclusters"
q convert -c -O qcow2 -o extended_l2=on,compression_type=zstd src.raw extl2-zstd.qcow2
emit extl2-zstd.qcow2 convert "extended L2 entries, zstd clusters"

for bits in 1 64; do
    q create -f qcow2 -o refcount_bits=$bits refcount$bits.qcow2 2M
    io refcount$bits.qcow2 'write -P 0x71 0 300k' 'write -P 0x72 1M 64k'
    emit refcount$bits.qcow2 convert "refcount_bits=$bits"
done

q create -f qcow2 snapshot.qcow2 4M
io snapshot.qcow2 'write -P 0x81 0 512k' 'write -P 0x82 1M 256k'
q snapshot -c snap1 snapshot.qcow2
io snapshot.qcow2 'write -P 0x83 64k 64k' 'write -P 0x84 3M 128k' 'write -z 1M 64k'
emit snapshot.qcow2 convert "internal snapshot, writes after it"

q create -f qcow2 -o cluster_size=1024 resized.qcow2 1M
io resized.qcow2 'write -P 0x91 0 20k' 'write -P 0x92 512k 8k'
q resize resized.qcow2 $((16 * 1024 * 1024 + 512))
io resized.qcow2 'write -P 0x93 2k 2k' 'write -P 0x94 16776192 1k' 'write -P 0x95 16777216 512'
emit resized.qcow2 convert "resized: L1 moved after its L2 tables, size not a cluster multiple"

q create -f qcow2 odd-size.qcow2 $((3 * 1024 * 1024 + 1536))
io odd-size.qcow2 'write -P 0xa1 0 64k' 'write -P 0xa2 3M 1536'
emit odd-size.qcow2 convert "virtual size 3 MiB + 1536, partial last cluster"

q create -f qcow2 -o lazy_refcounts=on dirty.qcow2 2M
io dirty.qcow2 'write -P 0xb1 0 64k'
# Set the dirty bit (incompatible feature bit 0, byte 79 of the header) as a crash would leave it.
printf '\x01' | dd of=dirty.qcow2 bs=1 seek=79 conv=notrunc status=none
emit dirty.qcow2 convert "dirty bit set"

q create -f qcow2 -o backing_file=default.qcow2,backing_fmt=qcow2 backing.qcow2
emit backing.qcow2 unsupported "backing file default.qcow2"

q create -f qcow2 --object secret,id=s0,data=pw -o encrypt.format=luks,encrypt.key-secret=s0 luks.qcow2 1M
emit luks.qcow2 unsupported "LUKS encryption"

q create -f qcow2 -o data_file=datafile.raw datafile.qcow2 1M
emit datafile.qcow2 unsupported "external data file datafile.raw"

rm -f src.raw
