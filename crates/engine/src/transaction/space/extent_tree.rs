//! The extent tree's back references: applying the queued changes of `delayed_ref` at
//! commit. Tree blocks have skinny METADATA_ITEMs `(bytenr, 169, level)`; a data extent
//! has an EXTENT_ITEM `(bytenr, 168, len)` with its references inline while the item stays
//! small, then as keyed EXTENT_DATA_REF items.

use crate::error::{Error, Result};
use crate::transaction::space::delayed_ref::{DataHead, DataRef, TreeRefOp};
use crate::transaction::Transaction;
use oleo_format::items::{ExtentItem, InlineRef, EXTENT_FLAG_TREE_BLOCK};
use oleo_format::key::{item, objectid, Key};

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
    let tree = txn.refs.take_tree();
    let data = txn.refs.take_data();
    if tree.is_empty() && data.is_empty() {
        return Ok(false);
    }
    let transid = txn.transid;
    for (bytenr, op) in tree {
        match op {
            TreeRefOp::Add { owner, level } => {
                let key = Key::new(bytenr, item::METADATA_ITEM, u64::from(level));
                txn.insert_item(objectid::EXTENT_TREE, key, &metadata_item(transid, owner))
                    .map_err(|e| match e {
                        Error::AlreadyExists => {
                            Error::corrupt(bytenr, "extent item exists for a new tree block")
                        }
                        e => e,
                    })?;
            }
            TreeRefOp::Drop { level } => {
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
    for (bytenr, head) in data {
        txn.apply_data_head(bytenr, head)?;
    }
    Ok(true)
}

/// Largest EXTENT_ITEM we grow with inline refs before using keyed EXTENT_DATA_REF items.
const MAX_INLINE_EXTENT_ITEM: usize = 512;

/// Bytes an inline data reference adds to an EXTENT_ITEM (type byte and body).
const INLINE_DATA_REF_LEN: usize = 29;

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

fn keyed_count(bytenr: u64, body: &[u8]) -> Result<u32> {
    body.get(24..28)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| Error::corrupt(bytenr, "short EXTENT_DATA_REF"))
}

fn inline_count(ei: &mut ExtentItem, r: DataRef) -> Option<&mut u32> {
    ei.inline_refs.iter_mut().find_map(|x| match x {
        InlineRef::Data {
            root,
            objectid,
            offset,
            count,
        } if *root == r.root && *objectid == r.objectid && *offset == r.offset => Some(count),
        _ => None,
    })
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

    /// Applies the queued changes of one data extent now (before something reads or
    /// changes its item directly).
    pub(crate) fn run_data_head(&mut self, bytenr: u64) -> Result<()> {
        match self.refs.take_data_head(bytenr) {
            Some(head) => self.apply_data_head(bytenr, head),
            None => Ok(()),
        }
    }

    /// Applies one extent's net reference changes with one read and one write of its item;
    /// the last reference gone deletes the item and its checksums and frees the space.
    fn apply_data_head(&mut self, bytenr: u64, head: DataHead) -> Result<()> {
        let len = head.len;
        let key = Key::new(bytenr, item::EXTENT_ITEM, len);
        let existing = self.data_extent_item(bytenr, len)?;
        let adds: Vec<(DataRef, u32)> = head
            .refs
            .iter()
            .filter(|(_, &d)| d > 0)
            .map(|(&r, &d)| (r, d as u32))
            .collect();
        let drops: Vec<(DataRef, u32)> = head
            .refs
            .iter()
            .filter(|(_, &d)| d < 0)
            .map(|(&r, &d)| (r, d.unsigned_abs() as u32))
            .collect();
        let found = existing.is_some();
        let mut ei = match existing {
            Some(ei) => ei,
            None if adds.is_empty() && drops.is_empty() => {
                // Written and unreferenced again within this transaction.
                self.delete_csums(bytenr, len)?;
                return self.block_groups.free(bytenr, len);
            }
            None if !drops.is_empty() => {
                return Err(Error::corrupt(
                    bytenr,
                    format!(
                        "file extent of inode {} points at a data extent with no extent item",
                        drops[0].0.objectid
                    ),
                ))
            }
            None => ExtentItem {
                refs: 0,
                generation: self.transid,
                flags: oleo_format::items::EXTENT_FLAG_DATA,
                tree_block_info: None,
                inline_refs: Vec::new(),
            },
        };
        if adds.is_empty() && drops.is_empty() {
            return Ok(());
        }
        for &(r, n) in &adds {
            self.add_data_refs(bytenr, &mut ei, r, n)?;
        }
        for &(r, n) in &drops {
            self.drop_data_refs(bytenr, &mut ei, r, n)?;
        }
        match (ei.refs, found) {
            (0, true) => {
                self.delete_item(objectid::EXTENT_TREE, &key)?;
                self.delete_csums(bytenr, len)?;
                self.block_groups.free(bytenr, len)
            }
            (0, false) => Err(Error::corrupt(bytenr, "new data extent with no references")),
            (_, true) => self.replace_item(objectid::EXTENT_TREE, &key, &ei.to_bytes()),
            (_, false) => self.insert_item(objectid::EXTENT_TREE, key, &ei.to_bytes()),
        }
    }

    /// Adds `n` references from `r`: inline while the item stays small, else keyed.
    fn add_data_refs(
        &mut self,
        bytenr: u64,
        ei: &mut ExtentItem,
        r: DataRef,
        n: u32,
    ) -> Result<()> {
        let overflow = || Error::corrupt(bytenr, "data extent refs overflow");
        ei.refs = ei.refs.checked_add(u64::from(n)).ok_or_else(overflow)?;
        if let Some(count) = inline_count(ei, r) {
            *count = count.checked_add(n).ok_or_else(overflow)?;
            return Ok(());
        }
        let rkey = keyed_data_ref_key(bytenr, r);
        if let Some(body) = self.lookup(objectid::EXTENT_TREE, &rkey)? {
            let count = keyed_count(bytenr, &body)?
                .checked_add(n)
                .ok_or_else(overflow)?;
            self.replace_item(objectid::EXTENT_TREE, &rkey, &data_ref_body(r, count))
        } else if ei.encoded_len() + INLINE_DATA_REF_LEN <= MAX_INLINE_EXTENT_ITEM {
            ei.inline_refs.push(InlineRef::Data {
                root: r.root,
                objectid: r.objectid,
                offset: r.offset,
                count: n,
            });
            ei.sort_inline_refs();
            Ok(())
        } else {
            self.insert_item(objectid::EXTENT_TREE, rkey, &data_ref_body(r, n))
        }
    }

    /// Drops `n` references from `r`, inline or keyed.
    fn drop_data_refs(
        &mut self,
        bytenr: u64,
        ei: &mut ExtentItem,
        r: DataRef,
        n: u32,
    ) -> Result<()> {
        let below_zero = || Error::corrupt(bytenr, "data extent refs below zero");
        ei.refs = ei.refs.checked_sub(u64::from(n)).ok_or_else(below_zero)?;
        if let Some(count) = inline_count(ei, r) {
            *count = count.checked_sub(n).ok_or_else(below_zero)?;
            if *count == 0 {
                ei.inline_refs
                    .retain(|x| !matches!(x, InlineRef::Data { count: 0, .. }));
            }
            return Ok(());
        }
        let rkey = keyed_data_ref_key(bytenr, r);
        let body = self.lookup(objectid::EXTENT_TREE, &rkey)?.ok_or_else(|| {
            Error::Unsupported(format!(
                "data extent {bytenr} is referenced through a shared (snapshot) back reference; changing it is not supported yet"
            ))
        })?;
        let count = keyed_count(bytenr, &body)?
            .checked_sub(n)
            .ok_or_else(below_zero)?;
        if count == 0 {
            self.delete_item(objectid::EXTENT_TREE, &rkey)
        } else {
            self.replace_item(objectid::EXTENT_TREE, &rkey, &data_ref_body(r, count))
        }
    }
}
