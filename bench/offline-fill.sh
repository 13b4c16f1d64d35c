#!/usr/bin/env bash
# Filling an unmounted image without FUSE (issue 41's "way around FUSE for bulk work"):
# `oleo tar -x -f ARCHIVE -C IMAGE:/` for a plain, a zstd and a gzip archive, and `oleo cp -a
# TREE IMAGE:/`, against kernel btrfs doing the same on a loop mount (direct IO, as bench/run's
# kernel targets) followed by `sync -f`. The tree is bench/run's untar-cp tree (50,000
# source-like files in 2,500 directories, ~340 MB), the host copy of it warm in the page
# cache for both sides. Every run is on a fresh image; runs are interleaved; medians of
# ROUNDS (default 3). Prints a markdown table; with an argument, also writes it there.
# Needs root (the kernel side mounts a loop device); oleo's side needs none.
set -euo pipefail
cd "$(dirname "$0")/.."
oleo=${OLEO_BIN:-target/release/oleo}
[ -x "$oleo" ] || cargo build --release -p oleo-cli
rounds=${ROUNDS:-3}
files=${FILES:-50000}
dirs=${DIRS:-2500}
work=$(mktemp -d "${TMPDIR:-/var/tmp}/oleo-bench-offline.XXXXXX")
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
    mountpoint -q "$mnt" && umount "$mnt"
    [ -n "${loopdev:-}" ] && losetup -d "$loopdev" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# The tree, as bench/run's untar-cp workload makes it, then its archives and host copy.
PYTHONPATH=bench python3 -c '
import subprocess, sys
from oleobench.workloads import _TREE_SCRIPT
subprocess.run([sys.executable, "-c", _TREE_SCRIPT, *sys.argv[1:]], check=True)
' "$files" "$dirs" "$work/tree.tar"
zstd -q -T0 -o "$work/tree.tar.zst" "$work/tree.tar"
gzip -c "$work/tree.tar" > "$work/tree.tar.gz"
mkdir "$work/host"
tar -xf "$work/tree.tar" -C "$work/host"
bytes=$(du -sb "$work/host" | cut -f1)

fresh() {
    rm -f "$work/img"
    truncate -s 4G "$work/img"
    mkfs.btrfs -q -f "$work/img" >/dev/null
}
secs() {
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l
}
# The kernel: a loop device with direct IO, the command, then sync -f of the mount.
kernel() {
    fresh
    loopdev=$(losetup --direct-io=on -f --show "$work/img")
    mount "$loopdev" "$mnt"
    secs bash -c "$1 && sync -f '$mnt'"
    umount "$mnt"
    losetup -d "$loopdev"
    loopdev=
}
oleo_run() {
    fresh
    secs "$oleo" "$@"
}

declare -A t
add() { t[$1]="${t[$1]:-} $2"; }
for _ in $(seq "$rounds"); do
    add k_tar "$(kernel "tar -xf '$work/tree.tar' -C '$mnt'")"
    add o_tar "$(oleo_run tar -x -f "$work/tree.tar" -C "$work/img:/")"
    add k_zst "$(kernel "tar --zstd -xf '$work/tree.tar.zst' -C '$mnt'")"
    add o_zst "$(oleo_run tar -x -f "$work/tree.tar.zst" -C "$work/img:/")"
    add k_gz "$(kernel "tar -xzf '$work/tree.tar.gz' -C '$mnt'")"
    add o_gz "$(oleo_run tar -x -f "$work/tree.tar.gz" -C "$work/img:/")"
    add k_cp "$(kernel "cp -a '$work/host/src' '$mnt/'")"
    add o_cp "$(oleo_run cp -a "$work/host/src" "$work/img:/")"
done
# The last image oleo filled is checked, data checksums included.
btrfs check --check-data-csum "$work/img" >/dev/null 2>&1 || {
    echo "btrfs check failed on oleo's image" >&2
    exit 1
}

median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
row() {
    local k o
    k=$(echo "${t[k_$2]}" | median)
    o=$(echo "${t[o_$2]}" | median)
    printf '| %s | %.2f | %.2f | %.2fx |\n' "$1" "$k" "$o" "$(echo "$o / $k" | bc -l)"
}
table=$(cat <<TABLE
| into a fresh image | kernel btrfs, then sync (s) | oleo, unmounted (s) | oleo / kernel time |
|---|---|---|---|
$(row "tar -x of .tar" tar)
$(row "tar -x of .tar.zst" zst)
$(row "tar -x of .tar.gz" gz)
$(row "cp -a of the tree" cp)

$files files in $dirs directories, $bytes bytes; medians of $rounds interleaved rounds; \
runs (s): $(for k in k_tar o_tar k_zst o_zst k_gz o_gz k_cp o_cp; do printf '%s:%s; ' "$k" "${t[$k]}"; done)\
$(uname -r), $(nproc) CPUs, $(date -u +%F); btrfs check --check-data-csum clean
TABLE
)
echo "$table"
[ $# -gt 0 ] && echo "$table" > "$1"
exit 0
