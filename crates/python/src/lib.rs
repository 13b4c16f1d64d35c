//! The native half of oleo's Python package (`oleo._oleo`): a thin front end over the
//! engine's `Filesystem`, as the FUSE server and the CLI are. Paths arrive as bytes (the
//! package's Python half encodes them with `os.fsencode`), are resolved here from the
//! opened subvolume's root, and every call that reads or writes lets go of the GIL while
//! the engine works, so Python threads run in parallel. The idioms (`os.stat_result`, file
//! objects, `os.walk`) are built in Python from what these functions return
//! (`python/oleo/__init__.py`).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use oleo::mkfs::{MkfsOptions, Profile};
use oleo::{
    Attr, Compress, Error, FallocMode, FileKind, Filesystem, InodeId, NewInode, OpenOptions,
    RenameFlags, SetAttr, Timespec, XattrSet,
};
use parking_lot::RwLock;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

pyo3::create_exception!(
    oleo,
    CorruptError,
    PyOSError,
    "The image is damaged: metadata that fails validation (errno EUCLEAN), no valid \
     superblock, or file data whose checksum does not match (errno EIO)."
);

/// Symlinks followed while resolving one path before ELOOP, as Linux's MAXSYMLINKS.
const MAX_SYMLINKS: u32 = 40;

/// `path` as Python's `os.fsdecode` gives it: a str, bytes that are not UTF-8 escaped.
fn fsdecode<'py>(py: Python<'py>, path: &[u8]) -> Bound<'py, PyAny> {
    let b = PyBytes::new(py, path);
    b.call_method1("decode", ("utf-8", "surrogateescape"))
        .unwrap_or_else(|_| b.into_any())
}

/// The engine's error as the OSError Python raises for it: the subclass its errno picks
/// (FileNotFoundError, PermissionError, ...), the path it concerns as `filename`, and
/// `CorruptError` for a damaged image.
fn os_error(py: Python<'_>, e: Error, path: Option<&[u8]>) -> PyErr {
    let errno = e.errno();
    let strerror = std::io::Error::from_raw_os_error(errno).to_string();
    let strerror = strerror
        .split(" (os error")
        .next()
        .unwrap_or(&strerror)
        .to_string();
    // Errors that say more than their errno keep the engine's words.
    let msg = match &e {
        Error::NotFound
        | Error::AlreadyExists
        | Error::NotDir
        | Error::IsDir
        | Error::NoXattr
        | Error::ReadOnly
        | Error::NoSpace
        | Error::NotEmpty
        | Error::NameTooLong
        | Error::TooManyLinks
        | Error::FileTooBig
        | Error::CrossDevice
        | Error::NoDevice
        | Error::Range
        | Error::NoSuchOffset => strerror,
        other => format!("{strerror}: {other}"),
    };
    let filename = path.map(|p| fsdecode(py, p).unbind());
    match e {
        Error::Corrupt { .. } | Error::DataChecksum { .. } | Error::Unusable(_) => {
            CorruptError::new_err((errno, msg, filename))
        }
        _ => PyOSError::new_err((errno, msg, filename)),
    }
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O operation on a closed filesystem")
}

/// An inode as Python holds it: (subvolume, inode number).
type Id = (u64, u64);

/// A directory entry as Python gets it: (name, subvolume, inode number, DT_* type).
type Entry = (Py<PyBytes>, u64, u64, u8);

fn id_of(id: Id) -> InodeId {
    InodeId {
        subvol: id.0,
        ino: id.1,
    }
}

fn kind_code(k: FileKind) -> u8 {
    // The dirent DT_* values, as os.DirEntry's type tests use them.
    match k {
        FileKind::File => libc::DT_REG,
        FileKind::Dir => libc::DT_DIR,
        FileKind::Symlink => libc::DT_LNK,
        FileKind::CharDev => libc::DT_CHR,
        FileKind::BlockDev => libc::DT_BLK,
        FileKind::Fifo => libc::DT_FIFO,
        FileKind::Socket => libc::DT_SOCK,
    }
}

/// stat(2)'s fields in two tuples (a tuple converts only up to 12 items): (mode, ino,
/// subvolume, nlink, uid, gid, size, blocks, blksize, rdev, btrfs inode flags,
/// generation) and the (seconds, nanoseconds) of atime, mtime, ctime and birth time.
type StatTuple = (
    (u32, u64, u64, u32, u32, u32, u64, u64, u32, u64, u64, u64),
    (i64, u32, i64, u32, i64, u32, i64, u32),
);

