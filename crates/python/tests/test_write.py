"""Writes against the kernel: the same operations go through oleo's binding into an image
made by mkfs.btrfs and through the os module into a host directory (the reference).
After close, the kernel mounts the image: what it reads must equal the reference, what
oleo reads must equal what the kernel reads, and `btrfs check --check-data-csum` must
find nothing. The random sequences are seeded (OLEO_PY_SEEDS=1,2,... to explore)."""

import ctypes
import errno
import os
import random
import stat

import pytest

import oleo
from conftest import (HostTree, OleoTree, assert_same, btrfs_check, kernel_mount, manifest,
                      mkfs_btrfs, need_kernel, need_progs)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def host_fallocate(fd, mode, offset, length):
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Host:
    """The reference: each operation through the os module, on a host directory."""

    def __init__(self, root):
        self.root = root

    def p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def write(self, path, offset, data, mode):
        flags = {"w": os.O_CREAT | os.O_TRUNC | os.O_WRONLY, "r+": os.O_RDWR,
                 "a": os.O_CREAT | os.O_APPEND | os.O_WRONLY}[mode]
        fd = os.open(self.p(path), flags, 0o644)
        try:
            if mode != "a":
                os.lseek(fd, offset, os.SEEK_SET)
            os.write(fd, data)
        finally:
            os.close(fd)

    def truncate(self, path, size):
        os.truncate(self.p(path), size)

    def fallocate(self, path, mode, offset, length):
        fd = os.open(self.p(path), os.O_RDWR)
        try:
            host_fallocate(fd, mode, offset, length)
        finally:
            os.close(fd)

    def copy(self, src, dst, so, do, n):
        a = os.open(self.p(src), os.O_RDONLY)
        if stat.S_ISDIR(os.fstat(a).st_mode):
            # As the built-in open() the image side uses.
            os.close(a)
            raise IsADirectoryError(errno.EISDIR, "Is a directory", src)
        try:
            b = os.open(self.p(dst), os.O_RDWR)
        except OSError:
            os.close(a)
            raise
        try:
            done = 0
            while done < n:
                k = os.copy_file_range(a, b, n - done, so + done, do + done)
                if k == 0:
                    break
                done += k
            return done
        finally:
            os.close(a)
            os.close(b)

    def symlink(self, target, path):
        os.symlink(target, self.p(path))

    def __getattr__(self, name):
        f = getattr(os, name)

        def call(*paths_then_args, **kw):
            args = [self.p(a) if isinstance(a, str) and a.startswith("/") else a
                    for a in paths_then_args]
            return f(*args, **kw)
        return call


class Image:
    """The same operations through oleo."""

    def __init__(self, fs):
        self.fs = fs

    def write(self, path, offset, data, mode):
        with self.fs.open(path, {"w": "wb", "r+": "r+b", "a": "ab"}[mode]) as f:
            if mode != "a":
                f.seek(offset)
            f.write(data)

    def truncate(self, path, size):
        self.fs.truncate(path, size)

    def fallocate(self, path, mode, offset, length):
        with self.fs.open(path, "r+b", buffering=0) as f:
            self.fs.fallocate(f, offset, length, mode)

    def copy(self, src, dst, so, do, n):
        with self.fs.open(src, "rb", buffering=0) as a, \
                self.fs.open(dst, "r+b", buffering=0) as b:
            done = 0
            while done < n:
                k = self.fs.copy_file_range(a, b, n - done, so + done, do + done)
                if k == 0:
                    break
                done += k
            return done

    def __getattr__(self, name):
        return getattr(self.fs, name)


def outcome(f, *args, **kw):
    try:
        return ("ok", f(*args, **kw))
    except OSError as e:
        return ("err", e.errno)


