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

# pjdfstest (the Rust POSIX test suite from crates.io), run against an oleo mount by
# crates/cli/tests/pjdfstest.rs. It switches to two unprivileged users, nobody:nogroup and
# tests:tests (see crates/cli/tests/pjdfstest.toml); Debian has the first, not the second.
if ! command -v pjdfstest >/dev/null 2>&1; then
    echo "setup: installing pjdfstest (cargo install)"
    cargo install --locked pjdfstest
fi
getent group tests >/dev/null || groupadd --system tests
getent passwd tests >/dev/null ||
    useradd --system --gid tests --no-create-home --home-dir / --shell /usr/sbin/nologin tests

# Debian 12's btrfs-progs (6.2) cannot make block-group-tree images; the tests then use a
# newer mkfs.btrfs unpacked from bookworm-backports beside it (not installed over it: the
# format digest was verified against 6.2's output).
bpo=/opt/btrfs-progs-bpo
if ! mkfs.btrfs -O list-all 2>&1 | grep -q block-group-tree && [ ! -x "$bpo/sbin/mkfs.btrfs" ]; then
    . /etc/os-release
    if [ "${VERSION_CODENAME:-}" = bookworm ]; then
        echo "setup: unpacking btrfs-progs from bookworm-backports into $bpo"
        cat > /etc/apt/sources.list.d/bookworm-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
        apt-get update -qq
        tmp=$(mktemp -d)
        (cd "$tmp" && apt-get download -qq btrfs-progs/bookworm-backports && dpkg-deb -x btrfs-progs_*.deb "$bpo")
        rm -rf "$tmp"
    fi
fi

# The kernel pieces the tests compare against.
modprobe btrfs 2>/dev/null || true
modprobe fuse 2>/dev/null || true
modprobe loop 2>/dev/null || true
[ -e /dev/fuse ] || { echo "setup: /dev/fuse is missing: FUSE tests cannot run" >&2; }
grep -qw btrfs /proc/filesystems || echo "setup: the kernel has no btrfs: kernel comparison tests cannot run" >&2