fn stat_tuple(a: &Attr) -> StatTuple {
    (
        (
            a.mode,
            a.id.ino,
            a.id.subvol,
            a.nlink,
            a.uid,
            a.gid,
            a.size,
            a.blocks,
            a.blksize,
            a.rdev,
            a.flags,
            a.generation,
        ),
        (
            a.atime.sec,
            a.atime.nsec,
            a.mtime.sec,
            a.mtime.nsec,
            a.ctime.sec,
            a.ctime.nsec,
            a.crtime.sec,
            a.crtime.nsec,
        ),
    )
}

fn timespec(ns: i128) -> Timespec {
    Timespec {
        sec: ns.div_euclid(1_000_000_000) as i64,
        nsec: ns.rem_euclid(1_000_000_000) as u32,
    }
}

/// Splits `path` into its directory and last component ("a/b/c" into "a/b" and "c").
fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    let trimmed = {
        let mut end = path.len();
        while end > 1 && path[end - 1] == b'/' {
            end -= 1;
        }
        &path[..end]
    };
    match trimmed.iter().rposition(|&c| c == b'/') {
        Some(i) => (&trimmed[..i + 1], &trimmed[i + 1..]),
        None => (b"", trimmed),
    }
}

/// Resolves `path` from `root` as path resolution in the kernel does: "." and ".." and
/// symlinks in every component but the last, and in the last too with `follow`;
/// absolute symlink targets start again at `root` (the opened subvolume's root: an image
/// has no other). ELOOP after `MAX_SYMLINKS`.
fn resolve(fs: &Filesystem, root: InodeId, path: &[u8], follow: bool) -> oleo::Result<InodeId> {
    let mut queue: VecDeque<Vec<u8>> = components(path);
    let mut cur = root;
    let mut links = 0;
    while let Some(c) = queue.pop_front() {
        if c == b".." && cur == root {
            continue;
        }
        let next = fs.lookup(cur, &c)?;
        let last = queue.is_empty();
        if last && !follow {
            cur = next;
            break;
        }
        let attr = fs.getattr(next)?;
        match attr.kind {
            FileKind::Symlink => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ELOOP)));
                }
                let target = fs.readlink(next)?;
                if target.first() == Some(&b'/') {
                    cur = root;
                }
                for t in components(&target).into_iter().rev() {
                    queue.push_front(t);
                }
            }
            FileKind::Dir => cur = next,
            _ if last => cur = next,
            _ => return Err(Error::NotDir),
        }
    }
    Ok(cur)
}

fn components(path: &[u8]) -> VecDeque<Vec<u8>> {
    path.split(|&c| c == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect()
}

/// An open filesystem (a btrfs image or device). Every method may be called from any
/// thread; the engine takes its own locks.
#[pyclass(frozen, module = "oleo._oleo")]
struct Fs {
    inner: RwLock<Option<Arc<Filesystem>>>,
    writable: bool,
}

impl Fs {
    fn get(&self) -> PyResult<Arc<Filesystem>> {
        self.inner.read().clone().ok_or_else(closed)
    }

    /// Runs `f` on the filesystem without the GIL; an error names `path`.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        path: Option<&[u8]>,
        f: impl FnOnce(&Filesystem) -> oleo::Result<T> + Send,
    ) -> PyResult<T> {
        let fs = self.get()?;
        py.detach(|| f(&fs)).map_err(|e| os_error(py, e, path))
    }
}

impl Fs {
    /// unlink (`dir` false) or rmdir of `path`.
    fn remove(&self, py: Python<'_>, path: &[u8], dir: bool) -> PyResult<()> {
        self.run(py, Some(path), |fs| {
            let (parent, name) = parent_and_name(fs, path)?;
            if dir {
                fs.rmdir(parent, name)
            } else {
                fs.unlink(parent, name)
            }
        })
    }
}

/// The directory `path` names and its last component, which must be a real name.
fn parent_and_name<'a>(fs: &Filesystem, path: &'a [u8]) -> oleo::Result<(InodeId, &'a [u8])> {
    let (dir, name) = split_last(path);
    if name.is_empty() || name == b"." || name == b".." || name == b"/" {
        return Err(Error::InvalidArgument(
            "the path names no entry of a directory".into(),
        ));
    }
    Ok((resolve(fs, fs.root(), dir, true)?, name))
}

