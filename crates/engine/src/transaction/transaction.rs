//! A write transaction: generation T = last committed + 1. It holds every tree block changed
//! in T in memory (the `BlockStore` the B-tree write side works on), allocates new tree
//! blocks from metadata (system for the chunk tree) block groups, and on commit brings the
//! bookkeeping to a fixpoint (extent items, block group `used`, free space tree, ROOT_ITEMs),
//! writes the blocks to every copy, flushes, and only then writes the superblocks.
//!
//! Until the superblock is written nothing on disk refers to the new blocks: they go to space
//! that is free in the last commit, and space freed in T is never reused within T (nor
//! before T's superblock is durable).
//!
//! ## States
//! - *Running*: `FsCore::running`. Operations join it one at a time, each holding the
//!   filesystem's write lock (`Filesystem::core`) for as long as it changes trees.
//! - *Closed* (`Transaction::close`, under the write lock): bookkeeping to a fixpoint,
//!   blocks checksummed and handed to `DiskIo` as in-flight (reads see them from memory),
//!   the in-memory superblock and roots switched to T, the block groups carried over to
//!   T+1 with T's freed space pinned. The lock is released: T+1 starts at the next
//!   operation.
//! - *Writing* (`commit_pipe::CommitIo`, no filesystem lock): T's blocks, a flush, then in
//!   generation order its superblocks and a flush. Every closed commit passes through the
//!   pipe's deferred queue: whoever closed it queues it, then writes whatever the queue
//!   holds, oldest first, so the oldest unwritten commit is always with a thread that
//!   writes it next (the shuttle model `deferred_commits_are_all_written_in_order`).
//! - *Durable*: T's pins and in-flight blocks are released. A failure instead marks the
//!   pipe failed: every later commit and operation gets `Error::Aborted` (EROFS).
//!
//! ## Reads
//! A file read shares `Filesystem::core` only to find its extents and checksums
//! (`file_read`); the data is read after letting go, under a `ReadPin` that keeps space
//! freed from the transaction it looked in from being handed out until it is done.
//!
//! ## Lock order
//! 0. `InodeLocks` (one file's writers: write, truncate, fallocate, copy into or out of
//!    it; in-place writes and prealloc fills share it), taken before `core`, held across
//!    that file's data IO; two at once only in id order (`lock_two`). Then an in-place
//!    write's or prealloc fill's range (`NocowWriters::lock_range`; a queued fill keeps it
//!    until its item change is applied), then `NocowWriters`' lock (in-place writers
//!    share it across their data IO; snapshot and subvolume deletion hold it alone before
//!    taking `core`).
//! 1. The prealloc fill queue (`FillQueue`): its mutex is let go at once; a thread waits
//!    there (for queued changes, or to take over applying them) only before taking `core`.
//! 2. `Filesystem::core` (RwLock over `FsCore`): reads share it, changes hold it alone.
//! 3. The deferred queue (taken and let go at once), `CommitOrder::durable`, then
//!    `CommitOrder::failed`. A thread holding `core` may wait
//!    on `durable` (an inline commit, `sync` with nothing new); the writing half of a
//!    commit never takes `core`, so it always finishes.
//! 4. `LogSyncs::io` (`log_sync`): held by a log sync across its IO, and by a
//!    commit writing its superblocks (inside `durable`). A log sync waits for the commit
//!    before its own first and takes nothing else but leaf locks while holding it.
//! 5. Leaf locks, never held while taking another: the caches, `open_inodes`, `next_ino`,
//!    `next_index`, `subvol_roots`, `DiskIo`'s chunk map, context and in-flight map,
//!    `CommitPins` and `ReadPins`.
//!
//! Before a thread waits for long (a commit's IO, a commit to become durable, another
//! writer's inode lock) it says so through `blocking`, so a server with few threads ready
//! can wake another.

use crate::ctree::{self, finalize_block, BlockSource, BlockStore, TreeRoot};
use crate::error::{Error, Result};
use crate::io::disk_io::Block;
pub(crate) use crate::transaction::commit_pipe::CommitIo;
use crate::transaction::fs::FsCore;
use crate::transaction::space::block_group::{self, BlockGroups};
use crate::transaction::space::delayed_ref::DelayedRefs;
use crate::transaction::space::extent_tree;
use crate::transaction::space::free_space;
use oleo_format::items::{block_group as bg, RootItem, Timespec, ROOT_ITEM_SIZE};
use oleo_format::key::{item, objectid, Key};
use oleo_format::superblock::{self, compat_ro, incompat, BackupRoot};
use oleo_format::TreeBlock;
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// Wall-clock time as (seconds, nanoseconds).
fn now() -> (u64, u32) {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs(), d.subsec_nanos()))
        .unwrap_or((0, 0))
}

/// Rounds of the commit fixpoint before we call it a bug rather than slow convergence,
/// beyond one per block of the bookkeeping trees: on a nearly full filesystem every block
/// a round copies frees one whose extent item sits in a leaf not copied yet, and the rounds
/// go on until most of the extent tree is copied (each block is copied once per commit).
const MAX_COMMIT_ROUNDS: u64 = 64;

