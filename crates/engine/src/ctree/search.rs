//! B-tree search and iteration over verified blocks.

use crate::error::{Error, Result};
use crate::io::disk_io::{Block, DiskIo};
use oleo_format::key::Key;
use oleo_format::TreeBlock;
use std::ops::ControlFlow;

/// Where the read side gets tree blocks from: the disk (`DiskIo`), or a store that also
/// holds the blocks a transaction has changed but not yet written.
pub trait BlockSource {
    /// The block at `bytenr`, checked against what the pointer that led to it promises
    /// (`None`: nothing promised).
    fn read_tree_block(
        &self,
        bytenr: u64,
        level: Option<u8>,
        generation: Option<u64>,
        first_key: Option<Key>,
    ) -> Result<Block>;

    /// Whether an iteration goes around the block at `bytenr`, which failed with `e`,
    /// instead of failing (`rescue=ignorebadroots`; the source logs it).
    fn skip_unreadable(&self, _bytenr: u64, _e: &Error) -> bool {
        false
    }
}

impl BlockSource for DiskIo {
    fn read_tree_block(
        &self,
        bytenr: u64,
        level: Option<u8>,
        generation: Option<u64>,
        first_key: Option<Key>,
    ) -> Result<Block> {
        DiskIo::read_tree_block(self, bytenr, level, generation, first_key)
    }

    fn skip_unreadable(&self, bytenr: u64, e: &Error) -> bool {
        DiskIo::skip_unreadable(self, bytenr, e)
    }
}

/// Where a tree starts: the root block and what its pointer promises about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeRoot {
    /// The tree's id (objectid of its ROOT_ITEM: 1 root tree, 2 extent tree, 5 the
    /// top-level subvolume, ...).
    pub id: u64,
    /// Logical address of the root block.
    pub bytenr: u64,
    /// Level of the root block: 0 when the root is itself a leaf.
    pub level: u8,
    /// The generation (transid) the root block was written in, as its pointer records it.
    pub generation: u64,
}

fn view(block: &Block, bytenr: u64) -> Result<TreeBlock<'_>> {
    TreeBlock::new(block).map_err(|e| Error::corrupt(bytenr, e.to_string()))
}

fn fmt_err(bytenr: u64) -> impl Fn(oleo_format::FormatError) -> Error {
    move |e| Error::corrupt(bytenr, e.to_string())
}

/// A position in a tree: the blocks from root to leaf and the slot taken in each.
pub struct Cursor<'a, S: BlockSource + ?Sized = DiskIo> {
    io: &'a S,
    path: Vec<(Block, usize)>,
    exhausted: bool,
}

