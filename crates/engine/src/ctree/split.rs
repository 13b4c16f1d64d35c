//! Making room: a new root level when the root splits, node splits on the way down, and
//! leaf splits (two-way, or three-way when a big item lands between big neighbours). A new
//! item at the end of a full leaf first tries the start of the right neighbour, so keys
//! arriving in descending order do not leave one leaf per item.

use super::cow::cow_child;
use super::path::{next_key_after_leaf, Need, PathLevel, WritePath};
use super::search::TreeRoot;
use super::store::{block_fill, corrupt_at, leaf_mut, new_block, node_mut, view, BlockStore};
use crate::error::{Error, Result};
use oleo_format::key::Key;
use oleo_format::leaf_builder::leaf_data_size;
use oleo_format::tree_block::{ITEM_SIZE, MAX_LEVEL};
use oleo_format::tree_mut::{LeafMut, NodeMut};

/// Puts a new root above the current one (whose block must be dirty); `levels` gains the
/// new top level.
pub(crate) fn grow_root<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    levels: &mut Vec<PathLevel>,
) -> Result<()> {
    let old = root.bytenr;
    let level = root.level + 1;
    if level >= MAX_LEVEL {
        return Err(Error::corrupt(
            old,
            "tree would grow past the maximum level",
        ));
    }
    let first = view(store, old)?.key_at(0).map_err(corrupt_at(old))?;
    let (new, mut block) = new_block(store, root.id, level, old)?;
    let transid = store.transid();
    NodeMut::new(&mut block)
        .and_then(|mut n| n.insert_ptr(0, first, old, transid))
        .map_err(corrupt_at(new))?;
    store.insert_dirty(new, block)?;
    root.bytenr = new;
    root.level = level;
    root.generation = transid;
    levels.push(PathLevel {
        bytenr: new,
        slot: 0,
    });
    Ok(())
}

/// Splits the dirty node `bytenr` at `level` in two halves; the parent (on `levels`) gets
/// the pointer to the right half. Returns the half that `key` belongs to.
pub(crate) fn split_node<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &TreeRoot,
    levels: &mut [PathLevel],
    level: u8,
    bytenr: u64,
    key: &Key,
) -> Result<u64> {
    let up = usize::from(level) + 1;
    let parent = *levels
        .get(up)
        .ok_or_else(|| Error::corrupt(bytenr, "node split without a parent"))?;
    let (right, mut block) = new_block(store, root.id, level, bytenr)?;
    let right_key = {
        let mut node = node_mut(store, bytenr)?;
        let mut r = NodeMut::new(&mut block).map_err(corrupt_at(right))?;
        let mid = node.nritems().div_ceil(2);
        node.move_tail_to(mid, &mut r).map_err(corrupt_at(bytenr))?;
        r.key(0).map_err(corrupt_at(right))?
    };
    let transid = store.transid();
    node_mut(store, parent.bytenr)?
        .insert_ptr(parent.slot + 1, right_key, right, transid)
        .map_err(corrupt_at(parent.bytenr))?;
    store.insert_dirty(right, block)?;
    if *key >= right_key {
        levels[up].slot += 1;
        Ok(right)
    } else {
        Ok(bytenr)
    }
}

/// Moves items `[from..]` of the path's leaf to a new leaf right after it and returns the
/// new leaf's address. When nothing moves, the new leaf is empty and its parent pointer
/// gets `empty_key` (the key about to be inserted there).
fn split_leaf<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &TreeRoot,
    path: &WritePath,
    from: usize,
    empty_key: Option<Key>,
) -> Result<u64> {
    let left = path.leaf().bytenr;
    let parent = path
        .at_level(1)
        .ok_or_else(|| Error::corrupt(left, "leaf split without a parent"))?;
    let (right, mut block) = new_block(store, root.id, 0, left)?;
    let right_key = {
        let mut leaf = leaf_mut(store, left)?;
        let mut r = LeafMut::new(&mut block).map_err(corrupt_at(right))?;
        leaf.move_tail_to(from, &mut r).map_err(corrupt_at(left))?;
        match (r.nritems(), empty_key) {
            (0, Some(k)) => k,
            (0, None) => return Err(Error::corrupt(left, "leaf split moved nothing")),
            _ => r.key(0).map_err(corrupt_at(right))?,
        }
    };
    let transid = store.transid();
    node_mut(store, parent.bytenr)?
        .insert_ptr(parent.slot + 1, right_key, right, transid)
        .map_err(corrupt_at(parent.bytenr))?;
    store.insert_dirty(right, block)?;
    Ok(right)
}

