"""Reads against the kernel: an image the kernel wrote (compression, subvolumes and
snapshots, holes, preallocation, reflinks, xattrs, ACLs, odd names, every file type) is
read by the kernel (mounted read-only, so nothing moves, not even atimes), unmounted, and
read by oleo; every field of every entry must agree."""

import os
import random
import shutil
import stat
import subprocess

import pytest

import oleo
from conftest import (HostTree, OleoTree, assert_same, kernel_mount, manifest, mkfs_btrfs,
                      need_kernel)


def populate(m):
    """A tree with what kernel btrfs makes on disk: inline, regular, compressed (zlib,
    lzo, zstd), sparse, preallocated, NOCOW and reflinked files, xattrs and ACLs, every
    file type, odd names, a deep path, a big directory, subvolumes and snapshots."""
    rnd = random.Random(20261206)

    def j(*parts):
        return os.path.join(m, *parts)

    def write(path, data):
        with open(path, "wb") as f:
            f.write(data)

    os.mkdir(j(b"plain"))
    write(j(b"plain", b"inline"), b"a small file lives in its inode's leaf\n")
    write(j(b"plain", b"empty"), b"")
    write(j(b"plain", b"4k"), rnd.randbytes(4096))
    write(j(b"plain", b"odd-size"), rnd.randbytes(1_000_003))
    write(j(b"plain", b"big"), rnd.randbytes(9 << 20))
    for algo in (b"zlib", b"lzo", b"zstd"):
        d = j(b"comp-" + algo)
        os.mkdir(d)
        subprocess.run(["btrfs", "property", "set", d, "compression", algo], check=True)
        text = b"".join(b"line %d of a compressible file\n" % i for i in range(200_000))
        write(os.path.join(d, b"text"), text)
        write(os.path.join(d, b"mixed"), text[:300_000] + rnd.randbytes(300_000))
        write(os.path.join(d, b"small"), b"x" * 3000)
    with open(j(b"plain", b"sparse"), "wb") as f:
        f.write(b"head")
        f.seek(20 << 20)
        f.write(b"tail")
        f.seek(50 << 20)
        f.truncate()
    with open(j(b"plain", b"prealloc"), "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 8 << 20)
        f.seek(1 << 20)
        f.write(rnd.randbytes(100_000))
    write(j(b"plain", b"nocow"), b"")
    subprocess.run(["chattr", "+C", j(b"plain", b"nocow")], check=True)
    write(j(b"plain", b"nocow"), rnd.randbytes(3 << 20))
    subprocess.run(["cp", "--reflink=always", j(b"plain", b"big"), j(b"plain", b"reflink")],
                   check=True)
    with open(j(b"plain", b"reflink"), "r+b") as f:
        f.seek(4 << 20)
        f.write(b"changed after the reflink")

    os.mkdir(j(b"names"))
    for name in (b"caf\xe9-latin1", "ünïcødé-名前".encode(), b"sp ace", b"new\nline",
                 b"x" * 255, b"-dash", b".hidden", b"tab\there"):
        write(j(b"names", name), name)
    os.mkdir(j(b"types"))
    os.mkfifo(j(b"types", b"fifo"))
    os.mknod(j(b"types", b"null"), 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(j(b"types", b"blk"), 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    os.symlink(b"../plain/inline", j(b"types", b"rel-link"))
    os.symlink(b"/etc/absolute/target", j(b"types", b"abs-link"))
    os.symlink(b"nowhere", j(b"types", b"dangling"))
    os.symlink(b"y" * 3000, j(b"types", b"long-link"))
    write(j(b"types", b"hard1"), b"three names\n")
    os.link(j(b"types", b"hard1"), j(b"types", b"hard2"))
    os.link(j(b"types", b"hard1"), j(b"plain", b"hard3"))
    os.mkdir(j(b"attrs"))
    write(j(b"attrs", b"x"), b"xattrs\n")
    os.setxattr(j(b"attrs", b"x"), b"user.small", b"v")
    os.setxattr(j(b"attrs", b"x"), b"user.big", rnd.randbytes(3000))
    os.setxattr(j(b"attrs", b"x"), b"trusted.t", b"root only")
    os.setxattr(j(b"attrs"), b"user.on-a-dir", b"yes")
    if shutil.which("setfacl"):
        subprocess.run(["setfacl", "-m", "u:1234:r,g:99:rw", j(b"attrs", b"x")], check=True)
        subprocess.run(["setfacl", "-d", "-m", "u:55:rwx", j(b"attrs")], check=True)
    os.chown(j(b"attrs", b"x"), 1000, 1001)
    os.chmod(j(b"attrs", b"x"), 0o4751)
    os.utime(j(b"attrs", b"x"), ns=(1_000_000_123, 2_000_000_456))
    deep = j(b"deep")
    for i in range(40):
        deep = os.path.join(deep, b"d%d" % i)
    os.makedirs(deep)
    write(os.path.join(deep, b"bottom"), b"bottom\n")
    os.mkdir(j(b"bigdir"))
    for i in range(3000):
        write(j(b"bigdir", b"entry-%05d" % i), b"%d\n" % i)
    for i in range(0, 3000, 3):
        os.unlink(j(b"bigdir", b"entry-%05d" % i))

    subprocess.run(["btrfs", "-q", "subvolume", "create", j(b"sv")], check=True)
    write(j(b"sv", b"in-subvol"), rnd.randbytes(200_000))
    os.mkdir(j(b"sv", b"inner"))
    subprocess.run(["btrfs", "-q", "subvolume", "create", j(b"sv", b"nested")], check=True)
    write(j(b"sv", b"nested", b"f"), b"nested subvolume\n")
    subprocess.run(["btrfs", "-q", "subvolume", "snapshot", j(b"sv"), j(b"snap")], check=True)
    subprocess.run(["btrfs", "-q", "subvolume", "snapshot", "-r", j(b"sv"), j(b"snap-ro")],
                   check=True)
    with open(j(b"sv", b"in-subvol"), "r+b") as f:
        f.write(b"changed after the snapshots")
    write(j(b"snap", b"only-in-snap"), b"snap\n")
    os.sync()


@pytest.fixture(scope="module")
def kernel_image(tmp_path_factory):
    need_kernel()
    image = str(tmp_path_factory.mktemp("kimg") / "kernel.img")
    mkfs_btrfs(image, 1 << 30)
    with kernel_mount(image) as m:
        populate(m)
    return image


def test_every_entry_as_the_kernel_reads_it(kernel_image):
    with kernel_mount(kernel_image, "ro") as m:
        want = manifest(HostTree(m))
    with oleo.open(kernel_image) as fs:
        got = manifest(OleoTree(fs))
    # A nested subvolume shows in a snapshot of its parent as an empty directory that has
    # no inode on disk (BTRFS_EMPTY_SUBVOL_DIR_OBJECTID, 2): the kernel gives it the time
    # it made it in memory, oleo the epoch; neither is in the image.
    for man in (want, got):
        for rec in man.values():
            if rec["ino"] == 2:
                for k in ("atime", "mtime", "ctime"):
                    rec[k] = None
    assert len(want) > 2000
    assert_same(got, want, "oleo against the kernel")


def test_walk_scandir_and_stat_agree_with_os(kernel_image):
    with kernel_mount(kernel_image, "ro") as m:
        root = m.decode("utf-8", "surrogateescape")
        want = []
        for top, dirs, files in os.walk(root):
            rel = "/" if top == root else "/" + os.path.relpath(top, root)
            want.append((rel, sorted(dirs), sorted(files)))
        # (long-link's 3000-byte target cannot be followed: ENAMETOOLONG.)
        with os.scandir(os.path.join(root, "types")) as it:
            links = {e.name: e.is_dir() for e in it if e.name != "long-link"}
        st = os.stat(os.path.join(root, "types", "rel-link"))
    with oleo.open(kernel_image) as fs:
        got = [(top, sorted(dirs), sorted(files)) for top, dirs, files in fs.walk("/")]
        assert sorted(got) == sorted(want)
        with fs.scandir("/types") as it:
            assert {e.name: e.is_dir() for e in it if e.name != "long-link"} == links
        long_link = next(e for e in fs.scandir("/types") if e.name == "long-link")
        with pytest.raises(OSError) as err:
            long_link.is_dir()
        assert err.value.errno == 36
        ost = fs.stat("/types/rel-link")
        assert (ost.st_ino, ost.st_size, ost.st_mode) == (st.st_ino, st.st_size, st.st_mode)
        # Bottom-up lists every directory after what is under it.
        order = [top for top, _, _ in fs.walk("/deep", topdown=False)]
        assert order[-1] == "/deep" and len(order) == 41


def test_file_objects_read_seek_and_readinto(kernel_image):
    with kernel_mount(kernel_image, "ro") as m:
        with open(os.path.join(m, b"comp-zstd", b"mixed"), "rb") as f:
            want = f.read()
    with oleo.open(kernel_image) as fs:
        with fs.open("/comp-zstd/mixed", "rb") as f:
            assert isinstance(f, __import__("io").BufferedReader)
            assert f.read(10) == want[:10]
            f.seek(-5, 2)
            assert f.read() == want[-5:]
            f.seek(123_457)
            buf = bytearray(70_000)
            assert f.readinto(buf) == 70_000
            assert bytes(buf) == want[123_457:193_457]
            assert f.tell() == 193_457
        with fs.open("/comp-zstd/mixed", "rb", buffering=0) as raw:
            view = memoryview(bytearray(len(want) + 10))
            n = raw.readinto(view)
            assert bytes(view[:n]) == want[:n] and n > 0
        with fs.open("/plain/inline", "r") as t:
            assert t.read() == "a small file lives in its inode's leaf\n"


def test_subvolumes_as_btrfs_lists_them(kernel_image):
    with kernel_mount(kernel_image, "ro") as m:
        out = subprocess.run(["btrfs", "subvolume", "list", "-a", "-u", m.decode()],
                             capture_output=True, text=True, check=True).stdout
        ro = {}
        for path in ("sv", "snap", "snap-ro", "sv/nested"):
            prop = subprocess.run(["btrfs", "property", "get", "-ts",
                                   os.path.join(m.decode(), path), "ro"],
                                  capture_output=True, text=True, check=True).stdout
            ro[path] = prop.strip() == "ro=true"
    want = {}
    for line in out.splitlines():
        w = line.split()
        want[w[-1].replace("<FS_TREE>/", "")] = (int(w[1]), w[w.index("uuid") + 1])
    with oleo.open(kernel_image) as fs:
        subs = fs.subvolumes()
    got = {s["path"]: (s["id"], s["uuid"]) for s in subs}
    assert got == want
    assert {s["path"]: s["readonly"] for s in subs} == ro
    snap = next(s for s in subs if s["path"] == "snap-ro")
    assert snap["parent_uuid"] == want["sv"][1]


def test_open_a_subvolume(kernel_image):
    with oleo.open(kernel_image, subvol="sv") as fs:
        assert sorted(fs.listdir("/")) == ["in-subvol", "inner", "nested"]
        assert fs.read_bytes("/nested/f") == b"nested subvolume\n"
        assert fs.stat("/..").st_ino == 256
