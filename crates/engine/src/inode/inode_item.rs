//! Inode items and the back references from an inode to its names (INODE_REF, and
//! INODE_EXTREF when one ref item would outgrow a leaf), inode numbers, orphan items.
//! These are the transaction-level pieces the POSIX operations in `inode_ops` combine.

use crate::error::{Error, Result};
use crate::transaction::fs::InodeId;
use crate::transaction::Transaction;
use oleo_format::csum::extref_hash;
use oleo_format::items::{InodeExtref, InodeItem, InodeRef, Timespec};
use oleo_format::key::{item, objectid, Key};
use oleo_format::superblock::incompat;
use std::ops::ControlFlow;

/// Wall-clock time in the on-disk form.
/// The time an inode is stamped with: the kernel's coarse realtime clock, the one the
/// kernel stamps with itself (FUSE's writeback cache lets it stamp regular files), so that
/// an inode changed after another never looks older.
pub fn now() -> Timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_REALTIME_COARSE always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    Timespec {
        sec: ts.tv_sec,
        nsec: ts.tv_nsec as u32,
    }
}

/// The largest item body we let one ref item grow to: a quarter of a leaf keeps splits sane.
fn ref_item_budget(nodesize: u32) -> usize {
    nodesize as usize / 4
}

impl Transaction<'_> {
    /// The inode item as this transaction sees it.
    pub(crate) fn read_inode(&mut self, id: InodeId) -> Result<InodeItem> {
        if let Some(inode) = self.delayed.inode(&id) {
            return Ok(InodeItem::clone(inode));
        }
        let body = self
            .lookup(id.subvol, &Key::new(id.ino, item::INODE_ITEM, 0))?
            .ok_or(Error::NotFound)?;
        InodeItem::parse(&body).map_err(|e| {
            Error::corrupt(
                0,
                format!("inode {} of subvolume {}: {e}", id.ino, id.subvol),
            )
        })
    }

    /// `read_inode`, with None for an inode that does not exist.
    pub(crate) fn find_inode(&mut self, id: InodeId) -> Result<Option<InodeItem>> {
        match self.read_inode(id) {
            Ok(i) => Ok(Some(i)),
            Err(Error::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the inode item back, stamped with this transaction: a delayed item, written
    /// to the tree once however often it changes (`delayed_inode`).
    pub(crate) fn write_inode(&mut self, id: InodeId, inode: &mut InodeItem) -> Result<()> {
        inode.transid = self.transid;
        inode.sequence = inode.sequence.wrapping_add(1);
        self.inodes_changed.insert(id.subvol);
        self.filesystem().inodes.remove(&id);
        self.queue_inode(id, inode)
    }

    /// `write_inode` for a change of atime alone: no change counted in the sequence number
    /// (the kernel leaves i_version alone for S_ATIME).
    pub(crate) fn write_inode_atime(&mut self, id: InodeId, inode: &mut InodeItem) -> Result<()> {
        inode.sequence = inode.sequence.wrapping_sub(1);
        self.write_inode(id, inode)
    }

    pub(crate) fn insert_inode(&mut self, id: InodeId, inode: &InodeItem) -> Result<()> {
        self.insert_item(
            id.subvol,
            Key::new(id.ino, item::INODE_ITEM, 0),
            &inode.to_bytes(),
        )?;
        self.inodes_changed.insert(id.subvol);
        self.cache_new_inode(id, inode);
        Ok(())
    }

    /// The reply to a create asks for the new inode at once: keep it in the cache.
    fn cache_new_inode(&mut self, id: InodeId, inode: &InodeItem) {
        let cached = std::sync::Arc::new(inode.clone());
        self.filesystem().inodes.insert(id, cached);
    }

    /// Inserts a new inode's item with its first name (`name` at `index` in `parent`).
    pub(crate) fn insert_named_inode(
        &mut self,
        id: InodeId,
        inode: &InodeItem,
        parent: u64,
        name: &[u8],
        index: u64,
    ) -> Result<()> {
        let entry = InodeRef {
            index,
            name: name.to_vec(),
        };
        let reference = InodeRef::to_bytes_all(std::slice::from_ref(&entry))
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let body = inode.to_bytes();
        self.insert_items(
            id.subvol,
            &[
                (Key::new(id.ino, item::INODE_ITEM, 0), &body),
                (Key::new(id.ino, item::INODE_REF, parent), &reference),
            ],
        )?;
        self.inodes_changed.insert(id.subvol);
        self.cache_new_inode(id, inode);
        Ok(())
    }

    /// Returns `id`, the last number `new_ino` gave, unused (its creation failed).
    pub(crate) fn give_back_ino(&mut self, id: InodeId) {
        let mut next = self.filesystem().next_ino.lock();
        if next.get(&id.subvol) == Some(&(id.ino + 1)) {
            next.insert(id.subvol, id.ino);
        }
    }

    /// A fresh inode number in subvolume `subvol`: one past the highest in use.
    pub(crate) fn new_ino(&mut self, subvol: u64) -> Result<u64> {
        let cached = self.filesystem().next_ino.lock().get(&subvol).copied();
        let next = match cached {
            Some(n) => n,
            None => {
                let root = self.root(subvol)?;
                let mut highest = objectid::FIRST_FREE;
                // The last key below the special objectids (orphans, free-ino cache) is the
                // highest inode number in use.
                let probe = Key::new(objectid::LAST_FREE, u8::MAX, u64::MAX);
                let mut cur = crate::ctree::Cursor::search(&*self, &root, &probe)?;
                if cur.item()?.is_none_or(|(k, _)| k > probe) && cur.prev()? {
                    if let Some((k, _)) = cur.item()? {
                        highest = highest.max(k.objectid);
                    }
                } else if let Some((k, _)) = cur.item()? {
                    if k <= probe {
                        highest = highest.max(k.objectid);
                    }
                }
                highest + 1
            }
        };
        if next > objectid::LAST_FREE {
            return Err(Error::NoSpace);
        }
        self.filesystem().next_ino.lock().insert(subvol, next + 1);
        Ok(next)
    }

    /// Records `name` (at directory index `index`) as a name of `id` in directory `parent`.
    pub(crate) fn add_inode_ref(
        &mut self,
        id: InodeId,
        parent: u64,
        name: &[u8],
        index: u64,
    ) -> Result<()> {
        let key = Key::new(id.ino, item::INODE_REF, parent);
        let entry = InodeRef {
            index,
            name: name.to_vec(),
        };
        // Most inodes have one name in a directory: try the insertion first, one descent.
        let body = InodeRef::to_bytes_all(std::slice::from_ref(&entry))
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        match self.insert_item(id.subvol, key, &body) {
            Err(Error::AlreadyExists) => {}
            r => return r,
        }
        match self.lookup(id.subvol, &key)? {
            None => self.insert_item(id.subvol, key, &body),
            Some(old) => {
                let mut refs = InodeRef::parse_all(&old)
                    .map_err(|e| Error::corrupt(0, format!("inode ref of {}: {e}", id.ino)))?;
                refs.push(entry);
                let body = InodeRef::to_bytes_all(&refs)
                    .map_err(|e| Error::InvalidArgument(e.to_string()))?;
                if body.len() <= ref_item_budget(self.filesystem().sb.nodesize) {
                    return self.replace_item(id.subvol, &key, &body);
                }
                self.add_inode_extref(id, parent, name, index)
            }
        }
    }

    fn add_inode_extref(
        &mut self,
        id: InodeId,
        parent: u64,
        name: &[u8],
        index: u64,
    ) -> Result<()> {
        if !self.filesystem().sb.has_incompat(incompat::EXTENDED_IREF) {
            return Err(Error::TooManyLinks);
        }
        let key = Key::new(id.ino, item::INODE_EXTREF, extref_hash(parent, name));
        let entry = InodeExtref {
            parent,
            index,
            name: name.to_vec(),
        };
        let mut refs = match self.lookup(id.subvol, &key)? {
            Some(old) => InodeExtref::parse_all(&old)
                .map_err(|e| Error::corrupt(0, format!("extref of {}: {e}", id.ino)))?,
            None => Vec::new(),
        };
        let fresh = refs.is_empty();
        refs.push(entry);
        let body =
            InodeExtref::to_bytes_all(&refs).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if body.len() > ref_item_budget(self.filesystem().sb.nodesize) {
            return Err(Error::TooManyLinks);
        }
        if fresh {
            self.insert_item(id.subvol, key, &body)
        } else {
            self.replace_item(id.subvol, &key, &body)
        }
    }

    /// Removes the name `name` in `parent` from `id`'s back references; returns its index.
    pub(crate) fn remove_inode_ref(
        &mut self,
        id: InodeId,
        parent: u64,
        name: &[u8],
    ) -> Result<u64> {
        let key = Key::new(id.ino, item::INODE_REF, parent);
        if let Some(old) = self.lookup(id.subvol, &key)? {
            let mut refs = InodeRef::parse_all(&old)
                .map_err(|e| Error::corrupt(0, format!("inode ref of {}: {e}", id.ino)))?;
            if let Some(pos) = refs.iter().position(|r| r.name == name) {
                let index = refs.remove(pos).index;
                if refs.is_empty() {
                    self.delete_item(id.subvol, &key)?;
                } else {
                    let body = InodeRef::to_bytes_all(&refs)
                        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
                    self.replace_item(id.subvol, &key, &body)?;
                }
                return Ok(index);
            }
        }
        let key = Key::new(id.ino, item::INODE_EXTREF, extref_hash(parent, name));
        let old = self.lookup(id.subvol, &key)?.ok_or_else(|| {
            Error::corrupt(
                0,
                format!(
                    "inode {} has no back reference for its name in {parent}",
                    id.ino
                ),
            )
        })?;
        let mut refs = InodeExtref::parse_all(&old)
            .map_err(|e| Error::corrupt(0, format!("extref of {}: {e}", id.ino)))?;
        let pos = refs
            .iter()
            .position(|r| r.parent == parent && r.name == name)
            .ok_or_else(|| {
                Error::corrupt(
                    0,
                    format!(
                        "inode {} has no back reference for its name in {parent}",
                        id.ino
                    ),
                )
            })?;
        let index = refs.remove(pos).index;
        if refs.is_empty() {
            self.delete_item(id.subvol, &key)?;
        } else {
            let body = InodeExtref::to_bytes_all(&refs)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            self.replace_item(id.subvol, &key, &body)?;
        }
        Ok(index)
    }

    /// Marks `id` as an orphan: unlinked but still open, to be deleted when closed (or
    /// at the next mount, by us or the kernel, after a crash).
    pub(crate) fn add_orphan(&mut self, id: InodeId) -> Result<()> {
        let key = Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, id.ino);
        match self.insert_item(id.subvol, key, &[]) {
            Err(Error::AlreadyExists) => Ok(()),
            r => r,
        }
    }

    /// The inodes listed as orphans in subvolume `subvol`.
    pub(crate) fn orphans(&mut self, subvol: u64) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        self.for_each_in_range(
            subvol,
            Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, 0),
            Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, u64::MAX),
            |k, _| {
                out.push(k.offset);
                Ok(ControlFlow::Continue(()))
            },
        )?;
        Ok(out)
    }
}
