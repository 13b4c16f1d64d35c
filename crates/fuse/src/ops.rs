//! One function per FUSE request: decode what the kernel sent into an engine call, encode
//! the answer. `dispatch` routes; nothing here decides anything about the filesystem.

use crate::caller::{creator, Caller};
use crate::fileattr_ops;
use crate::transport::abi::{self, fattr};
use crate::transport::{DirBuf, Errno, Handler, InitConfig, Op, Reply, Request};
use crate::{
    errno, is_o_direct, space_fh, spawn_committer, write_direct, write_once, OleoFuse, MAX_IO,
};
use oleo::fileattr::{INODE_FLAG_APPEND, INODE_FLAG_IMMUTABLE, INODE_FLAG_SYNC};
use oleo::{FallocMode, NewInode, SetAttr, XattrSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// `_IO(0x94, 8)` in the kernel's uapi/linux/btrfs.h.
const BTRFS_IOC_SYNC: u32 = 0x9408;

/// Answers with `ok` or the error.
fn answer<T>(r: Result<T, Errno>, reply: Reply<'_>, ok: impl FnOnce(T, Reply<'_>)) {
    match r {
        Ok(v) => ok(v, reply),
        Err(e) => reply.error(e),
    }
}

fn empty(r: Result<(), Errno>, reply: Reply<'_>) {
    answer(r, reply, |(), reply| reply.ok())
}

fn entry(r: Result<abi::EntryOut, Errno>, reply: Reply<'_>) {
    answer(r, reply, |e, reply| reply.entry(&e))
}

/// The INIT flags oleo asks for (`nullfs`, bench's FUSE floor, asks for the same).
///
/// Each flag is a promise to the kernel; `crates/cli/tests/fuse_promises.rs` has a test
/// per promise that checks the result through the mount and again on disk (after an
/// unmount, by oleo and by the kernel):
/// - ASYNC_READ: READs of one file may come at once and out of order; each is answered
///   from the file as it stands.
/// - BIG_WRITES, MAX_PAGES (`max_write`, `max_pages`): one WRITE carries up to 1 MiB and
///   is written whole or fails whole (`big_writes_land_whole`).
/// - ATOMIC_O_TRUNC: OPEN with O_TRUNC truncates before it answers, with do_truncate's
///   rules (`open` below; `o_trunc_truncates_on_disk`).
/// - DO_READDIRPLUS: each listed entry carries its attributes, counted as a lookup
///   (`readdirplus_attributes_are_current`).
/// - ASYNC_DIO: O_DIRECT requests of one caller may come at once (`parallel_direct_io`).
/// - PARALLEL_DIROPS: lookups and listings of one directory may come at once; the
///   engine's locks order changes (`fuse_concurrent.rs`).
/// - CACHE_SYMLINKS: a link's target never changes once created (`symlinks_cached`).
/// - POSIX_ACL: the kernel checks and caches ACLs; we keep the mode and the access ACL
///   in step and make new nodes inherit default ACLs (`acl_mode_in_step`).
/// - HANDLE_KILLPRIV_V2: setuid/setgid go on write, truncate, O_TRUNC and chown by a
///   caller without CAP_FSETID, and the kernel is told at once (`setuid_dropped`).
/// - DONT_MASK: the umask is applied here, unless a default ACL replaces it
///   (`umask_and_default_acl`).
/// - SETXATTR_EXT: an access ACL set with ACL_KILL_SGID drops S_ISGID
///   (`acl_kill_sgid`).
/// - WRITEBACK_CACHE: the kernel caches writes and owns mtime/ctime of regular files;
///   its write-backs leave times alone and its SETATTRs set them
///   (`times_survive_remount`).
/// - DIRECT_IO_ALLOW_MMAP: DIRECT_IO handles may be mmapped; their pages are written
///   back like any other (`mmap_of_direct_handle`).
/// - OVER_IO_URING: the same requests over io_uring (`fuse_rw.rs` runs both).
/// - EXPORT_SUPPORT: a node id is re-derived from (subvolume, inode) after the kernel
///   forgot it (`nodeid.rs`), and within the mounted subvolume across remounts; each entry
///   carries the inode's btrfs generation; LOOKUP answers "." (ESTALE once the inode has no
///   name) and ".." of a directory (`file_handles_outlive_the_cache`).
///
/// Replies promise too: STATX gives the birth time btrfs keeps (`statx_birth_time`);
/// FOPEN_DIRECT_IO (writers of a SYNC file, every writer near full; not O_DIRECT opens,
/// which take the kernel's own direct path) sends that handle's writes to us as made;
/// the kernel stamps no times for them and ignores ours, so its stat of such a file
/// lags the disk's mtime until it forgets the inode (a limit of FUSE's writeback cache).
/// FOPEN_KEEP_CACHE says a file's data changes only through this kernel (no request
/// rewrites data behind it: copy_file_range comes through the kernel, which drops the
/// range itself; `reopen_reads_what_was_written`);
/// FOPEN_CACHE_DIR says the same of a listing (a snapshot or subvolume made by ioctl
/// drops the parent's listing, `listing_shows_new_snapshot`); entry and attribute
/// timeouts and negative entries hold for `TTL`/`RW_TTL` unless we invalidate them.
pub fn init_flags(writable: bool, uring: bool) -> u64 {
    let mut flags = abi::init::ASYNC_READ
        | abi::init::BIG_WRITES
        | abi::init::ATOMIC_O_TRUNC
        | abi::init::DO_READDIRPLUS
        | abi::init::ASYNC_DIO
        | abi::init::PARALLEL_DIROPS
        | abi::init::CACHE_SYMLINKS
        | abi::init::MAX_PAGES
        // The kernel then caches ACLs (found or absent) instead of asking per access.
        | abi::init::POSIX_ACL
        // Else every write(2) first asks for security.capability (a round trip).
        | abi::init::HANDLE_KILLPRIV_V2
        // The umask is ours to apply, so a parent's default ACL can replace it.
        | abi::init::DONT_MASK
        // Setting an access ACL tells us when S_ISGID must go (ACL_KILL_SGID).
        | abi::init::SETXATTR_EXT
        // File handles (open_by_handle_at, NFS) of inodes the kernel forgot.
        | abi::init::EXPORT_SUPPORT;
    if uring {
        // Offered only where the fuse module's enable_uring is set.
        flags |= abi::init::OVER_IO_URING;
    }
    if writable {
        // The kernel's page cache gathers writes into large requests (one extent each).
        // Direct-IO handles (near full, see space_guard) can still be mmapped.
        flags |= abi::init::WRITEBACK_CACHE | abi::init::DIRECT_IO_ALLOW_MMAP;
    }
    flags
}