/// Puts a new empty leaf just left of the path's leaf, for `key` (smaller than all keys
/// of that leaf) to go into.
fn new_leaf_before<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &TreeRoot,
    path: &WritePath,
    key: &Key,
) -> Result<u64> {
    let right = path.leaf().bytenr;
    let parent = path
        .at_level(1)
        .ok_or_else(|| Error::corrupt(right, "leaf split without a parent"))?;
    let (left, block) = new_block(store, root.id, 0, right)?;
    let transid = store.transid();
    node_mut(store, parent.bytenr)?
        .insert_ptr(parent.slot, *key, left, transid)
        .map_err(corrupt_at(parent.bytenr))?;
    store.insert_dirty(left, block)?;
    Ok(left)
}

/// Where to cut a leaf that cannot take what is coming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Two leaves: the first `n` entries of the planned sequence stay left.
    At(usize),
    /// Three leaves: before the slot, the slot alone, after it.
    ThreeWay,
}

/// Plans a split of a leaf whose entries take `sizes` bytes each (header included) when an
/// entry of `new` bytes must go in at `slot`, in a leaf with `cap` bytes. Cuts are positions
/// in the sequence with the new entry included.
fn plan_insert(sizes: &[usize], slot: usize, new: usize, cap: usize) -> Option<Cut> {
    let n = sizes.len();
    let size_at = |v: usize| match v.cmp(&slot) {
        std::cmp::Ordering::Less => sizes[v],
        std::cmp::Ordering::Equal => new,
        std::cmp::Ordering::Greater => sizes[v - 1],
    };
    let prefix = prefix_sums((0..=n).map(size_at));
    let total = prefix[n + 1];
    let fits = |c: usize| prefix[c] <= cap && total - prefix[c] <= cap;
    // Appending after the last item or before the first: the new item alone, so that
    // sequential inserts leave full leaves behind.
    if slot == n && fits(n) {
        return Some(Cut::At(n));
    }
    if slot == 0 && fits(1) {
        return Some(Cut::At(1));
    }
    balanced_cut(&prefix, 1..=n, cap).or_else(|| (slot > 0 && slot < n).then_some(Cut::ThreeWay))
}

/// Plans a split of a leaf whose item at `slot` grows by `grow` bytes.
fn plan_growth(sizes: &[usize], slot: usize, grow: usize, cap: usize) -> Option<Cut> {
    let n = sizes.len();
    let prefix = prefix_sums((0..n).map(|v| sizes[v] + if v == slot { grow } else { 0 }));
    balanced_cut(&prefix, 1..n, cap).or_else(|| (slot > 0 && slot + 1 < n).then_some(Cut::ThreeWay))
}

fn prefix_sums(sizes: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut out = vec![0];
    let mut sum = 0;
    for s in sizes {
        sum += s;
        out.push(sum);
    }
    out
}

/// Among cuts where both sides fit, the one with the most even halves.
fn balanced_cut(prefix: &[usize], cuts: impl Iterator<Item = usize>, cap: usize) -> Option<Cut> {
    let total = prefix.last().copied().unwrap_or(0);
    cuts.filter(|&c| c < prefix.len() && prefix[c] <= cap && total - prefix[c] <= cap)
        .min_by_key(|&c| prefix[c].max(total - prefix[c]))
        .map(Cut::At)
}

/// Leaf facts the planners need.
struct LeafShape {
    sizes: Vec<usize>,
}

