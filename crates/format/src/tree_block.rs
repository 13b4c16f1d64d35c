//! Tree blocks: the header every node and leaf starts with, and read-only views of both.
//! Accessors are bounds-checked; `validate` decides whether a block is fit to use.

use crate::bytes::{array, put_at, slice, u32_at, u64_at, u8_at};
use crate::csum::CsumType;
use crate::error::Result;
use crate::key::{Key, KEY_SIZE};

pub const HEADER_SIZE: usize = 101;
pub const ITEM_SIZE: usize = 25;
pub const KEY_PTR_SIZE: usize = 33;
pub const MAX_LEVEL: u8 = 8;

pub const HEADER_FLAG_WRITTEN: u64 = 1 << 0;
pub const HEADER_FLAG_RELOC: u64 = 1 << 1;
pub const BACKREF_REV_SHIFT: u32 = 56;
pub const MIXED_BACKREF_REV: u64 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub csum: [u8; 32],
    pub fsid: [u8; 16],
    pub bytenr: u64,
    pub flags: u64,
    pub chunk_tree_uuid: [u8; 16],
    pub generation: u64,
    pub owner: u64,
    pub nritems: u32,
    pub level: u8,
}

impl Header {
    pub fn parse(b: &[u8]) -> Result<Header> {
        slice(b, 0, HEADER_SIZE)?;
        Ok(Header {
            csum: array(b, 0)?,
            fsid: array(b, 32)?,
            bytenr: u64_at(b, 48)?,
            flags: u64_at(b, 56)?,
            chunk_tree_uuid: array(b, 64)?,
            generation: u64_at(b, 80)?,
            owner: u64_at(b, 88)?,
            nritems: u32_at(b, 96)?,
            level: u8_at(b, 100)?,
        })
    }

    pub fn backref_rev(&self) -> u64 {
        self.flags >> BACKREF_REV_SHIFT
    }

    /// The flags of a freshly written block: WRITTEN, mixed backref revision.
    pub const fn new_block_flags() -> u64 {
        HEADER_FLAG_WRITTEN | (MIXED_BACKREF_REV << BACKREF_REV_SHIFT)
    }

    /// Writes the header fields into the first 101 bytes of `block` (csum included as is;
    /// see `write_csum` to fill it).
    pub fn write_into(&self, block: &mut [u8]) -> Result<()> {
        put_at(block, 0, &self.csum)?;
        put_at(block, 32, &self.fsid)?;
        put_at(block, 48, &self.bytenr.to_le_bytes())?;
        put_at(block, 56, &self.flags.to_le_bytes())?;
        put_at(block, 64, &self.chunk_tree_uuid)?;
        put_at(block, 80, &self.generation.to_le_bytes())?;
        put_at(block, 88, &self.owner.to_le_bytes())?;
        put_at(block, 96, &self.nritems.to_le_bytes())?;
        put_at(block, 100, &[self.level])
    }
}

/// Computes the checksum of a tree block (or superblock) over bytes `[32, len)` and stores it
/// in the 32-byte csum field at offset 0.
pub fn write_csum(block: &mut [u8], csum_type: CsumType) -> Result<()> {
    let body = slice(block, 32, block.len().saturating_sub(32))?;
    let digest = csum_type.compute(body);
    put_at(block, 0, &digest)
}

/// A leaf item header: its key and where its body lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemHeader {
    pub key: Key,
    /// Body offset relative to the end of the block header.
    pub offset: u32,
    pub size: u32,
}

/// A node's pointer to a child block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPtr {
    pub key: Key,
    pub blockptr: u64,
    pub generation: u64,
}

impl KeyPtr {
    pub fn to_bytes(&self) -> [u8; KEY_PTR_SIZE] {
        let mut b = [0u8; KEY_PTR_SIZE];
        b[..KEY_SIZE].copy_from_slice(&self.key.to_bytes());
        b[KEY_SIZE..KEY_SIZE + 8].copy_from_slice(&self.blockptr.to_le_bytes());
        b[KEY_SIZE + 8..].copy_from_slice(&self.generation.to_le_bytes());
        b
    }
}

/// A view of one tree block's bytes.
#[derive(Clone, Copy)]
pub struct TreeBlock<'a> {
    data: &'a [u8],
    nritems: usize,
    level: u8,
}

impl<'a> TreeBlock<'a> {
    pub fn new(data: &'a [u8]) -> Result<TreeBlock<'a>> {
        slice(data, 0, HEADER_SIZE)?;
        Ok(TreeBlock {
            data,
            nritems: u32_at(data, 96)? as usize,
            level: u8_at(data, 100)?,
        })
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    pub fn header(&self) -> Result<Header> {
        Header::parse(self.data)
    }

    pub fn nritems(&self) -> usize {
        self.nritems
    }

    pub fn level(&self) -> u8 {
        self.level
    }

    pub fn is_leaf(&self) -> bool {
        self.level == 0
    }

    pub fn generation(&self) -> u64 {
        u64_at(self.data, 80).unwrap_or(0)
    }

    pub fn owner(&self) -> u64 {
        u64_at(self.data, 88).unwrap_or(0)
    }

    pub fn bytenr(&self) -> u64 {
        u64_at(self.data, 48).unwrap_or(0)
    }

    pub fn item(&self, slot: usize) -> Result<ItemHeader> {
        let off = HEADER_SIZE + slot * ITEM_SIZE;
        Ok(ItemHeader {
            key: Key::parse(self.data, off)?,
            offset: u32_at(self.data, off + KEY_SIZE)?,
            size: u32_at(self.data, off + KEY_SIZE + 4)?,
        })
    }

    pub fn item_key(&self, slot: usize) -> Result<Key> {
        Key::parse(self.data, HEADER_SIZE + slot * ITEM_SIZE)
    }

    /// The body of leaf item `slot`.
    pub fn item_data(&self, slot: usize) -> Result<&'a [u8]> {
        let it = self.item(slot)?;
        slice(
            self.data,
            HEADER_SIZE + it.offset as usize,
            it.size as usize,
        )
    }

    pub fn key_ptr(&self, slot: usize) -> Result<KeyPtr> {
        let off = HEADER_SIZE + slot * KEY_PTR_SIZE;
        Ok(KeyPtr {
            key: Key::parse(self.data, off)?,
            blockptr: u64_at(self.data, off + KEY_SIZE)?,
            generation: u64_at(self.data, off + KEY_SIZE + 8)?,
        })
    }

    /// The key at `slot`, item or pointer depending on the level.
    pub fn key_at(&self, slot: usize) -> Result<Key> {
        if self.is_leaf() {
            self.item_key(slot)
        } else {
            Key::parse(self.data, HEADER_SIZE + slot * KEY_PTR_SIZE)
        }
    }

    /// Binary search: `Ok(slot)` when `key` is at `slot`, `Err(slot)` for the position it
    /// would be inserted at (the first key greater than it). Keys are validated sorted.
    pub fn search(&self, key: &Key) -> Result<std::result::Result<usize, usize>> {
        let (mut lo, mut hi) = (0usize, self.nritems);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let k = self.key_at(mid)?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(Ok(mid)),
            }
        }
        Ok(Err(lo))
    }

    /// For a node: the child slot whose subtree may contain `key` (the last pointer whose key
    /// is <= `key`, or 0).
    pub fn child_slot_for(&self, key: &Key) -> Result<usize> {
        Ok(match self.search(key)? {
            Ok(slot) => slot,
            Err(0) => 0,
            Err(slot) => slot - 1,
        })
    }
}
