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
# The wrapper's wait is for a daemon finishing its final commit after an unmount. An image
# that is still mounted is being mounted a second time (generic/732, 589): that mount
# joins the running daemon (a bind mount, as the kernel shares one superblock), no wait.
sed -i 's|^start=$(date +%s.%N); h=$(holders); first=$h$|&\nfindmnt -rn -S "$src" -t fuse.oleo >/dev/null 2>\&1 \&\& { h=; first=; }|' "$tmp/run"
grep -q '^findmnt -rn -S "$src" -t fuse.oleo' "$tmp/run" ||
    { echo "fstests: the run script changed: cannot patch its mount wrapper"; echo "fstests: 0 passed, 1 failed"; exit 1; }
# fstests knows no way to make a FUSE filesystem of a given size: _scratch_mkfs_sized notruns
# for FSTYP=fuse, so the tests that need a small filesystem (ENOSPC and the like) never ran.
# The run gives it one: the built tree's common/rc calls $OLEO_MKFS SIZE SCRATCH_DEV for
# FSTYP=fuse, which waits until no oleo daemon still holds the image (a final commit after
# umount) and runs `oleo mkfs --size`; after such a test the scratch image is made afresh at
# IMG_SIZE for the next one. (No-op once the shared script handles it.)
cat > "$tmp/mkfs-sized.sh" <<'HOOK'
cat > "$WORK/mkfs.oleo" <<EOF
#!/bin/bash
# mkfs.oleo SIZE DEVICE (from _scratch_mkfs_sized): a SIZE-byte btrfs on DEVICE ("-": all of it)
OLEO=$OLEO
WORK=$WORK
EOF
cat >> "$WORK/mkfs.oleo" <<'EOF'
src=$(realpath -m -- "$2")
for ((i = 0; i < 1200; i++)); do
    held=
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/exe" 2>/dev/null)" = "$OLEO" ] || continue
        tr '\0' '\n' < "$p/cmdline" 2>/dev/null | grep -qxF -- "$src" && held=1
    done
    [ -z "$held" ] && break
    sleep 0.1
done
touch "$WORK/scratch.sized"
[ "$1" = - ] && exec "$OLEO" mkfs -f -q "$src"
exec "$OLEO" mkfs -f -q --size "$1" "$src"
EOF
chmod +x "$WORK/mkfs.oleo"
export OLEO_MKFS=$WORK/mkfs.oleo
grep -q OLEO_MKFS "$FST/common/rc" || sed -i 's|^\t\t_notrun "Filesystem \$FSTYP not supported in _scratch_mkfs_sized"$|\t\tif [ "$FSTYP" = fuse ] \&\& [ -n "$OLEO_MKFS" ]; then "$OLEO_MKFS" $fssize $SCRATCH_DEV; else _notrun "Filesystem $FSTYP not supported in _scratch_mkfs_sized"; fi|' "$FST/common/rc"
# fstests answers some questions per filesystem type and, for FSTYP=fuse, refuses: names as
# byte strings (_require_names_are_bytes: 453, 454), the timestamp range (402) and the label's
# longest length (_label_get_max: 492). oleo is btrfs; for FSTYP=fuse with FUSE_SUBTYP=.oleo
# those three functions answer as they do for btrfs. (No-op once fstests knows oleo.)
if ! grep -q '^_oleo_as_btrfs()' "$FST/common/rc"; then
    cat >> "$FST/common/rc" <<'EOF'

# oleo (FSTYP=fuse, FUSE_SUBTYP=.oleo) is btrfs: the filesystem type to answer for.
_oleo_as_btrfs()
{
	if [ "$1" = fuse ] && [ "${FUSE_SUBTYP:-}" = .oleo ]; then echo btrfs; else echo "$1"; fi
}
EOF
fi
# (Each sed below changes nothing once it has been applied.)
# 260 picks its FITRIM arguments by filesystem type: for btrfs (a trim takes any logical
# start, so "beyond the end" is only 2^64-1) as for oleo.
grep -q _oleo_as_btrfs "$FST/tests/generic/260" || sed -i 's/\$FSTYP\b/$(_oleo_as_btrfs $FSTYP)/g' "$FST/tests/generic/260"
# Tests that make and mount a filesystem of their own (a loop device inside the scratch
# filesystem: 361; the scratch device mounted again: 589) call _mkfs_dev, which does
# nothing for FSTYP=fuse, and mount with `-t $FSTYP`, i.e. plain `fuse`, whose helper
# runs the source as a program. For oleo: mkfs.oleo, and `-t fuse.oleo`.
sed -i -e '/^_try_mkfs_dev()$/,/^}$/ s|^\t# do nothing for fuse$|\t[ "${FUSE_SUBTYP:-}" = .oleo ] \&\& [ -n "${OLEO_MKFS:-}" ] \&\& "$OLEO_MKFS" - $*|' \
    -e '/^_mount()$/,/^}$/ s|^    \$MOUNT_PROG \$\*$|    if [ "$FSTYP" = fuse ] \&\& [ "${FUSE_SUBTYP:-}" = .oleo ]; then $MOUNT_PROG $(echo " $* " \| sed "s\| -t fuse \| -t fuse.oleo \|"); else $MOUNT_PROG $*; fi|' \
    "$FST/common/rc"
