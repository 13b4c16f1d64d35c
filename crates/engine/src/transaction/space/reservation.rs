//! Space reservation and the life of a write operation: before an operation changes
//! anything it reserves the metadata (and data) space it may need, allocating new chunks
//! or committing (freed space becomes reusable only after a commit) to make room; if that
//! is not enough it fails with ENOSPC with nothing changed. An operation that fails after it
//! changed trees leaves them inconsistent: the transaction is aborted.

use crate::error::{Error, Result};
use crate::transaction::fs::FsCore;
use crate::transaction::Transaction;
use oleo_format::items::block_group as bg;

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
        let nodesize = self.filesystem().sb.nodesize;
        let ns = u64::from(nodesize);
        // Delayed items are written before the commit, into blocks not allocated yet.
        let delayed = self.delayed.reserved_blocks(nodesize);
        // Every block changed in T adds an extent item and, if it was copied, drops the
        // old one's, which may sit in any leaf of the extent tree, and frees space the
        // free space tree records anywhere, and each block those changes copy frees another
        // in turn: never more than those trees hold, and in practice a few per changed
        // block. The new items cluster (an eighth). On a full 4 KiB-node filesystem a
        // transaction that changed 2,100 blocks needed 740 more at commit, one of 140
        // needed 510, one with only delayed items (250 blocks once written) more than 253
        // (`empty_files_from_many_threads_until_full`, library and FUSE).
        let changed = self.dirty.len() as u64 + delayed;
        let scattered = (8 * changed + 512).min(self.bookkeeping_blocks + 2 * 8);
        (scattered + changed / 8 + 64 + delayed) * ns
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
        while !self.block_groups.has_available(kind, bytes) {
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

    /// True if `bytes` of log blocks fit beside what the commit itself needs: the log
    /// takes metadata space no operation reserved, so it must leave the commit's alone.
    pub(crate) fn log_fits(&self, bytes: u64) -> bool {
        let ns = u64::from(self.filesystem().sb.nodesize);
        let need = self.commit_reserve() + bytes + 64 * ns;
        self.block_groups.has_available(bg::METADATA, need)
    }

    /// Counts `len` bytes of data allocated against the operation's reservation. Going
    /// over means some path allocates data its operation did not reserve: it worked here
    /// only because space happened to be free, and at full data it would abort.
    pub(crate) fn spend_data(&mut self, len: u64) {
        let Some(left) = self.data_budget else {
            return;
        };
        if len > left {
            log::error!("an operation allocated {len} bytes of data, {left} were reserved");
            debug_assert!(len <= left, "data allocated beyond the reservation");
        }
        self.data_budget = Some(left.saturating_sub(len));
    }

    /// True if a commit would give back space of type `kind` freed in this transaction.
    fn commit_frees(&self, kind: u64) -> bool {
        self.block_groups.has_pinned(kind) || (kind == bg::DATA && self.refs.drops_data())
    }
}

impl FsCore {
    /// True if a commit would give back data space: extents freed since the last commit
    /// (overwritten, truncated, deleted) stay pinned, and still count as used, until one.
    pub(crate) fn commit_would_free_data(&self) -> bool {
        match self.running.as_deref() {
            Some(t) => t.block_groups.has_pinned(bg::DATA) || t.refs.drops_data(),
            None => self
                .block_groups
                .as_ref()
                .is_some_and(|g| g.has_pinned(bg::DATA)),
        }
    }

    /// Metadata space free in the block groups there are, without allocating a chunk.
    pub(crate) fn metadata_room(&self) -> u64 {
        match self.running.as_deref() {
            Some(t) => t.block_groups.available(bg::METADATA),
            None => self
                .block_groups
                .as_ref()
                .map_or(0, |g| g.available(bg::METADATA)),
        }
    }

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
                    if txn.is_idle() {
                        // Only commits still being written hold the freed space, and
                        // committing nothing would cost the bookkeeping trees' copies.
                        drop(txn);
                        self.pipe.write_deferred()?;
                        self.pipe.wait_durable(self.sb.generation)?;
                    } else {
                        txn.commit()?;
                    }
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
            txn.data_budget = Some(need.data);
            let r = f(&mut txn);
            txn.data_budget = None;
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
                // Bounded memory: dirty tree blocks go to disk before they outgrow the limit,
                // written by this thread once it lets go of the lock (`CoreMut`).
                // One such commit at most waits at a time: a long run of operations under
                // one hold of the lock (mkfs --rootdir) writes the one before inline.
                self.pipe.write_deferred()?;
                let io = self.start_transaction()?.close()?;
                self.pipe.defer(io);
            }
            return r;
        }
    }
}
