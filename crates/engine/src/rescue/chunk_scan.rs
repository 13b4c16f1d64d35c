//! The chunk map rebuilt without the chunk tree, in memory, as `btrfs rescue chunk-recover`
//! does on disk: every device is read from end to end, and each verified tree block found
//! there gives up its items. Chunk items (from any older copy of a chunk tree leaf) come
//! first; then chunks the chunk tree no longer describes are put together from their block
//! group item (start, length, type) and their dev extents (where the stripes are).

use crate::io::disk_io::DiskIo;
use crate::io::volumes::ChunkMap;
use oleo_format::items::block_group as bg;
use oleo_format::items::{BlockGroupItem, ChunkItem, DevExtent, Stripe};
use oleo_format::key::{item, objectid};
use oleo_format::superblock::Superblock;
use oleo_format::tree_block::{Header, HEADER_SIZE, MAX_LEVEL};
use oleo_format::validate::{check_tree_block, Expect, FsContext};
use oleo_format::TreeBlock;
use std::collections::{BTreeMap, BTreeSet};

/// Bytes read at once.
const PIECE: usize = 4 << 20;
/// The stripe length of every btrfs chunk.
const STRIPE_LEN: u64 = 64 << 10;
/// Items kept from the scan, whatever the image claims (about 100 bytes each).
const MAX_ITEMS: usize = 1 << 20;

/// What the scan found, newest generation winning per key.
#[derive(Default)]
struct Found {
    /// logical start -> (generation, chunk)
    chunks: BTreeMap<u64, (u64, ChunkItem)>,
    /// (devid, physical) -> (generation, dev extent)
    dev_extents: BTreeMap<(u64, u64), (u64, DevExtent)>,
    /// logical start -> (generation, length, flags)
    groups: BTreeMap<u64, (u64, u64, u64)>,
    /// Logical addresses of the verified tree blocks seen: they are metadata.
    tree_blocks: BTreeSet<u64>,
    items: usize,
}

/// Adds to `map` the chunks a scan of the devices finds that it lacks. Returns how many.
pub(crate) fn recover(io: &DiskIo, sb: &Superblock, map: &mut ChunkMap) -> usize {
    let ctx = sb.fs_context();
    let nodesize = sb.nodesize as usize;
    let step = (sb.sectorsize as usize).max(512);
    if !(HEADER_SIZE..=PIECE).contains(&nodesize) || !nodesize.is_multiple_of(step) {
        return 0;
    }
    let mut found = Found::default();
    let devices: Vec<u64> = io.devices().members().map(|(d, _)| d).collect();
    for devid in devices {
        let Some(dev) = io.devices().get(devid) else {
            continue;
        };
        let size = dev.size();
        let mut buf = vec![0u8; PIECE + nodesize];
        let mut at = 0u64;
        while at < size {
            let n = ((size - at) as usize).min(buf.len());
            if n < nodesize || dev.read_exact_at(&mut buf[..n], at).is_err() {
                at = at.saturating_add(PIECE as u64);
                continue;
            }
            let mut off = 0;
            while off < PIECE && off + nodesize <= n {
                let block = &buf[off..off + nodesize];
                if take_block(block, &ctx, &mut found) {
                    // A verified block covers its own bytes: the next one starts after it.
                    off += nodesize;
                } else {
                    off += step;
                }
            }
            at = at.saturating_add(PIECE as u64);
        }
    }
    assemble(found, sb, map)
}

