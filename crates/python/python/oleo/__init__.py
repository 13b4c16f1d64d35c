"""Read and write btrfs filesystems (image files and block devices) without root or a
mount, with the idioms of Python's ``os``, ``io`` and ``zipfile``.

    import oleo
    with oleo.open("disk.img") as fs:
        for top, dirs, files in fs.walk("/"):
            ...
        data = fs.open("/etc/hostname", "rb").read()

    with oleo.open("disk.img", "w") as fs:      # commits on close
        with fs.open("/hello.txt", "w") as f:
            f.write("hello, btrfs\\n")

Paths are inside the filesystem, from the root of the subvolume opened (the default
subvolume unless ``subvol=`` or ``subvolid=`` says otherwise); a relative path starts
there too. Errors are the built-in ``OSError`` subclasses (``FileNotFoundError``,
``PermissionError``, ...) with ``errno`` and ``filename``; a damaged image raises
``oleo.CorruptError``, itself an ``OSError``. Every call that reads or writes lets go of
the GIL, so threads run in parallel.
"""

import atexit
import io
import os
import stat as _stat
import warnings
import weakref

from . import _oleo
from ._oleo import CorruptError, __version__

__all__ = ["open", "mkfs", "FileSystem", "DirEntry", "CorruptError", "__version__"]

#: os.setxattr's flags.
XATTR_CREATE = 1
XATTR_REPLACE = 2
#: fallocate(2)'s modes.
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10

_DT_DIR, _DT_REG, _DT_LNK = 4, 8, 10


def _encode(path):
    """A path as the bytes the filesystem stores (os.fsencode), from str, bytes or a
    path-like object."""
    return os.fsencode(path)


def _umask():
    """The process's umask, from /proc (reading it with os.umask would change it for an
    instant under every other thread)."""
    try:
        with io.open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Only the fields this platform's os.stat_result has (st_birthtime is not Linux's).
_STAT_FIELDS = frozenset(dir(os.stat_result))


def _stat_result(raw):
    ints, times = raw
    mode, ino, subvol, nlink, uid, gid, size, blocks, blksize, rdev, flags, gen = ints
    a_s, a_ns, m_s, m_ns, c_s, c_ns, b_s, b_ns = times
    seq = (mode, ino, subvol, nlink, uid, gid, size, a_s, m_s, c_s)
    extra = {
        "st_atime": a_s + a_ns / 1e9,
        "st_mtime": m_s + m_ns / 1e9,
        "st_ctime": c_s + c_ns / 1e9,
        "st_atime_ns": a_s * 1_000_000_000 + a_ns,
        "st_mtime_ns": m_s * 1_000_000_000 + m_ns,
        "st_ctime_ns": c_s * 1_000_000_000 + c_ns,
        "st_blksize": blksize,
        "st_blocks": blocks,
        "st_rdev": rdev,
    }
    if "st_birthtime" in _STAT_FIELDS:
        extra["st_birthtime"] = b_s + b_ns / 1e9
    if "st_gen" in _STAT_FIELDS:
        extra["st_gen"] = gen
    if "st_flags" in _STAT_FIELDS:
        extra["st_flags"] = flags
    return os.stat_result(seq, extra)


def open(path, mode="r", **options):
    """Opens the btrfs filesystem in the image file or block device ``path``.

    ``mode`` is ``"r"`` (read-only: nothing is written, not even a log replay) or ``"w"``
    (read-write: changes join a transaction that is committed on ``close``, by ``sync``,
    and whenever its dirty metadata passes half of the block cache; ``close`` raises if
    the commit fails). One writer per image: opening an image another program writes raises an
    OSError with errno EBUSY naming the holder.

    Options: ``subvol`` (a path from the top level) or ``subvolid`` to open that
    subvolume, as the mount options of those names; ``devices``: the filesystem's other
    devices; ``compress`` (``"zstd"``, ``"zlib:9"``, ``"lzo"``) and ``compress_force``
    for new data; ``cache_bytes``: the tree block cache's size; ``log_replay=False``
    ignores an fsync log (``rescue=nologreplay``); ``degraded`` opens with devices
    missing.
    """
    if mode not in ("r", "w", "rw", "r+"):
        raise ValueError(f"mode must be 'r' or 'w', not {mode!r}")
    writable = mode != "r"
    sub = options.pop("subvol", None)
    if sub is not None:
        options["subvol"] = _encode(sub)
    devices = options.pop("devices", None)
    if devices is not None:
        options["devices"] = [os.fspath(d) for d in devices]
    native = _oleo.open(os.fspath(path), writable, **options)
    return FileSystem(native, os.fspath(path), writable)


