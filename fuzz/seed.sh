#!/usr/bin/env bash
# Seeds the fuzz corpora with small valid inputs made by qemu-img/qemu-io, GNU tar and Python's
# tarfile, so each target starts from inputs that pass its magic and header checks.
#
# Usage: fuzz/seed.sh [CORPUS_DIR]   (default: fuzz/corpus; one directory per target)
#
# Every image is small (virtual sizes of a few MiB, block/cluster sizes at their minimum) so the
# fuzzer's inputs stay short: libFuzzer's -max_len defaults to the largest seed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:-$here/corpus}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

q() { qemu-img "$@" >/dev/null; }
io() {
    local fmt=$1 img=$2 o
    shift 2
    local args=()
    for c in "$@"; do args+=(-c "$c"); done
    o=$(qemu-io -f "$fmt" "${args[@]}" "$img" 2>&1)
    if grep -qiE 'error|failed|invalid' <<<"$o"; then
        echo "qemu-io failed on $img: $o" >&2
        exit 1
    fi
}
seed() { mkdir -p "$out/$1" && cp "$2" "$out/$1/$(basename "$2")"; }

# A small raw disk with data, a zero run and a hole, converted into each format.
q create -f raw base.raw 3M
io raw base.raw "write -P 0x5a 0 64k" "write -z 512k 64k" "write -P 0xa5 2560k 4k" "write -P 1 3068k 4k"

# qcow2: 512-byte clusters keep the tables small; v2 and v3; compressed; extended L2.
q convert -O qcow2 -o cluster_size=512 base.raw c512.qcow2
q convert -O qcow2 -o cluster_size=512,compat=0.10 base.raw v2.qcow2
q convert -c -O qcow2 -o cluster_size=4096 base.raw deflate.qcow2
q convert -c -O qcow2 -o cluster_size=4096,compression_type=zstd base.raw zstd.qcow2
q convert -O qcow2 -o cluster_size=16384,extended_l2=on base.raw extl2.qcow2
q create -f qcow2 -o cluster_size=512 empty.qcow2 1M
for f in c512 v2 deflate zstd extl2 empty; do seed qcow2_stream $f.qcow2; done

# vmdk: monolithicSparse and streamOptimized (the stream reader's two kinds).
q convert -O vmdk -o subformat=monolithicSparse base.raw sparse.vmdk
q convert -O vmdk -o subformat=streamOptimized base.raw stream.vmdk
q create -f vmdk -o subformat=streamOptimized empty-stream.vmdk 1M
# Appended in two sessions: zero sectors between the grains, found through the tables.
q create -f vmdk -o subformat=streamOptimized sessions.vmdk 1M
io vmdk sessions.vmdk "write -P 0xaa 0 64k"
io vmdk sessions.vmdk "write -P 0xbb 512k 64k"
for f in sparse stream empty-stream sessions; do seed vmdk_stream $f.vmdk; done

# vpc: dynamic (empty and with data; blocks are 2 MiB) and fixed.
q create -f vpc empty.vhd 1M
q convert -O vpc -o subformat=dynamic base.raw dynamic.vhd
q convert -O vpc -o subformat=dynamic,force_size=on base.raw force.vhd
q create -f vpc -o subformat=fixed fixed.vhd 64k
for f in empty dynamic force fixed; do seed vpc_stream $f.vhd; done

# vdi: dynamic and static (1 MiB blocks).
q create -f vdi empty.vdi 1M
q convert -O vdi base.raw dynamic.vdi
q create -f vdi -o static=on static.vdi 1M
for f in empty dynamic static; do seed vdi_stream $f.vdi; done

# vhdx: 1 MiB blocks and log (the minimum), dynamic and fixed.
q create -f vhdx -o block_size=1M,log_size=1M empty.vhdx 1M
q convert -O vhdx -o block_size=1M,log_size=1M base.raw dynamic.vhdx
q create -f vhdx -o block_size=1M,log_size=1M,subformat=fixed fixed.vhdx 1M
for f in empty dynamic fixed; do seed vhdx_stream $f.vhdx; done

# archive_extract: GNU tar in each format (sparse files in each sparse version), and Python's
# tarfile for links, PAX records and long names.
mkdir -p tree/d/e
printf 'hello\n' >tree/d/f
ln -s f tree/d/l
ln tree/d/f tree/h
truncate -s 1M tree/sparse
printf 'x' | dd of=tree/sparse bs=1 seek=600000 conv=notrunc status=none
chmod 0750 tree/d
tar --format=gnu --sparse -C tree -cf gnu.tar .
tar --format=ustar -C tree -cf ustar.tar d/f d/l h
for v in 0.0 0.1 1.0; do
    tar --format=pax --sparse --sparse-version=$v -C tree -cf pax-sparse-$v.tar sparse
done
python3 - <<'EOF'
import io, tarfile
with tarfile.open('python-pax.tar', 'w', format=tarfile.PAX_FORMAT) as t:
    for name, kind, data, link in [
        ('dir/', tarfile.DIRTYPE, b'', ''),
        ('dir/' + 'n' * 120, tarfile.REGTYPE, b'long name', ''),
        ('dir/s', tarfile.SYMTYPE, b'', '../dir'),
        ('hl', tarfile.LNKTYPE, b'', 'dir/' + 'n' * 120),
    ]:
        ti = tarfile.TarInfo(name)
        ti.type, ti.linkname, ti.size, ti.mode = kind, link, len(data), 0o644
        t.addfile(ti, io.BytesIO(data) if data else None)
EOF
for f in gnu ustar pax-sparse-0.0 pax-sparse-0.1 pax-sparse-1.0 python-pax; do
    seed archive_extract $f.tar
done

# ovf: the descriptor VMware and VirtualBox write (shape), and one without a disk section.
cat >vm.ovf <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<!-- a comment -->
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1">
  <References>
    <File ovf:href="vm-disk1.vmdk" ovf:id="file1" ovf:size="68096"/>
    <File ovf:href="data &amp; logs.vmdk.gz" ovf:id="file2" ovf:compression="gzip"/>
  </References>
  <DiskSection>
    <Info>Virtual disk information</Info>
    <Disk ovf:capacity="16" ovf:capacityAllocationUnits="byte * 2^30" ovf:diskId="vmdisk1" ovf:fileRef="file1" ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>
    <Disk ovf:capacity="1" ovf:diskId="blank"/>
    <Disk ovf:capacity="2" ovf:diskId="vmdisk2" ovf:fileRef="file2"/>
  </DiskSection>
  <VirtualSystem ovf:id="vm"><Info>A VM</Info><![CDATA[<Disk ovf:fileRef="no"/>]]></VirtualSystem>
</Envelope>
EOF
printf '<Envelope><References><File id="a" href="a.qcow2"/><File id="b" href="b.img"/></References></Envelope>' >refs.ovf
for f in vm refs; do seed ovf $f.ovf; done

du -sh "$out"/*
