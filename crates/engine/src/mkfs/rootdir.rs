//! Filling a new filesystem from a directory (`mkfs --rootdir`), through the ordinary write
//! API: no root, no mount. Every kind of inode is copied with its owner, mode, xattrs (POSIX
//! ACLs included), atime and mtime; hard links stay one inode; holes stay holes (found with
//! SEEK_DATA/SEEK_HOLE); ctime is the time of the copy, as the kernel would stamp it. Other
//! filesystems mounted below the source are not entered (their mount points are copied as
//! empty directories), as with mkfs.btrfs.

use crate::error::{Error, Result};
use crate::inode::xattr::XattrSet;
use crate::transaction::fs::{FsCore, InodeId, Timespec};
use crate::vfs::inode_ops::NewInode;
use crate::vfs::setattr::SetAttr;
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Bytes copied per write: large extents, bounded memory.
const CHUNK: usize = 8 << 20;

/// How far the copy has got (for a progress display).
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// Inodes (files, directories, symlinks, ...) below the source; `measure` counts
    /// every entry, so a file with several names counts once per name there.
    pub inodes: u64,
    /// Data bytes copied (holes not counted).
    pub bytes: u64,
}

/// What a source tree needs: its inodes and data bytes (holes not counted).
pub fn measure(src: &Path) -> Result<Progress> {
    let root = std::fs::symlink_metadata(src).map_err(|e| at(src, e))?;
    let mut total = Progress::default();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| at(&dir, e))? {
            let entry = entry.map_err(|e| at(&dir, e))?;
            let meta = entry.metadata().map_err(|e| at(&entry.path(), e))?;
            total.inodes += 1;
            total.bytes += (meta.blocks() * 512).min(meta.len());
            if meta.is_dir() && meta.dev() == root.dev() {
                stack.push(entry.path());
            }
        }
    }
    Ok(total)
}

/// Copies the tree under `src` into `fs`'s root directory, which takes `src`'s owner, mode
/// and times. `progress` is called after each inode with the totals so far and its path.
pub fn fill(
    fs: &crate::Filesystem,
    src: &Path,
    progress: &mut dyn FnMut(&Progress, &Path),
) -> Result<()> {
    // One writer, many small operations: the filesystem stays ours for the whole copy.
    let mut core = fs.core_mut();
    let fs = &mut *core;
    let root_meta = std::fs::symlink_metadata(src).map_err(|e| at(src, e))?;
    if !root_meta.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "{}: --rootdir needs a directory",
            src.display()
        )));
    }
    let mut copy = Copy {
        fs,
        device: root_meta.dev(),
        links: HashMap::new(),
        done: Progress::default(),
        buf: vec![0u8; CHUNK],
    };
    let root = copy.fs.root();
    copy.attributes(root, src, &root_meta)?;
    copy.dir(root, src, progress)?;
    copy.times(root, &root_meta)
}

struct Copy<'a> {
    fs: &'a mut FsCore,
    device: u64,
    /// Source (st_dev, st_ino) of inodes with more than one link, to link them again.
    links: HashMap<(u64, u64), InodeId>,
    done: Progress,
    buf: Vec<u8>,
}