#[pymethods]
impl Fs {
    /// True when opened for writing.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// True once `close` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.read().is_none()
    }

    /// Commits (when writable) and lets go of the image. Raises if the commit fails;
    /// a second call does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(fs) = self.inner.write().take() else {
            return Ok(());
        };
        if !self.writable {
            return Ok(());
        }
        py.detach(|| fs.close_all_and_sync().map(drop))
            .map_err(|e| os_error(py, e, None))
    }

    /// The inode `path` names, as (subvolume, inode number).
    fn resolve(&self, py: Python<'_>, path: &[u8], follow: bool) -> PyResult<Id> {
        self.run(py, Some(path), |fs| {
            let id = resolve(fs, fs.root(), path, follow)?;
            Ok((id.subvol, id.ino))
        })
    }

    /// stat (follow) or lstat of `path`.
    fn stat(&self, py: Python<'_>, path: &[u8], follow: bool) -> PyResult<StatTuple> {
        self.run(py, Some(path), |fs| {
            let id = resolve(fs, fs.root(), path, follow)?;
            Ok(stat_tuple(&fs.getattr(id)?))
        })
    }

    /// stat of an inode already found (a directory entry, an open file).
    fn stat_id(&self, py: Python<'_>, id: Id) -> PyResult<StatTuple> {
        self.run(py, None, |fs| Ok(stat_tuple(&fs.getattr(id_of(id))?)))
    }

    /// The entries of directory `path` (without "." and ".."): (name, subvolume, inode,
    /// DT_* type) each, in the directory's index order.
    fn listdir(&self, py: Python<'_>, path: &[u8]) -> PyResult<Vec<Entry>> {
        let entries = self.run(py, Some(path), |fs| {
            let dir = resolve(fs, fs.root(), path, true)?;
            if fs.getattr(dir)?.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            let mut out = Vec::new();
            fs.readdir(dir, 0, &mut |e| {
                if e.name != b"." && e.name != b".." {
                    out.push((e.name, e.id.subvol, e.id.ino, kind_code(e.kind)));
                }
                true
            })?;
            Ok(out)
        })?;
        Ok(entries
            .into_iter()
            .map(|(n, s, i, k)| (PyBytes::new(py, &n).unbind(), s, i, k))
            .collect())
    }

    /// The target of symlink `path`.
    fn readlink(&self, py: Python<'_>, path: &[u8]) -> PyResult<Py<PyBytes>> {
        let t = self.run(py, Some(path), |fs| {
            let id = resolve(fs, fs.root(), path, false)?;
            fs.readlink(id)
        })?;
        Ok(PyBytes::new(py, &t).unbind())
    }

    /// The xattr names of `path`.
    fn listxattr(&self, py: Python<'_>, path: &[u8], follow: bool) -> PyResult<Vec<Py<PyBytes>>> {
        let names = self.run(py, Some(path), |fs| {
            fs.listxattr(resolve(fs, fs.root(), path, follow)?)
        })?;
        Ok(names.iter().map(|n| PyBytes::new(py, n).unbind()).collect())
    }

    /// The value of xattr `name` of `path` (ENODATA if it has none).
    fn getxattr(
        &self,
        py: Python<'_>,
        path: &[u8],
        name: &[u8],
        follow: bool,
    ) -> PyResult<Py<PyBytes>> {
        let v = self.run(py, Some(path), |fs| {
            fs.getxattr(resolve(fs, fs.root(), path, follow)?, name)
        })?;
        Ok(PyBytes::new(py, &v).unbind())
    }

    /// Sets xattr `name`; `flags` as os.setxattr's (XATTR_CREATE 1, XATTR_REPLACE 2).
    fn setxattr(
        &self,
        py: Python<'_>,
        path: &[u8],
        name: &[u8],
        value: &[u8],
        flags: i32,
        follow: bool,
    ) -> PyResult<()> {
        let how = match flags {
            0 => XattrSet::Either,
            1 => XattrSet::Create,
            2 => XattrSet::Replace,
            _ => {
                return Err(PyValueError::new_err(
                    "flags must be 0, XATTR_CREATE or XATTR_REPLACE",
                ))
            }
        };
        self.run(py, Some(path), |fs| {
            fs.setxattr(resolve(fs, fs.root(), path, follow)?, name, value, how)
        })
    }

    /// Removes xattr `name` of `path`.
    fn removexattr(&self, py: Python<'_>, path: &[u8], name: &[u8], follow: bool) -> PyResult<()> {
        self.run(py, Some(path), |fs| {
            fs.removexattr(resolve(fs, fs.root(), path, follow)?, name)
        })
    }

    /// Opens `path` as open(2) with `flags` (O_CREAT, O_EXCL, O_TRUNC, O_NOFOLLOW,
    /// O_DIRECTORY; the access mode is the caller's to keep), creating a regular file of
    /// mode `mode & ~umask` owned by `uid`:`gid`. The inode stays alive while open, even
    /// unlinked, until `release`. Returns the inode and whether it is a directory.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &self,
        py: Python<'_>,
        path: &[u8],
        flags: i32,
        mode: u32,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> PyResult<Id> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if (write || flags & (libc::O_CREAT | libc::O_TRUNC) != 0) && !self.writable {
            return Err(os_error(py, Error::ReadOnly, Some(path)));
        }
        self.run(py, Some(path), |fs| {
            let follow = flags & libc::O_NOFOLLOW == 0;
            let found = match resolve(fs, fs.root(), path, follow) {
                Ok(id) if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 => {
                    let _ = id;
                    return Err(Error::AlreadyExists);
                }
                Ok(id) => Some(id),
                Err(Error::NotFound) if flags & libc::O_CREAT != 0 => None,
                Err(e) => return Err(e),
            };
            let id = match found {
                Some(id) => {
                    let a = fs.getattr(id)?;
                    match a.kind {
                        FileKind::Symlink => {
                            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::ELOOP)))
                        }
                        FileKind::Dir if write => return Err(Error::IsDir),
                        FileKind::Dir => {}
                        _ if flags & libc::O_DIRECTORY != 0 => return Err(Error::NotDir),
                        _ => {}
                    }
                    if flags & libc::O_TRUNC != 0 && a.kind == FileKind::File && write {
                        // As open(2)'s do_truncate: times stamped even when already
                        // empty, on the engine's clock.
                        let t = oleo::now();
                        let now = Timespec {
                            sec: t.sec,
                            nsec: t.nsec,
                        };
                        fs.setattr(
                            id,
                            &SetAttr {
                                size: Some(0),
                                mtime: Some(now),
                                ..Default::default()
                            },
                        )?;
                    }
                    id
                }
                None => {
                    let (dir, name) = parent_and_name(fs, path)?;
                    let new = NewInode::file(mode & 0o7777).umask(umask).owner(uid, gid);
                    fs.mknod(dir, name, &new)?.id
                }
            };
            fs.pin_open(id);
            Ok((id.subvol, id.ino))
        })
    }

    /// Closes what `open` opened: an unlinked file goes with its last opener.
    fn release(&self, py: Python<'_>, id: Id) -> PyResult<()> {
        let fs = self.get()?;
        if !self.writable {
            fs.drop_pin(id_of(id));
            return Ok(());
        }
        py.detach(|| fs.unpin_open(id_of(id)))
            .map_err(|e| os_error(py, e, None))
    }

    /// Reads up to `size` bytes at `offset` (fewer at the end of the file). The engine
    /// reads straight into the new bytes object (whole sectors from the device with no
    /// copy in between), which no other code can see before it is returned.
    fn read<'py>(
        &self,
        py: Python<'py>,
        id: Id,
        offset: u64,
        size: u32,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let fs = self.get()?;
        let file_size = py
            .detach(|| fs.getattr(id_of(id)))
            .map_err(|e| os_error(py, e, None))?
            .size;
        let want = file_size.saturating_sub(offset).min(size as u64) as usize;
        let mut got = 0;
        let bytes = PyBytes::new_with(py, want, |buf| {
            got = py
                .detach(|| fs.read_into(id_of(id), offset, buf, false))
                .map_err(|e| os_error(py, e, None))?;
            Ok(())
        })?;
        if got == want {
            return Ok(bytes);
        }
        // The file shrank meanwhile: only what was read.
        Ok(PyBytes::new(py, &bytes.as_bytes()[..got]))
    }

    /// Writes all of `data` at `offset`; returns its length.
    fn write(&self, py: Python<'_>, id: Id, offset: u64, data: &[u8]) -> PyResult<usize> {
        self.run(py, None, |fs| {
            let mut done = 0;
            while done < data.len() {
                let n = fs.write(id_of(id), offset + done as u64, &data[done..])?;
                if n == 0 {
                    return Err(Error::NoSpace);
                }
                done += n;
            }
            Ok(done)
        })
    }

    /// fallocate(2): `mode` 0 allocates, FALLOC_FL_KEEP_SIZE (1) keeps the size, with
    /// FALLOC_FL_PUNCH_HOLE (2) punches, FALLOC_FL_ZERO_RANGE (16) zeroes.
    fn fallocate(&self, py: Python<'_>, id: Id, mode: i32, offset: u64, len: u64) -> PyResult<()> {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let how = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => FallocMode::Allocate { keep_size },
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => FallocMode::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => FallocMode::ZeroRange { keep_size },
            _ => {
                return Err(os_error(
                    py,
                    Error::Unsupported(format!("fallocate mode {mode:#x}")),
                    None,
                ))
            }
        };
        self.run(py, None, |fs| fs.fallocate(id_of(id), offset, len, how))
    }

    /// copy_file_range(2) between two open files: whole extents are shared, the rest
    /// copied; returns the bytes copied.
    fn copy_file_range(
        &self,
        py: Python<'_>,
        src: Id,
        src_off: u64,
        dst: Id,
        dst_off: u64,
        len: u64,
    ) -> PyResult<u64> {
        self.run(py, None, |fs| {
            fs.copy_file_range(id_of(src), src_off, id_of(dst), dst_off, len)
        })
    }

    /// fsync(2) of an open file: durable when this returns.
    fn fsync(&self, py: Python<'_>, id: Id) -> PyResult<()> {
        self.run(py, None, |fs| fs.fsync(id_of(id), false))
    }

    /// Commits the running transaction: everything before is durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        if !self.writable {
            return Ok(());
        }
        self.run(py, None, |fs| fs.sync().map(drop))
    }

    /// chmod, chown, truncate and utime in one: None leaves a field alone; times in
    /// nanoseconds. `id` (an open file) or `path` names the inode.
    #[pyo3(signature = (path, follow, id=None, mode=None, uid=None, gid=None, size=None, atime_ns=None, mtime_ns=None))]
    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        py: Python<'_>,
        path: &[u8],
        follow: bool,
        id: Option<Id>,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime_ns: Option<i128>,
        mtime_ns: Option<i128>,
    ) -> PyResult<()> {
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime_ns.map(timespec),
            mtime: mtime_ns.map(timespec),
            ctime: None,
        };
        self.run(py, Some(path), |fs| {
            let target = match id {
                Some(id) => id_of(id),
                None => resolve(fs, fs.root(), path, follow)?,
            };
            fs.setattr(target, &set).map(drop)
        })
    }

    /// mkdir(2): directory `path` of mode `mode & ~umask`, owned by `uid`:`gid`.
    fn mkdir(
        &self,
        py: Python<'_>,
        path: &[u8],
        mode: u32,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> PyResult<()> {
        self.run(py, Some(path), |fs| {
            let (dir, name) = parent_and_name(fs, path)?;
            let new = NewInode::dir(mode & 0o7777).umask(umask).owner(uid, gid);
            fs.mkdir(dir, name, &new).map(drop)
        })
    }

    /// mknod(2): a regular file, fifo, socket or device node (`mode` with its type bits).
    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        py: Python<'_>,
        path: &[u8],
        mode: u32,
        rdev: u64,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> PyResult<()> {
        self.run(py, Some(path), |fs| {
            let (dir, name) = parent_and_name(fs, path)?;
            let new = NewInode::with_mode(mode)
                .umask(umask)
                .rdev(rdev)
                .owner(uid, gid);
            fs.mknod(dir, name, &new).map(drop)
        })
    }

    /// symlink(2): `path` pointing at `target`.
    fn symlink(
        &self,
        py: Python<'_>,
        target: &[u8],
        path: &[u8],
        uid: u32,
        gid: u32,
    ) -> PyResult<()> {
        self.run(py, Some(path), |fs| {
            let (dir, name) = parent_and_name(fs, path)?;
            fs.symlink(dir, name, target, uid, gid).map(drop)
        })
    }

    /// link(2): `dst` becomes another name of what `src` names.
    fn link(&self, py: Python<'_>, src: &[u8], dst: &[u8], follow: bool) -> PyResult<()> {
        let id = self.run(py, Some(src), |fs| resolve(fs, fs.root(), src, follow))?;
        self.run(py, Some(dst), |fs| {
            let (dir, name) = parent_and_name(fs, dst)?;
            if fs.getattr(id)?.kind == FileKind::Dir {
                return Err(Error::NotPermitted("a hard link to a directory".into()));
            }
            fs.link(id, dir, name).map(drop)
        })
    }

    /// unlink(2) of a non-directory.
    fn unlink(&self, py: Python<'_>, path: &[u8]) -> PyResult<()> {
        self.remove(py, path, false)
    }

    /// rmdir(2) of an empty directory.
    fn rmdir(&self, py: Python<'_>, path: &[u8]) -> PyResult<()> {
        self.remove(py, path, true)
    }

    /// rename(2), or renameat2(2) with RENAME_NOREPLACE or RENAME_EXCHANGE.
    fn rename(
        &self,
        py: Python<'_>,
        src: &[u8],
        dst: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> PyResult<()> {
        self.run(py, Some(src), |fs| {
            let (from, name) = parent_and_name(fs, src)?;
            let (to, new_name) = parent_and_name(fs, dst)?;
            let flags = RenameFlags {
                noreplace,
                exchange,
                ..Default::default()
            };
            fs.rename(from, name, to, new_name, flags)
        })
    }

    /// statvfs(2): (block size, blocks, free, available, files, free files, name max).
    fn statvfs(&self, py: Python<'_>) -> PyResult<(u32, u64, u64, u64, u64, u64, u32)> {
        self.run(py, None, |fs| {
            let s = fs.statfs()?;
            Ok((
                s.block_size,
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.name_max,
            ))
        })
    }

    /// Every subvolume and snapshot as a dict: id, parent id, name, path, uuid,
    /// parent_uuid, received_uuid (bytes of 16, zeros for none), generation, ctransid,
    /// otransid, readonly, otime (seconds, nanoseconds).
    fn subvolumes<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let list = self.run(py, None, |fs| fs.list_subvolumes())?;
        list.iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("id", s.id)?;
                d.set_item("parent", s.parent.map(|p| p.0))?;
                d.set_item("name", PyBytes::new(py, &s.name))?;
                d.set_item("path", s.path.as_ref().map(|p| PyBytes::new(py, p)))?;
                d.set_item("uuid", PyBytes::new(py, &s.uuid))?;
                d.set_item("parent_uuid", PyBytes::new(py, &s.parent_uuid))?;
                d.set_item("received_uuid", PyBytes::new(py, &s.received_uuid))?;
                d.set_item("generation", s.generation)?;
                d.set_item("ctransid", s.ctransid)?;
                d.set_item("otransid", s.otransid)?;
                d.set_item("readonly", s.readonly)?;
                d.set_item("otime", s.otime)?;
                Ok(d)
            })
            .collect()
    }

    /// `btrfs subvolume create`: a new, empty subvolume at `path`; returns its id.
    fn create_subvolume(&self, py: Python<'_>, path: &[u8], uid: u32, gid: u32) -> PyResult<u64> {
        self.run(py, Some(path), |fs| {
            let (dir, name) = parent_and_name(fs, path)?;
            fs.create_subvolume(dir, name, uid, gid)
        })
    }

    /// `btrfs subvolume snapshot [-r]`: a snapshot of the subvolume whose root is
    /// `source`, at `dest`; returns its id.
    fn snapshot(
        &self,
        py: Python<'_>,
        source: &[u8],
        dest: &[u8],
        readonly: bool,
    ) -> PyResult<u64> {
        let src = self.run(py, Some(source), |fs| {
            let id = resolve(fs, fs.root(), source, true)?;
            if id.ino != 256 {
                return Err(Error::InvalidArgument(
                    "not the root directory of a subvolume".into(),
                ));
            }
            Ok(id.subvol)
        })?;
        self.run(py, Some(dest), |fs| {
            let (dir, name) = parent_and_name(fs, dest)?;
            fs.snapshot(src, dir, name, readonly)
        })
    }

    /// `btrfs subvolume delete`: removes the subvolume at `path` (its space is freed in
    /// the background, as the kernel's cleaner does); returns its id.
    fn delete_subvolume(&self, py: Python<'_>, path: &[u8]) -> PyResult<u64> {
        self.run(py, Some(path), |fs| {
            let (dir, name) = parent_and_name(fs, path)?;
            fs.delete_subvolume(dir, name)
        })
    }

    /// The filesystem's label.
    fn label(&self, py: Python<'_>) -> PyResult<Py<PyBytes>> {
        let l = self.get()?.label();
        Ok(PyBytes::new(py, &l).unbind())
    }
}

