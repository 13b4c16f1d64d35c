//! Writing files into an unmounted image through the library, for `oleo cp` and `oleo tar`:
//! `IMAGE:PATH` arguments, an open image with the caller's rights (as the kernel would give
//! them: a non-root caller keeps no foreign owner, makes no device node and sets no
//! trusted.*/security.* xattr), one inode made with its owner, mode, xattrs and times, data
//! written in large pieces with holes left as holes, commits every so often, and errors that
//! name the path and let the run go on.

use crate::common::progress::Meter;
use oleo::{Error, FileKind, Filesystem, InodeId, NewInode, OpenOptions, SetAttr, Timespec};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes per write: large extents, bounded memory.
pub const CHUNK: usize = 8 << 20;
/// A commit after this much data, or this long, whichever comes first: a run stopped
/// half-way loses at most that much, and the running transaction stays small.
const COMMIT_BYTES: u64 = 1 << 30;
const COMMIT_EVERY: Duration = Duration::from_secs(30);

/// chattr flags that a copy keeps (FS_IOC_GETFLAGS bits): NOCOW and compression.
pub const FS_COMPR_FL: u32 = 0x0000_0004;
pub const FS_NOCOMP_FL: u32 = 0x0000_0400;
pub const FS_NOCOW_FL: u32 = 0x0080_0000;
pub const KEPT_FLAGS: u32 = FS_COMPR_FL | FS_NOCOMP_FL | FS_NOCOW_FL;

/// A place in an image: `IMAGE:PATH`.
#[derive(Clone, Debug)]
pub struct InImage {
    pub image: PathBuf,
    /// Path from the opened subvolume's root; empty for the root.
    pub path: Vec<u8>,
}

/// `IMAGE:PATH` if the part before the first colon is an image file or block device and
/// the whole argument is no existing host path; None for a host path.
pub fn parse_place(arg: &OsStr) -> Option<InImage> {
    let bytes = arg.as_bytes();
    if Path::new(arg).symlink_metadata().is_ok() {
        return None;
    }
    let colon = bytes.iter().position(|&b| b == b':')?;
    let image = PathBuf::from(OsStr::from_bytes(&bytes[..colon]));
    let meta = std::fs::metadata(&image).ok()?;
    if !(meta.is_file() || meta.file_type().is_block_device()) {
        return None;
    }
    Some(InImage {
        image,
        path: trim_path(&bytes[colon + 1..]),
    })
}

/// `path` without leading, trailing and doubled slashes and `.` components.
pub fn trim_path(path: &[u8]) -> Vec<u8> {
    let parts: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    parts.join(&b'/')
}

/// Splits a trimmed path into (parent, last component).
pub fn split_last(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

pub fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// An image opened for reading, `subvol` (a path from the top level) as its root.
pub fn open_read(image: &Path, subvol: Option<&str>) -> Result<Filesystem, String> {
    let options = OpenOptions {
        subvol: subvol.map(|s| trim_path(s.as_bytes())),
        ..OpenOptions::default()
    };
    Filesystem::open(image, options).map_err(|e| format!("{}: {e}", image.display()))
}

/// (name, value) pairs.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Times as stat gives them.
#[derive(Clone, Copy, Debug)]
pub struct Times {
    pub atime: Timespec,
    pub mtime: Timespec,
}

/// What a new inode in the image gets: the source's type, mode, owner, device number,
/// times, xattrs and chattr flags.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Type and permission bits, as st_mode.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub times: Times,
    pub xattrs: Xattrs,
    /// FS_IOC_GETFLAGS bits (only `KEPT_FLAGS` count).
    pub flags: u32,
}

