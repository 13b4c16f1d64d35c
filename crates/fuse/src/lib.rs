//! The FUSE server: decodes requests, calls the oleo engine, replies. No filesystem logic
//! lives here.
//!
//! Node ids: FUSE wants one 64-bit id per inode, btrfs has (subvolume, inode number) pairs.
//! The opened subvolume's root is FUSE's root id 1. Every other inode is
//! `(subvolume index << 48) | inode number`, where the subvolume index is a small number
//! this mount hands out in the order it meets subvolumes (0 = the opened subvolume). The
//! same value is st_ino, so inode numbers in the opened subvolume are exactly btrfs's and
//! stay unique across the whole mount (all subvolumes share FUSE's one st_dev).
//!
//! # Layers
//!
//! - [`transport`]: oleo's own FUSE transport, which knows nothing of btrfs. A [`Session`]
//!   reads requests from a mounted /dev/fuse descriptor (or io_uring), decodes them into
//!   [`transport::Op`]s and hands each to a [`transport::Handler`] with a
//!   [`transport::Reply`] to answer it.
//! - [`OleoFuse`]: the handler that serves an [`oleo::Filesystem`], with [`MountSettings`]
//!   for what the image does not say (writable, commit interval, io_uring).
//! - [`subvol_ioctl`]: the fixed-size ioctls through which `oleo subvolume` and
//!   `oleo property` reach a mounted filesystem.
//!
//! # Example: serve an image
//!
//! Mounting needs root here (mount(2) with the descriptor; `oleo mount` also knows
//! fusermount3). The session serves until the filesystem is unmounted.
//!
//! ```no_run
//! use std::ffi::CString;
//! use std::os::fd::{AsRawFd, OwnedFd};
//! use oleo::{Filesystem, OpenOptions};
//! use oleo_fuse::{Access, MountSettings, OleoFuse, Session};
//!
//! // Read-only: the default OpenOptions and MountSettings.
//! let fs = Filesystem::open("btrfs.img", OpenOptions::default())?;
//! let server = OleoFuse::new(fs, MountSettings::default());
//!
//! // Attach a FUSE connection at /mnt (a directory, hence rootmode 40000).
//! let dev: OwnedFd = std::fs::OpenOptions::new()
//!     .read(true)
//!     .write(true)
//!     .open("/dev/fuse")?
//!     .into();
//! let data = CString::new(format!(
//!     "fd={},rootmode=40000,user_id=0,group_id=0,default_permissions",
//!     dev.as_raw_fd()
//! ))?;
//! // SAFETY: every pointer is a NUL-terminated string that outlives the call.
//! let r = unsafe {
//!     libc::mount(
//!         c"btrfs.img".as_ptr(),
//!         c"/mnt".as_ptr(),
//!         c"fuse.oleo".as_ptr(),
//!         libc::MS_RDONLY,
//!         data.as_ptr().cast(),
//!     )
//! };
//! if r != 0 {
//!     return Err(std::io::Error::last_os_error().into());
//! }
//!
//! // Four workers; the server gets the session's notifier to invalidate kernel caches.
//! let slot = server.notifier_slot();
//! let session = Session::from_fd(server, dev, 4, Access::All);
//! let _ = slot.set(session.notifier());
//! session.run()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod caller;
mod fileattr_ops;
mod fs_ioctl;
mod listings;
mod mount_flags;
mod nodeid;
mod ops;
mod space_guard;
mod stream_ops;
pub mod subvol_ioctl;
mod subvol_ops;
pub mod transport;

use nodeid::NodeIds;
use oleo::{Attr, Error, FileKind, Filesystem, InodeId};
use space_guard::{OpenMode, SpaceGuard};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use transport::{abi, Errno};

pub use mount_flags::{Atime, MountFlags};
pub use ops::init_flags;
pub use space_guard::NotifierSlot;
pub use stream_ops::{set_stream_handler, Note, ReceiveJob, SendJob, StreamHandler};
pub use transport::{Access, Session};

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
    /// Take requests over io_uring where the kernel offers it (see `transport::uring`).
    pub uring: bool,
    /// What the mount's VFS flags ask of the server (atime, sync, dirsync).
    pub flags: MountFlags,
    /// Offer FUSE_ALLOW_IDMAP, so the mount may be idmapped (Linux 6.12+). Only for a
    /// mount with default_permissions: the kernel fails the connection otherwise.
    pub allow_idmap: bool,
    /// The filesystem-wide options the mount was made with, in the CLI's canonical form:
    /// the server only hands them back (`subvol_ioctl::GET_SERVER_OPTIONS`), so that a second
    /// mount of the same image can be compared with this one.
    pub options: String,
}

