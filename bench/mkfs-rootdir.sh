#!/usr/bin/env bash
# `oleo mkfs --rootdir` against `mkfs.btrfs --rootdir` on the same tree (a copy of
# /usr/include: tens of thousands of files, directories and symlinks), medians of 3 runs of
# each, interleaved. Prints a markdown table; with an argument, also writes it to that file.
# Needs root only to read the whole tree; the images are plain files.
set -euo pipefail
cd "$(dirname "$0")/.."
oleo=${OLEO_BIN:-target/release/oleo}
[ -x "$oleo" ] || cargo build --release -p oleo-cli
work=$(mktemp -d "${TMPDIR:-/tmp}/oleo-bench-rootdir.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/tree
cp -a /usr/include "$src"
files=$(find "$src" | wc -l)
bytes=$(du -sb "$src" | cut -f1)
size=$(( (bytes * 2 / 1048576 + 512) ))M

# Seconds (wall clock, with a final sync of the image) of one run of "$@" on a fresh image.
timed() {
    local img=$work/img
    rm -f "$img"
    truncate -s "$size" "$img"
    local t0 t1
    t0=$(date +%s.%N)
    "$@" "$img" >/dev/null 2>&1
    sync -f "$img"
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l
}
median() { sort -n | sed -n 2p; }

oleo_t=() progs_t=()
for _ in 1 2 3; do
    oleo_t+=("$(timed "$oleo" mkfs -q -f --rootdir "$src")")
    progs_t+=("$(timed mkfs.btrfs -q -f --rootdir "$src")")
done
o=$(printf '%s\n' "${oleo_t[@]}" | median)
p=$(printf '%s\n' "${progs_t[@]}" | median)
table=$(cat <<TABLE
| tree | entries | bytes | oleo mkfs --rootdir (s) | mkfs.btrfs --rootdir (s) | oleo / mkfs.btrfs time |
|---|---|---|---|---|---|
| /usr/include | $files | $bytes | $(printf %.2f "$o") | $(printf %.2f "$p") | $(printf %.2fx "$(echo "$o / $p" | bc -l)") |

runs (s): oleo ${oleo_t[*]}; mkfs.btrfs ${progs_t[*]}; $(mkfs.btrfs --version | head -1); $(date -u +%F)
TABLE
)
echo "$table"
[ $# -gt 0 ] && echo "$table" > "$1"
exit 0
