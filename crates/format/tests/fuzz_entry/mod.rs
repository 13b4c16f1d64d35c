//! Fuzz entry points over the format layer, shared by the cargo-fuzz targets in `fuzz/`
//! (included with `#[path]`) and the stable randomized test `tests/fuzz_format.rs`.
//!
//! Each takes arbitrary bytes and must return without panicking, whatever they are. Where a
//! check (magic, checksum, fsid, bytenr) would stop almost every random input at the door,
//! the entry point repairs it first so the fuzzer reaches the code behind it.
#![allow(dead_code)]

use oleo_format::compression::decompress;
use oleo_format::csum::{name_hash, CsumType};
use oleo_format::items::{
    block_group, BlockGroupItem, ChunkItem, Compression, DevExtent, DevItem, DirEntryIter,
    ExtentItem, FileExtent, FreeSpaceInfo, InodeExtref, InodeItem, InodeRef, RootItem, RootRef,
};
use oleo_format::key::{item, Key};
use oleo_format::superblock::{self, Superblock, SUPER_INFO_SIZE};
use oleo_format::tree_block::HEADER_SIZE;
use oleo_format::validate::{check_tree_block, Expect, FsContext};
use oleo_format::TreeBlock;

const CSUMS: [CsumType; 4] = [
    CsumType::Crc32c,
    CsumType::Xxhash64,
    CsumType::Sha256,
    CsumType::Blake2b,
];

/// Superblock parsing, as is and with magic and checksum repaired (so the field checks and
/// the sys_chunk_array walk are reached).
pub fn superblock(data: &[u8]) {
    use_superblock(Superblock::parse(data));
    if data.len() >= SUPER_INFO_SIZE {
        let mut b = data[..SUPER_INFO_SIZE].to_vec();
        b[64..72].copy_from_slice(&superblock::MAGIC.to_le_bytes());
        let csum = CSUMS[(b[196] % 4) as usize];
        b[196..198].copy_from_slice(&csum.raw().to_le_bytes());
        let c = csum.compute(&b[32..]);
        b[..32].copy_from_slice(&c);
        use_superblock(Superblock::parse(&b));
    }
}

fn use_superblock(r: oleo_format::Result<Superblock>) {
    if let Ok(sb) = r {
        let _ = sb.sys_chunks();
        let _ = sb.metadata_fsid();
        let _ = sb.csum_type();
        let _ = superblock::flag_names(sb.incompat_flags, superblock::incompat::NAMES);
        let _ = format!("{sb:?}");
    }
}

/// A context derived from the first 8 bytes of the input.
fn context(b: &[u8]) -> FsContext {
    let g = |i: usize| b.get(i).copied().unwrap_or(0);
    let nodesize = [4096u32, 8192, 16384, 65536][(g(0) % 4) as usize];
    FsContext {
        nodesize,
        sectorsize: if g(1) % 2 == 0 {
            4096
        } else {
            nodesize.min(65536)
        },
        csum_type: CSUMS[(g(2) % 4) as usize],
        metadata_fsid: [g(3); 16],
        super_generation: u64::from_le_bytes([g(4), g(5), g(6), g(7), 0, 0, 0, 0]),
    }
}

/// The tree checker with a context from the input: once on the raw bytes (with an arbitrary
/// nodesize too), once with the block made to look like ours (size, fsid, bytenr, checksum)
/// so that the structure and item checks run. Then every accessor and item parser on the
/// block, whether or not the checker accepted it.
pub fn tree_block(data: &[u8]) {
    let ctx = context(data);
    let body = data.get(8..).unwrap_or(&[]);
    let expect = Expect {
        bytenr: 1 << 20,
        level: data.get(8).map(|l| l % 9),
        generation: None,
        first_key: None,
    };
    // Raw, with the context's nodesize and with one taken from the input.
    let _ = check_tree_block(body, &ctx, &expect);
    let odd = FsContext {
        nodesize: body.len() as u32,
        sectorsize: u32::from(data.get(1).copied().unwrap_or(0)),
        ..ctx.clone()
    };
    let _ = check_tree_block(body, &odd, &expect);
    // Repaired.
    let mut block = body.to_vec();
    block.resize(ctx.nodesize as usize, 0);
    if block.len() >= HEADER_SIZE {
        block[32..48].copy_from_slice(&ctx.metadata_fsid);
        block[48..56].copy_from_slice(&expect.bytenr.to_le_bytes());
        let c = ctx.csum_type.compute(&block[32..]);
        block[..32].copy_from_slice(&c);
    }
    let _ = check_tree_block(
        &block,
        &ctx,
        &Expect {
            level: None,
            ..expect.clone()
        },
    );
    walk_block(&block);
    walk_block(body);
}