/// The running transaction's state. It lives in `FsCore::running` between operations,
/// so every operation joins it and reads see its changes until it is committed.
pub struct TxnState {
    pub(crate) transid: u64,
    pub(crate) nodesize: u32,
    pub(crate) chunk_tree_uuid: [u8; 16],
    /// Blocks changed in T, shared with readers: an edit copies a block only while a
    /// reader still holds it (`Arc::make_mut`), so reading a dirty block never copies.
    pub(crate) dirty: BTreeMap<u64, Block>,
    /// Current root of every tree touched in T.
    pub(crate) roots: BTreeMap<u64, TreeRoot>,
    /// The root as its ROOT_ITEM (or the superblock) records it, and that item's key.
    recorded: BTreeMap<u64, (TreeRoot, Key)>,
    pub(crate) block_groups: BlockGroups,
    pub(crate) refs: DelayedRefs,
    /// Per tree, bytes of tree blocks allocated minus freed (ROOT_ITEM.bytes_used).
    used_delta: BTreeMap<u64, i64>,
    /// The tree holding BLOCK_GROUP_ITEMs: the extent tree or the block group tree.
    pub(crate) bg_items_tree: u64,
    /// Chunks created in T: what the superblock must learn at commit.
    pub(crate) new_chunks: crate::transaction::space::chunk_alloc::PendingChunks,
    /// Set when a change failed half-way: the trees may be inconsistent, so no commit.
    poisoned: Option<String>,
    /// Tree changes made so far (an operation that fails after changing trees aborts).
    changes: u64,
    /// Old blocks copied in this transaction that other trees still share: freeing them
    /// only drops this tree's reference.
    shared_cow: std::collections::HashSet<u64>,
    /// ROOT_ITEM.last_snapshot per subvolume tree (blocks older than it may be shared).
    last_snapshots: BTreeMap<u64, u64>,
    /// What fsyncs logged, and what changed since (`tree_log`).
    pub(crate) log: crate::transaction::changes::TxnLog,
    /// Directory index and inode items not in their trees yet (`delayed_inode`).
    pub(crate) delayed: crate::transaction::delayed_inode::DelayedItems,
    /// Blocks of the extent, free space and block group trees when T started: the most
    /// the commit's bookkeeping can copy of them.
    pub(crate) bookkeeping_blocks: u64,
    /// Data bytes the running operation reserved and may still allocate (`reservation`);
    /// None outside operations.
    pub(crate) data_budget: Option<u64>,
    /// Incompat feature bits this transaction's changes need in the superblock.
    pub(crate) incompat_needed: u64,
    /// Subvolumes an inode of which was created or changed in T: their ctransid and ctime
    /// move (the kernel's btrfs_update_root_times); a tree changed otherwise, such as a
    /// snapshot's source, keeps them (send streams name a parent by its ctransid).
    pub(crate) inodes_changed: std::collections::BTreeSet<u64>,
    /// A new superblock label (without its NUL), written by this transaction's commit.
    pub(crate) new_label: Option<Vec<u8>>,
    /// Uncompressed data extents allocated in T whose file extent item was put in whole
    /// (address to length): one may grow over the piece written after it
    /// (`Transaction::join_previous`), as no committed tree, snapshot or log holds it.
    pub(crate) fresh_data: crate::transaction::space::delayed_ref::FreshExtents,
}

impl TxnState {
    /// ROOT_ITEM.last_snapshot of `tree` as this transaction changed it, if it did.
    pub(crate) fn last_snapshot_seen(&self, tree: u64) -> Option<u64> {
        self.last_snapshots.get(&tree).copied()
    }
}

/// A handle on the running transaction (generation T = last committed + 1), for editing
/// items in any tree by key, copy-on-write. Dropping it leaves the changes in the running
/// transaction for the next operation to join; `commit` writes them out (from outside
/// the crate: `Filesystem::with_transaction`, or a later `Filesystem::sync`).
pub struct Transaction<'a> {
    fs: CoreRef<'a>,
}

/// The state a transaction works on: borrowed by an operation already holding it, or
/// locked for a transaction started through the public handle.
enum CoreRef<'a> {
    Borrowed(&'a mut FsCore),
    Locked(parking_lot::RwLockWriteGuard<'a, FsCore>),
}

impl std::ops::Deref for CoreRef<'_> {
    type Target = FsCore;
    fn deref(&self) -> &FsCore {
        match self {
            CoreRef::Borrowed(f) => f,
            CoreRef::Locked(g) => g,
        }
    }
}

impl std::ops::DerefMut for CoreRef<'_> {
    fn deref_mut(&mut self) -> &mut FsCore {
        match self {
            CoreRef::Borrowed(f) => f,
            CoreRef::Locked(g) => g,
        }
    }
}

impl std::ops::Deref for Transaction<'_> {
    type Target = TxnState;
    fn deref(&self) -> &TxnState {
        self.fs
            .running
            .as_deref()
            .expect("a Transaction always has running state")
    }
}

impl std::ops::DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut TxnState {
        self.fs
            .running
            .as_deref_mut()
            .expect("a Transaction always has running state")
    }
}

impl FsCore {
    /// Starts transaction `generation + 1`. The filesystem must have been opened writable.
    pub(crate) fn start_transaction(&mut self) -> Result<Transaction<'_>> {
        Transaction::start(self)
    }
}

