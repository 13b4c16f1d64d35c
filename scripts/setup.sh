#!/usr/bin/env bash
# Installs what building and testing oleo needs on a Debian machine (run as root).
set -euo pipefail

packages=(btrfs-progs btrfs-compsize fuse3 libfuse3-dev pkg-config xz-utils zstd attr acl e2fsprogs xfsprogs util-linux kmod python3-venv)
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
    echo "setup: no Rust toolchain: install Rust 1.85 or newer with rustup, then run this again" >&2
    exit 1
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

# Prints the URI of the apt source that serves SUITE's main archive (not -security), read from
# the machine's own apt configuration (deb822 .sources files and one-line .list files).
debian_archive_uri() {
    local suite=$1 f uri=""
    shopt -s nullglob
    for f in /etc/apt/sources.list.d/*.sources; do
        uri=$(awk -v s="$suite" '
            /^[ \t]*$/ { if (ok && uri != "") { print uri; exit } ; uri=""; ok=0; next }
            /^URIs:/ { uri=$2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) ok=1 }
            END { if (ok && uri != "") print uri }' "$f" | head -n1)
        [ -n "$uri" ] && break
    done
    if [ -z "$uri" ]; then
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [ -f "$f" ] || continue
            uri=$(awk -v s="$suite" '$1 == "deb" { sub(/\[[^]]*\] */, ""); if ($3 == s) { print $2; exit } }' "$f")
            [ -n "$uri" ] && break
        done
    fi
    shopt -u nullglob
    printf '%s\n' "$uri"
}

# Debian 12's btrfs-progs (6.2) cannot make block-group-tree images; the tests then use a
# newer mkfs.btrfs unpacked from bookworm-backports beside it (not installed over it: the
# format digest was verified against 6.2's output).
bpo=/opt/btrfs-progs-bpo
if ! mkfs.btrfs -O list-all 2>&1 | grep -q block-group-tree && [ ! -x "$bpo/sbin/mkfs.btrfs" ]; then
    . /etc/os-release
    if [ "${VERSION_CODENAME:-}" = bookworm ]; then
        echo "setup: unpacking btrfs-progs from bookworm-backports into $bpo"
        # The archive this machine already uses for bookworm: backports live beside it.
        uri=$(debian_archive_uri bookworm)
        if [ -z "$uri" ]; then
            echo "setup: no apt source for bookworm found; cannot add bookworm-backports" >&2
        else
            printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                "$uri" > /etc/apt/sources.list.d/bookworm-backports.sources
        fi
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
# Unprivileged mounts (fusermount3) open /dev/fuse as the user: udev makes it 0666 on a normal
# system, some minimal machines leave it 0600.
[ -e /dev/fuse ] && chmod 0666 /dev/fuse
grep -qw btrfs /proc/filesystems || echo "setup: the kernel has no btrfs: kernel comparison tests cannot run" >&2
