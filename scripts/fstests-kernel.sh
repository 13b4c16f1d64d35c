#!/usr/bin/env bash
# The oracle for fstests/generic.list's tail: runs fstests generic tests on kernel btrfs on this
# machine (FSTYP=btrfs, TEST_DEV and SCRATCH_DEV loop devices over sparse files), with the
# same built fstests tree and caps as scripts/fstests.sh, so that a test left out of the list
# can be said to fail, or not run, on kernel btrfs too, and long tests can be timed.
#
#   scripts/fstests-kernel.sh TEST...          TEST is NNN or generic/NNN
#
# Environment: WORK (default /tmp/oleo-fstests-kernel), IMG_SIZE (default 8G), CAP (seconds per
# test, default 600), FSTESTS_DIR (a built fstests tree; default: the one scripts/fstests.sh
# builds under /var/tmp/oleo-fstests). Needs root and the btrfs module. Prints one line per
# test: "generic/NNN pass|fail|notrun SECONDS [reason]". Results under $WORK/results.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/fstests-kernel.sh TEST..." >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "fstests-kernel: needs root" >&2; exit 2; }
FST=${FSTESTS_DIR:-$(ls -d /var/tmp/oleo-fstests/xfstests-* 2>/dev/null | head -n 1)}
[ -x "$FST/check" ] || { echo "fstests-kernel: no built fstests tree (run scripts/fstests.sh once, or set FSTESTS_DIR)" >&2; exit 2; }
WORK=${WORK:-/tmp/oleo-fstests-kernel}
IMG_SIZE=${IMG_SIZE:-8G}
CAP=${CAP:-600}
mkdir -p "$WORK"/{img,mnt/test,mnt/scratch,logs,results}
WORK=$(realpath "$WORK")
for f in test scratch; do
    rm -f "$WORK/img/$f.img"
    truncate -s "$IMG_SIZE" "$WORK/img/$f.img"
done
test_dev=$(losetup -f --show "$WORK/img/test.img") || exit 2
scratch_dev=$(losetup -f --show "$WORK/img/scratch.img") || { losetup -d "$test_dev"; exit 2; }
cleanup() {
    umount "$WORK/mnt/test" "$WORK/mnt/scratch" 2>/dev/null
    losetup -d "$test_dev" "$scratch_dev" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkfs.btrfs -q -f "$test_dev" >/dev/null 2>&1 || { echo "fstests-kernel: mkfs.btrfs failed" >&2; exit 2; }
cat > "$WORK/local.config" <<EOF
export FSTYP=btrfs
export TEST_DEV=$test_dev
export TEST_DIR=$WORK/mnt/test
export SCRATCH_DEV=$scratch_dev
export SCRATCH_MNT=$WORK/mnt/scratch
export RESULT_BASE=$WORK/results
EOF
for t in "$@"; do
    t=${t#generic/}
    t0=$(date +%s)
    (cd "$FST" && HOST_OPTIONS=$WORK/local.config timeout -k 10 "$CAP" ./check "generic/$t") \
        > "$WORK/logs/$t.check" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    note=
    if [ $rc = 124 ] || [ $rc = 137 ]; then status=fail; note=" [timed out after ${CAP}s]"
    elif grep -q "^Not run: generic/$t" "$WORK/logs/$t.check"; then
        status=notrun
        note=" [$(grep -m1 -E "^generic/$t +\[not run\]" "$WORK/logs/$t.check" | sed -E "s|^generic/$t +\[not run\] ||")]"
    elif grep -q "^Passed all 1 tests" "$WORK/logs/$t.check"; then status=pass
    else status=fail; fi
    umount "$WORK/mnt/test" "$WORK/mnt/scratch" 2>/dev/null
    echo "generic/$t $status ${secs}s$note"
done