impl FsCore {
    /// Why this filesystem cannot be written by oleo, if it cannot.
    pub(crate) fn can_write(&self) -> Result<()> {
        if let Some(why) = &self.aborted {
            return Err(Error::Aborted(why.clone()));
        }
        check_writable(self)?;
        match load_root(self, objectid::QUOTA_TREE) {
            Err(Error::NotFound) => {}
            Ok(_) => {
                return Err(Error::Unsupported(
                    "writing to filesystems with quotas enabled is not supported yet".into(),
                ))
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

fn check_writable(fs: &FsCore) -> Result<()> {
    let sb = &fs.sb;
    // An in-memory log replay runs a transaction on a read-only device; nothing else may.
    let replaying_in_memory = fs.log_in_memory && fs.running.is_none();
    if !fs.io.devices().is_writable() && !replaying_in_memory {
        return Err(Error::ReadOnly);
    }
    if let Some(why) = crate::transaction::fs::too_small(fs.io.device().size(), sb) {
        return Err(Error::Unsupported(why));
    }
    if sb.log_root != 0 {
        let why = fs
            .log_not_replayed
            .as_deref()
            .unwrap_or("it was opened read-only");
        return Err(Error::Unsupported(format!(
            "the filesystem has a log tree that was not replayed ({why}); mount it with the kernel first"
        )));
    }
    if !sb.has_incompat(incompat::SKINNY_METADATA) {
        return Err(Error::Unsupported(
            "writing needs skinny metadata extent items (mkfs -O skinny-metadata)".into(),
        ));
    }
    if !sb.has_compat_ro(compat_ro::FREE_SPACE_TREE)
        || !sb.has_compat_ro(compat_ro::FREE_SPACE_TREE_VALID)
    {
        return Err(Error::Unsupported(
            "writing needs the free space tree (space_cache=v2); this filesystem uses v1".into(),
        ));
    }
    if sb.has_incompat(incompat::EXTENT_TREE_V2)
        || sb.has_incompat(incompat::ZONED)
        || sb.has_incompat(incompat::RAID_STRIPE_TREE)
        || sb.has_incompat(incompat::SIMPLE_QUOTA)
        || sb.has_incompat(incompat::REMAP_TREE)
    {
        return Err(Error::Unsupported(
            "writing to filesystems with extent-tree-v2, zoned, raid-stripe-tree, simple quota or remap tree is not supported".into(),
        ));
    }
    Ok(())
}

impl TxnState {
    fn new(fs: &mut FsCore) -> Result<TxnState> {
        if let Some(why) = fs.pipe.failure() {
            fs.aborted.get_or_insert(why);
        }
        if let Some(why) = &fs.aborted {
            return Err(Error::Aborted(why.clone()));
        }
        check_writable(fs)?;
        let transid = fs
            .sb
            .generation
            .checked_add(1)
            .ok_or_else(|| Error::Unusable("generation overflows".into()))?;
        let bg_items_tree = if fs.sb.has_compat_ro(compat_ro::BLOCK_GROUP_TREE) {
            objectid::BLOCK_GROUP_TREE
        } else {
            objectid::EXTENT_TREE
        };
        // Quota groups count tree blocks per subvolume: we do not keep them up to date.
        match load_root(fs, objectid::QUOTA_TREE) {
            Err(Error::NotFound) => {}
            Ok(_) => {
                return Err(Error::Unsupported(
                    "writing to filesystems with quotas enabled is not supported yet".into(),
                ))
            }
            Err(e) => return Err(e),
        }
        let block_groups = match fs.block_groups.take() {
            Some(groups) => groups,
            None => {
                let (items_root, _) = load_root(fs, bg_items_tree)?;
                let (fst_root, _) = load_root(fs, objectid::FREE_SPACE_TREE)?;
                BlockGroups::load(
                    &*fs.io,
                    &fs.io.chunks(),
                    &items_root,
                    &fst_root,
                    u64::from(fs.sb.sectorsize),
                    fs.pipe.pins(),
                )?
            }
        };
        let nodesize = fs.sb.nodesize;
        // What the commit's bookkeeping may have to copy, at most (`reservation`).
        let mut bookkeeping_blocks = 0;
        for tree in [
            objectid::EXTENT_TREE,
            objectid::FREE_SPACE_TREE,
            bg_items_tree,
        ] {
            if let Some((_, ri)) = fs.read_root_item(tree)? {
                bookkeeping_blocks += ri.bytes_used / u64::from(nodesize);
            }
        }
        // New blocks carry the chunk tree uuid every existing header has.
        let chunk_tree_uuid = {
            let rt = fs.root_tree;
            let b = fs
                .io
                .read_tree_block(rt.bytenr, Some(rt.level), Some(rt.generation), None)?;
            TreeBlock::new(&b)
                .and_then(|tb| tb.header())
                .map_err(|e| Error::corrupt(rt.bytenr, e.to_string()))?
                .chunk_tree_uuid
        };
        Ok(TxnState {
            transid,
            nodesize,
            chunk_tree_uuid,
            dirty: BTreeMap::new(),
            roots: BTreeMap::new(),
            recorded: BTreeMap::new(),
            block_groups,
            refs: DelayedRefs::default(),
            used_delta: BTreeMap::new(),
            bg_items_tree,
            new_chunks: Default::default(),
            poisoned: None,
            changes: 0,
            shared_cow: Default::default(),
            last_snapshots: BTreeMap::new(),
            log: Default::default(),
            delayed: Default::default(),
            inodes_changed: Default::default(),
            new_label: None,
            fresh_data: Default::default(),
            bookkeeping_blocks,
            data_budget: None,
            incompat_needed: 0,
        })
    }
}

impl<'a> Transaction<'a> {
    fn start(fs: &'a mut FsCore) -> Result<Transaction<'a>> {
        Self::join(CoreRef::Borrowed(fs))
    }

    pub(crate) fn start_locked(
        fs: parking_lot::RwLockWriteGuard<'a, FsCore>,
    ) -> Result<Transaction<'a>> {
        Self::join(CoreRef::Locked(fs))
    }

    fn join(mut fs: CoreRef<'a>) -> Result<Transaction<'a>> {
        if let Some(why) = fs.pipe.failure() {
            // A commit failed while this transaction ran on top of it: both are lost.
            if fs.aborted.is_none() {
                fs.aborted = Some(why);
                fs.drop_running();
            }
        }
        if let Some(why) = &fs.aborted {
            return Err(Error::Aborted(why.clone()));
        }
        if fs.running.is_none() {
            let st = TxnState::new(&mut fs)?;
            fs.running = Some(Box::new(st));
        } else if fs.log_in_memory {
            // The log replayed in memory on a read-only open: never changed or committed.
            return Err(Error::ReadOnly);
        }
        Ok(Transaction { fs })
    }

    /// The transaction id (generation) this transaction will commit as: what the blocks
    /// and items it writes record as their generation.
    pub fn generation(&self) -> u64 {
        self.transid
    }

    /// The filesystem; its reads see this transaction's changes.
    pub(crate) fn filesystem(&self) -> &FsCore {
        &self.fs
    }

    /// The current root of tree `tree` (as changed in this transaction).
    pub(crate) fn root(&mut self, tree: u64) -> Result<TreeRoot> {
        if let Some(r) = self.roots.get(&tree) {
            return Ok(*r);
        }
        let (root, key) = load_root(&self.fs, tree)?;
        self.roots.insert(tree, root);
        self.recorded.insert(tree, (root, key));
        Ok(root)
    }

    /// Takes a tree made in this transaction (a new subvolume or snapshot) whose ROOT_ITEM,
    /// at `key`, records `root`. With `counted`, that item's bytes_used already counts the
    /// root block (a snapshot's is its source's), so allocating it changes nothing there.
    pub(crate) fn add_root(&mut self, root: TreeRoot, key: Key, counted: bool) {
        self.roots.insert(root.id, root);
        self.recorded.insert(root.id, (root, key));
        if counted {
            self.used_delta.remove(&root.id);
        }
    }

    /// Forgets tree `tree` (a dropped subvolume whose ROOT_ITEM is gone): the commit must
    /// not look for its item.
    pub(crate) fn forget_root(&mut self, tree: u64) {
        self.roots.remove(&tree);
        self.recorded.remove(&tree);
        self.used_delta.remove(&tree);
        self.last_snapshots.remove(&tree);
    }

    /// Copies tree `tree`'s root block into this transaction (if it is not already) and
    /// returns the root.
    pub(crate) fn cow_tree_root(&mut self, tree: u64) -> Result<TreeRoot> {
        self.with_root(tree, ctree::cow_root)?;
        self.root(tree)
    }

    /// Records that subvolume `tree` was snapshotted in this transaction: from now on its
    /// blocks written up to now may be shared (see `backref`).
    pub(crate) fn note_snapshot_of(&mut self, tree: u64) {
        let transid = self.transid;
        self.last_snapshots.insert(tree, transid);
    }

    fn usable(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(Error::Unsupported(format!(
                "the transaction failed earlier ({why}); it cannot continue"
            ))),
            None => Ok(()),
        }
    }

    /// Runs a write-side B-tree operation on tree `tree`, keeping its moved root.
    fn with_root<R>(
        &mut self,
        tree: u64,
        f: impl FnOnce(&mut Self, &mut TreeRoot) -> Result<R>,
    ) -> Result<R> {
        self.usable()?;
        let mut root = self.root(tree)?;
        let r = f(self, &mut root);
        self.roots.insert(tree, root);
        if r.is_ok() {
            self.changes += 1;
        }
        match r {
            // A missing or taken key leaves the tree consistent (at most its path copied).
            Err(e) if !matches!(e, Error::NotFound | Error::AlreadyExists) => {
                self.poisoned = Some(e.to_string());
                Err(e)
            }
            r => r,
        }
    }

    /// Inserts an item with body `data` into tree `tree` (a tree id: FS_TREE, a
    /// subvolume, the extent tree, ...). `Error::AlreadyExists` if the key is taken.
    pub fn insert_item(&mut self, tree: u64, key: Key, data: &[u8]) -> Result<()> {
        self.note_insert(tree, &key, data);
        self.with_root(tree, |s, r| ctree::insert_item(s, r, key, data))
    }

    /// Inserts items with strictly increasing keys.
    pub(crate) fn insert_items(&mut self, tree: u64, items: &[(Key, &[u8])]) -> Result<()> {
        for (k, d) in items {
            self.note_insert(tree, k, d);
        }
        self.with_root(tree, |s, r| ctree::insert_items(s, r, items))
    }

    /// Deletes every item with `min <= key <= max`; returns how many.
    pub(crate) fn delete_items_in_range(&mut self, tree: u64, min: Key, max: Key) -> Result<usize> {
        if crate::transaction::changes::is_subvolume(tree) {
            self.log.note_range(tree, &min, &max);
        }
        self.with_root(tree, |s, r| ctree::delete_range(s, r, min, max))
    }

    /// Deletes the item with this key from tree `tree`. `Error::NotFound` if there is none.
    pub fn delete_item(&mut self, tree: u64, key: &Key) -> Result<()> {
        self.note_removal(tree, key, None)?;
        self.with_root(tree, |s, r| ctree::delete_item(s, r, key))
    }

    /// `insert_items` without telling the log: delayed items, noted when queued.
    pub(crate) fn tree_insert_items(&mut self, tree: u64, items: &[(Key, &[u8])]) -> Result<()> {
        self.with_root(tree, |s, r| ctree::insert_items(s, r, items))
    }

    /// `delete_item` without telling the log (see `tree_insert_items`).
    pub(crate) fn tree_delete_item(&mut self, tree: u64, key: &Key) -> Result<()> {
        self.with_root(tree, |s, r| ctree::delete_item(s, r, key))
    }

    /// `update_item` without telling the log (see `tree_insert_items`).
    pub(crate) fn tree_update_item(
        &mut self,
        tree: u64,
        key: &Key,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        self.with_root(tree, |s, r| ctree::update_item(s, r, key, f))
    }

    /// Counts a change held outside the trees (a delayed item): an operation failing after
    /// it aborts the transaction, as after a tree change.
    pub(crate) fn count_change(&mut self) {
        self.changes += 1;
    }

    /// Tells the log about an item going in (see `tree_log::changes`).
    fn note_insert(&mut self, tree: u64, key: &Key, body: &[u8]) {
        if !crate::transaction::changes::is_subvolume(tree) {
            return;
        }
        match key.item_type {
            item::EXTENT_DATA => {
                let range = crate::transaction::changes::extent_range(key, body);
                self.log.note(tree, key, &[range]);
            }
            item::DIR_INDEX => self.log.note(tree, key, &[index_range(key)]),
            _ => self.log.note(tree, key, &[]),
        }
    }

    /// Tells the log about an item changing or going away (and the key it gets instead):
    /// for file extents, the range the old item covered.
    fn note_removal(&mut self, tree: u64, key: &Key, new_key: Option<&Key>) -> Result<()> {
        if !crate::transaction::changes::is_subvolume(tree) {
            return Ok(());
        }
        let mut ranges = Vec::new();
        if key.item_type == item::EXTENT_DATA {
            match self.lookup(tree, key)? {
                Some(body) => {
                    let (a, b) = crate::transaction::changes::extent_range(key, &body);
                    ranges.push((a, b));
                    if let Some(n) = new_key {
                        ranges.push((n.offset, n.offset.saturating_add(b - a)));
                    }
                }
                None => ranges.push((key.offset, u64::MAX)),
            }
        }
        if key.item_type == item::DIR_INDEX {
            // The directory's fsync must know where the entry led.
            let body = self.lookup(tree, key)?.unwrap_or_default();
            let mut any = false;
            for e in oleo_format::items::DirEntryIter::new(&body) {
                let target = e
                    .ok()
                    .filter(|e| e.location.item_type == item::INODE_ITEM)
                    .map(|e| e.location.objectid);
                self.log.note_unlinked(tree, key.objectid, target);
                any = true;
            }
            if !any {
                self.log.note_unlinked(tree, key.objectid, None);
            }
            ranges.push(index_range(key));
            ranges.extend(new_key.map(index_range));
        }
        self.log.note(tree, key, &ranges);
        Ok(())
    }

    /// Changes the body of an existing item in place: `f` gets the body (its length
    /// fixed) and its result is returned. `Error::NotFound` if there is no such item.
    pub fn update_item<R>(
        &mut self,
        tree: u64,
        key: &Key,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        if key.item_type == item::DIR_INDEX {
            self.note_removal(tree, key, None)?;
        } else if crate::transaction::changes::is_subvolume(tree) {
            // The new body is not known here: a file extent may now reach anywhere after.
            let ranges = [(key.offset, u64::MAX)];
            self.log.note(tree, key, &ranges);
        }
        self.with_root(tree, |s, r| ctree::update_item(s, r, key, f))
    }

    /// Replaces the body of an existing item (growing or shrinking it as needed).
    pub(crate) fn replace_item(&mut self, tree: u64, key: &Key, body: &[u8]) -> Result<()> {
        let len = body.len();
        self.note_removal(tree, key, None)?;
        self.note_insert(tree, key, body);
        self.with_root(tree, |s, r| {
            ctree::resize_item(s, r, key, len)?;
            ctree::update_item(s, r, key, |b| b.copy_from_slice(body))
        })
    }

    /// Inserts the item, or replaces the body of the one with this key.
    pub(crate) fn put_item(&mut self, tree: u64, key: Key, body: &[u8]) -> Result<()> {
        match self.insert_item(tree, key, body) {
            Err(Error::AlreadyExists) => self.replace_item(tree, &key, body),
            r => r,
        }
    }

    /// Changes items of one leaf of tree `tree` in place, under one descent to `key`
    /// (`ctree::edit_leaf`). The caller tells the log what changed (`note_file_range`).
    pub(crate) fn edit_leaf<R>(
        &mut self,
        tree: u64,
        key: &Key,
        f: impl FnOnce(
            &mut oleo_format::tree_mut::LeafMut<'_>,
            usize,
            bool,
        ) -> std::result::Result<R, oleo_format::FormatError>,
    ) -> Result<R> {
        self.with_root(tree, |s, r| ctree::edit_leaf(s, r, key, f))
    }

    /// Tells the log that the file extent items of inode `ino` in subvolume `tree` over
    /// `[start, end)` changed (an in-place edit that neither `insert_item` nor
    /// `delete_item` saw).
    pub(crate) fn note_file_range(&mut self, tree: u64, ino: u64, start: u64, end: u64) {
        if crate::transaction::changes::is_subvolume(tree) {
            let key = Key::new(ino, item::EXTENT_DATA, start);
            self.log.note(tree, &key, &[(start, end)]);
        }
    }

    /// Changes an item's key in place; `new_key` must sort between its neighbours.
    pub(crate) fn set_item_key(&mut self, tree: u64, key: &Key, new_key: Key) -> Result<()> {
        self.note_removal(tree, key, Some(&new_key))?;
        self.log.note(tree, &new_key, &[]);
        self.with_root(tree, |s, r| ctree::set_item_key(s, r, key, new_key))
    }

    /// The last item with `key`'s objectid and type and a key <= `key`.
    pub(crate) fn lookup_le(&mut self, tree: u64, key: &Key) -> Result<Option<(Key, Vec<u8>)>> {
        let root = self.root(tree)?;
        ctree::lookup_le(&*self, &root, key)
    }

    /// The item with this key as this transaction sees it.
    pub fn lookup(&mut self, tree: u64, key: &Key) -> Result<Option<Vec<u8>>> {
        let root = self.root(tree)?;
        ctree::lookup(&*self, &root, key)
    }

    /// Calls `f` for every item with `min <= key <= max`, as this transaction sees them.
    pub fn for_each_in_range(
        &mut self,
        tree: u64,
        min: Key,
        max: Key,
        f: impl FnMut(Key, &[u8]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let root = self.root(tree)?;
        ctree::for_each_in_range(&*self, &root, min, max, f)
    }

    /// Writes changed roots into their ROOT_ITEMs. True if any changed.
    fn update_root_items(&mut self) -> Result<bool> {
        let todo: Vec<(u64, TreeRoot, Key, i64)> = self
            .roots
            .iter()
            .filter(|(&id, _)| id != objectid::ROOT_TREE && id != objectid::CHUNK_TREE)
            .filter_map(|(&id, r)| {
                let delta = self.used_delta.get(&id).copied().unwrap_or(0);
                match self.recorded.get(&id) {
                    Some((rec, key)) if rec != r || delta != 0 => Some((id, *r, *key, delta)),
                    _ => None,
                }
            })
            .collect();
        let now = now();
        for &(id, r, key, delta) in &todo {
            let subvolume =
                crate::transaction::changes::is_subvolume(id) && self.inodes_changed.contains(&id);
            let transid = self.transid;
            let ok = self
                .update_item(objectid::ROOT_TREE, &key, |b| {
                    // Legacy 239-byte items would have to grow: not done in place.
                    if b.len() < ROOT_ITEM_SIZE {
                        return Ok(false);
                    }
                    // Parsing drops fields past the legacy size when generation_v2 differs
                    // (an old kernel wrote them), as the kernel does when it reads such an item.
                    let mut ri = RootItem::parse(b)?;
                    ri.generation = r.generation;
                    ri.generation_v2 = r.generation;
                    ri.bytenr = r.bytenr;
                    ri.level = r.level;
                    ri.bytes_used = ri.bytes_used.saturating_add_signed(delta);
                    // An inode of this subvolume changed in this transaction.
                    if subvolume {
                        ri.ctransid = transid;
                        ri.ctime = Timespec {
                            sec: now.0 as i64,
                            nsec: now.1,
                        };
                    }
                    b[..ROOT_ITEM_SIZE].copy_from_slice(&ri.to_bytes());
                    Ok(true)
                })?
                .map_err(|e: oleo_format::FormatError| {
                    Error::corrupt(0, format!("root item of tree {id}: {e}"))
                })?;
            if !ok {
                return Err(Error::Unsupported(format!(
                    "tree {id} has a legacy 239-byte ROOT_ITEM; rewriting it is not supported"
                )));
            }
            self.recorded.insert(id, (r, key));
            self.used_delta.remove(&id);
        }
        Ok(!todo.is_empty())
    }

    /// Commits: bookkeeping to a fixpoint, blocks to disk, flush, superblocks, flush.
    /// Returns the new generation. On error before the superblock write the disk still
    /// shows the previous generation.
    pub(crate) fn commit(self) -> Result<u64> {
        self.close()?.write()
    }

    /// Closes the transaction (bookkeeping to a fixpoint, blocks checksummed, the next
    /// transaction may start) and returns the writing still to do, which needs no lock.
    pub(crate) fn close(mut self) -> Result<CommitIo> {
        match self.try_close() {
            Ok(io) => Ok(io),
            Err(e) => {
                // The disk is intact, but the in-memory state can no longer be trusted.
                self.abort(&format!("commit failed: {e}"));
                Err(e)
            }
        }
    }

    fn try_close(&mut self) -> Result<CommitIo> {
        self.usable()?;
        let started = std::time::Instant::now();
        let (dirty, available) = (self.dirty.len(), self.block_groups.available(bg::METADATA));
        match self.settle_bookkeeping() {
            Err(Error::NoSpace) => {
                // The reservations promised room for this: say by how much they missed.
                log::error!(
                    "commit {} ran out of metadata space: {dirty} blocks changed, {} KiB were \
                     available for {} bookkeeping blocks, {} changed now",
                    self.transid,
                    available / 1024,
                    self.bookkeeping_blocks,
                    self.dirty.len()
                );
                return Err(Error::NoSpace);
            }
            r => r?,
        }
        let root_tree = self.root(objectid::ROOT_TREE)?;
        if root_tree.generation != self.transid {
            return Err(Error::corrupt(
                root_tree.bytenr,
                "the root tree was not copied in this commit",
            ));
        }
        let sb = self.new_superblock(root_tree)?;
        let blocks = self.finish_blocks()?;
        log::debug!(
            "commit {}: {dirty} blocks changed by operations, {} to write, closed in {:?}",
            self.transid,
            blocks.len(),
            started.elapsed()
        );
        // Readers and the next transaction see these blocks from memory until written.
        self.fs.io.add_inflight(&blocks);
        let transid = self.transid;
        self.fs.committed(sb.clone(), root_tree)?;
        Ok(CommitIo::new(
            transid,
            blocks,
            sb,
            std::sync::Arc::clone(&self.fs.io),
            std::sync::Arc::clone(&self.fs.pipe),
        ))
    }

    /// Delayed items into their trees, then the commit's bookkeeping to a fixpoint.
    fn settle_bookkeeping(&mut self) -> Result<()> {
        self.run_delayed_items()?;
        self.write_dev_stats()?;
        // The root tree is copied in every commit: its root carries the new generation.
        let (_, ext_key) = self.recorded_key(objectid::EXTENT_TREE)?;
        self.update_item(objectid::ROOT_TREE, &ext_key, |_| ())?;
        let mut settled = false;
        for _ in 0..MAX_COMMIT_ROUNDS + self.bookkeeping_blocks {
            let mut changed = extent_tree::run_delayed_refs(self)?;
            let bg_tree = self.bg_items_tree;
            changed |= block_group::sync(self, bg_tree)?;
            changed |= free_space::sync(self)?;
            changed |= self.update_root_items()?;
            if !changed && self.refs.is_empty() {
                settled = true;
                break;
            }
        }
        if !settled {
            return Err(Error::Unsupported(
                "commit bookkeeping did not reach a fixpoint".into(),
            ));
        }
        Ok(())
    }

    /// The devices' error counters into their DEV_STATS items, when they changed (the
    /// kernel's btrfs_run_dev_stats).
    pub(crate) fn write_dev_stats(&mut self) -> Result<()> {
        let Some(stats) = self.fs.io.devices().take_dirty_stats() else {
            return Ok(());
        };
        for (devid, v) in stats {
            let mut body = Vec::with_capacity(40);
            for x in v {
                body.extend_from_slice(&x.to_le_bytes());
            }
            let key = Key::new(objectid::DEV_STATS, item::PERSISTENT_ITEM, devid);
            if self.lookup(objectid::DEV_TREE, &key)?.is_some() {
                self.delete_item(objectid::DEV_TREE, &key)?;
            }
            self.insert_item(objectid::DEV_TREE, key, &body)?;
        }
        Ok(())
    }

    pub(crate) fn recorded_key(&mut self, tree: u64) -> Result<(TreeRoot, Key)> {
        self.root(tree)?;
        self.recorded
            .get(&tree)
            .copied()
            .ok_or_else(|| Error::corrupt(0, format!("tree {tree} has no recorded root")))
    }

    /// Checksums every dirty block; they leave the transaction as shared blocks.
    fn finish_blocks(&mut self) -> Result<Vec<(u64, Block)>> {
        let csum = self.fs.sb.csum_type();
        let st = self.fs.running.as_deref_mut().ok_or(Error::NotFound)?;
        let mut out = Vec::with_capacity(st.dirty.len());
        for (bytenr, mut block) in std::mem::take(&mut st.dirty) {
            finalize_block(std::sync::Arc::make_mut(&mut block), csum)?;
            out.push((bytenr, block));
        }
        Ok(out)
    }

    /// Throws the running transaction away after a failure left its trees inconsistent.
    /// The disk still holds the last commit; changes since are lost, so the filesystem
    /// refuses further writes (as the kernel turns read-only after an abort).
    pub(crate) fn abort(mut self, why: &str) {
        log::error!(
            "transaction {} aborted: {why}; changes since generation {} are lost and the filesystem is now read-only",
            self.transid,
            self.fs.sb.generation
        );
        self.fs.aborted = Some(why.to_string());
        self.fs.drop_running();
    }

    /// ROOT_ITEM.last_snapshot of subvolume tree `tree`.
    pub(crate) fn last_snapshot(&mut self, tree: u64) -> Result<u64> {
        if let Some(&v) = self.last_snapshots.get(&tree) {
            return Ok(v);
        }
        let (_, key) = self.recorded_key(tree)?;
        let body = self
            .lookup(objectid::ROOT_TREE, &key)?
            .ok_or_else(|| Error::corrupt(0, format!("tree {tree} has no ROOT_ITEM")))?;
        let ri = RootItem::parse(&body)
            .map_err(|e| Error::corrupt(0, format!("root item of tree {tree}: {e}")))?;
        self.last_snapshots.insert(tree, ri.last_snapshot);
        Ok(ri.last_snapshot)
    }

    /// Tree changes made so far in this transaction.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Memory held by dirty tree blocks.
    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.dirty.len() as u64 * u64::from(self.nodesize)
    }

    /// The failure that poisoned this transaction, if any: a tree edit that failed
    /// half-way (other than on a missing or taken key) leaves its trees inconsistent, so
    /// every later edit is refused (`Error::Unsupported`) and its commit fails and aborts
    /// it.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    fn new_superblock(&mut self, root_tree: TreeRoot) -> Result<superblock::Superblock> {
        let old = &self.fs.sb;
        let mut sb = old.clone();
        sb.generation = self.transid;
        sb.root = root_tree.bytenr;
        sb.root_level = root_tree.level;
        if let Some(chunk) = self.roots.get(&objectid::CHUNK_TREE) {
            if chunk.bytenr != old.chunk_root {
                sb.chunk_root = chunk.bytenr;
                sb.chunk_root_level = chunk.level;
                sb.chunk_root_generation = chunk.generation;
            }
        }
        sb.incompat_flags |= self.incompat_needed;
        if let Some(label) = &self.new_label {
            sb.label.clone_from(label);
        }
        let used = old.bytes_used as i128 + self.block_groups.used_delta;
        sb.bytes_used = u64::try_from(used)
            .map_err(|_| Error::corrupt(0, "superblock bytes_used would go negative"))?;
        crate::transaction::space::chunk_alloc::apply_to_superblock(
            &self.new_chunks,
            &mut sb,
            self.filesystem().io.devices(),
        )?;
        // The kernel keeps uuid_tree_generation at the committed generation once the uuid
        // tree is known good (it rescans the tree at mount otherwise).
        if old.uuid_tree_generation == old.generation {
            sb.uuid_tree_generation = self.transid;
        }
        let backup = self.backup_root(&sb)?;
        sb.backup_roots
            .resize(superblock::NUM_BACKUP_ROOTS, BackupRoot::default());
        let newest = sb
            .backup_roots
            .iter()
            .enumerate()
            .max_by_key(|(_, b)| b.tree_root_gen)
            .map(|(i, _)| i)
            .unwrap_or(superblock::NUM_BACKUP_ROOTS - 1);
        let slot = (newest + 1) % superblock::NUM_BACKUP_ROOTS;
        sb.backup_roots[slot] = backup;
        Ok(sb)
    }

    /// The backup root record of this commit (the ring slot after the newest).
    fn backup_root(&mut self, sb: &superblock::Superblock) -> Result<BackupRoot> {
        let mut get = |id: u64| -> Result<TreeRoot> {
            match self.root(id) {
                Ok(r) => Ok(r),
                Err(Error::NotFound) => Ok(TreeRoot {
                    id,
                    bytenr: 0,
                    level: 0,
                    generation: 0,
                }),
                Err(e) => Err(e),
            }
        };
        let extent = get(objectid::EXTENT_TREE)?;
        let fs_root = get(objectid::FS_TREE)?;
        let dev = get(objectid::DEV_TREE)?;
        let csum = get(objectid::CSUM_TREE)?;
        Ok(BackupRoot {
            tree_root: sb.root,
            tree_root_gen: sb.generation,
            chunk_root: sb.chunk_root,
            chunk_root_gen: sb.chunk_root_generation,
            extent_root: extent.bytenr,
            extent_root_gen: extent.generation,
            fs_root: fs_root.bytenr,
            fs_root_gen: fs_root.generation,
            dev_root: dev.bytenr,
            dev_root_gen: dev.generation,
            csum_root: csum.bytenr,
            csum_root_gen: csum.generation,
            total_bytes: sb.total_bytes,
            bytes_used: sb.bytes_used,
            num_devices: sb.num_devices,
            tree_root_level: sb.root_level,
            chunk_root_level: sb.chunk_root_level,
            extent_root_level: extent.level,
            fs_root_level: fs_root.level,
            dev_root_level: dev.level,
            csum_root_level: csum.level,
        })
    }
}

/// Writes the superblock to every copy that fits on each device, each with its own bytenr
/// and its device's DEV_ITEM.
pub(crate) fn write_superblocks(
    io: &crate::io::disk_io::DiskIo,
    sb: &superblock::Superblock,
) -> Result<()> {
    io.devices().write_superblocks(sb, false)
}

/// The committed root of tree `tree` and the key of the item recording it (the superblock
/// records the root and chunk trees: their key is a placeholder).
fn load_root(fs: &FsCore, tree: u64) -> Result<(TreeRoot, Key)> {
    match tree {
        objectid::ROOT_TREE => Ok((fs.root_tree, Key::MIN)),
        objectid::CHUNK_TREE => Ok((
            TreeRoot {
                id: tree,
                bytenr: fs.sb.chunk_root,
                level: fs.sb.chunk_root_level,
                generation: fs.sb.chunk_root_generation,
            },
            Key::MIN,
        )),
        _ => {
            let mut found = None;
            ctree::for_each_in_range(
                &*fs.io,
                &fs.root_tree,
                Key::new(tree, item::ROOT_ITEM, 0),
                Key::new(tree, item::ROOT_ITEM, u64::MAX),
                |key, data| {
                    let ri = oleo_format::items::RootItem::parse(data)
                        .map_err(|e| Error::corrupt(0, format!("root item {key:?}: {e}")))?;
                    found = Some((
                        TreeRoot {
                            id: tree,
                            bytenr: ri.bytenr,
                            level: ri.level,
                            generation: ri.generation,
                        },
                        key,
                    ));
                    Ok(ControlFlow::Break(()))
                },
            )?;
            found.ok_or(Error::NotFound)
        }
    }
}

/// What the pointer to a dirty block promises must hold (it is not checksummed yet).
pub(crate) fn check_promises(
    block: &[u8],
    bytenr: u64,
    level: Option<u8>,
    generation: Option<u64>,
    first_key: Option<Key>,
) -> Result<()> {
    let tb = TreeBlock::new(block).map_err(|e| Error::corrupt(bytenr, e.to_string()))?;
    let first_ok = match first_key {
        Some(k) => tb.nritems() == 0 || tb.key_at(0).ok() == Some(k),
        None => true,
    };
    if tb.bytenr() != bytenr
        || level.is_some_and(|l| l != tb.level())
        || generation.is_some_and(|g| g != tb.generation())
        || !first_ok
    {
        return Err(Error::corrupt(
            bytenr,
            "dirty block differs from the pointer to it",
        ));
    }
    Ok(())
}

impl BlockSource for Transaction<'_> {
    fn read_tree_block(
        &self,
        bytenr: u64,
        level: Option<u8>,
        generation: Option<u64>,
        first_key: Option<Key>,
    ) -> Result<Block> {
        if let Some(block) = self.dirty.get(&bytenr) {
            check_promises(block, bytenr, level, generation, first_key)?;
            return Ok(block.clone());
        }
        self.fs
            .io
            .read_tree_block(bytenr, level, generation, first_key)
    }
}

impl BlockStore for Transaction<'_> {
    fn nodesize(&self) -> u32 {
        self.nodesize
    }

    fn transid(&self) -> u64 {
        self.transid
    }

    fn fsid(&self) -> [u8; 16] {
        self.fs.sb.metadata_fsid()
    }

    fn chunk_tree_uuid(&self) -> [u8; 16] {
        self.chunk_tree_uuid
    }

    fn alloc(&mut self, owner: u64, level: u8, _hint: u64) -> Result<u64> {
        let kind = if owner == objectid::CHUNK_TREE {
            bg::SYSTEM
        } else {
            bg::METADATA
        };
        let st = &mut **self;
        let size = u64::from(st.nodesize);
        let bytenr = st.block_groups.alloc(kind, size)?;
        st.refs.add_tree_block(bytenr, owner, level)?;
        *st.used_delta.entry(owner).or_default() += size as i64;
        Ok(bytenr)
    }

    fn free(&mut self, bytenr: u64, tree: u64, level: u8) -> Result<()> {
        if self.shared_cow.remove(&bytenr) {
            // Other trees still reach it: only this tree's reference goes.
            let size = i64::from(self.nodesize);
            *self.used_delta.entry(tree).or_default() -= size;
            let before = self.changes;
            let r = self.drop_shared_block(bytenr, level, tree);
            // Part of copying the block (see `on_cow`).
            self.changes = before;
            return r;
        }
        let st = &mut **self;
        let size = u64::from(st.nodesize);
        let born_here = st.dirty.remove(&bytenr).is_some();
        *st.used_delta.entry(tree).or_default() -= size as i64;
        let unrecorded = st.refs.drop_tree_block(bytenr, level)?;
        if born_here && unrecorded {
            // Allocated in T and never written, nothing on disk refers to it: free for
            // reuse at once (as the kernel's btrfs_free_tree_block), so that splits and
            // merges churning through a big transaction do not pin the space it needs.
            st.block_groups.free_unpinned(bytenr, size)
        } else {
            st.block_groups.free(bytenr, size)
        }
    }

    fn on_cow(&mut self, tree: u64, old: &[u8], _new_bytenr: u64) -> Result<()> {
        let bytenr = TreeBlock::new(old)
            .map_err(|e| Error::corrupt(0, e.to_string()))?
            .bytenr();
        // Copying a block others share moves references in the extent tree, complete and
        // consistent: not a change of the operation's own, which must not make an
        // operation refused afterwards (a name taken) look half-done and abort.
        let before = self.changes;
        let moved = self.update_ref_for_cow(tree, old);
        self.changes = before;
        match moved {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.shared_cow.insert(bytenr);
                Ok(())
            }
            Err(e) => {
                self.poisoned = Some(e.to_string());
                Err(e)
            }
        }
    }