fn leaf_shape<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64) -> Result<LeafShape> {
    let leaf = leaf_mut(store, bytenr)?;
    let sizes = (0..leaf.nritems())
        .map(|s| leaf.item(s).map(|it| ITEM_SIZE + it.size as usize))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(corrupt_at(bytenr))?;
    Ok(LeafShape { sizes })
}

/// Free bytes in a leaf (the common case needs no more than this).
fn leaf_free<S: BlockStore + ?Sized>(store: &mut S, bytenr: u64) -> Result<usize> {
    Ok(leaf_mut(store, bytenr)?.free_space())
}

/// Makes the room `need` asks for in the path's leaf. Returns, for a batch, how many items
/// now fit at the path's slot.
pub(crate) fn make_room<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    path: &mut WritePath,
    key: &Key,
    need: Need,
) -> Result<usize> {
    match need {
        Need::Nothing => Ok(0),
        #[cfg(test)]
        Need::Bytes(_) if path.found => Ok(0),
        Need::Batch(_) if path.found => Ok(0),
        #[cfg(test)]
        Need::Bytes(bytes) => {
            room_for_insert(store, root, path, key, bytes)?;
            Ok(0)
        }
        Need::Batch(items) => {
            let (count, bytes) = batch_here(store, path, items)?;
            room_for_insert(store, root, path, key, bytes)?;
            Ok(count)
        }
        Need::GrowTo(_) if !path.found => Ok(0),
        Need::GrowTo(len) => {
            let PathLevel { bytenr, slot } = path.leaf();
            let size = leaf_mut(store, bytenr)?
                .item(slot)
                .map_err(corrupt_at(bytenr))?
                .size as usize;
            room_for_growth(store, root, path, len.saturating_sub(size))?;
            Ok(0)
        }
    }
}

/// How many of the batch belong at the path's slot (keys before the next key in the tree)
/// and fit in one leaf, and the bytes they need.
fn batch_here<S: BlockStore + ?Sized>(
    store: &mut S,
    path: &WritePath,
    items: &[(Key, usize)],
) -> Result<(usize, usize)> {
    let PathLevel { bytenr, slot } = path.leaf();
    let bound = {
        let leaf = view(store, bytenr)?;
        if slot < leaf.nritems() {
            Some(leaf.item_key(slot).map_err(corrupt_at(bytenr))?)
        } else {
            None
        }
    };
    let bound = match bound {
        Some(k) => Some(k),
        None => next_key_after_leaf(store, path)?,
    };
    let cap = leaf_data_size(store.nodesize());
    let (mut count, mut bytes) = (0, 0);
    for (k, len) in items {
        let more = ITEM_SIZE + len;
        if bound.is_some_and(|b| *k >= b) || bytes + more > cap {
            break;
        }
        count += 1;
        bytes += more;
    }
    Ok((count, bytes))
}

/// The tree needs a parent above the leaf for a split: grow one if the leaf is the root.
fn ensure_parent<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    path: &mut WritePath,
) -> Result<()> {
    if path.levels.len() == 1 {
        grow_root(store, root, &mut path.levels)?;
    }
    Ok(())
}

fn room_for_insert<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    path: &mut WritePath,
    key: &Key,
    bytes: usize,
) -> Result<()> {
    let PathLevel { bytenr, slot } = path.leaf();
    if leaf_free(store, bytenr)? >= bytes {
        return Ok(());
    }
    let shape = leaf_shape(store, bytenr)?;
    ensure_parent(store, root, path)?;
    if slot == shape.sizes.len() && into_right_neighbour(store, root, path, bytes)? {
        return Ok(());
    }
    let cap = leaf_data_size(store.nodesize());
    match plan_insert(&shape.sizes, slot, bytes, cap) {
        Some(Cut::At(1)) if slot == 0 => {
            let left = new_leaf_before(store, root, path, key)?;
            path.levels[0] = PathLevel {
                bytenr: left,
                slot: 0,
            };
        }
        Some(Cut::At(cut)) if cut <= slot => {
            let right = split_leaf(store, root, path, cut, Some(*key))?;
            move_path_right(path, right, slot - cut);
        }
        Some(Cut::At(cut)) => {
            split_leaf(store, root, path, cut - 1, None)?;
        }
        Some(Cut::ThreeWay) => {
            split_leaf(store, root, path, slot, None)?;
            let middle = split_leaf(store, root, path, slot, Some(*key))?;
            move_path_right(path, middle, 0);
        }
        None => {
            return Err(Error::corrupt(bytenr, "no leaf split makes room"));
        }
    }
    Ok(())
}

