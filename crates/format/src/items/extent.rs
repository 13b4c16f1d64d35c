//! EXTENT_ITEM / METADATA_ITEM with their inline back references.

use crate::bytes::{put_u32, put_u64, put_u8, u32_at, u64_at, u8_at};
use crate::csum::extent_data_ref_hash;
use crate::error::Result;
use crate::invalid;
use crate::key::{item, Key};

/// Extent item flag: a data extent.
pub const EXTENT_FLAG_DATA: u64 = 1 << 0;
/// Extent item flag: a tree block.
pub const EXTENT_FLAG_TREE_BLOCK: u64 = 1 << 1;
/// Tree blocks only: this block's children are referenced by parent (SHARED refs).
pub const EXTENT_FLAG_FULL_BACKREF: u64 = 1 << 8;

/// The fixed part of every extent item (refs, generation, flags).
pub const EXTENT_ITEM_HEADER: usize = 24;
/// The key + level that follow the header of a non-skinny tree block extent item.
pub const TREE_BLOCK_INFO_SIZE: usize = 18;

/// A back reference stored inside an extent item (`btrfs_extent_inline_ref`): who
/// references the extent. The same references may also live in keyed items of the same
/// types; an extent's `refs` is the sum over both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InlineRef {
    /// TREE_BLOCK_REF: tree `root` references this tree block.
    TreeBlock {
        /// Id of the referencing tree.
        root: u64,
    },
    /// SHARED_BLOCK_REF: the node at `parent` references this tree block (FULL_BACKREF).
    SharedBlock {
        /// Logical address of the parent node.
        parent: u64,
    },
    /// EXTENT_DATA_REF: `count` file extent items of inode `objectid` in tree `root` reference
    /// this data extent, all at file position `offset` for the extent's byte 0.
    Data {
        /// Id of the subvolume holding the file extent items.
        root: u64,
        /// Inode number of the file.
        objectid: u64,
        /// `key.offset - offset` of the file extent items: where the extent would start in
        /// the file.
        offset: u64,
        /// How many such file extent items there are.
        count: u32,
    },
    /// SHARED_DATA_REF: `count` file extent items in the leaf at `parent` reference this data
    /// extent.
    SharedData {
        /// Logical address of the leaf holding the file extent items.
        parent: u64,
        /// How many file extent items of that leaf reference the extent.
        count: u32,
    },
    /// EXTENT_OWNER_REF (simple quotas): the root charged for the extent. Counts no reference.
    Owner {
        /// Id of the owning root.
        root: u64,
    },
}

impl InlineRef {
    /// The type byte that starts this ref on disk.
    pub fn ref_type(&self) -> u8 {
        match self {
            InlineRef::TreeBlock { .. } => item::TREE_BLOCK_REF,
            InlineRef::SharedBlock { .. } => item::SHARED_BLOCK_REF,
            InlineRef::Data { .. } => item::EXTENT_DATA_REF,
            InlineRef::SharedData { .. } => item::SHARED_DATA_REF,
            InlineRef::Owner { .. } => item::EXTENT_OWNER_REF,
        }
    }

    /// On-disk size including the type byte.
    pub fn encoded_len(&self) -> usize {
        1 + match self {
            InlineRef::Data { .. } => 28,
            InlineRef::SharedData { .. } => 12,
            _ => 8,
        }
    }

    /// The number this ref contributes to the extent's `refs`.
    pub fn count(&self) -> u64 {
        match self {
            InlineRef::Data { count, .. } | InlineRef::SharedData { count, .. } => *count as u64,
            InlineRef::Owner { .. } => 0,
            _ => 1,
        }
    }

    /// Refs are sorted by type ascending, then by this value descending (the kernel's
    /// lookup relies on that order; recent tree-checkers verify it).
    pub fn sequence(&self) -> u64 {
        match *self {
            InlineRef::TreeBlock { root } | InlineRef::Owner { root } => root,
            InlineRef::SharedBlock { parent } | InlineRef::SharedData { parent, .. } => parent,
            InlineRef::Data {
                root,
                objectid,
                offset,
                ..
            } => extent_data_ref_hash(root, objectid, offset),
        }
    }

