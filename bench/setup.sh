#!/usr/bin/env bash
# Installs what the benchmark harness drives. Idempotent: fast when all is present.
#   apt:   fio dbench fsmark (real fs_mark) btrfs-progs xfsprogs e2fsprogs fuse2fs
#          zfs-fuse fuse3 fuse-overlayfs python3-matplotlib, plus libclang-dev/libfuse3-dev/pkg-config
#          which btrfs-fuse's build needs (bindgen, fuser), and bc and zstd for the shell
#          benchmarks (mkfs-rootdir.sh, offline-fill.sh)
#   cargo: btrfs-fuse (rustutils/btrfsutils), the read-only Rust peer
# A failure of the btrfs-fuse build is reported but not fatal: the harness then
# records btrfs-fuse as N/A.
set -u
export DEBIAN_FRONTEND=noninteractive

pkgs=(fio dbench fsmark btrfs-progs xfsprogs e2fsprogs fuse2fs zfs-fuse fuse3 fuse-overlayfs
      python3-matplotlib python3-pytest libclang-dev libfuse3-dev pkg-config bc zstd)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: apt-get install ${missing[*]}"
    apt-get update -qq || exit 1
    apt-get install -y -qq "${missing[@]}" >/dev/null || exit 1
fi

# zfs-fuse's package starts a system daemon; the harness starts its own per
# measurement and refuses to share, so stop and disable the system one.
if command -v systemctl >/dev/null && systemctl is-active -q zfs-fuse 2>/dev/null; then
    systemctl disable --now zfs-fuse >/dev/null 2>&1 || true
fi
[ -x /etc/init.d/zfs-fuse ] && /etc/init.d/zfs-fuse stop >/dev/null 2>&1 || true

export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v btrfs-fuse >/dev/null; then
    if command -v cargo >/dev/null; then
        echo "setup: cargo install btrfs-fuse (a few minutes)"
        cargo install --locked btrfs-fuse >/tmp/btrfs-fuse-install.log 2>&1 \
            || echo "setup: cargo install btrfs-fuse failed (see /tmp/btrfs-fuse-install.log); btrfs-fuse will be N/A"
    else
        echo "setup: cargo not found; btrfs-fuse will be N/A"
    fi
fi

modprobe loop 2>/dev/null || true
modprobe fuse 2>/dev/null || true
modprobe btrfs 2>/dev/null || true
modprobe xfs 2>/dev/null || true

echo "setup: done"
for t in fio dbench fs_mark mkfs.btrfs mkfs.xfs mkfs.ext4 fuse2fs zfs-fuse fuse-overlayfs btrfs-fuse; do
    printf '  %-11s %s\n' "$t" "$(command -v "$t" || echo MISSING)"
done
/usr/bin/python3 -c 'import matplotlib; print("  matplotlib ", matplotlib.__version__)' 2>/dev/null \
    || echo "  matplotlib  MISSING (no plots)"
