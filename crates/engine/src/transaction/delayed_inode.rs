//! Delayed items (the kernel's delayed-inode.c, seed 001): DIR_INDEX insertions and
//! deletions and INODE_ITEM updates wait in memory in the running transaction and go into
//! the subvolume tree in batches: before the commit, before a log copies items, and when the
//! queue passes `QUEUE_MAX`. A directory's queued insertions are one descent per leaf
//! (`insert_items`); an entry that is created and removed within the queue never reaches
//! the tree, and an inode changed many times is written once.
//!
//! Readers see the queue as if it were in the tree: `readdir` merges a directory's queue
//! with its DIR_INDEX items, `read_inode` and `FsCore::inode_item` look here first. The log
//! is told of every change when it is queued, so what an fsync must log is known before
//! the items exist in the tree.
//!
//! Space: the queue reserves metadata per leaf its batch may fill, not per item
//! (`reserved_blocks`): an insertion into a leaf the batch already fills costs nothing more,
//! so the ENOSPC check every operation makes (`reservation`) stays exact without charging
//! each queued entry a full path.

use crate::error::Result;
use crate::transaction::fs::InodeId;
use crate::transaction::Transaction;
use oleo_format::items::InodeItem;
use oleo_format::key::{item, Key};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Queued items past which the operation that queues one writes them all (the kernel's
/// BTRFS_DELAYED_WRITEBACK).
const QUEUE_MAX: usize = 512;

/// Blocks a first change in a tree may need: a copied path plus a split at every level
/// (as `reservation::BLOCKS_PER_ITEM`).
const PATH_BLOCKS: u64 = 16;

/// Bytes of a leaf's header, and of one item's header in it.
const LEAF_HEADER: u64 = 101;
const ITEM_HEADER: u64 = 25;

/// Deleted entry numbers at most this far apart are taken to share a leaf.
const RUN_GAP: u64 = 32;

/// One directory's queued DIR_INDEX changes.
#[derive(Default)]
pub(crate) struct DirQueue {
    /// New entries: index -> DIR_INDEX body.
    pub(crate) insert: BTreeMap<u64, Vec<u8>>,
    /// Entries in the tree to delete.
    pub(crate) delete: BTreeSet<u64>,
    /// Bytes the insertions take in leaves, item headers included.
    insert_bytes: u64,
    /// Runs of deletions close enough to share a leaf.
    delete_runs: u64,
}

impl DirQueue {
    fn is_empty(&self) -> bool {
        self.insert.is_empty() && self.delete.is_empty()
    }

    /// Tree blocks writing this queue may allocate: a path for its first leaf and two
    /// blocks (a leaf and its share of the parent) for every further leaf it fills or
    /// touches.
    fn blocks(&self, nodesize: u32) -> u64 {
        if self.is_empty() {
            return 0;
        }
        let leaf = u64::from(nodesize) - LEAF_HEADER;
        let insert_leaves = self.insert_bytes.div_ceil(leaf);
        let delete_leaves = self.delete_runs + self.delete.len() as u64 / 64;
        PATH_BLOCKS + 2 * (insert_leaves + delete_leaves)
    }

    /// Adds `index` to the deletions, keeping the count of runs.
    fn add_delete(&mut self, index: u64) {
        if !self.delete.insert(index) {
            return;
        }
        let near = |a: u64, b: u64| b - a <= RUN_GAP;
        let prev = self.delete.range(..index).next_back().copied();
        let next = self.delete.range(index + 1..).next().copied();
        let joins_prev = prev.is_some_and(|p| near(p, index));
        let joins_next = next.is_some_and(|n| near(index, n));
        let were_one = matches!((prev, next), (Some(p), Some(n)) if near(p, n));
        self.delete_runs = self.delete_runs + 1 + u64::from(were_one)
            - u64::from(joins_prev)
            - u64::from(joins_next);
    }
}

/// The running transaction's delayed items.
#[derive(Default)]
pub(crate) struct DelayedItems {
    dirs: BTreeMap<InodeId, DirQueue>,
    /// The sum of `DirQueue::blocks` over `dirs`, kept as they change (every operation's
    /// reservation asks for it: a sum over hundreds of directories each time showed in
    /// profiles of unpacking a tree).
    dir_blocks: u64,
    inodes: BTreeMap<InodeId, Arc<InodeItem>>,
    /// Queued insertions, deletions and inode items.
    count: usize,
    /// Write through (log replay, which reads the tree it is changing).
    pub(crate) bypass: bool,
}

impl DelayedItems {
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The inode item as last written, if it waits here.
    pub(crate) fn inode(&self, id: &InodeId) -> Option<&Arc<InodeItem>> {
        self.inodes.get(id)
    }

    /// The directory's queued entry changes, if any.
    pub(crate) fn dir(&self, id: &InodeId) -> Option<&DirQueue> {
        self.dirs.get(id).filter(|q| !q.is_empty())
    }

    /// Tree blocks writing everything queued may allocate.
    pub(crate) fn reserved_blocks(&self, nodesize: u32) -> u64 {
        debug_assert_eq!(
            self.dir_blocks,
            self.dirs.values().map(|q| q.blocks(nodesize)).sum::<u64>()
        );
        let inodes = match self.inodes.len() as u64 {
            0 => 0,
            n => PATH_BLOCKS + n,
        };
        self.dir_blocks + inodes
    }

    /// Runs `f` on `dir`'s queue, keeping `dir_blocks` up to date.
    fn change_dir<R>(
        &mut self,
        dir: InodeId,
        nodesize: u32,
        f: impl FnOnce(&mut DirQueue) -> R,
    ) -> R {
        let q = self.dirs.entry(dir).or_default();
        let before = q.blocks(nodesize);
        let r = f(q);
        self.dir_blocks = self.dir_blocks - before + q.blocks(nodesize);
        r
    }
}

impl Transaction<'_> {
    /// Queues the DIR_INDEX item `index` of `dir` with body `body`.
    pub(crate) fn queue_dir_index(
        &mut self,
        dir: InodeId,
        index: u64,
        body: Vec<u8>,
    ) -> Result<()> {
        let key = Key::new(dir.ino, item::DIR_INDEX, index);
        self.log
            .note(dir.subvol, &key, &[(index, index.saturating_add(1))]);
        let nodesize = self.filesystem().sb.nodesize;
        let added = self.delayed.change_dir(dir, nodesize, |q| {
            q.insert_bytes += body.len() as u64 + ITEM_HEADER;
            match q.insert.insert(index, body) {
                Some(old) => {
                    q.insert_bytes -= old.len() as u64 + ITEM_HEADER;
                    0
                }
                None => 1,
            }
        });
        self.delayed.count += added;
        self.count_change();
        self.after_queueing()
    }

    /// Queues the deletion of DIR_INDEX item `index` of `dir`, an entry leading to inode
    /// `target` of the same subvolume (None: elsewhere). An entry still queued is dropped.
    pub(crate) fn queue_dir_index_deletion(
        &mut self,
        dir: InodeId,
        index: u64,
        target: Option<u64>,
    ) -> Result<()> {
        let key = Key::new(dir.ino, item::DIR_INDEX, index);
        self.log.note_unlinked(dir.subvol, dir.ino, target);
        self.log
            .note(dir.subvol, &key, &[(index, index.saturating_add(1))]);
        let nodesize = self.filesystem().sb.nodesize;
        // (queued items dropped, deletions added)
        let (dropped, added) = self.delayed.change_dir(dir, nodesize, |q| {
            if let Some(body) = q.insert.remove(&index) {
                q.insert_bytes -= body.len() as u64 + ITEM_HEADER;
                (1, 0)
            } else {
                let before = q.delete.len();
                q.add_delete(index);
                (0, q.delete.len() - before)
            }
        });
        self.delayed.count = self.delayed.count + added - dropped;
        self.count_change();
        self.after_queueing()
    }

    /// Queues `inode` as inode `id`'s item (which exists in the tree).
    pub(crate) fn queue_inode(&mut self, id: InodeId, inode: &InodeItem) -> Result<()> {
        let key = Key::new(id.ino, item::INODE_ITEM, 0);
        self.log.note(id.subvol, &key, &[]);
        if self
            .delayed
            .inodes
            .insert(id, Arc::new(inode.clone()))
            .is_none()
        {
            self.delayed.count += 1;
        }
        self.count_change();
        self.after_queueing()
    }

    /// Drops what waits for inode `id`: its items are being deleted.
    pub(crate) fn forget_delayed(&mut self, id: InodeId) {
        let nodesize = self.filesystem().sb.nodesize;
        let d = &mut self.delayed;
        if d.inodes.remove(&id).is_some() {
            d.count -= 1;
        }
        if let Some(q) = d.dirs.remove(&id) {
            d.count -= q.insert.len() + q.delete.len();
            d.dir_blocks -= q.blocks(nodesize);
        }
    }

    fn after_queueing(&mut self) -> Result<()> {
        if self.delayed.bypass || self.delayed.count > QUEUE_MAX {
            self.run_delayed_items()?;
        }
        Ok(())
    }

    /// Writes every queued item into its tree.
    pub(crate) fn run_delayed_items(&mut self) -> Result<()> {
        if self.delayed.is_empty() {
            return Ok(());
        }
        let dirs = std::mem::take(&mut self.delayed.dirs);
        self.delayed.dir_blocks = 0;
        let inodes = std::mem::take(&mut self.delayed.inodes);
        self.delayed.count = 0;
        for (dir, q) in dirs {
            for index in q.delete {
                let key = Key::new(dir.ino, item::DIR_INDEX, index);
                self.tree_delete_item(dir.subvol, &key)?;
            }
            if !q.insert.is_empty() {
                let items: Vec<(Key, &[u8])> = q
                    .insert
                    .iter()
                    .map(|(&i, b)| (Key::new(dir.ino, item::DIR_INDEX, i), b.as_slice()))
                    .collect();
                self.tree_insert_items(dir.subvol, &items)?;
            }
        }
        for (id, inode) in inodes {
            let body = inode.to_bytes();
            let key = Key::new(id.ino, item::INODE_ITEM, 0);
            self.tree_update_item(id.subvol, &key, |b| b[..body.len()].copy_from_slice(&body))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletion_runs_merge_and_split() {
        let mut q = DirQueue::default();
        q.add_delete(10);
        q.add_delete(200);
        assert_eq!(q.delete_runs, 2);
        q.add_delete(11);
        assert_eq!(q.delete_runs, 2);
        // 100 bridges neither gap; 40 and 70 join 10..200 step by step.
        q.add_delete(100);
        assert_eq!(q.delete_runs, 3);
        q.add_delete(40);
        q.add_delete(70);
        assert_eq!(q.delete_runs, 2);
        q.add_delete(130);
        q.add_delete(160);
        assert_eq!(q.delete_runs, 2);
        q.add_delete(180);
        assert_eq!(q.delete_runs, 1);
        q.add_delete(160);
        assert_eq!(q.delete_runs, 1);
    }

    #[test]
    fn insertions_reserve_per_leaf() {
        let mut q = DirQueue::default();
        for i in 0..100u64 {
            q.insert.insert(i, vec![0; 50]);
            q.insert_bytes += 50 + ITEM_HEADER;
        }
        // 7,500 bytes fit one 16 KiB leaf: a path, and one leaf.
        assert_eq!(q.blocks(16384), PATH_BLOCKS + 2);
        // The same in 4 KiB leaves fills two.
        assert_eq!(q.blocks(4096), PATH_BLOCKS + 4);
    }
}