def run_ops(seed, host, image, n):
    """n random operations on both; each must succeed or fail alike."""
    rnd = random.Random(seed)
    files, dirs, links = ["/f0"], ["/"], []
    for side in (host, image):
        side.write("/f0", 0, b"seed file\n", "w")

    def new_name(d):
        return (d.rstrip("/") + "/n%d" % rnd.randrange(10**6))

    def pick(seq):
        return rnd.choice(seq)

    for step in range(n):
        op = rnd.choice(["create", "create", "write", "append", "truncate", "fallocate",
                         "punch", "zero", "copy", "mkdir", "rename", "link", "unlink",
                         "rmdir", "symlink", "chmod", "chown", "utime", "setxattr",
                         "removexattr", "mkfifo"])
        if op == "create":
            path = new_name(pick(dirs))
            data = rnd.randbytes(rnd.choice([0, 1, 100, 4095, 4096, 5000, 70_000, 300_000]))
            args = ("write", path, 0, data, "w")
            files.append(path)
        elif op in ("write", "append"):
            data = rnd.randbytes(rnd.choice([1, 512, 4096, 9000, 200_000]))
            off = rnd.choice([0, 1, 4096, 6000, 1 << 20])
            args = ("write", pick(files), off, data, "r+" if op == "write" else "a")
        elif op == "truncate":
            args = ("truncate", pick(files), rnd.choice([0, 1, 4096, 10_000, 3 << 20]))
        elif op in ("fallocate", "punch", "zero"):
            mode = {"fallocate": rnd.choice([0, oleo.FALLOC_FL_KEEP_SIZE]),
                    "punch": oleo.FALLOC_FL_PUNCH_HOLE | oleo.FALLOC_FL_KEEP_SIZE,
                    "zero": rnd.choice([0, 1]) | oleo.FALLOC_FL_ZERO_RANGE}[op]
            off = rnd.choice([0, 4096, 5000, 65536])
            args = ("fallocate", pick(files), mode, off, rnd.choice([4096, 10_000, 1 << 20]))
        elif op == "copy":
            args = ("copy", pick(files), pick(files), rnd.choice([0, 4096]),
                    rnd.choice([0, 4096, 8192, 100_000]), rnd.choice([4096, 65536, 1 << 20]))
        elif op == "mkdir":
            path = new_name(pick(dirs))
            args = ("mkdir", path, rnd.choice([0o755, 0o700, 0o1777]))
            dirs.append(path)
        elif op == "rename":
            src = pick(files + dirs[1:]) if len(dirs) > 1 else pick(files)
            dst = pick(files) if rnd.random() < 0.3 else new_name(pick(dirs))
            args = ("rename", src, dst)
        elif op == "link":
            path = new_name(pick(dirs))
            args = ("link", pick(files), path)
            files.append(path)
        elif op == "unlink":
            args = ("unlink", pick(files + links))
        elif op == "rmdir":
            args = ("rmdir", pick(dirs[1:])) if len(dirs) > 1 else ("rmdir", "/nonexistent")
        elif op == "symlink":
            path = new_name(pick(dirs))
            args = ("symlink", pick(files + ["../x", "/abs/target", "a" * 500]), path)
            links.append(path)
        elif op == "chmod":
            args = ("chmod", pick(files + dirs[1:] or files), rnd.choice([0o600, 0o4755, 0o640]))
        elif op == "chown":
            args = ("chown", pick(files), rnd.choice([0, 1000]), rnd.choice([0, 50, -1]))
        elif op == "utime":
            t = rnd.randrange(10**18)
            args = ("utime", pick(files + dirs[1:] or files))
            kw = {"ns": (t, t + rnd.randrange(10**9))}
            results = [outcome(getattr(side, "utime"), *args[1:], **kw)
                       for side in (host, image)]
            assert results[0][0] == results[1][0], (seed, step, args, results)
            continue
        elif op == "setxattr":
            # Small enough for ext4's one block of xattrs on the host side.
            args = ("setxattr", pick(files), "user.k%d" % rnd.randrange(2),
                    rnd.randbytes(rnd.choice([0, 10, 1000])))
        elif op == "removexattr":
            args = ("removexattr", pick(files), "user.k%d" % rnd.randrange(2))
        else:
            path = new_name(pick(dirs))
            args = ("mkfifo", path)
        results = []
        for side in (host, image):
            results.append(outcome(getattr(side, args[0]), *args[1:]))
        got, want = results[1], results[0]
        if args[0] == "copy" and want[0] == "ok":
            # Both copied; how much at once is each filesystem's own choice.
            continue
        assert got == want, f"seed {seed} step {step}: {args[0]}{args[1:3]}: " \
                            f"oleo {got}, os {want}"


