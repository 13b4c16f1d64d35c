//! Back references of blocks shared between subvolumes (snapshots). A snapshot starts as a
//! copy of its source's root node only: everything below is shared, each block counted
//! once per tree that reaches it. When a tree copies a shared block, the references of the
//! block's children (tree blocks and data extents) must say who reaches them now — the
//! kernel's update_ref_for_cow:
//! - the block's owner copies a block others share: the old block becomes FULL_BACKREF (its
//!   children get references by parent address, for the other trees that still reach them
//!   through it); the owner's references by root serve the copy;
//! - another tree copies it: the copy's children get references by root for that tree;
//! - the last tree copies a FULL_BACKREF block: the copy's children get references by root,
//!   the ones by the old parent go.
//!
//! Then the tree drops its own reference to the old block, which is freed only when that was
//! the last one.

use crate::error::{Error, Result};
use crate::transaction::space::delayed_ref::DataRef;
use crate::transaction::Transaction;
use oleo_format::items::{
    ExtentItem, FileExtent, FileExtentBody, InlineRef, EXTENT_FLAG_FULL_BACKREF,
};
use oleo_format::key::{item, objectid, Key};
use oleo_format::TreeBlock;

/// Largest METADATA_ITEM we grow with inline refs before using keyed ref items.
const MAX_INLINE_METADATA_ITEM: usize = 256;

/// A reference to a tree block or data extent: by root, or by parent block address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum By {
    Root(u64),
    Parent(u64),
}

fn corrupt(bytenr: u64, what: impl std::fmt::Display) -> Error {
    Error::corrupt(bytenr, what.to_string())
}

