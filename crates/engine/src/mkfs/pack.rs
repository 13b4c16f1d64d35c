//! Packing a sorted item list into a B-tree: leaves filled in key order, then as many node
//! levels as needed. The shape depends only on item sizes, so block counts can be settled
//! before addresses are known; addresses are handed in afterwards.

use crate::error::{Error, Result};
use oleo_format::leaf_builder::{max_item_size, max_node_ptrs};
use oleo_format::tree_block::{Header, KeyPtr, ITEM_SIZE};
use oleo_format::{CsumType, Key, LeafBuilder, NodeBuilder};
use std::ops::Range;

/// Items of one tree, sorted by key, no duplicates.
pub(crate) type Items = Vec<(Key, Vec<u8>)>;

/// Which items go in which leaf and which blocks each node level groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Item index ranges, one per leaf.
    leaves: Vec<Range<usize>>,
    /// `levels[i]` holds, for each node at level i+1, the range of level-i blocks under it.
    levels: Vec<Vec<Range<usize>>>,
}

/// One block of a planned tree: what the extent tree records about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockInfo {
    pub bytenr: u64,
    pub level: u8,
    pub first_key: Key,
    pub owner: u64,
}

impl Shape {
    /// Greedy packing: each leaf takes items until the next one does not fit. An empty tree
    /// is one empty leaf (allowed only as a root).
    pub fn of(items: &Items, nodesize: u32) -> Result<Shape> {
        let mut leaves = Vec::new();
        let mut start = 0;
        let mut used = 0usize;
        let capacity = max_item_size(nodesize) + ITEM_SIZE;
        for (i, (key, body)) in items.iter().enumerate() {
            if body.len() > max_item_size(nodesize) {
                return Err(Error::InvalidArgument(format!(
                    "item {key:?} of {} bytes does not fit in a {nodesize}-byte leaf",
                    body.len()
                )));
            }
            let need = ITEM_SIZE + body.len();
            if used + need > capacity {
                leaves.push(start..i);
                start = i;
                used = 0;
            }
            used += need;
        }
        leaves.push(start..items.len());
        let fanout = max_node_ptrs(nodesize);
        let mut levels = Vec::new();
        let mut below = leaves.len();
        while below > 1 {
            let groups: Vec<Range<usize>> = (0..below)
                .step_by(fanout)
                .map(|s| s..(s + fanout).min(below))
                .collect();
            below = groups.len();
            levels.push(groups);
        }
        Ok(Shape { leaves, levels })
    }

    pub fn block_count(&self) -> usize {
        self.leaves.len() + self.levels.iter().map(Vec::len).sum::<usize>()
    }

    pub fn root_level(&self) -> u8 {
        self.levels.len() as u8
    }

    /// Block infos in allocation order (leaves, then each node level, root last), given
    /// that order's addresses.
    pub fn block_infos(&self, items: &Items, addrs: &[u64], owner: u64) -> Result<Vec<BlockInfo>> {
        if addrs.len() != self.block_count() {
            return Err(Error::InvalidArgument(format!(
                "tree {owner}: {} addresses for {} blocks",
                addrs.len(),
                self.block_count()
            )));
        }
        let mut infos = Vec::with_capacity(addrs.len());
        let mut level_keys: Vec<Key> = self
            .leaves
            .iter()
            .map(|r| items.get(r.start).map_or(Key::MIN, |(k, _)| *k))
            .collect();
        for first_key in &level_keys {
            infos.push((0u8, *first_key));
        }
        for (i, groups) in self.levels.iter().enumerate() {
            level_keys = groups.iter().map(|g| level_keys[g.start]).collect();
            for first_key in &level_keys {
                infos.push((i as u8 + 1, *first_key));
            }
        }
        Ok(infos
            .into_iter()
            .zip(addrs)
            .map(|((level, first_key), &bytenr)| BlockInfo {
                bytenr,
                level,
                first_key,
                owner,
            })
            .collect())
    }

    /// The finished blocks (address, bytes) in allocation order. `header` supplies the
    /// per-filesystem fields (fsid, chunk tree uuid, generation, flags) and the owner.
    pub fn build(
        &self,
        items: &Items,
        addrs: &[u64],
        header: &Header,
        nodesize: u32,
        csum: CsumType,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let infos = self.block_infos(items, addrs, header.owner)?;
        let fmt = |e: oleo_format::FormatError| {
            Error::InvalidArgument(format!("building tree {}: {e}", header.owner))
        };
        let mut out = Vec::with_capacity(infos.len());
        let mut slot = 0;
        for range in &self.leaves {
            let mut leaf = LeafBuilder::new(nodesize).map_err(fmt)?;
            for (key, body) in &items[range.clone()] {
                leaf.push(*key, body).map_err(fmt)?;
            }
            let h = Header {
                bytenr: infos[slot].bytenr,
                ..header.clone()
            };
            out.push((h.bytenr, leaf.finish(&h, csum).map_err(fmt)?));
            slot += 1;
        }
        // Blocks of the level below the current one, as indexes into `infos`.
        let mut below: Vec<usize> = (0..self.leaves.len()).collect();
        for (i, groups) in self.levels.iter().enumerate() {
            let mut this_level = Vec::with_capacity(groups.len());
            for g in groups {
                let mut node = NodeBuilder::new(nodesize).map_err(fmt)?;
                for &child in &below[g.clone()] {
                    node.push(KeyPtr {
                        key: infos[child].first_key,
                        blockptr: infos[child].bytenr,
                        generation: header.generation,
                    })
                    .map_err(fmt)?;
                }
                let h = Header {
                    bytenr: infos[slot].bytenr,
                    ..header.clone()
                };
                out.push((h.bytenr, node.finish(&h, i as u8 + 1, csum).map_err(fmt)?));
                this_level.push(slot);
                slot += 1;
            }
            below = this_level;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(n: usize, size: usize) -> Items {
        (0..n)
            .map(|i| (Key::new(i as u64 + 1, 1, 0), vec![7u8; size]))
            .collect()
    }

    #[test]
    fn shapes() {
        let empty = Shape::of(&Vec::new(), 4096).unwrap();
        assert_eq!((empty.block_count(), empty.root_level()), (1, 0));
        // 439-byte root items: 8 fit in a 4 KiB leaf (8 * 464 = 3712 <= 3995), 9 do not.
        assert_eq!(Shape::of(&items(8, 439), 4096).unwrap().block_count(), 1);
        let two = Shape::of(&items(9, 439), 4096).unwrap();
        assert_eq!((two.block_count(), two.root_level()), (3, 1));
        let infos = two
            .block_infos(&items(9, 439), &[4096, 8192, 12288], 1)
            .unwrap();
        assert_eq!(infos[1].first_key, Key::new(9, 1, 0));
        assert_eq!(infos[2].first_key, Key::new(1, 1, 0));
        assert!(Shape::of(&items(1, 5000), 4096).is_err());
    }
}