def mkfs(path, size=None, *, rootdir=None, label=None, nodesize=None, csum=None,
         metadata=None, data=None, uuid=None, owner=None, force=False):
    """Makes a new btrfs filesystem in ``path`` as ``mkfs.btrfs`` does: an image file is
    created (sparse) or grown to ``size`` bytes; without ``size`` an existing file or
    device keeps its size. ``rootdir`` copies a host directory in (mkfs.btrfs
    --rootdir). ``csum`` is crc32c, xxhash, sha256 or blake2; ``metadata``/``data`` the
    profiles (single, dup, ...); ``uuid`` a 16-byte or string UUID; ``owner`` the root
    directory's (uid, gid), the caller's by default. ``force`` overwrites an existing
    filesystem or other signature. Returns the new filesystem's UUID as a string."""
    import uuid as _uuid

    if isinstance(uuid, str):
        uuid = _uuid.UUID(uuid).bytes
    if owner is None:
        owner = (os.getuid(), os.getgid())
    fsid, _total = _oleo.mkfs(os.fspath(path), size,
                              None if rootdir is None else os.fspath(rootdir),
                              label, nodesize, csum, metadata, data,
                              None if uuid is None else bytes(uuid), tuple(owner), force)
    return str(_uuid.UUID(bytes=bytes(fsid)))


class DirEntry:
    """An entry of ``FileSystem.scandir``, as ``os.DirEntry``: ``name`` and ``path``
    (str, or bytes when the directory was given as bytes), ``inode()``, ``is_dir()``,
    ``is_file()``, ``is_symlink()`` from the directory entry itself, ``stat()`` on
    demand (cached)."""

    __slots__ = ("name", "path", "_fs", "_id", "_type", "_stat", "_lstat")

    def __init__(self, fs, name, path, ident, dtype):
        self.name = name
        self.path = path
        self._fs = fs
        self._id = ident
        self._type = dtype
        self._stat = None
        self._lstat = None

    def inode(self):
        return self._id[1]

    def is_dir(self, *, follow_symlinks=True):
        if self._type == _DT_LNK and follow_symlinks:
            return self._follow(_stat.S_ISDIR)
        return self._type == _DT_DIR

    def is_file(self, *, follow_symlinks=True):
        if self._type == _DT_LNK and follow_symlinks:
            return self._follow(_stat.S_ISREG)
        return self._type == _DT_REG

    def is_symlink(self):
        return self._type == _DT_LNK

    def is_junction(self):
        return False

    def _follow(self, test):
        # As os.DirEntry: a dangling link is no directory; other errors are raised.
        try:
            return test(self.stat().st_mode)
        except FileNotFoundError:
            return False

    def stat(self, *, follow_symlinks=True):
        if follow_symlinks and self._type == _DT_LNK:
            if self._stat is None:
                self._stat = self._fs.stat(self.path)
            return self._stat
        if self._lstat is None:
            self._lstat = _stat_result(self._fs._native.stat_id(self._id))
        return self._lstat

    def __fspath__(self):
        return self.path

    def __repr__(self):
        return f"<oleo.DirEntry {self.name!r}>"


