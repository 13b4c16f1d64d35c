//! Settling the trees of a fresh filesystem. Most trees have fixed contents, but the extent
//! tree records every tree block (its own included) and the free space tree describes the
//! gaps between them, so their sizes feed back into the allocation. We iterate: guess their
//! shapes, allocate every block, recompute both trees, until nothing changes.

use super::layout::{BlockAllocator, ChunkPlan};
use super::pack::{BlockInfo, Items, Shape};
use super::trees::{self, Params, RootPlace};
use crate::error::{Error, Result};
use oleo_format::items::block_group;
use oleo_format::key::objectid;
use oleo_format::tree_block::Header;
use oleo_format::CsumType;
use std::collections::BTreeMap;

/// Which optional trees exist.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TreeSet {
    pub free_space_tree: bool,
    pub block_group_tree: bool,
}

/// The finished metadata: every block with its bytes, and where each tree's root is.
pub(crate) struct Planned {
    pub blocks: Vec<(u64, Vec<u8>)>,
    pub roots: BTreeMap<u64, RootPlace>,
    /// Bytes of tree blocks per chunk, in `chunks` order.
    pub used: Vec<u64>,
}

/// Trees in allocation order within the METADATA chunk (the chunk tree goes to SYSTEM).
fn metadata_trees(set: TreeSet) -> Vec<u64> {
    let mut v = vec![
        objectid::ROOT_TREE,
        objectid::EXTENT_TREE,
        objectid::DEV_TREE,
        objectid::FS_TREE,
        objectid::CSUM_TREE,
        objectid::UUID_TREE,
    ];
    if set.free_space_tree {
        v.push(objectid::FREE_SPACE_TREE);
    }
    v.push(objectid::DATA_RELOC_TREE);
    if set.block_group_tree {
        v.push(objectid::BLOCK_GROUP_TREE);
    }
    v
}

/// Trees with a ROOT_ITEM in the root tree (all but the root and chunk trees).
fn rooted_trees(set: TreeSet) -> Vec<u64> {
    metadata_trees(set)
        .into_iter()
        .filter(|&id| id != objectid::ROOT_TREE)
        .collect()
}

fn find_chunk(chunks: &[ChunkPlan], kind: u64) -> Result<&ChunkPlan> {
    chunks
        .iter()
        .find(|c| c.flags & kind != 0)
        .ok_or_else(|| Error::InvalidArgument(format!("no {kind:#x} chunk planned")))
}

struct State {
    items: BTreeMap<u64, Items>,
    shapes: BTreeMap<u64, Shape>,
}

impl State {
    fn set(&mut self, id: u64, items: Items, nodesize: u32) -> Result<()> {
        self.shapes.insert(id, Shape::of(&items, nodesize)?);
        self.items.insert(id, items);
        Ok(())
    }

    fn shape(&self, id: u64) -> Result<&Shape> {
        self.shapes
            .get(&id)
            .ok_or_else(|| Error::InvalidArgument(format!("tree {id} not planned")))
    }
}

