"""Hostile images raise, never crash or hang the interpreter: btrfs-progs' damaged fsck
images and seeded corruptions of a fresh image are walked and read in a child
interpreter, which must end normally (an OSError is a fine answer; a signal or a
timeout is not)."""

import os
import random
import subprocess
import sys
import tarfile
import pathlib

import pytest

import oleo
from conftest import need

FSCK = pathlib.Path(os.environ.get(
    "OLEO_FSCK_IMAGES",
    pathlib.Path(__file__).resolve().parents[4] / "shared/test-images/btrfs-progs-fsck"))

CHILD = r"""
import sys, oleo
errors = 0
try:
    with oleo.open(sys.argv[1]) as fs:
        for top, dirs, files in fs.walk("/", onerror=lambda e: None):
            for name in files + dirs:
                path = top.rstrip("/") + "/" + name
                try:
                    st = fs.lstat(path)
                    fs.listxattr(path, follow_symlinks=False)
                    if (st.st_mode & 0o170000) == 0o100000:
                        fs.read_bytes(path)
                    elif (st.st_mode & 0o170000) == 0o120000:
                        fs.readlink(path)
                except OSError:
                    errors += 1
        fs.subvolumes()
        fs.statvfs()
except OSError as e:
    print("open:", type(e).__name__, e)
print("errors:", errors)
"""


def run_child(image):
    r = subprocess.run([sys.executable, "-c", CHILD, str(image)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"{image}: exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout


def unxz_sparse(src, dest):
    """Decompresses an .xz image, leaving its zero blocks as holes."""
    import lzma

    zero = bytes(1 << 20)
    size = 0
    with lzma.open(src) as i, open(dest, "wb") as o:
        while True:
            chunk = i.read(1 << 20)
            if not chunk:
                break
            if chunk == zero[:len(chunk)]:
                o.seek(len(chunk), 1)
            else:
                o.write(chunk)
            size += len(chunk)
        o.truncate(size)


def fsck_images(tmp):
    out = []
    for case in sorted(FSCK.iterdir()):
        for f in sorted(case.iterdir()):
            if f.suffix == ".img":
                out.append(f)
            elif f.name.endswith((".img.xz", ".raw.xz")):
                dest = tmp / case.name / f.name[:-3]
                dest.parent.mkdir(parents=True, exist_ok=True)
                unxz_sparse(f, dest)
                out.append(dest)
            elif f.name.endswith(".tar.xz"):
                dest = tmp / case.name / f.name[:-7]
                dest.mkdir(parents=True)
                with tarfile.open(f) as t:
                    t.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") \
                        else t.extractall(dest)
                out.extend(sorted(p for p in dest.rglob("*") if p.is_file()))
    return out


def test_damaged_fsck_images(tmp_path):
    need(f"btrfs-progs' fsck images in {FSCK}", FSCK.is_dir())
    images = fsck_images(tmp_path)
    assert len(images) > 70
    for image in images:
        run_child(image)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_seeded_corruptions(tmp_path, seed):
    base = tmp_path / "base.img"
    oleo.mkfs(base, 256 << 20)
    with oleo.open(base, "w") as fs:
        for d in range(20):
            fs.mkdir(f"/d{d}")
            for i in range(40):
                with fs.open(f"/d{d}/f{i}", "wb") as f:
                    f.write(bytes([i]) * (i * 300))
                fs.setxattr(f"/d{d}/f{i}", "user.x", b"v" * i)
    data = bytearray(base.read_bytes())
    rnd = random.Random(seed)
    # Flip bytes inside the first 40 MiB (superblock copy, system and metadata chunks).
    for _ in range(8):
        bad = bytearray(data)
        for _ in range(rnd.choice([1, 4, 64])):
            pos = rnd.randrange(0x10000, min(len(bad), 40 << 20))
            bad[pos] ^= rnd.randrange(1, 256)
        image = tmp_path / "bad.img"
        image.write_bytes(bad)
        run_child(image)
