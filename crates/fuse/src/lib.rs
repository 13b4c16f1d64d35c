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
mod space_guard;

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use nodeid::NodeIds;
use oleo::{Attr, Error, FallocMode, FileKind, Filesystem, InodeId, NewInode, SetAttr, XattrSet};
use parking_lot::RwLock;
use space_guard::{OpenMode, SpaceGuard};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use fuser::{BackgroundSession, Config, MountOption, Session, SessionACL};
pub use space_guard::NotifierSlot;

/// The image cannot change under a read-only mount, so the kernel may cache for as long as
/// it likes. A writable mount changes only through this server, and the kernel drops what
/// its own changes make stale; attributes the kernel cannot predict (a directory's size
/// after a create, another name's nlink) expire after `RW_TTL`.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);
const RW_TTL: Duration = Duration::from_secs(1);

/// Largest read and readahead we negotiate: 1 MiB requests.
const MAX_IO: u32 = 1 << 20;

/// How a mount behaves beyond what the image says.
#[derive(Clone, Debug)]
pub struct MountSettings {
    /// Serve writes (the image must have been opened writable).
    pub writable: bool,
    /// Seconds between commits of the running transaction (btrfs's commit=).
    pub commit_interval: Duration,
}

impl Default for MountSettings {
    fn default() -> Self {
        MountSettings {
            writable: false,
            commit_interval: Duration::from_secs(30),
        }
    }
}

pub struct OleoFuse {
    /// Reads share the lock; an operation that writes holds it alone.
    fs: Arc<RwLock<Filesystem>>,
    ids: NodeIds,
    settings: MountSettings,
    ttl: Duration,
    space: Arc<SpaceGuard>,
    /// The kernel's lookup count per node. While above zero the inode is pinned: unlinked,
    /// it lives on as an orphan until the kernel has forgotten it and closed it.
    lookups: parking_lot::Mutex<HashMap<u64, u64>>,
    /// Open directory handles: where each listing ends (see `Filesystem::readdir_end`).
    dir_handles: parking_lot::Mutex<(u64, HashMap<u64, u64>)>,
}