fn room_for_growth<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &mut TreeRoot,
    path: &mut WritePath,
    grow: usize,
) -> Result<()> {
    let PathLevel { bytenr, slot } = path.leaf();
    if leaf_free(store, bytenr)? >= grow {
        return Ok(());
    }
    let shape = leaf_shape(store, bytenr)?;
    ensure_parent(store, root, path)?;
    let cap = leaf_data_size(store.nodesize());
    match plan_growth(&shape.sizes, slot, grow, cap) {
        Some(Cut::At(cut)) => {
            let right = split_leaf(store, root, path, cut, None)?;
            if slot >= cut {
                move_path_right(path, right, slot - cut);
            }
        }
        Some(Cut::ThreeWay) => {
            split_leaf(store, root, path, slot + 1, None)?;
            let middle = split_leaf(store, root, path, slot, None)?;
            move_path_right(path, middle, 0);
        }
        None => return Err(Error::corrupt(bytenr, "no leaf split makes room")),
    }
    Ok(())
}

/// The path continues in the leaf just right of the current one (same parent).
fn move_path_right(path: &mut WritePath, leaf: u64, slot: usize) {
    path.levels[0] = PathLevel { bytenr: leaf, slot };
    if let Some(parent) = path.levels.get_mut(1) {
        parent.slot += 1;
    }
}

/// For a new item after the last of a full leaf: use the start of the right neighbour
/// (under the same parent) if it has room. True when the path now points there.
fn into_right_neighbour<S: BlockStore + ?Sized>(
    store: &mut S,
    root: &TreeRoot,
    path: &mut WritePath,
    bytes: usize,
) -> Result<bool> {
    let Some(parent) = path.at_level(1) else {
        return Ok(false);
    };
    let ptr = {
        let node = view(store, parent.bytenr)?;
        if parent.slot + 1 >= node.nritems() {
            return Ok(false);
        }
        node.key_ptr(parent.slot + 1)
            .map_err(corrupt_at(parent.bytenr))?
    };
    let fill = block_fill(store, &ptr, 0)?;
    if leaf_data_size(store.nodesize()).saturating_sub(fill) < bytes {
        return Ok(false);
    }
    let right = cow_child(store, root.id, parent.bytenr, parent.slot + 1, 0)?;
    move_path_right(path, right, 0);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_and_prepends_go_alone() {
        assert_eq!(plan_insert(&[100; 10], 10, 50, 1000), Some(Cut::At(10)));
        assert_eq!(plan_insert(&[100; 10], 0, 50, 1000), Some(Cut::At(1)));
    }

    #[test]
    fn middle_insert_splits_evenly() {
        assert_eq!(plan_insert(&[100; 10], 4, 100, 1000), Some(Cut::At(5)));
        assert_eq!(plan_growth(&[100; 10], 2, 50, 1000), Some(Cut::At(5)));
    }

    #[test]
    fn big_item_between_big_neighbours_needs_three_leaves() {
        assert_eq!(plan_insert(&[600, 600], 1, 600, 1000), Some(Cut::ThreeWay));
        assert_eq!(
            plan_growth(&[400, 100, 400], 1, 800, 1000),
            Some(Cut::ThreeWay)
        );
        assert_eq!(plan_growth(&[100, 400], 0, 800, 1000), Some(Cut::At(1)));
    }
}