/// Checks one candidate block; keeps its chunk, dev extent and block group items.
fn take_block(block: &[u8], ctx: &FsContext, found: &mut Found) -> bool {
    if block[32..48] != ctx.metadata_fsid {
        return false;
    }
    let Ok(h) = Header::parse(block) else {
        return false;
    };
    if h.level >= MAX_LEVEL {
        return false;
    }
    let expect = Expect {
        bytenr: h.bytenr,
        ..Expect::default()
    };
    if check_tree_block(block, ctx, &expect).is_err() {
        return false;
    }
    if found.tree_blocks.len() < MAX_ITEMS {
        found.tree_blocks.insert(h.bytenr);
    }
    let wanted = matches!(
        h.owner,
        objectid::CHUNK_TREE
            | objectid::DEV_TREE
            | objectid::EXTENT_TREE
            | objectid::BLOCK_GROUP_TREE
    );
    let Ok(tb) = TreeBlock::new(block) else {
        return true;
    };
    if !wanted || !tb.is_leaf() {
        return true;
    }
    let gen = h.generation;
    for slot in 0..tb.nritems() {
        if found.items >= MAX_ITEMS {
            break;
        }
        let (Ok(key), Ok(data)) = (tb.item_key(slot), tb.item_data(slot)) else {
            break;
        };
        match key.item_type {
            item::CHUNK_ITEM => {
                if let Ok(c) = ChunkItem::parse(data) {
                    newer(&mut found.chunks, key.offset, gen, c);
                    found.items += 1;
                }
            }
            item::DEV_EXTENT => {
                if let Ok(d) = DevExtent::parse(data) {
                    newer(&mut found.dev_extents, (key.objectid, key.offset), gen, d);
                    found.items += 1;
                }
            }
            item::BLOCK_GROUP_ITEM => {
                if let Ok(g) = BlockGroupItem::parse(data) {
                    let (len, flags) = (key.offset, g.flags);
                    match found.groups.get(&key.objectid) {
                        Some(&(old, _, _)) if old >= gen => {}
                        _ => {
                            found.groups.insert(key.objectid, (gen, len, flags));
                        }
                    }
                    found.items += 1;
                }
            }
            _ => {}
        }
    }
    true
}

fn newer<K: Ord, V>(map: &mut BTreeMap<K, (u64, V)>, key: K, gen: u64, value: V) {
    match map.get(&key) {
        Some((old, _)) if *old >= gen => {}
        _ => {
            map.insert(key, (gen, value));
        }
    }
}

fn covered(map: &ChunkMap, start: u64, len: u64) -> bool {
    map.lookup(start).is_some()
        || map
            .lookup(start.saturating_add(len).saturating_sub(1))
            .is_some()
        || map
            .chunks()
            .any(|(&s, c)| s >= start && s < start.saturating_add(len) && c.length > 0)
}

fn assemble(found: Found, sb: &Superblock, map: &mut ChunkMap) -> usize {
    let mut added = 0;
    // Chunk items of the newest leaf that held each, newest first: an older leaf's chunk
    // may have been removed since, and the space given to a newer one.
    let mut chunks: Vec<(u64, u64, ChunkItem)> = found
        .chunks
        .into_iter()
        .map(|(start, (gen, c))| (gen, start, c))
        .collect();
    chunks.sort_by_key(|(gen, start, _)| (std::cmp::Reverse(*gen), *start));
    for (_, start, c) in chunks {
        if !covered(map, start, c.length) && map.insert(start, c).is_ok() {
            added += 1;
        }
    }
    // Stripes per chunk, from the dev extents.
    let mut stripes: BTreeMap<u64, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for ((devid, physical), (_, d)) in &found.dev_extents {
        stripes
            .entry(d.chunk_offset)
            .or_default()
            .push((*devid, *physical, d.length));
    }
    let blocks = found.tree_blocks;
    for (start, parts) in stripes {
        let Some(&(_, dev_len, _)) = parts.first() else {
            continue;
        };
        let n = parts.len();
        let (length, flags) = match found.groups.get(&start) {
            Some(&(_, len, flags)) => (len, flags),
            None => {
                // No block group item either: the type is guessed from what lies in it,
                // the profile from the stripes (one, or two copies).
                let holds_tree = blocks
                    .range(start..start.saturating_add(dev_len))
                    .next()
                    .is_some();
                let kind = if holds_tree { bg::METADATA } else { bg::DATA };
                let profile = match n {
                    1 => 0,
                    2 if parts[0].0 == parts[1].0 => bg::DUP,
                    2 => bg::RAID1,
                    _ => continue,
                };
                (dev_len, kind | profile)
            }
        };
        if length == 0 || covered(map, start, length) {
            continue;
        }
        let chunk = ChunkItem {
            length,
            owner: objectid::EXTENT_TREE,
            stripe_len: STRIPE_LEN,
            chunk_type: flags,
            io_align: STRIPE_LEN as u32,
            io_width: STRIPE_LEN as u32,
            sector_size: sb.sectorsize,
            num_stripes: n.min(u16::MAX as usize) as u16,
            sub_stripes: if flags & bg::RAID10 != 0 { 2 } else { 1 },
            stripes: parts
                .iter()
                .map(|&(devid, offset, _)| Stripe {
                    devid,
                    offset,
                    dev_uuid: if devid == sb.dev_item.devid {
                        sb.dev_item.uuid
                    } else {
                        [0; 16]
                    },
                })
                .collect(),
        };
        if map.insert(start, chunk).is_ok() {
            added += 1;
        }
    }
    added
}
