//! Tree blocks: the header every node and leaf starts with, and read-only views of both.
//! Accessors are bounds-checked; `validate` decides whether a block is fit to use.

use crate::bytes::{array, put_at, slice, u32_at, u64_at, u8_at};
use crate::csum::CsumType;
use crate::error::Result;
use crate::key::{Key, KEY_SIZE};

/// Size of the header every tree block starts with (`btrfs_header`).
pub const HEADER_SIZE: usize = 101;
/// Size of a leaf item header (`btrfs_item`): key, body offset, body size.
pub const ITEM_SIZE: usize = 25;
/// Size of a node's child pointer (`btrfs_key_ptr`): key, block address, generation.
pub const KEY_PTR_SIZE: usize = 33;
/// Number of levels a tree may have (`BTRFS_MAX_LEVEL`): levels run from 0 (leaves) to 7.
pub const MAX_LEVEL: u8 = 8;

/// Header flag: the block has been written out; it must be COWed before it changes.
pub const HEADER_FLAG_WRITTEN: u64 = 1 << 0;
/// Header flag: the block belongs to a relocation tree (balance).
pub const HEADER_FLAG_RELOC: u64 = 1 << 1;
/// The header flags' top byte (bits 56..64) holds the back reference revision.
pub const BACKREF_REV_SHIFT: u32 = 56;
/// Back reference revision of every block of a MIXED_BACKREF filesystem.
pub const MIXED_BACKREF_REV: u64 = 1;

/// The header at the start of every node and leaf (`btrfs_header`, 101 bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Checksum of bytes `[32, nodesize)` of the block, zero-padded.
    pub csum: [u8; 32],
    /// The filesystem's fsid (its `metadata_uuid` with METADATA_UUID).
    pub fsid: [u8; 16],
    /// Logical address of this block; must equal where it was read from.
    pub bytenr: u64,
    /// Flags ([`HEADER_FLAG_WRITTEN`], [`HEADER_FLAG_RELOC`]) and, in the top byte, the
    /// back reference revision.
    pub flags: u64,
    /// UUID of the chunk tree, the same in every block of the filesystem.
    pub chunk_tree_uuid: [u8; 16],
    /// Transaction id in which this block was written.
    pub generation: u64,
    /// Id of the tree the block belongs to (at the time it was created).
    pub owner: u64,
    /// Number of items (leaf) or child pointers (node).
    pub nritems: u32,
    /// 0 for a leaf, 1 to 7 for a node (one more than its children).
    pub level: u8,
}

impl Header {
    /// Reads the header from the first 101 bytes of `b`.
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

    /// The back reference revision (top byte of `flags`; [`MIXED_BACKREF_REV`] normally).
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
    /// The item's key.
    pub key: Key,
    /// Body offset relative to the end of the block header.
    pub offset: u32,
    /// Body length in bytes.
    pub size: u32,
}

/// A node's pointer to a child block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPtr {
    /// The child's first key (the lowest key in its subtree).
    pub key: Key,
    /// Logical address of the child block.
    pub blockptr: u64,
    /// The child's header generation; a read must find exactly this.
    pub generation: u64,
}

impl KeyPtr {
    /// The 33-byte on-disk pointer.
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
    /// A view of `data`, which must hold at least a header. Checks nothing else: use
    /// [`check_tree_block`](crate::validate::check_tree_block) before trusting the rest.
    pub fn new(data: &'a [u8]) -> Result<TreeBlock<'a>> {
        slice(data, 0, HEADER_SIZE)?;
        Ok(TreeBlock {
            data,
            nritems: u32_at(data, 96)? as usize,
            level: u8_at(data, 100)?,
        })
    }

    /// The whole block.
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    /// The parsed header.
    pub fn header(&self) -> Result<Header> {
        Header::parse(self.data)
    }

    /// Number of items (leaf) or child pointers (node).
    pub fn nritems(&self) -> usize {
        self.nritems
    }

    /// The block's level: 0 for a leaf.
    pub fn level(&self) -> u8 {
        self.level
    }

    /// True for a leaf (level 0).
    pub fn is_leaf(&self) -> bool {
        self.level == 0
    }

    /// Transaction id in which the block was written.
    pub fn generation(&self) -> u64 {
        u64_at(self.data, 80).unwrap_or(0)
    }

    /// Id of the tree the block belongs to.
    pub fn owner(&self) -> u64 {
        u64_at(self.data, 88).unwrap_or(0)
    }

    /// Logical address the block claims as its own.
    pub fn bytenr(&self) -> u64 {
        u64_at(self.data, 48).unwrap_or(0)
    }

    /// Leaf item header `slot`.
    pub fn item(&self, slot: usize) -> Result<ItemHeader> {
        let off = HEADER_SIZE + slot * ITEM_SIZE;
        Ok(ItemHeader {
            key: Key::parse(self.data, off)?,
            offset: u32_at(self.data, off + KEY_SIZE)?,
            size: u32_at(self.data, off + KEY_SIZE + 4)?,
        })
    }

    /// The key of leaf item `slot`.
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

    /// Node child pointer `slot`.
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
