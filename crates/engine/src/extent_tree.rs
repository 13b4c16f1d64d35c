//! Back references of tree blocks in the extent tree (skinny metadata: one METADATA_ITEM
//! `(bytenr, 169, level)` per block). Changing the extent tree allocates and frees extent
//! tree blocks itself, so allocations and frees are queued (the kernel's delayed refs) and
//! the queue is run at commit until it stays empty.

use crate::ctree::{self, BlockSource, TreeRoot};
use crate::error::{Error, Result};
use crate::transaction::Transaction;
use oleo_format::items::{ExtentItem, InlineRef, EXTENT_FLAG_FULL_BACKREF, EXTENT_FLAG_TREE_BLOCK};
use oleo_format::key::{item, objectid, Key};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RefOp {
    /// A new block of tree `owner`: insert its METADATA_ITEM.
    Add { owner: u64, level: u8 },
    /// A block of an earlier commit (or one whose item is already in): remove its item.
    Drop { level: u8 },
}

#[derive(Default)]
pub(crate) struct DelayedRefs {
    pending: BTreeMap<u64, RefOp>,
}

impl DelayedRefs {
    pub(crate) fn add(&mut self, bytenr: u64, owner: u64, level: u8) -> Result<()> {
        if self
            .pending
            .insert(bytenr, RefOp::Add { owner, level })
            .is_some()
        {
            return Err(Error::corrupt(bytenr, "tree block allocated twice"));
        }
        Ok(())
    }

    /// Queues the removal of the block's item; a block whose item was never inserted just
    /// loses its queued insertion.
    pub(crate) fn drop_ref(&mut self, bytenr: u64, level: u8) -> Result<()> {
        match self.pending.remove(&bytenr) {
            Some(RefOp::Add { .. }) => Ok(()),
            Some(RefOp::Drop { .. }) => Err(Error::corrupt(bytenr, "tree block freed twice")),
            None => {
                self.pending.insert(bytenr, RefOp::Drop { level });
                Ok(())
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// The item body of a tree block owned by `owner`, allocated in `generation`.
fn metadata_item(generation: u64, owner: u64) -> Vec<u8> {
    ExtentItem {
        refs: 1,
        generation,
        flags: EXTENT_FLAG_TREE_BLOCK,
        tree_block_info: None,
        inline_refs: vec![InlineRef::TreeBlock { root: owner }],
    }
    .to_bytes()
}

/// Applies the queued ref changes once. Returns true if there were any (applying them may
/// have queued more: call again until it returns false).
pub(crate) fn run_delayed_refs(txn: &mut Transaction<'_>) -> Result<bool> {
    let batch = std::mem::take(&mut txn.refs.pending);
    if batch.is_empty() {
        return Ok(false);
    }
    let transid = txn.transid;
    for (bytenr, op) in batch {
        match op {
            RefOp::Add { owner, level } => {
                let key = Key::new(bytenr, item::METADATA_ITEM, u64::from(level));
                txn.insert_item(objectid::EXTENT_TREE, key, &metadata_item(transid, owner))
                    .map_err(|e| match e {
                        Error::AlreadyExists => {
                            Error::corrupt(bytenr, "extent item exists for a new tree block")
                        }
                        e => e,
                    })?;
            }
            RefOp::Drop { level } => {
                let key = Key::new(bytenr, item::METADATA_ITEM, u64::from(level));
                txn.delete_item(objectid::EXTENT_TREE, &key)
                    .map_err(|e| match e {
                        Error::NotFound => Error::corrupt(
                            bytenr,
                            "freed tree block has no METADATA_ITEM (non-skinny or damaged extent tree)",
                        ),
                        e => e,
                    })?;
            }
        }
    }
    Ok(true)
}

/// Refuses to copy a block some other tree (a snapshot) also references: moving those
/// references (update_ref_for_cow) is not implemented, and getting it wrong corrupts.
pub(crate) fn check_exclusive<S: BlockSource + ?Sized>(
    io: &S,
    extent_root: &TreeRoot,
    tree: u64,
    bytenr: u64,
    level: u8,
    owner: u64,
) -> Result<()> {
    let shared =
        || Error::Unsupported("writing to snapshot-shared metadata is not supported yet".into());
    if owner != tree {
        return Err(shared());
    }
    let key = Key::new(bytenr, item::METADATA_ITEM, u64::from(level));
    let body = ctree::lookup(io, extent_root, &key)?
        .ok_or_else(|| Error::corrupt(bytenr, "tree block has no METADATA_ITEM"))?;
    let ei = ExtentItem::parse(&body, true).map_err(|e| Error::corrupt(bytenr, e.to_string()))?;
    if ei.refs != 1 || ei.flags & EXTENT_FLAG_FULL_BACKREF != 0 {
        return Err(shared());
    }
    Ok(())
}
