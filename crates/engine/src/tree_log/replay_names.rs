//! The names half of a log replay (the kernel's replay_dir_deletes, replay_one_dir_item,
//! add_inode_ref and fixup_inode_link_counts): directory entries the log declares gone,
//! entries and back references it adds, then every touched inode's link count and every
//! touched directory's size recounted from what is left.

use super::replay::Names;
use crate::error::{Error, Result};
use crate::transaction::fs::InodeId;
use crate::transaction::Transaction;
use oleo_format::items::{DirEntryIter, InodeExtref, InodeRef};
use oleo_format::key::{item, Key};
use std::collections::BTreeSet;
use std::ops::ControlFlow;

/// Inodes whose link count and directories whose size must be recounted at the end.
#[derive(Default)]
pub(super) struct Touched {
    pub inodes: BTreeSet<u64>,
    pub dirs: BTreeSet<u64>,
}

/// One name of an inode: (parent directory, name, directory index).
pub(super) type Name = (u64, Vec<u8>, u64);

fn corrupt(what: String) -> Error {
    Error::corrupt(0, what)
}

/// Every name a ref item body lists (INODE_REF: under `key.offset`).
pub(super) fn names_in_ref(key: &Key, body: &[u8]) -> Result<Vec<Name>> {
    if key.item_type == item::INODE_REF {
        Ok(InodeRef::parse_all(body)
            .map_err(|e| corrupt(format!("inode ref {key:?}: {e}")))?
            .into_iter()
            .map(|r| (key.offset, r.name, r.index))
            .collect())
    } else {
        Ok(InodeExtref::parse_all(body)
            .map_err(|e| corrupt(format!("inode extref {key:?}: {e}")))?
            .into_iter()
            .map(|r| (r.parent, r.name, r.index))
            .collect())
    }
}

