//! The tree checker: decides whether a tree block read from disk may be trusted.
//! Modelled on what the kernel checks before it uses a block (format digest 2.6): the
//! checksum, where the block claims to be, its place in the tree, its structure, and the
//! items the engine interprets.

use crate::bytes::{u16_at, u32_at};
use crate::csum::{name_hash, CsumType};
use crate::error::{FormatError, Result};
use crate::invalid;
use crate::items::{
    ChunkItem, DevItem, DirEntryIter, FileExtent, FileExtentBody, FileType, InodeItem,
};
use crate::key::{item, objectid, Key};
use crate::tree_block::{TreeBlock, HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE, MAX_LEVEL};

/// Filesystem-wide facts a block is checked against.
#[derive(Clone, Debug)]
pub struct FsContext {
    /// Tree block size (superblock `nodesize`).
    pub nodesize: u32,
    /// Data block size (superblock `sectorsize`); block addresses and extents align to it.
    pub sectorsize: u32,
    /// Checksum algorithm of the filesystem.
    pub csum_type: CsumType,
    /// The fsid every header must carry
    /// ([`Superblock::metadata_fsid`](crate::Superblock::metadata_fsid)).
    pub metadata_fsid: [u8; 16],
    /// The superblock's generation: nothing in a block may be newer than the next one.
    pub super_generation: u64,
}

/// What the reader of a block expects it to be, from the pointer that led to it.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    /// Logical address the block was read from; the header must claim it.
    pub bytenr: u64,
    /// Level the parent pointer, ROOT_ITEM or superblock gives, if known.
    pub level: Option<u8>,
    /// Generation the parent pointer, ROOT_ITEM or superblock gives, if known
    /// (a mismatch is the kernel's "parent transid verify failed").
    pub generation: Option<u64>,
    /// Key the parent's pointer carries, if known: the block's first key must equal it.
    pub first_key: Option<Key>,
}

/// Full check of one block: checksum first (cheap to report, and everything else is noise
/// if it fails), then identity, then structure, then items.
pub fn check_tree_block(data: &[u8], ctx: &FsContext, expect: &Expect) -> Result<()> {
    // The engine's context comes from a checked superblock, but this function is also fuzzed
    // with arbitrary ones: a tiny nodesize would slice out of bounds, a zero sectorsize
    // divide by zero.
    if (ctx.nodesize as usize) < HEADER_SIZE || ctx.sectorsize == 0 {
        invalid!(
            "nodesize {} / sectorsize {} unusable",
            ctx.nodesize,
            ctx.sectorsize
        );
    }
    if data.len() != ctx.nodesize as usize {
        invalid!(
            "block is {} bytes, nodesize is {}",
            data.len(),
            ctx.nodesize
        );
    }
    if !ctx.csum_type.verify(&data[32..], &data[..32]) {
        return Err(FormatError::ChecksumMismatch);
    }
    check_tree_block_but_csum(data, ctx, expect)
}

/// The least a block must hold to be read at all, for a block that failed the full check
/// on every copy and that the user asked to read anyway (oleo's `rescue=ignoremetacsums`,
/// what `btrfs restore` reads): the address, fsid and level it claims, and an item count
/// that fits the block. Neither checksum, generation nor items are checked.
pub fn check_tree_block_identity(data: &[u8], ctx: &FsContext, expect: &Expect) -> Result<()> {
    if (ctx.nodesize as usize) < HEADER_SIZE || data.len() != ctx.nodesize as usize {
        invalid!(
            "block is {} bytes, nodesize is {}",
            data.len(),
            ctx.nodesize
        );
    }
    let block = TreeBlock::new(data)?;
    let h = block.header()?;
    if h.bytenr != expect.bytenr {
        invalid!(
            "block claims bytenr {} but was read at {}",
            h.bytenr,
            expect.bytenr
        );
    }
    if h.fsid != ctx.metadata_fsid {
        invalid!("block belongs to another filesystem (fsid mismatch)");
    }
    if h.level >= MAX_LEVEL {
        invalid!("level {} out of range", h.level);
    }
    if let Some(level) = expect.level {
        if h.level != level {
            invalid!("level {} where {} was expected", h.level, level);
        }
    }
    let per = if block.is_leaf() {
        ITEM_SIZE
    } else {
        KEY_PTR_SIZE
    };
    if block.nritems().saturating_mul(per) > data.len() - HEADER_SIZE {
        invalid!("{} items do not fit the block", block.nritems());
    }
    Ok(())
}

