//! Where log tree blocks live: in memory for the whole transaction, at addresses reserved
//! from metadata space that the committed state calls free (as the kernel places them: no
//! extent item, no block group `used`, no free space tree change).
//!
//! A block handed to a log sync is never changed again: the next change copies it (the
//! ctree's copy-on-write, because `dirty_mut` no longer offers it). Its address may be
//! reused once a later log sync, whose trees no longer point at it, is durable. At the
//! commit every address goes back to the allocator, pinned until that commit is durable.

use crate::ctree::{BlockSource, BlockStore};
use crate::error::{Error, Result};
use crate::io::disk_io::Block;
use crate::transaction::space::block_group::BlockGroups;
use oleo_format::items::block_group as bg;
use oleo_format::key::Key;
use std::collections::HashMap;

/// The log blocks of one transaction.
#[derive(Default)]
pub(crate) struct LogBlocks {
    /// Changed since the last log sync: editable in place.
    dirty: HashMap<u64, Block>,
    /// Handed to a log sync: read-only.
    written: HashMap<u64, Block>,
    /// Addresses no tree points at any more, with the log sync after which they are no
    /// longer reachable from disk either (0: never written).
    freed: Vec<(u64, u64)>,
    /// Every address reserved for the log in this transaction.
    reserved: Vec<u64>,
}

impl LogBlocks {
    /// Blocks held (the log's size).
    pub(crate) fn count(&self) -> usize {
        self.dirty.len() + self.written.len()
    }

    /// The blocks changed since the last sync, made ready for writing (`finalize`): they
    /// become read-only. Blocks this sync makes unreachable are reusable once sync `seq`
    /// is durable.
    pub(crate) fn take_dirty(
        &mut self,
        csum: oleo_format::CsumType,
        seq: u64,
    ) -> Result<Vec<(u64, Block)>> {
        for f in self.freed.iter_mut() {
            if f.1 == u64::MAX {
                f.1 = seq;
            }
        }
        let mut out = Vec::with_capacity(self.dirty.len());
        for (bytenr, mut block) in std::mem::take(&mut self.dirty) {
            crate::ctree::finalize_block(std::sync::Arc::make_mut(&mut block), csum)?;
            self.written.insert(bytenr, block.clone());
            out.push((bytenr, block));
        }
        out.sort_unstable_by_key(|(b, _)| *b);
        Ok(out)
    }

    /// Gives every address back at the commit: pinned until the commit is durable (a log
    /// on disk may point at any of them until then).
    pub(crate) fn release(self, groups: &mut BlockGroups, nodesize: u32) {
        for bytenr in self.reserved {
            groups.cancel_reserved(bytenr);
            // Inside a block group: it was reserved there.
            let _ = groups.pin(bytenr, u64::from(nodesize));
        }
    }
}

/// The log blocks together with the allocator: a `BlockStore` for the ctree.
pub(crate) struct LogStore<'a> {
    pub blocks: &'a mut LogBlocks,
    pub groups: &'a mut BlockGroups,
    pub nodesize: u32,
    pub transid: u64,
    pub fsid: [u8; 16],
    pub chunk_tree_uuid: [u8; 16],
    /// The newest durable log sync: blocks freed before it may be reused.
    pub synced: u64,
}

impl BlockSource for LogBlocks {
    fn read_tree_block(
        &self,
        bytenr: u64,
        _level: Option<u8>,
        _generation: Option<u64>,
        _first_key: Option<Key>,
    ) -> Result<Block> {
        // Our own blocks, never read back from the device.
        self.dirty
            .get(&bytenr)
            .or_else(|| self.written.get(&bytenr))
            .cloned()
            .ok_or_else(|| Error::corrupt(bytenr, "not a block of this transaction's log"))
    }
}

impl BlockSource for LogStore<'_> {
    fn read_tree_block(
        &self,
        bytenr: u64,
        level: Option<u8>,
        generation: Option<u64>,
        first_key: Option<Key>,
    ) -> Result<Block> {
        self.blocks
            .read_tree_block(bytenr, level, generation, first_key)
    }
}

impl BlockStore for LogStore<'_> {
    fn nodesize(&self) -> u32 {
        self.nodesize
    }

    fn transid(&self) -> u64 {
        self.transid
    }

    fn fsid(&self) -> [u8; 16] {
        self.fsid
    }

    fn chunk_tree_uuid(&self) -> [u8; 16] {
        self.chunk_tree_uuid
    }

    fn alloc(&mut self, _owner: u64, _level: u8, _hint: u64) -> Result<u64> {
        let synced = self.synced;
        if let Some(i) = self.blocks.freed.iter().position(|&(_, s)| s <= synced) {
            return Ok(self.blocks.freed.swap_remove(i).0);
        }
        let size = u64::from(self.nodesize);
        let bytenr = self.groups.reserve(bg::METADATA, size, size)?;
        self.blocks.reserved.push(bytenr);
        Ok(bytenr)
    }

    fn free(&mut self, bytenr: u64, _tree: u64, _level: u8) -> Result<()> {
        if self.blocks.dirty.remove(&bytenr).is_some() {
            self.blocks.freed.push((bytenr, 0));
        } else if self.blocks.written.remove(&bytenr).is_some() {
            // On disk under the last sync's trees until the next sync is durable.
            self.blocks.freed.push((bytenr, u64::MAX));
        }
        Ok(())
    }

    fn dirty_mut(&mut self, bytenr: u64) -> Option<&mut [u8]> {
        self.blocks
            .dirty
            .get_mut(&bytenr)
            .map(std::sync::Arc::make_mut)
    }

    fn insert_dirty(&mut self, bytenr: u64, block: Vec<u8>) -> Result<()> {
        if block.len() != self.nodesize as usize {
            return Err(Error::corrupt(
                bytenr,
                "log block size differs from nodesize",
            ));
        }
        self.blocks.dirty.insert(bytenr, block.into());
        Ok(())
    }
}

impl crate::transaction::TxnState {
    /// This transaction's log blocks with its allocator, as a store for the ctree; `fsid`
    /// for new headers, `synced` the newest durable log sync.
    pub(crate) fn log_store(&mut self, fsid: [u8; 16], synced: u64) -> LogStore<'_> {
        LogStore {
            blocks: &mut self.log.blocks,
            groups: &mut self.block_groups,
            nodesize: self.nodesize,
            transid: self.transid,
            fsid,
            chunk_tree_uuid: self.chunk_tree_uuid,
            synced,
        }
    }
}