    fn dirty_mut(&mut self, bytenr: u64) -> Option<&mut [u8]> {
        self.dirty.get_mut(&bytenr).map(std::sync::Arc::make_mut)
    }

    fn insert_dirty(&mut self, bytenr: u64, block: Vec<u8>) -> Result<()> {
        if block.len() != self.nodesize as usize {
            return Err(Error::corrupt(
                bytenr,
                "dirty block size differs from nodesize",
            ));
        }
        self.dirty.insert(bytenr, block.into());
        Ok(())
    }
}

impl TxnState {
    /// True if T changed nothing yet (operations that failed before changing anything,
    /// fsyncs of clean files): committing it would only write a new root tree and the
    /// superblocks, two flushes for nothing.
    pub(crate) fn is_idle(&self) -> bool {
        self.changes == 0
            && self.dirty.is_empty()
            && self.refs.is_empty()
            && self.delayed.is_empty()
            && self.log.blocks.count() == 0
            && self.new_chunks.is_empty()
            && self.new_label.is_none()
    }
}

impl FsCore {
    /// Commits the running transaction, if any: everything before is durable after.
    /// Returns the generation on disk.
    pub(crate) fn sync(&mut self) -> Result<u64> {
        match self.close_running()? {
            Some(io) => io.write(),
            None => self.pipe.wait_durable(self.sb.generation),
        }
    }

