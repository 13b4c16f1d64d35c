"""Fixtures of the binding's tests: images made by mkfs.btrfs and the kernel, kernel
mounts, and one description ("manifest") of a tree, built the same way from a kernel
mount, a host directory, or oleo, so that they compare field by field."""

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

import oleo

IN_CI = os.environ.get("CI") == "true"


def need(what, ok):
    """Skips when `ok` is false, with a message; under CI=true that is a failure."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"needs {what}, which CI must have")
    pytest.skip(f"needs {what}")


def have_kernel_btrfs():
    if os.geteuid() != 0 or shutil.which("mkfs.btrfs") is None:
        return False
    with open("/proc/filesystems") as f:
        if "btrfs" in f.read():
            return True
    return subprocess.run(["modprobe", "btrfs"], capture_output=True).returncode == 0


def need_kernel():
    need("root, mkfs.btrfs and kernel btrfs", have_kernel_btrfs())


def need_progs():
    need("mkfs.btrfs (btrfs-progs)", shutil.which("mkfs.btrfs") is not None)


def mkfs_btrfs(path, size=512 << 20, *args):
    with open(path, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.btrfs", "-q", "-f", *args, path], check=True,
                   capture_output=True)


@contextlib.contextmanager
def kernel_mount(image, *options):
    """The image mounted by the kernel on a loop device; unmounted on exit."""
    mnt = tempfile.mkdtemp(prefix="oleo-py-mnt-")
    opts = ",".join(("loop",) + options)
    subprocess.run(["mount", "-t", "btrfs", "-o", opts, image, mnt], check=True)
    try:
        yield mnt.encode()
    finally:
        subprocess.run(["umount", mnt], check=True)
        os.rmdir(mnt)


def btrfs_check(image):
    r = subprocess.run(["btrfs", "check", "--check-data-csum", image],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"btrfs check failed:\n{r.stdout}\n{r.stderr}"


class HostTree:
    """The os module's calls on a host directory (a kernel mount or a plain directory),
    in FileSystem's shape, for `manifest`."""

    def __init__(self, root):
        self.root = root if isinstance(root, bytes) else os.fsencode(root)

    def _p(self, path):
        return self.root + path

    def listdir(self, path):
        return os.listdir(self._p(path))

    def lstat(self, path):
        return os.lstat(self._p(path))

    def readlink(self, path):
        return os.readlink(self._p(path))

    def xattrs(self, path):
        p = self._p(path)
        return {os.fsencode(n): os.getxattr(p, n, follow_symlinks=False)
                for n in os.listxattr(p, follow_symlinks=False)}

    def content(self, path):
        with open(self._p(path), "rb") as f:
            return f.read()


class OleoTree:
    """The same calls through an open oleo FileSystem."""

    def __init__(self, fs):
        self.fs = fs

    def listdir(self, path):
        return self.fs.listdir(path)

    def lstat(self, path):
        return self.fs.lstat(path)

    def readlink(self, path):
        return self.fs.readlink(path)

    def xattrs(self, path):
        return {os.fsencode(n): self.fs.getxattr(path, n, follow_symlinks=False)
                for n in self.fs.listxattr(path, follow_symlinks=False)}

    def content(self, path):
        return self.fs.read_bytes(path)


ALL_FIELDS = ("mode", "ino", "nlink", "uid", "gid", "size", "blocks", "rdev", "atime",
              "mtime", "ctime", "xattrs", "target", "sha256")


def manifest(tree, fields=ALL_FIELDS, skip_xattr=lambda name: False):
    """Every entry under the root: path -> the chosen fields (file contents as sha256)."""
    out = {}
    stack = [b"/"]
    while stack:
        d = stack.pop()
        for name in sorted(tree.listdir(d)):
            p = d + name if d.endswith(b"/") else d + b"/" + name
            st = tree.lstat(p)
            rec = {
                "mode": st.st_mode, "ino": st.st_ino, "nlink": st.st_nlink,
                "uid": st.st_uid, "gid": st.st_gid,
                "size": st.st_size if not stat.S_ISDIR(st.st_mode) else None,
                "blocks": st.st_blocks, "rdev": st.st_rdev,
                "atime": st.st_atime_ns, "mtime": st.st_mtime_ns, "ctime": st.st_ctime_ns,
            }
            rec["xattrs"] = {k: v for k, v in tree.xattrs(p).items() if not skip_xattr(k)}
            if stat.S_ISLNK(st.st_mode):
                rec["target"] = tree.readlink(p)
            if stat.S_ISREG(st.st_mode):
                rec["sha256"] = hashlib.sha256(tree.content(p)).hexdigest()
            if stat.S_ISDIR(st.st_mode):
                stack.append(p)
            out[p] = {k: v for k, v in rec.items() if k in fields}
    return out


def assert_same(got, want, what):
    """Equal manifests, or an error that names the first entries and fields that differ."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, f"{what}: missing {missing[:5]}, extra {extra[:5]}"
    diffs = []
    for p in sorted(want):
        for k in want[p]:
            if got[p].get(k) != want[p][k]:
                diffs.append(f"{p!r} {k}: {got[p].get(k)!r} != {want[p][k]!r}")
    assert not diffs, f"{what}: {len(diffs)} differences:\n" + "\n".join(diffs[:20])


@pytest.fixture
def tmp_image(tmp_path):
    """A fresh 512 MiB image made by oleo.mkfs (no root needed)."""
    path = tmp_path / "disk.img"
    oleo.mkfs(path, 512 << 20)
    return path
