//! EXTENT_ITEM / METADATA_ITEM with their inline back references.

use crate::bytes::{u32_at, u64_at, u8_at};
use crate::error::Result;
use crate::invalid;
use crate::key::{item, Key};

pub const EXTENT_FLAG_DATA: u64 = 1 << 0;
pub const EXTENT_FLAG_TREE_BLOCK: u64 = 1 << 1;

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
}
