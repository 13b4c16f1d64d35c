#!/usr/bin/env bash
# Builds oleo, makes a demo btrfs image with mkfs.btrfs and the kernel (unless one is given),
# mounts it with oleo and shows it.   usage: scripts/demo.sh [IMAGE] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p oleo-cli
oleo=$PWD/target/release/oleo

image="" keep=0
for a in "$@"; do
    case "$a" in --keep) keep=1 ;; *) image=$a ;; esac
done
work=/tmp/oleo-demo
mkdir -p "$work/mnt" "$work/kernel"
if [ -z "$image" ]; then
    image=$work/demo.img
    echo "== making a demo image at $image with mkfs.btrfs and the kernel"
    rm -f "$image"; truncate -s 512M "$image"
    mkfs.btrfs -q -f "$image"
    mount -o loop,compress=zstd "$image" "$work/kernel"
    (
        cd "$work/kernel"
        echo "hello from btrfs" > hello.txt
        setfattr -n user.greeting -v "written by the kernel" hello.txt
        mkdir -p docs/deep/er; seq 1 100000 > docs/numbers.txt
        ln -s ../hello.txt docs/link-to-hello
        head -c 8M /dev/urandom > random.bin
        btrfs -q subvolume create projects
        echo "inside a subvolume" > projects/readme
        btrfs -q subvolume snapshot -r projects projects-snapshot
    )
    umount "$work/kernel"
fi

# First lines of a listing: sed reads it all, so the writer never dies of SIGPIPE (with
# pipefail a `| head` fails the script on any listing longer than the head).
first() { sed -n "1,${1}p"; }
echo "== oleo dump-super $image (first lines)"
"$oleo" dump-super "$image" | first 12
echo "== oleo mount $image $work/mnt"
if mountpoint -q "$work/mnt" || ! stat "$work/mnt" >/dev/null 2>&1; then
    fusermount3 -u "$work/mnt" || umount -l "$work/mnt"
fi
"$oleo" mount "$image" "$work/mnt"
trap '[ $keep = 1 ] || fusermount3 -u "$work/mnt"' EXIT
grep " $work/mnt " /proc/mounts
echo "== ls -la"; ls -la "$work/mnt" | first 40
entries=$(find "$work/mnt" | wc -l)
echo "== find (first 30 of $entries entries)"; find "$work/mnt" | first 30
if [ -f "$work/mnt/hello.txt" ]; then
    echo "== cat hello.txt"; cat "$work/mnt/hello.txt"
    echo "== getfattr -d hello.txt"; getfattr -d "$work/mnt/hello.txt"
fi
echo "== df"; df -h "$work/mnt"
if [ $keep = 1 ]; then echo "left mounted at $work/mnt (unmount with: fusermount3 -u $work/mnt)"; fi