impl Transaction<'_> {
    /// Every name inode `ino` has in the subvolume now.
    pub(super) fn names_of(&mut self, subvol: u64, ino: u64) -> Result<Vec<Name>> {
        let mut found = Vec::new();
        self.for_each_in_range(
            subvol,
            Key::new(ino, item::INODE_REF, 0),
            Key::new(ino, item::INODE_EXTREF, u64::MAX),
            |k, b| {
                found.push((k, b.to_vec()));
                Ok(ControlFlow::Continue(()))
            },
        )?;
        let mut out = Vec::new();
        for (k, b) in found {
            out.extend(names_in_ref(&k, &b)?);
        }
        Ok(out)
    }

    /// Removes entry `name` (DIR_INDEX `index`) of directory `dir` and the back reference
    /// of the inode it names.
    fn unlink_entry(
        &mut self,
        subvol: u64,
        dir: u64,
        name: &[u8],
        index: u64,
        touched: &mut Touched,
    ) -> Result<()> {
        let d = InodeId { subvol, ino: dir };
        let target = self.find_dir_entry(d, name)?.ok_or_else(|| {
            corrupt(format!(
                "entry {:?} of directory {dir} has no DIR_ITEM",
                String::from_utf8_lossy(name)
            ))
        })?;
        if target.location.item_type != item::INODE_ITEM {
            return Err(Error::Unsupported(format!(
                "the log removes the subvolume entry {:?} of directory {dir}",
                String::from_utf8_lossy(name)
            )));
        }
        let ino = target.location.objectid;
        self.remove_dir_entry(d, name, index, Some(ino))?;
        self.remove_inode_ref(InodeId { subvol, ino }, dir, name)?;
        touched.inodes.insert(ino);
        touched.dirs.insert(dir);
        Ok(())
    }

    /// Adds `name` -> `ino` to directory `dir` at `index`, with its back reference.
    fn link_entry(
        &mut self,
        subvol: u64,
        dir: u64,
        name: &[u8],
        index: u64,
        ino: u64,
        touched: &mut Touched,
    ) -> Result<()> {
        let id = InodeId { subvol, ino };
        let mode = self.read_inode(id)?.mode;
        let target = crate::inode::dir_item::EntryTarget {
            location: Key::new(ino, item::INODE_ITEM, 0),
            file_type: crate::vfs::inode_ops::file_type_of(mode)
                .map_err(|e| corrupt(format!("inode {ino}: {e}")))?,
        };
        self.add_dir_entry(InodeId { subvol, ino: dir }, name, target, index)?;
        self.add_inode_ref(id, dir, name, index)?;
        touched.inodes.insert(ino);
        touched.dirs.insert(dir);
        Ok(())
    }

    /// The DIR_INDEX entry of `dir` at `index`: (name, target inode).
    fn entry_at(&mut self, subvol: u64, dir: u64, index: u64) -> Result<Option<(Vec<u8>, Key)>> {
        let key = Key::new(dir, item::DIR_INDEX, index);
        let Some(body) = self.lookup(subvol, &key)? else {
            return Ok(None);
        };
        let e = DirEntryIter::new(&body)
            .next()
            .ok_or_else(|| corrupt(format!("empty dir index {key:?}")))?
            .map_err(|e| corrupt(format!("dir index {key:?}: {e}")))?;
        Ok(Some((e.name.to_vec(), e.location)))
    }

    /// Makes `name` at `index` in `dir` name `ino`, clearing whatever holds the name or the
    /// index now (the kernel's conflicting-name handling).
    fn ensure_entry(
        &mut self,
        subvol: u64,
        dir: u64,
        name: &[u8],
        index: u64,
        ino: u64,
        touched: &mut Touched,
    ) -> Result<()> {
        if let Some((n, loc)) = self.entry_at(subvol, dir, index)? {
            if n == name && loc.objectid == ino && loc.item_type == item::INODE_ITEM {
                return Ok(());
            }
            self.unlink_entry(subvol, dir, &n, index, touched)?;
        }
        if self
            .find_dir_entry(InodeId { subvol, ino: dir }, name)?
            .is_some()
        {
            let old = self
                .entry_index(subvol, dir, name)?
                .ok_or_else(|| corrupt(format!("entry of directory {dir} has no DIR_INDEX")))?;
            self.unlink_entry(subvol, dir, name, old, touched)?;
        }
        self.link_entry(subvol, dir, name, index, ino, touched)
    }

    /// The DIR_INDEX number of entry `name` of `dir`, from its target's back references.
    fn entry_index(&mut self, subvol: u64, dir: u64, name: &[u8]) -> Result<Option<u64>> {
        let Some(t) = self.find_dir_entry(InodeId { subvol, ino: dir }, name)? else {
            return Ok(None);
        };
        if t.location.item_type != item::INODE_ITEM {
            return Err(Error::Unsupported(format!(
                "the log replaces the subvolume entry {:?} of directory {dir}",
                String::from_utf8_lossy(name)
            )));
        }
        Ok(self
            .names_of(subvol, t.location.objectid)?
            .into_iter()
            .find(|(p, n, _)| *p == dir && n == name)
            .map(|(_, _, i)| i))
    }

    /// DIR_LOG_INDEX ranges: entries of `dir` inside a range the log covers but not in
    /// the log were removed before the fsync.
    pub(super) fn replay_dir_deletes(
        &mut self,
        subvol: u64,
        dir: u64,
        names: &Names,
        touched: &mut Touched,
    ) -> Result<()> {
        for &(first, last) in &names.log_ranges {
            let mut gone = Vec::new();
            self.for_each_in_range(
                subvol,
                Key::new(dir, item::DIR_INDEX, first),
                Key::new(dir, item::DIR_INDEX, last),
                |k, body| {
                    let e = DirEntryIter::new(body)
                        .next()
                        .ok_or_else(|| corrupt(format!("empty dir index {k:?}")))?
                        .map_err(|e| corrupt(format!("dir index {k:?}: {e}")))?;
                    let kept = names
                        .dir_index
                        .iter()
                        .any(|(i, n, _)| *i == k.offset && *n == e.name);
                    if !kept {
                        gone.push((e.name.to_vec(), k.offset));
                    }
                    Ok(ControlFlow::Continue(()))
                },
            )?;
            for (name, index) in gone {
                self.unlink_entry(subvol, dir, &name, index, touched)?;
            }
        }
        Ok(())
    }

    /// Logged DIR_INDEX entries whose name no logged back reference adds.
    pub(super) fn replay_dir_index(
        &mut self,
        subvol: u64,
        dir: u64,
        names: &Names,
        ref_named: &BTreeSet<(u64, Vec<u8>)>,
        touched: &mut Touched,
    ) -> Result<()> {
        for (index, name, location) in &names.dir_index {
            if location.item_type != item::INODE_ITEM {
                return Err(Error::Unsupported(format!(
                    "the log adds the subvolume entry {:?} to directory {dir}",
                    String::from_utf8_lossy(name)
                )));
            }
            if ref_named.contains(&(dir, name.clone())) {
                continue;
            }
            let ino = location.objectid;
            match self.read_inode(InodeId { subvol, ino }) {
                Ok(_) => {}
                // A name for an inode that is neither in the log nor on disk: skipped,
                // as the kernel does.
                Err(Error::NotFound) => continue,
                Err(e) => return Err(e),
            }
            self.ensure_entry(subvol, dir, name, *index, ino, touched)?;
        }
        Ok(())
    }

    /// The logged back references of `ino` under each parent they name are all it has
    /// there: names missing from them go, names in them are added.
    pub(super) fn replay_refs(
        &mut self,
        subvol: u64,
        ino: u64,
        logged: &[Name],
        touched: &mut Touched,
    ) -> Result<()> {
        // A subvolume's root directory names itself ".." in its own back reference, with
        // no entry anywhere: nothing to replay there.
        let parents: BTreeSet<u64> = logged
            .iter()
            .map(|(p, _, _)| *p)
            .filter(|&p| p != ino)
            .collect();
        for &parent in &parents {
            match self.read_inode(InodeId {
                subvol,
                ino: parent,
            }) {
                Ok(_) => {}
                Err(Error::NotFound) => continue,
                Err(e) => return Err(e),
            }
            let have: Vec<Name> = self
                .names_of(subvol, ino)?
                .into_iter()
                .filter(|(p, _, _)| *p == parent)
                .collect();
            for (_, name, index) in &have {
                if !logged
                    .iter()
                    .any(|(p, n, i)| *p == parent && n == name && i == index)
                {
                    self.unlink_entry(subvol, parent, name, *index, touched)?;
                }
            }
            for (p, name, index) in logged {
                if *p == parent {
                    self.ensure_entry(subvol, parent, name, *index, ino, touched)?;
                }
            }
        }
        touched.inodes.insert(ino);
        Ok(())
    }

    /// Link counts and directory sizes from what the names are now; an inode left with
    /// no name becomes an orphan (deleted by the mount's orphan cleanup).
    pub(super) fn fix_counts(&mut self, subvol: u64, touched: &Touched) -> Result<()> {
        for &dir in &touched.dirs {
            let id = InodeId { subvol, ino: dir };
            let mut size = 0u64;
            self.for_each_in_range(
                subvol,
                Key::new(dir, item::DIR_INDEX, 0),
                Key::new(dir, item::DIR_INDEX, u64::MAX),
                |k, body| {
                    for e in DirEntryIter::new(body) {
                        let e = e.map_err(|e| corrupt(format!("dir index {k:?}: {e}")))?;
                        size += 2 * e.name.len() as u64;
                    }
                    Ok(ControlFlow::Continue(()))
                },
            )?;
            let mut inode = self.read_inode(id)?;
            if inode.size != size {
                inode.size = size;
                self.write_inode(id, &mut inode)?;
            }
        }
        for &ino in &touched.inodes {
            let id = InodeId { subvol, ino };
            let mut inode = match self.read_inode(id) {
                Ok(i) => i,
                Err(Error::NotFound) => continue,
                Err(e) => return Err(e),
            };
            let names = self.names_of(subvol, ino)?.len() as u32;
            let is_dir = inode.mode & 0o170000 == 0o040000;
            let nlink = if is_dir { names.min(1) } else { names };
            if nlink == 0 {
                if is_dir && self.entry_count(subvol, ino)? != 0 {
                    return Err(Error::Unsupported(format!(
                        "the log leaves directory {ino} with entries but no name"
                    )));
                }
                self.add_orphan(id)?;
            }
            if inode.nlink != nlink {
                inode.nlink = nlink;
                self.write_inode(id, &mut inode)?;
            }
        }
        Ok(())
    }

    fn entry_count(&mut self, subvol: u64, dir: u64) -> Result<usize> {
        let mut n = 0;
        self.for_each_in_range(
            subvol,
            Key::new(dir, item::DIR_INDEX, 0),
            Key::new(dir, item::DIR_INDEX, u64::MAX),
            |_, _| {
                n += 1;
                Ok(ControlFlow::Break(()))
            },
        )?;
        Ok(n)
    }
}
