#!/usr/bin/env bash
# fstests (xfstests) generic tests against oleo's FUSE mount, with `btrfs check` after each.
#
#   scripts/fstests.sh OLEO_BINARY [TEST...]      TEST is NNN or generic/NNN; default: fstests/generic.list
#
# Runs the `run` script of ../shared/fstests (beside the clone; FSTESTS_SHARED names another
# copy) from a temporary folder where the project's fstests/generic.list and fstests/known.txt
# take the place of the shared ones (../shared is read-only). See ../shared/fstests/README.md:
# WORK, IMG_SIZE, FSTESTS_DIR (a built fstests tree; without it the first run builds one under
# /var/tmp/oleo-fstests) pass through. Needs root, FUSE and btrfs-progs: without them it
# prints why it skips and exits 0, but under CI=true a skip is a failure. The last line is
# always "fstests: N passed, M failed" (a skip under CI, or a run that could not start, counts
# as one failure).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${FSTESTS_SHARED:-$root/../shared/fstests}

[ $# -ge 1 ] || { echo "usage: scripts/fstests.sh OLEO_BINARY [TEST...]" >&2; exit 2; }
oleo=$(realpath -e "$1" 2>/dev/null) || { echo "fstests: no oleo binary $1" >&2; echo "fstests: 0 passed, 1 failed"; exit 1; }
shift

skip() {
    if [ "${CI:-}" = true ]; then
        echo "fstests: cannot run: $* (a skip is a failure under CI=true)" >&2
        echo "fstests: 0 passed, 1 failed"
        exit 1
    fi
    echo "fstests: skipped: $*"
    exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root"
[ -c /dev/fuse ] && [ -r /dev/fuse ] && [ -w /dev/fuse ] || skip "needs FUSE (/dev/fuse)"
grep -qw fuse /proc/filesystems 2>/dev/null || modprobe fuse 2>/dev/null
grep -qw fuse /proc/filesystems 2>/dev/null || skip "needs FUSE (no fuse in /proc/filesystems)"
command -v btrfs >/dev/null || skip "needs btrfs-progs (btrfs check)"
[ -x "$shared/run" ] && [ -x "$shared/setup" ] && ls "$shared"/xfstests-*.tar.gz >/dev/null 2>&1 ||
    skip "no fstests snapshot at $shared"

tmp=$(mktemp -d /tmp/oleo-fstests-run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$shared/run" "$shared/setup" "$tmp/"
ln -s "$(realpath "$(ls "$shared"/xfstests-*.tar.gz | head -n 1)")" "$tmp/"
cp "$root/fstests/generic.list" "$root/fstests/known.txt" "$tmp/"
# run's mount.fuse.oleo wrapper waits until no oleo process holds the image (the previous
# daemon's final commit after umount); `mount -o remount` is served by that very daemon, so
# the wait would last its full 120 s and time the test out (generic/294, 306, 452). A remount
# goes straight to oleo. (No-op once the shared script handles it.)
sed -i 's|^src=$(realpath -m -- "$1")$|&\ncase " $* " in *remount*) exec "$OLEO" "$@" ;; esac|' "$tmp/run"

out=$tmp/out
bash "$tmp/run" "$oleo" "$@" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
if ! tail -n 1 "$out" | grep -qE '^fstests: [0-9]+ passed, [0-9]+ failed$'; then
    echo "fstests: the run ended early (exit status $status)"
    echo "fstests: 0 passed, 1 failed"
    [ "$status" = 0 ] && status=1
    exit "$status"
fi
# run's own count has known.txt's failures among the failed; the last line counts them as
# skipped and fails only the unexpected ones (a failed `btrfs check` makes a test unexpected).
passed=$(sed -nE 's/^fstests: ([0-9]+) passed, [0-9]+ failed$/\1/p' "$out" | tail -n 1)
known=$(sed -nE 's/^[0-9]+ notrun; ([0-9]+) failed or did not run for known reasons.*/\1/p' "$out" | tail -n 1)
failed=$(sed -nE 's/^unexpected:(.*)$/\1/p' "$out" | wc -w)
[ "$status" != 0 ] && [ "$failed" = 0 ] && failed=1
echo "fstests: $passed passed, $failed failed, ${known:-0} skipped"
exit "$status"
