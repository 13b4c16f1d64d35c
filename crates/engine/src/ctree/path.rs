//! The write side's search: a descent from the root that leaves every block on the way dirty
//! (copied on write) and, when asked to make room, splits what is full on the way down so a
//! leaf split always finds room in its parent.

use super::cow::{cow_child, cow_root};
use super::search::TreeRoot;
use super::split::{grow_root, make_room, split_node};
use super::store::{corrupt_at, node_mut, view, BlockStore};
use crate::error::{Error, Result};
use oleo_format::key::Key;
#[cfg(test)]
use oleo_format::leaf_builder::leaf_data_size;
use oleo_format::leaf_builder::max_node_ptrs;

const MIN_NODE_PTRS: usize = 8;

/// One step of a path: a dirty block and the slot taken in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathLevel {
    pub bytenr: u64,
    pub slot: usize,
}

/// Where a write lands: every block from the root down to the leaf, all dirty in the running
/// transaction, so the caller may edit the leaf in place (through the store's `dirty_mut`).
#[derive(Clone, Debug)]
pub struct WritePath {
    /// Indexed by level: 0 is the leaf, the last entry is the root. Never empty.
    pub(crate) levels: Vec<PathLevel>,
    /// Whether the leaf slot holds exactly the key searched for.
    pub found: bool,
}

impl WritePath {
    /// The leaf and the slot of the key (or where it would be inserted).
    pub fn leaf(&self) -> PathLevel {
        self.levels.first().copied().unwrap_or_default()
    }

    pub fn at_level(&self, level: usize) -> Option<PathLevel> {
        self.levels.get(level).copied()
    }

    /// Number of levels, leaf included.
    #[cfg(test)]
    pub(crate) fn height(&self) -> usize {
        self.levels.len()
    }
}

/// What the caller is about to do at the key, so the descent can make room for it.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteIntent {
    /// Edit or delete items: nothing grows, nothing is split.
    Modify,
    /// Insert new items at the key: they need this many bytes in the leaf (bodies plus 25
    /// bytes per item header). Nothing is split if the key already exists.
    Insert(usize),
}

/// The room a descent must make in the leaf it ends in.
pub(crate) enum Need<'a> {
    Nothing,
    /// Room for new items of this many bytes (`search_for_write`'s `WriteIntent::Insert`).
    #[cfg(test)]
    Bytes(usize),
    /// As many of these sorted (key, body length) items as belong at the first key's
    /// position and fit in one leaf.
    Batch(&'a [(Key, usize)]),
    GrowTo(usize),
}

pub(crate) struct Descent {
    pub path: WritePath,
    /// For `Need::Batch`: how many of the items the leaf now has room for.
    pub batch_count: usize,
}

/// Descends to `key`, copying every block on the way that is not yet dirty and making the
/// room `intent` asks for. The tree root in `root` changes when the root is copied or the
/// tree grows a level.
#[cfg(test)]
pub(crate) fn search_for_write<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    key: &Key,
    intent: WriteIntent,
) -> Result<WritePath> {
    let need = match intent {
        WriteIntent::Modify => Need::Nothing,
        WriteIntent::Insert(bytes) => {
            if bytes > leaf_data_size(store.nodesize()) {
                return Err(Error::InvalidArgument(format!(
                    "{bytes} bytes never fit in one leaf"
                )));
            }
            Need::Bytes(bytes)
        }
    };
    Ok(descend(store, root, key, need)?.path)
}

pub(crate) fn descend<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    key: &Key,
    need: Need,
) -> Result<Descent> {
    let max_ptrs = max_node_ptrs(store.nodesize());
    // Splits keep three pointers free and halve nodes: tiny nodes cannot do both.
    if max_ptrs < MIN_NODE_PTRS {
        return Err(Error::InvalidArgument(format!(
            "nodesize {} is too small for a B-tree",
            store.nodesize()
        )));
    }
    cow_root(store, root)?;
    let may_split = !matches!(need, Need::Nothing);
    let mut levels = vec![PathLevel::default(); usize::from(root.level) + 1];
    let mut bytenr = root.bytenr;
    let mut level = root.level;
    while level > 0 {
        // A leaf split adds up to two pointers to its parent: keep three free all the way.
        if may_split && node_mut(store, bytenr)?.nritems() + 3 >= max_ptrs {
            if level == root.level {
                grow_root(store, root, &mut levels)?;
            }
            bytenr = split_node(store, root, &mut levels, level, bytenr, key)?;
        }
        let slot = view(store, bytenr)?
            .child_slot_for(key)
            .map_err(corrupt_at(bytenr))?;
        levels[usize::from(level)] = PathLevel { bytenr, slot };
        bytenr = cow_child(store, root.id, bytenr, slot, level - 1)?;
        level -= 1;
    }
    let (slot, found) = match view(store, bytenr)?
        .search(key)
        .map_err(corrupt_at(bytenr))?
    {
        Ok(slot) => (slot, true),
        Err(slot) => (slot, false),
    };
    levels[0] = PathLevel { bytenr, slot };
    let mut path = WritePath { levels, found };
    let batch_count = make_room(store, root, &mut path, key, need)?;
    Ok(Descent { path, batch_count })
}

/// The first key after the path's leaf: the key of the next subtree in the lowest node that
/// has one. None when the leaf is the last of the tree.
pub(crate) fn next_key_after_leaf<S: BlockStore + ?Sized>(
    store: &mut S,
    path: &WritePath,
) -> Result<Option<Key>> {
    for pl in path.levels.iter().skip(1) {
        let node = view(store, pl.bytenr)?;
        if pl.slot + 1 < node.nritems() {
            return node
                .key_ptr(pl.slot + 1)
                .map(|p| Some(p.key))
                .map_err(corrupt_at(pl.bytenr));
        }
    }
    Ok(None)
}

/// After the caller changed the first key of the path's leaf (inserted or removed at slot 0,
/// or re-keyed it): brings the pointer keys above it in line.
#[cfg(test)]
pub(crate) fn update_parent_keys<S: BlockStore + ?Sized>(
    store: &mut S,
    path: &WritePath,
) -> Result<()> {
    let leaf = path.leaf().bytenr;
    let first = {
        let tb = view(store, leaf)?;
        if tb.nritems() == 0 {
            return Ok(());
        }
        tb.key_at(0).map_err(corrupt_at(leaf))?
    };
    fixup_low_keys(store, path, 1, first)
}

/// The first key of the block at `from_level` changed to `key`: update the pointer keys
/// above it, up to the first pointer that is not the first of its node.
pub(crate) fn fixup_low_keys<S: BlockStore + ?Sized>(
    store: &mut S,
    path: &WritePath,
    from_level: usize,
    key: Key,
) -> Result<()> {
    for pl in path.levels.iter().skip(from_level) {
        node_mut(store, pl.bytenr)?
            .set_key(pl.slot, key)
            .map_err(corrupt_at(pl.bytenr))?;
        if pl.slot != 0 {
            break;
        }
    }
    Ok(())
}
