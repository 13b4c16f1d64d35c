//! Tolerant tree walks: every readable leaf's items, the unreadable blocks reported.

use super::{Report, SkippedBlock};
use crate::io::disk_io::DiskIo;
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
        let block = match io.read_tree_block(bytenr, level, generation, first_key) {
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

fn skip(report: &mut Report, bytenr: u64, owner: u64, why: String) {
    eprintln!("skipping tree block {bytenr} of tree {owner}: {why}");
    report
        .skipped_blocks
        .push(SkippedBlock { bytenr, owner, why });
}