impl Copy<'_> {
    fn dir(
        &mut self,
        dir: InodeId,
        path: &Path,
        progress: &mut dyn FnMut(&Progress, &Path),
    ) -> Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| at(path, e))?
            .collect::<std::io::Result<_>>()
            .map_err(|e| at(path, e))?;
        // A stable order makes images of the same tree the same.
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let src = entry.path();
            let name = entry.file_name();
            let meta = std::fs::symlink_metadata(&src).map_err(|e| at(&src, e))?;
            self.entry(dir, name.as_bytes(), &src, &meta, progress)
                .map_err(|e| match e {
                    Error::NoSpace => Error::InvalidArgument(format!(
                        "{}: no space left in the new filesystem",
                        src.display()
                    )),
                    e => e,
                })?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        dir: InodeId,
        name: &[u8],
        src: &Path,
        meta: &Metadata,
        progress: &mut dyn FnMut(&Progress, &Path),
    ) -> Result<()> {
        let key = (meta.dev(), meta.ino());
        if !meta.is_dir() && meta.nlink() > 1 {
            if let Some(&id) = self.links.get(&key) {
                self.fs.link(id, dir, name)?;
                return Ok(());
            }
        }
        let mode = meta.mode();
        let owner = (meta.uid(), meta.gid());
        let ft = meta.file_type();
        let id = if ft.is_dir() {
            self.fs
                .mkdir(
                    dir,
                    name,
                    &NewInode::dir(mode & 0o7777).owner(owner.0, owner.1),
                )?
                .id
        } else if ft.is_symlink() {
            let target = std::fs::read_link(src).map_err(|e| at(src, e))?;
            self.fs
                .symlink(dir, name, target.as_os_str().as_bytes(), owner.0, owner.1)?
                .id
        } else {
            let new = NewInode::with_mode(mode)
                .rdev(meta.rdev())
                .owner(owner.0, owner.1);
            self.fs.mknod(dir, name, &new)?.id
        };
        if !ft.is_symlink() {
            self.attributes(id, src, meta)?;
        } else {
            self.xattrs(id, src)?;
        }
        if ft.is_file() {
            self.data(id, src, meta)?;
        }
        if meta.nlink() > 1 && !ft.is_dir() {
            self.links.insert(key, id);
        }
        self.done.inodes += 1;
        progress(&self.done, src);
        if ft.is_dir() && meta.dev() == self.device {
            self.dir(id, src, progress)?;
        }
        // After the contents: filling a directory changes its mtime.
        self.times(id, meta)
    }

    /// Owner, then mode (a chown may clear set-id bits), then xattrs (an ACL matches the
    /// mode it was read with).
    fn attributes(&mut self, id: InodeId, src: &Path, meta: &Metadata) -> Result<()> {
        self.fs.setattr(
            id,
            &SetAttr {
                uid: Some(meta.uid()),
                gid: Some(meta.gid()),
                ..SetAttr::default()
            },
        )?;
        self.fs.setattr(
            id,
            &SetAttr {
                mode: Some(meta.mode() & 0o7777),
                ..SetAttr::default()
            },
        )?;
        self.xattrs(id, src)
    }

    fn times(&mut self, id: InodeId, meta: &Metadata) -> Result<()> {
        let t = |sec: i64, nsec: i64| Timespec {
            sec,
            nsec: nsec as u32,
        };
        self.fs.setattr(
            id,
            &SetAttr {
                atime: Some(t(meta.atime(), meta.atime_nsec())),
                mtime: Some(t(meta.mtime(), meta.mtime_nsec())),
                ..SetAttr::default()
            },
        )?;
        Ok(())
    }

    fn xattrs(&mut self, id: InodeId, src: &Path) -> Result<()> {
        for (name, value) in read_xattrs(src)? {
            self.fs.setxattr(id, &name, &value, XattrSet::Either)?;
        }
        Ok(())
    }

    /// The data ranges of `src` (holes skipped), then the size.
    fn data(&mut self, id: InodeId, src: &Path, meta: &Metadata) -> Result<()> {
        let file = File::open(src).map_err(|e| at(src, e))?;
        let len = meta.len();
        let mut at_off = 0u64;
        while at_off < len {
            let Some((start, end)) = next_data(&file, at_off, len) else {
                break;
            };
            let mut pos = start;
            while pos < end {
                let n = ((end - pos) as usize).min(self.buf.len());
                let got = read_full(&file, &mut self.buf[..n], pos).map_err(|e| at(src, e))?;
                if got == 0 {
                    break;
                }
                self.fs.write(id, pos, &self.buf[..got], false)?;
                self.done.bytes += got as u64;
                pos += got as u64;
            }
            at_off = end;
        }
        // A trailing hole: the size says where the file ends.
        self.fs.setattr(
            id,
            &SetAttr {
                size: Some(len),
                ..SetAttr::default()
            },
        )?;
        Ok(())
    }
}

/// The next data range at or after `from` of a host file `len` bytes long, as (start, end),
/// by SEEK_DATA/SEEK_HOLE (a filesystem without them reports all data). None: only a hole
/// is left. For copying sparse host files in (also `oleo cp`, `oleo tar`).
pub fn next_data(file: &File, from: u64, len: u64) -> Option<(u64, u64)> {
    let fd = file.as_raw_fd();
    // SAFETY: lseek on an open descriptor.
    let start = unsafe { libc::lseek(fd, from as i64, libc::SEEK_DATA) };
    if start < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        return (e != Some(libc::ENXIO)).then_some((from, len));
    }
    // SAFETY: as above.
    let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
    let end = if end < 0 { len } else { (end as u64).min(len) };
    Some((start as u64, end))
}

/// Reads `buf.len()` bytes of a host file at `at`, fewer only at its end; the bytes read.
pub fn read_full(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64)? {
            0 => break,
            n => done += n,
        }
    }
    Ok(done)
}

/// Every xattr of host file `path` (not following a symlink) this process may read, as
/// (name, value); none where the filesystem has no xattrs. Also for `oleo cp`.
pub fn read_xattrs(path: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::InvalidArgument(format!("{}: NUL in path", path.display())))?;
    let mut names = vec![0u8; 4096];
    let n = loop {
        // SAFETY: c is NUL-terminated, names a valid buffer of its length.
        let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
        if n >= 0 {
            break n as usize;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) => names.resize(names.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(at(path, e)),
        }
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let cn = CString::new(name).expect("split at NUL");
        let mut value = vec![0u8; 4096];
        loop {
            // SAFETY: both strings are NUL-terminated, value a valid buffer.
            let got = unsafe {
                libc::lgetxattr(
                    c.as_ptr(),
                    cn.as_ptr(),
                    value.as_mut_ptr().cast(),
                    value.len(),
                )
            };
            if got >= 0 {
                value.truncate(got as usize);
                out.push((name.to_vec(), value));
                break;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ERANGE) => value.resize(value.len() * 4, 0),
                // Gone since the listing.
                Some(libc::ENODATA) => break,
                _ => {
                    return Err(Error::Io(std::io::Error::new(
                        e.kind(),
                        format!(
                            "{}: xattr {}: {e}",
                            path.display(),
                            String::from_utf8_lossy(name)
                        ),
                    )))
                }
            }
        }
    }
    Ok(out)
}

/// An IO error that names the source path.
fn at(path: &Path, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(
        e.kind(),
        format!("{}: {e}", PathBuf::from(path).display()),
    ))
}