    /// Rewrites the bad copies of tree blocks that reads found (the kernel's read repair of
    /// metadata), under the exclusive lock: a block the extent tree still has as allocated,
    /// at the generation read, and not copied in the running transaction cannot be freed
    /// or reused while this runs, so the bytes written are still the block's.
    pub(crate) fn repair_tree_blocks(&mut self) {
        let todo = self.io.take_repairs();
        for (bytenr, mirror, block) in todo {
            let Ok(tb) = oleo_format::TreeBlock::new(&block) else {
                continue;
            };
            let generation = tb.generation();
            let dirty = self
                .running
                .as_ref()
                .is_some_and(|t| t.dirty.contains_key(&bytenr));
            let root = self.read_root_item(objectid::EXTENT_TREE).ok().flatten();
            let mut allocated = false;
            if let Some((root, _)) = root {
                let _ = ctree::for_each_in_range(
                    &*self,
                    &root,
                    Key::new(bytenr, item::EXTENT_ITEM, 0),
                    Key::new(bytenr, item::METADATA_ITEM, u64::MAX),
                    |k, v| {
                        let skinny = k.item_type == item::METADATA_ITEM;
                        allocated = oleo_format::items::ExtentItem::parse(v, skinny)
                            .is_ok_and(|e| e.generation == generation);
                        Ok(std::ops::ControlFlow::Break(()))
                    },
                );
            }
            if dirty || !allocated {
                continue;
            }
            match self.io.repair_copy(bytenr, &block, mirror) {
                Ok(()) => log::warn!("repaired tree block {bytenr} copy {mirror} from a good copy"),
                Err(e) => log::error!("could not repair tree block {bytenr} copy {mirror}: {e}"),
            }
        }
    }

    /// Closes the running transaction, if any, leaving its writing to the caller (which
    /// need not hold the filesystem: see `Filesystem::sync`).
    pub(crate) fn close_running(
        &mut self,
    ) -> Result<Option<crate::transaction::commit_pipe::CommitIo>> {
        if let Some(why) = &self.aborted {
            // What the aborted transaction held is lost: a sync must not say otherwise.
            return Err(Error::Aborted(why.clone()));
        }
        self.repair_tree_blocks();
        if self.running.is_none() || self.log_in_memory {
            return Ok(None);
        }
        if let Some(st) = self.running.take_if(|st| st.is_idle()) {
            // Nothing to commit (seed 003: no flush that is not needed).
            self.block_groups = Some(st.block_groups);
            return Ok(None);
        }
        self.start_transaction()?.close().map(Some)
    }
}

/// The DIR_INDEX number a change of the item at `key` touches, as a range.
fn index_range(key: &Key) -> (u64, u64) {
    (key.offset, key.offset.saturating_add(1))
}
