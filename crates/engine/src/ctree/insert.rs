//! Creating trees, inserting items and changing them in place.

use super::balance::rebalance;
use super::path::{descend, fixup_low_keys, Need, PathLevel};
use super::search::{BlockSource, Cursor, TreeRoot};
use super::store::{corrupt_at, leaf_mut, new_block, BlockStore};
use crate::error::{Error, Result};
use oleo_format::key::Key;
use oleo_format::leaf_builder::max_item_size;
use oleo_format::tree_mut::LeafMut;
use oleo_format::FormatError;

/// A new tree `tree_id` holding nothing: an empty leaf as its root.
pub fn new_tree<S: BlockStore + ?Sized>(store: &mut S, tree_id: u64) -> Result<TreeRoot> {
    let (bytenr, block) = new_block(store, tree_id, 0, 0)?;
    store.insert_dirty(bytenr, block)?;
    Ok(TreeRoot {
        id: tree_id,
        bytenr,
        level: 0,
        generation: store.transid(),
    })
}

/// Inserts one item. `AlreadyExists` if the key is taken.
pub fn insert_item<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    key: Key,
    data: &[u8],
) -> Result<()> {
    insert_items(store, root, &[(key, data)])
}

/// Inserts items with strictly increasing keys, as few descents as the tree allows (one per
/// run of keys that land in the same leaf).
pub fn insert_items<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    items: &[(Key, &[u8])],
) -> Result<()> {
    let specs: Vec<(Key, usize)> = items.iter().map(|(k, d)| (*k, d.len())).collect();
    insert_empty_items(store, root, &specs, |i, body| {
        if let Some((_, data)) = items.get(i) {
            body.copy_from_slice(data);
        }
        Ok(())
    })
}

/// Inserts items (strictly increasing keys, body lengths) and lets `fill(index, body)` write
/// each zeroed body in place. On `AlreadyExists` the items before the clashing key's run may
/// already be in the tree.
pub fn insert_empty_items<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    items: &[(Key, usize)],
    mut fill: impl FnMut(usize, &mut [u8]) -> Result<()>,
) -> Result<()> {
    let max = max_item_size(store.nodesize());
    if let Some((k, len)) = items.iter().find(|(_, len)| *len > max) {
        return Err(Error::InvalidArgument(format!(
            "item {k:?} of {len} bytes is larger than the {max} a leaf holds"
        )));
    }
    if items.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(Error::InvalidArgument(
            "items to insert must have strictly increasing keys".into(),
        ));
    }
    let mut done = 0;
    while let Some(rest) = items.get(done..).filter(|r| !r.is_empty()) {
        let first = rest[0].0;
        let d = descend(store, root, &first, Need::Batch(rest))?;
        if d.path.found {
            return Err(Error::AlreadyExists);
        }
        let count = d.batch_count;
        if count == 0 {
            return Err(Error::corrupt(
                d.path.leaf().bytenr,
                "no room made for an insert",
            ));
        }
        let PathLevel { bytenr, slot } = d.path.leaf();
        {
            let mut leaf = leaf_mut(store, bytenr)?;
            leaf.insert_items(slot, &rest[..count])
                .map_err(corrupt_at(bytenr))?;
            for i in 0..count {
                fill(
                    done + i,
                    leaf.item_body_mut(slot + i).map_err(corrupt_at(bytenr))?,
                )?;
            }
        }
        if slot == 0 {
            fixup_low_keys(store, &d.path, 1, first)?;
        }
        done += count;
    }
    Ok(())
}

/// Runs `f` on the body of the item with this key, in place. `NotFound` if there is none.
pub fn update_item<S: BlockStore + ?Sized, R>(
    store: &mut S,
    root: &mut TreeRoot,
    key: &Key,
    f: impl FnOnce(&mut [u8]) -> R,
) -> Result<R> {
    let d = descend(store, root, key, Need::Nothing)?;
    if !d.path.found {
        return Err(Error::NotFound);
    }
    let PathLevel { bytenr, slot } = d.path.leaf();
    let mut leaf = leaf_mut(store, bytenr)?;
    Ok(f(leaf.item_body_mut(slot).map_err(corrupt_at(bytenr))?))
}