/// Every accessor of a block and every parser on every item body, errors ignored.
fn walk_block(b: &[u8]) {
    let Ok(tb) = TreeBlock::new(b) else { return };
    let _ = tb.header();
    let (_, _, _) = (tb.generation(), tb.owner(), tb.bytenr());
    // nritems is a raw u32: look at a bounded number of slots.
    let n = tb.nritems().min(b.len() / 17 + 2);
    for slot in 0..n {
        let _ = tb.key_at(slot);
        if tb.is_leaf() {
            if let (Ok(it), Ok(body)) = (tb.item(slot), tb.item_data(slot)) {
                items_of_type(it.key.item_type, body);
            }
        } else {
            let _ = tb.key_ptr(slot);
        }
    }
    let probe = Key::new(256, item::DIR_INDEX, 2);
    let _ = tb.search(&probe);
    let _ = tb.child_slot_for(&probe);
    let _ = tb.search(&Key::MAX);
    let _ = tb.search(&Key::MIN);
}

/// Item parsers: the first byte picks the item type, the rest is the body.
pub fn items(data: &[u8]) {
    let Some((&t, body)) = data.split_first() else {
        return;
    };
    items_of_type(t, body);
    // And every parser on the same bytes, whatever the type byte says.
    for t in [
        item::INODE_ITEM,
        item::INODE_REF,
        item::INODE_EXTREF,
        item::DIR_ITEM,
        item::EXTENT_DATA,
        item::ROOT_ITEM,
        item::ROOT_REF,
        item::EXTENT_ITEM,
        item::METADATA_ITEM,
        item::CHUNK_ITEM,
        item::DEV_ITEM,
        item::DEV_EXTENT,
        item::BLOCK_GROUP_ITEM,
        item::FREE_SPACE_INFO,
    ] {
        items_of_type(t, body);
    }
}

fn items_of_type(t: u8, body: &[u8]) {
    match t {
        item::INODE_ITEM => {
            let _ = InodeItem::parse(body);
        }
        item::INODE_REF => {
            let _ = InodeRef::parse_all(body);
        }
        item::INODE_EXTREF => {
            let _ = InodeExtref::parse_all(body);
        }
        item::DIR_ITEM | item::DIR_INDEX | item::XATTR_ITEM => {
            for e in DirEntryIter::new(body).take(1 << 16).flatten() {
                let _ = (e.kind(), name_hash(e.name));
            }
        }
        item::EXTENT_DATA => {
            if let Ok(fe) = FileExtent::parse(body) {
                let _ = fe.file_len();
                let _ = fe.compression.name();
            }
        }
        item::ROOT_ITEM => {
            let _ = RootItem::parse(body);
        }
        item::ROOT_REF | item::ROOT_BACKREF => {
            let _ = RootRef::parse(body);
        }
        item::EXTENT_ITEM | item::METADATA_ITEM => {
            let _ = ExtentItem::parse(body, t == item::METADATA_ITEM);
        }
        item::CHUNK_ITEM => {
            if let Ok(c) = ChunkItem::parse(body) {
                let _ = block_group::describe(c.chunk_type);
            }
        }
        item::DEV_ITEM => {
            let _ = DevItem::parse(body);
        }
        item::DEV_EXTENT => {
            let _ = DevExtent::parse(body);
        }
        item::BLOCK_GROUP_ITEM => {
            let _ = BlockGroupItem::parse(body);
        }
        item::FREE_SPACE_INFO => {
            let _ = FreeSpaceInfo::parse(body);
        }
        _ => {
            let _ = Key::parse(body, 0);
        }
    }
}

/// Decompression: byte 0 picks the algorithm, bytes 1..3 the output bound (up to 256 KiB),
/// byte 3 the sector size; the rest is the stream. The output never exceeds the bound.
pub fn decompression(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let kind = [
        Compression::None,
        Compression::Zlib,
        Compression::Lzo,
        Compression::Zstd,
    ][(data[0] % 4) as usize];
    let max_out = (u16::from_le_bytes([data[1], data[2]]) as usize) * 4;
    let sectorsize = [4096usize, 8192, 16384, 65536][(data[3] % 4) as usize];
    let input = &data[4..];
    if let Ok(out) = decompress(kind, input, max_out, sectorsize) {
        assert!(
            out.len() <= max_out,
            "{kind:?}: {} bytes out, bound {max_out}",
            out.len()
        );
    }
    // Odd sector sizes must be refused, not divide by zero or allocate wildly.
    let _ = decompress(kind, input, max_out.min(4096), data[3] as usize);
}
