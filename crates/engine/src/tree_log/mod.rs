//! The log tree (the kernel's tree-log.c): what an fsync writes instead of a full commit,
//! and what the next mount replays. The superblock's `log_root` points at a log root tree
//! (owner TREE_LOG, generation = last commit + 1) holding one ROOT_ITEM per subvolume that
//! logged something; each names that subvolume's log tree, whose items use the
//! subvolume's own key formats (../shared/docs/btrfs-format.md sections 8 and 12).
//!
//! Log blocks and the data extents only the log refers to are in no extent tree and look
//! free in the committed state: a replay must keep them out of its own allocations until
//! its commit (which writes `log_root` 0) is durable.
//!
//! Writing, one module per step of an fsync: `log_inode` (copy a file's changes into its
//! subvolume's log tree, or decide that only a commit can make them durable) and
//! `log_dir` (the same for a directory's entries). What they build on is the transaction
//! layer's: `transaction::changes` (every edit of a subvolume tree records what it
//! touched), `transaction::log_store` (where log blocks live) and `transaction::log_sync`
//! (write them, flush, superblock copy 0, flush; group commit), since every block and
//! superblock write is ordered there. Reading a pending log (`read`) and replaying it
//! (`replay`, with the names half in `replay_names`) at mount.

mod log_dir;
mod log_inode;
mod replay;
mod replay_names;

pub(crate) use crate::transaction::log_sync::{write_batch, Synced};
pub(crate) use log_inode::FsyncPlan;

use crate::ctree::{BlockSource, TreeRoot};
use crate::error::{Error, Result};
use crate::transaction::fs::FsCore;
use oleo_format::items::RootItem;
use oleo_format::key::{item, objectid, Key};
use oleo_format::TreeBlock;

/// A log larger than this many blocks is refused rather than read into memory (the
/// kernel's logs are a few blocks per fsynced inode; a hostile one could be anything).
const MAX_LOG_BLOCKS: usize = 8192;

/// One subvolume's log tree, read whole.
pub(crate) struct SubvolLog {
    pub subvol: u64,
    /// Every item in key order.
    pub items: Vec<(Key, Vec<u8>)>,
}

/// A pending log, read whole.
pub(crate) struct Log {
    /// Highest subvolume id first: the kernel's replay order.
    pub subvols: Vec<SubvolLog>,
    /// Every log tree block (log root tree included): space nothing may take before the
    /// replay is durable.
    pub blocks: Vec<u64>,
}

/// Reads the log the superblock points at. Any damage is an error naming the block.
pub(crate) fn read(fs: &FsCore) -> Result<Log> {
    let sb = fs.superblock();
    let generation = sb
        .generation
        .checked_add(1)
        .ok_or_else(|| Error::Unusable("generation overflows".into()))?;
    let mut blocks = Vec::new();
    let root = TreeRoot {
        id: objectid::TREE_LOG,
        bytenr: sb.log_root,
        level: sb.log_root_level,
        generation,
    };
    let mut roots = Vec::new();
    walk(fs, &root, &mut blocks, &mut roots)?;
    let mut subvols = Vec::new();
    for (key, body) in roots {
        if key.objectid != objectid::TREE_LOG || key.item_type != item::ROOT_ITEM {
            return Err(Error::corrupt(
                sb.log_root,
                format!("log root tree holds item {key:?}, not a log tree root"),
            ));
        }
        let ri = RootItem::parse(&body)
            .map_err(|e| Error::corrupt(sb.log_root, format!("log root item {key:?}: {e}")))?;
        if ri.generation != generation {
            return Err(Error::corrupt(
                ri.bytenr,
                format!(
                    "log tree of subvolume {} has generation {}, expected {generation}",
                    key.offset, ri.generation
                ),
            ));
        }
        let log_root = TreeRoot {
            id: objectid::TREE_LOG,
            bytenr: ri.bytenr,
            level: ri.level,
            generation,
        };
        let mut items = Vec::new();
        walk(fs, &log_root, &mut blocks, &mut items)?;
        subvols.push(SubvolLog {
            subvol: key.offset,
            items,
        });
    }
    subvols.sort_by_key(|s| std::cmp::Reverse(s.subvol));
    Ok(Log { subvols, blocks })
}

/// Every item of the tree at `root` in key order; its blocks are added to `blocks`.
fn walk(
    fs: &FsCore,
    root: &TreeRoot,
    blocks: &mut Vec<u64>,
    items: &mut Vec<(Key, Vec<u8>)>,
) -> Result<()> {
    // (bytenr, level, first key) still to visit, the next one last.
    let mut todo = vec![(root.bytenr, root.level, None)];
    while let Some((bytenr, level, first_key)) = todo.pop() {
        if blocks.len() >= MAX_LOG_BLOCKS {
            return Err(Error::Unsupported(format!(
                "the log tree has more than {MAX_LOG_BLOCKS} blocks"
            )));
        }
        if blocks.contains(&bytenr) {
            return Err(Error::corrupt(bytenr, "log tree block referenced twice"));
        }
        let block = fs.read_tree_block(bytenr, Some(level), Some(root.generation), first_key)?;
        blocks.push(bytenr);
        let tb = TreeBlock::new(&block).map_err(|e| Error::corrupt(bytenr, e.to_string()))?;
        if tb.owner() != objectid::TREE_LOG {
            return Err(Error::corrupt(
                bytenr,
                format!("log tree block owned by tree {}", tb.owner() as i64),
            ));
        }
        let bad = |e: oleo_format::FormatError| Error::corrupt(bytenr, e.to_string());
        if tb.is_leaf() {
            for slot in 0..tb.nritems() {
                items.push((
                    tb.item_key(slot).map_err(bad)?,
                    tb.item_data(slot).map_err(bad)?.to_vec(),
                ));
            }
        } else {
            for slot in (0..tb.nritems()).rev() {
                let p = tb.key_ptr(slot).map_err(bad)?;
                todo.push((p.blockptr, level - 1, Some(p.key)));
            }
        }
    }
    Ok(())
}