/// Every check of [`check_tree_block`] but the checksum: for a block whose checksum failed
/// on every copy, when the user asked to read it anyway (`rescue=ignoremetacsums`).
pub fn check_tree_block_but_csum(data: &[u8], ctx: &FsContext, expect: &Expect) -> Result<()> {
    if ctx.sectorsize == 0 {
        invalid!("sectorsize 0 unusable");
    }
    check_tree_block_identity(data, ctx, expect)?;
    let block = TreeBlock::new(data)?;
    let h = block.header()?;
    if let Some(generation) = expect.generation {
        if h.generation != generation {
            invalid!(
                "generation {} where the parent says {} (parent transid verify failed)",
                h.generation,
                generation
            );
        }
    }
    if h.generation > ctx.super_generation.saturating_add(1) {
        invalid!(
            "generation {} is newer than the filesystem ({})",
            h.generation,
            ctx.super_generation
        );
    }
    if block.is_leaf() {
        check_leaf(&block, ctx)?;
    } else {
        check_node(&block, ctx)?;
    }
    if let Some(first) = expect.first_key {
        if block.nritems() > 0 && block.key_at(0)? != first {
            invalid!(
                "first key {:?} differs from the parent's {:?}",
                block.key_at(0)?,
                first
            );
        }
    }
    Ok(())
}

fn check_node(block: &TreeBlock, ctx: &FsContext) -> Result<()> {
    let n = block.nritems();
    let max = (ctx.nodesize as usize - HEADER_SIZE) / KEY_PTR_SIZE;
    if n == 0 || n > max {
        invalid!("node has {n} pointers, allowed 1..={max}");
    }
    let mut prev: Option<Key> = None;
    for slot in 0..n {
        let p = block.key_ptr(slot)?;
        if p.blockptr == 0 || p.blockptr % ctx.sectorsize as u64 != 0 {
            invalid!("pointer {slot} to unaligned or zero block {}", p.blockptr);
        }
        if p.generation > ctx.super_generation.saturating_add(1) {
            invalid!(
                "pointer {slot} generation {} is in the future",
                p.generation
            );
        }
        if prev.is_some_and(|k| k >= p.key) {
            invalid!("node keys out of order at slot {slot}");
        }
        prev = Some(p.key);
    }
    Ok(())
}

fn check_leaf(block: &TreeBlock, ctx: &FsContext) -> Result<()> {
    let n = block.nritems();
    let data_size = ctx.nodesize as usize - HEADER_SIZE;
    if n * ITEM_SIZE > data_size {
        invalid!("leaf claims {n} items, more than fit");
    }
    let mut prev: Option<Key> = None;
    let mut expected_end = data_size;
    for slot in 0..n {
        let it = block.item(slot)?;
        let (off, size) = (it.offset as usize, it.size as usize);
        if off.checked_add(size) != Some(expected_end) {
            invalid!("item {slot} body [{off}, +{size}) is not packed against the previous one (ends at {expected_end})");
        }
        if off < n * ITEM_SIZE {
            invalid!("item {slot} body overlaps the item headers");
        }
        expected_end = off;
        if prev.is_some_and(|k| k >= it.key) {
            invalid!("leaf keys out of order at slot {slot}");
        }
        prev = Some(it.key);
        check_item(block, slot, &it.key, ctx)
            .map_err(|e| FormatError::Invalid(format!("item {slot} {:?}: {e}", it.key)))?;
    }
    Ok(())
}

