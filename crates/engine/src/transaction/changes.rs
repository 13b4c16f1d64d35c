//! What changed of each inode in the running transaction since it was last logged: every
//! edit of a subvolume tree passes here (`Transaction`'s item functions), so an fsync
//! knows which file ranges to log without asking the write paths.

use crate::ctree::TreeRoot;
use crate::transaction::fs::InodeId;
use crate::transaction::log_store::LogBlocks;
use oleo_format::items::FileExtent;
use oleo_format::key::{item, objectid, Key};
use std::collections::{BTreeMap, BTreeSet};

/// One inode's changes since it was last logged in this transaction.
#[derive(Default)]
pub(crate) struct InodeChanges {
    /// File ranges whose EXTENT_DATA items changed, sorted and disjoint.
    pub ranges: Vec<(u64, u64)>,
    /// Anything of the inode changed.
    pub dirty: bool,
    /// Its names (INODE_REF/EXTREF) changed in this transaction.
    pub names: bool,
    /// The log sync that holds its last logging.
    pub logged: Option<u64>,
    /// Where the file ended (sector-aligned) when it was last logged: a replay of that
    /// log cuts the file there, so once it grows, the log must describe what lies past.
    pub logged_eof: u64,
    /// A directory's DIR_INDEX numbers added or removed in this transaction (sorted,
    /// disjoint, half-open).
    pub indexes: Vec<(u64, u64)>,
    /// Those of them changed since the directory's entries were last logged: the next
    /// logging states these again (the log still holds the others as they are).
    pub unlogged: Vec<(u64, u64)>,
    /// Inodes whose entries in this directory went away since the directory was last
    /// logged (a logging checks that each keeps a name a replay knows).
    pub unlinked: BTreeSet<u64>,
    /// Entries went away without the log learning where they led (a range deletion, a
    /// subvolume's entry): the directory's fsync commits.
    pub unknown_unlinks: bool,
    /// Directories where this inode got or lost a name (INODE_REF) in this transaction.
    pub parents: Vec<u64>,
    /// An INODE_EXTREF of it changed (its key names no directory).
    pub extrefs: bool,
    /// A directory logged only so that a replay makes it (inode item, names, xattrs):
    /// its entries are not in the log.
    pub exists_only: bool,
}

/// The running transaction's log: the changes, the log trees, their blocks.
#[derive(Default)]
pub(crate) struct TxnLog {
    pub inodes: foldhash::HashMap<InodeId, InodeChanges>,
    /// Why fsyncs in this transaction must commit it (the kernel's "log full commit").
    pub full_commit: Option<String>,
    /// Logged inodes whose names changed since: the log must say their new names (or
    /// that they are gone) before it is synced again (`Transaction::settle`).
    pub stale: Vec<InodeId>,
    /// Each subvolume's log tree.
    pub trees: BTreeMap<u64, TreeRoot>,
    /// The log root tree, once a log sync built it.
    pub root_tree: Option<TreeRoot>,
    /// The roots the log root tree records.
    pub recorded: BTreeMap<u64, TreeRoot>,
    pub blocks: LogBlocks,
    /// Per subvolume, disk ranges whose checksums its log holds (sorted, disjoint).
    pub csummed: BTreeMap<u64, Vec<(u64, u64)>>,
}

pub(crate) fn is_subvolume(tree: u64) -> bool {
    tree == objectid::FS_TREE || (objectid::FIRST_FREE..=objectid::LAST_FREE).contains(&tree)
}

/// The file range an EXTENT_DATA item at `key` with `body` covers.
pub(crate) fn extent_range(key: &Key, body: &[u8]) -> (u64, u64) {
    let len = FileExtent::parse(body)
        .map(|fe| fe.file_len())
        .unwrap_or(u64::MAX);
    (key.offset, key.offset.saturating_add(len.max(1)))
}

/// Whether `x` is in the sorted set of disjoint ranges `set`.
pub(crate) fn in_ranges(set: &[(u64, u64)], x: u64) -> bool {
    let i = set.partition_point(|&(_, e)| e <= x);
    set.get(i).is_some_and(|&(a, _)| a <= x)
}

/// Adds `[a, b)` to a sorted set of disjoint ranges.
pub(crate) fn add_range(set: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    if a >= b {
        return;
    }
    let (mut a, mut b) = (a, b);
    let first = set.partition_point(|&(_, e)| e < a);
    let mut last = first;
    while last < set.len() && set[last].0 <= b {
        a = a.min(set[last].0);
        b = b.max(set[last].1);
        last += 1;
    }
    set.splice(first..last, [(a, b)]);
}