impl Default for MountSettings {
    fn default() -> Self {
        MountSettings {
            writable: false,
            commit_interval: Duration::from_secs(30),
            uring: true,
            flags: MountFlags::default(),
            allow_idmap: false,
            options: String::new(),
        }
    }
}

/// What is known of one node's pages in the kernel's cache (`OleoFuse::cached_nodes`).
#[derive(Default)]
struct CacheMark {
    /// Requests that may have filled its cache so far (page-cache READs, cached WRITEs).
    filled: std::sync::atomic::AtomicU64,
    /// `filled` when the last direct write dropped the pages it wrote: where it has not
    /// moved since, the next drop takes the whole file, which may clear the mark.
    at_last_drop: std::sync::atomic::AtomicU64,
}

/// The FUSE server of one mount: a [`transport::Handler`] that answers the kernel's
/// requests with calls to an [`oleo::Filesystem`]. Hand it to [`Session::from_fd`].
pub struct OleoFuse {
    /// Reads share the lock; an operation that writes holds it alone.
    fs: Arc<Filesystem>,
    ids: NodeIds,
    settings: MountSettings,
    ttl: Duration,
    space: Arc<SpaceGuard>,
    /// The kernel's lookup count per node. While above zero the inode is pinned: unlinked,
    /// it lives on as an orphan until the kernel has forgotten it and closed it.
    lookups: parking_lot::Mutex<foldhash::HashMap<u64, u64>>,
    /// Where each listing ends (see `listings` and `Filesystem::readdir_end`).
    listings: parking_lot::Mutex<listings::Listings>,
    /// The kernel opens directories without OPENDIR (see `listings`).
    no_opendir: std::sync::atomic::AtomicBool,
    /// WRITEBACK_CACHE was agreed: the kernel owns regular files' mtime and ctime (it
    /// stamps them, sends them by SETATTR, and ignores ours while it caches the inode).
    kernel_times: AtomicBool,
    /// The mount's last or running scrub (`oleo scrub start|status` on a mount).
    scrub: Arc<parking_lot::Mutex<subvol_ioctl::ScrubStatus>>,
    /// The VFS flags in force (a remount changes them).
    flags: mount_flags::FlagsCell,
    /// Nodes whose pages the kernel may hold: every page it caches came from a page-cache
    /// READ or went out as a cached WRITE of that node (see `OleoFuse::drop_cached_range`).
    /// A node leaves at its last FORGET, with the kernel's inode and pages, or once a drop
    /// of all its pages finished with no such request since (`CacheMark`).
    cached_nodes: parking_lot::RwLock<foldhash::HashMap<u64, CacheMark>>,
}

impl OleoFuse {
    /// A server for `fs`; `settings.writable` needs `fs` opened writable
    /// ([`Filesystem::open_rw`]). Nothing runs until a session serves it: the commit thread of
    /// a writable mount starts at the kernel's INIT.
    pub fn new(fs: Filesystem, settings: MountSettings) -> OleoFuse {
        let ids = NodeIds::new(fs.root());
        let ttl = if settings.writable { RW_TTL } else { TTL };
        let fs = Arc::new(fs);
        let flags = mount_flags::FlagsCell::new(settings.flags);
        OleoFuse {
            flags,
            fs,
            ids,
            settings,
            ttl,
            space: Arc::new(SpaceGuard::new(space_guard::kernel_dirty_limit())),
            listings: Default::default(),
            no_opendir: Default::default(),
            kernel_times: Default::default(),
            scrub: Default::default(),
            lookups: parking_lot::Mutex::new(Default::default()),
            cached_nodes: Default::default(),
        }
    }