impl Transaction<'_> {
    /// The METADATA_ITEM of a tree block as this transaction sees it.
    pub(crate) fn tree_block_item(&mut self, bytenr: u64, level: u8) -> Result<ExtentItem> {
        let key = Key::new(bytenr, item::METADATA_ITEM, u64::from(level));
        let body = self
            .lookup(objectid::EXTENT_TREE, &key)?
            .ok_or_else(|| corrupt(bytenr, "tree block has no METADATA_ITEM"))?;
        ExtentItem::parse(&body, true).map_err(|e| corrupt(bytenr, e))
    }

    pub(crate) fn put_tree_block_item(
        &mut self,
        bytenr: u64,
        level: u8,
        ei: &ExtentItem,
    ) -> Result<()> {
        let key = Key::new(bytenr, item::METADATA_ITEM, u64::from(level));
        self.replace_item(objectid::EXTENT_TREE, &key, &ei.to_bytes())
    }

    /// Adds one reference to the tree block at `bytenr`.
    fn add_tree_ref(&mut self, bytenr: u64, level: u8, by: By) -> Result<()> {
        let mut ei = self.tree_block_item(bytenr, level)?;
        ei.refs = ei
            .refs
            .checked_add(1)
            .ok_or_else(|| corrupt(bytenr, "extent refs overflow"))?;
        let inline = match by {
            By::Root(root) => InlineRef::TreeBlock { root },
            By::Parent(parent) => InlineRef::SharedBlock { parent },
        };
        if ei.inline_refs.contains(&inline) {
            return Err(corrupt(
                bytenr,
                format!("tree block already has the reference {by:?}"),
            ));
        }
        if ei.encoded_len() + inline.encoded_len() <= MAX_INLINE_METADATA_ITEM {
            ei.inline_refs.push(inline);
            ei.sort_inline_refs();
        } else {
            let (t, off) = match by {
                By::Root(r) => (item::TREE_BLOCK_REF, r),
                By::Parent(p) => (item::SHARED_BLOCK_REF, p),
            };
            self.insert_item(objectid::EXTENT_TREE, Key::new(bytenr, t, off), &[])?;
        }
        self.put_tree_block_item(bytenr, level, &ei)
    }

    /// Drops one reference to the tree block at `bytenr`; true if it was the last (the
    /// item is then deleted; the caller frees the space).
    pub(crate) fn drop_tree_ref(&mut self, bytenr: u64, level: u8, by: By) -> Result<bool> {
        let mut ei = self.tree_block_item(bytenr, level)?;
        let inline = match by {
            By::Root(root) => InlineRef::TreeBlock { root },
            By::Parent(parent) => InlineRef::SharedBlock { parent },
        };
        if let Some(pos) = ei.inline_refs.iter().position(|r| *r == inline) {
            ei.inline_refs.remove(pos);
        } else {
            let (t, off) = match by {
                By::Root(r) => (item::TREE_BLOCK_REF, r),
                By::Parent(p) => (item::SHARED_BLOCK_REF, p),
            };
            match self.delete_item(objectid::EXTENT_TREE, &Key::new(bytenr, t, off)) {
                Err(Error::NotFound) => {
                    return Err(corrupt(
                        bytenr,
                        format!("tree block has no reference {by:?} to drop"),
                    ))
                }
                r => r?,
            }
        }
        ei.refs = ei
            .refs
            .checked_sub(1)
            .ok_or_else(|| corrupt(bytenr, "tree block refs below zero"))?;
        if ei.refs == 0 {
            let key = Key::new(bytenr, item::METADATA_ITEM, u64::from(level));
            self.delete_item(objectid::EXTENT_TREE, &key)?;
            return Ok(true);
        }
        self.put_tree_block_item(bytenr, level, &ei)?;
        Ok(false)
    }

    /// Adds or drops a data extent reference held through a parent block (snapshots).
    fn change_shared_data_ref(
        &mut self,
        bytenr: u64,
        len: u64,
        parent: u64,
        add: bool,
    ) -> Result<()> {
        // Queued changes of this extent go first: they may create its item or hold the
        // references that keep it alive.
        self.run_data_head(bytenr)?;
        let key = Key::new(bytenr, item::EXTENT_ITEM, len);
        let body = self
            .lookup(objectid::EXTENT_TREE, &key)?
            .ok_or_else(|| corrupt(bytenr, "data extent has no extent item"))?;
        let mut ei = ExtentItem::parse(&body, false).map_err(|e| corrupt(bytenr, e))?;
        let pos = ei
            .inline_refs
            .iter()
            .position(|r| matches!(r, InlineRef::SharedData { parent: p, .. } if *p == parent));
        let rkey = Key::new(bytenr, item::SHARED_DATA_REF, parent);
        if add {
            ei.refs = ei
                .refs
                .checked_add(1)
                .ok_or_else(|| corrupt(bytenr, "extent refs overflow"))?;
            if let Some(p) = pos {
                if let InlineRef::SharedData { count, .. } = &mut ei.inline_refs[p] {
                    *count = count
                        .checked_add(1)
                        .ok_or_else(|| corrupt(bytenr, "shared data ref count overflow"))?;
                }
            } else if let Some(b) = self.lookup(objectid::EXTENT_TREE, &rkey)? {
                let c = u32::from_le_bytes(
                    b.get(..4)
                        .and_then(|x| x.try_into().ok())
                        .ok_or_else(|| corrupt(bytenr, "short SHARED_DATA_REF"))?,
                );
                self.replace_item(
                    objectid::EXTENT_TREE,
                    &rkey,
                    &c.checked_add(1)
                        .ok_or_else(|| corrupt(bytenr, "shared data ref count overflow"))?
                        .to_le_bytes(),
                )?;
            } else if ei.encoded_len() + 13 <= MAX_INLINE_METADATA_ITEM * 2 {
                ei.inline_refs
                    .push(InlineRef::SharedData { parent, count: 1 });
                ei.sort_inline_refs();
            } else {
                self.insert_item(objectid::EXTENT_TREE, rkey, &1u32.to_le_bytes())?;
            }
            return self.replace_item(objectid::EXTENT_TREE, &key, &ei.to_bytes());
        }
        if let Some(p) = pos {
            if let InlineRef::SharedData { count, .. } = &mut ei.inline_refs[p] {
                *count -= 1;
                if *count == 0 {
                    ei.inline_refs.remove(p);
                }
            }
        } else {
            let b = self.lookup(objectid::EXTENT_TREE, &rkey)?.ok_or_else(|| {
                corrupt(
                    bytenr,
                    format!("data extent has no shared reference from {parent}"),
                )
            })?;
            let c = u32::from_le_bytes(
                b.get(..4)
                    .and_then(|x| x.try_into().ok())
                    .ok_or_else(|| corrupt(bytenr, "short SHARED_DATA_REF"))?,
            );
            if c <= 1 {
                self.delete_item(objectid::EXTENT_TREE, &rkey)?;
            } else {
                self.replace_item(objectid::EXTENT_TREE, &rkey, &(c - 1).to_le_bytes())?;
            }
        }
        ei.refs = ei
            .refs
            .checked_sub(1)
            .ok_or_else(|| corrupt(bytenr, "data extent refs below zero"))?;
        if ei.refs == 0 {
            // Only a snapshot's last reference can go this way; the extent is then free.
            self.delete_item(objectid::EXTENT_TREE, &key)?;
            self.delete_csums(bytenr, len)?;
            return self.block_groups.free(bytenr, len);
        }
        self.replace_item(objectid::EXTENT_TREE, &key, &ei.to_bytes())
    }

    /// Adds (or drops) one reference for every child of `block`: tree blocks below a node,
    /// data extents of a leaf. `by_parent`: references by this block's address (FULL_BACKREF);
    /// otherwise by root `tree`.
    pub(crate) fn change_child_refs(
        &mut self,
        block: &[u8],
        tree: u64,
        by_parent: bool,
        add: bool,
    ) -> Result<()> {
        let tb = TreeBlock::new(block).map_err(|e| corrupt(0, e))?;
        let (bytenr, level) = (tb.bytenr(), tb.level());
        let by = if by_parent {
            By::Parent(bytenr)
        } else {
            By::Root(tree)
        };
        if level > 0 {
            for slot in 0..tb.nritems() {
                let ptr = tb.key_ptr(slot).map_err(|e| corrupt(bytenr, e))?;
                if add {
                    self.add_tree_ref(ptr.blockptr, level - 1, by)?;
                } else if self.drop_tree_ref(ptr.blockptr, level - 1, by)? {
                    return Err(corrupt(
                        ptr.blockptr,
                        "a child lost its last reference while its parent still holds it",
                    ));
                }
            }
            return Ok(());
        }
        for slot in 0..tb.nritems() {
            let key = tb.key_at(slot).map_err(|e| corrupt(bytenr, e))?;
            if key.item_type != item::EXTENT_DATA {
                continue;
            }
            let body = tb.item_data(slot).map_err(|e| corrupt(bytenr, e))?;
            let fe = FileExtent::parse(body).map_err(|e| corrupt(bytenr, e))?;
            let FileExtentBody::Extent {
                disk_bytenr,
                disk_num_bytes,
                offset,
                ..
            } = fe.body
            else {
                continue;
            };
            if disk_bytenr == 0 {
                continue;
            }
            match (by_parent, add) {
                (true, a) => self.change_shared_data_ref(disk_bytenr, disk_num_bytes, bytenr, a)?,
                (false, true) => self.add_data_ref(
                    disk_bytenr,
                    disk_num_bytes,
                    DataRef {
                        root: tree,
                        objectid: key.objectid,
                        offset: key.offset.wrapping_sub(offset),
                    },
                )?,
                (false, false) => self.drop_data_ref(
                    disk_bytenr,
                    disk_num_bytes,
                    DataRef {
                        root: tree,
                        objectid: key.objectid,
                        offset: key.offset.wrapping_sub(offset),
                    },
                )?,
            }
        }
        Ok(())
    }

    /// Gives every child of `block`, the root block of the new snapshot `tree`, a
    /// reference from `tree` (the kernel's btrfs_inc_ref).
    pub(crate) fn add_child_refs(&mut self, block: &[u8], tree: u64) -> Result<()> {
        self.change_child_refs(block, tree, false, true)
    }

    /// Before tree `tree` copies the old block `old`: moves the children's references as
    /// described at the top. Returns true if `tree`'s reference was the block's last, so
    /// the old block's space is freed; false if other trees still reach it (then only the
    /// reference is dropped, see `drop_shared_block`).
    pub(crate) fn update_ref_for_cow(&mut self, tree: u64, old: &[u8]) -> Result<bool> {
        let tb = TreeBlock::new(old).map_err(|e| corrupt(0, e))?;
        let (bytenr, level, owner, generation) =
            (tb.bytenr(), tb.level(), tb.owner(), tb.generation());
        if !self.can_be_shared(tree, bytenr, generation)? {
            return Ok(true);
        }
        let ei = self.tree_block_item(bytenr, level)?;
        let full = ei.flags & EXTENT_FLAG_FULL_BACKREF != 0;
        if ei.refs > 1 {
            if owner == tree && !full {
                // Others keep reaching the children through the old block, by its address;
                // our references by root now serve the copy.
                self.change_child_refs(old, tree, true, true)?;
                let mut ei = self.tree_block_item(bytenr, level)?;
                ei.flags |= EXTENT_FLAG_FULL_BACKREF;
                self.put_tree_block_item(bytenr, level, &ei)?;
            } else {
                self.change_child_refs(old, tree, false, true)?;
            }
            return Ok(false);
        }
        if full {
            self.change_child_refs(old, tree, false, true)?;
            self.change_child_refs(old, tree, true, false)?;
        }
        Ok(true)
    }

    /// Drops `tree`'s reference to a block other trees still share (after copying it).
    pub(crate) fn drop_shared_block(&mut self, bytenr: u64, level: u8, tree: u64) -> Result<()> {
        if self.drop_tree_ref(bytenr, level, By::Root(tree))? {
            return Err(corrupt(bytenr, "a shared block lost its last reference"));
        }
        Ok(())
    }

    /// Whether a block may be referenced by more than one tree: only below the root of a
    /// subvolume tree, and only if written before the subvolume's last snapshot.
    fn can_be_shared(&mut self, tree: u64, bytenr: u64, generation: u64) -> Result<bool> {
        if !objectid::is_fs_tree(tree) {
            return Ok(false);
        }
        if self.roots.get(&tree).is_some_and(|r| r.bytenr == bytenr) {
            return Ok(false);
        }
        let last_snapshot = self.last_snapshot(tree)?;
        Ok(generation <= last_snapshot)
    }
}