impl OleoFuse {
    pub fn new(fs: Filesystem, settings: MountSettings) -> OleoFuse {
        let ids = NodeIds::new(fs.root());
        let ttl = if settings.writable { RW_TTL } else { TTL };
        let fs = Arc::new(RwLock::new(fs));
        OleoFuse {
            fs,
            ids,
            settings,
            ttl,
            space: Arc::new(SpaceGuard::new(space_guard::kernel_dirty_limit())),
            dir_handles: parking_lot::Mutex::new((1, HashMap::new())),
            lookups: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// Set it to the session's notifier once the session exists: near full, the server
    /// tells the kernel to stop caching writes (see `space_guard`).
    pub fn notifier_slot(&self) -> NotifierSlot {
        self.space.notifier_slot()
    }

    /// What lets the mount tell the server about the kernel's dirty limit once mounted.
    pub fn dirty_cap(&self) -> DirtyCap {
        DirtyCap(Arc::clone(&self.space))
    }

    /// Free data space, for decisions that may be approximate.
    fn available(fs: &Filesystem) -> u64 {
        fs.data_available().unwrap_or(u64::MAX)
    }

    /// Registers an open of `id`: a handle number and how the kernel should treat it.
    fn open_handle(&self, ino: u64, flags: i32) -> (FileHandle, FopenFlags) {
        let writing = self.settings.writable && flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writing && self.space.is_low() {
            // Leaving low space is noticed here, when it matters.
            self.space.update(Self::available(&self.fs.read()));
        }
        let mode = self.space.open_mode(writing);
        let fh = FileHandle(self.space.opened(ino, mode));
        match mode {
            OpenMode::Direct => (
                fh,
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            _ => (fh, FopenFlags::FOPEN_KEEP_CACHE),
        }
    }

    /// Runs a write operation with the filesystem to itself.
    fn mutate<R>(&self, f: impl FnOnce(&mut Filesystem) -> oleo::Result<R>) -> Result<R, Errno> {
        if !self.settings.writable {
            return Err(Errno::EROFS);
        }
        let mut fs = self.fs.write();
        f(&mut fs).map_err(errno)
    }

    fn reply_entry(&self, r: Result<Attr, Errno>, reply: ReplyEntry) {
        match r.and_then(|a| Ok((self.file_attr(&a)?, a.id))) {
            Ok((attr, id)) => {
                self.remember(&self.fs.read(), attr.ino.0, id);
                reply.entry(&self.ttl, &attr, Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    /// Counts one more kernel reference to `node` (each entry the kernel is given), before
    /// the reply goes out: its FORGET cannot come earlier. `fs` is locked by the caller.
    fn remember(&self, fs: &Filesystem, node: u64, id: InodeId) {
        let mut lookups = self.lookups.lock();
        let n = lookups.entry(node).or_insert(0);
        if *n == 0 {
            fs.pin_open(id);
        }
        *n += 1;
    }

    /// The kernel dropped `nlookup` references to `node`.
    fn forget_node(&self, node: u64, nlookup: u64) {
        let last = {
            let mut lookups = self.lookups.lock();
            match lookups.get_mut(&node) {
                Some(n) if *n > nlookup => {
                    *n -= nlookup;
                    false
                }
                Some(_) => {
                    lookups.remove(&node);
                    true
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        if let Ok(id) = self.id(INodeNo(node)) {
            if let Err(e) = self.unpin(id) {
                log::warn!("deleting forgotten inode {node}: {e:?}");
            }
        }
    }

    /// Drops one pin of `id`; deletes it if it was the last and the inode has no names left.
    fn unpin(&self, id: InodeId) -> Result<(), Errno> {
        let orphan = {
            let fs = self.fs.read();
            fs.drop_pin(id) && fs.getattr(id).is_ok_and(|a| a.nlink == 0)
        };
        if orphan && self.settings.writable {
            self.fs.write().delete_if_unlinked(id).map_err(errno)?;
        }
        Ok(())
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
        let attr = self.fs.read().getattr(id).map_err(errno)?;
        self.file_attr(&attr)
    }

    /// `entry_attr` under a read lock the caller already holds (taking it again could wait
    /// forever behind a queued writer).
    fn entry_attr_in(&self, fs: &Filesystem, id: InodeId) -> Result<FileAttr, Errno> {
        let attr = fs.getattr(id).map_err(errno)?;
        self.file_attr(&attr)
    }

    /// Lists a directory under one read lock, which `add` gets to use (it must not lock).
    fn list(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut add: impl FnMut(&Filesystem, u64, InodeId, FileKind, &[u8], u64) -> bool,
    ) -> Result<(), Errno> {
        let dir = self.id(ino)?;
        let end = self.dir_handles.lock().1.get(&fh.0).copied();
        let fs = self.fs.read();
        // Offsets 1 and 2 follow "." and ".."; a real entry with DIR_INDEX i resumes at i + 1.
        if offset < 1 && add(&fs, ino.0, dir, FileKind::Dir, b".", 1) {
            return Ok(());
        }
        if offset < 2 && add(&fs, ino.0, dir, FileKind::Dir, b"..", 2) {
            return Ok(());
        }
        let mut err = None;
        fs.readdir(dir, offset.max(2), &mut |e| {
            // Entries created or renamed since opendir sit past its end.
            if end.is_some_and(|end| e.next_offset > end) {
                return false;
            }
            match self.ids.encode(e.id) {
                Some(node) => !add(&fs, node, e.id, e.kind, &e.name, e.next_offset),
                None => {
                    err = Some(Errno::EOVERFLOW);
                    false
                }
            }
        })
        .map_err(errno)?;
        err.map_or(Ok(()), Err)
    }
}

/// Commits the running transaction every `interval` until the filesystem is gone.
/// Set to have the committer commit at once (see `request_commit`).
static COMMIT_REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks the mount's committer to commit now rather than at its next interval (a mount
/// turning read-only wants its changes on disk). Only stores a flag: a signal handler may
/// call it.
pub fn request_commit() {
    COMMIT_REQUESTED.store(true, Ordering::SeqCst);
}

fn spawn_committer(fs: Weak<RwLock<Filesystem>>, interval: Duration) {
    const NAP: Duration = Duration::from_millis(100);
    let spawned = std::thread::Builder::new()
        .name("oleo-commit".into())
        .spawn(move || loop {
            let start = std::time::Instant::now();
            while start.elapsed() < interval && !COMMIT_REQUESTED.swap(false, Ordering::SeqCst) {
                std::thread::sleep(NAP);
            }
            let Some(fs) = fs.upgrade() else { return };
            let mut fs = fs.write();
            if fs.has_uncommitted_changes() {
                if let Err(e) = fs.sync() {
                    log::error!("periodic commit failed: {e}");
                }
            }
        });
    if let Err(e) = spawned {
        log::error!(
            "cannot start the commit thread ({e}): changes are committed only on fsync and unmount"
        );
    }
}

fn time_or_now(t: TimeOrNow) -> oleo::Timespec {
    match t {
        TimeOrNow::SpecificTime(t) => system_time(t),
        // The engine's clock, as every other stamp.
        TimeOrNow::Now => {
            let t = oleo::now();
            oleo::Timespec {
                sec: t.sec,
                nsec: t.nsec,
            }
        }
    }
}

fn system_time(st: SystemTime) -> oleo::Timespec {
    match st.duration_since(UNIX_EPOCH) {
        Ok(d) => oleo::Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            oleo::Timespec { sec, nsec }
        }
    }
}

/// A write through a direct handle: as much as fits, leaving `keep` bytes free (short
/// writes are how write(2) says the device is full), ENOSPC if nothing fits.
fn write_direct(
    fs: &mut Filesystem,
    id: InodeId,
    offset: u64,
    data: &[u8],
    keep: u64,
) -> oleo::Result<usize> {
    const SECTOR: u64 = 4096;
    // The longest prefix of `n` bytes that ends on a sector boundary (or all of data).
    let prefix = |n: u64| -> usize {
        if n >= data.len() as u64 {
            return data.len();
        }
        ((offset + n) / SECTOR * SECTOR).saturating_sub(offset) as usize
    };
    let mut len = data.len();
    if keep > 0 {
        len = prefix(OleoFuse::available(fs).saturating_sub(keep));
    }
    loop {
        if len == 0 {
            return Err(Error::NoSpace);
        }
        match fs.write(id, offset, &data[..len]) {
            Err(Error::NoSpace) => {
                let shorter = prefix(len as u64 / 2);
                if shorter >= len {
                    return Err(Error::NoSpace);
                }
                len = shorter;
            }
            r => return r,
        }
    }
}

fn errno(e: Error) -> Errno {
    if matches!(
        e,
        Error::Corrupt { .. } | Error::DataChecksum { .. } | Error::Io(_) | Error::Aborted(_)
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
    fn destroy(&mut self) {
        if !self.settings.writable {
            return;
        }
        let mut fs = self.fs.write();
        if let Err(e) = fs.close_all_and_sync() {
            log::error!("final commit at unmount failed: {e}");
        }
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Started here, in the serving process: a daemonizing mount forks after `new`.
        if self.settings.writable {
            spawn_committer(Arc::downgrade(&self.fs), self.settings.commit_interval);
        }
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
        let wanted = if self.settings.writable {
            // The kernel's page cache gathers writes into large requests (one extent each).
            // Direct-IO handles (near full, see space_guard) can still be mmapped.
            wanted | InitFlags::FUSE_WRITEBACK_CACHE | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
        } else {
            wanted
        };
        let _ = config.add_capabilities(wanted & config.capabilities());
        Ok(())
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(system_time),
        };
        let r = self
            .id(ino)
            .and_then(|id| self.mutate(|fs| fs.setattr(id, &set)))
            .and_then(|a| self.file_attr(&a));
        match r {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.id(parent).and_then(|dir| {
            self.mutate(|fs| {
                let new = NewInode::with_mode(mode)
                    .umask(umask)
                    .rdev(u64::from(rdev))
                    .owner(req.uid(), req.gid());
                fs.mknod(dir, name.as_bytes(), &new)
            })
        });
        self.reply_entry(r, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.id(parent).and_then(|dir| {
            self.mutate(|fs| {
                let new = NewInode::dir(mode).umask(umask).owner(req.uid(), req.gid());
                fs.mkdir(dir, name.as_bytes(), &new)
            })
        });
        self.reply_entry(r, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.id(parent).and_then(|dir| {
            self.mutate(|fs| {
                fs.symlink(
                    dir,
                    link_name.as_bytes(),
                    target.as_os_str().as_bytes(),
                    req.uid(),
                    req.gid(),
                )
            })
        });
        self.reply_entry(r, reply)
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.id(ino).and_then(|id| {
            let dir = self.id(newparent)?;
            self.mutate(|fs| fs.link(id, dir, newname.as_bytes()))
        });
        self.reply_entry(r, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .id(parent)
            .and_then(|dir| self.mutate(|fs| fs.unlink(dir, name.as_bytes())))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .id(parent)
            .and_then(|dir| self.mutate(|fs| fs.rmdir(dir, name.as_bytes())))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let raw = flags.bits();
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if raw & !known != 0 {
            return reply.error(Errno::EINVAL);
        }
        let flags = oleo::RenameFlags {
            noreplace: raw & libc::RENAME_NOREPLACE != 0,
            exchange: raw & libc::RENAME_EXCHANGE != 0,
            whiteout: (raw & libc::RENAME_WHITEOUT != 0).then(|| (req.uid(), req.gid())),
        };
        let r = self.id(parent).and_then(|from| {
            let to = self.id(newparent)?;
            self.mutate(|fs| fs.rename(from, name.as_bytes(), to, newname.as_bytes(), flags))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.id(parent).and_then(|dir| {
            self.mutate(|fs| {
                let new = NewInode::with_mode(mode)
                    .umask(umask)
                    .owner(req.uid(), req.gid());
                let a = fs.mknod(dir, name.as_bytes(), &new)?;
                fs.pin_open(a.id);
                Ok(a)
            })
        });
        match r.and_then(|a| self.file_attr(&a)) {
            Ok(attr) => {
                if let Ok(id) = self.id(attr.ino) {
                    self.remember(&self.fs.read(), attr.ino.0, id);
                }
                let (fh, open_flags) = self.open_handle(attr.ino.0, flags);
                reply.created(&self.ttl, &attr, Generation(0), fh, open_flags)
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let direct = self.space.is_direct(fh.0);
        let keep = if direct { self.space.keep_free() } else { 0 };
        let r = self.id(ino).and_then(|id| {
            self.mutate(|fs| {
                let n = if direct {
                    write_direct(fs, id, offset, data, keep)?
                } else {
                    fs.write(id, offset, data)?
                };
                Ok((n, Self::available(fs)))
            })
        });
        match r {
            Ok((n, available)) => {
                reply.written(n as u32);
                self.space.update(available);
            }
            Err(e) => {
                reply.error(e);
                if e == Errno::ENOSPC && !direct {
                    // A write-back: the writer learns at its next write(2), fsync or close.
                    self.space.writeback_failed(ino.0);
                }
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to do on close (durability is fsync's job). ENOSYS tells the kernel to
        // stop sending FLUSH at all, saving a round trip per close; with the writeback cache
        // it still writes dirty pages back on close.
        reply.error(Errno::ENOSYS)
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Durable means committed: the whole transaction goes (a log tree comes later).
        match self.mutate(|fs| fs.sync()) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.mutate(|fs| fs.sync()) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let m = if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
            if !keep_size {
                return reply.error(Errno::EOPNOTSUPP);
            }
            FallocMode::PunchHole
        } else if mode & libc::FALLOC_FL_ZERO_RANGE != 0 {
            FallocMode::ZeroRange { keep_size }
        } else {
            FallocMode::Allocate { keep_size }
        };
        match self
            .id(ino)
            .and_then(|id| {
                self.mutate(|fs| {
                    fs.fallocate(id, offset, length, m)?;
                    Ok(Self::available(fs))
                })
            })
            .map(|available| self.space.update(available))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let how = match flags {
            0 => XattrSet::Either,
            libc::XATTR_CREATE => XattrSet::Create,
            libc::XATTR_REPLACE => XattrSet::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        match self
            .id(ino)
            .and_then(|id| self.mutate(|fs| fs.setxattr(id, name.as_bytes(), value, how)))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self
            .id(ino)
            .and_then(|id| self.mutate(|fs| fs.removexattr(id, name.as_bytes())))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let r = self.id(ino_in).and_then(|src| {
            let dst = self.id(ino_out)?;
            self.mutate(|fs| {
                let n = fs.copy_file_range(src, offset_in, dst, offset_out, len)?;
                Ok((n, Self::available(fs)))
            })
            .map(|(n, available)| {
                self.space.update(available);
                n
            })
        });
        match r {
            Ok(n) => reply.written(n.min(u32::MAX as u64) as u32),
            Err(e) => reply.error(e),
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.id(parent).and_then(|dir| {
            let fs = self.fs.read();
            let id = fs.lookup(dir, name.as_bytes()).map_err(errno)?;
            let attr = self.entry_attr_in(&fs, id)?;
            self.remember(&fs, attr.ino.0, id);
            Ok(attr)
        });
        match r {
            Ok(attr) => reply.entry(&self.ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.forget_node(ino.0, nlookup);
    }

    // BATCH_FORGET: fuser's default calls `forget` for each node.

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // The kernel asks with the handle before a cached write(2) when attributes are
        // invalid: the moment to stop a writer the page cache would let run on.
        if fh.is_some_and(|fh| self.space.refuse_cached_write(fh.0)) {
            return reply.error(Errno::ENOSPC);
        }
        match self.id(ino).and_then(|id| self.entry_attr(id)) {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self
            .id(ino)
            .and_then(|id| self.fs.read().readlink(id).map_err(errno))
        {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY && !self.settings.writable {
            return reply.error(Errno::EROFS);
        }
        match self.id(ino) {
            Ok(id) => {
                // An open file outlives its last name (it becomes an orphan until release).
                self.fs.read().pin_open(id);
                let (fh, open_flags) = self.open_handle(ino.0, flags.0);
                reply.opened(fh, open_flags)
            }
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.space.released(fh.0);
        match self.id(ino).and_then(|id| self.unpin(id)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
            .and_then(|id| self.fs.read().read(id, offset, size).map_err(errno))
        {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let Ok(from) = u64::try_from(offset) else {
            return reply.error(Errno::EINVAL);
        };
        // The kernel answers SEEK_SET/CUR/END itself; only the extent-aware ones come here.
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        if self.space.has_cached_writer(ino.0) {
            // The kernel may hold data for this file that we have not seen (it does not
            // write back before asking), so our map of holes could be wrong. ENOSYS makes
            // the kernel answer from then on by itself, for every file of the mount: all
            // data up to its size, which is never wrong, only less sparse.
            return reply.error(Errno::ENOSYS);
        }
        match self
            .id(ino)
            .and_then(|id| self.fs.read().seek_data_hole(id, from, data).map_err(errno))
        {
            Ok(at) => reply.offset(at as i64),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let end = match self
            .id(ino)
            .and_then(|dir| self.fs.read().readdir_end(dir).map_err(errno))
        {
            Ok(end) => end,
            Err(e) => return reply.error(e),
        };
        let fh = {
            let mut h = self.dir_handles.lock();
            let fh = h.0;
            h.0 += 1;
            h.1.insert(fh, end);
            fh
        };
        reply.opened(
            FileHandle(fh),
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dir_handles.lock().1.remove(&fh.0);
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.list(ino, fh, offset, |_fs, node, _id, kind, name, next| {
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
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut err = None;
        let r = self.list(
            ino,
            fh,
            offset,
            |fs, node, id, _kind, name, next| match self.entry_attr_in(fs, id) {
                Ok(attr) => {
                    let full = reply.add(
                        INodeNo(node),
                        next,
                        OsStr::from_bytes(name),
                        &self.ttl,
                        &attr,
                        Generation(0),
                    );
                    // The kernel takes a reference to every entry but "." and "..".
                    if !full && name != b"." && name != b".." {
                        self.remember(fs, node, id);
                    }
                    full
                }
                Err(e) => {
                    err = Some(e);
                    true
                }
            },
        );
        match r.and_then(|_| err.map_or(Ok(()), Err)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.read().statfs() {
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
            .and_then(|id| self.fs.read().getxattr(id, name.as_bytes()).map_err(errno))
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
            .and_then(|id| self.fs.read().listxattr(id).map_err(errno))
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

/// The session's settings: worker threads and who may use the mount (mounting itself is
/// the caller's: see the CLI's fuse_mount).
pub fn config(threads: usize, acl: SessionACL) -> Config {
    let mut cfg = Config::default();
    cfg.n_threads = Some(threads.max(1));
    cfg.clone_fd = true;
    cfg.acl = acl;
    cfg
}

/// Caps what the kernel keeps dirty for a mount, so that a small filesystem keeps its writes
/// cached until it is nearly full (see `space_guard`: the margin kept free follows the cap).
pub struct DirtyCap(Arc<SpaceGuard>);

impl DirtyCap {
    /// Lowers the mount's per-device dirty limit to `bytes` (needs root: sysfs) and, if that
    /// worked, the server's margin with it. Never raises it.
    pub fn apply(&self, canonical_mountpoint: &Path, bytes: u64) -> std::io::Result<()> {
        let knob = format!("/sys/class/bdi/{}/max_bytes", bdi_of(canonical_mountpoint)?);
        let current: u64 = std::fs::read_to_string(&knob)?.trim().parse().unwrap_or(0);
        if current != 0 && bytes >= current {
            return Ok(());
        }
        std::fs::write(&knob, bytes.to_string())?;
        self.0.set_kernel_dirty_bytes(bytes);
        Ok(())
    }
}

/// Raises the kernel's readahead window for the mount at `mountpoint`. FUSE can only shrink
/// it at init, and the default 128 KiB caps sequential reads at a fraction of the disk.
/// Needs root (sysfs); best effort otherwise. The device number comes from mountinfo: a stat
/// of the mount point would ask this very server, which is not serving yet; for the same
/// reason `canonical_mountpoint` must have been resolved before mounting.
pub fn set_readahead(canonical_mountpoint: &std::path::Path, kib: u32) -> std::io::Result<()> {
    let dev = bdi_of(canonical_mountpoint)?;
    std::fs::write(
        format!("/sys/class/bdi/{dev}/read_ahead_kb"),
        kib.to_string(),
    )
}

/// The mount's device number (its bdi's name), from mountinfo.
fn bdi_of(canonical_mountpoint: &Path) -> std::io::Result<String> {
    let want = canonical_mountpoint;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let point = f
                .get(4)?
                .replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\134", "\\");
            (Path::new(&point) == want).then(|| f.get(2).map(|d| d.to_string()))?
        })
        .next_back()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "mount not in mountinfo"))
}
