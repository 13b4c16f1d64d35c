#!/usr/bin/env bash
# Installs what building and testing oleo needs on a Debian machine (run as root).
set -euo pipefail

packages=(btrfs-progs fuse3 libfuse3-dev pkg-config xz-utils attr acl e2fsprogs util-linux kmod)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: no Rust toolchain; installing one with rustup (needs network access to rustup.rs)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl ca-certificates >/dev/null
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# The kernel pieces the tests compare against.
modprobe btrfs 2>/dev/null || true
modprobe fuse 2>/dev/null || true
modprobe loop 2>/dev/null || true
[ -e /dev/fuse ] || { echo "setup: /dev/fuse is missing: FUSE tests cannot run" >&2; }
grep -qw btrfs /proc/filesystems || echo "setup: the kernel has no btrfs: kernel comparison tests cannot run" >&2