impl<'a, S: BlockSource + ?Sized> Cursor<'a, S> {
    /// Positions at the first item whose key is >= `key`.
    pub fn search(io: &'a S, root: &TreeRoot, key: &Key) -> Result<Cursor<'a, S>> {
        let mut cur = Cursor {
            io,
            path: Vec::with_capacity(root.level as usize + 1),
            exhausted: false,
        };
        let mut block =
            io.read_tree_block(root.bytenr, Some(root.level), Some(root.generation), None)?;
        loop {
            let tb = view(&block, root.bytenr)?;
            if tb.is_leaf() {
                let slot = match tb.search(key).map_err(fmt_err(tb.bytenr()))? {
                    Ok(s) | Err(s) => s,
                };
                cur.path.push((block, slot));
                break;
            }
            let slot = tb.child_slot_for(key).map_err(fmt_err(tb.bytenr()))?;
            match cur.child(&tb, slot)? {
                Some(child) => {
                    cur.path.push((block, slot));
                    block = child;
                }
                None => {
                    // Gone around: the first readable item after the lost subtree.
                    cur.path.push((block, slot + 1));
                    cur.descend(false)?;
                    break;
                }
            }
        }
        cur.settle()?;
        Ok(cur)
    }

    /// The child at `slot`; None when it is unreadable and the source goes around it.
    fn child(&self, node: &TreeBlock, slot: usize) -> Result<Option<Block>> {
        let p = node.key_ptr(slot).map_err(fmt_err(node.bytenr()))?;
        match self.io.read_tree_block(
            p.blockptr,
            Some(node.level() - 1),
            Some(p.generation),
            Some(p.key),
        ) {
            Ok(b) => Ok(Some(b)),
            Err(e) if self.io.skip_unreadable(p.blockptr, &e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Descends from path depth `depth` (a node) to a leaf, taking the first or last slot.
    fn descend(&mut self, last: bool) -> Result<()> {
        loop {
            let (block, slot) = self
                .path
                .last()
                .cloned()
                .ok_or_else(|| Error::corrupt(0, "empty path"))?;
            let tb = view(&block, 0)?;
            // A node whose children were all gone around: `settle` climbs on.
            if tb.is_leaf() || slot >= tb.nritems() {
                return Ok(());
            }
            let Some(child) = self.child(&tb, slot)? else {
                if last {
                    // Going around backwards is not needed by any caller: fail as before.
                    return Err(Error::corrupt(tb.bytenr(), "a child block is unreadable"));
                }
                if let Some(last) = self.path.last_mut() {
                    last.1 += 1;
                }
                continue;
            };
            let ctb = view(&child, 0)?;
            let cslot = if last {
                ctb.nritems().saturating_sub(1)
            } else {
                0
            };
            self.path.push((child, cslot));
        }
    }

    /// Moves off a leaf end onto the next leaf's first item, if there is one.
    fn settle(&mut self) -> Result<()> {
        loop {
            let (leaf, slot) = match self.path.last() {
                Some(p) => p,
                None => return Ok(()),
            };
            if *slot < view(leaf, 0)?.nritems() {
                return Ok(());
            }
            // Climb until a node has a next child, then descend to its leftmost leaf.
            let mut depth = self.path.len() - 1;
            loop {
                if depth == 0 {
                    self.exhausted = true;
                    return Ok(());
                }
                depth -= 1;
                let (node, nslot) = &self.path[depth];
                if nslot + 1 < view(node, 0)?.nritems() {
                    break;
                }
            }
            self.path.truncate(depth + 1);
            self.path[depth].1 += 1;
            self.descend(false)?;
        }
    }

    /// The current item, or None past the last one.
    pub fn item(&self) -> Result<Option<(Key, &[u8])>> {
        if self.exhausted {
            return Ok(None);
        }
        let (leaf, slot) = match self.path.last() {
            Some(p) => p,
            None => return Ok(None),
        };
        let tb = view(leaf, 0)?;
        // A node last in the path: every child past it was gone around (rescue).
        if *slot >= tb.nritems() || !tb.is_leaf() {
            return Ok(None);
        }
        let e = fmt_err(tb.bytenr());
        Ok(Some((
            tb.item_key(*slot).map_err(&e)?,
            tb.item_data(*slot).map_err(&e)?,
        )))
    }

    #[allow(clippy::should_implement_trait)] // moves a cursor; can fail, yields nothing
    pub fn next(&mut self) -> Result<()> {
        if self.exhausted {
            return Ok(());
        }
        if let Some(last) = self.path.last_mut() {
            last.1 += 1;
        }
        self.settle()
    }

    /// Steps back one item; false when already at the first item of the tree.
    pub fn prev(&mut self) -> Result<bool> {
        if self.exhausted {
            // Past the end: the last item of the tree is the previous one.
            self.exhausted = false;
            let leaf_items = self
                .path
                .last()
                .map(|(b, _)| view(b, 0).map(|t| t.nritems()))
                .transpose()?
                .unwrap_or(0);
            if let Some(last) = self.path.last_mut() {
                if leaf_items > 0 {
                    last.1 = leaf_items - 1;
                    return Ok(true);
                }
            }
        }
        let Some(last) = self.path.last_mut() else {
            return Ok(false);
        };
        if last.1 > 0 {
            last.1 -= 1;
            return Ok(true);
        }
        let mut depth = self.path.len() - 1;
        loop {
            if depth == 0 {
                return Ok(false);
            }
            depth -= 1;
            if self.path[depth].1 > 0 {
                break;
            }
        }
        self.path.truncate(depth + 1);
        self.path[depth].1 -= 1;
        self.descend(true)?;
        Ok(true)
    }
}

/// Calls `f` for each item with `min <= key <= max`, in order, until it breaks.
pub fn for_each_in_range<S: BlockSource + ?Sized>(
    io: &S,
    root: &TreeRoot,
    min: Key,
    max: Key,
    mut f: impl FnMut(Key, &[u8]) -> Result<ControlFlow<()>>,
) -> Result<()> {
    let mut cur = Cursor::search(io, root, &min)?;
    while let Some((key, data)) = cur.item()? {
        if key > max {
            break;
        }
        if f(key, data)?.is_break() {
            break;
        }
        cur.next()?;
    }
    Ok(())
}

/// The body of the item with exactly this key.
pub fn lookup<S: BlockSource + ?Sized>(
    io: &S,
    root: &TreeRoot,
    key: &Key,
) -> Result<Option<Vec<u8>>> {
    let cur = Cursor::search(io, root, key)?;
    Ok(match cur.item()? {
        Some((k, data)) if k == *key => Some(data.to_vec()),
        _ => None,
    })
}

/// The last item whose key is <= `key` and whose objectid and type equal `key`'s.
pub fn lookup_le<S: BlockSource + ?Sized>(
    io: &S,
    root: &TreeRoot,
    key: &Key,
) -> Result<Option<(Key, Vec<u8>)>> {
    let mut cur = Cursor::search(io, root, key)?;
    if let Some((k, data)) = cur.item()? {
        if k == *key {
            return Ok(Some((k, data.to_vec())));
        }
    }
    if !cur.prev()? {
        return Ok(None);
    }
    Ok(match cur.item()? {
        Some((k, data))
            if k.objectid == key.objectid && k.item_type == key.item_type && k <= *key =>
        {
            Some((k, data.to_vec()))
        }
        _ => None,
    })
}