/// What the VFS's may_open refuses for an inode's flags (FUSE leaves it to the server):
/// writing an immutable file, and writing an append-only one but at its end.
fn check_open_allowed(inode_flags: u64, flags: i32) -> Result<(), Errno> {
    let writing = flags & libc::O_ACCMODE != libc::O_RDONLY;
    if inode_flags & INODE_FLAG_IMMUTABLE != 0 && (writing || flags & libc::O_TRUNC != 0) {
        return Err(Errno::EPERM);
    }
    if inode_flags & INODE_FLAG_APPEND != 0
        && (writing && flags & libc::O_APPEND == 0 || flags & libc::O_TRUNC != 0)
    {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// notify_change's rule for times, which FUSE leaves to the server (the kernel's inode has
/// no S_APPEND): times given explicitly (utimensat with a time or UTIME_OMIT,
/// ATTR_TIMES_SET) may not change on an append-only inode; a touch (utimes(NULL) or both
/// UTIME_NOW, ATTR_TOUCH) may. (Immutable inodes refuse both, in the engine.)
///
/// FUSE does not carry ATTR_TIMES_SET, so it is read from what does come: a touch sends
/// ATIME_NOW and MTIME_NOW, or under WRITEBACK_CACHE (regular files) ATIME_NOW with the
/// kernel's clock in both mtime and ctime. The kernel writing back a file's times
/// (fuse_flush_times) sends mtime and ctime, equal after a write, and no atime: not a
/// utimensat either. What is left is ATTR_TIMES_SET. (One case reads as a write-back:
/// UTIME_OMIT with UTIME_NOW under WRITEBACK_CACHE, allowed here, refused by the kernel.)
fn check_times_allowed(inode_flags: u64, arg: &abi::SetattrIn) -> Result<(), Errno> {
    let has = |bit: u32| arg.valid & bit != 0;
    if inode_flags & INODE_FLAG_APPEND == 0
        || !has(fattr::ATIME | fattr::MTIME)
        || has(fattr::SIZE | fattr::FH)
    {
        return Ok(());
    }
    let kernel_now = has(fattr::CTIME) && (arg.mtime, arg.mtimensec) == (arg.ctime, arg.ctimensec);
    let mtime_now = has(fattr::MTIME) && (has(fattr::MTIME_NOW) || kernel_now);
    let touch = has(fattr::ATIME) && has(fattr::ATIME_NOW) && mtime_now;
    let write_back = !has(fattr::ATIME) && has(fattr::MTIME) && kernel_now;
    if touch || write_back {
        return Ok(());
    }
    Err(Errno::EPERM)
}

impl Handler for OleoFuse {
    fn init(&self, kernel_flags: u64) -> InitConfig {
        self.no_opendir.store(
            kernel_flags & abi::init::NO_OPENDIR_SUPPORT != 0,
            Ordering::Relaxed,
        );
        // Started here, in the serving process: a daemonizing mount forks after `new`.
        if self.settings.writable {
            spawn_committer(Arc::downgrade(&self.fs), self.settings.commit_interval);
        }
        // A worker about to wait for a commit or another writer wakes a spare one.
        oleo::blocking::set_hook(crate::transport::will_block);
        let mut flags = init_flags(self.settings.writable, self.settings.uring);
        if self.settings.allow_idmap {
            flags |= abi::init::ALLOW_IDMAP;
        }
        self.kernel_times.store(
            flags & kernel_flags & abi::init::WRITEBACK_CACHE != 0,
            Ordering::Relaxed,
        );
        InitConfig {
            flags,
            max_write: MAX_IO,
            max_readahead: MAX_IO,
        }
    }

    fn destroy(&self) -> std::io::Result<()> {
        if !self.settings.writable {
            return Ok(());
        }
        match self.fs.close_all_and_sync() {
            Ok(_) => Ok(()),
            Err(e) => Err(std::io::Error::other(format!(
                "final commit at unmount failed (the image keeps its last commit): {e}"
            ))),
        }
    }

    fn dispatch(&self, req: &Request, op: Op<'_>, reply: Reply<'_>) {
        let node = req.nodeid;
        match op {
            Op::Lookup { name } => match self.lookup(node, name) {
                // No such name, for as long as a name stays valid: the kernel keeps the
                // negative entry (only it creates names here), so a create after a failed
                // stat or open does not ask again.
                Err(e) if e.0 == libc::ENOENT => reply.entry(&self.negative_entry()),
                r => entry(r, reply),
            },
            Op::Forget(n) => {
                self.forget_node(node, n);
                reply.none()
            }
            Op::BatchForget(all) => {
                for f in all {
                    self.forget_node(f.nodeid, f.nlookup);
                }
                reply.none()
            }
            Op::Getattr { fh } => answer(self.getattr(node, fh), reply, |a, r| r.attr(&a)),
            // statx(2) asking for more than the basic fields (the birth time).
            Op::Statx(arg) => {
                let fh = (arg.getattr_flags & abi::GETATTR_FH != 0).then_some(arg.fh);
                answer(self.statx(node, fh), reply, |s, r| r.statx(&s))
            }
            Op::Setattr(arg) => answer(self.setattr(req, node, &arg), reply, |a, r| r.attr(&a)),
            Op::Readlink => answer(self.readlink(node), reply, |t, r| r.data(&t)),
            Op::Symlink { name, target } => entry(self.symlink(req, node, name, target), reply),
            Op::Mknod { arg, name } => {
                let r = creator(req).and_then(|(uid, gid)| {
                    let new = NewInode::with_mode(arg.mode)
                        .umask(arg.umask)
                        .rdev(u64::from(arg.rdev))
                        .owner(uid, gid);
                    self.mknod(node, name, &new)
                });
                entry(r, reply)
            }
            Op::Mkdir { arg, name } => {
                let r = creator(req).and_then(|(uid, gid)| {
                    let new = NewInode::dir(arg.mode).umask(arg.umask).owner(uid, gid);
                    self.mkdir(node, name, &new)
                });
                entry(r, reply)
            }
            Op::Unlink { name } => empty(self.unlink(node, name, false), reply),
            Op::Rmdir { name } => empty(self.unlink(node, name, true), reply),
            Op::Rename {
                newdir,
                flags,
                name,
                newname,
            } => empty(self.rename(req, node, name, newdir, newname, flags), reply),
            Op::Link { oldnode, name } => entry(self.link(oldnode, node, name), reply),
            Op::Open { flags, open_flags } => answer(
                self.open(req, node, flags, open_flags),
                reply,
                |(fh, f), r| r.opened(fh, f),
            ),
            Op::Read(arg) => self.read(node, &arg, reply),
            Op::Write { arg, data } => self.write(req, node, &arg, data, reply),
            Op::Statfs => answer(self.statfs(), reply, |s, r| r.statfs(&s)),
            Op::Release(arg) => {
                self.space.released(space_fh(arg.fh));
                empty(self.id(node).and_then(|id| self.unpin(id)), reply)
            }
            // fsync of a file or a directory logs it (or commits where the log cannot say
            // the change); syncfs commits the transaction.
            // On a read-only mount there is nothing to make durable: success, as in the
            // kernel (the engine does no IO for an inode with nothing new).
            Op::Fsync { datasync, .. } | Op::Fsyncdir { datasync, .. } => empty(
                self.id(node)
                    .and_then(|id| self.fs.fsync(id, datasync).map_err(errno)),
                reply,
            ),
            Op::Syncfs => empty(self.mutate(|fs| fs.sync().map(drop)), reply),
            Op::Ioctl { arg, data } => match arg.cmd {
                c if fileattr_ops::is_fileattr_ioctl(c) => {
                    answer(self.fileattr_ioctl(node, c, data), reply, |out, r| {
                        r.ioctl(0, &out)
                    })
                }
                // `btrfs filesystem sync`: commit the transaction. The only way a FUSE
                // client has to ask for one (syncfs(2) reaches no FUSE server).
                // On a read-only mount there is nothing to commit.
                BTRFS_IOC_SYNC if !self.settings.writable => reply.ioctl(0, &[]),
                BTRFS_IOC_SYNC => answer(self.mutate(|fs| fs.sync().map(drop)), reply, |(), r| {
                    r.ioctl(0, &[])
                }),
                c if crate::fs_ioctl::is_fs_ioctl(c) => {
                    answer(self.fs_ioctl(req, c, data), reply, |out, r| {
                        r.ioctl(0, &out)
                    })
                }
                c if OleoFuse::is_subvol_ioctl(c) => {
                    answer(self.subvol_ioctl(req, node, c, data), reply, |out, r| {
                        r.ioctl(0, &out)
                    })
                }
                _ => reply.error(Errno::ENOTTY),
            },
            Op::Setxattr {
                flags,
                setxattr_flags,
                name,
                value,
            } => empty(
                self.setxattr(node, name, value, flags, setxattr_flags),
                reply,
            ),
            Op::Getxattr { size, name } => {
                let r = self
                    .id(node)
                    .and_then(|id| self.fs.getxattr(id, name).map_err(errno));
                xattr_answer(r, size, reply)
            }
            Op::Listxattr { size } => {
                let r = self
                    .id(node)
                    .and_then(|id| self.fs.listxattr(id).map_err(errno))
                    .map(|names| {
                        let mut buf = Vec::new();
                        for n in names {
                            buf.extend_from_slice(&n);
                            buf.push(0);
                        }
                        buf
                    });
                xattr_answer(r, size, reply)
            }
            Op::Removexattr { name } => empty(
                self.id(node).and_then(|id| {
                    self.mutate(|fs| fs.removexattr(id, name))?;
                    self.inode_change_done(id)
                }),
                reply,
            ),
            // Nothing to do on close (durability is fsync's job). ENOSYS tells the kernel to
            // stop sending FLUSH at all, saving a round trip per close; with the writeback
            // cache it still writes dirty pages back on close.
            Op::Flush => reply.error(Errno::ENOSYS),
            // Zero-message opendir where the kernel has it (ENOSYS turns it on): it then
            // caches listings as with these flags. A listing's end is kept in `listings`.
            Op::Opendir { .. }
                if self.no_opendir.load(Ordering::Relaxed)
                    && self.listings_cacheable_without_open() =>
            {
                reply.error(Errno::ENOSYS)
            }
            // A cached listing would hide a listing that moves the atime.
            Op::Opendir { .. } => answer(self.id(node), reply, |id, r| {
                let keep = if self.may_keep_cache(id, true) {
                    abi::fopen::KEEP_CACHE | abi::fopen::CACHE_DIR
                } else {
                    0
                };
                r.opened(0, keep)
            }),
            Op::Readdir(arg) => self.readdir(req, node, &arg, reply),
            Op::Readdirplus(arg) => self.readdirplus(req, node, &arg, reply),
            Op::Releasedir(_) => reply.ok(),
            Op::Create { arg, name } => self.create(req, node, Some(name), &arg, reply),
            Op::Tmpfile(arg) => self.create(req, node, None, &arg, reply),
            Op::Fallocate(arg) => empty(self.fallocate(node, &arg), reply),
            Op::Lseek(arg) => answer(self.lseek(node, &arg), reply, |o, r| r.offset(o)),
            Op::CopyFileRange(arg) => answer(self.copy_file_range(node, &arg), reply, |n, r| {
                r.written(n.min(u64::from(u32::MAX)) as u32)
            }),
            // Permissions are the kernel's (default_permissions): ACCESS never comes then.
            Op::Access { .. } | Op::Unknown(_) => reply.error(Errno::ENOSYS),
            Op::Init(..) | Op::Destroy | Op::Interrupt => reply.error(Errno::EIO),
        }
    }
}

/// GETXATTR and LISTXATTR: size 0 asks how big; too small a buffer is ERANGE.
fn xattr_answer(r: Result<Vec<u8>, Errno>, size: u32, reply: Reply<'_>) {
    match r {
        Ok(v) if size == 0 => reply.xattr_size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

impl OleoFuse {
    /// LOOKUP of a name; with EXPORT_SUPPORT also of "." (the node itself: the kernel
    /// opening a file handle of an inode it forgot) and ".." (a directory's parent, from
    /// its INODE_REF, or ROOT_BACKREF for a subvolume root: reconnecting such a handle).
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<abi::EntryOut, Errno> {
        let dir = self.id(parent)?;
        let id = self.fs.lookup(dir, name).map_err(errno)?;
        if name == b"." {
            // The kernel asks only for an inode it no longer holds: one with no name left
            // is gone for it (deleted at its forget, maybe not yet here), so the handle
            // is stale, as on kernel btrfs.
            let a = self.fs.getattr(id).map_err(errno)?;
            if a.nlink == 0 {
                return Err(Errno::ESTALE);
            }
        }
        let e = self.entry_of(id)?;
        self.remember(e.nodeid, id);
        Ok(e)
    }

    fn negative_entry(&self) -> abi::EntryOut {
        abi::EntryOut {
            entry_valid: self.ttl.as_secs(),
            entry_valid_nsec: self.ttl.subsec_nanos(),
            ..Default::default()
        }
    }

    fn getattr(&self, node: u64, fh: Option<u64>) -> Result<abi::AttrOut, Errno> {
        self.attr_out(&self.fresh_attr(node, fh)?)
    }

    /// An inode's attributes for GETATTR or STATX. The kernel asks with the handle before
    /// a cached write(2) when attributes are invalid: the moment to stop a writer the page
    /// cache would let run on.
    fn fresh_attr(&self, node: u64, fh: Option<u64>) -> Result<oleo::Attr, Errno> {
        if fh.is_some_and(|fh| self.space.refuse_cached_write(space_fh(fh))) {
            return Err(Errno::ENOSPC);
        }
        let id = self.id(node)?;
        self.fs.getattr(id).map_err(errno)
    }

    /// STATX: what GETATTR says, plus the birth time (btrfs's otime) and the inode flags
    /// statx(2) reports, as kernel btrfs fills them.
    fn statx(&self, node: u64, fh: Option<u64>) -> Result<abi::StatxOut, Errno> {
        let a = self.fresh_attr(node, fh)?;
        let f = self.file_attr(&a)?;
        let t = |sec: u64, nsec: u32| abi::SxTime {
            tv_sec: sec as i64,
            tv_nsec: nsec,
            reserved: 0,
        };
        let flag = |bit: u64, attr: u64| if a.flags & bit != 0 { attr } else { 0 };
        const COMPRESSED: u64 = 0x4;
        const IMMUTABLE: u64 = 0x10;
        const APPEND: u64 = 0x20;
        const NODUMP: u64 = 0x40;
        use oleo::format::items::{
            INODE_FLAG_APPEND as A, INODE_FLAG_COMPRESS as C, INODE_FLAG_IMMUTABLE as I,
            INODE_FLAG_NODUMP as N,
        };
        let rdev = u64::from(f.rdev);
        Ok(abi::StatxOut {
            attr_valid: self.ttl.as_secs(),
            attr_valid_nsec: self.ttl.subsec_nanos(),
            stat: abi::Statx {
                mask: abi::STATX_BASIC_STATS | abi::STATX_BTIME,
                blksize: f.blksize,
                attributes: flag(A, APPEND)
                    | flag(C, COMPRESSED)
                    | flag(I, IMMUTABLE)
                    | flag(N, NODUMP),
                attributes_mask: APPEND | COMPRESSED | IMMUTABLE | NODUMP,
                nlink: f.nlink,
                uid: f.uid,
                gid: f.gid,
                mode: f.mode as u16,
                ino: f.ino,
                size: f.size,
                blocks: f.blocks,
                atime: t(f.atime, f.atimensec),
                btime: t(a.crtime.sec as u64, a.crtime.nsec),
                ctime: t(f.ctime, f.ctimensec),
                mtime: t(f.mtime, f.mtimensec),
                rdev_major: libc::major(rdev as libc::dev_t),
                rdev_minor: libc::minor(rdev as libc::dev_t),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn setattr(
        &self,
        req: &Request,
        node: u64,
        arg: &abi::SetattrIn,
    ) -> Result<abi::AttrOut, Errno> {
        let v = arg.valid;
        let has = |bit: u32| v & bit != 0;
        let stamp = |now_bit: u32, bit: u32, sec: u64, nsec: u32| {
            if has(now_bit) {
                // The engine's clock, as every other stamp.
                let t = oleo::now();
                Some(oleo::Timespec {
                    sec: t.sec,
                    nsec: t.nsec,
                })
            } else if has(bit) {
                Some(oleo::Timespec {
                    sec: sec as i64,
                    nsec,
                })
            } else {
                None
            }
        };
        let mut set = SetAttr {
            mode: has(fattr::MODE).then_some(arg.mode),
            uid: has(fattr::UID).then_some(arg.uid),
            gid: has(fattr::GID).then_some(arg.gid),
            size: has(fattr::SIZE).then_some(arg.size),
            atime: stamp(fattr::ATIME_NOW, fattr::ATIME, arg.atime, arg.atimensec),
            mtime: stamp(fattr::MTIME_NOW, fattr::MTIME, arg.mtime, arg.mtimensec),
            ctime: has(fattr::CTIME).then_some(oleo::Timespec {
                sec: arg.ctime as i64,
                nsec: arg.ctimensec,
            }),
        };
        let id = self.id(node)?;
        if has(fattr::ATIME | fattr::MTIME) {
            check_times_allowed(self.fs.getattr(id).map_err(errno)?.flags, arg)?;
        }
        // A chown drops setuid/setgid in the engine, as chown(2) does; a truncate by a
        // caller without CAP_FSETID is flagged.
        if has(fattr::KILL_SUIDGID) && set.mode.is_none() && !has(fattr::UID | fattr::GID) {
            set.mode = killed_mode(&self.fs.getattr(id).map_err(errno)?, req);
        }
        let rest = v & !(fattr::FH | fattr::LOCKOWNER);
        if rest == fattr::CTIME || rest == 0 || self.kernel_owns_times() {
            let a = self.fs.getattr(id).map_err(errno)?;
            let regular = a.kind == oleo::FileKind::File;
            // The kernel's ATTR_KILL_* requests reach us stripped (HANDLE_KILLPRIV_V2): as
            // a SETATTR of nothing (file_remove_privs before fallocate or copy_file_range,
            // by a caller without CAP_FSETID; chown(-1, -1)) or of ctime alone (chown(-1,
            // -1) of a regular file under WRITEBACK_CACHE). Both drop setuid/setgid: as
            // chown does for root (it has CAP_FSETID), as a write does for anyone else.
            if (rest == fattr::CTIME || rest == 0)
                && a.kind != oleo::FileKind::Dir
                && a.mode & (libc::S_ISUID | libc::S_ISGID) != 0
            {
                let caller = Caller::of(req);
                if caller.as_ref().is_some_and(|c| c.uid == 0) {
                    set.uid = Some(a.uid);
                } else {
                    set.mode = killed_mode(&a, req);
                    // A chown is a mode change by its caller (setattr_prepare's owner
                    // check), where file_remove_privs is forced: the chown is the
                    // ctime-only SETATTR of a regular file, or any of another kind. A
                    // caller we cannot name is no owner.
                    let chown = rest == fattr::CTIME || !regular;
                    if chown && set.mode.is_some() && caller.is_none_or(|c| c.uid != a.uid) {
                        return Err(Errno::EPERM);
                    }
                }
            }
            // A regular file's times are the kernel's under WRITEBACK_CACHE: those it did
            // not send stay as they are.
            if regular && self.kernel_owns_times() {
                set.ctime = set.ctime.or(Some(a.ctime));
                if set.size.is_some() {
                    set.mtime = set.mtime.or(Some(a.mtime));
                }
            }
        }
        let a = self.mutate(|fs| fs.setattr(id, &set))?;
        self.inode_change_done(id)?;
        if set.atime.is_some() && a.kind == oleo::FileKind::Dir {
            self.listing_cache_stale(node);
        }
        self.attr_out(&a)
    }

    /// Drops setuid/setgid as the kernel asked (HANDLE_KILLPRIV_V2) for the caller of
    /// `req`; nothing to do on most files, which have neither.
    fn kill_suid(&self, node: u64, id: oleo::InodeId, req: &Request) -> Result<(), Errno> {
        let Some(mode) = killed_mode(&self.fs.getattr(id).map_err(errno)?, req) else {
            return Ok(());
        };
        let set = SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        self.mutate(|fs| fs.setattr(id, &set))?;
        // The kernel keeps its cached mode after a direct write: stat would show the
        // bits for up to a second.
        self.attrs_changed(node);
        Ok(())
    }

    fn readlink(&self, node: u64) -> Result<Vec<u8>, Errno> {
        let id = self.id(node)?;
        self.fs.readlink(id).map_err(errno)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<abi::EntryOut, Errno> {
        let dir = self.id(parent)?;
        let (uid, gid) = creator(req)?;
        let a = self.mutate(|fs| fs.symlink(dir, name, target, uid, gid))?;
        self.dir_change_done(&[dir], Some(a.id))?;
        self.new_entry(Ok(a))
    }

    fn mknod(&self, parent: u64, name: &[u8], new: &NewInode) -> Result<abi::EntryOut, Errno> {
        let dir = self.id(parent)?;
        let a = self.mutate(|fs| fs.mknod(dir, name, new))?;
        self.dir_change_done(&[dir], Some(a.id))?;
        self.new_entry(Ok(a))
    }

    fn mkdir(&self, parent: u64, name: &[u8], new: &NewInode) -> Result<abi::EntryOut, Errno> {
        let dir = self.id(parent)?;
        let a = self.mutate(|fs| fs.mkdir(dir, name, new))?;
        self.dir_change_done(&[dir], Some(a.id))?;
        self.new_entry(Ok(a))
    }

    fn link(&self, node: u64, newparent: u64, name: &[u8]) -> Result<abi::EntryOut, Errno> {
        let id = self.id(node)?;
        let dir = self.id(newparent)?;
        let a = self.mutate(|fs| fs.link(id, dir, name))?;
        self.dir_change_done(&[dir], Some(a.id))?;
        self.new_entry(Ok(a))
    }

    fn unlink(&self, parent: u64, name: &[u8], dir: bool) -> Result<(), Errno> {
        let parent = self.id(parent)?;
        if dir {
            self.mutate(|fs| fs.rmdir(parent, name))?;
        } else {
            self.mutate(|fs| fs.unlink(parent, name))?;
        }
        self.dir_change_done(&[parent], None)
    }

    fn rename(
        &self,
        req: &Request,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        raw: u32,
    ) -> Result<(), Errno> {
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if raw & !known != 0 {
            return Err(Errno::EINVAL);
        }
        // A whiteout is a new inode: RENAME2 with RENAME_WHITEOUT carries its owner.
        let whiteout = if raw & libc::RENAME_WHITEOUT != 0 {
            Some(creator(req)?)
        } else {
            None
        };
        let flags = oleo::RenameFlags {
            noreplace: raw & libc::RENAME_NOREPLACE != 0,
            exchange: raw & libc::RENAME_EXCHANGE != 0,
            whiteout,
        };
        let from = self.id(parent)?;
        let to = self.id(newparent)?;
        self.mutate(|fs| fs.rename(from, name, to, newname, flags))?;
        self.dir_change_done(&[from, to], None)
    }

    fn open(
        &self,
        req: &Request,
        node: u64,
        flags: u32,
        open_flags: u32,
    ) -> Result<(u64, u32), Errno> {
        let flags = flags as i32;
        if flags & libc::O_ACCMODE != libc::O_RDONLY && !self.settings.writable {
            return Err(Errno::EROFS);
        }
        let id = self.id(node)?;
        let inode_flags = self.fs.getattr(id).map_err(errno)?.flags;
        check_open_allowed(inode_flags, flags)?;
        if flags & libc::O_TRUNC != 0 {
            // ATOMIC_O_TRUNC: the truncation is ours, done before the open answers, under
            // the kernel's inode lock (it sets its own size to 0 once we answer). As
            // do_truncate: to 0 even when empty (extents past EOF go too), setuid/setgid
            // dropped for a caller without CAP_FSETID, times stamped: by the kernel under
            // WRITEBACK_CACHE (it ignores ours and sends its own), else here.
            let a = self.fs.getattr(id).map_err(errno)?;
            let (mtime, ctime) = if self.kernel_owns_times() {
                (a.mtime, a.ctime)
            } else {
                let t = oleo::now();
                let t = oleo::Timespec {
                    sec: t.sec,
                    nsec: t.nsec,
                };
                (t, t)
            };
            let mut set = SetAttr {
                size: Some(0),
                mtime: Some(mtime),
                ctime: Some(ctime),
                ..Default::default()
            };
            if open_flags & abi::OPEN_KILL_SUIDGID != 0 {
                set.mode = killed_mode(&a, req);
            }
            self.mutate(|fs| fs.setattr(id, &set))?;
        } else if open_flags & abi::OPEN_KILL_SUIDGID != 0 {
            self.kill_suid(node, id, req)?;
        }
        // An open file outlives its last name (it becomes an orphan until release).
        self.fs.pin_open(id);
        let (fh, mut fopen) = self.open_handle(node, flags, inode_flags & INODE_FLAG_SYNC != 0);
        // The kernel drops the file's pages when told not to keep them: the reads that
        // follow reach us and move the atime (relatime: once after each change).
        if flags & libc::O_ACCMODE != libc::O_WRONLY && !self.may_keep_cache(id, false) {
            fopen &= !abi::fopen::KEEP_CACHE;
        }
        Ok((fh, fopen))
    }

    /// CREATE, or with no name TMPFILE: a regular file with no name, which lives while
    /// open and until the kernel forgets it, unless linkat(2) gives it a name.
    fn create(
        &self,
        req: &Request,
        parent: u64,
        name: Option<&[u8]>,
        arg: &abi::CreateIn,
        reply: Reply<'_>,
    ) {
        let r = creator(req).and_then(|(uid, gid)| Ok((self.id(parent)?, uid, gid)));
        let r = r.and_then(|(dir, uid, gid)| {
            self.mutate(|fs| {
                let new = NewInode::with_mode(arg.mode)
                    .umask(arg.umask)
                    .owner(uid, gid);
                let a = match name {
                    Some(name) => fs.mknod(dir, name, &new)?,
                    None => fs.tmpfile(dir, &new)?,
                };
                if name.is_some() {
                    fs.pin_open(a.id);
                }
                Ok((a, dir))
            })
        });
        let r = r.and_then(|(a, dir)| {
            if name.is_some() {
                self.dir_change_done(&[dir], Some(a.id))?;
            }
            Ok(a)
        });
        match r.and_then(|a| Ok((self.entry_out(&a)?, a.id))) {
            Ok((e, id)) => {
                self.remember(e.nodeid, id);
                let (fh, open_flags) = self.open_handle(e.nodeid, arg.flags as i32, false);
                reply.created(&e, fh, open_flags)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(&self, node: u64, arg: &abi::ReadIn, reply: Reply<'_>) {
        let id = match self.id(node) {
            Ok(id) => id,
            Err(e) => return reply.error(e),
        };
        let uncached = is_o_direct(arg.fh);
        // A READ of the page cache fills it, whatever the handle (an mmap of an O_DIRECT
        // descriptor reads through it too); the kernel's direct reads carry a lock owner.
        if arg.read_flags & abi::READ_LOCKOWNER == 0 {
            self.may_cache(node);
        }
        reply.data_into(arg.size as usize, |buf| {
            let n = self
                .fs
                .read_into(id, arg.offset, buf, uncached)
                .map_err(errno)?;
            self.read_happened(id, false);
            Ok(n)
        });
    }

    fn write(&self, req: &Request, node: u64, arg: &abi::WriteIn, data: &[u8], reply: Reply<'_>) {
        let direct = self.space.is_direct(space_fh(arg.fh));
        let o_direct = is_o_direct(arg.fh);
        // What is not the page cache's write-back (a direct handle's writes, and O_DIRECT
        // writes as write(2) makes them) must leave room for the dirty pages of cached
        // writers: else an O_DIRECT writer filling the disk fails their write-back, and
        // data write(2) took is lost (fstests generic/299).
        let guarded = direct || (o_direct && arg.write_flags & abi::WRITE_CACHE == 0);
        let keep = if guarded { self.space.keep_free() } else { 0 };
        // Only a FOPEN_DIRECT_IO handle's own writes leave the times to us.
        let kernel_times =
            self.kernel_owns_times() && (arg.write_flags & abi::WRITE_CACHE != 0 || !direct);
        if arg.write_flags & abi::WRITE_CACHE != 0 {
            // The write-back of pages the kernel keeps.
            self.may_cache(node);
        }
        let r = self.id(node).and_then(|id| {
            self.mutate(|fs| {
                let n = if guarded {
                    // An O_DIRECT write may be asynchronous: whole or ENOSPC.
                    let whole = o_direct;
                    write_direct(
                        fs,
                        id,
                        arg.offset,
                        data,
                        keep,
                        whole,
                        o_direct,
                        kernel_times,
                    )?
                } else {
                    write_once(fs, id, arg.offset, data, o_direct, kernel_times)?
                };
                Ok((n, self.available(fs)))
            })
        });
        let r = r.and_then(|x| {
            // Under `sync` the kernel fsyncs after each write itself, but not after one
            // through a FOPEN_DIRECT_IO handle (fuse_direct_write_iter).
            if direct && self.flags.get().sync {
                self.fs.fsync(self.id(node)?, true).map_err(errno)?;
            }
            if arg.write_flags & abi::WRITE_KILL_SUIDGID != 0 {
                self.kill_suid(node, self.id(node)?, req)?;
            }
            Ok(x)
        });
        match r {
            Ok((n, available)) => {
                // The kernel's own direct write (O_DIRECT, not through a FOPEN_DIRECT_IO
                // handle) drops the range from its page cache after the write only when it
                // waits for it: an asynchronous one (ASYNC_DIO: io_uring, libaio) leaves
                // whatever a buffered reader cached meanwhile. So we drop it, before the
                // answer lets the caller read.
                if o_direct && !direct && arg.write_flags & abi::WRITE_CACHE == 0 && n > 0 {
                    self.drop_cached_range(node, arg.offset, n as u64);
                }
                reply.written(n as u32);
                self.space.update(available);
            }
            Err(e) => {
                reply.error(e);
                if e == Errno::ENOSPC && !direct {
                    // A write-back: the writer learns at its next write(2), fsync or close.
                    self.space.writeback_failed(node);
                }
            }
        }
    }

    fn statfs(&self) -> Result<abi::StatfsOut, Errno> {
        let s = self.fs.statfs().map_err(errno)?;
        Ok(abi::StatfsOut {
            blocks: s.blocks,
            bfree: s.blocks_free,
            bavail: s.blocks_avail,
            files: s.files,
            ffree: s.files_free,
            bsize: s.block_size,
            namelen: s.name_max,
            frsize: s.block_size,
            ..Default::default()
        })
    }

    fn setxattr(
        &self,
        node: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> Result<(), Errno> {
        let how = match flags as i32 {
            0 => XattrSet::Either,
            libc::XATTR_CREATE => XattrSet::Create,
            libc::XATTR_REPLACE => XattrSet::Replace,
            _ => return Err(Errno::EINVAL),
        };
        let id = self.id(node)?;
        self.mutate(|fs| fs.setxattr(id, name, value, how))?;
        self.inode_change_done(id)?;
        // posix_acl_update_mode's rule, which FUSE leaves to us: an access ACL set by a
        // caller outside the file's group without CAP_FSETID drops S_ISGID.
        if setxattr_flags & abi::SETXATTR_ACL_KILL_SGID != 0 && name == b"system.posix_acl_access" {
            let a = self.fs.getattr(id).map_err(errno)?;
            if a.mode & libc::S_ISGID != 0 {
                let set = SetAttr {
                    mode: Some(a.mode & 0o7777 & !libc::S_ISGID),
                    ..Default::default()
                };
                self.mutate(|fs| fs.setattr(id, &set))?;
            }
            self.attrs_changed(node);
        }
        Ok(())
    }

    /// Drops the kernel's cached listing of directory `node`: a listing it answers from
    /// its cache never reaches us, and an atime set back (utimes) makes the next one move
    /// it again.
    fn listing_cache_stale(&self, node: u64) {
        if let Some(n) = self.notifier() {
            if let Err(e) = n.inval_inode(node, 0, 0) {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    log::debug!("cannot drop the kernel's listing of {node}: {e}");
                }
            }
        }
    }

    /// Tells the kernel that what it caches of `node`'s attributes is stale (a change it
    /// did not ask for by SETATTR, such as setuid/setgid dropped on a write).
    fn attrs_changed(&self, node: u64) {
        let Some(n) = self.notifier() else {
            return;
        };
        // Offset -1: attributes only, the page cache stays.
        if let Err(e) = n.inval_inode(node, -1, 0) {
            if e.raw_os_error() != Some(libc::ENOENT) {
                log::warn!("cannot tell the kernel that inode {node} changed: {e}");
            }
        }
    }

    /// Drops `len` bytes of `node` from `offset` from the kernel's page cache (and its
    /// attributes, so the kernel's next write asks for them: a round trip). The kernel
    /// waits for each cached page it drops to be unlocked, and one request keeps its pages
    /// locked until we answer it: a write-through, which the kernel makes of a buffered
    /// write by a caller without CAP_FSETID to a file whose setuid/setgid must go; on an
    /// O_DIRECT handle, the rest of a direct write that came up short. So the drop runs on
    /// a thread of its own and the answer waits for it at most DROP_WAIT: where it could
    /// not finish before, it finishes after the answer, when those pages are written
    /// anyway.
    ///
    /// A node the kernel never filled pages of (`may_cache`) has none to drop: the drop, a
    /// round trip through one thread for every direct write, is skipped (fio's 4 KiB random
    /// O_DIRECT writes: a quarter of the server's waits). A node stays marked after the
    /// writer that filled its cache is gone (fio lays its file out with write(2), then
    /// drops the pages itself), so where nothing could fill its cache since the last drop,
    /// the drop takes the whole file, and once that finished with still nothing since, the
    /// mark goes: a mixed O_DIRECT reader and writer (seed 002) paid a drop, and through it
    /// a GETATTR, for every write. A buffered reader beside a direct writer keeps the mark
    /// (its READs move it), and loses its cache at most once per quiet spell.
    fn drop_cached_range(&self, node: u64, offset: u64, len: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        let (filled, quiet) = match self.cached_nodes.read().get(&node) {
            Some(m) => {
                let filled = m.filled.load(SeqCst);
                (filled, m.at_last_drop.swap(filled, SeqCst) == filled)
            }
            None => return,
        };
        let Some(n) = self.notifier() else {
            return;
        };
        let (off, len) = if quiet {
            (0, 0)
        } else {
            match (i64::try_from(offset), i64::try_from(len)) {
                (Ok(off), Ok(len)) => (off, len),
                _ => return,
            }
        };
        // Dropping waits for the reads in flight over those pages (and writes back dirty
        // mapped ones): other workers must be free to answer them.
        crate::transport::will_block();
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if page_dropper().send((n, node, off, len, done)).is_err() {
            return;
        }
        // A drop can wait on pages the kernel keeps locked until this very write is
        // answered: never wait for it without bound.
        let dropped = wait.recv_timeout(DROP_WAIT).unwrap_or(false);
        if quiet && dropped {
            let mut nodes = self.cached_nodes.write();
            if nodes
                .get(&node)
                .is_some_and(|m| m.filled.load(SeqCst) == filled)
            {
                nodes.remove(&node);
            }
        }
    }

    fn readdir(&self, req: &Request, node: u64, arg: &abi::ReadIn, reply: Reply<'_>) {
        let mut buf = DirBuf::new(arg.size);
        let r = self.list(node, req.pid, arg.offset, |ino, _id, kind, name, next| {
            !buf.add(ino, next, crate::type_bits(kind), name)
        });
        match r {
            Ok(()) => buf.send(reply),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(&self, req: &Request, node: u64, arg: &abi::ReadIn, reply: Reply<'_>) {
        let mut buf = DirBuf::new(arg.size);
        let mut err = None;
        let r = self.list(node, req.pid, arg.offset, |ino, id, kind, name, next| {
            match self.entry_of(id) {
                Ok(mut e) => {
                    e.nodeid = ino;
                    let full = !buf.add_plus(&e, next, crate::type_bits(kind), name);
                    // The kernel takes a reference to every entry but "." and "..".
                    if !full && name != b"." && name != b".." {
                        self.remember(ino, id);
                    }
                    full
                }
                Err(e) => {
                    err = Some(e);
                    true
                }
            }
        });
        match r.and_then(|()| err.map_or(Ok(()), Err)) {
            Ok(()) => buf.send(reply),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(&self, node: u64, arg: &abi::FallocateIn) -> Result<(), Errno> {
        let mode = arg.mode as i32;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let m = if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
            if !keep_size {
                return Err(Errno::EOPNOTSUPP);
            }
            FallocMode::PunchHole
        } else if mode & libc::FALLOC_FL_ZERO_RANGE != 0 {
            FallocMode::ZeroRange { keep_size }
        } else {
            FallocMode::Allocate { keep_size }
        };
        let id = self.id(node)?;
        // The kernel stamps and sends the times of a regular file itself (file_modified).
        let kernel_times = self.kernel_owns_times();
        let available = self.mutate(|fs| {
            if kernel_times {
                fs.fallocate_keep_times(id, arg.offset, arg.length, m)?;
            } else {
                fs.fallocate(id, arg.offset, arg.length, m)?;
            }
            Ok(self.available(fs))
        })?;
        self.space.update(available);
        Ok(())
    }

    fn lseek(&self, node: u64, arg: &abi::LseekIn) -> Result<u64, Errno> {
        let Ok(from) = u64::try_from(arg.offset as i64) else {
            return Err(Errno::EINVAL);
        };
        // The kernel answers SEEK_SET/CUR/END itself; only the extent-aware ones come here.
        let data = match arg.whence as i32 {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return Err(Errno::EINVAL),
        };
        if self
            .space
            .has_cached_writer_after(node, Duration::from_millis(20))
        {
            // The kernel may hold data for this file that we have not seen (it does not
            // write back before asking), so our map of holes could be wrong. ENOSYS makes
            // the kernel answer from then on by itself, for every file of the mount: all
            // data up to its size, which is never wrong, only less sparse.
            return Err(Errno::ENOSYS);
        }
        let id = self.id(node)?;
        self.fs.seek_data_hole(id, from, data).map_err(errno)
    }

    fn copy_file_range(&self, node: u64, arg: &abi::CopyFileRangeIn) -> Result<u64, Errno> {
        let src = self.id(node)?;
        let dst = self.id(arg.nodeid_out)?;
        let kernel_times = self.kernel_owns_times();
        let (n, available) = self.mutate(|fs| {
            let n = if kernel_times {
                fs.copy_file_range_keep_times(src, arg.off_in, dst, arg.off_out, arg.len)?
            } else {
                fs.copy_file_range(src, arg.off_in, dst, arg.off_out, arg.len)?
            };
            Ok((n, self.available(fs)))
        })?;
        self.space.update(available);
        Ok(n)
    }
}

/// How long the answer to a direct write waits for the kernel to drop the written range
/// from its page cache (see `drop_cached_range`).
const DROP_WAIT: Duration = Duration::from_secs(1);

/// Whether the kernel holds none of those pages now (it has no such inode, or dropped
/// them).
fn drop_pages(n: &crate::transport::Notifier, node: u64, off: i64, len: i64) -> bool {
    match n.inval_inode(node, off, len) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
        Err(e) => {
            log::warn!("cannot drop inode {node}'s cached pages: {e}");
            false
        }
    }
}

/// A page-cache drop: the session's notifier, node, offset, length, and where to say done.
type PageDrop = (
    crate::transport::Notifier,
    u64,
    i64,
    i64,
    std::sync::mpsc::SyncSender<bool>,
);

/// The thread that drops ranges from the kernel's page cache for direct writes of callers
/// without CAP_FSETID, one at a time.
fn page_dropper() -> std::sync::mpsc::Sender<PageDrop> {
    static TX: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<PageDrop>>> =
        std::sync::OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<PageDrop>();
        let spawned = std::thread::Builder::new()
            .name("oleo-page-drop".into())
            .spawn(move || {
                for (n, node, off, len, done) in rx {
                    let _ = done.try_send(drop_pages(&n, node, off, len));
                }
            });
        if let Err(e) = spawned {
            log::warn!("no thread to drop cached pages after direct writes: {e}");
        }
        std::sync::Mutex::new(tx)
    });
    tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The mode a write, truncate or O_TRUNC open by a caller without CAP_FSETID leaves, if
/// it changes (the VFS's rule, which the kernel leaves to us with HANDLE_KILLPRIV_V2): no
/// setuid; no setgid where the group may execute or the caller is not in the file's group
/// (`Caller::in_group`; the file's mode alone decides on most files, and the caller is
/// looked up only when it matters).
fn killed_mode(a: &oleo::Attr, req: &Request) -> Option<u32> {
    let mut mode = a.mode;
    mode &= !libc::S_ISUID;
    if mode & libc::S_ISGID != 0
        && (mode & libc::S_IXGRP != 0 || !Caller::of(req).is_some_and(|c| c.in_group(a.gid)))
    {
        mode &= !libc::S_ISGID;
    }
    (mode != a.mode).then_some(mode)
}
