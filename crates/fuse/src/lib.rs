//! The FUSE server: decodes requests, calls the oleo engine, replies. No filesystem logic
//! lives here.
//!
//! Node ids: FUSE wants one 64-bit id per inode, btrfs has (subvolume, inode number) pairs.
//! The opened subvolume's root is FUSE's root id 1. Every other inode is
//! `(subvolume index << 48) | inode number`, where the subvolume index is a small number
//! this mount hands out in the order it meets subvolumes (0 = the opened subvolume). The
//! same value is st_ino, so inode numbers in the opened subvolume are exactly btrfs's and
//! stay unique across the whole mount (all subvolumes share FUSE's one st_dev).

mod nodeid;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use nodeid::NodeIds;
use oleo::{Attr, Error, FileKind, Filesystem, InodeId};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use fuser::{BackgroundSession, Config, MountOption, Session, SessionACL};

/// The image cannot change under a read-only mount, so the kernel may cache for as long as
/// it likes.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Largest read and readahead we negotiate: 1 MiB requests.
const MAX_IO: u32 = 1 << 20;

pub struct OleoFuse {
    fs: Arc<Filesystem>,
    ids: NodeIds,
}

impl OleoFuse {
    pub fn new(fs: Arc<Filesystem>) -> OleoFuse {
        let ids = NodeIds::new(fs.root());
        OleoFuse { fs, ids }
    }

    fn id(&self, ino: INodeNo) -> Result<InodeId, Errno> {
        self.ids.decode(ino.0).ok_or(Errno::ESTALE)
    }

    fn file_attr(&self, a: &Attr) -> Result<FileAttr, Errno> {
        let ino = self.ids.st_ino(a.id).ok_or(Errno::EOVERFLOW)?;
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: a.size,
            blocks: a.blocks,
            atime: time(a.atime),
            mtime: time(a.mtime),
            ctime: time(a.ctime),
            crtime: time(a.crtime),
            kind: file_type(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            blksize: a.blksize,
            flags: 0,
        })
    }

    fn entry_attr(&self, id: InodeId) -> Result<FileAttr, Errno> {
        let attr = self.fs.getattr(id).map_err(errno)?;
        self.file_attr(&attr)
    }

    fn list(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(u64, InodeId, FileKind, &[u8], u64) -> bool,
    ) -> Result<(), Errno> {
        let dir = self.id(ino)?;
        // Offsets 1 and 2 follow "." and ".."; a real entry with DIR_INDEX i resumes at i + 1.
        if offset < 1 && add(ino.0, dir, FileKind::Dir, b".", 1) {
            return Ok(());
        }
        if offset < 2 && add(ino.0, dir, FileKind::Dir, b"..", 2) {
            return Ok(());
        }
        let mut err = None;
        self.fs
            .readdir(dir, offset.max(2), &mut |e| match self.ids.encode(e.id) {
                Some(node) => !add(node, e.id, e.kind, &e.name, e.next_offset),
                None => {
                    err = Some(Errno::EOVERFLOW);
                    false
                }
            })
            .map_err(errno)?;
        err.map_or(Ok(()), Err)
    }
}

fn errno(e: Error) -> Errno {
    if matches!(
        e,
        Error::Corrupt { .. } | Error::DataChecksum { .. } | Error::Io(_)
    ) {
        log::error!("{e}");
    }
    Errno::from_i32(e.errno())
}

fn time(t: oleo::Timespec) -> SystemTime {
    let nanos = Duration::new(t.sec.unsigned_abs(), t.nsec);
    if t.sec >= 0 {
        UNIX_EPOCH + nanos
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::new(t.sec.unsigned_abs(), 0))
            .map_or(UNIX_EPOCH, |b| b + Duration::new(0, t.nsec))
    }
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

impl fuser::Filesystem for OleoFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_ASYNC_READ
            // The kernel then caches ACLs (found or absent) instead of asking per access.
            | InitFlags::FUSE_POSIX_ACL;
        let _ = config.add_capabilities(wanted & config.capabilities());
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self
            .id(parent)
            .and_then(|dir| self.fs.lookup(dir, name.as_bytes()).map_err(errno))
            .and_then(|id| self.entry_attr(id));
        match r {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.id(ino).and_then(|id| self.entry_attr(id)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self
            .id(ino)
            .and_then(|id| self.fs.readlink(id).map_err(errno))
        {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self
            .id(ino)
            .and_then(|id| self.fs.read(id, offset, size).map_err(errno))
        {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let Ok(from) = u64::try_from(offset) else {
            return reply.error(Errno::EINVAL);
        };
        // The kernel answers SEEK_SET/CUR/END itself; only the extent-aware ones come here.
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        match self.id(ino).and_then(|id| self.fs.seek_data_hole(id, from, data).map_err(errno)) {
            Ok(at) => reply.offset(at as i64),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.list(ino, offset, |node, _id, kind, name, next| {
            reply.add(
                INodeNo(node),
                next,
                file_type(kind),
                OsStr::from_bytes(name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut err = None;
        let r = self.list(ino, offset, |node, id, _kind, name, next| {
            match self.entry_attr(id) {
                Ok(attr) => reply.add(
                    INodeNo(node),
                    next,
                    OsStr::from_bytes(name),
                    &TTL,
                    &attr,
                    Generation(0),
                ),
                Err(e) => {
                    err = Some(e);
                    true
                }
            }
        });
        match r.and_then(|_| err.map_or(Ok(()), Err)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self
            .id(ino)
            .and_then(|id| self.fs.getxattr(id, name.as_bytes()).map_err(errno))
        {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self
            .id(ino)
            .and_then(|id| self.fs.listxattr(id).map_err(errno))
        {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                if size == 0 {
                    reply.size(buf.len() as u32)
                } else if buf.len() > size as usize {
                    reply.error(Errno::ERANGE)
                } else {
                    reply.data(&buf)
                }
            }
            Err(e) => reply.error(e),
        }
    }
}

/// Mount options for a read-only oleo mount. `source` shows in /proc/mounts.
pub fn config(source: &str, threads: usize, allow_other: bool) -> Config {
    let mount_options = vec![
        MountOption::FSName(source.to_string()),
        MountOption::Subtype("oleo".into()),
        MountOption::RO,
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
    ];
    let mut cfg = Config::default();
    cfg.mount_options = mount_options;
    cfg.n_threads = Some(threads.max(1));
    cfg.clone_fd = true;
    if allow_other {
        cfg.acl = SessionACL::All;
    }
    cfg
}

/// Raises the kernel's readahead window for the mount at `mountpoint`. FUSE can only shrink
/// it at init, and the default 128 KiB caps sequential reads at a fraction of the disk.
/// Needs root (sysfs); best effort otherwise. The device number comes from mountinfo: a stat
/// of the mount point would ask this very server, which is not serving yet; for the same
/// reason `canonical_mountpoint` must have been resolved before mounting.
pub fn set_readahead(canonical_mountpoint: &std::path::Path, kib: u32) -> std::io::Result<()> {
    let want = canonical_mountpoint;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dev = info
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let point = f.get(4)?.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\");
            (std::path::Path::new(&point) == want).then(|| f.get(2).map(|d| d.to_string()))?
        })
        .last()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "mount not in mountinfo"))?;
    std::fs::write(format!("/sys/class/bdi/{dev}/read_ahead_kb"), kib.to_string())
}
