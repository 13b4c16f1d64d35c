//! Dropping a deleted subvolume's tree (the kernel's btrfs_drop_snapshot, run by its
//! cleaner): every block only this tree reaches is freed with the references it holds;
//! a block others share loses this tree's reference only (after its children's
//! references, if they named this tree, move to the block's address).
//!
//! One step drops the subtree under one slot of the root and records the next slot's key
//! as drop_progress, with the root's level as drop_level: the subtrees under the root's
//! slots before that key are gone, as `btrfs check` and the kernel read it; a crash or an
//! unmount resumes there. The last step frees the root and deletes the ROOT_ITEM and the
//! orphan item. Steps run in transactions of their own (see `clean_step`).

use crate::ctree::BlockSource;
use crate::error::{Error, Result};
use crate::transaction::space::backref::By;
use crate::transaction::Transaction;
use oleo_format::items::EXTENT_FLAG_FULL_BACKREF;
use oleo_format::key::{item, objectid, Key};
use oleo_format::TreeBlock;
use std::ops::ControlFlow;

/// Metadata one step may change: an extent item per block of one subtree, at most.
pub(crate) const STEP_ITEMS: u64 = 64;

impl crate::transaction::fs::FsCore {
    /// The lowest subvolume waiting to be dropped (an orphan item in the root tree).
    pub(crate) fn next_dead_root(&self) -> Result<Option<u64>> {
        let mut found = None;
        crate::ctree::for_each_in_range(
            self,
            &self.root_tree(),
            Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, 0),
            Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, u64::MAX),
            |k, _| {
                found = Some(k.offset);
                Ok(ControlFlow::Break(()))
            },
        )?;
        Ok(found)
    }
}

fn corrupt(bytenr: u64, what: impl std::fmt::Display) -> Error {
    Error::corrupt(bytenr, what.to_string())
}

impl Transaction<'_> {
    pub(crate) fn drop_step(&mut self, id: u64) -> Result<()> {
        let orphan = Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, id);
        // Found in the root tree directly: `subvol_item` would take the tree into this
        // transaction's roots, and a later step would then take it for a changed tree.
        let mut found = None;
        self.for_each_in_range(
            objectid::ROOT_TREE,
            Key::new(id, item::ROOT_ITEM, 0),
            Key::new(id, item::ROOT_ITEM, u64::MAX),
            |k, b| {
                found = Some((k, b.to_vec()));
                Ok(ControlFlow::Break(()))
            },
        )?;
        let Some((key, body)) = found else {
            // An orphan item without its root: nothing left to drop.
            return self.delete_item(objectid::ROOT_TREE, &orphan);
        };
        let mut ri = oleo_format::items::RootItem::parse(&body)
            .map_err(|e| corrupt(0, format!("root item of tree {id}: {e}")))?;
        if ri.refs != 0 {
            return Err(corrupt(
                0,
                format!("subvolume {id} is an orphan but still referenced"),
            ));
        }
        let root = self.read_tree_block(ri.bytenr, Some(ri.level), Some(ri.generation), None)?;
        let tb = TreeBlock::new(&root).map_err(|e| corrupt(ri.bytenr, e))?;
        if ri.level > 0 {
            let start = if ri.drop_progress == Key::new(0, 0, 0) && ri.drop_level == 0 {
                0
            } else {
                (0..tb.nritems())
                    .find(|&s| tb.key_ptr(s).is_ok_and(|p| p.key >= ri.drop_progress))
                    .unwrap_or(tb.nritems())
            };
            if start < tb.nritems() {
                let full = self.tree_block_item(ri.bytenr, ri.level)?.flags
                    & EXTENT_FLAG_FULL_BACKREF
                    != 0;
                let ptr = tb.key_ptr(start).map_err(|e| corrupt(ri.bytenr, e))?;
                let by = if full {
                    By::Parent(ri.bytenr)
                } else {
                    By::Root(id)
                };
                self.drop_subtree(id, ptr.blockptr, ri.level - 1, ptr.generation, by)?;
                match tb.key_ptr(start + 1) {
                    Ok(next) if start + 1 < tb.nritems() => {
                        // As the kernel records it: in the node at drop_level (the root),
                        // the slot to go on with; those before it are gone.
                        ri.drop_progress = next.key;
                        ri.drop_level = ri.level;
                        return self.put_subvol_item(&key, &ri);
                    }
                    _ => {}
                }
            }
        } else {
            let full = self.tree_block_item(ri.bytenr, 0)?.flags & EXTENT_FLAG_FULL_BACKREF != 0;
            self.change_child_refs(&root, id, full, false)?;
        }
        // Everything below is gone: the root goes, then the subvolume's last items.
        if !self.drop_tree_ref(ri.bytenr, ri.level, By::Root(id))? {
            return Err(corrupt(ri.bytenr, "a dead subvolume's root is shared"));
        }
        let size = u64::from(self.nodesize);
        self.block_groups.free(ri.bytenr, size)?;
        self.delete_item(objectid::ROOT_TREE, &key)?;
        self.delete_item(objectid::ROOT_TREE, &orphan)?;
        self.forget_root(id);
        Ok(())
    }

    /// Drops tree `tree`'s reference (`by`) to the block at `bytenr`, and with it the whole
    /// subtree if that reference was the only one.
    fn drop_subtree(
        &mut self,
        tree: u64,
        bytenr: u64,
        level: u8,
        generation: u64,
        by: By,
    ) -> Result<()> {
        let block = self.read_tree_block(bytenr, Some(level), Some(generation), None)?;
        let owner = TreeBlock::new(&block)
            .map_err(|e| corrupt(bytenr, e))?
            .owner();
        let mut ei = self.tree_block_item(bytenr, level)?;
        let full = ei.flags & EXTENT_FLAG_FULL_BACKREF != 0;
        if ei.refs > 1 {
            if owner == tree && !full {
                // The children's references name this tree; the others reach them through
                // this block: they are re-keyed to its address first.
                self.change_child_refs(&block, tree, true, true)?;
                self.change_child_refs(&block, tree, false, false)?;
                ei = self.tree_block_item(bytenr, level)?;
                ei.flags |= EXTENT_FLAG_FULL_BACKREF;
                self.put_tree_block_item(bytenr, level, &ei)?;
            }
            if self.drop_tree_ref(bytenr, level, by)? {
                return Err(corrupt(bytenr, "a shared block lost its last reference"));
            }
            return Ok(());
        }
        if level > 0 {
            let tb = TreeBlock::new(&block).map_err(|e| corrupt(bytenr, e))?;
            let child_by = if full {
                By::Parent(bytenr)
            } else {
                By::Root(tree)
            };
            for slot in 0..tb.nritems() {
                let ptr = tb.key_ptr(slot).map_err(|e| corrupt(bytenr, e))?;
                self.drop_subtree(tree, ptr.blockptr, level - 1, ptr.generation, child_by)?;
            }
        } else {
            self.change_child_refs(&block, tree, full, false)?;
        }
        if !self.drop_tree_ref(bytenr, level, by)? {
            return Err(corrupt(
                bytenr,
                "a block only one tree reaches has other references",
            ));
        }
        let size = u64::from(self.nodesize);
        self.block_groups.free(bytenr, size)
    }
}