impl Meta {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// How much of the source's metadata a copy keeps.
#[derive(Clone, Copy, Debug)]
pub struct Keep {
    /// Owner (as far as the caller may), as cp -p / tar --same-owner.
    pub owner: bool,
    /// Every mode bit; false: the permission bits less the umask.
    pub mode: bool,
    /// Access and modification times.
    pub times: bool,
    /// Xattrs, POSIX ACLs included, and the NOCOW/compression flags.
    pub xattrs: bool,
}

/// The image being written, and the run's state: errors seen, data since the last commit,
/// the progress line.
pub struct Sink {
    pub fs: Filesystem,
    image: PathBuf,
    pub meter: Meter,
    /// Something failed: the exit status is 1.
    pub failed: bool,
    root: bool,
    euid: u32,
    egid: u32,
    groups: Vec<u32>,
    umask: u32,
    since_commit: u64,
    last_commit: Instant,
    /// Directories `dir_at` found, by path: an archive names a member's directory with
    /// every member, and a directory, once there, is never removed or replaced by this
    /// run (`clear_slot` refuses to).
    dirs: HashMap<Vec<u8>, InodeId>,
}

impl Sink {
    pub fn open(image: &Path, subvol: Option<&str>, quiet: bool) -> Result<Sink, String> {
        let options = OpenOptions {
            subvol: subvol.map(|s| trim_path(s.as_bytes())),
            // One thread fills the image: its data writes run beside its tree work.
            write_behind: true,
            ..OpenOptions::default()
        };
        let fs =
            Filesystem::open_rw(image, options).map_err(|e| format!("{}: {e}", image.display()))?;
        // SAFETY: these calls cannot fail; umask is set back at once.
        let (euid, egid, umask) = unsafe {
            let m = libc::umask(0);
            libc::umask(m);
            (libc::geteuid(), libc::getegid(), m as u32)
        };
        let groups = supplementary_groups();
        Ok(Sink {
            fs,
            image: image.to_path_buf(),
            meter: Meter::new(quiet),
            failed: false,
            root: euid == 0,
            euid,
            egid,
            groups,
            umask,
            since_commit: 0,
            last_commit: Instant::now(),
            dirs: HashMap::new(),
        })
    }

    /// Reports an error about `what` (a path) and goes on.
    pub fn report(&mut self, what: &str, e: impl std::fmt::Display) {
        self.meter.clear();
        eprintln!("oleo: {what}: {e}");
        self.failed = true;
    }

    /// Commits if enough data or time went by since the last commit.
    pub fn maybe_commit(&mut self) -> Result<(), String> {
        if self.since_commit >= COMMIT_BYTES || self.last_commit.elapsed() >= COMMIT_EVERY {
            self.fs
                .sync()
                .map_err(|e| format!("{}: commit: {e}", self.image.display()))?;
            self.since_commit = 0;
            self.last_commit = Instant::now();
        }
        Ok(())
    }

    /// The final commit. True if every file went well.
    pub fn finish(self) -> Result<bool, String> {
        let Sink {
            fs,
            image,
            meter,
            failed,
            ..
        } = self;
        meter.clear();
        drop(meter);
        fs.close()
            .map_err(|e| format!("{}: final commit: {e}", image.display()))?;
        Ok(!failed)
    }

    pub fn is_root(&self) -> bool {
        self.root
    }

    /// The owner a new inode gets: the source's if the caller may give it (root; anyone
    /// for a group of their own), else the caller's. True if the source's was kept.
    fn owner(&self, meta: &Meta, keep: Keep) -> (u32, u32, bool) {
        if !keep.owner {
            return (self.euid, self.egid, false);
        }
        if self.root {
            return (meta.uid, meta.gid, true);
        }
        let gid = if meta.gid == self.egid || self.groups.contains(&meta.gid) {
            meta.gid
        } else {
            self.egid
        };
        (self.euid, gid, self.euid == meta.uid && gid == meta.gid)
    }

    fn perm(&self, meta: &Meta, keep: Keep, owner_kept: bool) -> u32 {
        let mut perm = meta.mode & 0o7777;
        if !keep.mode {
            perm &= 0o777 & !self.umask;
        }
        if !owner_kept && keep.owner {
            // As cp -p: set-id bits go with an owner that could not be kept.
            perm &= !(libc::S_ISUID | libc::S_ISGID);
        }
        perm
    }