sed -i -e '/^_require_names_are_bytes() {$/,/^}$/ s|^\( *\)case "\$FSTYP" in$|\1case "$(_oleo_as_btrfs "$FSTYP")" in|' \
    -e '/^_label_get_max()$/,/^}$/ s|^\(\t*\)case \$FSTYP in$|\1case $(_oleo_as_btrfs "$FSTYP") in|' \
    -e '/^_filesystem_timestamp_range()$/,/^}$/ s|^\(\t*\)case \$fstyp in$|\1case $(_oleo_as_btrfs "$fstyp") in|' \
    "$FST/common/rc"
HOOK
sed -i "/^chmod +x \"\$WRAP\"$/r $tmp/mkfs-sized.sh" "$tmp/run"
cat > "$tmp/resize.sh" <<'HOOK'
    if [ -e "$WORK/scratch.sized" ]; then  # a test made a sized scratch filesystem
        rm -f "$WORK/scratch.sized"
        release "$SCRATCH_MNT" "$SCRATCH_IMG"
        [ -b "$SCRATCH_IMG" ] || rm -f "$SCRATCH_IMG"
        "$OLEO" mkfs -f --size "$IMG_SIZE" "$SCRATCH_IMG" >/dev/null || die "oleo mkfs failed"
    fi
HOOK
sed -i "/^    echo \"generic\/\$t \$status \${secs}s\$NOTE\" | tee -a \"\$WORK\/summary.txt\"$/{
r $tmp/resize.sh
}" "$tmp/run"

# FSTESTS_DEVICES=loop: TEST_DEV and SCRATCH_DEV are loop devices over the image files, for the
# tests that need a block device (_require_block_device) or a logical block size below the page
# size (512-byte direct IO: _min_dio_alignment takes the device's). oleo serves a block device
# as it serves an image. The loop devices are detached at the end of the run.
if [ "${FSTESTS_DEVICES:-}" = loop ]; then
    command -v losetup >/dev/null || skip "FSTESTS_DEVICES=loop needs losetup"
    cat > "$tmp/loop.sh" <<'HOOK'
TEST_FILE=$TEST_IMG SCRATCH_FILE=$SCRATCH_IMG
for f in "$TEST_FILE" "$SCRATCH_FILE"; do
    truncate -s "$IMG_SIZE" "$f" || die "cannot make $f"
done
TEST_IMG=$(losetup -f --show "$TEST_FILE") || die "losetup $TEST_FILE failed"
SCRATCH_IMG=$(losetup -f --show "$SCRATCH_FILE") || { losetup -d "$TEST_IMG"; die "losetup $SCRATCH_FILE failed"; }
echo "fstests run: TEST_DEV $TEST_IMG ($TEST_FILE), SCRATCH_DEV $SCRATCH_IMG ($SCRATCH_FILE)"
HOOK
    sed -i '/^SCRATCH_IMG=\$WORK\/img\/scratch.img$/r '"$tmp/loop.sh" "$tmp/run"
    # A device node is formatted in place, never removed; the loop devices go at exit.
    sed -i 's|^    rm -f "\$TEST_IMG" "\$SCRATCH_IMG"$|    for f in "$TEST_IMG" "$SCRATCH_IMG"; do [ -b "$f" ] \|\| rm -f "$f"; done|' "$tmp/run"
    # Before each test fstests wipes a block device given as SCRATCH_DEV (wipefs -a in
    # _try_wipe_scratch_devs), and its _scratch_mkfs for FSTYP=fuse only removes files: on a
    # loop device, the wipe and _scratch_mkfs each leave a new filesystem (mkfs.oleo, as for
    # sized ones).
    cat > "$tmp/loop-mkfs.sh" <<'HOOK'
