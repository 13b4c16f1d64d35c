//! The public handle on an open filesystem: `Send + Sync`, every operation through
//! `&self`, so an embedding program (or the FUSE server) reads and writes from many
//! threads with no lock of its own.
//!
//! Inside, the state (`FsCore`) sits behind one reader-writer lock: reads share it, an
//! operation that changes the filesystem holds it alone while it joins the running
//! transaction. A commit holds it only to close the transaction (bookkeeping to a
//! fixpoint, blocks checksummed); writing the blocks, the flushes and the superblocks run
//! without it, while new operations join the next transaction (see `transaction`).
//!
//! Layer 8, the top: every public operation starts here, takes the inode lock and the
//! filesystem lock in order, and calls down (data, inode, subvolume, tree_log,
//! transaction). `inspect` reads raw trees for the dump tools.

mod fileattr;
mod inspect;
mod ioctl;
mod subvolume;
mod usage;

pub use usage::{ChunkInfo, DeviceInfo};
mod write;

use crate::ctree::TreeRoot;
use crate::data::file::ExtentInfo;
use crate::error::{Error, Result};
use crate::inode::inode_lock::InodeLocks;
use crate::inode::xattr::XattrSet;
use crate::transaction::fs::{Attr, DirEntry, FsCore, InodeId, StatFs, SubvolumeInfo};
use crate::transaction::options::OpenOptions;
use crate::transaction::Transaction;
use crate::tree_log::{write_batch, FsyncPlan, Synced};
use crate::vfs::file_ops::FallocMode;
use crate::vfs::inode_ops::{NewInode, RenameFlags};
use crate::vfs::setattr::{AtimeRule, SetAttr};
use oleo_format::superblock::Superblock;
use oleo_format::TreeBlock;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::path::Path;

/// The state held alone; see `Filesystem::core_mut`.
pub(crate) struct CoreMut<'a>(Option<RwLockWriteGuard<'a, FsCore>>);

