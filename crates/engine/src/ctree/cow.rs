//! Copy-on-write: a block of an earlier transaction is never edited; it is copied to a new
//! address, the copy is stamped with this transaction, its parent (or the tree root) is
//! pointed at the copy, and the old block is freed.

use super::search::TreeRoot;
use super::store::{corrupt_at, dirty_block_flags, is_dirty, node_mut, view, BlockStore};
use crate::error::{Error, Result};
use oleo_format::key::Key;
use oleo_format::tree_mut::HeaderMut;

/// Copies the block `old` (which must not be dirty) for `tree`; returns the copy's address.
fn cow_block<S: BlockStore + ?Sized>(
    store: &mut S,
    tree: u64,
    old: u64,
    level: u8,
    generation: u64,
    first_key: Option<Key>,
) -> Result<u64> {
    let block = store.read_tree_block(old, Some(level), Some(generation), first_key)?;
    if block.len() != store.nodesize() as usize {
        return Err(Error::corrupt(old, "block size differs from nodesize"));
    }
    let new = store.alloc(tree, level, old)?;
    store.on_cow(tree, &block, new)?;
    let mut copy = block.to_vec();
    stamp(store, &mut copy, new, tree)?;
    store.insert_dirty(new, copy)?;
    store.free(old, tree, level)?;
    Ok(new)
}

/// Makes `copy` the block at `bytenr`, written by `tree` in this transaction.
fn stamp<S: BlockStore + ?Sized>(store: &S, copy: &mut [u8], bytenr: u64, tree: u64) -> Result<()> {
    let err = corrupt_at(bytenr);
    let mut h = HeaderMut::new(copy).map_err(&err)?;
    let flags = h.flags().map_err(&err)?;
    h.set_bytenr(bytenr).map_err(&err)?;
    h.set_generation(store.transid()).map_err(&err)?;
    h.set_owner(tree).map_err(&err)?;
    h.set_flags(dirty_block_flags(flags)).map_err(&err)?;
    h.set_fsid(&store.fsid()).map_err(&err)?;
    h.set_chunk_tree_uuid(&store.chunk_tree_uuid())
        .map_err(&err)
}

fn check_level<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64, level: u8) -> Result<()> {
    let found = view(store, bytenr)?.level();
    if found != level {
        return Err(Error::corrupt(
            bytenr,
            format!("level {found} where {level} was expected"),
        ));
    }
    Ok(())
}

/// Makes the root block dirty, copying it if needed.
pub(crate) fn cow_root<S: BlockStore + ?Sized>(store: &mut S, root: &mut TreeRoot) -> Result<()> {
    if is_dirty(store, root.bytenr) {
        root.generation = store.transid();
    } else {
        let new = cow_block(
            store,
            root.id,
            root.bytenr,
            root.level,
            root.generation,
            None,
        )?;
        root.bytenr = new;
        root.generation = store.transid();
    }
    check_level(store, root.bytenr, root.level)
}

/// A copy of `root`'s block as the root of the new tree `tree` (the kernel's
/// btrfs_copy_root): same items, its own address, stamped with `tree` and this transaction.
/// The caller gives the children their references from `tree`.
pub fn copy_root<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &TreeRoot,
    tree: u64,
) -> Result<TreeRoot> {
    let block = store.read_tree_block(root.bytenr, Some(root.level), None, None)?;
    if block.len() != store.nodesize() as usize {
        return Err(Error::corrupt(
            root.bytenr,
            "block size differs from nodesize",
        ));
    }
    let new = store.alloc(tree, root.level, root.bytenr)?;
    let mut copy = block.to_vec();
    stamp(store, &mut copy, new, tree)?;
    store.insert_dirty(new, copy)?;
    Ok(TreeRoot {
        id: tree,
        bytenr: new,
        level: root.level,
        generation: store.transid(),
    })
}

/// Makes child `slot` of the dirty node `parent` dirty, copying it if needed; returns the
/// child's (possibly new) address.
pub(crate) fn cow_child<S: BlockStore + ?Sized>(
    store: &mut S,
    tree: u64,
    parent: u64,
    slot: usize,
    child_level: u8,
) -> Result<u64> {
    let ptr = view(store, parent)?
        .key_ptr(slot)
        .map_err(corrupt_at(parent))?;
    let child = if is_dirty(store, ptr.blockptr) {
        ptr.blockptr
    } else {
        let new = cow_block(
            store,
            tree,
            ptr.blockptr,
            child_level,
            ptr.generation,
            Some(ptr.key),
        )?;
        let transid = store.transid();
        node_mut(store, parent)?
            .set_ptr(slot, new, transid)
            .map_err(corrupt_at(parent))?;
        new
    };
    check_level(store, child, child_level)?;
    Ok(child)
}
