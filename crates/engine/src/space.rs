//! Space reservation and the life of a write operation: before an operation changes
//! anything it reserves the metadata (and data) space it may need, allocating new chunks
//! or committing (freed space becomes reusable only after a commit) to make room; if that
//! is not enough it fails with ENOSPC with nothing changed. An operation that fails after it
//! changed trees leaves them inconsistent: the transaction is aborted.

use crate::error::{Error, Result};
use crate::fs::{FsCore, InodeId, StatFs};
use crate::transaction::Transaction;
use oleo_format::items::block_group as bg;
use oleo_format::items::BlockGroupItem;
use oleo_format::key::{item, objectid, Key};
use oleo_format::superblock::compat_ro;

/// Blocks one item change may need: a copied path plus a split at every level (the
/// kernel reserves the same, 2 * BTRFS_MAX_LEVEL per item).
const BLOCKS_PER_ITEM: u64 = 16;

/// What an operation may consume.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reserve {
    items: u64,
    /// Bytes of items that go in side by side (a file's extent and csum items): they
    /// share leaves, so they cost about their size, not a path each.
    bulk: u64,
    data: u64,
}

impl Reserve {
    pub(crate) fn items(items: u64) -> Reserve {
        Reserve {
            items,
            bulk: 0,
            data: 0,
        }
    }

    pub(crate) fn bulk(self, bytes: u64) -> Reserve {
        Reserve {
            bulk: bytes,
            ..self
        }
    }

    pub(crate) fn data(self, bytes: u64) -> Reserve {
        Reserve {
            data: bytes,
            ..self
        }
    }
}