    /// `node` may have pages in the kernel's cache from now on. Called before the data
    /// is read or written, so that a direct write that finds no mark after its own write
    /// knows no page of the range can hold older bytes (`drop_cached_range`), and a drop
    /// of the whole file that began before it does not clear the mark.
    fn may_cache(&self, node: u64) {
        if let Some(m) = self.cached_nodes.read().get(&node) {
            m.filled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        let mut nodes = self.cached_nodes.write();
        let m = nodes.entry(node).or_default();
        m.filled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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

    /// Free data space, for decisions that may be approximate. Near the low-water mark,
    /// space freed since the last commit (overwritten or deleted data) is given back first
    /// by a commit: a file overwritten in a loop must not look like a full disk.
    fn available(&self, fs: &Filesystem) -> u64 {
        let a = fs.data_available().unwrap_or(u64::MAX);
        if a < self.space.low_water() && fs.reclaim_data_space().unwrap_or(false) {
            return fs.data_available().unwrap_or(u64::MAX);
        }
        a
    }

    /// Registers an open of `id`: a handle number and how the kernel should treat it.
    /// Writers of a SYNC file (each write made durable as it is made) bypass the page
    /// cache (FOPEN_DIRECT_IO); direct writes to one file that do not extend it run in
    /// parallel (in-place writes share the file's lock, see the engine's `nocow`).
    /// O_DIRECT opens keep the kernel's own direct-IO path: it goes around the page cache
    /// too, and stamps mtime/ctime as it does for every write under WRITEBACK_CACHE (with
    /// FOPEN_DIRECT_IO it stamps nothing, and ignores the times we stamp, so stat would
    /// show the old mtime until the kernel forgot the inode).
    fn open_handle(&self, ino: u64, flags: i32, sync_inode: bool) -> (u64, u32) {
        let writing = self.settings.writable && flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writing && self.space.is_low() {
            // Leaving low space is noticed here, when it matters.
            self.space.update(self.available(&self.fs));
        }
        let mut mode = self.space.open_mode(writing);
        let direct = writing && sync_inode;
        if direct && mode == OpenMode::Cached {
            mode = OpenMode::Direct;
        }
        let mut fh = self.space.opened(ino, mode, flags & libc::O_DIRECT != 0);
        if flags & libc::O_DIRECT != 0 {
            fh |= O_DIRECT_FH;
        }
        if direct || mode == OpenMode::Direct {
            let f = abi::fopen::DIRECT_IO | abi::fopen::PARALLEL_DIRECT_WRITES;
            (fh, f | abi::fopen::KEEP_CACHE)
        } else {
            (fh, abi::fopen::KEEP_CACHE)
        }
    }

    fn kernel_owns_times(&self) -> bool {
        self.kernel_times.load(Ordering::Relaxed)
    }

    /// What tells the kernel its caches went stale (once the session exists).
    fn notifier(&self) -> Option<transport::Notifier> {
        self.space.notifier_slot().get().cloned()
    }

    /// Runs operations that change the filesystem (refused on a read-only mount).
    fn mutate<R>(&self, f: impl FnOnce(&Filesystem) -> oleo::Result<R>) -> Result<R, Errno> {
        if !self.settings.writable {
            return Err(Errno::EROFS);
        }
        f(&self.fs).map_err(errno)
    }

    /// The entry the kernel gets for a new or found inode, counted as one more lookup.
    fn new_entry(&self, r: Result<Attr, Errno>) -> Result<abi::EntryOut, Errno> {
        let a = r?;
        let e = self.entry_out(&a)?;
        self.remember(e.nodeid, a.id);
        Ok(e)
    }

    /// An entry: the node id (root 1, else st_ino) and btrfs's inode generation, which
    /// with it makes a file handle (EXPORT_SUPPORT): an inode number btrfs hands out again
    /// after a deletion comes with a new generation, so an old handle is stale. The root's
    /// generation is 0, as the kernel wants of node 1.
    fn entry_out(&self, a: &Attr) -> Result<abi::EntryOut, Errno> {
        let attr = self.file_attr(a)?;
        let nodeid = self.ids.encode(a.id).ok_or(Errno::EOVERFLOW)?;
        let (secs, nsec) = (self.ttl.as_secs(), self.ttl.subsec_nanos());
        Ok(abi::EntryOut {
            nodeid,
            generation: if nodeid == abi::ROOT_ID {
                0
            } else {
                // The kernel keeps 32 bits (i_generation) and compares them with this.
                a.generation & u64::from(u32::MAX)
            },
            entry_valid: secs,
            attr_valid: secs,
            entry_valid_nsec: nsec,
            attr_valid_nsec: nsec,
            attr,
        })
    }

    fn attr_out(&self, a: &Attr) -> Result<abi::AttrOut, Errno> {
        Ok(abi::AttrOut {
            attr_valid: self.ttl.as_secs(),
            attr_valid_nsec: self.ttl.subsec_nanos(),
            dummy: 0,
            attr: self.file_attr(a)?,
        })
    }

    /// Counts one more kernel reference to `node` (each entry the kernel is given), before
    /// the reply goes out: its FORGET cannot come earlier.
    fn remember(&self, node: u64, id: InodeId) {
        let mut lookups = self.lookups.lock();
        let n = lookups.entry(node).or_insert(0);
        if *n == 0 {
            self.fs.pin_open(id);
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
        // The kernel's inode, and every page it cached, is gone.
        self.cached_nodes.write().remove(&node);
        if let Ok(id) = self.id(node) {
            if let Err(e) = self.unpin(id) {
                log::warn!("deleting forgotten inode {node}: {e:?}");
            }
        }
    }

    /// Drops one pin of `id`; deletes it if it was the last and the inode has no names left.
    fn unpin(&self, id: InodeId) -> Result<(), Errno> {
        let orphan = self.fs.drop_pin(id) && self.fs.getattr(id).is_ok_and(|a| a.nlink == 0);
        if orphan && self.settings.writable {
            self.fs.delete_if_unlinked(id).map_err(errno)?;
        }
        Ok(())
    }

    fn id(&self, node: u64) -> Result<InodeId, Errno> {
        self.ids.decode(node).ok_or(Errno::ESTALE)
    }

    fn file_attr(&self, a: &Attr) -> Result<abi::Attr, Errno> {
        let ino = self.ids.st_ino(a.id).ok_or(Errno::EOVERFLOW)?;
        Ok(abi::Attr {
            ino,
            size: a.size,
            blocks: a.blocks,
            atime: a.atime.sec as u64,
            mtime: a.mtime.sec as u64,
            ctime: a.ctime.sec as u64,
            atimensec: a.atime.nsec,
            mtimensec: a.mtime.nsec,
            ctimensec: a.ctime.nsec,
            mode: type_bits(a.kind) | (a.mode & 0o7777),
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            blksize: a.blksize,
            flags: 0,
        })
    }

    /// An inode's entry as the kernel gets it.
    fn entry_of(&self, id: InodeId) -> Result<abi::EntryOut, Errno> {
        let attr = self.fs.getattr(id).map_err(errno)?;
        self.entry_out(&attr)
    }

    /// Lists a directory from `offset`; `add` returns true once the answer is full.
    fn list(
        &self,
        node: u64,
        reader: u32,
        offset: u64,
        mut add: impl FnMut(u64, InodeId, FileKind, &[u8], u64) -> bool,
    ) -> Result<(), Errno> {
        let dir = self.id(node)?;
        let known = self.listings.lock().end(node, reader, offset);
        let end = match known {
            Some(end) => end,
            // Looked up without holding `listings`: it may read the tree from disk.
            None => {
                let end = self.fs.readdir_end(dir).map_err(errno)?;
                self.listings.lock().begin(node, reader, end);
                end
            }
        };
        // Offsets 1 and 2 follow "." and ".."; a real entry with DIR_INDEX i resumes at i + 1.
        if offset < 1 && add(node, dir, FileKind::Dir, b".", 1) {
            return Ok(());
        }
        if offset < 2 && add(node, dir, FileKind::Dir, b"..", 2) {
            return Ok(());
        }
        let mut err = None;
        self.fs
            .readdir(dir, offset.max(2), &mut |e| {
                // Entries created or renamed since opendir sit past its end.
                if e.next_offset > end {
                    return false;
                }
                match self.ids.encode(e.id) {
                    Some(node) => !add(node, e.id, e.kind, &e.name, e.next_offset),
                    None => {
                        err = Some(Errno::EOVERFLOW);
                        false
                    }
                }
            })
            .map_err(errno)?;
        err.map_or(Ok(()), Err)?;
        // getdents moves the directory's atime (the kernel's iterate_dir).
        self.read_happened(dir, true);
        Ok(())
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

fn spawn_committer(fs: Weak<Filesystem>, interval: Duration) {
    const NAP: Duration = Duration::from_millis(100);
    let spawned = std::thread::Builder::new()
        .name("oleo-commit".into())
        .spawn(move || loop {
            let start = std::time::Instant::now();
            while start.elapsed() < interval && !COMMIT_REQUESTED.swap(false, Ordering::SeqCst) {
                std::thread::sleep(NAP);
            }
            let Some(fs) = fs.upgrade() else { return };
            if fs.has_uncommitted_changes() {
                if let Err(e) = fs.sync() {
                    log::error!("periodic commit failed: {e}");
                }
            }
            // The cleaner: deleted subvolumes' trees are dropped a step at a time (each
            // step holds the filesystem briefly and is committed), until none is left or
            // it is time to look again.
            let started = std::time::Instant::now();
            while started.elapsed() < interval {
                match fs.clean_step() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        log::error!("dropping a deleted subvolume failed: {e}");
                        break;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        log::error!(
            "cannot start the commit thread ({e}): changes are committed only on fsync and unmount"
        );
    }
}

/// A write through a direct handle: as much as fits, leaving `keep` bytes free (short
/// writes are how write(2) says the device is full), ENOSPC if nothing fits.
/// Marks the handles of O_DIRECT opens: their data bypasses the image's page cache too.
const O_DIRECT_FH: u64 = 1 << 63;

/// The space guard's handle number of `fh`.
fn space_fh(fh: u64) -> u64 {
    fh & !O_DIRECT_FH
}

fn is_o_direct(fh: u64) -> bool {
    fh & O_DIRECT_FH != 0
}

/// `whole`: all of `data` or ENOSPC, never a short write: the kernel turns a short
/// asynchronous O_DIRECT write into EIO (fs/fuse/file.c, fuse_get_res_by_io), so O_DIRECT
/// writes go whole.
#[allow(clippy::too_many_arguments)]
fn write_direct(
    fs: &Filesystem,
    id: InodeId,
    offset: u64,
    data: &[u8],
    keep: u64,
    whole: bool,
    o_direct: bool,
    kernel_times: bool,
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
        let free = || fs.data_available().unwrap_or(u64::MAX);
        let mut avail = free();
        // Space freed since the last commit counts once a commit gives it back.
        if avail.saturating_sub(keep) < data.len() as u64 && fs.reclaim_data_space()? {
            avail = free();
        }
        len = prefix(avail.saturating_sub(keep));
    }
    loop {
        if len == 0 || (whole && len < data.len()) {
            return Err(Error::NoSpace);
        }
        let written = write_once(fs, id, offset, &data[..len], o_direct, kernel_times);
        match written {
            Err(Error::NoSpace) if whole => return Err(Error::NoSpace),
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

/// One write as the kernel sent it: O_DIRECT data goes around the image's page cache.
/// `kernel_times`: the kernel stamped mtime and ctime itself (every write but one through
/// a FOPEN_DIRECT_IO handle, under WRITEBACK_CACHE) and sends them in a SETATTR of its
/// own; it ignores ours, so stamping them too left the disk a clock tick apart from what
/// stat showed.
fn write_once(
    fs: &Filesystem,
    id: InodeId,
    offset: u64,
    data: &[u8],
    o_direct: bool,
    kernel_times: bool,
) -> oleo::Result<usize> {
    if kernel_times {
        fs.write_keep_times(id, offset, data, o_direct)
    } else if o_direct {
        fs.write_direct(id, offset, data)
    } else {
        fs.write(id, offset, data)
    }
}

fn errno(e: Error) -> Errno {
    if matches!(
        e,
        Error::Corrupt { .. } | Error::DataChecksum { .. } | Error::Io(_) | Error::Aborted(_)
    ) {
        log::error!("{e}");
    }
    Errno(e.errno())
}

/// The S_IFMT bits of a kind.
fn type_bits(k: FileKind) -> u32 {
    match k {
        FileKind::File => libc::S_IFREG,
        FileKind::Dir => libc::S_IFDIR,
        FileKind::Symlink => libc::S_IFLNK,
        FileKind::CharDev => libc::S_IFCHR,
        FileKind::BlockDev => libc::S_IFBLK,
        FileKind::Fifo => libc::S_IFIFO,
        FileKind::Socket => libc::S_IFSOCK,
    }
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
