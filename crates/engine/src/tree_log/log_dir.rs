//! A directory's fsync (the kernel's log_directory_changes): the entries it gained or lost
//! in this transaction go to the log, so that a replay makes them or removes them.
//!
//! Logged, as ../shared/docs/btrfs-format.md 12.3 shows the kernel doing it:
//! - the directory's inode item (nbytes 0), its xattrs, and its names if it is new;
//! - a DIR_LOG_INDEX range over every entry number added or removed since the directory
//!   was last logged in this transaction (a replay removes the entries in a range that the
//!   log does not list) and the DIR_INDEX items now in those ranges (a replay adds them);
//!   what earlier loggings put in the log stands, so an fsync costs what changed since
//!   the last one, not the transaction's whole history;
//! - every inode such an entry leads to that a replay would not find (new in this
//!   transaction and not logged yet): files "exist only" (generation 0, size 0: their
//!   content is their own fsync's business), symlinks and special files whole, new
//!   directories whole with their own entries, as the kernel does.
//!
//! An inode that left a logged directory for another one in this transaction would lose
//! its only name at replay (the first log removes the entry, nothing adds the new one):
//! the directory it went to is logged along, as is a new directory a logged name is in;
//! an older file that came into a logged directory brings along the directory it left
//! (else a replay would keep its old name too) (up to `DIRS_MAX` directories in one go,
//! all or none). Commits instead: a directory older than this transaction that was
//! renamed or moved into a logged one (a log entry leading to a directory the log has no
//! back reference for makes the kernel's replay skip the rest of its leaf), more
//! directories than `DIRS_MAX`, subvolume entries, entries that went in bulk.

use super::log_inode::{insert_all, put, put_inode, type_range, Items, LOG_BLOCKS_MAX};
use super::replay_names::names_in_ref;
use crate::ctree;
use crate::error::{Error, Result};
use crate::transaction::changes::in_ranges;
use crate::transaction::fs::{FileKind, InodeId};
use crate::transaction::Transaction;
use oleo_format::items::{DirEntryIter, FileExtent, FileExtentBody, InodeItem};
use oleo_format::key::{item, Key};
use std::ops::ControlFlow;

/// Directories one fsync may log together before it commits instead.
const DIRS_MAX: usize = 8;

/// What the log gets for one directory.
struct DirPlan {
    id: InodeId,
    inode: InodeItem,
    /// Its back references, when it is new and they changed.
    refs: Option<Items>,
    xattrs: Items,
    /// The DIR_INDEX ranges changed since the last logging, and the items now in them.
    ranges: Vec<(u64, u64)>,
    entries: Items,
    /// Inodes entries lead to that a replay would not find, with their items.
    targets: Vec<(InodeId, Items)>,
}

/// Whether a directory can be logged alone.
enum Planned {
    Ready(Box<DirPlan>),
    /// Only with this directory logged too: an inode that left the first for it would
    /// otherwise lose its only name at replay.
    Needs(u64),
    Commit(String),
}