    /// Where `name` in `dir` is to be made: an existing directory is kept for a directory
    /// (returned, to merge into); anything else in the way is removed; a directory in the
    /// way of a non-directory (or the reverse) is an error, as for cp.
    pub fn clear_slot(
        &self,
        dir: InodeId,
        name: &[u8],
        want_dir: bool,
    ) -> Result<Option<InodeId>, String> {
        let id = match self.fs.lookup(dir, name) {
            Ok(id) => id,
            Err(Error::NotFound) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let attr = self.fs.getattr(id).map_err(|e| e.to_string())?;
        match (attr.kind == FileKind::Dir, want_dir) {
            (true, true) => Ok(Some(id)),
            (true, false) => Err("cannot overwrite directory with non-directory".into()),
            (false, true) => Err("cannot overwrite non-directory with directory".into()),
            (false, false) => {
                self.fs.unlink(dir, name).map_err(|e| e.to_string())?;
                Ok(None)
            }
        }
    }

    /// Makes `name` in `dir` as `meta` says (a directory that exists is merged into), with
    /// owner, mode, flags and xattrs; not its data and not its times (`set_times`, once
    /// its contents are in). `target` is a symlink's.
    pub fn create(
        &mut self,
        dir: InodeId,
        name: &[u8],
        meta: &Meta,
        target: Option<&[u8]>,
        keep: Keep,
    ) -> Result<InodeId, String> {
        let existing = self.clear_slot(dir, name, meta.is_dir())?;
        let (uid, gid, owner_kept) = self.owner(meta, keep);
        let perm = self.perm(meta, keep, owner_kept);
        let fmt = meta.mode & libc::S_IFMT;
        if (fmt == libc::S_IFCHR || fmt == libc::S_IFBLK) && !self.root {
            // mknod(2) of a device needs CAP_MKNOD.
            return Err(Error::NotPermitted("mknod".into()).to_string());
        }
        let e = |e: Error| e.to_string();
        let id = if let Some(id) = existing {
            self.chown_chmod(id, uid, gid, perm, keep)?;
            id
        } else {
            match fmt {
                libc::S_IFDIR => {
                    let id = self
                        .fs
                        .mkdir(dir, name, &NewInode::dir(perm).owner(uid, gid))
                        .map_err(e)?
                        .id;
                    if perm & (libc::S_ISUID | libc::S_ISGID) != 0 {
                        // mkdir keeps only the permission and sticky bits.
                        self.chown_chmod(
                            id,
                            uid,
                            gid,
                            perm,
                            Keep {
                                owner: false,
                                ..keep
                            },
                        )?;
                    }
                    id
                }
                libc::S_IFLNK => {
                    self.fs
                        .symlink(dir, name, target.unwrap_or_default(), uid, gid)
                        .map_err(e)?
                        .id
                }
                _ => {
                    let new = NewInode::with_mode(fmt | perm)
                        .rdev(meta.rdev)
                        .owner(uid, gid);
                    let made = self.fs.mknod(dir, name, &new).map_err(e)?;
                    // Whatever the creation did with the set-id bits, they are as asked
                    // (a second change only where it dropped some).
                    if made.mode & 0o7777 != perm {
                        self.set_mode(made.id, perm)?;
                    }
                    made.id
                }
            }
        };
        self.flags_and_xattrs(id, meta, keep)?;
        Ok(id)
    }

    /// An existing directory takes `meta`'s owner, mode and xattrs.
    pub fn apply_to_existing_dir(
        &mut self,
        id: InodeId,
        meta: &Meta,
        keep: Keep,
    ) -> Result<(), String> {
        let (uid, gid, owner_kept) = self.owner(meta, keep);
        let perm = self.perm(meta, keep, owner_kept);
        self.chown_chmod(id, uid, gid, perm, keep)?;
        self.flags_and_xattrs(id, meta, keep)
    }

    fn chown_chmod(
        &self,
        id: InodeId,
        uid: u32,
        gid: u32,
        perm: u32,
        keep: Keep,
    ) -> Result<(), String> {
        let e = |e: Error| e.to_string();
        if keep.owner {
            self.fs
                .setattr(
                    id,
                    &SetAttr {
                        uid: Some(uid),
                        gid: Some(gid),
                        ..SetAttr::default()
                    },
                )
                .map_err(e)?;
        }
        if keep.mode || keep.owner {
            self.set_mode(id, perm)?;
        }
        Ok(())
    }

    /// Sets `id`'s permission bits (set-id and sticky included) to `perm`.
    fn set_mode(&self, id: InodeId, perm: u32) -> Result<(), String> {
        let mode = SetAttr {
            mode: Some(perm),
            ..SetAttr::default()
        };
        self.fs
            .setattr(id, &mode)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The NOCOW/compression flags (before any data: NOCOW only takes on an empty file),
    /// then the xattrs, POSIX ACLs among them.
    fn flags_and_xattrs(&mut self, id: InodeId, meta: &Meta, keep: Keep) -> Result<(), String> {
        if !keep.xattrs {
            return Ok(());
        }
        let e = |e: Error| e.to_string();
        let fmt = meta.mode & libc::S_IFMT;
        if (fmt == libc::S_IFREG || fmt == libc::S_IFDIR) && meta.flags & KEPT_FLAGS != 0 {
            let old = self.fs.get_fs_flags(id).map_err(e)?;
            self.fs
                .set_fs_flags(id, (old & !KEPT_FLAGS) | (meta.flags & KEPT_FLAGS))
                .map_err(e)?;
        }
        for (xname, value) in &meta.xattrs {
            if !self.root && (xname.starts_with(b"trusted.") || xname.starts_with(b"security.")) {
                // Not the caller's to set; cp -a and tar skip them quietly too.
                continue;
            }
            self.fs
                .setxattr(id, xname, value, oleo::XattrSet::Either)
                .map_err(|err| format!("xattr {}: {err}", show(xname)))?;
        }
        Ok(())
    }

    /// Another name for `id`.
    pub fn link(&mut self, id: InodeId, dir: InodeId, name: &[u8]) -> Result<(), String> {
        self.clear_slot(dir, name, false)?;
        self.fs.link(id, dir, name).map_err(|e| e.to_string())?;
        Ok(())
    }

    pub fn set_times(&self, id: InodeId, times: &Times) -> Result<(), String> {
        self.set_attrs(
            id,
            SetAttr {
                atime: Some(times.atime),
                mtime: Some(times.mtime),
                ..SetAttr::default()
            },
        )
    }

    fn set_attrs(&self, id: InodeId, set: SetAttr) -> Result<(), String> {
        self.fs
            .setattr(id, &set)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Writes `data` at `offset` of `id`, all of it.
    pub fn write(&mut self, id: InodeId, offset: u64, data: &[u8]) -> Result<(), String> {
        let mut done = 0;
        while done < data.len() {
            let n = self
                .fs
                .write(id, offset + done as u64, &data[done..])
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("short write".into());
            }
            done += n;
        }
        self.meter.add(data.len());
        self.since_commit += data.len() as u64;
        Ok(())
    }

    /// Sets the size (a hole at the end is a hole) and then the times, in one change.
    pub fn set_size_and_times(&self, id: InodeId, size: u64, times: &Times) -> Result<(), String> {
        self.set_attrs(
            id,
            SetAttr {
                size: Some(size),
                atime: Some(times.atime),
                mtime: Some(times.mtime),
                ..SetAttr::default()
            },
        )
    }

    /// Sets the size: a hole at the end is a hole.
    pub fn set_size(&self, id: InodeId, size: u64) -> Result<(), String> {
        self.set_attrs(
            id,
            SetAttr {
                size: Some(size),
                ..SetAttr::default()
            },
        )
    }

    /// The directory at `path` (trimmed) below the root, made (with the caller as owner
    /// and 0777 less the umask) where missing if `make`.
    pub fn dir_at(&mut self, path: &[u8], make: bool) -> Result<InodeId, String> {
        if let Some(&id) = self.dirs.get(path) {
            return Ok(id);
        }
        let mut id = self.fs.root();
        let mut at = 0;
        for c in path.split(|&b| b == b'/') {
            let prefix = &path[..(at + c.len()).min(path.len())];
            at += c.len() + 1;
            if c.is_empty() {
                continue;
            }
            id = match self.fs.lookup(id, c) {
                Ok(next) => next,
                Err(Error::NotFound) if make => {
                    let new = NewInode::dir(0o777 & !self.umask).owner(self.euid, self.egid);
                    self.fs
                        .mkdir(id, c, &new)
                        .map_err(|e| format!("{}: {e}", show(path)))?
                        .id
                }
                Err(e) => return Err(format!("{}: {e}", show(path))),
            };
            let attr = self
                .fs
                .getattr(id)
                .map_err(|e| format!("{}: {e}", show(path)))?;
            if attr.kind != FileKind::Dir {
                return Err(format!("{}: {}", show(path), Error::NotDir));
            }
            self.dirs.insert(prefix.to_vec(), id);
        }
        Ok(id)
    }
}

/// Now, as the kernel stamps a time.
pub fn now() -> Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// The caller's supplementary groups.
fn supplementary_groups() -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; 65536];
    // SAFETY: the buffer holds as many gids as its length says.
    let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    groups.truncate(n.max(0) as usize);
    groups
}