/// Grows (zero-filled at the end) or shrinks (cut at the end) the body of an item.
pub fn resize_item<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    key: &Key,
    new_len: usize,
) -> Result<()> {
    let max = max_item_size(store.nodesize());
    if new_len > max {
        return Err(Error::InvalidArgument(format!(
            "item of {new_len} bytes is larger than the {max} a leaf holds"
        )));
    }
    let d = descend(store, root, key, Need::GrowTo(new_len))?;
    if !d.path.found {
        return Err(Error::NotFound);
    }
    let PathLevel { bytenr, slot } = d.path.leaf();
    let old_len = {
        let mut leaf = leaf_mut(store, bytenr)?;
        let old = leaf.item(slot).map_err(corrupt_at(bytenr))?.size as usize;
        leaf.resize_item(slot, new_len)
            .map_err(corrupt_at(bytenr))?;
        old
    };
    if new_len < old_len {
        rebalance(store, root, &d.path)?;
    }
    Ok(())
}

/// Changes an item's key without moving it: `new_key` must sort between the item's
/// neighbours in the tree (the kernel's set_item_key_safe).
pub fn set_item_key<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    key: &Key,
    new_key: Key,
) -> Result<()> {
    let (prev, next) = neighbours(&*store, root, key)?;
    if prev.is_some_and(|p| p >= new_key) || next.is_some_and(|n| n <= new_key) {
        return Err(Error::InvalidArgument(format!(
            "key {new_key:?} does not sort between the neighbours of {key:?}"
        )));
    }
    let d = descend(store, root, key, Need::Nothing)?;
    if !d.path.found {
        return Err(Error::NotFound);
    }
    let PathLevel { bytenr, slot } = d.path.leaf();
    leaf_mut(store, bytenr)?
        .set_key(slot, new_key)
        .map_err(corrupt_at(bytenr))?;
    if slot == 0 {
        fixup_low_keys(store, &d.path, 1, new_key)?;
    }
    Ok(())
}

/// The keys before and after the item with `key` (which must exist).
fn neighbours<S: BlockSource + ?Sized>(
    store: &S,
    root: &TreeRoot,
    key: &Key,
) -> Result<(Option<Key>, Option<Key>)> {
    let mut cur = Cursor::search(store, root, key)?;
    if cur.item()?.map(|(k, _)| k) != Some(*key) {
        return Err(Error::NotFound);
    }
    cur.next()?;
    let next = cur.item()?.map(|(k, _)| k);
    let mut cur = Cursor::search(store, root, key)?;
    let prev = if cur.prev()? {
        cur.item()?.map(|(k, _)| k)
    } else {
        None
    };
    Ok((prev, next))
}

/// Descends to `key` and runs `f(leaf, slot, found)` on the leaf where it is (or would be),
/// in place: several neighbouring items changed under one search, as the kernel changes
/// them with one path (btrfs_mark_extent_written). Nothing is split: `f` checks the leaf's
/// free space itself and leaves the leaf as it is when the change does not fit (or is not
/// there); it may insert, remove, re-key and rewrite items as long as every key stays
/// within the leaf's place in the tree. The pointer keys above follow a changed first key,
/// and a leaf left with fewer items is rebalanced.
pub(crate) fn edit_leaf<S: BlockStore + ?Sized, R>(
    store: &mut S,
    root: &mut TreeRoot,
    key: &Key,
    f: impl FnOnce(&mut LeafMut<'_>, usize, bool) -> std::result::Result<R, FormatError>,
) -> Result<R> {
    let d = descend(store, root, key, Need::Nothing)?;
    let PathLevel { bytenr, slot } = d.path.leaf();
    let (r, first, before, after) = {
        let mut leaf = leaf_mut(store, bytenr)?;
        let before = leaf.nritems();
        let first = (before > 0)
            .then(|| leaf.key(0))
            .transpose()
            .map_err(corrupt_at(bytenr))?;
        let r = f(&mut leaf, slot, d.path.found).map_err(corrupt_at(bytenr))?;
        let after = leaf.nritems();
        let now = (after > 0)
            .then(|| leaf.key(0))
            .transpose()
            .map_err(corrupt_at(bytenr))?;
        (r, (now != first).then_some(now).flatten(), before, after)
    };
    if let Some(k) = first {
        fixup_low_keys(store, &d.path, 1, k)?;
    }
    if after < before {
        rebalance(store, root, &d.path)?;
    }
    Ok(r)
}