    /// Appends the ref as stored: type byte, then its fields.
    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_u8(out, self.ref_type());
        match *self {
            InlineRef::TreeBlock { root } | InlineRef::Owner { root } => put_u64(out, root),
            InlineRef::SharedBlock { parent } => put_u64(out, parent),
            InlineRef::Data {
                root,
                objectid,
                offset,
                count,
            } => {
                put_u64(out, root);
                put_u64(out, objectid);
                put_u64(out, offset);
                put_u32(out, count);
            }
            InlineRef::SharedData { parent, count } => {
                put_u64(out, parent);
                put_u32(out, count);
            }
        }
    }
}

/// The body of an EXTENT_ITEM or METADATA_ITEM (`btrfs_extent_item` and what follows): an
/// allocated extent, how often it is referenced, and its inline back references.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentItem {
    /// Total reference count: the sum of the counts of all refs, inline and keyed.
    pub refs: u64,
    /// Transaction id in which the extent was allocated.
    pub generation: u64,
    /// [`EXTENT_FLAG_DATA`] or [`EXTENT_FLAG_TREE_BLOCK`], and [`EXTENT_FLAG_FULL_BACKREF`].
    pub flags: u64,
    /// Non-skinny tree block extents record the block's first key and level.
    pub tree_block_info: Option<(Key, u8)>,
    /// The back references stored in the item itself.
    pub inline_refs: Vec<InlineRef>,
}

impl ExtentItem {
    /// `skinny` is true for METADATA_ITEM keys (no tree block info).
    pub fn parse(b: &[u8], skinny: bool) -> Result<ExtentItem> {
        let refs = u64_at(b, 0)?;
        let generation = u64_at(b, 8)?;
        let flags = u64_at(b, 16)?;
        let mut off = 24;
        let mut tree_block_info = None;
        if flags & EXTENT_FLAG_TREE_BLOCK != 0 && !skinny {
            tree_block_info = Some((Key::parse(b, off)?, u8_at(b, off + 17)?));
            off += 18;
        }
        let mut inline_refs = Vec::new();
        while off < b.len() {
            let t = u8_at(b, off)?;
            off += 1;
            let r = match t {
                item::TREE_BLOCK_REF => InlineRef::TreeBlock {
                    root: u64_at(b, off)?,
                },
                item::SHARED_BLOCK_REF => InlineRef::SharedBlock {
                    parent: u64_at(b, off)?,
                },
                item::EXTENT_OWNER_REF => InlineRef::Owner {
                    root: u64_at(b, off)?,
                },
                item::EXTENT_DATA_REF => InlineRef::Data {
                    root: u64_at(b, off)?,
                    objectid: u64_at(b, off + 8)?,
                    offset: u64_at(b, off + 16)?,
                    count: u32_at(b, off + 24)?,
                },
                item::SHARED_DATA_REF => InlineRef::SharedData {
                    parent: u64_at(b, off)?,
                    count: u32_at(b, off + 8)?,
                },
                other => invalid!("unknown inline backref type {other}"),
            };
            off += match r {
                InlineRef::Data { .. } => 28,
                InlineRef::SharedData { .. } => 12,
                _ => 8,
            };
            inline_refs.push(r);
        }
        Ok(ExtentItem {
            refs,
            generation,
            flags,
            tree_block_info,
            inline_refs,
        })
    }

    /// Puts the inline refs in on-disk order: type ascending, sequence descending.
    pub fn sort_inline_refs(&mut self) {
        self.inline_refs.sort_by(|a, b| {
            a.ref_type()
                .cmp(&b.ref_type())
                .then(b.sequence().cmp(&a.sequence()))
        });
    }

    /// On-disk size of the item body.
    pub fn encoded_len(&self) -> usize {
        EXTENT_ITEM_HEADER
            + self.tree_block_info.map_or(0, |_| TREE_BLOCK_INFO_SIZE)
            + self
                .inline_refs
                .iter()
                .map(InlineRef::encoded_len)
                .sum::<usize>()
    }

    /// Appends the item as stored: header, tree block info (only when present: set it for
    /// EXTENT_ITEM keys of tree blocks, leave it `None` for METADATA_ITEM and data), then
    /// the inline refs in the order given (see `sort_inline_refs`).
    pub fn write_into(&self, out: &mut Vec<u8>) {
        put_u64(out, self.refs);
        put_u64(out, self.generation);
        put_u64(out, self.flags);
        if let Some((key, level)) = self.tree_block_info {
            out.extend_from_slice(&key.to_bytes());
            put_u8(out, level);
        }
        for r in &self.inline_refs {
            r.write_into(out);
        }
    }

    /// The item body (see [`ExtentItem::write_into`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.write_into(&mut out);
        out
    }
}
