//! fsync's logging step (the kernel's btrfs_log_inode): copies what changed of one file
//! since it was last logged into its subvolume's log tree, in the running transaction.
//!
//! Logged, as the kernel's replay expects it (../shared/docs/btrfs-format.md 12.3):
//! - the inode item, with nbytes 0 (the replay counts it);
//! - every xattr (a replay deletes those of a logged inode that its log lacks);
//! - the file extent items over every range changed since the last logging, widened to
//!   whole items of the log and of the file, with explicit holes for the gaps below EOF,
//!   and everything past EOF (a replay cuts the file there, preallocated tails included)
//!   or past the EOF of its last logging (a later replay no longer cuts there);
//! - checksums of the extents written in this transaction;
//! - for a file created in this transaction, its names (the replay makes the entries), and
//!   each new directory above it that the log lacks, only so that it exists (its names and
//!   xattrs, not its entries: the kernel's log_all_new_ancestors); for an older file that
//!   was renamed, linked or unlinked in it, the entries of every directory where its names
//!   changed (`log_dir`).
//!
//! An inode renamed, linked or unlinked after it was logged is logged again before the log
//! is synced next (`settle`: replaying its old names could undo a rename over it; the
//! kernel edits its log at the rename instead), or taken out of the log with the
//! directories it left logged if it is gone.
//!
//! Directories go to `log_dir`. fsync commits the transaction instead where this log
//! cannot describe the change: symlinks and special files; INODE_EXTREFs that changed; a
//! log past `LOG_BLOCKS_MAX` blocks or without metadata space. (Without NO_HOLES the file's
//! own hole items are copied like any other extent.)

use crate::ctree::{self, BlockSource, BlockStore, TreeRoot};
use crate::error::{Error, Result};
use crate::transaction::changes::{add_range, missing_from};
use crate::transaction::fs::{FileKind, InodeId};
use crate::transaction::log_store::LogStore;
use crate::transaction::log_sync::{Gathered, LogBatch};
use crate::transaction::Transaction;
use oleo_format::items::{Compression, FileExtent, FileExtentBody, InodeItem, RootItem};
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;

/// A log this large commits instead (the replay refuses logs past 8192 blocks).
pub(super) const LOG_BLOCKS_MAX: usize = 2048;

/// What an fsync does after logging.
pub(crate) enum FsyncPlan {
    /// Wait for commit `transid - 1`, then for log sync `seq` of `transid` if there is one
    /// (`LogSyncs::sync`).
    Log { transid: u64, seq: Option<u64> },
    /// Commit the transaction, for this reason.
    Commit(String),
}

impl crate::transaction::fs::FsCore {
    /// fsync's first half, under the lock: log `id` in the running transaction.
    pub(crate) fn plan_fsync(&mut self, id: InodeId) -> Result<FsyncPlan> {
        if self.running.is_none() || self.log_in_memory {
            // Nothing changed since the last commit closed.
            return Ok(FsyncPlan::Log {
                transid: self.sb.generation + 1,
                seq: None,
            });
        }
        self.start_transaction()?.log_inode(id)
    }

    /// A log sync's first step, under the lock: every log block of transaction `transid`
    /// changed since the last sync, and the superblock pointing at the log.
    pub(crate) fn gather_log(&mut self, transid: u64) -> Result<Gathered<LogBatch>> {
        if self.running.as_deref().map(|t| t.transid) != Some(transid) {
            return Ok(Gathered::Closed);
        }
        let mut txn = self.start_transaction()?;
        let seq = txn.filesystem().pipe.log.gather();
        txn.log_batch(seq)
            .map(|batch| Gathered::Batch { seq, batch })
    }
}

/// Items to copy into the log.
pub(super) type Items = Vec<(Key, Vec<u8>)>;

/// A file extent item with the end of the range it covers.
type Extent = (Key, Vec<u8>, u64);

