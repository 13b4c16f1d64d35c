#!/usr/bin/env bash
# Builds oleo and installs it: the binary in $PREFIX/bin (default /usr/local), and the
# mount(8) helper mount.fuse.oleo beside the system's other mount helpers, so that
# `mount -t fuse.oleo`, fstab lines and `mount -o remount,ro` reach oleo. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${PREFIX:-/usr/local}
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p oleo-cli
install -D -m 0755 target/release/oleo "$prefix/bin/oleo"
# mount(8) looks in /sbin (on merged-/usr systems the same directory as /usr/sbin).
for dir in /sbin /usr/sbin; do
    [ -d "$dir" ] || continue
    ln -sfn "$prefix/bin/oleo" "$dir/mount.fuse.oleo"
done
# Unprivileged mounts go through fusermount3, which opens /dev/fuse as the user.
if [ -e /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
    echo "install: note: /dev/fuse is mode $(stat -c %a /dev/fuse); users can mount only if it is 0666" >&2
fi
echo "installed $prefix/bin/oleo and mount.fuse.oleo"