pub(crate) fn plan(
    p: &Params,
    csum: CsumType,
    chunks: &[ChunkPlan],
    set: TreeSet,
) -> Result<Planned> {
    let ns = p.nodesize;
    let sys = find_chunk(chunks, block_group::SYSTEM)?;
    let meta = find_chunk(chunks, block_group::METADATA)?;
    let rooted = rooted_trees(set);
    let order = metadata_trees(set);

    let mut st = State {
        items: BTreeMap::new(),
        shapes: BTreeMap::new(),
    };
    st.set(objectid::CHUNK_TREE, trees::chunk_tree(p, chunks)?, ns)?;
    st.set(objectid::DEV_TREE, trees::dev_tree(p, chunks), ns)?;
    st.set(
        objectid::FS_TREE,
        trees::root_dir_tree(p, p.root_owner)?,
        ns,
    )?;
    st.set(
        objectid::DATA_RELOC_TREE,
        trees::root_dir_tree(p, (0, 0))?,
        ns,
    )?;
    st.set(objectid::CSUM_TREE, Vec::new(), ns)?;
    st.set(objectid::UUID_TREE, trees::uuid_tree(p), ns)?;
    // Sizes of these do not depend on the values still unknown.
    let placeholder: Vec<(u64, RootPlace)> = rooted
        .iter()
        .map(|&id| (id, RootPlace::default()))
        .collect();
    st.set(objectid::ROOT_TREE, trees::root_tree(p, &placeholder)?, ns)?;
    let bg_placeholder = trees::block_group_items(chunks, &[], ns);
    if set.block_group_tree {
        st.set(objectid::BLOCK_GROUP_TREE, bg_placeholder.clone(), ns)?;
    }
    st.set(objectid::EXTENT_TREE, Vec::new(), ns)?;
    if set.free_space_tree {
        st.set(objectid::FREE_SPACE_TREE, Vec::new(), ns)?;
    }

    let mut settled = false;
    for _ in 0..32 {
        let (addrs, infos) = allocate(&st, &order, sys, meta, ns)?;
        let bg = trees::block_group_items(chunks, &infos, ns);
        let extra = if set.block_group_tree { Vec::new() } else { bg };
        let ext = trees::extent_tree(p, &infos, &extra);
        let mut changed = Shape::of(&ext, ns)? != *st.shape(objectid::EXTENT_TREE)?;
        st.set(objectid::EXTENT_TREE, ext, ns)?;
        if set.free_space_tree {
            let fst = trees::free_space_tree(chunks, &infos, ns);
            changed |= Shape::of(&fst, ns)? != *st.shape(objectid::FREE_SPACE_TREE)?;
            st.set(objectid::FREE_SPACE_TREE, fst, ns)?;
        }
        drop(addrs);
        if !changed {
            settled = true;
            break;
        }
    }
    if !settled {
        return Err(Error::InvalidArgument(
            "the extent and free space trees did not settle".into(),
        ));
    }
    // Same shapes, same addresses; but now the first keys of the extent tree's own blocks
    // come from its final keys (they matter for non-skinny tree block records).
    let (addrs, infos) = allocate(&st, &order, sys, meta, ns)?;

    // Fill in the values that depend on addresses; sizes (hence shapes) stay the same.
    let mut roots = BTreeMap::new();
    for (&id, a) in &addrs {
        let shape = st.shape(id)?;
        let bytenr = a.last().copied().unwrap_or(0);
        roots.insert(
            id,
            RootPlace {
                bytenr,
                level: shape.root_level(),
                blocks: a.len() as u64,
            },
        );
    }
    let places: Vec<(u64, RootPlace)> = rooted
        .iter()
        .map(|id| (*id, roots.get(id).copied().unwrap_or_default()))
        .collect();
    replace(
        &mut st,
        objectid::ROOT_TREE,
        trees::root_tree(p, &places)?,
        ns,
    )?;
    let bg = trees::block_group_items(chunks, &infos, ns);
    let extra = if set.block_group_tree {
        replace(&mut st, objectid::BLOCK_GROUP_TREE, bg, ns)?;
        Vec::new()
    } else {
        bg
    };
    replace(
        &mut st,
        objectid::EXTENT_TREE,
        trees::extent_tree(p, &infos, &extra),
        ns,
    )?;

    let used = chunks
        .iter()
        .map(|c| infos.iter().filter(|b| c.contains(b.bytenr)).count() as u64 * ns as u64)
        .collect();
    let mut blocks = Vec::new();
    for (&id, a) in &addrs {
        let header = Header {
            csum: [0; 32],
            fsid: p.fsid,
            bytenr: 0,
            flags: Header::new_block_flags(),
            chunk_tree_uuid: p.chunk_tree_uuid,
            generation: p.generation,
            owner: id,
            nritems: 0,
            level: 0,
        };
        let items = st
            .items
            .get(&id)
            .ok_or_else(|| Error::InvalidArgument(format!("tree {id} has no items")))?;
        blocks.extend(st.shape(id)?.build(items, a, &header, ns, csum)?);
    }
    Ok(Planned {
        blocks,
        roots,
        used,
    })
}

/// Replaces a tree's items with final values, insisting the shape is unchanged (the
/// addresses were handed out for that shape).
fn replace(st: &mut State, id: u64, items: Items, nodesize: u32) -> Result<()> {
    if Shape::of(&items, nodesize)? != *st.shape(id)? {
        return Err(Error::InvalidArgument(format!(
            "tree {id} changed shape while its values were filled in"
        )));
    }
    st.items.insert(id, items);
    Ok(())
}

type Allocation = (BTreeMap<u64, Vec<u64>>, Vec<BlockInfo>);

/// Addresses for every block of every tree under the current shapes, and what the extent
/// tree must record about each.
fn allocate(
    st: &State,
    order: &[u64],
    sys: &ChunkPlan,
    meta: &ChunkPlan,
    nodesize: u32,
) -> Result<Allocation> {
    let mut addrs = BTreeMap::new();
    let mut infos = Vec::new();
    let mut sys_alloc = BlockAllocator::new(sys, nodesize);
    let mut meta_alloc = BlockAllocator::new(meta, nodesize);
    let all = std::iter::once(objectid::CHUNK_TREE).chain(order.iter().copied());
    for id in all {
        let shape = st.shape(id)?;
        let alloc = if id == objectid::CHUNK_TREE {
            &mut sys_alloc
        } else {
            &mut meta_alloc
        };
        let a = (0..shape.block_count())
            .map(|_| alloc.alloc())
            .collect::<Result<Vec<u64>>>()?;
        let items = st
            .items
            .get(&id)
            .ok_or_else(|| Error::InvalidArgument(format!("tree {id} has no items")))?;
        infos.extend(shape.block_infos(items, &a, id)?);
        addrs.insert(id, a);
    }
    Ok((addrs, infos))
}
