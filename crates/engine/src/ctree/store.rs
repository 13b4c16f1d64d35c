//! What the write side needs from the transaction layer, and small helpers to reach the
//! blocks it holds.

use super::search::BlockSource;
use crate::error::{Error, Result};
use oleo_format::tree_block::{
    KeyPtr, BACKREF_REV_SHIFT, HEADER_FLAG_RELOC, HEADER_FLAG_WRITTEN, HEADER_SIZE, ITEM_SIZE,
    MIXED_BACKREF_REV,
};
use oleo_format::tree_mut::{init_block, HeaderMut, LeafMut, NodeMut};
use oleo_format::{CsumType, FormatError, Header, TreeBlock};

/// The blocks of one running transaction, and the policy around them.
///
/// `read_tree_block` (from `BlockSource`) must return a block as it is now: the dirty copy if
/// this transaction changed it, otherwise the verified block from disk.
pub trait BlockStore: BlockSource {
    fn nodesize(&self) -> u32;
    /// The running transaction: every block written now carries this generation.
    fn transid(&self) -> u64;
    /// The fsid tree block headers carry (the metadata fsid).
    fn fsid(&self) -> [u8; 16];
    fn chunk_tree_uuid(&self) -> [u8; 16];
    /// A fresh address for a block of tree `owner` at `level`; `hint` is a nearby block
    /// (the one being copied or split), for locality.
    fn alloc(&mut self, owner: u64, level: u8, hint: u64) -> Result<u64>;
    /// Tree `tree` no longer references the block at `bytenr` (at `level`). If the block is
    /// dirty, the store must drop the dirty copy: it is not to be written.
    fn free(&mut self, bytenr: u64, tree: u64, level: u8) -> Result<()>;
    /// `old` (a block of another transaction) is being copied to `new_bytenr` for `tree`.
    /// Called before the copy is used and before `old` is freed: the place for the extent
    /// layer to move references of the children (the kernel's update_ref_for_cow).
    fn on_cow(&mut self, _tree: u64, _old: &[u8], _new_bytenr: u64) -> Result<()> {
        Ok(())
    }
    /// The dirty block at `bytenr`, for editing in place; None if this transaction has not
    /// written it.
    fn dirty_mut(&mut self, bytenr: u64) -> Option<&mut [u8]>;
    /// Adds (or replaces) the dirty block at `bytenr`, an address `alloc` returned.
    fn insert_dirty(&mut self, bytenr: u64, block: Vec<u8>) -> Result<()>;
}

/// Readies a dirty block for writing: marks it WRITTEN and checksums it. After this the
/// block must not be edited in place again (the next change copies it).
pub fn finalize_block(block: &mut [u8], csum: CsumType) -> Result<()> {
    zero_unused(block);
    let mut h = HeaderMut::new(block).map_err(|e| Error::corrupt(0, e.to_string()))?;
    let bytenr = h.bytenr().unwrap_or(0);
    let err = corrupt_at(bytenr);
    let flags = h.flags().map_err(&err)?;
    h.set_flags(flags | HEADER_FLAG_WRITTEN).map_err(&err)?;
    h.finalize(csum).map_err(&err)
}

/// Zeroes the bytes no item uses: in a leaf, between the item headers and the item data;
/// in a node, after the last key pointer. Edits leave old item headers and data there, and
/// the kernel writes zeros (its scrub's csum lookup reads a leaf's slot past the last item
/// and took a stale EXTENT_CSUM key there for a real one).
fn zero_unused(block: &mut [u8]) {
    const HEADER: usize = 101;
    const ITEM: usize = 25;
    const PTR: usize = 33;
    let Some(n) = block
        .get(96..100)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
    else {
        return;
    };
    let level = block.get(100).copied().unwrap_or(0);
    let len = block.len();
    let (from, to) = if level > 0 {
        (HEADER + n * PTR, len)
    } else {
        let data_start = (0..n)
            .filter_map(|i| {
                let at = HEADER + i * ITEM + 17;
                let off = block.get(at..at + 4)?;
                Some(HEADER + u32::from_le_bytes(off.try_into().unwrap()) as usize)
            })
            .min()
            .unwrap_or(len);
        (HEADER + n * ITEM, data_start)
    };
    if from < to && to <= len {
        block[from..to].fill(0);
    }
}

