//! Building tree blocks: the inverse of `TreeBlock`. A `LeafBuilder` takes items in key
//! order and lays them out as the kernel does (item headers forward from the block header,
//! bodies packed back to back from the end of the block); a `NodeBuilder` takes child
//! pointers. Both finish into a complete, checksummed block that `validate` accepts.

use crate::bytes::put_at;
use crate::csum::CsumType;
use crate::error::Result;
use crate::invalid;
use crate::key::{Key, KEY_SIZE};
use crate::tree_block::{write_csum, Header, KeyPtr, HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};

/// Bytes after the header: item headers plus bodies must fit here.
pub fn leaf_data_size(nodesize: u32) -> usize {
    (nodesize as usize).saturating_sub(HEADER_SIZE)
}

/// The largest body one item can have (a leaf holding only that item).
pub fn max_item_size(nodesize: u32) -> usize {
    leaf_data_size(nodesize).saturating_sub(ITEM_SIZE)
}

/// How many child pointers fit in a node.
pub fn max_node_ptrs(nodesize: u32) -> usize {
    leaf_data_size(nodesize) / KEY_PTR_SIZE
}

fn check_nodesize(nodesize: u32) -> Result<()> {
    if !nodesize.is_power_of_two() || !(4096..=65536).contains(&nodesize) {
        invalid!("nodesize {nodesize} is not a power of two in 4K..64K");
    }
    Ok(())
}

/// Writes the header with the final level and item count, then the checksum.
fn seal(
    block: &mut [u8],
    header: &Header,
    nritems: usize,
    level: u8,
    csum: CsumType,
) -> Result<()> {
    let Ok(nritems) = u32::try_from(nritems) else {
        invalid!("{nritems} items in one block");
    };
    let h = Header {
        csum: [0; 32],
        nritems,
        level,
        ..header.clone()
    };
    h.write_into(block)?;
    write_csum(block, csum)
}

/// A leaf under construction.
#[derive(Clone, Debug)]
pub struct LeafBuilder {
    nodesize: u32,
    items: Vec<(Key, Vec<u8>)>,
    /// Item headers plus bodies so far.
    used: usize,
}

impl LeafBuilder {
    /// An empty leaf for blocks of `nodesize` bytes (a power of two in 4 KiB..=64 KiB).
    pub fn new(nodesize: u32) -> Result<LeafBuilder> {
        check_nodesize(nodesize)?;
        Ok(LeafBuilder {
            nodesize,
            items: Vec::new(),
            used: 0,
        })
    }

    /// The leaf's free space as btrfs counts it (what `dump-tree` prints).
    pub fn free_space(&self) -> usize {
        leaf_data_size(self.nodesize) - self.used
    }

    /// True when an item with a body of `body_len` bytes still fits.
    pub fn fits(&self, body_len: usize) -> bool {
        ITEM_SIZE
            .checked_add(body_len)
            .is_some_and(|need| need <= self.free_space())
    }

    /// Appends an item. Keys must be strictly increasing; the item must fit.
    pub fn push(&mut self, key: Key, body: &[u8]) -> Result<()> {
        if let Some((last, _)) = self.items.last() {
            if *last >= key {
                invalid!("leaf items out of order: {key:?} after {last:?}");
            }
        }
        if !self.fits(body.len()) {
            invalid!(
                "item {key:?} of {} bytes does not fit ({} bytes free)",
                body.len(),
                self.free_space()
            );
        }
        self.used += ITEM_SIZE + body.len();
        self.items.push((key, body.to_vec()));
        Ok(())
    }

    /// Number of items pushed so far.
    pub fn nritems(&self) -> usize {
        self.items.len()
    }

    /// True when no item has been pushed.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Key of the first item (the key a parent's pointer to this leaf carries).
    pub fn first_key(&self) -> Option<Key> {
        self.items.first().map(|(k, _)| *k)
    }

    /// Key of the last item pushed.
    pub fn last_key(&self) -> Option<Key> {
        self.items.last().map(|(k, _)| *k)
    }

    /// The finished block. From `header` it takes fsid, bytenr, flags, chunk_tree_uuid,
    /// generation and owner; nritems, level (0) and the checksum are computed.
    pub fn finish(&self, header: &Header, csum: CsumType) -> Result<Vec<u8>> {
        let mut block = vec![0u8; self.nodesize as usize];
        let data_size = leaf_data_size(self.nodesize);
        // Bodies go from the end of the block backwards, item 0 last in the block.
        let mut end = data_size;
        for (slot, (key, body)) in self.items.iter().enumerate() {
            let start = end - body.len();
            let ih = HEADER_SIZE + slot * ITEM_SIZE;
            put_at(&mut block, ih, &key.to_bytes())?;
            put_at(&mut block, ih + KEY_SIZE, &(start as u32).to_le_bytes())?;
            put_at(
                &mut block,
                ih + KEY_SIZE + 4,
                &(body.len() as u32).to_le_bytes(),
            )?;
            put_at(&mut block, HEADER_SIZE + start, body)?;
            end = start;
        }
        seal(&mut block, header, self.items.len(), 0, csum)?;
        Ok(block)
    }
}

/// A node (level >= 1) under construction.
#[derive(Clone, Debug)]
pub struct NodeBuilder {
    nodesize: u32,
    ptrs: Vec<KeyPtr>,
}

impl NodeBuilder {
    /// An empty node for blocks of `nodesize` bytes (a power of two in 4 KiB..=64 KiB).
    pub fn new(nodesize: u32) -> Result<NodeBuilder> {
        check_nodesize(nodesize)?;
        Ok(NodeBuilder {
            nodesize,
            ptrs: Vec::new(),
        })
    }

    /// True when no more pointers fit ([`max_node_ptrs`]).
    pub fn is_full(&self) -> bool {
        self.ptrs.len() >= max_node_ptrs(self.nodesize)
    }

    /// Appends a child pointer; keys strictly increasing, at most `max_node_ptrs`.
    pub fn push(&mut self, ptr: KeyPtr) -> Result<()> {
        if let Some(last) = self.ptrs.last() {
            if last.key >= ptr.key {
                invalid!(
                    "node pointers out of order: {:?} after {:?}",
                    ptr.key,
                    last.key
                );
            }
        }
        if self.is_full() {
            invalid!("node is full ({} pointers)", self.ptrs.len());
        }
        self.ptrs.push(ptr);
        Ok(())
    }

    /// Number of pointers pushed so far.
    pub fn nritems(&self) -> usize {
        self.ptrs.len()
    }

    /// Key of the first pointer (the key a parent's pointer to this node carries).
    pub fn first_key(&self) -> Option<Key> {
        self.ptrs.first().map(|p| p.key)
    }

    /// The finished block at `level` (1..8). A node must hold at least one pointer.
    pub fn finish(&self, header: &Header, level: u8, csum: CsumType) -> Result<Vec<u8>> {
        if level == 0 || level >= crate::tree_block::MAX_LEVEL {
            invalid!("node level {level} out of range");
        }
        if self.ptrs.is_empty() {
            invalid!("a node needs at least one pointer");
        }
        let mut block = vec![0u8; self.nodesize as usize];
        for (slot, p) in self.ptrs.iter().enumerate() {
            put_at(&mut block, HEADER_SIZE + slot * KEY_PTR_SIZE, &p.to_bytes())?;
        }
        seal(&mut block, header, self.ptrs.len(), level, csum)?;
        Ok(block)
    }
}
