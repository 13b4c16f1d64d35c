//! Raw access to trees for inspection tools (`oleo dump-tree`): every block of a tree, in
//! depth-first order, already verified.

use crate::ctree::TreeRoot;
use crate::error::{Error, Result};
use crate::io::disk_io::Block;
use crate::transaction::fs::FsCore;
use oleo_format::key::{item, objectid, Key};
use oleo_format::TreeBlock;
use std::ops::ControlFlow;

impl FsCore {
    /// The root of tree `id`: the chunk, root and log-root trees come from the superblock,
    /// every other tree from its ROOT_ITEM.
    pub(crate) fn tree_root(&self, id: u64) -> Result<Option<TreeRoot>> {
        let sb = &self.sb;
        Ok(match id {
            objectid::ROOT_TREE => Some(self.root_tree()),
            objectid::CHUNK_TREE => Some(TreeRoot {
                id,
                bytenr: sb.chunk_root,
                level: sb.chunk_root_level,
                generation: sb.chunk_root_generation,
            }),
            objectid::TREE_LOG if sb.log_root != 0 => Some(TreeRoot {
                id,
                bytenr: sb.log_root,
                level: sb.log_root_level,
                generation: sb.generation + 1,
            }),
            objectid::TREE_LOG => None,
            _ => self.read_root_item(id)?.map(|(r, _)| r),
        })
    }

    /// Ids of every tree with a ROOT_ITEM, plus the chunk and root trees.
    pub(crate) fn tree_ids(&self) -> Result<Vec<u64>> {
        let mut ids = vec![objectid::ROOT_TREE, objectid::CHUNK_TREE];
        crate::ctree::for_each_in_range(self, &self.root_tree(), Key::MIN, Key::MAX, |key, _| {
            if key.item_type == item::ROOT_ITEM && !ids.contains(&key.objectid) {
                ids.push(key.objectid);
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(ids)
    }

    /// Calls `f` with each block of the tree, parents before children. A block that fails
    /// verification is reported to `on_error` and its subtree skipped, so a damaged tree
    /// still shows everything readable.
    pub(crate) fn walk_tree(
        &self,
        root: &TreeRoot,
        f: &mut dyn FnMut(TreeBlock<'_>),
        on_error: &mut dyn FnMut(&Error),
    ) -> Result<()> {
        let block = crate::ctree::BlockSource::read_tree_block(
            self,
            root.bytenr,
            Some(root.level),
            Some(root.generation),
            None,
        )?;
        self.walk_block(&block, f, on_error, 0)
    }

    fn walk_block(
        &self,
        block: &Block,
        f: &mut dyn FnMut(TreeBlock<'_>),
        on_error: &mut dyn FnMut(&Error),
        depth: usize,
    ) -> Result<()> {
        let tb = TreeBlock::new(block).map_err(|e| Error::corrupt(0, e.to_string()))?;
        f(tb);
        if tb.is_leaf() || depth > 8 {
            return Ok(());
        }
        for slot in 0..tb.nritems() {
            let p = tb
                .key_ptr(slot)
                .map_err(|e| Error::corrupt(tb.bytenr(), e.to_string()))?;
            match crate::ctree::BlockSource::read_tree_block(
                self,
                p.blockptr,
                Some(tb.level() - 1),
                Some(p.generation),
                Some(p.key),
            ) {
                Ok(child) => self.walk_block(&child, f, on_error, depth + 1)?,
                Err(e) => on_error(&e),
            }
        }
        Ok(())
    }
}