class _ScandirIterator:
    """What ``FileSystem.scandir`` returns: an iterator that is also a context manager,
    as os.scandir's."""

    def __init__(self, entries):
        self._it = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def close(self):
        self._it = iter(())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _RawFile(io.RawIOBase):
    """A file of the filesystem as a raw binary stream: seekable, with ``readinto``
    straight into the caller's buffer."""

    def __init__(self, fs, ident, name, mode, readable, writable, append):
        super().__init__()
        self._fs = fs
        self._id = ident
        self.name = name
        self.mode = mode
        self._readable = readable
        self._writable = writable
        self._append = append
        self._pos = 0

    def readable(self):
        return self._readable

    def writable(self):
        return self._writable

    def seekable(self):
        return True

    def _check(self, what):
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if what == "r" and not self._readable:
            raise io.UnsupportedOperation("not readable")
        if what == "w" and not self._writable:
            raise io.UnsupportedOperation("not writable")

    def readinto(self, b):
        self._check("r")
        view = memoryview(b).cast("B")
        # The stable ABI of Python 3.9 has no buffer protocol: the engine reads into a
        # bytes object, copied once into the caller's buffer.
        data = self._fs._native.read(self._id, self._pos, len(view))
        n = len(data)
        view[:n] = data
        self._pos += n
        return n

    def readall(self):
        self._check("r")
        size = self._size()
        chunks = []
        while True:
            want = min(max(size - self._pos, 1 << 16), 1 << 30)
            data = self._fs._native.read(self._id, self._pos, want)
            if not data:
                break
            chunks.append(data)
            self._pos += len(data)
        return b"".join(chunks)

    def write(self, b):
        self._check("w")
        if self._append:
            self._pos = self._size()
        data = b if type(b) is bytes else bytes(memoryview(b).cast("B"))
        n = self._fs._native.write(self._id, self._pos, data)
        self._pos += n
        return n

    def _size(self):
        return self._fs._native.stat_id(self._id)[0][6]

    def seek(self, offset, whence=io.SEEK_SET):
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size() + offset
        else:
            raise ValueError(f"invalid whence ({whence})")
        if pos < 0:
            raise OSError(22, "Invalid argument")
        self._pos = pos
        return pos

    def tell(self):
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return self._pos

    def truncate(self, size=None):
        self._check("w")
        if size is None:
            size = self._pos
        self._fs._native.setattr(b"", True, id=self._id, size=size)
        return size

    def fileno(self):
        raise io.UnsupportedOperation("a file inside an image has no descriptor")

    def isatty(self):
        return False

    def close(self):
        if not self.closed:
            try:
                if not self._fs._native.closed:
                    self._fs._native.release(self._id)
            finally:
                super().close()

    def fsync(self):
        self._fs._native.fsync(self._id)

    def stat(self):
        return _stat_result(self._fs._native.stat_id(self._id))