SEEDS = [int(s) for s in os.environ.get("OLEO_PY_SEEDS", "1,2,3").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_operations_as_the_kernel_reads_them(seed, tmp_path):
    need_kernel()
    image = str(tmp_path / "w.img")
    mkfs_btrfs(image, 1 << 30)
    ref = tmp_path / "ref"
    ref.mkdir()
    os.chmod(ref, 0o755)
    with oleo.open(image, "w") as fs:
        fs.chmod("/", 0o755)
        run_ops(seed, Host(str(ref)), Image(fs), 400)
    # Times move at other instants on the two sides (test_a_scripted_session checks the
    # times utime sets); a directory's nlink is 1 in btrfs, 2 and more in ext4.
    fields = ("mode", "nlink", "uid", "gid", "size", "xattrs", "target", "sha256")

    def comparable(man):
        out = {}
        for p, r in man.items():
            r = {k: v for k, v in r.items() if k in fields}
            r["xattrs"] = {k: v for k, v in r["xattrs"].items() if k.startswith(b"user.")}
            if stat.S_ISDIR(r["mode"]):
                del r["nlink"]
            out[p] = r
        return out
    want = comparable(manifest(HostTree(str(ref))))
    with kernel_mount(image, "ro") as m:
        kernel_all = manifest(HostTree(m))
    assert_same(comparable(kernel_all), want, f"seed {seed}: the kernel's reading against os's")
    with oleo.open(image) as fs:
        again = manifest(OleoTree(fs))
    assert_same(again, kernel_all, f"seed {seed}: oleo's reading against the kernel's")
    btrfs_check(image)


def test_a_scripted_session(tmp_path):
    """Every call of the API once, the result read back by the kernel."""
    need_kernel()
    image = str(tmp_path / "s.img")
    mkfs_btrfs(image, 1 << 30)
    with oleo.open(image, "w") as fs:
        fs.makedirs("/a/b/c")
        fs.makedirs("/a/b/c", exist_ok=True)
        with fs.open("/a/b/c/text.txt", "w", encoding="utf-8") as f:
            f.write("héllo\n" * 1000)
        with fs.open("/a/b/c/text.txt", "a") as f:
            f.write("appended\n")
        with fs.open("/bin.dat", "wb") as f:
            f.write(b"\0" * 10 + bytes(range(256)) * 1000)
        with fs.open("/bin.dat", "r+b") as f:
            f.seek(5)
            f.write(b"XYZ")
            f.truncate(200_000)
        with fs.open("/excl", "x") as f:
            f.write("made by x")
        fs.symlink("a/b/c/text.txt", "/link")
        fs.link("/bin.dat", "/bin-hard")
        fs.rename("/excl", "/a/moved")
        fs.chmod("/a/moved", 0o640)
        fs.chown("/a/moved", 4242, 4343)
        fs.utime("/a/moved", ns=(1_234_567_890_123_456_789, 1_700_000_000_000_000_001))
        fs.setxattr("/a/moved", "user.note", b"kept")
        fs.setxattr("/a/moved", "user.gone", b"removed")
        fs.removexattr("/a/moved", "user.gone")
        fs.mkfifo("/fifo")
        with fs.open("/pre", "wb", buffering=0) as f:
            fs.fallocate(f, 0, 1 << 20)
            f.seek(4096)
            f.write(b"in preallocated space")
        with fs.open("/bin.dat", "rb", buffering=0) as a, fs.open("/copy", "wb", buffering=0) as b:
            assert fs.copy_file_range(a, b, 200_000) == 200_000
        sub = fs.create_subvolume("/vol")
        with fs.open("/vol/inside", "wb") as f:
            f.write(b"in a subvolume")
        snap = fs.snapshot("/vol", "/vol-snap", readonly=True)
        assert snap > sub >= 256
        fs.unlink("/bin-hard")
        fs.mkdir("/gone")
        fs.rmdir("/gone")
        with fs.open("/unlinked-while-open", "wb") as f:
            fs.unlink("/unlinked-while-open")
            f.write(b"still writable")
        assert fs.read_text("/link") == "héllo\n" * 1000 + "appended\n"
    with kernel_mount(image, "ro") as m:
        def rd(p):
            with open(os.path.join(m, p), "rb") as f:
                return f.read()
        assert rd(b"link") == ("héllo\n" * 1000 + "appended\n").encode()
        assert rd(b"bin.dat")[:20] == b"\0" * 5 + b"XYZ" + b"\0\0" + bytes(range(10))
        assert len(rd(b"bin.dat")) == 200_000 and rd(b"copy") == rd(b"bin.dat")
        st = os.lstat(os.path.join(m, b"a/moved"))
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 4242, 4343)
        assert (st.st_atime_ns, st.st_mtime_ns) == (1_234_567_890_123_456_789,
                                                    1_700_000_000_000_000_001)
        assert os.listxattr(os.path.join(m, b"a/moved")) == ["user.note"]
        assert stat.S_ISFIFO(os.lstat(os.path.join(m, b"fifo")).st_mode)
        assert rd(b"pre")[4096:4117] == b"in preallocated space"
        assert os.stat(os.path.join(m, b"bin.dat")).st_nlink == 1
        assert rd(b"vol-snap/inside") == b"in a subvolume"
        assert not os.path.exists(os.path.join(m, b"gone"))
        assert not os.path.exists(os.path.join(m, b"unlinked-while-open"))
    btrfs_check(image)


