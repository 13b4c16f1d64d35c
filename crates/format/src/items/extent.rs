//! EXTENT_ITEM / METADATA_ITEM with their inline back references.

use crate::bytes::{put_u32, put_u64, put_u8, u32_at, u64_at, u8_at};
use crate::csum::extent_data_ref_hash;
use crate::error::Result;
use crate::invalid;
use crate::key::{item, Key};

pub const EXTENT_FLAG_DATA: u64 = 1 << 0;
pub const EXTENT_FLAG_TREE_BLOCK: u64 = 1 << 1;
/// Tree blocks only: this block's children are referenced by parent (SHARED refs).
pub const EXTENT_FLAG_FULL_BACKREF: u64 = 1 << 8;

/// The fixed part of every extent item (refs, generation, flags).
pub const EXTENT_ITEM_HEADER: usize = 24;
/// The key + level that follow the header of a non-skinny tree block extent item.
pub const TREE_BLOCK_INFO_SIZE: usize = 18;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InlineRef {
    TreeBlock {
        root: u64,
    },
    SharedBlock {
        parent: u64,
    },
    Data {
        root: u64,
        objectid: u64,
        offset: u64,
        count: u32,
    },
    SharedData {
        parent: u64,
        count: u32,
    },
    Owner {
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentItem {
    pub refs: u64,
    pub generation: u64,
    pub flags: u64,
    /// Non-skinny tree block extents record the block's first key and level.
    pub tree_block_info: Option<(Key, u8)>,
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

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.write_into(&mut out);
        out
    }
}