impl Transaction<'_> {
    /// Logs the entry changes of directories `dirs` of subvolume `subvol`, and of any
    /// other directory they need; why not, when the log cannot say them. Either all of
    /// them go to the log or none.
    pub(super) fn log_dirs(
        &mut self,
        subvol: u64,
        dirs: &[u64],
        seq: u64,
    ) -> Result<Option<String>> {
        let mut set: Vec<u64> = dirs.to_vec();
        let plans = 'plan: loop {
            let mut plans = Vec::new();
            for &d in &set {
                let id = InodeId { subvol, ino: d };
                match self.plan_dir(id, &set)? {
                    Planned::Ready(p) => plans.push(*p),
                    Planned::Needs(q) if set.len() < DIRS_MAX && !set.contains(&q) => {
                        set.push(q);
                        continue 'plan;
                    }
                    Planned::Needs(q) => {
                        return Ok(Some(format!(
                            "directory {d} needs {q} logged too, past {DIRS_MAX} directories"
                        )))
                    }
                    Planned::Commit(why) => return Ok(Some(why)),
                }
            }
            break plans;
        };
        let mut bytes = 0;
        for p in &plans {
            let lists = [p.refs.as_ref(), Some(&p.xattrs), Some(&p.entries)];
            let targets = p.targets.iter().map(|(_, i)| Some(i));
            for items in lists.into_iter().chain(targets).flatten() {
                bytes += items.iter().map(|(_, v)| v.len() + 25).sum::<usize>();
            }
        }
        if self.log.blocks.count() > LOG_BLOCKS_MAX || !self.log_fits(4 * bytes as u64) {
            return Ok(Some(
                "the log tree is large or metadata space is low".into(),
            ));
        }
        for p in plans {
            self.write_dir(p, seq)?;
        }
        Ok(None)
    }

    /// What logging directory `id` takes, with the directories `with` logged alongside.
    fn plan_dir(&mut self, id: InodeId, with: &[u64]) -> Result<Planned> {
        let Some(inode) = self.find_inode(id)? else {
            return Ok(Planned::Commit(format!("directory {} is gone", id.ino)));
        };
        if FileKind::from_mode(inode.mode) != Some(FileKind::Dir) || inode.nlink == 0 {
            return Ok(Planned::Commit(format!("inode {} is no directory", id.ino)));
        }
        let c = self.log.inodes.get(&id);
        if c.is_some_and(|c| c.unknown_unlinks) {
            return Ok(Planned::Commit(
                "entries of the directory went without a trace".into(),
            ));
        }
        let names = c.is_some_and(|c| c.names);
        let ranges = c.map(|c| c.unlogged.clone()).unwrap_or_default();
        let unlinked = c.map(|c| c.unlinked.clone()).unwrap_or_default();
        let refs = if names {
            match self.new_inode_refs(id, &inode, with)? {
                Ok((_, missing)) if !missing.is_empty() => return Ok(Planned::Needs(missing[0])),
                Ok((r, _)) => Some(r),
                Err(why) => return Ok(Planned::Commit(why)),
            }
        } else {
            None
        };
        for ino in unlinked {
            if let Some(q) = self.new_name_elsewhere(id, ino, with)? {
                return Ok(Planned::Needs(q));
            }
        }
        let xattrs = self.items_of(id, item::XATTR_ITEM, item::XATTR_ITEM)?;

        // The entries in the changed ranges, and the inodes they lead to that a replay
        // would not find.
        let mut entries: Items = Vec::new();
        for &(a, b) in &ranges {
            self.for_each_in_range(
                id.subvol,
                Key::new(id.ino, item::DIR_INDEX, a),
                Key::new(id.ino, item::DIR_INDEX, b - 1),
                |k, v| {
                    entries.push((k, v.to_vec()));
                    Ok(ControlFlow::Continue(()))
                },
            )?;
        }
        let mut targets: Vec<(InodeId, Items)> = Vec::new();
        for (k, v) in &entries {
            let e = DirEntryIter::new(v)
                .next()
                .ok_or_else(|| Error::corrupt(0, format!("empty dir index {k:?}")))?
                .map_err(|e| Error::corrupt(0, format!("dir index {k:?}: {e}")))?;
            if e.location.item_type != item::INODE_ITEM {
                return Ok(Planned::Commit(
                    "the directory has a new subvolume entry".into(),
                ));
            }
            let t = InodeId {
                subvol: id.subvol,
                ino: e.location.objectid,
            };
            let is_dir = e.kind() == oleo_format::items::FileType::Dir;
            let new = self.is_new(t)?;
            if is_dir && !new && t != id {
                // An older directory moved in: the kernel's replay adds an entry to a
                // directory whose back reference the log lacks, then stops replaying the
                // log's other entries (replay_one_dir_item returns 1); its own fsync
                // commits here too (last_unlink_trans).
                return Ok(Planned::Commit(format!(
                    "directory {} was moved into directory {}",
                    t.ino, id.ino
                )));
            }
            let logged = self.log.inodes.get(&t).is_some_and(|c| c.logged.is_some());
            if logged || t == id || with.contains(&t.ino) || targets.iter().any(|(x, _)| *x == t) {
                continue;
            }
            if is_dir {
                // Logged whole, its entries too, as the kernel does.
                return Ok(Planned::Needs(t.ino));
            }
            if !new {
                if let Some(q) = self.old_name_unlogged(id, t.ino, with) {
                    return Ok(Planned::Needs(q));
                }
            }
            match self.target_items(t)? {
                Ok(Some(items)) => targets.push((t, items)),
                Ok(None) => {}
                Err(why) => return Ok(Planned::Commit(why)),
            }
        }
        Ok(Planned::Ready(Box::new(DirPlan {
            id,
            inode,
            refs,
            xattrs,
            ranges,
            entries,
            targets,
        })))
    }

    fn write_dir(&mut self, p: DirPlan, seq: u64) -> Result<()> {
        let DirPlan {
            id,
            mut inode,
            refs,
            xattrs,
            ranges,
            entries,
            targets,
        } = p;
        let (mut store, mut root) = self.open_log(id.subvol)?;
        put_inode(&mut store, &mut root, id.ino, &mut inode)?;
        let replace = |store: &mut _, root: &mut _, ino, from, to, items: &Items| {
            let (min, max) = type_range(ino, from, to);
            ctree::delete_range(store, root, min, max)?;
            insert_all(store, root, items)
        };
        if let Some(refs) = &refs {
            let (a, b) = (item::INODE_REF, item::INODE_EXTREF);
            replace(&mut store, &mut root, id.ino, a, b, refs)?;
        }
        let (a, b) = (item::XATTR_ITEM, item::XATTR_ITEM);
        replace(&mut store, &mut root, id.ino, a, b, &xattrs)?;
        // Each changed range: the log's entries in it give way to the directory's, and a
        // DIR_LOG_INDEX item covers it (a replay takes the union of them all).
        for &(a, b) in &ranges {
            let (min, max) = (
                Key::new(id.ino, item::DIR_INDEX, a),
                Key::new(id.ino, item::DIR_INDEX, b - 1),
            );
            ctree::delete_range(&mut store, &mut root, min, max)?;
            let key = Key::new(id.ino, item::DIR_LOG_INDEX, a);
            let end = match ctree::lookup(&*store.blocks, &root, &key)? {
                Some(v) => v
                    .get(..8)
                    .and_then(|e| e.try_into().ok())
                    .map_or(b - 1, |e| (b - 1).max(u64::from_le_bytes(e))),
                _ => b - 1,
            };
            put(&mut store, &mut root, key, &end.to_le_bytes())?;
        }
        insert_all(&mut store, &mut root, &entries)?;
        for (t, items) in &targets {
            let (a, b) = (item::INODE_ITEM, item::EXTENT_DATA);
            replace(&mut store, &mut root, t.ino, a, b, items)?;
        }
        self.log.trees.insert(id.subvol, root);
        for (t, _) in targets {
            // Logged: a rename of it from now on must commit (changes::note), and its own
            // fsync logs it whole (its size here was 0).
            let c = self.log.inodes.entry(t).or_default();
            c.logged = Some(seq);
            c.logged_eof = 0;
        }
        let c = self.log.inodes.entry(id).or_default();
        c.dirty = false;
        c.names = false;
        c.exists_only = false;
        c.logged = Some(seq);
        c.unlogged.clear();
        c.unlinked.clear();
        Ok(())
    }

    /// Whether inode `t` was made in this transaction.
    fn is_new(&mut self, t: InodeId) -> Result<bool> {
        let transid = self.transid;
        Ok(self.find_inode(t)?.is_some_and(|i| i.generation >= transid))
    }

    /// What the log needs of inode `t`, which a new entry leads to, so that a replay
    /// finds it: nothing if it is older than this transaction; why not, if the log cannot
    /// hold it.
    fn target_items(&mut self, t: InodeId) -> Result<std::result::Result<Option<Items>, String>> {
        let Some(mut ti) = self.find_inode(t)? else {
            return Ok(Err(format!("inode {} of a new entry is gone", t.ino)));
        };
        if ti.generation < self.transid {
            return Ok(Ok(None));
        }
        ti.nbytes = 0;
        let mut items = Vec::new();
        let whole = !matches!(
            FileKind::from_mode(ti.mode),
            Some(FileKind::File | FileKind::Dir)
        );
        if !whole {
            // Exists only: the replay creates it empty if it must.
            ti.generation = 0;
            ti.size = 0;
        }
        items.push((Key::new(t.ino, item::INODE_ITEM, 0), ti.to_bytes()));
        // A replay deletes the xattrs of a logged inode that its log lacks.
        items.extend(self.items_of(t, item::XATTR_ITEM, item::XATTR_ITEM)?);
        if whole {
            for (k, v) in self.items_of(t, item::EXTENT_DATA, item::EXTENT_DATA)? {
                let inline = FileExtent::parse(&v)
                    .is_ok_and(|fe| matches!(fe.body, FileExtentBody::Inline { .. }));
                if !inline {
                    return Ok(Err(format!("new inode {} has extents on disk", t.ino)));
                }
                items.push((k, v));
            }
        }
        Ok(Ok(Some(items)))
    }

    /// A directory, not `dir` nor in `with`, whose entry leading to `ino` (an older inode
    /// that got a name in `dir`) went away with the log not saying so: a replay would add
    /// the new name and keep the old one (a directory with two names, a file with one too
    /// many), so that directory is logged too.
    fn old_name_unlogged(&self, dir: InodeId, ino: u64, with: &[u64]) -> Option<u64> {
        let c = self.log.inodes.get(&InodeId {
            subvol: dir.subvol,
            ino,
        })?;
        c.parents.iter().copied().find(|&p| {
            p != dir.ino
                && !with.contains(&p)
                && self
                    .log
                    .inodes
                    .get(&InodeId {
                        subvol: dir.subvol,
                        ino: p,
                    })
                    .is_some_and(|pc| pc.unlinked.contains(&ino) || pc.unknown_unlinks)
        })
    }

    /// A directory, not in `with`, where `ino` (whose entry in `dir` went away) got a
    /// name in this transaction: a replay that removes the entry in `dir` would lose
    /// `ino` unless that directory's log names it. Names in older entries survive a replay
    /// as they are.
    fn new_name_elsewhere(&mut self, dir: InodeId, ino: u64, with: &[u64]) -> Result<Option<u64>> {
        let t = InodeId {
            subvol: dir.subvol,
            ino,
        };
        if self.find_inode(t)?.is_none_or(|i| i.nlink == 0) {
            return Ok(None);
        }
        for (k, v) in self.items_of(t, item::INODE_REF, item::INODE_EXTREF)? {
            for (parent, _, index) in names_in_ref(&k, &v)? {
                if parent == dir.ino || with.contains(&parent) {
                    continue;
                }
                let p = InodeId {
                    subvol: dir.subvol,
                    ino: parent,
                };
                let new = self
                    .log
                    .inodes
                    .get(&p)
                    .is_some_and(|c| in_ranges(&c.indexes, index));
                if new {
                    return Ok(Some(parent));
                }
            }
        }
        Ok(None)
    }
}