def test_close_reports_and_read_only_refuses(tmp_image):
    with oleo.open(tmp_image) as fs:
        with pytest.raises(OSError) as e:
            fs.mkdir("/x")
        assert e.value.errno == errno.EROFS
        with pytest.raises(OSError) as e:
            fs.open("/new", "w")
        assert e.value.errno == errno.EROFS
    fs = oleo.open(tmp_image, "w")
    fs.mkdir("/kept")
    fs.close()
    fs.close()
    assert fs.closed
    with pytest.raises(ValueError):
        fs.stat("/")
    with oleo.open(tmp_image) as fs:
        assert fs.isdir("/kept")


def test_an_image_made_by_oleo_mkfs_passes_btrfs_check(tmp_path):
    need_progs()
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"rootdir\n" * 1000)
    os.symlink("d/f", src / "l")
    image = tmp_path / "m.img"
    uuid = oleo.mkfs(image, 256 << 20, rootdir=src, label="pylabel")
    assert len(uuid) == 36
    with oleo.open(image) as fs:
        assert fs.label == "pylabel"
        assert fs.read_bytes("/l") == b"rootdir\n" * 1000
    btrfs_check(str(image))


def test_a_forgotten_close_still_commits(tmp_image):
    """Writes of a script that never calls close() are committed at exit (and an unclosed
    filesystem collected earlier warns, as an unclosed file does)."""
    import subprocess
    import sys

    code = ("import oleo, sys\n"
            "fs = oleo.open(sys.argv[1], 'w')\n"
            "with fs.open('/kept', 'wb') as f:\n"
            "    f.write(b'committed at exit')\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_image)], check=True)
    with oleo.open(tmp_image) as fs:
        assert fs.read_bytes("/kept") == b"committed at exit"
    fs = oleo.open(tmp_image, "w")
    fs.mkdir("/by-gc")
    with pytest.warns(ResourceWarning):
        del fs
        import gc
        gc.collect()
    with oleo.open(tmp_image) as fs:
        assert fs.isdir("/by-gc")


def test_open_for_writing_truncates_as_open_does(tmp_image):
    """"w" empties an existing file and stamps its mtime, even when it was already empty
    (open(2)'s O_TRUNC); "r+" and "a" keep the bytes."""
    with oleo.open(tmp_image, "w") as fs:
        with fs.open("/f", "wb") as f:
            f.write(b"0123456789")
        with fs.open("/f", "r+b") as f:
            f.write(b"ab")
        assert fs.read_bytes("/f") == b"ab23456789"
        with fs.open("/f", "ab") as f:
            f.write(b"!")
        assert fs.read_bytes("/f") == b"ab23456789!"
        fs.open("/f", "wb").close()
        assert fs.read_bytes("/f") == b""
        fs.utime("/f", ns=(1, 1))
        fs.open("/f", "wb").close()
        assert fs.stat("/f").st_mtime_ns > 1


def test_mkfs_options_reach_the_image(tmp_path):
    need_progs()
    import subprocess

    image = tmp_path / "x.img"
    oleo.mkfs(image, 256 << 20, csum="xxhash", nodesize=8192, label="opts")
    sb = subprocess.run(["btrfs", "inspect-internal", "dump-super", str(image)],
                        capture_output=True, text=True, check=True).stdout
    assert "csum_type\t\t1 (xxhash64)" in sb, sb
    assert "nodesize\t\t8192" in sb
    assert "label\t\t\topts" in sb
    btrfs_check(str(image))
    with pytest.raises(ValueError):
        oleo.mkfs(tmp_path / "y.img", 256 << 20, csum="md5")
