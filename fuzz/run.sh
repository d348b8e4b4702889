#!/usr/bin/env bash
# Runs the fuzz targets one after another, each for a bounded time, on the stable toolchain.
#
# Usage: fuzz/run.sh [SECONDS] [TARGET...]     (default: 300 s each, all seven targets)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and seeded corpora (`fuzz/seed.sh`).
# RUSTC_BOOTSTRAP=1 lets the stable compiler take the -Z flags cargo-fuzz passes; set
# FUZZ_SANITIZER=none where AddressSanitizer does not link. One fuzzing process at a time (no
# -jobs/-workers): the machine is shared. Crashes, timeouts and OOMs land in
# fuzz/artifacts/TARGET/, the log of each run in fuzz/logs/TARGET.log; the last line of each
# summary gives executions and coverage (cov/ft). Leak detection is off, per input and at exit:
# LeakSanitizer reports threads still exiting (a scoped thread's thread-local storage at the end of
# an input, a cancelled pipeline stage's thread, which is detached by design, at exit); memory
# growth still fails on -rss_limit_mb.
set -euo pipefail

cd "$(dirname "$0")"
secs=${1:-300}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(qcow2_stream vmdk_stream vpc_stream vdi_stream vhdx_stream archive_extract ovf)
fi
export RUSTC_BOOTSTRAP=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
# Extractions and spill files go to memory, not the shared disk (archive_extract syncs its
# filesystem once per input).
export TMPDIR=${FUZZ_TMPDIR:-/dev/shm/quarry-fuzz}
mkdir -p "$TMPDIR" logs

for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    cargo fuzz build -s "${FUZZ_SANITIZER:-address}" "$t"
    # libFuzzer caps inputs at 1 MiB unless told otherwise, which would cut the vhdx seeds (a
    # vhdx's metadata and BAT sit at 1 MiB boundaries) and the dynamic vhd ones to headers only.
    largest=$(find "corpus/$t" -type f -printf '%s\n' | sort -n | tail -1)
    max_len=$(( ${largest:-0} > 1048576 ? ${largest:-0} : 1048576 ))
    status=0
    cargo fuzz run -s "${FUZZ_SANITIZER:-address}" "$t" -- -max_len="$max_len" \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -detect_leaks=0 \
        -print_final_stats=1 \
        >"logs/$t.log" 2>&1 || status=$?
    summary=$(grep -E '^#[0-9]+[[:space:]]+(DONE|NEW|REDUCE|pulse|INITED)' "logs/$t.log" | tail -1 || true)
    runs=$(grep -E '^stat::number_of_executed_units' "logs/$t.log" | awk '{print $2}' || true)
    echo "$t: exit $status, ${runs:-?} executions, last: ${summary:-none}"
    ls "artifacts/$t" 2>/dev/null | sed "s|^|  artifact: artifacts/$t/|" || true
done