export OLEO_SCRATCH_MKFS=$IMG_SIZE
grep -q 'OLEO_SCRATCH_MKFS:-}" \] && \[ "\$dev"' "$FST/common/rc" || sed -i '/^_try_wipe_scratch_devs()$/,/^}$/ s|^\t\ttest -b \$dev \&\& \$WIPEFS_PROG -a \$dev$|&\n\t\t[ -n "${OLEO_SCRATCH_MKFS:-}" ] \&\& [ "$dev" = "$SCRATCH_DEV" ] \&\& "$OLEO_MKFS" "$OLEO_SCRATCH_MKFS" $dev >/dev/null|' "$FST/common/rc"
grep -q OLEO_SCRATCH_MKFS "$FST/common/rc" || sed -i '/^_scratch_mkfs()$/,/^}$/ s|^\t\t_scratch_cleanup_files$|\t\tif [ "$FSTYP" = fuse ] \&\& [ -n "${OLEO_SCRATCH_MKFS:-}" ] \&\& [ -b "$SCRATCH_DEV" ]; then "$OLEO_MKFS" "$OLEO_SCRATCH_MKFS" $SCRATCH_DEV >/dev/null \|\| return 1; fi\n\t\t_scratch_cleanup_files|' "$FST/common/rc"
HOOK
    sed -i "/^export OLEO_MKFS=\$WORK\/mkfs.oleo$/r $tmp/loop-mkfs.sh" "$tmp/run"
    # The images kept after a failed check are copies of 8 GiB devices: sparse ones.
    sed -i 's#^        cp "\$\(TEST\|SCRATCH\)_IMG" #        cp --sparse=always "$\1_IMG" #' "$tmp/run"
    grep -q 'cp --sparse=always "\$TEST_IMG"' "$tmp/run" ||
        { echo "fstests: the run script changed; FSTESTS_DEVICES=loop cannot patch it"; echo "fstests: 0 passed, 1 failed"; exit 1; }
    # A test that needs no check of the scratch device (_require_scratch_nocheck) may leave
    # another filesystem on it on purpose (740 runs every mkfs.* there): fstests checks
    # nothing then, and the next test's wipe makes a new one.
    cat > "$tmp/nocheck.sh" <<'HOOK'
        if [ "$img" = "$SCRATCH_IMG" ] && [ -b "$img" ] && grep -q '^_require_scratch_nocheck' "$FST/tests/generic/$t" &&
            [ "$(blkid -p -o value -s TYPE "$img" 2>/dev/null)" != btrfs ]; then
            NOTE+=" [$(basename "$img") left as $(blkid -p -o value -s TYPE "$img" 2>/dev/null || echo no filesystem) by a nocheck test: not checked]"
            continue
        fi
HOOK
    sed -i "/^    for img in \"\\\$TEST_IMG\" \"\\\$SCRATCH_IMG\"; do$/r $tmp/nocheck.sh" "$tmp/run"
    grep -q "by a nocheck test" "$tmp/run" ||
        { echo "fstests: the run script changed; FSTESTS_DEVICES=loop cannot patch it"; echo "fstests: 0 passed, 1 failed"; exit 1; }
    # A device holds the last run's filesystem: its mkfs must be forced.
    sed -i 's|"\$OLEO" mkfs --size|"$OLEO" mkfs -f --size|' "$tmp/run"
    sed -i '/^cleanup() {$/,/^}$/ s|^    release_all$|&\n    [ -b "$TEST_IMG" ] \&\& losetup -d "$TEST_IMG" "$SCRATCH_IMG" 2>/dev/null|' "$tmp/run"
    grep -q 'losetup -d' "$tmp/run" && grep -q '\[ -b "\$f" \]' "$tmp/run" ||
        { echo "fstests: the run script changed; FSTESTS_DEVICES=loop cannot patch it"; echo "fstests: 0 passed, 1 failed"; exit 1; }
fi

# FSTESTS_CAP=SECONDS: every test's time limit (the run gives 150 s, 300 s to a few long
# ones), for surveys of long tests.
if [ -n "${FSTESTS_CAP:-}" ]; then
    sed -i 's|^    case "\$LONG_TESTS" in \*" \$t "\*) cap=300 ;; \*) cap=150 ;; esac$|&\n    cap=$FSTESTS_CAP|' "$tmp/run"
    grep -q '^    cap=\$FSTESTS_CAP$' "$tmp/run" ||
        { echo "fstests: the run script changed; FSTESTS_CAP cannot patch it"; echo "fstests: 0 passed, 1 failed"; exit 1; }
fi

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
# What each unexpected failure printed, for a CI log that is all we keep of the machine: the
# check log (fstests puts the start of the diff against the expected output there) and the
# end of the test's .full.
work=$(realpath -m "${WORK:-/tmp/oleo-fstests}")
for t in $(sed -nE 's/^unexpected:(.*)$/\1/p' "$out" | tail -n 1); do
    echo "--- generic/$t: end of its check log"
    tail -n 30 "$work/logs/$t.check" 2>&1
    echo "--- generic/$t: end of $t.full"
    tail -n 25 "$work/results/generic/$t.full" 2>&1
done
[ "$status" != 0 ] && [ "$failed" = 0 ] && failed=1
echo "fstests: $passed passed, $failed failed, ${known:-0} skipped"
exit "$status"