/// Per-item rules for the items the engine interprets.
fn check_item(block: &TreeBlock, slot: usize, key: &Key, ctx: &FsContext) -> Result<()> {
    let body = block.item_data(slot)?;
    let sector = ctx.sectorsize as u64;
    match key.item_type {
        item::INODE_ITEM => {
            let inode = InodeItem::parse(body)?;
            if body.len() != InodeItem::SIZE {
                invalid!("inode item size {}", body.len());
            }
            if inode.generation > ctx.super_generation.saturating_add(1)
                || inode.transid > ctx.super_generation.saturating_add(1)
            {
                invalid!("inode generation in the future");
            }
            if !valid_mode(inode.mode) {
                invalid!("invalid mode {:o}", inode.mode);
            }
        }
        item::DIR_ITEM | item::DIR_INDEX | item::XATTR_ITEM => {
            let mut count = 0;
            for e in DirEntryIter::new(body) {
                let e = e?;
                count += 1;
                let is_xattr = key.item_type == item::XATTR_ITEM;
                if is_xattr != (e.kind() == FileType::Xattr) {
                    invalid!(
                        "entry type {} in a {} item",
                        e.file_type,
                        if is_xattr { "xattr" } else { "dir" }
                    );
                }
                if e.kind() == FileType::Unknown {
                    invalid!("entry with unknown file type {}", e.file_type);
                }
                if e.name.is_empty() || e.name.len() > 255 {
                    invalid!("name length {}", e.name.len());
                }
                if !is_xattr && !e.data.is_empty() {
                    invalid!("directory entry carries {} data bytes", e.data.len());
                }
                if key.item_type != item::DIR_INDEX && name_hash(e.name) != key.offset {
                    invalid!("name hash mismatch");
                }
            }
            if key.item_type == item::DIR_INDEX && count != 1 {
                invalid!("dir index holds {count} entries");
            }
        }
        item::INODE_REF => {
            let mut off = 0;
            while off < body.len() {
                let len = u16_at(body, off + 8)? as usize;
                crate::bytes::slice(body, off + 10, len)?;
                off += 10 + len;
            }
        }
        item::EXTENT_DATA => {
            let fe = FileExtent::parse(body)?;
            match fe.body {
                FileExtentBody::Inline { data } => {
                    if key.offset != 0 {
                        invalid!("inline extent at file offset {}", key.offset);
                    }
                    if fe.compression == crate::items::Compression::None
                        && data.len() as u64 != fe.ram_bytes
                    {
                        invalid!(
                            "inline extent holds {} bytes, ram_bytes {}",
                            data.len(),
                            fe.ram_bytes
                        );
                    }
                }
                FileExtentBody::Extent {
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    num_bytes,
                    ..
                } => {
                    for (name, v) in [
                        ("file offset", key.offset),
                        ("disk_bytenr", disk_bytenr),
                        ("disk_num_bytes", disk_num_bytes),
                        ("offset", offset),
                        ("num_bytes", num_bytes),
                    ] {
                        if v % sector != 0 {
                            invalid!("{name} {v} not sector aligned");
                        }
                    }
                    if key.offset.checked_add(num_bytes).is_none() {
                        invalid!("extent end overflows");
                    }
                }
            }
        }
        item::EXTENT_CSUM
            if (key.objectid != objectid::EXTENT_CSUM
                || body.len() % ctx.csum_type.size() != 0
                || !key.offset.is_multiple_of(sector)) =>
        {
            invalid!("bad csum item");
        }
        item::CHUNK_ITEM => {
            let c = ChunkItem::parse(body)?;
            if c.length == 0 || c.length % sector != 0 || !key.offset.is_multiple_of(sector) {
                invalid!("chunk start/length not aligned");
            }
            if c.stripe_len != 65536 {
                invalid!("chunk stripe_len {}", c.stripe_len);
            }
        }
        item::DEV_ITEM if body.len() != DevItem::SIZE => {
            invalid!("dev item size {}", body.len());
        }
        item::ROOT_ITEM => {
            crate::items::RootItem::parse(body)?;
        }
        item::BLOCK_GROUP_ITEM if body.len() != 24 => {
            invalid!("block group item size {}", body.len());
        }
        item::DEV_EXTENT if body.len() != 48 => {
            invalid!("dev extent size {}", body.len());
        }
        item::FREE_SPACE_INFO => {
            u32_at(body, 4)?;
        }
        _ => {}
    }
    Ok(())
}

fn valid_mode(mode: u32) -> bool {
    matches!(
        mode & libc_s_ifmt(),
        0o140000 | 0o120000 | 0o100000 | 0o060000 | 0o040000 | 0o020000 | 0o010000
    )
}

const fn libc_s_ifmt() -> u32 {
    0o170000
}