impl Transaction<'_> {
    /// Logs what changed of `id` and queues the log sync; what the fsync does next.
    pub(crate) fn log_inode(&mut self, id: InodeId) -> Result<FsyncPlan> {
        let transid = self.transid;
        if let Some(why) = self.poisoned() {
            // The trees may be half changed: a commit refuses them, a log must too.
            return Ok(FsyncPlan::Commit(why.to_string()));
        }
        if let Some(why) = &self.log.full_commit {
            return Ok(FsyncPlan::Commit(why.clone()));
        }
        let seq = self.filesystem().pipe.log.next();
        match self.settle(seq) {
            Ok(None) => {}
            Ok(Some(why)) => return Ok(FsyncPlan::Commit(why)),
            Err(e) => {
                let why = format!("logging renamed inodes again failed: {e}");
                self.log.full_commit = Some(why.clone());
                return Ok(FsyncPlan::Commit(why));
            }
        }
        let (dirty, logged) = match self.log.inodes.get(&id) {
            Some(c) => (c.dirty, c.logged),
            None => (false, None),
        };
        if !dirty {
            return Ok(FsyncPlan::Log {
                transid,
                seq: logged,
            });
        }
        match self.copy_inode(id, seq) {
            Ok(None) => Ok(FsyncPlan::Log {
                transid,
                seq: Some(seq),
            }),
            Ok(Some(why)) => Ok(FsyncPlan::Commit(why)),
            Err(e) => {
                // The log trees may be half changed: none of this transaction's fsyncs
                // may use them any more.
                let why = format!("logging inode {} failed: {e}", id.ino);
                self.log.full_commit = Some(why.clone());
                Ok(FsyncPlan::Commit(why))
            }
        }
    }

    /// Copies the inode's changes into the log tree; why not, when the log cannot say it.
    fn copy_inode(&mut self, id: InodeId, seq: u64) -> Result<Option<String>> {
        let transid = self.transid;
        let sb = &self.filesystem().sb;
        let sector = u64::from(sb.sectorsize);
        let csum_size = sb.csum_type().size();
        if self.log.blocks.count() > LOG_BLOCKS_MAX {
            return Ok(Some("the log tree is large".into()));
        }
        let Some(mut inode) = self.find_inode(id)? else {
            return Ok(Some(format!("inode {} is gone", id.ino)));
        };
        if inode.nlink == 0 {
            return Ok(Some("the inode has no name".into()));
        }
        match FileKind::from_mode(inode.mode) {
            Some(FileKind::File) => {}
            Some(FileKind::Dir) => return self.log_dirs(id.subvol, &[id.ino], seq),
            _ => return Ok(Some("only regular files and directories are logged".into())),
        }
        let (names, extrefs, parents) = match self.log.inodes.get(&id) {
            Some(c) => (c.names, c.extrefs, c.parents.clone()),
            None => (false, false, Vec::new()),
        };
        let mut refs = Vec::new();
        // An older file's new and lost names go through the logs of the directories
        // where they changed, after its own items.
        let mut dirs = Vec::new();
        // New directories a replay must make for the file's names to have a place.
        let mut ancestors = Vec::new();
        if names && inode.generation == transid {
            match self.new_inode_refs(id, &inode, &[])? {
                Ok(r) => (refs, ancestors) = r,
                Err(why) => return Ok(Some(why)),
            }
            // A directory whose entries are in the log may still list a name it had
            // before.
            dirs = parents
                .into_iter()
                .filter(|&p| {
                    let p = InodeId {
                        subvol: id.subvol,
                        ino: p,
                    };
                    self.log
                        .inodes
                        .get(&p)
                        .is_some_and(|c| c.logged.is_some() && !c.exists_only)
                })
                .collect();
        } else if names {
            if extrefs {
                return Ok(Some("the file's extended references changed".into()));
            }
            dirs = parents;
        }
        let xattrs = self.items_of(id, item::XATTR_ITEM, item::XATTR_ITEM)?;

        // The ranges to log, widened until no item of the file or of the log crosses them.
        let eof = inode.size.next_multiple_of(sector);
        let mut ranges = self
            .log
            .inodes
            .get(&id)
            .map(|c| c.ranges.clone())
            .unwrap_or_default();
        let logged_eof = match self.log.inodes.get(&id) {
            Some(c) if c.logged.is_some() => c.logged_eof,
            _ => eof,
        };
        add_range(&mut ranges, eof.min(logged_eof), u64::MAX);
        let file_root = self.root(id.subvol)?;
        let log_root = self.log.trees.get(&id.subvol).copied();
        let mut plans: Vec<(u64, u64, Vec<Extent>)> = Vec::new();
        for (a, b) in ranges {
            // Whole sectors: a changed inline extent records its byte length, and a hole
            // item logged from such a range would fail the kernel's tree checker.
            let mut a = a - a % sector;
            let mut b = b.checked_next_multiple_of(sector).unwrap_or(u64::MAX);
            let mut rounds = 0;
            let current = loop {
                let current = extents_overlapping(&*self, &file_root, id.ino, a, b, sector)?;
                let logged = match &log_root {
                    Some(r) => extents_overlapping(&self.log.blocks, r, id.ino, a, b, sector)?,
                    None => Vec::new(),
                };
                let (na, nb) = current
                    .iter()
                    .chain(&logged)
                    .fold((a, b), |(x, y), (k, _, e)| (x.min(k.offset), y.max(*e)));
                if (na, nb) == (a, b) {
                    break current;
                }
                (a, b) = (na, nb);
                rounds += 1;
                if rounds > 64 {
                    return Ok(Some("the file's extents keep widening the range".into()));
                }
            };
            plans.push((a, b, current));
        }

        // Checksums of the data written in this transaction that the log lacks.
        let mut sums: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut csummed = self
            .log
            .csummed
            .get(&id.subvol)
            .cloned()
            .unwrap_or_default();
        for (_, _, current) in &plans {
            for (_, body, _) in current {
                let Some((s, e)) = new_data(body, transid) else {
                    continue;
                };
                for (ps, pe) in missing_from(&csummed, s, e) {
                    sums.extend(self.csums_in(ps, pe, sector, csum_size)?);
                    add_range(&mut csummed, ps, pe);
                }
            }
        }

        // Into the log tree, if the commit keeps the room it needs.
        let nodesize = self.filesystem().sb.nodesize;
        let bytes: usize = plans
            .iter()
            .flat_map(|(_, _, c)| c.iter().map(|(_, v, _)| v.len() + 25))
            .chain(sums.iter().map(|(_, v)| v.len() + 25))
            .chain(xattrs.iter().chain(&refs).map(|(_, v)| v.len() + 25))
            .sum();
        if !self.log_fits(4 * bytes as u64) {
            return Ok(Some("metadata space is low".into()));
        }
        let per_item = (nodesize as usize / 2 / csum_size).max(1);
        let (mut store, mut root) = self.open_log(id.subvol)?;
        put_inode(&mut store, &mut root, id.ino, &mut inode)?;
        if names {
            let (min, max) = type_range(id.ino, item::INODE_REF, item::INODE_EXTREF);
            ctree::delete_range(&mut store, &mut root, min, max)?;
            insert_all(&mut store, &mut root, &refs)?;
        }
        let (min, max) = type_range(id.ino, item::XATTR_ITEM, item::XATTR_ITEM);
        ctree::delete_range(&mut store, &mut root, min, max)?;
        insert_all(&mut store, &mut root, &xattrs)?;
        for (a, b, current) in &plans {
            let stale = extents_overlapping(&*store.blocks, &root, id.ino, *a, *b, sector)?;
            for (k, _, _) in stale {
                ctree::delete_item(&mut store, &mut root, &k)?;
            }
            let mut items: Vec<(Key, Vec<u8>)> =
                current.iter().map(|(k, v, _)| (*k, v.clone())).collect();
            items.extend(holes(id.ino, *a, (*b).min(eof), current, transid));
            items.sort_by_key(|(k, _)| *k);
            insert_all(&mut store, &mut root, &items)?;
        }
        for (start, bytes) in &sums {
            for (i, chunk) in bytes.chunks(per_item * csum_size).enumerate() {
                let at = start + (i * per_item) as u64 * sector;
                let key = Key::new(objectid::EXTENT_CSUM, item::EXTENT_CSUM, at);
                ctree::insert_item(&mut store, &mut root, key, chunk)?;
            }
        }
        self.log.trees.insert(id.subvol, root);
        self.log.csummed.insert(id.subvol, csummed);
        let c = self.log.inodes.entry(id).or_default();
        c.ranges.clear();
        c.dirty = false;
        c.logged = Some(seq);
        c.logged_eof = eof;
        if !ancestors.is_empty() {
            if let Some(why) = self.log_new_ancestors(id.subvol, ancestors, seq)? {
                self.log.full_commit = Some(why.clone());
                return Ok(Some(why));
            }
        }
        if dirs.is_empty() {
            if let Some(c) = self.log.inodes.get_mut(&id) {
                c.names = false;
            }
            return Ok(None);
        }
        match self.log_dirs(id.subvol, &dirs, seq)? {
            None => {
                if let Some(c) = self.log.inodes.get_mut(&id) {
                    c.names = false;
                }
                Ok(None)
            }
            Some(why) => {
                // The file's items are in: without its directories the log may name it
                // where a replay finds no directory.
                self.log.full_commit = Some(why.clone());
                Ok(Some(why))
            }
        }
    }

    /// Logs new directories `dirs`, and the new ones above them, only so that a replay
    /// makes them (the kernel's log_all_new_ancestors, LOG_INODE_EXISTS): inode item with
    /// generation 0 and size 0, names, xattrs; not their entries, which would bring
    /// whatever else moved into them along. Why not, where that cannot be said.
    fn log_new_ancestors(
        &mut self,
        subvol: u64,
        mut dirs: Vec<u64>,
        seq: u64,
    ) -> Result<Option<String>> {
        let mut done = Vec::new();
        while let Some(d) = dirs.pop() {
            if done.contains(&d) {
                continue;
            }
            done.push(d);
            let id = InodeId { subvol, ino: d };
            let Some(mut inode) = self.find_inode(id)? else {
                return Ok(Some(format!("directory {d} is gone")));
            };
            let (refs, missing) = match self.new_inode_refs(id, &inode, &[])? {
                Ok(r) => r,
                Err(why) => return Ok(Some(why)),
            };
            dirs.extend(missing);
            let xattrs = self.items_of(id, item::XATTR_ITEM, item::XATTR_ITEM)?;
            let bytes: usize = refs.iter().chain(&xattrs).map(|(_, v)| v.len() + 25).sum();
            if self.log.blocks.count() > LOG_BLOCKS_MAX || !self.log_fits(4 * bytes as u64 + 1024) {
                return Ok(Some(
                    "the log tree is large or metadata space is low".into(),
                ));
            }
            inode.generation = 0;
            inode.size = 0;
            let (mut store, mut root) = self.open_log(subvol)?;
            put_inode(&mut store, &mut root, d, &mut inode)?;
            for (from, to, items) in [
                (item::INODE_REF, item::INODE_EXTREF, &refs),
                (item::XATTR_ITEM, item::XATTR_ITEM, &xattrs),
            ] {
                let (min, max) = type_range(d, from, to);
                ctree::delete_range(&mut store, &mut root, min, max)?;
                insert_all(&mut store, &mut root, items)?;
            }
            self.log.trees.insert(subvol, root);
            // Its names and entries stay unlogged: its own fsync logs them.
            let c = self.log.inodes.entry(id).or_default();
            c.logged = Some(seq);
            c.exists_only = true;
        }
        Ok(None)
    }

    /// Logs again the inodes whose names changed after they were logged, so that the log
    /// says their names as they are; why not (the transaction's fsyncs then commit).
    fn settle(&mut self, seq: u64) -> Result<Option<String>> {
        // The log copies items from the subvolume trees: the delayed ones go there first.
        self.run_delayed_items()?;
        while let Some(id) = self.log.stale.pop() {
            let why = match self.relog(id, seq) {
                Ok(why) => why,
                Err(e) => Some(format!("logging inode {} again failed: {e}", id.ino)),
            };
            if let Some(why) = why {
                self.log.full_commit = Some(why.clone());
                return Ok(Some(why));
            }
        }
        Ok(None)
    }

    fn relog(&mut self, id: InodeId, seq: u64) -> Result<Option<String>> {
        if self.find_inode(id)?.is_some_and(|i| i.nlink > 0) {
            if let Some(c) = self.log.inodes.get_mut(&id) {
                c.dirty = true;
            }
            if let Some(why) = self.copy_inode(id, seq)? {
                return Ok(Some(why));
            }
            // A logged directory it left still lists the old name: a replay would add that
            // name beside the new one (a directory with two names), so it is logged again.
            let left: Vec<u64> = {
                let parents = self.log.inodes.get(&id).map(|c| c.parents.clone());
                parents
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|&p| {
                        let pid = InodeId {
                            subvol: id.subvol,
                            ino: p,
                        };
                        self.log.inodes.get(&pid).is_some_and(|pc| {
                            pc.logged.is_some()
                                && !pc.exists_only
                                && (pc.unlinked.contains(&id.ino) || pc.unknown_unlinks)
                        })
                    })
                    .collect()
            };
            if left.is_empty() {
                return Ok(None);
            }
            return self.log_dirs(id.subvol, &left, seq);
        }
        // Gone: it leaves the log, and the directories it left say so.
        let parents = self
            .log
            .inodes
            .get(&id)
            .map(|c| c.parents.clone())
            .unwrap_or_default();
        if self.log.trees.contains_key(&id.subvol) {
            let (mut store, mut root) = self.open_log(id.subvol)?;
            let (min, max) = (Key::new(id.ino, 0, 0), Key::new(id.ino, u8::MAX, u64::MAX));
            ctree::delete_range(&mut store, &mut root, min, max)?;
            self.log.trees.insert(id.subvol, root);
        }
        if let Some(c) = self.log.inodes.get_mut(&id) {
            c.logged = None;
        }
        if parents.is_empty() {
            return Ok(None);
        }
        self.log_dirs(id.subvol, &parents, seq)
    }

    /// The back references of an inode whose names changed in this transaction, for the
    /// log: a replay makes its entries from them; with the parent directories new in this
    /// transaction that are neither logged nor in `with` (a replay would find no directory
    /// to make the entry in unless they are logged too). Why not, where that cannot work:
    /// an inode older than this transaction (renamed, linked or unlinked: the log would
    /// have to say what became of its old names), extended references.
    pub(super) fn new_inode_refs(
        &mut self,
        id: InodeId,
        inode: &InodeItem,
        with: &[u64],
    ) -> Result<std::result::Result<(Items, Vec<u64>), String>> {
        if inode.generation != self.transid {
            return Ok(Err("the inode's names changed in this transaction".into()));
        }
        let refs = self.items_of(id, item::INODE_REF, item::INODE_EXTREF)?;
        let mut missing = Vec::new();
        for (k, _) in &refs {
            if k.item_type != item::INODE_REF {
                return Ok(Err("the inode has extended references".into()));
            }
            let pid = InodeId {
                subvol: id.subvol,
                ino: k.offset,
            };
            let Some(p) = self.find_inode(pid)? else {
                return Ok(Err("a parent directory is gone".into()));
            };
            let logged = self
                .log
                .inodes
                .get(&pid)
                .is_some_and(|c| c.logged.is_some());
            if p.generation >= self.transid
                && !logged
                && !with.contains(&k.offset)
                && !missing.contains(&k.offset)
            {
                missing.push(k.offset);
            }
        }
        Ok(Ok((refs, missing)))
    }

    /// The log tree of `subvol` (a new one if it has none yet) and the store to change it
    /// in; the caller records the new root in `log.trees`.
    pub(super) fn open_log(&mut self, subvol: u64) -> Result<(LogStore<'_>, TreeRoot)> {
        let fsid = BlockStore::fsid(&*self);
        let synced = self.filesystem().pipe.log.synced();
        let root = self.log.trees.get(&subvol).copied();
        let st = &mut **self;
        let mut store = st.log_store(fsid, synced);
        let root = match root {
            Some(r) => r,
            None => ctree::new_tree(&mut store, objectid::TREE_LOG)?,
        };
        Ok((store, root))
    }

    /// The inode's items of types `from..=to`.
    pub(super) fn items_of(
        &mut self,
        id: InodeId,
        from: u8,
        to: u8,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        let (min, max) = type_range(id.ino, from, to);
        let mut out = Vec::new();
        self.for_each_in_range(id.subvol, min, max, |k, v| {
            out.push((k, v.to_vec()));
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// The csum tree's checksums of `[start, end)`, cut to it: (address, sums) runs.
    pub(super) fn csums_in(
        &mut self,
        start: u64,
        end: u64,
        sector: u64,
        size: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let key = |at| Key::new(objectid::EXTENT_CSUM, item::EXTENT_CSUM, at);
        let mut found: Vec<(Key, Vec<u8>)> = Vec::new();
        if let Some(first) = self.lookup_le(objectid::CSUM_TREE, &key(start))? {
            found.push(first);
        }
        self.for_each_in_range(
            objectid::CSUM_TREE,
            key(start.saturating_add(1)),
            key(end - 1),
            |k, v| {
                found.push((k, v.to_vec()));
                Ok(ControlFlow::Continue(()))
            },
        )?;
        let mut out = Vec::new();
        for (k, v) in found {
            let item_end = k.offset + (v.len() / size) as u64 * sector;
            let (s, e) = (k.offset.max(start), item_end.min(end));
            if s >= e {
                continue;
            }
            let from = ((s - k.offset) / sector) as usize * size;
            let to = ((e - k.offset) / sector) as usize * size;
            out.push((s, v[from..to].to_vec()));
        }
        Ok(out)
    }

    /// Records the log trees' roots in the log root tree and readies every changed log
    /// block for writing: the batch log sync `seq` writes.
    fn log_batch(&mut self, seq: u64) -> Result<LogBatch> {
        let r = self.try_log_batch(seq);
        if let Err(e) = &r {
            self.log.full_commit = Some(format!("gathering the log failed: {e}"));
        }
        r
    }

    fn try_log_batch(&mut self, seq: u64) -> Result<LogBatch> {
        if let Some(why) = self.settle(seq)? {
            return Err(Error::Unsupported(why));
        }
        if let Some(why) = &self.log.full_commit {
            // Half changed: the commit makes this transaction's fsyncs durable.
            return Err(Error::Unsupported(why.clone()));
        }
        let nodesize = self.filesystem().sb.nodesize;
        let csum = self.filesystem().sb.csum_type();
        let fsid = BlockStore::fsid(&*self);
        let synced = self.filesystem().pipe.log.synced();
        let mut sb = self.filesystem().sb.clone();
        let st = &mut **self;
        let changed: Vec<(u64, TreeRoot)> = st
            .log
            .trees
            .iter()
            .filter(|(s, r)| st.log.recorded.get(s) != Some(r))
            .map(|(&s, &r)| (s, r))
            .collect();
        let root_tree = st.log.root_tree;
        let mut store = st.log_store(fsid, synced);
        let mut rt = match root_tree {
            Some(r) => r,
            None => ctree::new_tree(&mut store, objectid::TREE_LOG)?,
        };
        for (subvol, r) in &changed {
            let key = Key::new(objectid::TREE_LOG, item::ROOT_ITEM, *subvol);
            let body = log_root_item(r, nodesize).to_bytes();
            put(&mut store, &mut rt, key, &body)?;
        }
        st.log.recorded.extend(changed);
        st.log.root_tree = Some(rt);
        let blocks = st.log.blocks.take_dirty(csum, seq)?;
        sb.log_root = rt.bytenr;
        sb.log_root_level = rt.level;
        Ok(LogBatch { blocks, sb })
    }
}

/// The ROOT_ITEM naming a subvolume's log tree, as the kernel fills it.
fn log_root_item(r: &TreeRoot, nodesize: u32) -> RootItem {
    let mut ri = RootItem {
        generation: r.generation,
        generation_v2: r.generation,
        bytenr: r.bytenr,
        level: r.level,
        ..Default::default()
    };
    ri.inode.generation = 1;
    ri.inode.size = 3;
    ri.inode.nbytes = u64::from(nodesize);
    ri.inode.nlink = 1;
    ri.inode.mode = 0o40755;
    ri
}

pub(super) fn type_range(ino: u64, from: u8, to: u8) -> (Key, Key) {
    (Key::new(ino, from, 0), Key::new(ino, to, u64::MAX))
}

/// Puts an inode item into a log tree, with nbytes 0 (a replay counts it).
pub(super) fn put_inode<S: BlockStore>(
    store: &mut S,
    root: &mut TreeRoot,
    ino: u64,
    inode: &mut InodeItem,
) -> Result<()> {
    inode.nbytes = 0;
    put(
        store,
        root,
        Key::new(ino, item::INODE_ITEM, 0),
        &inode.to_bytes(),
    )
}

/// Inserts the item, or replaces the one with its key.
pub(super) fn put<S: BlockStore>(
    store: &mut S,
    root: &mut TreeRoot,
    key: Key,
    body: &[u8],
) -> Result<()> {
    match ctree::insert_item(store, root, key, body) {
        Err(Error::AlreadyExists) => {
            ctree::resize_item(store, root, &key, body.len())?;
            ctree::update_item(store, root, &key, |b| b.copy_from_slice(body))
        }
        r => r,
    }
}

pub(super) fn insert_all<S: BlockStore>(
    store: &mut S,
    root: &mut TreeRoot,
    items: &[(Key, Vec<u8>)],
) -> Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    let refs: Vec<(Key, &[u8])> = items.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    ctree::insert_items(store, root, &refs)
}

/// The disk range whose checksums a replay of this extent item takes from the log: data
/// written in transaction `transid` (older data has its sums in the csum tree already).
fn new_data(body: &[u8], transid: u64) -> Option<(u64, u64)> {
    let fe = FileExtent::parse(body).ok()?;
    if fe.generation != transid {
        return None;
    }
    match fe.body {
        FileExtentBody::Extent {
            prealloc: false,
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } if disk_bytenr != 0 => Some(if fe.compression == Compression::None {
            (disk_bytenr + offset, disk_bytenr + offset + num_bytes)
        } else {
            (disk_bytenr, disk_bytenr + disk_num_bytes)
        }),
        _ => None,
    }
}

/// Explicit hole items for the gaps between `current` in `[a, b)`.
fn holes(ino: u64, a: u64, b: u64, current: &[Extent], transid: u64) -> Vec<(Key, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = a;
    let mut hole = |from: u64, to: u64| {
        if from < to {
            let body = FileExtent {
                generation: transid,
                ram_bytes: to - from,
                compression: Compression::None,
                body: FileExtentBody::Extent {
                    prealloc: false,
                    disk_bytenr: 0,
                    disk_num_bytes: 0,
                    offset: 0,
                    num_bytes: to - from,
                },
            };
            out.push((Key::new(ino, item::EXTENT_DATA, from), body.to_bytes()));
        }
    };
    for (k, _, e) in current {
        if k.offset >= b {
            break;
        }
        hole(at, k.offset.min(b));
        at = at.max(*e);
    }
    hole(at, b);
    out
}

/// The file extent items of `ino` in the tree at `root` that overlap `[a, b)`, with the
/// end of each (an inline extent covers its whole sector).
fn extents_overlapping<S: BlockSource + ?Sized>(
    src: &S,
    root: &TreeRoot,
    ino: u64,
    a: u64,
    b: u64,
    sector: u64,
) -> Result<Vec<Extent>> {
    let key = |at| Key::new(ino, item::EXTENT_DATA, at);
    let end_of = |k: &Key, v: &[u8]| -> Result<u64> {
        let fe = FileExtent::parse(v)
            .map_err(|e| Error::corrupt(0, format!("extent {k:?} of inode {ino}: {e}")))?;
        let len = match fe.body {
            FileExtentBody::Inline { .. } => fe.ram_bytes.next_multiple_of(sector),
            FileExtentBody::Extent { num_bytes, .. } => num_bytes,
        };
        Ok(k.offset.saturating_add(len))
    };
    let mut out = Vec::new();
    if let Some((k, v)) = ctree::lookup_le(src, root, &key(a))? {
        let e = end_of(&k, &v)?;
        if e > a && k.offset < b {
            out.push((k, v, e));
        }
    }
    if a.saturating_add(1) < b {
        ctree::for_each_in_range(src, root, key(a + 1), key(b - 1), |k, v| {
            let e = end_of(&k, v)?;
            out.push((k, v.to_vec(), e));
            Ok(ControlFlow::Continue(()))
        })?;
    }
    Ok(out)
}