/// Opens the btrfs filesystem in `path` (an image file or block device). `options` as
/// the keyword arguments of `oleo.open` (see its docstring).
#[pyfunction]
#[pyo3(signature = (path, writable, subvol=None, subvolid=None, devices=Vec::new(), compress=None, compress_force=false, cache_bytes=None, log_replay=true, degraded=false))]
#[allow(clippy::too_many_arguments)]
fn open(
    py: Python<'_>,
    path: PathBuf,
    writable: bool,
    subvol: Option<Vec<u8>>,
    subvolid: Option<u64>,
    devices: Vec<PathBuf>,
    compress: Option<String>,
    compress_force: bool,
    cache_bytes: Option<u64>,
    log_replay: bool,
    degraded: bool,
) -> PyResult<Fs> {
    let mut options = OpenOptions {
        read_only: !writable,
        subvol,
        subvolid,
        devices,
        log_replay,
        degraded,
        ..Default::default()
    };
    if let Some(c) = compress {
        options.compress = Compress::parse(Some(&c), compress_force)
            .map_err(|e| PyValueError::new_err(format!("compress={c}: {e}")))?;
    }
    if let Some(b) = cache_bytes {
        options.cache_bytes = b;
    }
    let name = path.as_os_str().as_encoded_bytes().to_vec();
    let fs = py
        .detach(|| {
            if writable {
                Filesystem::open_rw(&path, options)
            } else {
                Filesystem::open(&path, options)
            }
        })
        .map_err(|e| os_error(py, e, Some(&name)))?;
    Ok(Fs {
        inner: RwLock::new(Some(Arc::new(fs))),
        writable,
    })
}

