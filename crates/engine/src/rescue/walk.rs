//! Tolerant tree walks: every readable leaf's items, the unreadable blocks reported.

use super::{Report, SkippedBlock};
use crate::io::disk_io::{Block, DiskIo};
use oleo_format::tree_block::Header;
use oleo_format::{Key, TreeBlock};
use std::collections::{BTreeMap, HashSet};

/// The items of one tree, by key.
pub(crate) type Items = BTreeMap<Key, Vec<u8>>;

/// Where a tree starts: its root block and what its pointer promises.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Start {
    pub owner: u64,
    pub bytenr: u64,
    pub level: Option<u8>,
    pub generation: Option<u64>,
}

/// btrfs trees have at most 8 levels; anything deeper is damage.
const MAX_LEVEL: u8 = 7;

/// Collects the items `keep` accepts from every readable leaf under `start`. Blocks that
/// fail on every copy go to `report` and their subtrees are left out.
pub(crate) fn collect(
    io: &DiskIo,
    start: Start,
    keep: &dyn Fn(&Key) -> bool,
    report: &mut Report,
) -> Items {
    let mut items = Items::new();
    let mut seen = HashSet::new();
    let mut stack = vec![(start.bytenr, start.level, start.generation, None)];
    while let Some((bytenr, level, generation, first_key)) = stack.pop() {
        // A node pointing back up (or twice at one block) would loop forever.
        if !seen.insert(bytenr) {
            continue;
        }
        let block = match read_block(io, bytenr, level, generation, first_key) {
            Ok(b) => b,
            Err(e) => {
                skip(report, bytenr, start.owner, e.to_string());
                continue;
            }
        };
        let tb = match TreeBlock::new(&block) {
            Ok(tb) => tb,
            Err(e) => {
                skip(report, bytenr, start.owner, e.to_string());
                continue;
            }
        };
        if tb.level() > MAX_LEVEL {
            skip(report, bytenr, start.owner, format!("level {}", tb.level()));
            continue;
        }
        if tb.is_leaf() {
            for slot in 0..tb.nritems() {
                let (Ok(key), Ok(data)) = (tb.item_key(slot), tb.item_data(slot)) else {
                    skip(
                        report,
                        bytenr,
                        start.owner,
                        format!("item {slot} is damaged"),
                    );
                    break;
                };
                if keep(&key) {
                    items.insert(key, data.to_vec());
                }
            }
            continue;
        }
        // Children pushed in reverse so the walk goes left to right.
        for slot in (0..tb.nritems()).rev() {
            if let Ok(ptr) = tb.key_ptr(slot) {
                stack.push((
                    ptr.blockptr,
                    Some(tb.level() - 1),
                    Some(ptr.generation),
                    Some(ptr.key),
                ));
            }
        }
    }
    items
}

/// A tree block as [`DiskIo::read_tree_block`] reads it; when every copy fails that, a copy
/// whose checksum, address, fsid and level still hold is used anyway (as `btrfs restore`
/// ignores a wrong transid): a bad item in it is no reason to lose the good ones beside it,
/// which the walk takes one by one.
pub(crate) fn read_block(
    io: &DiskIo,
    bytenr: u64,
    level: Option<u8>,
    generation: Option<u64>,
    first_key: Option<Key>,
) -> crate::error::Result<Block> {
    let err = match io.read_tree_block(bytenr, level, generation, first_key) {
        Ok(b) => return Ok(b),
        Err(e) => e,
    };
    let ctx = io.context();
    let nodesize = ctx.nodesize as usize;
    if nodesize < oleo_format::tree_block::HEADER_SIZE {
        return Err(err);
    }
    for mirror in 0..io.num_mirrors(bytenr).clamp(1, 4) {
        let mut buf = vec![0u8; nodesize];
        if io.read_logical(bytenr, &mut buf, mirror).is_err()
            || !ctx.csum_type.verify(&buf[32..], &buf[..32])
        {
            continue;
        }
        let Ok(h) = Header::parse(&buf) else {
            continue;
        };
        let level_ok = h.level <= MAX_LEVEL && level.is_none_or(|l| l == h.level);
        if h.bytenr != bytenr || h.fsid != ctx.metadata_fsid || !level_ok {
            continue;
        }
        if TreeBlock::new(&buf).is_err() {
            continue;
        }
        eprintln!("tree block {bytenr}: {err}; its copy {mirror} is used as far as it reads");
        return Ok(buf.into());
    }
    Err(err)
}

fn skip(report: &mut Report, bytenr: u64, owner: u64, why: String) {
    eprintln!("skipping tree block {bytenr} of tree {owner}: {why}");
    report
        .skipped_blocks
        .push(SkippedBlock { bytenr, owner, why });
}
