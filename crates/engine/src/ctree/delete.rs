//! Deleting items: one by key, or every item in a key range, leaf by leaf.

use super::balance::rebalance;
use super::path::{descend, fixup_low_keys, next_key_after_leaf, Need, PathLevel, WritePath};
use super::search::TreeRoot;
use super::store::{corrupt_at, leaf_mut, BlockStore};
use crate::error::{Error, Result};
use oleo_format::key::Key;

/// Deletes the item with this key. `NotFound` if there is none.
pub fn delete_item<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    key: &Key,
) -> Result<()> {
    let d = descend(store, root, key, Need::Nothing)?;
    if !d.path.found {
        return Err(Error::NotFound);
    }
    remove_from_leaf(store, root, &d.path, 1)
}

/// Deletes every item with `min <= key <= max`; returns how many there were.
pub fn delete_range<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    min: Key,
    max: Key,
) -> Result<usize> {
    let mut deleted = 0;
    let mut from = min;
    while from <= max {
        let d = descend(store, root, &from, Need::Nothing)?;
        let PathLevel { bytenr, slot } = d.path.leaf();
        let (in_range, leaf_len) = {
            let leaf = leaf_mut(store, bytenr)?;
            let n = leaf.nritems();
            let mut end = slot;
            while end < n && leaf.key(end).map_err(corrupt_at(bytenr))? <= max {
                end += 1;
            }
            (end - slot, n)
        };
        if in_range > 0 {
            remove_from_leaf(store, root, &d.path, in_range)?;
            deleted += in_range;
            if slot + in_range < leaf_len {
                break; // stopped at a key past `max`
            }
            continue; // the leaf's tail is gone: search again from the same key
        }
        if slot < leaf_len {
            break; // the first key at or after `from` is past `max`
        }
        // Nothing at or after `from` in this leaf: go on with the next leaf's first key.
        match next_key_after_leaf(store, &d.path)? {
            Some(next) if next > from => from = next,
            _ => break,
        }
    }
    Ok(deleted)
}

/// Removes `count` items at the slot of a path from `search_for_write`, then fixes parent
/// keys and rebalances (the kernel's btrfs_del_items). The path is spent afterwards.
#[cfg(test)]
pub(crate) fn delete_items_at<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    path: &WritePath,
    count: usize,
) -> Result<()> {
    remove_from_leaf(store, root, path, count)
}

fn remove_from_leaf<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    path: &WritePath,
    count: usize,
) -> Result<()> {
    let PathLevel { bytenr, slot } = path.leaf();
    let new_first = {
        let mut leaf = leaf_mut(store, bytenr)?;
        leaf.remove_items(slot, count).map_err(corrupt_at(bytenr))?;
        if slot == 0 && leaf.nritems() > 0 {
            Some(leaf.key(0).map_err(corrupt_at(bytenr))?)
        } else {
            None
        }
    };
    if let Some(key) = new_first {
        fixup_low_keys(store, path, 1, key)?;
    }
    rebalance(store, root, path)
}