/// Maps a format error in the block at `bytenr` to an engine error naming it.
pub(crate) fn corrupt_at(bytenr: u64) -> impl Fn(FormatError) -> Error {
    move |e| Error::corrupt(bytenr, e.to_string())
}

/// True when `bytenr` was already copied (or created) in this transaction and may be
/// edited in place.
pub(crate) fn is_dirty<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64) -> bool {
    let transid = store.transid();
    store
        .dirty_mut(bytenr)
        .is_some_and(|b| TreeBlock::new(b).is_ok_and(|tb| tb.generation() == transid))
}

/// The dirty block at `bytenr`; an error if the transaction has no such block.
pub(crate) fn dirty<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64) -> Result<&mut [u8]> {
    let nodesize = store.nodesize() as usize;
    match store.dirty_mut(bytenr) {
        Some(b) if b.len() == nodesize => Ok(b),
        Some(b) => Err(Error::corrupt(
            bytenr,
            format!("dirty block is {} bytes, nodesize is {nodesize}", b.len()),
        )),
        None => Err(Error::corrupt(
            bytenr,
            "block is not dirty in this transaction",
        )),
    }
}

/// A read-only view of a dirty block.
pub(crate) fn view<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64) -> Result<TreeBlock<'_>> {
    let b = dirty(store, bytenr)?;
    TreeBlock::new(b).map_err(corrupt_at(bytenr))
}

/// Dirty blocks were checked when read or made by the views: their layout is not walked again.
pub(crate) fn leaf_mut<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64) -> Result<LeafMut<'_>> {
    LeafMut::of_checked(dirty(store, bytenr)?).map_err(corrupt_at(bytenr))
}

pub(crate) fn node_mut<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64) -> Result<NodeMut<'_>> {
    NodeMut::new(dirty(store, bytenr)?).map_err(corrupt_at(bytenr))
}

/// Flags of a block written in this transaction: not yet WRITTEN, mixed back references.
pub(crate) fn dirty_block_flags(old: u64) -> u64 {
    let low = old & ((1u64 << BACKREF_REV_SHIFT) - 1);
    let cleared = low & !(HEADER_FLAG_WRITTEN | HEADER_FLAG_RELOC);
    cleared | (MIXED_BACKREF_REV << BACKREF_REV_SHIFT)
}

/// Allocates and formats an empty block of `tree` at `level`. It is not in the store yet:
/// the caller fills it and hands it over with `insert_dirty`.
pub(crate) fn new_block<S: BlockStore + ?Sized>(
    store: &mut S,
    tree: u64,
    level: u8,
    hint: u64,
) -> Result<(u64, Vec<u8>)> {
    let bytenr = store.alloc(tree, level, hint)?;
    let mut block = vec![0u8; store.nodesize() as usize];
    let header = Header {
        csum: [0; 32],
        fsid: store.fsid(),
        bytenr,
        flags: dirty_block_flags(0),
        chunk_tree_uuid: store.chunk_tree_uuid(),
        generation: store.transid(),
        owner: tree,
        nritems: 0,
        level,
    };
    init_block(&mut block, &header).map_err(corrupt_at(bytenr))?;
    Ok((bytenr, block))
}

/// How full the child `ptr` points to is: bytes used for a leaf, pointers for a node.
/// Reads without copying: a neighbour is only copied once it is actually changed.
pub(crate) fn block_fill<S: BlockStore + ?Sized>(
    store: &mut S,
    ptr: &KeyPtr,
    level: u8,
) -> Result<usize> {
    if is_dirty(store, ptr.blockptr) {
        let b = dirty(store, ptr.blockptr)?;
        return fill_of(b, ptr.blockptr);
    }
    let b = store.read_tree_block(
        ptr.blockptr,
        Some(level),
        Some(ptr.generation),
        Some(ptr.key),
    )?;
    fill_of(&b, ptr.blockptr)
}

pub(crate) fn fill_of(block: &[u8], bytenr: u64) -> Result<usize> {
    let tb = TreeBlock::new(block).map_err(corrupt_at(bytenr))?;
    let n = tb.nritems();
    if !tb.is_leaf() {
        return Ok(n);
    }
    if n == 0 {
        return Ok(0);
    }
    let data = block.len().saturating_sub(HEADER_SIZE);
    let lowest = tb.item(n - 1).map_err(corrupt_at(bytenr))?.offset as usize;
    Ok(n * ITEM_SIZE + data.saturating_sub(lowest))
}