/// The parts of `[a, b)` not in the sorted set `set`.
pub(crate) fn missing_from(set: &[(u64, u64)], a: u64, b: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut cur = a;
    let first = set.partition_point(|&(_, e)| e <= a);
    for &(s, e) in &set[first..] {
        if s >= b {
            break;
        }
        if s > cur {
            out.push((cur, s));
        }
        cur = cur.max(e);
    }
    if cur < b {
        out.push((cur, b));
    }
    out
}

impl TxnLog {
    /// Records the deletion of every item of subvolume `subvol` in `[min, max]`.
    pub(crate) fn note_range(&mut self, subvol: u64, min: &Key, max: &Key) {
        if min.objectid == max.objectid && min.item_type == max.item_type {
            // Items of one type of one inode: a file extent starting before `min` stays.
            self.note(subvol, min, &[(min.offset, u64::MAX)]);
            if min.item_type == item::DIR_INDEX {
                self.note_unlinked(subvol, min.objectid, None);
            }
            return;
        }
        if max.objectid.saturating_sub(min.objectid) > 64 {
            self.full_commit
                .get_or_insert_with(|| "items of many inodes were deleted".into());
            return;
        }
        for ino in min.objectid..=max.objectid {
            for t in [item::INODE_ITEM, item::INODE_REF, item::EXTENT_DATA] {
                self.note(subvol, &Key::new(ino, t, 0), &[(0, u64::MAX)]);
            }
            self.note_unlinked(subvol, ino, None);
        }
    }

    /// Records that an entry of directory `dir` leading to `target` (None: unknown or not
    /// an inode of this subvolume) went away.
    pub(crate) fn note_unlinked(&mut self, subvol: u64, dir: u64, target: Option<u64>) {
        let c = self.inodes.entry(InodeId { subvol, ino: dir }).or_default();
        match target {
            Some(t) => {
                c.unlinked.insert(t);
            }
            None => c.unknown_unlinks = true,
        }
    }

    /// Records an edit of `key` in subvolume `subvol`: `ranges` are the file ranges of the
    /// EXTENT_DATA items it removes or adds, or the DIR_INDEX numbers.
    pub(crate) fn note(&mut self, subvol: u64, key: &Key, ranges: &[(u64, u64)]) {
        if !(objectid::FIRST_FREE..=objectid::LAST_FREE).contains(&key.objectid) {
            return;
        }
        let c = self
            .inodes
            .entry(InodeId {
                subvol,
                ino: key.objectid,
            })
            .or_default();
        c.dirty = true;
        match key.item_type {
            item::INODE_REF | item::INODE_EXTREF => {
                c.names = true;
                if key.item_type == item::INODE_EXTREF {
                    c.extrefs = true;
                } else if key.offset != 0 && !c.parents.contains(&key.offset) {
                    // (Offset 0: all of a deleted inode's references, removed one by one
                    // before.)
                    c.parents.push(key.offset);
                }
                if c.logged.is_some() {
                    // The log has this inode under names it may no longer have: replaying
                    // them could bring back a name that was renamed over or removed.
                    let id = InodeId {
                        subvol,
                        ino: key.objectid,
                    };
                    if c.extrefs {
                        self.full_commit.get_or_insert_with(|| {
                            format!("the extended references of inode {} changed", id.ino)
                        });
                    } else if !self.stale.contains(&id) {
                        self.stale.push(id);
                    }
                }
            }
            item::EXTENT_DATA => {
                for &(a, b) in ranges {
                    add_range(&mut c.ranges, a, b);
                }
            }
            item::DIR_INDEX => {
                for &(a, b) in ranges {
                    add_range(&mut c.indexes, a, b);
                    add_range(&mut c.unlogged, a, b);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_subtract() {
        let mut s = Vec::new();
        add_range(&mut s, 10, 20);
        add_range(&mut s, 30, 40);
        add_range(&mut s, 20, 25);
        assert_eq!(s, vec![(10, 25), (30, 40)]);
        add_range(&mut s, 5, 35);
        assert_eq!(s, vec![(5, 40)]);
        add_range(&mut s, 50, 60);
        assert_eq!(missing_from(&s, 0, 100), vec![(0, 5), (40, 50), (60, 100)]);
        assert_eq!(missing_from(&s, 6, 39), vec![]);
        assert_eq!(missing_from(&s, 38, 52), vec![(40, 50)]);
        assert!(in_ranges(&s, 5) && in_ranges(&s, 39) && in_ranges(&s, 59));
        assert!(!in_ranges(&s, 4) && !in_ranges(&s, 40) && !in_ranges(&s, 60));
    }
}
