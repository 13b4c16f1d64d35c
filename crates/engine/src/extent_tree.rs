//! Back references of tree blocks in the extent tree (skinny metadata: one METADATA_ITEM
//! `(bytenr, 169, level)` per block). Changing the extent tree allocates and frees extent
//! tree blocks itself, so allocations and frees are queued (the kernel's delayed refs) and
//! the queue is run at commit until it stays empty.

use crate::error::{Error, Result};
use crate::transaction::Transaction;
use oleo_format::items::{ExtentItem, InlineRef, EXTENT_FLAG_TREE_BLOCK};
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

/// Where one reference to a data extent comes from: file extent items of inode `objectid`
/// in tree `root` whose `key.offset - extent offset` is `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DataRef {
    pub root: u64,
    pub objectid: u64,
    pub offset: u64,
}

/// Largest EXTENT_ITEM we grow with inline refs before using keyed EXTENT_DATA_REF items.
const MAX_INLINE_EXTENT_ITEM: usize = 512;

fn data_ref_body(r: DataRef, count: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(28);
    out.extend_from_slice(&r.root.to_le_bytes());
    out.extend_from_slice(&r.objectid.to_le_bytes());
    out.extend_from_slice(&r.offset.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out
}

fn keyed_data_ref_key(bytenr: u64, r: DataRef) -> Key {
    Key::new(
        bytenr,
        item::EXTENT_DATA_REF,
        oleo_format::csum::extent_data_ref_hash(r.root, r.objectid, r.offset),
    )
}

impl Transaction<'_> {
    fn data_extent_item(&mut self, bytenr: u64, len: u64) -> Result<Option<ExtentItem>> {
        let key = Key::new(bytenr, item::EXTENT_ITEM, len);
        match self.lookup(objectid::EXTENT_TREE, &key)? {
            None => Ok(None),
            Some(body) => ExtentItem::parse(&body, false)
                .map(Some)
                .map_err(|e| Error::corrupt(bytenr, format!("data extent item: {e}"))),
        }
    }

    /// Adds one reference to the data extent `[bytenr, bytenr + len)`; the first one
    /// creates its EXTENT_ITEM.
    pub(crate) fn add_data_ref(&mut self, bytenr: u64, len: u64, r: DataRef) -> Result<()> {
        let key = Key::new(bytenr, item::EXTENT_ITEM, len);
        let Some(mut ei) = self.data_extent_item(bytenr, len)? else {
            let ei = ExtentItem {
                refs: 1,
                generation: self.transid,
                flags: oleo_format::items::EXTENT_FLAG_DATA,
                tree_block_info: None,
                inline_refs: vec![InlineRef::Data {
                    root: r.root,
                    objectid: r.objectid,
                    offset: r.offset,
                    count: 1,
                }],
            };
            return self.insert_item(objectid::EXTENT_TREE, key, &ei.to_bytes());
        };
        ei.refs = ei
            .refs
            .checked_add(1)
            .ok_or_else(|| Error::corrupt(bytenr, "extent refs overflow"))?;
        let inline = ei.inline_refs.iter_mut().find_map(|x| match x {
            InlineRef::Data {
                root,
                objectid,
                offset,
                count,
            } if *root == r.root && *objectid == r.objectid && *offset == r.offset => Some(count),
            _ => None,
        });
        if let Some(count) = inline {
            *count = count
                .checked_add(1)
                .ok_or_else(|| Error::corrupt(bytenr, "data ref count overflows"))?;
        } else {
            let rkey = keyed_data_ref_key(bytenr, r);
            if let Some(body) = self.lookup(objectid::EXTENT_TREE, &rkey)? {
                let count = u32::from_le_bytes(
                    body.get(24..28)
                        .and_then(|b| b.try_into().ok())
                        .ok_or_else(|| Error::corrupt(bytenr, "short EXTENT_DATA_REF"))?,
                );
                self.replace_item(
                    objectid::EXTENT_TREE,
                    &rkey,
                    &data_ref_body(
                        r,
                        count
                            .checked_add(1)
                            .ok_or_else(|| Error::corrupt(bytenr, "data ref count overflow"))?,
                    ),
                )?;
            } else if ei.encoded_len() + 29 <= MAX_INLINE_EXTENT_ITEM {
                ei.inline_refs.push(InlineRef::Data {
                    root: r.root,
                    objectid: r.objectid,
                    offset: r.offset,
                    count: 1,
                });
                ei.sort_inline_refs();
            } else {
                self.insert_item(objectid::EXTENT_TREE, rkey, &data_ref_body(r, 1))?;
            }
        }
        self.replace_item(objectid::EXTENT_TREE, &key, &ei.to_bytes())
    }

    /// Drops one reference; the last one deletes the extent item, frees (pins) the space
    /// and deletes its checksums.
    pub(crate) fn drop_data_ref(&mut self, bytenr: u64, len: u64, r: DataRef) -> Result<()> {
        let key = Key::new(bytenr, item::EXTENT_ITEM, len);
        let mut ei = self.data_extent_item(bytenr, len)?.ok_or_else(|| {
            Error::corrupt(
                bytenr,
                format!(
                    "file extent of inode {} points at a data extent with no extent item",
                    r.objectid
                ),
            )
        })?;
        let pos = ei.inline_refs.iter().position(|x| {
            matches!(x, InlineRef::Data { root, objectid, offset, .. }
                if *root == r.root && *objectid == r.objectid && *offset == r.offset)
        });
        match pos {
            Some(p) => {
                if let InlineRef::Data { count, .. } = &mut ei.inline_refs[p] {
                    *count -= 1;
                    if *count == 0 {
                        ei.inline_refs.remove(p);
                    }
                }
            }
            None => {
                let rkey = keyed_data_ref_key(bytenr, r);
                let body = self.lookup(objectid::EXTENT_TREE, &rkey)?.ok_or_else(|| {
                    Error::Unsupported(format!(
                        "data extent {bytenr} is referenced through a shared (snapshot) back reference; changing it is not supported yet"
                    ))
                })?;
                let count = u32::from_le_bytes(
                    body.get(24..28)
                        .and_then(|b| b.try_into().ok())
                        .ok_or_else(|| Error::corrupt(bytenr, "short EXTENT_DATA_REF"))?,
                );
                if count <= 1 {
                    self.delete_item(objectid::EXTENT_TREE, &rkey)?;
                } else {
                    self.replace_item(objectid::EXTENT_TREE, &rkey, &data_ref_body(r, count - 1))?;
                }
            }
        }
        ei.refs = ei
            .refs
            .checked_sub(1)
            .ok_or_else(|| Error::corrupt(bytenr, "data extent refs below zero"))?;
        if ei.refs > 0 {
            return self.replace_item(objectid::EXTENT_TREE, &key, &ei.to_bytes());
        }
        self.delete_item(objectid::EXTENT_TREE, &key)?;
        self.delete_csums(bytenr, len)?;
        self.block_groups.free(bytenr, len)
    }
}