/// Makes a new btrfs filesystem in `path` as mkfs.btrfs does, filled from the host
/// directory `rootdir` if given. Returns (fsid, total bytes).
#[pyfunction]
#[pyo3(signature = (path, size=None, rootdir=None, label=None, nodesize=None, csum=None, metadata=None, data=None, uuid=None, owner=None, force=false))]
#[allow(clippy::too_many_arguments)]
fn mkfs(
    py: Python<'_>,
    path: PathBuf,
    size: Option<u64>,
    rootdir: Option<PathBuf>,
    label: Option<String>,
    nodesize: Option<u32>,
    csum: Option<String>,
    metadata: Option<String>,
    data: Option<String>,
    uuid: Option<[u8; 16]>,
    owner: Option<(u32, u32)>,
    force: bool,
) -> PyResult<(Py<PyBytes>, u64)> {
    let mut o = MkfsOptions {
        size,
        label,
        fsid: uuid,
        force,
        ..Default::default()
    };
    if let Some(n) = nodesize {
        o.nodesize = n;
    }
    if let Some(c) = csum {
        o.csum = oleo::format::CsumType::parse(&c)
            .ok_or_else(|| PyValueError::new_err(format!("unknown checksum {c:?}")))?;
    }
    if let Some(m) = metadata {
        o.metadata_profile = Profile::parse(&m)
            .ok_or_else(|| PyValueError::new_err(format!("unknown profile {m:?}")))?;
    }
    if let Some(d) = data {
        o.data_profile = Profile::parse(&d)
            .ok_or_else(|| PyValueError::new_err(format!("unknown profile {d:?}")))?;
    }
    if let Some(owner) = owner {
        o.root_owner = owner;
    }
    let name = path.as_os_str().as_encoded_bytes().to_vec();
    let report = py
        .detach(|| -> oleo::Result<_> {
            let report = oleo::mkfs::mkfs(&path, &o)?;
            if let Some(dir) = &rootdir {
                let fs = Filesystem::open_rw(&path, OpenOptions::default())?;
                oleo::mkfs::rootdir::fill(&fs, dir, &mut |_, _| {})?;
                fs.close()?;
            }
            Ok(report)
        })
        .map_err(|e| os_error(py, e, Some(&name)))?;
    Ok((PyBytes::new(py, &report.fsid).unbind(), report.total_bytes))
}

/// The native module.
#[pymodule]
fn _oleo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Fs>()?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(mkfs, m)?)?;
    m.add("CorruptError", m.py().get_type::<CorruptError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
