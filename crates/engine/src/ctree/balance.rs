//! After items leave a leaf: emptied blocks are dropped from their parents (up the path),
//! under-filled blocks merge with a neighbour under the same parent when both fit in one,
//! and a root node left with a single child gives way to that child. Nothing in the format
//! needs a minimum fill; merging only keeps trees from thinning out.

use super::cow::cow_child;
use super::path::{fixup_low_keys, PathLevel, WritePath};
use super::search::TreeRoot;
use super::store::{block_fill, corrupt_at, dirty, fill_of, node_mut, view, BlockStore};
use crate::error::{Error, Result};
use oleo_format::leaf_builder::{leaf_data_size, max_node_ptrs};
use oleo_format::tree_mut::{LeafMut, NodeMut};

/// Rebalances bottom-up along `path`, whose leaf just lost items or bytes.
pub(crate) fn rebalance<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    path: &WritePath,
) -> Result<()> {
    let height = path.levels.len();
    let mut level = 0;
    while level + 1 < height {
        let here = path.levels[level];
        let parent = path.levels[level + 1];
        let n = view(store, here.bytenr)?.nritems();
        if n == 0 {
            if only_child_chain(store, path, level)? {
                return collapse_to_empty_leaf(store, root, path);
            }
            remove_child(store, path, level + 1, parent.slot)?;
            store.free(here.bytenr, root.id, level as u8)?;
        } else if !(under_filled(store, here.bytenr)?
            && merge_with_neighbour(store, root, path, level)?)
        {
            break;
        }
        level += 1;
    }
    collapse_root(store, root)
}

/// True when every block above `level` has this one as its only child.
fn only_child_chain<S: BlockStore + ?Sized>(
    store: &mut S,
    path: &WritePath,
    level: usize,
) -> Result<bool> {
    for pl in path.levels.iter().skip(level + 1) {
        if view(store, pl.bytenr)?.nritems() != 1 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The last item of the tree is gone: the emptied leaf becomes the root.
fn collapse_to_empty_leaf<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    path: &WritePath,
) -> Result<()> {
    let leaf = path.leaf().bytenr;
    if !view(store, leaf)?.is_leaf() {
        return Err(Error::corrupt(leaf, "empty node at the bottom of a path"));
    }
    for (level, pl) in path.levels.iter().enumerate().skip(1) {
        store.free(pl.bytenr, root.id, level as u8)?;
    }
    root.bytenr = leaf;
    root.level = 0;
    root.generation = store.transid();
    Ok(())
}

/// Removes pointer `slot` from the node at `level` of the path, fixing keys above if the
/// node's first key changed.
fn remove_child<S: BlockStore + ?Sized>(
    store: &mut S,
    path: &WritePath,
    level: usize,
    slot: usize,
) -> Result<()> {
    let PathLevel { bytenr, .. } = path.levels[level];
    let new_first = {
        let mut node = node_mut(store, bytenr)?;
        node.remove_ptr(slot).map_err(corrupt_at(bytenr))?;
        if slot == 0 && node.nritems() > 0 {
            Some(node.key(0).map_err(corrupt_at(bytenr))?)
        } else {
            None
        }
    };
    match new_first {
        Some(key) => fixup_low_keys(store, path, level + 1, key),
        None => Ok(()),
    }
}

/// Leaves under a third full, nodes under a quarter (the kernel's thresholds, roughly).
fn under_filled<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64) -> Result<bool> {
    let nodesize = store.nodesize();
    let block = view(store, bytenr)?;
    let fill = fill_of(block.bytes(), bytenr)?;
    Ok(if block.is_leaf() {
        fill * 3 < leaf_data_size(nodesize)
    } else {
        fill * 4 < max_node_ptrs(nodesize)
    })
}

/// Whether two blocks with these fills fit in one. Merged nodes keep the headroom the
/// descent wants, so the next insert does not split them right away.
fn fit_together(nodesize: u32, is_leaf: bool, a: usize, b: usize) -> bool {
    if is_leaf {
        a + b <= leaf_data_size(nodesize)
    } else {
        a + b + 4 <= max_node_ptrs(nodesize)
    }
}

/// Merges the block at `level` of the path with its right or left neighbour. Both must be
/// dirty to be edited, so the neighbour is copied first; this also lets the extent layer see
/// (through `on_cow`) every block whose contents move. True when a merge happened.
fn merge_with_neighbour<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &TreeRoot,
    path: &WritePath,
    level: usize,
) -> Result<bool> {
    let here = path.levels[level];
    let parent = path.levels[level + 1];
    let nodesize = store.nodesize();
    let is_leaf = level == 0;
    let own_fill = fill_of(dirty(store, here.bytenr)?, here.bytenr)?;
    let siblings = view(store, parent.bytenr)?.nritems();
    let child_level = level as u8;
    let sibling = |store: &mut S, slot: usize| {
        view(store, parent.bytenr)?
            .key_ptr(slot)
            .map_err(corrupt_at(parent.bytenr))
    };

    if parent.slot + 1 < siblings {
        let ptr = sibling(store, parent.slot + 1)?;
        if fit_together(
            nodesize,
            is_leaf,
            own_fill,
            block_fill(store, &ptr, child_level)?,
        ) {
            let right = cow_child(store, root.id, parent.bytenr, parent.slot + 1, child_level)?;
            let mut copy = dirty(store, right)?.to_vec();
            move_all(&mut copy, dirty(store, here.bytenr)?, is_leaf, here.bytenr)?;
            remove_child(store, path, level + 1, parent.slot + 1)?;
            store.free(right, root.id, child_level)?;
            return Ok(true);
        }
    }
    if parent.slot > 0 {
        let ptr = sibling(store, parent.slot - 1)?;
        if fit_together(
            nodesize,
            is_leaf,
            own_fill,
            block_fill(store, &ptr, child_level)?,
        ) {
            let left = cow_child(store, root.id, parent.bytenr, parent.slot - 1, child_level)?;
            let mut copy = dirty(store, left)?.to_vec();
            move_all(dirty(store, here.bytenr)?, &mut copy, is_leaf, here.bytenr)?;
            store.insert_dirty(left, copy)?;
            remove_child(store, path, level + 1, parent.slot)?;
            store.free(here.bytenr, root.id, child_level)?;
            return Ok(true);
        }
    }
    Ok(false)
}

/// Moves everything in `src` to the end of `dst` (its left neighbour).
fn move_all(src: &mut [u8], dst: &mut [u8], is_leaf: bool, bytenr: u64) -> Result<()> {
    let err = corrupt_at(bytenr);
    if is_leaf {
        let mut from = LeafMut::new(src).map_err(&err)?;
        let n = from.nritems();
        from.move_head_to(n, &mut LeafMut::new(dst).map_err(&err)?)
            .map_err(&err)
    } else {
        let mut from = NodeMut::new(src).map_err(&err)?;
        let n = from.nritems();
        from.move_head_to(n, &mut NodeMut::new(dst).map_err(&err)?)
            .map_err(&err)
    }
}

/// While the root is a node with a single child, that child becomes the root.
pub(crate) fn collapse_root<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
) -> Result<()> {
    while root.level > 0 && view(store, root.bytenr)?.nritems() == 1 {
        let old = root.bytenr;
        let child = cow_child(store, root.id, old, 0, root.level - 1)?;
        store.free(old, root.id, root.level)?;
        root.bytenr = child;
        root.level -= 1;
        root.generation = store.transid();
    }
    Ok(())
}