impl std::ops::Deref for CoreMut<'_> {
    type Target = FsCore;
    fn deref(&self) -> &FsCore {
        self.0.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for CoreMut<'_> {
    fn deref_mut(&mut self) -> &mut FsCore {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for CoreMut<'_> {
    fn drop(&mut self) {
        let Some(core) = self.0.take() else {
            return;
        };
        let pipe = std::sync::Arc::clone(&core.pipe);
        drop(core);
        // A failure is logged and fails the pipe: the next operation reports it.
        let _ = pipe.write_deferred();
    }
}

/// An open btrfs filesystem: the handle every read and write goes through.
///
/// [`Filesystem::open`] opens an image file or block device read-only,
/// [`Filesystem::open_rw`] writable (one writer per image; see `Error::Busy`). The handle
/// is `Send + Sync` and every operation takes `&self`, so any number of threads may use
/// it at once. Inodes are named by [`InodeId`] (subvolume, inode number); [`root`]
/// (`Filesystem::root`) is the root directory of the subvolume that was opened. Changes
/// join the running transaction and become durable at the next commit: [`sync`], a
/// transaction outgrowing its dirty limit, [`close`], or a drop (which can only log a
/// failure).
///
/// [`root`]: Filesystem::root
/// [`sync`]: Filesystem::sync
/// [`close`]: Filesystem::close
pub struct Filesystem {
    core: RwLock<FsCore>,
    /// The device, reached without the lock (tree blocks a lookup missed).
    io: std::sync::Arc<crate::io::disk_io::DiskIo>,
    /// Per-file locks, taken before `core` (see `inode_lock`).
    inode_locks: InodeLocks,
    /// In-place writers against snapshots (see `nocow`), taken before `core`.
    nocow: crate::data::nocow::NocowWriters,
    /// Item changes of prealloc fills whose writes have returned (`prealloc_fill`): every
    /// use of `core` but the write path's planning applies them first.
    fills: crate::data::prealloc_fill::FillQueue,
    /// The core's commit pipe, reached without the lock (`queue_fill`).
    pipe: std::sync::Arc<crate::transaction::commit_pipe::CommitPipe>,
    /// The core's open counts, pinned and unpinned without `core` (`OpenInodes`).
    open_inodes: std::sync::Arc<crate::transaction::fs::OpenInodes>,
    /// The core's name sets, read without `core` (`lookup`).
    names: std::sync::Arc<crate::transaction::name_sets::NameSets>,
}

/// Operations that read: they share the lock.
macro_rules! reads {
    ($($(#[$m:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {$(
        $(#[$m])*
        pub fn $name(&self $(, $arg: $ty)*) -> $ret {
            self.core_read().$name($($arg),*)
        }
    )*};
}

/// Reads that look up items: they share the lock, and read tree blocks missing from the
/// cache after letting go of it (`lookup_op`).
macro_rules! lookups {
    ($($(#[$m:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {$(
        $(#[$m])*
        pub fn $name(&self $(, $arg: $ty)*) -> $ret {
            self.lookup_op(|core| core.$name($($arg),*))
        }
    )*};
}

/// Operations that change the filesystem: they hold the lock alone.
macro_rules! writes {
    ($($(#[$m:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {$(
        $(#[$m])*
        pub fn $name(&self $(, $arg: $ty)*) -> $ret {
            self.core_mut().$name($($arg),*)
        }
    )*};
}

/// Opens the filesystem as a mount does, each step in the layer that owns it: the device
/// and the trees (`FsCore::open`), the subvolume asked for (`subvolume`), a pending log
/// replayed (`tree_log`), and the orphans the last session left deleted (`vfs`).
fn mount(path: &Path, options: OpenOptions) -> Result<FsCore> {
    let mut fs = FsCore::open(path, options.clone())?;
    // A drop closes open files and commits, as an unmount does.
    fs.on_close = Some(FsCore::finish);
    fs.top = fs.resolve_mount_subvolume(&options)?;
    if fs.pending_log {
        fs.replay_pending_log(options.log_replay, !options.read_only)?;
    }
    if !options.read_only && fs.can_write().is_ok() {
        // Like the kernel at mount: files unlinked while open in the last session go now.
        match fs.remove_orphans(fs.top.subvol) {
            Ok(0) => {}
            Ok(n) => log::info!("removed {n} orphan inodes of subvolume {}", fs.top.subvol),
            Err(e) => log::warn!("orphan cleanup skipped: {e}"),
        }
    }
    if fs.pending_log {
        log::warn!(
                "the log tree at logical {} holds changes fsynced after the last commit (generation {}); \
                 they are not replayed ({}): showing the last committed state, like rescue=nologreplay",
                fs.sb.log_root,
                fs.sb.generation,
                fs.log_not_replayed.as_deref().unwrap_or("opened read-only")
            );
    }
    Ok(fs)
}

#[allow(clippy::unused_unit)]
impl Filesystem {
    /// Opens an image file or block device (read-only unless `options.read_only` is false).
    pub fn open(path: impl AsRef<Path>, options: OpenOptions) -> Result<Filesystem> {
        Ok(Filesystem::new(mount(path.as_ref(), options)?))
    }

    /// Opens an image file or block device writable.
    pub fn open_rw(path: impl AsRef<Path>, options: OpenOptions) -> Result<Filesystem> {
        let options = OpenOptions {
            read_only: false,
            ..options
        };
        Ok(Filesystem::new(mount(path.as_ref(), options)?))
    }

    fn new(core: FsCore) -> Filesystem {
        Filesystem {
            io: std::sync::Arc::clone(&core.io),
            pipe: std::sync::Arc::clone(&core.pipe),
            open_inodes: std::sync::Arc::clone(&core.open_inodes),
            names: std::sync::Arc::clone(&core.names),
            core: RwLock::new(core),
            inode_locks: InodeLocks::default(),
            nocow: Default::default(),
            fills: Default::default(),
        }
    }

    /// Marks `id` as open: if its last name goes, it lives on until unpinned. Takes no
    /// lock but the open counts' own (`OpenInodes`).
    pub fn pin_open(&self, id: InodeId) {
        self.open_inodes.pin(id);
    }

    /// Undoes one `pin_open` without deleting anything; true if it was the last (then
    /// `unpin`'s caller deletes an inode left without names under the write lock).
    pub fn drop_pin(&self, id: InodeId) -> bool {
        self.open_inodes.unpin(id)
    }

    /// Runs a read `f` under the shared lock with tree-block reads limited to the cache.
    /// A block it misses is read with the lock let go, under a read pin (so its space is
    /// not reused meanwhile), and `f` runs again: a cold read never holds the lock while
    /// the device works, and writers never wait for it.
    pub(crate) fn lookup_op<R>(&self, f: impl Fn(&FsCore) -> Result<R>) -> Result<R> {
        self.drain_fills();
        self.lookup_op_raw(f)
    }

    /// `lookup_op` without waiting for queued prealloc fills: for the write path's plans,
    /// which read nothing a queued fill changes (see `prealloc_fill`).
    pub(crate) fn lookup_op_raw<R>(&self, f: impl Fn(&FsCore) -> Result<R>) -> Result<R> {
        // A path longer than this many misses (a cache too small to hold it) is read with
        // the lock held, as before.
        const MAX_MISSES: usize = 16;
        for _ in 0..MAX_MISSES {
            let (miss, _pin) = {
                let core = self.core.read();
                let only = crate::io::disk_io::CachedOnly::new();
                match f(&core) {
                    Err(Error::NotCached(miss)) => {
                        drop(only);
                        (miss, core.pipe.pin_read(core.running_transid()))
                    }
                    r => return r,
                }
            };
            crate::blocking::will_wait();
            miss.fetch(&self.io)?;
        }
        f(&self.core.read())
    }

    /// Commits and closes; returns the final commit's result (a drop commits too, but can
    /// only log a failure).
    pub fn close(self) -> Result<()> {
        self.drain_fills();
        self.core.into_inner().close()
    }

    /// What a rescue open (`OpenOptions::rescue`) went around so far.
    pub fn rescue_skips(&self) -> &crate::io::rescue::SkipLog {
        self.io.skips()
    }

    /// The superblock as last committed.
    pub fn superblock(&self) -> Superblock {
        self.core_read().superblock().clone()
    }

    /// Lists directory `dir` from offset `from` (an entry's `next_offset` resumes after
    /// it); `f` returns false to stop. `f` runs without the lock held, so it may call back
    /// into the filesystem (the entries come in batches read under the lock).
    pub fn readdir(
        &self,
        dir: InodeId,
        from: u64,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        const BATCH: usize = 128;
        let mut from = from;
        loop {
            let batch = self.lookup_op(|core| {
                let mut batch = Vec::with_capacity(BATCH);
                core.readdir(dir, from, &mut |e| {
                    batch.push(e);
                    batch.len() < BATCH
                })?;
                Ok(batch)
            })?;
            let last = batch.len() < BATCH;
            for e in batch {
                from = e.next_offset;
                if !f(e) {
                    return Ok(());
                }
            }
            if last {
                return Ok(());
            }
        }
    }

    /// Reads up to `size` bytes at `offset` (fewer at the end of the file). Only finding
    /// the extents shares the lock; the data is read after letting go (see `file_read`).
    pub fn read(&self, id: InodeId, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.read_mode(id, offset, size, false)
    }

    /// `read` for a caller's O_DIRECT read: the data comes from the device itself, not
    /// from an image file's page cache, wherever it is sector aligned.
    pub fn read_direct(&self, id: InodeId, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.read_mode(id, offset, size, true)
    }

    fn read_mode(&self, id: InodeId, offset: u64, size: u32, uncached: bool) -> Result<Vec<u8>> {
        self.plan(id, offset, size, uncached)?.execute()
    }

    fn plan(
        &self,
        id: InodeId,
        offset: u64,
        size: u32,
        uncached: bool,
    ) -> Result<crate::data::file_read::ReadPlan> {
        let mut plan = self.lookup_op(|core| {
            let pin = core.pipe.pin_read(core.running_transid());
            core.plan_read(id, offset, size, Some(pin))
        })?;
        plan.uncached = uncached;
        Ok(plan)
    }

    /// Reads up to `buf.len()` bytes at `offset` into `buf`, straight from the devices
    /// where the range is whole sectors (the FUSE server hands its reply buffer); returns
    /// how many (fewer at the end of the file). `uncached` as for `read_direct`.
    pub fn read_into(
        &self,
        id: InodeId,
        offset: u64,
        buf: &mut [u8],
        uncached: bool,
    ) -> Result<usize> {
        let size = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        self.plan(id, offset, size, uncached)?.execute_into(buf)
    }

    /// Visits every block of a tree (inspection tools). `f` runs under the shared lock:
    /// it must not call back into the filesystem.
    pub fn walk_tree(
        &self,
        root: &TreeRoot,
        f: &mut dyn FnMut(TreeBlock<'_>),
        on_error: &mut dyn FnMut(&crate::Error),
    ) -> Result<()> {
        self.core_read().walk_tree(root, f, on_error)
    }

    /// Starts (or joins) the running transaction, with the filesystem to itself until the
    /// transaction handle is dropped or committed.
    pub fn start_transaction(&self) -> Result<Transaction<'_>> {
        self.drain_fills();
        Transaction::start_locked(self.core.write())
    }

    /// Runs `f` in the running transaction and commits it if `f` succeeds; returns the
    /// committed generation and what `f` returned.
    pub fn with_transaction<R>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<R>,
    ) -> Result<(u64, R)> {
        let mut txn = self.start_transaction()?;
        let r = f(&mut txn)?;
        let generation = txn.commit()?;
        Ok((generation, r))
    }

    /// The inode `name` names in directory `dir` (`.` and `..` included; a subvolume's
    /// entry leads to its root directory). `Error::NotFound` if none. A name a directory
    /// made here surely lacks (`name_sets`) is answered without the lock: the LOOKUP
    /// before every create no longer waits for other threads' creates.
    pub fn lookup(&self, dir: InodeId, name: &[u8]) -> Result<InodeId> {
        let plain = !name.is_empty() && name.len() <= 255 && name != b"." && name != b"..";
        if plain
            && self
                .names
                .surely_absent(dir, oleo_format::csum::name_hash(name))
        {
            return Err(Error::NotFound);
        }
        self.lookup_op(|core| core.lookup(dir, name))
    }

    /// The state, alone. Letting go of it writes the commits closed meanwhile (a
    /// transaction over its dirty limit), outside the lock.
    pub(crate) fn core_mut(&self) -> CoreMut<'_> {
        self.drain_fills();
        CoreMut(Some(self.core.write()))
    }

    /// The state, shared.
    pub(crate) fn core_read(&self) -> RwLockReadGuard<'_, FsCore> {
        self.drain_fills();
        self.core.read()
    }

    /// `core_read` without waiting for queued prealloc fills (see `lookup_op_raw`).
    pub(crate) fn core_read_raw(&self) -> RwLockReadGuard<'_, FsCore> {
        self.core.read()
    }

    /// Waits until the item changes of every prealloc fill queued so far are applied.
    fn drain_fills(&self) {
        if self.fills.busy() {
            self.fills.drain(&|batch| self.apply_fills(batch));
        }
    }

    /// Queues a fill's item change (its data is on the device; it keeps its range until
    /// the change is applied), applying queued ones if nobody else is. Then writes a
    /// commit closed at the dirty limit meanwhile, as `CoreMut`'s drop would: batches are
    /// applied without `CoreMut`, so that readers waiting for them never wait for commit
    /// IO. A failure there is logged and fails the pipe: the next operation reports it.
    pub(crate) fn queue_fill(&self, fill: crate::data::prealloc_fill::PendingFill) {
        self.fills.push(fill, &|batch| self.apply_fills(batch));
        let _ = self.pipe.write_deferred();
    }

    /// Applies queued prealloc fills under one hold of the lock, each in its own operation,
    /// then lets their ranges go. A change that fails aborts the transaction: its write
    /// has returned, and its range must not read as preallocated from now on. A commit
    /// closed meanwhile (the dirty limit) is not written here, where readers may be
    /// waiting for the batch, but by the writer after it (`queue_fill`).
    fn apply_fills(&self, batch: Vec<crate::data::prealloc_fill::PendingFill>) {
        {
            let mut core = self.core.write();
            for f in &batch {
                let need = crate::filesystem::write::fill_reserve(&f.pieces, &f.sums);
                let r = core.write_op(need, |t| {
                    t.mark_extent_written(f.id, &f.pieces, &f.sums, f.end, f.keep_times)
                });
                if let Err(e) = r {
                    let why = format!(
                        "the write into preallocated space of inode {} at {} could not be recorded: {e}",
                        f.id.ino,
                        f.pieces.first().map_or(0, |p| p.at)
                    );
                    if core.aborted.is_none() {
                        let started = core.start_transaction().map(|t| t.abort(&why));
                        if started.is_err() {
                            core.aborted = Some(why);
                        }
                    }
                }
            }
        }
        for f in &batch {
            self.nocow.unlock_range(f.range);
        }
    }

    pub(crate) fn inode_locks(&self) -> &InodeLocks {
        &self.inode_locks
    }

    pub(crate) fn nocow_writers(&self) -> &crate::data::nocow::NocowWriters {
        &self.nocow
    }

    /// Whether a read of `id` now would move its atime under `rule` (a FUSE server asks
    /// at open: a read the kernel answers from its cache never reaches it).
    pub fn atime_due(&self, id: InodeId, rule: AtimeRule) -> Result<bool> {
        self.lookup_op(|core| core.atime_due(id, rule))
    }

    /// A read of `id` happened: its atime moves to now if `rule` says so, in the running
    /// transaction (no commit of its own, as the kernel's atime updates). True if it
    /// moved. The check shares the lock; only an atime that moves takes it alone.
    pub fn touch_atime(&self, id: InodeId, rule: AtimeRule) -> Result<bool> {
        if !self.atime_due(id, rule)? {
            return Ok(false);
        }
        self.core_mut().touch_atime(id, rule)
    }

    /// Changes a file's size, owner, mode or times (its data changes with its size).
    pub fn setattr(&self, id: InodeId, set: &SetAttr) -> Result<Attr> {
        let _file = self.inode_locks.lock(id);
        self.core_mut().setattr(id, set)
    }

    /// Allocates, punches or zeroes a range of `id`.
    pub fn fallocate(&self, id: InodeId, offset: u64, len: u64, mode: FallocMode) -> Result<()> {
        self.fallocate_how(id, offset, len, mode, false)
    }

    /// `fallocate` leaving mtime and ctime to a caller whose cache owns them (FUSE's
    /// writeback cache: see `write_keep_times`).
    pub fn fallocate_keep_times(
        &self,
        id: InodeId,
        offset: u64,
        len: u64,
        mode: FallocMode,
    ) -> Result<()> {
        self.fallocate_how(id, offset, len, mode, true)
    }

    fn fallocate_how(
        &self,
        id: InodeId,
        offset: u64,
        len: u64,
        mode: FallocMode,
        keep_times: bool,
    ) -> Result<()> {
        let _file = self.inode_locks.lock(id);
        self.core_mut().fallocate(id, offset, len, mode, keep_times)
    }

    /// Copies `len` bytes, sharing whole extents; returns the bytes copied.
    pub fn copy_file_range(
        &self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        self.copy_file_range_how(src, src_off, dst, dst_off, len, false)
    }

    /// `copy_file_range` leaving the destination's mtime and ctime to a caller whose
    /// cache owns them (FUSE's writeback cache: see `write_keep_times`).
    pub fn copy_file_range_keep_times(
        &self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        self.copy_file_range_how(src, src_off, dst, dst_off, len, true)
    }

    /// Makes `[dst_off, dst_off + len)` of `dst` share `src`'s extents from `src_off` (a
    /// reflink), within a subvolume or across two of this filesystem. Offsets must be
    /// sector-aligned, and `len` too unless the range ends at the source's EOF; what cannot
    /// be shared (unaligned, an inline source, checksums on one side only) is
    /// `Error::Unsupported`, with nothing changed, for the caller to copy instead.
    pub fn reflink(
        &self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
    ) -> Result<()> {
        let _files = self.inode_locks.lock_two(src, dst);
        self.core_mut().reflink(src, src_off, dst, dst_off, len)
    }

    /// Stores a compressed extent as it comes (BTRFS_IOC_ENCODED_WRITE): `len` bytes at
    /// file `offset` that are bytes `[unencoded_offset, +len)` of what `data`, compressed
    /// with `compression`, decodes to (`unencoded_len` bytes). The data is not decoded
    /// here. `Error::Unsupported`, with nothing changed, where the kernel would refuse too
    /// or the data belongs inline: the caller then writes it decoded.
    #[allow(clippy::too_many_arguments)] // the fields of the kernel's encoded write
    pub fn write_encoded(
        &self,
        id: InodeId,
        offset: u64,
        len: u64,
        unencoded_len: u64,
        unencoded_offset: u64,
        compression: oleo_format::items::Compression,
        data: &[u8],
    ) -> Result<()> {
        let e = crate::data::encoded::Encoded {
            offset,
            len,
            unencoded_len,
            unencoded_offset,
            compression,
            data,
        };
        let _file = self.inode_locks.lock(id);
        self.core_mut().write_encoded(id, &e)
    }

    /// The bytes of file `id`'s disk extent at `bytenr` (`disk_len` long) as they are on
    /// disk, compressed data still compressed (BTRFS_IOC_ENCODED_READ's payload), checked
    /// against their checksums.
    pub fn read_extent_raw(&self, id: InodeId, bytenr: u64, disk_len: u64) -> Result<Vec<u8>> {
        let plan = self.lookup_op(|core| {
            let pin = core.pipe.pin_read(core.running_transid());
            core.plan_raw_extent(id, bytenr, disk_len, Some(pin))
        })?;
        plan.execute()
    }

    /// The file ranges of subvolumes `roots` that reference the data extent of
    /// `disk_len` bytes at `bytenr` (holding `ram_bytes` uncompressed), from the extent
    /// tree's backrefs: (root, inode, file offset, extent offset, length). None when the
    /// extent has more than 64 references (not worth searching) or no extent item.
    /// References the running transaction has queued are not seen: ask after a commit
    /// (send reads read-only snapshots of a read-only open).
    pub fn extent_users(
        &self,
        bytenr: u64,
        disk_len: u64,
        ram_bytes: u64,
        roots: &[u64],
    ) -> Result<Option<Vec<crate::data::extent_users::ExtentUser>>> {
        self.lookup_op(|core| core.extent_users(bytenr, disk_len, ram_bytes, roots))
    }

    fn copy_file_range_how(
        &self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
        keep_times: bool,
    ) -> Result<u64> {
        // The source too: an in-place write into an extent being shared would show in the
        // copy after it was made.
        let _files = self.inode_locks.lock_two(src, dst);
        self.core_mut()
            .copy_file_range(src, src_off, dst, dst_off, len, keep_times)
    }

    reads! {
        /// The root directory of the opened subvolume.
        fn root(&self) -> InodeId;
        /// True when the image has a log tree that was not replayed.
        fn has_pending_log(&self) -> bool;
        /// Memory held by the running transaction's dirty tree blocks.
        fn dirty_bytes(&self) -> u64;
        /// True while changes are waiting for a commit.
        fn has_uncommitted_changes(&self) -> bool;
        /// (writes, flushes) issued to the device since it was opened.
        fn io_counts(&self) -> (u64, u64);
        /// Records every device write and flush from now on (crash simulation).
        fn start_io_recording(&self) -> ();
        /// The writes and flushes recorded so far.
        fn take_io_recording(&self) -> Vec<crate::io::device::IoEvent>;
        /// The writes and flushes recorded so far on every device of a set, in the order
        /// they were issued, each with its devid.
        fn take_io_recording_devices(&self) -> Vec<(u64, crate::io::device::IoEvent)>;
        /// Makes every later write to the device fail after `writes` more (crash tests).
        fn fail_writes_after(&self, writes: u64) -> ();
        /// Why this filesystem cannot be written by oleo, if it cannot.
        fn can_write(&self) -> Result<()>;
        /// A path from the top-level subvolume to `id`.
        fn inode_path(&self, id: InodeId) -> Result<Vec<u8>>;
        /// The default subvolume's id: what the `default` entry of the root tree's
        /// directory names (`btrfs subvolume set-default`), 5 (FS_TREE) if there is none.
        /// Opening without `subvol`/`subvolid` opens it.
        fn default_subvolume(&self) -> Result<u64>;
        /// Every subvolume and snapshot (ROOT_ITEMs with references), with its place in
        /// the tree of subvolumes, as `btrfs subvolume list` shows them.
        fn list_subvolumes(&self) -> Result<Vec<SubvolumeInfo>>;
        /// The current root of tree `id` (None: no such tree).
        fn tree_root(&self, id: u64) -> Result<Option<TreeRoot>>;
        /// Every tree the root tree records.
        fn tree_ids(&self) -> Result<Vec<u64>>;
    }

    /// Bytes new file data can still get (statfs's available space). Asked around every
    /// guarded write (the FUSE space guard), it does not wait for queued prealloc fills:
    /// they change items, not the space given to data.
    pub fn data_available(&self) -> Result<u64> {
        self.core_read_raw().data_available()
    }

    /// statfs(2): size, free and available space from the block groups (queued prealloc
    /// fills change none of it, as for `data_available`).
    pub fn statfs(&self) -> Result<StatFs> {
        self.core_read_raw().statfs()
    }

    lookups! {
        /// SEEK_DATA (`data`) or SEEK_HOLE from `offset`.
        fn seek_data_hole(&self, id: InodeId, offset: u64, data: bool) -> Result<u64>;
        /// A file's extents, as FIEMAP reports them.
        fn file_extents(&self, id: InodeId) -> Result<Vec<ExtentInfo>>;
        /// The offset past the last entry `dir` has now (a listing opened now ends there).
        fn readdir_end(&self, dir: InodeId) -> Result<u64>;
        /// stat(2) of `id`, from its INODE_ITEM.
        fn getattr(&self, id: InodeId) -> Result<Attr>;
        /// The target of symlink `id` (`Error::InvalidArgument` for anything else).
        fn readlink(&self, id: InodeId) -> Result<Vec<u8>>;
        /// The value of xattr `name` (its XATTR_ITEM); `Error::NoXattr` if it has none.
        fn getxattr(&self, id: InodeId, name: &[u8]) -> Result<Vec<u8>>;
        /// The names of every xattr of `id`, POSIX ACLs (`system.posix_acl_*`) included.
        fn listxattr(&self, id: InodeId) -> Result<Vec<Vec<u8>>>;
        /// Follows `path` (components separated by '/') from `start`.
        fn resolve_path(&self, start: InodeId, path: &[u8]) -> Result<InodeId>;
    }

    /// Commits when that gives data space back (what was freed since the last commit stays
    /// pinned until one, as in the kernel, which commits before it reports ENOSPC): for
    /// callers that must see free space as it really is. True if it committed.
    pub fn reclaim_data_space(&self) -> Result<bool> {
        if !self.core.read().commit_would_free_data() {
            return Ok(false);
        }
        self.sync()?;
        Ok(true)
    }

    /// Commits the running transaction, if any: everything before is durable after.
    /// Returns the generation on disk. Operations of other threads go on meanwhile, in the
    /// next transaction: only closing this one holds the lock.
    pub fn sync(&self) -> Result<u64> {
        // Group commit: while an earlier commit is still writing, operations of other
        // threads keep joining the running transaction; waiting for that commit first
        // lets one commit (two flushes) cover every sync that arrived meanwhile.
        let (closed, pipe) = {
            let core = self.core_read();
            (core.superblock().generation, core.pipe.clone())
        };
        pipe.wait_durable(closed)?;
        let (io, generation, pipe) = {
            let mut core = self.core.write();
            let io = core.close_running()?;
            (io, core.superblock().generation, core.pipe.clone())
        };
        match io {
            Some(io) => io.write(),
            // Nothing new, but a commit of another thread may still be writing.
            None => pipe.wait_durable(generation),
        }
    }

    /// fsync(2) or fdatasync(2) of `id`: its data and metadata (for a directory, the
    /// entries it gained or lost) are durable when this returns. Its changes since its
    /// last fsync go to its subvolume's log tree and one log sync writes them, shared with
    /// the fsyncs of other threads that arrive meanwhile; where the log cannot describe the
    /// change (`tree_log::log_inode`, `tree_log::log_dir`), the transaction commits
    /// instead. An inode with nothing new costs no IO.
    pub fn fsync(&self, id: InodeId, _datasync: bool) -> Result<()> {
        // Data written in place is in no tree: with nothing to log, a flush makes it durable.
        let written_in_place = self.nocow.take_unsynced(id);
        let mut r = self.fsync_inode(id);
        if written_in_place && r.is_ok() {
            // The log sync that covered this inode may have been written before its data
            // (it had no item to log): one more flush, cheap with nothing new to write.
            r = self.io.flush();
        }
        if r.is_err() && written_in_place {
            self.nocow.mark_unsynced(id);
        }
        r
    }

    fn fsync_inode(&self, id: InodeId) -> Result<()> {
        let plan = {
            // This file's writes in flight finish first: their items must be in.
            let _file = self.inode_locks.lock(id);
            self.core_mut().plan_fsync(id)?
        };
        match plan {
            FsyncPlan::Commit(why) => {
                log::debug!("fsync of inode {} commits: {why}", id.ino);
                self.sync().map(drop)
            }
            FsyncPlan::Log { transid, seq } => {
                let pipe = self.core_read().pipe.clone();
                pipe.wait_durable(transid - 1)?;
                let Some(seq) = seq else { return Ok(()) };
                let gather = || self.core_mut().gather_log(transid);
                let write = |b: &_| write_batch(&self.io, b);
                match pipe.log.sync(transid, seq, gather, write) {
                    Synced::Durable => Ok(()),
                    Synced::Closed => pipe.wait_durable(transid).map(drop),
                    Synced::Broken => self.sync().map(drop),
                }
            }
        }
    }

    /// (log syncs written, fsyncs they made durable) since the filesystem was opened.
    pub fn log_sync_counts(&self) -> (u64, u64) {
        self.core_read().pipe.log.counts()
    }

    writes! {
        /// Undoes one `pin_open`; the last one deletes the inode if it has no names left.
        fn unpin_open(&self, id: InodeId) -> Result<()>;
        /// Deletes `id` if it has no names left and nothing pins it.
        fn delete_if_unlinked(&self, id: InodeId) -> Result<()>;
        /// Creates a file of any type but directory and symlink, as `new` describes.
        fn mknod(&self, parent: InodeId, name: &[u8], new: &NewInode) -> Result<Attr>;
        /// Creates directory `name` in `parent`, as `new` describes (of its mode only the
        /// permission and sticky bits count); returns its attributes.
        fn mkdir(&self, parent: InodeId, name: &[u8], new: &NewInode) -> Result<Attr>;
        /// An unnamed regular file (O_TMPFILE), pinned as if open, that `link` can name.
        fn tmpfile(&self, parent: InodeId, new: &NewInode) -> Result<Attr>;
        /// Creates symlink `name` in `parent` pointing at `target` (stored inline),
        /// owned by `uid`:`gid`, mode 0777.
        fn symlink(&self, parent: InodeId, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr>;
        /// Gives `id` (not a directory) another name, `name` in `parent` (same subvolume).
        fn link(&self, id: InodeId, parent: InodeId, name: &[u8]) -> Result<Attr>;
        /// Removes non-directory `name` from `parent`; the inode goes with its last name
        /// unless it is pinned open (`pin_open`), then with the last unpin.
        fn unlink(&self, parent: InodeId, name: &[u8]) -> Result<()>;
        /// Removes empty directory `name` from `parent`.
        fn rmdir(&self, parent: InodeId, name: &[u8]) -> Result<()>;
        /// rename(2)/renameat2(2): moves `name` in `parent` to `new_name` in `new_parent`
        /// (same subvolume), replacing a target unless `flags` say otherwise.
        fn rename(&self, parent: InodeId, name: &[u8], new_parent: InodeId, new_name: &[u8], flags: RenameFlags) -> Result<()>;
        /// Sets xattr `name` of `id` to `value`, as `how` allows. `system.posix_acl_*`
        /// names set POSIX ACLs, `btrfs.compression` the compression property.
        fn setxattr(&self, id: InodeId, name: &[u8], value: &[u8], how: XattrSet) -> Result<()>;
        /// Removes xattr `name` of `id`; `Error::NoXattr` if it has none.
        fn removexattr(&self, id: InodeId, name: &[u8]) -> Result<()>;
        /// Deletes every unlinked inode still pinned, then commits (an unmount).
        fn close_all_and_sync(&self) -> Result<u64>;
    }
}