class FileSystem:
    """An open btrfs filesystem: returned by ``oleo.open``, a context manager whose exit
    closes it (committing when writable). The methods take paths inside the filesystem
    as str, bytes or path-like objects, as the ``os`` functions of the same names do."""

    def __init__(self, native, image, writable):
        self._native = native
        self.image = image
        self.writable = writable
        # New inodes get the umask the process had when the filesystem was opened.
        self._umask = _umask()
        if writable:
            _open_writers.add(self)

    def __del__(self):
        # A writable one as an unclosed file: a warning, then the commit close() would
        # have made (the engine commits when dropped, but could then only log a failure).
        # A read-only one has nothing to lose (fsspec keeps its instances until exit).
        native = getattr(self, "_native", None)
        if native is not None and not native.closed and self.writable:
            warnings.warn(f"unclosed {self!r}", ResourceWarning, source=self)
            try:
                native.close()
            except OSError as e:
                warnings.warn(f"{self!r}: the commit at garbage collection failed: {e}",
                              RuntimeWarning)

    # -- the handle -------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self):
        return self._native.closed

    def close(self):
        """Commits (when writable) and closes; raises ``OSError`` if the commit fails."""
        self._native.close()

    def sync(self):
        """Commits the running transaction: everything done so far is durable."""
        self._native.sync()

    def __repr__(self):
        state = "closed" if self.closed else ("rw" if self.writable else "ro")
        return f"<oleo.FileSystem {self.image!r} {state}>"

    # -- reading ----------------------------------------------------------------------

    def stat(self, path, *, follow_symlinks=True):
        """os.stat: ``st_dev`` is the subvolume's id, ``st_ino`` the inode number."""
        return _stat_result(self._native.stat(_encode(path), follow_symlinks))

    def lstat(self, path):
        return self.stat(path, follow_symlinks=False)

    def _mode(self, path, follow):
        """The st_mode of ``path``, or None where nothing is (as os.path's tests)."""
        try:
            return self.stat(path, follow_symlinks=follow).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None

    def exists(self, path):
        return self._mode(path, True) is not None

    def isdir(self, path):
        mode = self._mode(path, True)
        return mode is not None and _stat.S_ISDIR(mode)

    def isfile(self, path):
        mode = self._mode(path, True)
        return mode is not None and _stat.S_ISREG(mode)

    def islink(self, path):
        mode = self._mode(path, False)
        return mode is not None and _stat.S_ISLNK(mode)

    def scandir(self, path="/"):
        """os.scandir: an iterator of ``DirEntry``, in the directory's index order."""
        as_bytes = isinstance(path, bytes)
        raw = _encode(path)
        entries = self._native.listdir(raw)
        base = raw if raw.endswith(b"/") else raw + b"/"
        out = []
        for name, subvol, ino, dtype in entries:
            full = base + name
            if as_bytes:
                out.append(DirEntry(self, name, full, (subvol, ino), dtype))
            else:
                out.append(DirEntry(self, os.fsdecode(name), os.fsdecode(full),
                                    (subvol, ino), dtype))
        return _ScandirIterator(out)

    def listdir(self, path="/"):
        """os.listdir: the names in directory ``path``."""
        names = [e[0] for e in self._native.listdir(_encode(path))]
        if isinstance(path, bytes):
            return names
        return [os.fsdecode(n) for n in names]

    def walk(self, top="/", topdown=True, onerror=None, followlinks=False):
        """os.walk: (dirpath, dirnames, filenames) for every directory under ``top``;
        symlinks to directories are listed in dirnames and entered with
        ``followlinks``."""
        stack = [top]
        while stack:
            top = stack.pop()
            if isinstance(top, tuple):
                # Bottom-up: its subdirectories have been walked.
                yield top
                continue
            try:
                entries = list(self.scandir(top))
            except OSError as e:
                if onerror is not None:
                    onerror(e)
                continue
            dirs, nondirs, into = [], [], []
            for e in entries:
                try:
                    is_dir = e.is_dir()
                except OSError:
                    # As os.walk: a link that cannot be followed is no directory.
                    is_dir = False
                if is_dir:
                    dirs.append(e.name)
                    if not topdown and (followlinks or not e.is_symlink()):
                        into.append(e.path)
                else:
                    nondirs.append(e.name)
            if topdown:
                yield top, dirs, nondirs
                sep = b"/" if isinstance(top, bytes) else "/"
                base = top if top.endswith(sep) else top + sep
                for d in reversed(dirs):
                    path = base + d
                    if followlinks or not self.islink(path):
                        stack.append(path)
            else:
                stack.append((top, dirs, nondirs))
                stack.extend(reversed(into))

    def readlink(self, path):
        """os.readlink: str for a str path, bytes for bytes."""
        target = self._native.readlink(_encode(path))
        return target if isinstance(path, bytes) else os.fsdecode(target)

    def listxattr(self, path, *, follow_symlinks=True):
        """os.listxattr: every xattr name, POSIX ACLs (``system.posix_acl_*``) included."""
        return [os.fsdecode(n) for n in self._native.listxattr(_encode(path), follow_symlinks)]

    def getxattr(self, path, attribute, *, follow_symlinks=True):
        """os.getxattr: the value as bytes; ``OSError`` ENODATA if there is none."""
        return self._native.getxattr(_encode(path), _encode(attribute), follow_symlinks)

    def statvfs(self):
        """os.statvfs of the filesystem (its free space from the block groups)."""
        bsize, blocks, bfree, bavail, files, ffree, namemax = self._native.statvfs()
        return os.statvfs_result((bsize, bsize, blocks, bfree, bavail, files, ffree, ffree,
                                  0, namemax))

    def read_bytes(self, path):
        """The whole content of file ``path``."""
        with self.open(path, "rb", buffering=0) as f:
            return f.readall()

    def read_text(self, path, encoding=None, errors=None):
        with self.open(path, "r", encoding=encoding, errors=errors) as f:
            return f.read()

    # -- files ------------------------------------------------------------------------

    def open(self, path, mode="r", buffering=-1, encoding=None, errors=None, newline=None,
             *, perm=0o666):
        """The built-in open() for a file inside the filesystem: "r", "w", "x", "a" with
        "b", "t" and "+" as ``io.open`` takes them, returning the same classes
        (``BufferedReader``, ``BufferedWriter``, ``BufferedRandom``, ``TextIOWrapper``,
        or the raw ``io.RawIOBase`` with ``buffering=0``). New files get ``perm`` less
        the process's umask, owned by the calling user."""
        chars = set(mode)
        if not chars <= set("rwxab+t") or len(mode) != len(chars):
            raise ValueError(f"invalid mode: {mode!r}")
        kinds = chars & set("rwxa")
        if len(kinds) != 1 or ("b" in chars and "t" in chars):
            raise ValueError(f"invalid mode: {mode!r}")
        kind = kinds.pop()
        plus = "+" in chars
        binary = "b" in chars
        if binary and (encoding is not None or errors is not None or newline is not None):
            raise ValueError("binary mode doesn't take an encoding, errors or newline")
        flags = {"r": 0, "w": os.O_CREAT | os.O_TRUNC, "x": os.O_CREAT | os.O_EXCL,
                 "a": os.O_CREAT}[kind]
        readable = kind == "r" or plus
        writable = kind != "r" or plus
        flags |= os.O_RDWR if readable and writable else (os.O_WRONLY if writable else 0)
        raw_path = _encode(path)
        ident = self._native.open(raw_path, flags, perm, self._umask, os.getuid(), os.getgid())
        name = path if isinstance(path, (str, bytes)) else os.fspath(path)
        raw = _RawFile(self, ident, name, mode, readable, writable, kind == "a")
        try:
            if _stat.S_ISDIR(raw.stat().st_mode):
                raise IsADirectoryError(21, "Is a directory", name)
            if kind == "a":
                raw.seek(0, io.SEEK_END)
            if buffering == 0:
                if not binary:
                    raise ValueError("can't have unbuffered text I/O")
                return raw
            size = io.DEFAULT_BUFFER_SIZE if buffering in (-1, 1) else buffering
            if readable and writable:
                buf = io.BufferedRandom(raw, size)
            elif writable:
                buf = io.BufferedWriter(raw, size)
            else:
                buf = io.BufferedReader(raw, size)
            if binary:
                return buf
            text = io.TextIOWrapper(buf, encoding or "utf-8", errors, newline,
                                    line_buffering=buffering == 1)
            text.mode = mode
            return text
        except BaseException:
            raw.close()
            raise

    # -- changes ----------------------------------------------------------------------

    def mkdir(self, path, mode=0o777):
        """os.mkdir (``mode`` less the umask, owned by the calling user)."""
        self._native.mkdir(_encode(path), mode, self._umask, os.getuid(), os.getgid())

    def makedirs(self, name, mode=0o777, exist_ok=False):
        """os.makedirs."""
        raw = _encode(name).rstrip(b"/")
        parts = [p for p in raw.split(b"/") if p]
        cur = b""
        for i, part in enumerate(parts):
            cur += b"/" + part
            last = i == len(parts) - 1
            try:
                self._native.mkdir(cur, mode if last else 0o777, self._umask, os.getuid(),
                                   os.getgid())
            except FileExistsError:
                if last and not (exist_ok and self.isdir(cur)):
                    raise FileExistsError(17, "File exists", name) from None
                if not last and not self.isdir(cur):
                    raise

    def mknod(self, path, mode=0o600 | _stat.S_IFREG, device=0):
        """os.mknod: a regular file, fifo, socket or device node."""
        self._native.mknod(_encode(path), mode, device, self._umask, os.getuid(), os.getgid())

    def mkfifo(self, path, mode=0o666):
        self.mknod(path, (mode & 0o7777) | _stat.S_IFIFO)

    def unlink(self, path):
        self._native.unlink(_encode(path))

    remove = unlink

    def rmdir(self, path):
        self._native.rmdir(_encode(path))

    def rename(self, src, dst, *, noreplace=False, exchange=False):
        """os.rename (replacing ``dst`` if it exists); ``noreplace`` and ``exchange`` are
        renameat2's RENAME_NOREPLACE and RENAME_EXCHANGE."""
        self._native.rename(_encode(src), _encode(dst), noreplace, exchange)

    def replace(self, src, dst):
        self.rename(src, dst)

    def link(self, src, dst, *, follow_symlinks=True):
        self._native.link(_encode(src), _encode(dst), follow_symlinks)

    def symlink(self, src, dst):
        """os.symlink: ``dst`` is made pointing at ``src``."""
        self._native.symlink(_encode(src), _encode(dst), os.getuid(), os.getgid())

    def chmod(self, path, mode, *, follow_symlinks=True):
        self._native.setattr(_encode(path), follow_symlinks, mode=mode)

    def chown(self, path, uid, gid, *, follow_symlinks=True):
        """os.chown; -1 leaves that id unchanged."""
        self._native.setattr(_encode(path), follow_symlinks,
                             uid=None if uid == -1 else uid,
                             gid=None if gid == -1 else gid)

    def utime(self, path, times=None, *, ns=None, follow_symlinks=True):
        """os.utime: ``times`` (atime, mtime) in seconds or ``ns`` in nanoseconds; now
        if neither."""
        if times is not None and ns is not None:
            raise ValueError("utime: you may specify either 'times' or 'ns' but not both")
        if times is not None:
            ns = tuple(int(round(t * 1e9)) if isinstance(t, float) else int(t) * 10**9
                       for t in times)
        elif ns is None:
            import time
            now = time.time_ns()
            ns = (now, now)
        self._native.setattr(_encode(path), follow_symlinks, atime_ns=ns[0], mtime_ns=ns[1])

    def truncate(self, path, length):
        """os.truncate of the file at ``path`` (or an open file of this filesystem)."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            _flush(path)
            self._native.setattr(b"", True, id=_raw_of(path)._id, size=length)
            return
        self._native.setattr(_encode(path), True, size=length)

    def fallocate(self, file, offset, length, mode=0):
        """fallocate(2) on an open file of this filesystem: ``mode`` 0 or
        ``FALLOC_FL_KEEP_SIZE``, ``FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE``,
        ``FALLOC_FL_ZERO_RANGE``."""
        raw = _raw_of(file)
        _flush(file)
        self._native.fallocate(raw._id, mode, offset, length)

    def copy_file_range(self, src, dst, count, offset_src=None, offset_dst=None):
        """os.copy_file_range between two open files of this filesystem: whole extents are
        shared (a reflink), the rest copied. Offsets of None use and move the files'
        positions. Returns the bytes copied."""
        rs, rd = _raw_of(src), _raw_of(dst)
        _flush(src)
        _flush(dst)
        so = rs.tell() if offset_src is None else offset_src
        do = rd.tell() if offset_dst is None else offset_dst
        n = self._native.copy_file_range(rs._id, so, rd._id, do, count)
        if offset_src is None:
            _seek(src, so + n)
        if offset_dst is None:
            _seek(dst, do + n)
        return n

    def setxattr(self, path, attribute, value, flags=0, *, follow_symlinks=True):
        """os.setxattr (``XATTR_CREATE``, ``XATTR_REPLACE``); ``system.posix_acl_*`` set
        POSIX ACLs, ``btrfs.compression`` the compression property."""
        self._native.setxattr(_encode(path), _encode(attribute), bytes(value), flags,
                              follow_symlinks)

    def removexattr(self, path, attribute, *, follow_symlinks=True):
        self._native.removexattr(_encode(path), _encode(attribute), follow_symlinks)

    # -- subvolumes -------------------------------------------------------------------

    def subvolumes(self):
        """Every subvolume and snapshot, as ``btrfs subvolume list`` shows them: dicts
        with id, parent, name, path (str), uuid, parent_uuid, received_uuid (strings,
        None when unset), generation, ctransid, otransid, readonly, otime (float)."""
        import uuid as _uuid

        def u(b):
            return None if not any(b) else str(_uuid.UUID(bytes=bytes(b)))

        out = []
        for s in self._native.subvolumes():
            if s["id"] == 5:
                # The top level (FS_TREE), which btrfs subvolume list leaves out too.
                continue
            s["name"] = os.fsdecode(s["name"])
            s["path"] = None if s["path"] is None else os.fsdecode(s["path"])
            for k in ("uuid", "parent_uuid", "received_uuid"):
                s[k] = u(s[k])
            sec, nsec = s["otime"]
            s["otime"] = sec + nsec / 1e9
            out.append(s)
        return out

    def create_subvolume(self, path):
        """btrfs subvolume create: returns the new subvolume's id."""
        return self._native.create_subvolume(_encode(path), os.getuid(), os.getgid())

    def snapshot(self, source, dest, readonly=False):
        """btrfs subvolume snapshot [-r]: ``source`` is a subvolume's root directory.
        Returns the snapshot's id."""
        return self._native.snapshot(_encode(source), _encode(dest), readonly)

    def delete_subvolume(self, path):
        """btrfs subvolume delete: returns the deleted subvolume's id."""
        return self._native.delete_subvolume(_encode(path))

    @property
    def label(self):
        return os.fsdecode(self._native.label())


# Writable filesystems still open: committed at interpreter exit, so that a script that
# forgets close() loses nothing (a failure there is reported on stderr).
_open_writers = weakref.WeakSet()


@atexit.register
def _close_writers():
    for fs in list(_open_writers):
        if not fs.closed:
            try:
                fs.close()
            except OSError as e:
                import sys
                print(f"oleo: {fs.image}: the commit at exit failed: {e}", file=sys.stderr)


def _raw_of(f):
    """The raw file under a file object that FileSystem.open returned."""
    while not isinstance(f, _RawFile):
        inner = getattr(f, "buffer", None) or getattr(f, "raw", None)
        if inner is None:
            raise TypeError("not a file opened by oleo's FileSystem.open")
        f = inner
    return f


def _flush(f):
    if hasattr(f, "flush") and not isinstance(f, _RawFile):
        f.flush()


def _seek(f, pos):
    if isinstance(f, io.TextIOBase):
        f.buffer.seek(pos)
    else:
        f.seek(pos)