impl Transaction<'_> {
    /// Metadata the commit itself needs for this transaction's bookkeeping (extent items of
    /// new blocks, free space tree, block group and root items).
    fn commit_reserve(&self) -> u64 {
        let ns = u64::from(self.filesystem().sb.nodesize);
        self.dirty.len() as u64 * ns / 8 + 32 * ns
    }

    fn metadata_needed(&self, r: &Reserve) -> u64 {
        let ns = u64::from(self.filesystem().sb.nodesize);
        // Leaves of side-by-side items fill about half (splits), each copied once more.
        r.items * BLOCKS_PER_ITEM * ns + r.bulk * 4 + self.commit_reserve()
    }

    /// Makes sure `r` fits, allocating chunks if the device has room. NoSpace otherwise.
    fn reserve(&mut self, r: &Reserve) -> Result<()> {
        let meta = self.metadata_needed(r);
        self.ensure_available(bg::METADATA, meta)?;
        if r.data > 0 {
            self.ensure_available(bg::DATA, r.data)?;
        }
        Ok(())
    }

    fn ensure_available(&mut self, kind: u64, bytes: u64) -> Result<()> {
        while self.block_groups.available(kind) < bytes {
            if !self.try_alloc_chunk(kind)? {
                log::debug!(
                    "no space: {} bytes of type {kind:#x} wanted, {} available",
                    bytes,
                    self.block_groups.available(kind)
                );
                return Err(Error::NoSpace);
            }
        }
        Ok(())
    }

    /// Adds a chunk of type `kind` if the device has unallocated space. False if not.
    fn try_alloc_chunk(&mut self, kind: u64) -> Result<bool> {
        match self.alloc_chunk(kind) {
            Ok(_) => Ok(true),
            Err(Error::NoSpace) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// True if a commit would give back space of type `kind` freed in this transaction.
    fn commit_frees(&self, kind: u64) -> bool {
        self.block_groups.has_pinned(kind)
    }
}

impl FsCore {
    /// Runs one operation in the running transaction after reserving `need`.
    pub(crate) fn write_op<R>(
        &mut self,
        need: Reserve,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<R>,
    ) -> Result<R> {
        let mut committed = false;
        loop {
            let mut txn = self.start_transaction()?;
            let before_reserve = txn.changes();
            match txn.reserve(&need) {
                Ok(()) => {}
                Err(Error::NoSpace)
                    if !committed
                        && (txn.commit_frees(bg::METADATA) || txn.commit_frees(bg::DATA)) =>
                {
                    txn.commit()?;
                    committed = true;
                    continue;
                }
                Err(e) => {
                    // A chunk allocation that failed half-way leaves the trees inconsistent.
                    if !matches!(e, Error::NoSpace) && txn.changes() != before_reserve {
                        txn.abort(&format!("allocating a chunk failed: {e}"));
                    }
                    return Err(e);
                }
            }
            let before = txn.changes();
            let r = f(&mut txn);
            if let Err(e) = &r {
                if txn.changes() != before || txn.poisoned().is_some() {
                    let why = format!("an operation failed half-way: {e}");
                    txn.abort(&why);
                }
                return r;
            }
            let over = txn.dirty_bytes() > txn.filesystem().dirty_limit;
            drop(txn);
            if over {
                // Bounded memory: dirty tree blocks go to disk before they outgrow the limit.
                self.start_transaction()?.commit()?;
            }
            return r;
        }
    }

    /// Commits the running transaction, if any: everything before is durable after.
    /// Returns the generation on disk.
    pub fn sync(&mut self) -> Result<u64> {
        match self.close_running()? {
            Some(io) => io.write(),
            None => self.pipe.wait_durable(self.sb.generation),
        }
    }

    /// Closes the running transaction, if any, leaving its writing to the caller (which
    /// need not hold the filesystem: see `Filesystem::sync`).
    pub(crate) fn close_running(&mut self) -> Result<Option<crate::transaction::CommitIo>> {
        if self.running.is_none() {
            return Ok(None);
        }
        self.start_transaction()?.close().map(Some)
    }

    /// Marks `id` as open: if its last name goes, it lives on (as an orphan) until closed.
    pub fn pin_open(&self, id: InodeId) {
        *self.open_inodes.lock().entry(id).or_insert(0) += 1;
    }

    /// Undoes one `pin_open`; the last one deletes the inode if it has no names left.
    pub fn unpin_open(&mut self, id: InodeId) -> Result<()> {
        if self.drop_pin(id) {
            self.delete_if_unlinked(id)
        } else {
            Ok(())
        }
    }

    /// Undoes one `pin_open` without deleting anything; true if that was the last pin (then
    /// `delete_if_unlinked` finishes the job). Lets callers decide under a shared lock.
    pub fn drop_pin(&self, id: InodeId) -> bool {
        let mut open = self.open_inodes.lock();
        match open.get_mut(&id) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                open.remove(&id);
                true
            }
            None => false,
        }
    }

    /// Deletes `id` if it has no names left and nothing pins it (an orphan whose last user
    /// went away).
    pub fn delete_if_unlinked(&mut self, id: InodeId) -> Result<()> {
        if self.is_open(id) || self.aborted.is_some() || !self.io.device().is_writable() {
            return Ok(());
        }
        match self.inode_item(id) {
            Ok(inode) if inode.nlink == 0 => {
                self.write_op(Reserve::items(8), |t| t.delete_inode(id))
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn is_open(&self, id: InodeId) -> bool {
        self.open_inodes.lock().contains_key(&id)
    }

    /// Deletes inodes left as orphans (unlinked while open when the last session ended),
    /// as the kernel does at mount.
    pub(crate) fn remove_orphans(&mut self, subvol: u64) -> Result<usize> {
        let orphans = self.write_op(Reserve::items(1), |t| t.orphans(subvol))?;
        for &ino in &orphans {
            let id = InodeId { subvol, ino };
            self.write_op(Reserve::items(8), |t| t.delete_inode(id))?;
        }
        Ok(orphans.len())
    }
}

/// Copies of each byte a block group of these flags keeps on one device.
fn copies(flags: u64) -> u64 {
    match flags & bg::PROFILE_MASK {
        bg::DUP | bg::RAID1 | bg::RAID10 => 2,
        bg::RAID1C3 => 3,
        bg::RAID1C4 => 4,
        _ => 1,
    }
}

impl FsCore {
    /// (flags, length, used) of every block group as reads see them now.
    fn block_group_usage(&self) -> Result<Vec<(u64, u64, u64)>> {
        if let Some(t) = &self.running {
            return Ok(t.block_groups.summary().collect());
        }
        let tree = if self.sb.has_compat_ro(compat_ro::BLOCK_GROUP_TREE) {
            objectid::BLOCK_GROUP_TREE
        } else {
            objectid::EXTENT_TREE
        };
        let Some((root, _)) = self.read_root_item(tree)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (&start, chunk) in self.io.chunks().chunks() {
            let key = Key::new(start, item::BLOCK_GROUP_ITEM, chunk.length);
            let used = match crate::ctree::lookup(self, &root, &key)? {
                Some(body) => BlockGroupItem::parse(&body).map_or(0, |b| b.used),
                None => 0,
            };
            out.push((chunk.chunk_type, chunk.length, used));
        }
        Ok(out)
    }

    /// Bytes new file data can still get (statfs's available space).
    pub fn data_available(&self) -> Result<u64> {
        let s = self.statfs()?;
        Ok(s.blocks_avail * u64::from(s.block_size))
    }

    /// statfs as the kernel's btrfs computes it in spirit: blocks is the device, free is
    /// what is not used by any block group (counting every copy), available is what new
    /// file data can still get (free data block group space plus unallocated space).
    pub fn statfs(&self) -> Result<StatFs> {
        let bs = u64::from(self.sb.sectorsize);
        let groups = self.block_group_usage()?;
        let total = self.sb.total_bytes;
        let used_raw: u64 = groups.iter().map(|&(f, _, u)| u * copies(f)).sum();
        let allocated_raw: u64 = groups.iter().map(|&(f, l, _)| l * copies(f)).sum();
        let data: Vec<_> = groups.iter().filter(|g| g.0 & bg::DATA != 0).collect();
        let data_copies = data.first().map_or(1, |g| copies(g.0));
        let data_free: u64 = data.iter().map(|&&(_, l, u)| l.saturating_sub(u)).sum();
        let unallocated = total.saturating_sub(allocated_raw);
        let avail = data_free + unallocated / data_copies;
        let free = total.saturating_sub(used_raw).min(total);
        Ok(StatFs {
            block_size: bs as u32,
            blocks: total / bs,
            blocks_free: free / bs,
            blocks_avail: (avail / bs).min(free / bs),
            files: 0,
            files_free: 0,
            name_max: 255,
        })
    }
}
